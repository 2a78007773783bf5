//! The syscall allowlist as data. Every syscall not listed here is denied.
//!
//! Each entry says why a normal Linux userland (glibc, musl, busybox, python, node, git,
//! curl) needs the call; each argument check says what it keeps out. Syscalls that are
//! deliberately absent include, among others: `io_uring_*` (bypasses seccomp and socket
//! rules), `ptrace`, `process_vm_readv/writev`, `pidfd_getfd`, `kcmp` (inspect or steal
//! from other processes), `bpf`, `perf_event_open`, `userfaultfd` (kernel attack surface and
//! exploit helpers), `keyctl`, `add_key`, `request_key` (kernel keyrings are not namespaced),
//! `mount`, `umount2`, `pivot_root`, `chroot`, the new mount API (`open_tree`, `move_mount`,
//! `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`), `unshare`, `setns`, `kexec_*`,
//! `init_module`, `finit_module`, `delete_module`, `open_by_handle_at` (the "shocker"
//! container escape), `name_to_handle_at`, `reboot`, `swapon`, `swapoff`, `acct`, clock
//! setting, `sethostname`, `syslog`, `iopl`, `ioperm`, `modify_ldt`, `fanotify_*`,
//! `lookup_dcookie`, `quotactl*`, `memfd_secret`, `process_madvise`, `migrate_pages`,
//! `move_pages` and obsolete calls (`uselib`, `ustat`, `sysfs`, `_sysctl`).

use super::{Arch, ENOSYS};

/// One allowed syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// The kernel's name (as libseccomp and the OCI spec spell it).
    pub name: &'static str,
    /// `Some(arch)` for syscalls that exist only on that architecture (legacy x86_64 calls
    /// that the generic table of aarch64 replaced with `*at` forms).
    pub only_on: Option<Arch>,
    /// Why a normal userland needs it.
    pub reason: &'static str,
    /// Which argument values are allowed.
    pub args: Args,
}

/// The argument values an allowed syscall may be called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// Any arguments.
    Any,
    /// Allowed if at least one alternative holds; an alternative holds if all its checks do.
    /// Checks in one alternative are on distinct argument indices.
    AnyOf(&'static [&'static [ArgCheck]]),
}

/// One comparison of one syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCheck {
    /// Argument index (0-based).
    pub index: u8,
    /// How many bits the kernel reads.
    pub width: Width,
    /// The comparison.
    pub test: Test,
    /// What this check keeps out or lets in.
    pub reason: &'static str,
}

/// How many low bits of the register the kernel reads for an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// `int` / `unsigned int`: the kernel ignores the upper 32 bits, so the filter must too.
    U32,
    /// `unsigned long` / pointers: all 64 bits.
    U64,
}

impl Width {
    /// The mask of the bits the kernel reads.
    pub const fn mask(self) -> u64 {
        match self {
            Width::U32 => 0xffff_ffff,
            Width::U64 => u64::MAX,
        }
    }
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// The argument equals the value.
    Eq(u64),
    /// None of the masked bits is set (`arg & mask == 0`).
    NoBitsOf(u64),
    /// The argument is none of the values.
    NoneOf(&'static [u64]),
}

/// A syscall that is denied with its own errno instead of the policy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrnoOverride {
    /// The kernel's name.
    pub name: &'static str,
    /// The errno returned.
    pub errno: u32,
    /// Why this errno.
    pub reason: &'static str,
}

/// Denied syscalls that return a specific errno, whatever the policy's errno is.
pub const ERRNO_OVERRIDES: &[ErrnoOverride] = &[ErrnoOverride {
    name: "clone3",
    errno: ENOSYS,
    reason: "flags sit in memory the filter cannot read; ENOSYS makes libc fall back to clone, whose flags are checked",
}];

/// An allowed syscall that the `strict` level removes, and why a sandboxed agent tool can
/// do without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrictDrop {
    /// The kernel's name (also in [`ALLOWLIST`]).
    pub name: &'static str,
    /// Why strict drops it.
    pub reason: &'static str,
}

const fn dropped(name: &'static str, reason: &'static str) -> StrictDrop {
    StrictDrop { name, reason }
}

/// What `level = "strict"` removes from [`ALLOWLIST`]: facilities of servers and databases
/// rather than of shells, compilers, git, curl, python or node, each one kernel code that an
/// agent's tools then cannot reach.
pub const STRICT_DROPS: &[StrictDrop] = &[
    dropped(
        "personality",
        "execution domains are for 32-bit builds and old build scripts",
    ),
    dropped("msgget", "SysV IPC is for databases and legacy servers"),
    dropped("msgsnd", "SysV IPC is for databases and legacy servers"),
    dropped("msgrcv", "SysV IPC is for databases and legacy servers"),
    dropped("msgctl", "SysV IPC is for databases and legacy servers"),
    dropped("semget", "SysV IPC is for databases and legacy servers"),
    dropped("semop", "SysV IPC is for databases and legacy servers"),
    dropped("semtimedop", "SysV IPC is for databases and legacy servers"),
    dropped("semctl", "SysV IPC is for databases and legacy servers"),
    dropped("shmget", "SysV IPC is for databases and legacy servers"),
    dropped("shmat", "SysV IPC is for databases and legacy servers"),
    dropped("shmdt", "SysV IPC is for databases and legacy servers"),
    dropped("shmctl", "SysV IPC is for databases and legacy servers"),
    dropped("mq_open", "POSIX message queues are for servers"),
    dropped("mq_unlink", "POSIX message queues are for servers"),
    dropped("mq_timedsend", "POSIX message queues are for servers"),
    dropped("mq_timedreceive", "POSIX message queues are for servers"),
    dropped("mq_notify", "POSIX message queues are for servers"),
    dropped("mq_getsetattr", "POSIX message queues are for servers"),
    dropped(
        "io_setup",
        "libaio is for databases; tools use plain reads and writes",
    ),
    dropped("io_destroy", "libaio is for databases"),
    dropped("io_submit", "libaio is for databases"),
    dropped("io_getevents", "libaio is for databases"),
    dropped("io_pgetevents", "libaio is for databases"),
    dropped("io_cancel", "libaio is for databases"),
    dropped("get_mempolicy", "NUMA tuning is for large servers"),
    dropped("set_mempolicy", "NUMA tuning is for large servers"),
    dropped("mbind", "NUMA tuning is for large servers"),
    dropped("mlock", "locking memory is for key agents and databases"),
    dropped("mlock2", "locking memory is for key agents and databases"),
    dropped("mlockall", "locking memory is for key agents and databases"),
    dropped(
        "vmsplice",
        "zero-copy pipe tricks; a past source of kernel exploits",
    ),
    dropped(
        "sync",
        "flushes every filesystem of the host: a noisy-neighbour lever",
    ),
    dropped("syncfs", "flushes a whole filesystem shared with the host"),
];

/// The newest syscall of the table this allowlist was reviewed against (Linux 6.17).
/// Syscall numbers above it are newer than the review and return ENOSYS, so libc falls back
/// to older calls instead of failing (see the module docs).
pub const REVIEWED_THROUGH: &str = "file_setattr";

// Constants from the kernel's uapi headers. They are the same on x86_64 and aarch64
// (asm-generic values); they are written out here because the `libc` crate only has the
// host's values. A unit test compares them with `libc` on the host.

/// linux/sched.h: the flags that create namespaces.
pub const CLONE_NEWTIME: u64 = 0x0000_0080;
/// linux/sched.h
pub const CLONE_NEWNS: u64 = 0x0002_0000;
/// linux/sched.h
pub const CLONE_NEWCGROUP: u64 = 0x0200_0000;
/// linux/sched.h
pub const CLONE_NEWUTS: u64 = 0x0400_0000;
/// linux/sched.h
pub const CLONE_NEWIPC: u64 = 0x0800_0000;
/// linux/sched.h
pub const CLONE_NEWUSER: u64 = 0x1000_0000;
/// linux/sched.h
pub const CLONE_NEWPID: u64 = 0x2000_0000;
/// linux/sched.h
pub const CLONE_NEWNET: u64 = 0x4000_0000;
/// Every namespace flag. `CLONE_NEWTIME` overlaps the exit-signal byte of `clone()` (it can
/// only be requested through `clone3`/`unshare`), but no signal number reaches 0x80, so
/// masking it never rejects a valid `clone()`.
pub const CLONE_NAMESPACE_FLAGS: u64 = CLONE_NEWTIME
    | CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET;

/// linux/socket.h
pub const AF_UNIX: u64 = 1;
/// linux/socket.h
pub const AF_INET: u64 = 2;
/// linux/socket.h
pub const AF_INET6: u64 = 10;
/// linux/socket.h
pub const AF_NETLINK: u64 = 16;
/// linux/netlink.h
pub const NETLINK_ROUTE: u64 = 0;

/// asm-generic/ioctls.h: push a byte into the terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// asm-generic/ioctls.h: Linux console subcommands (selection paste among them).
pub const TIOCLINUX: u64 = 0x541C;

/// linux/personality.h: the default persona.
pub const PER_LINUX: u64 = 0x0000;
/// linux/personality.h: 32-bit `uname -m`.
pub const PER_LINUX32: u64 = 0x0008;
/// linux/personality.h: report a 2.6.x kernel version.
pub const UNAME26: u64 = 0x0002_0000;
/// personality(2): query the current persona without changing it.
pub const PERSONALITY_QUERY: u64 = 0xffff_ffff;

const fn any(name: &'static str, reason: &'static str) -> Allowed {
    Allowed {
        name,
        only_on: None,
        reason,
        args: Args::Any,
    }
}

const fn x86(name: &'static str, reason: &'static str) -> Allowed {
    Allowed {
        name,
        only_on: Some(Arch::X86_64),
        reason,
        args: Args::Any,
    }
}

const fn when(
    name: &'static str,
    reason: &'static str,
    alternatives: &'static [&'static [ArgCheck]],
) -> Allowed {
    Allowed {
        name,
        only_on: None,
        reason,
        args: Args::AnyOf(alternatives),
    }
}

const fn arg(index: u8, width: Width, test: Test, reason: &'static str) -> ArgCheck {
    ArgCheck {
        index,
        width,
        test,
        reason,
    }
}

/// The allowlist. Names are unique; unit tests check that each exists on its architectures.
pub const ALLOWLIST: &[Allowed] = &[
    // --- file descriptors and file I/O ---
    any("read", "read from a file descriptor"),
    any("write", "write to a file descriptor"),
    any("readv", "scatter read, used by stdio and runtimes"),
    any("writev", "gather write, used by stdio and runtimes"),
    any("pread64", "positioned read (databases, git packfiles)"),
    any("pwrite64", "positioned write"),
    any("preadv", "positioned scatter read"),
    any("pwritev", "positioned gather write"),
    any("preadv2", "positioned scatter read with flags"),
    any("pwritev2", "positioned gather write with flags"),
    any("lseek", "move a file offset"),
    any("close", "close a file descriptor"),
    any(
        "close_range",
        "close many descriptors before exec (glibc, python subprocess)",
    ),
    any("dup", "duplicate a descriptor"),
    x86(
        "dup2",
        "duplicate onto a given descriptor (shell redirections)",
    ),
    any("dup3", "dup2 with O_CLOEXEC"),
    any("fcntl", "descriptor flags, record locks, pipe sizes"),
    any("flock", "advisory whole-file locks (package managers, git)"),
    x86("pipe", "create a pipe (shell pipelines)"),
    any("pipe2", "create a pipe with flags"),
    when(
        "ioctl",
        "terminal control (isatty, window size), FIONREAD and device queries",
        &[&[arg(
            1,
            Width::U32,
            Test::NoneOf(&[TIOCSTI, TIOCLINUX]),
            "no TIOCSTI/TIOCLINUX: injecting keystrokes into a terminal escapes the sandbox",
        )]],
    ),
    any(
        "sendfile",
        "copy between descriptors in the kernel (cp, web servers)",
    ),
    any("splice", "move data between a pipe and a descriptor"),
    any("tee", "duplicate pipe contents"),
    any("vmsplice", "map user pages into a pipe"),
    any("copy_file_range", "in-kernel file copy (coreutils cp)"),
    any("fsync", "flush a file to disk"),
    any("fdatasync", "flush file data to disk"),
    any("syncfs", "flush the filesystem of a descriptor"),
    any("sync", "flush all filesystems (busybox sync)"),
    any("sync_file_range", "flush part of a file"),
    any("fadvise64", "access pattern hints"),
    any("readahead", "prefetch file data"),
    any("fallocate", "preallocate file space"),
    any("truncate", "set a file's length by path"),
    any("ftruncate", "set a file's length"),
    // --- paths and metadata ---
    x86(
        "open",
        "open a file (legacy x86_64 call, still used by static binaries)",
    ),
    any("openat", "open a file relative to a directory"),
    any("openat2", "openat with resolve restrictions"),
    x86("creat", "create a file (legacy)"),
    x86("stat", "file status by path (legacy)"),
    x86("lstat", "file status without following symlinks (legacy)"),
    any("fstat", "file status of a descriptor"),
    any("newfstatat", "file status relative to a directory"),
    any("statx", "extended file status (coreutils, glibc stat)"),
    any("statfs", "filesystem statistics (df)"),
    any("fstatfs", "filesystem statistics of a descriptor"),
    x86("access", "check permissions (legacy)"),
    any("faccessat", "check permissions relative to a directory"),
    any("faccessat2", "faccessat with flags (glibc >= 2.33)"),
    x86("readlink", "read a symlink (legacy)"),
    any("readlinkat", "read a symlink relative to a directory"),
    x86("getdents", "list a directory (legacy)"),
    any("getdents64", "list a directory"),
    any("getcwd", "current directory"),
    any("chdir", "change directory"),
    any("fchdir", "change directory to a descriptor"),
    x86("mkdir", "create a directory (legacy)"),
    any("mkdirat", "create a directory relative to a directory"),
    x86("rmdir", "remove a directory (legacy)"),
    x86("unlink", "remove a file (legacy)"),
    any("unlinkat", "remove a file or directory"),
    x86("rename", "rename (legacy)"),
    any("renameat", "rename relative to directories"),
    any("renameat2", "rename with flags (atomic exchange)"),
    x86("link", "hard link (legacy)"),
    any("linkat", "hard link relative to directories"),
    x86("symlink", "symlink (legacy)"),
    any("symlinkat", "symlink relative to a directory"),
    x86(
        "mknod",
        "create a FIFO (legacy); device nodes need CAP_MKNOD, which is dropped",
    ),
    any(
        "mknodat",
        "create a FIFO (mkfifo); device nodes need CAP_MKNOD, which is dropped",
    ),
    x86("chmod", "change mode (legacy)"),
    any("fchmod", "change mode of a descriptor"),
    any("fchmodat", "change mode relative to a directory"),
    any("fchmodat2", "fchmodat with flags (glibc >= 2.39)"),
    x86("chown", "change owner (legacy); only within the mapped ids"),
    x86("lchown", "change owner of a symlink (legacy)"),
    any("fchown", "change owner of a descriptor"),
    any("fchownat", "change owner relative to a directory"),
    any("umask", "file creation mask"),
    x86("utime", "set file times (legacy)"),
    x86("utimes", "set file times (legacy)"),
    x86(
        "futimesat",
        "set file times relative to a directory (legacy)",
    ),
    any("utimensat", "set file times (touch, tar, cp -p)"),
    any("getxattr", "read an extended attribute (ls, cp -a)"),
    any("lgetxattr", "read an extended attribute of a symlink"),
    any("fgetxattr", "read an extended attribute of a descriptor"),
    any("listxattr", "list extended attributes"),
    any("llistxattr", "list extended attributes of a symlink"),
    any("flistxattr", "list extended attributes of a descriptor"),
    any(
        "setxattr",
        "set an extended attribute (cp -a, tar --xattrs)",
    ),
    any("lsetxattr", "set an extended attribute of a symlink"),
    any("fsetxattr", "set an extended attribute of a descriptor"),
    any("removexattr", "remove an extended attribute"),
    any("lremovexattr", "remove an extended attribute of a symlink"),
    any(
        "fremovexattr",
        "remove an extended attribute of a descriptor",
    ),
    x86("inotify_init", "file change notification (legacy)"),
    any(
        "inotify_init1",
        "file change notification (watchers in node, python tools)",
    ),
    any("inotify_add_watch", "watch a path"),
    any("inotify_rm_watch", "stop watching a path"),
    // --- memory ---
    any("brk", "heap"),
    any("mmap", "map memory and files"),
    any("munmap", "unmap memory"),
    any("mprotect", "change memory protection (loaders, JITs)"),
    any("mremap", "grow or move a mapping (realloc)"),
    any("msync", "flush a file mapping"),
    any("madvise", "memory usage hints (allocators)"),
    any("mincore", "page residency queries"),
    any(
        "mlock",
        "lock pages in memory, within RLIMIT_MEMLOCK (gpg, ssh-agent)",
    ),
    any("mlock2", "mlock with flags"),
    any("munlock", "unlock pages"),
    any("mlockall", "lock the address space, within RLIMIT_MEMLOCK"),
    any("munlockall", "unlock the address space"),
    any(
        "mseal",
        "seal mappings against change; only restricts the caller",
    ),
    any(
        "memfd_create",
        "anonymous files (JITs, python multiprocessing, shared memory)",
    ),
    any(
        "membarrier",
        "memory barriers across threads (runtimes, liburcu)",
    ),
    any(
        "pkey_alloc",
        "memory protection keys; only restricts the caller",
    ),
    any("pkey_free", "free a memory protection key"),
    any("pkey_mprotect", "mprotect with a protection key"),
    any(
        "map_shadow_stack",
        "shadow stacks for new threads (glibc with x86 CET or arm64 GCS)",
    ),
    any("get_mempolicy", "NUMA policy query (libnuma, JVM)"),
    any("set_mempolicy", "NUMA policy of the caller"),
    any("mbind", "NUMA policy of a mapping"),
    // --- processes and threads ---
    when(
        "clone",
        "create threads and processes (pthread_create, fork, posix_spawn)",
        &[&[arg(
            0,
            Width::U64,
            Test::NoBitsOf(CLONE_NAMESPACE_FLAGS),
            "no CLONE_NEW* flags: a new namespace (user namespace above all) is kernel attack surface",
        )]],
    ),
    x86("fork", "create a process (legacy)"),
    x86(
        "vfork",
        "create a process sharing memory until exec (busybox, posix_spawn)",
    ),
    any("execve", "run a program"),
    any("execveat", "run a program from a descriptor (fexecve)"),
    any("exit", "end a thread"),
    any("exit_group", "end a process"),
    any("wait4", "reap a child"),
    any("waitid", "reap a child (python, posix_spawn)"),
    any("getpid", "own process id"),
    any("getppid", "parent process id"),
    any("gettid", "own thread id"),
    any(
        "set_tid_address",
        "thread id address for futex wake-up on exit (libc start-up)",
    ),
    any("set_robust_list", "robust futex list (glibc threads)"),
    any(
        "rseq",
        "restartable sequences (glibc >= 2.35 registers one per thread)",
    ),
    any("futex", "thread synchronisation"),
    any("futex_waitv", "wait on several futexes"),
    any("futex_wake", "futex2 wake (Linux 6.7)"),
    any("futex_wait", "futex2 wait (Linux 6.7)"),
    any("futex_requeue", "futex2 requeue (Linux 6.7)"),
    x86("arch_prctl", "set the thread pointer (TLS) at start-up"),
    any(
        "prctl",
        "process name, parent-death signal, no_new_privs, THP and similar settings; the options that could widen access need capabilities the sandbox drops",
    ),
    when(
        "personality",
        "execution domain, e.g. setarch linux32",
        &[
            &[arg(
                0,
                Width::U32,
                Test::Eq(PER_LINUX),
                "the default persona",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(PER_LINUX32),
                "32-bit uname -m for 32-bit builds",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(UNAME26),
                "report a 2.6 kernel for old build scripts",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(PER_LINUX32 | UNAME26),
                "both of the above",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(PERSONALITY_QUERY),
                "query the persona without changing it",
            )],
        ],
    ),
    any(
        "seccomp",
        "add a stricter filter of one's own (browsers, sandboxed tools); can only narrow",
    ),
    any(
        "landlock_create_ruleset",
        "Landlock self-restriction; can only narrow",
    ),
    any(
        "landlock_add_rule",
        "Landlock self-restriction; can only narrow",
    ),
    any(
        "landlock_restrict_self",
        "Landlock self-restriction; can only narrow",
    ),
    any("capget", "read capabilities (libcap, ping, shells)"),
    any(
        "capset",
        "drop capabilities; raising needs capabilities the sandbox drops",
    ),
    any("getuid", "real user id"),
    any("geteuid", "effective user id"),
    any("getgid", "real group id"),
    any("getegid", "effective group id"),
    any("getresuid", "all user ids"),
    any("getresgid", "all group ids"),
    any("getgroups", "supplementary groups"),
    any(
        "setuid",
        "change user id; without CAP_SETUID only to ids already held",
    ),
    any(
        "setgid",
        "change group id; without CAP_SETGID only to ids already held",
    ),
    any("setreuid", "swap user ids already held"),
    any("setregid", "swap group ids already held"),
    any("setresuid", "set user ids already held"),
    any("setresgid", "set group ids already held"),
    any(
        "setfsuid",
        "filesystem user id, limited to ids already held",
    ),
    any(
        "setfsgid",
        "filesystem group id, limited to ids already held",
    ),
    any(
        "setgroups",
        "set supplementary groups; needs CAP_SETGID, which is dropped",
    ),
    any("setpgid", "process groups (shell job control)"),
    any("getpgid", "process group of a process"),
    x86("getpgrp", "own process group (legacy)"),
    any("setsid", "new session (daemons, terminals)"),
    any("getsid", "session id"),
    any("getpriority", "scheduling priority"),
    any(
        "setpriority",
        "nice; raising priority needs CAP_SYS_NICE, which is dropped",
    ),
    any("sched_yield", "yield the CPU"),
    any(
        "sched_getaffinity",
        "CPU affinity (nproc, runtimes sizing thread pools)",
    ),
    any(
        "sched_setaffinity",
        "pin to CPUs within the cgroup's cpuset",
    ),
    any("sched_getparam", "scheduling parameters"),
    any(
        "sched_setparam",
        "scheduling parameters; real-time needs CAP_SYS_NICE",
    ),
    any("sched_getscheduler", "scheduling policy"),
    any(
        "sched_setscheduler",
        "scheduling policy; real-time needs CAP_SYS_NICE",
    ),
    any("sched_getattr", "scheduling attributes"),
    any(
        "sched_setattr",
        "scheduling attributes; real-time needs CAP_SYS_NICE",
    ),
    any("sched_get_priority_max", "priority range"),
    any("sched_get_priority_min", "priority range"),
    any("sched_rr_get_interval", "round-robin time slice"),
    any("ioprio_get", "I/O priority (ionice)"),
    any(
        "ioprio_set",
        "I/O priority; real-time class needs CAP_SYS_ADMIN",
    ),
    any("getrlimit", "resource limits"),
    any(
        "setrlimit",
        "lower resource limits; raising hard limits needs CAP_SYS_RESOURCE",
    ),
    any("prlimit64", "get and lower resource limits (ulimit)"),
    any("getrusage", "resource usage (time, make)"),
    any("times", "process times"),
    any("getcpu", "current CPU"),
    any("sysinfo", "uptime and memory totals (free, uptime)"),
    any("uname", "kernel name and version"),
    // --- signals ---
    any("rt_sigaction", "install a signal handler"),
    any("rt_sigprocmask", "block and unblock signals"),
    any("rt_sigreturn", "return from a signal handler"),
    any("rt_sigpending", "pending signals"),
    any("rt_sigsuspend", "wait for a signal"),
    any("rt_sigtimedwait", "wait for a signal with a timeout"),
    any(
        "rt_sigqueueinfo",
        "queue a signal with data to a process in the sandbox",
    ),
    any("rt_tgsigqueueinfo", "queue a signal with data to a thread"),
    any(
        "sigaltstack",
        "alternate signal stack (stack overflow handlers)",
    ),
    x86("signalfd", "signals through a descriptor (legacy)"),
    any("signalfd4", "signals through a descriptor"),
    x86("pause", "wait for a signal (legacy)"),
    any(
        "kill",
        "signal a process; the pid namespace limits the targets",
    ),
    any("tkill", "signal a thread"),
    any("tgkill", "signal a thread of a process (raise, abort)"),
    any(
        "pidfd_open",
        "descriptor for a child process (python >= 3.9, systemd-style waiting)",
    ),
    any("pidfd_send_signal", "signal through a pidfd"),
    any(
        "restart_syscall",
        "kernel-internal restart of an interrupted sleep",
    ),
    // --- time ---
    any("clock_gettime", "read a clock (usually through the vDSO)"),
    any("clock_getres", "clock resolution"),
    any("clock_nanosleep", "sleep on a clock"),
    any("nanosleep", "sleep"),
    any("gettimeofday", "wall-clock time (usually through the vDSO)"),
    x86("time", "wall-clock seconds (legacy)"),
    x86("alarm", "SIGALRM timer (legacy)"),
    any("getitimer", "interval timers"),
    any(
        "setitimer",
        "interval timers (timeouts in shells and python)",
    ),
    any("timer_create", "POSIX timers"),
    any("timer_delete", "POSIX timers"),
    any("timer_gettime", "POSIX timers"),
    any("timer_settime", "POSIX timers"),
    any("timer_getoverrun", "POSIX timers"),
    any(
        "timerfd_create",
        "timers through a descriptor (event loops)",
    ),
    any("timerfd_settime", "arm a timerfd"),
    any("timerfd_gettime", "read a timerfd"),
    // --- event loops ---
    x86("epoll_create", "event loop (legacy)"),
    any("epoll_create1", "event loop (node, python asyncio)"),
    any("epoll_ctl", "register with an event loop"),
    x86("epoll_wait", "wait in an event loop (legacy)"),
    any("epoll_pwait", "wait in an event loop"),
    any(
        "epoll_pwait2",
        "wait in an event loop with a precise timeout",
    ),
    x86("poll", "wait for descriptors (legacy)"),
    any("ppoll", "wait for descriptors"),
    x86("select", "wait for descriptors (legacy)"),
    any("pselect6", "wait for descriptors"),
    x86("eventfd", "event counter descriptor (legacy)"),
    any("eventfd2", "event counter descriptor (event loops, glib)"),
    // --- asynchronous I/O (libaio, not io_uring) ---
    any(
        "io_setup",
        "libaio context (databases); goes through normal file permission checks",
    ),
    any("io_destroy", "libaio context teardown"),
    any("io_submit", "libaio submission"),
    any("io_getevents", "libaio completion"),
    any("io_pgetevents", "libaio completion with a signal mask"),
    any("io_cancel", "libaio cancellation"),
    // --- networking ---
    when(
        "socket",
        "create a socket",
        &[
            &[arg(
                0,
                Width::U32,
                Test::Eq(AF_UNIX),
                "AF_UNIX: local IPC (proxy socket, dbus-less tools)",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(AF_INET),
                "AF_INET: TCP/UDP; the network namespace and proxy decide reachability",
            )],
            &[arg(
                0,
                Width::U32,
                Test::Eq(AF_INET6),
                "AF_INET6: TCP/UDP over IPv6",
            )],
            &[
                arg(
                    0,
                    Width::U32,
                    Test::Eq(AF_NETLINK),
                    "AF_NETLINK, only with the next check",
                ),
                arg(
                    2,
                    Width::U32,
                    Test::Eq(NETLINK_ROUTE),
                    "NETLINK_ROUTE only: getaddrinfo/getifaddrs read interfaces; changes need CAP_NET_ADMIN",
                ),
            ],
        ],
    ),
    when(
        "socketpair",
        "connected socket pairs (subprocess plumbing, event loops)",
        &[&[arg(
            0,
            Width::U32,
            Test::Eq(AF_UNIX),
            "AF_UNIX, the only useful family for pairs",
        )]],
    ),
    any("connect", "connect a socket"),
    any("bind", "bind a socket (local servers, test fixtures)"),
    any("listen", "listen on a socket"),
    any("accept", "accept a connection"),
    any("accept4", "accept a connection with flags"),
    any("getsockname", "local address of a socket"),
    any("getpeername", "remote address of a socket"),
    any("getsockopt", "socket options"),
    any(
        "setsockopt",
        "socket options; privileged ones need capabilities the sandbox drops",
    ),
    any("sendto", "send a datagram or stream data"),
    any("recvfrom", "receive a datagram or stream data"),
    any("sendmsg", "send with ancillary data (fd passing)"),
    any("recvmsg", "receive with ancillary data"),
    any("sendmmsg", "send many datagrams (DNS resolvers)"),
    any("recvmmsg", "receive many datagrams"),
    any("shutdown", "half-close a socket"),
    // --- System V and POSIX IPC (confined to the container's IPC namespace) ---
    any(
        "msgget",
        "SysV message queue in the sandbox's IPC namespace",
    ),
    any("msgsnd", "SysV message queue"),
    any("msgrcv", "SysV message queue"),
    any("msgctl", "SysV message queue"),
    any(
        "semget",
        "SysV semaphores (databases, python multiprocessing)",
    ),
    any("semop", "SysV semaphores"),
    any("semtimedop", "SysV semaphores"),
    any("semctl", "SysV semaphores"),
    any("shmget", "SysV shared memory"),
    any("shmat", "SysV shared memory"),
    any("shmdt", "SysV shared memory"),
    any("shmctl", "SysV shared memory"),
    any(
        "mq_open",
        "POSIX message queues in the sandbox's IPC namespace",
    ),
    any("mq_unlink", "POSIX message queues"),
    any("mq_timedsend", "POSIX message queues"),
    any("mq_timedreceive", "POSIX message queues"),
    any("mq_notify", "POSIX message queues"),
    any("mq_getsetattr", "POSIX message queues"),
    // --- randomness ---
    any("getrandom", "random bytes (libc, TLS, hash seeds)"),
];
