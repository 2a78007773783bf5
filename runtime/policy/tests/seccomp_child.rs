//! Loads the generated seccomp BPF into a real kernel and attacks it.
//!
//! The test re-executes its own binary three times as a child (selected by the
//! `AGENT_SANDBOX_SECCOMP_CHILD` variable): once without a filter, and once each with the
//! host's filter compiled for `errno = "EPERM"` and `errno = "EACCES"`. Every child performs
//! the same raw syscalls and prints one `SECCOMP-PROBE` JSON line per call, then runs a
//! busybox workload (sh, ls, cat, wget to an HTTP server this test runs on 127.0.0.1).
//!
//! The parent then proves that:
//! - under the filter every required denial returns exactly the configured errno (EACCES
//!   is one no kernel path here returns, so each denial is the filter's answer), and `clone3`
//!   returns ENOSYS;
//! - without the filter the same calls get through or fail differently (io_uring, unshare,
//!   personality and process_vm_readv succeed), so the test can fail;
//! - the allowed calls and the busybox workload still work under the filter;
//! - (x86_64) a syscall entered through the i386 table (`int 0x80`) kills the process, while
//!   without the filter it returns the pid.
//!
//! Attempting forbidden syscalls needs raw `libc::syscall`, hence `unsafe` in this file only.
#![allow(unsafe_code)]
#![allow(clippy::too_many_lines)]
// a test may be a long scenario
// A test binary: a failed set-up step must stop the test loudly, in helpers too.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use agent_sandbox_policy::seccomp::{Arch, DenyErrno, SyscallPolicy, compile_bpf};
use serde_json::{Value, json};

/// `libc::syscall` with every argument widened to a `c_long` first. The call is variadic, so a
/// bare `0` would travel as a 32-bit `int` and leave the register's upper half undefined: the
/// kernel reads all 64 bits of `size_t` and pointer arguments, and a probe would fail with
/// `EINVAL` depending on what the compiler left there.
macro_rules! raw_syscall {
    ($nr:expr $(, $arg:expr)* $(,)?) => {{
        // The register keeps the argument's bits; wrapping is the point.
        #[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
        let ret = libc::syscall($nr $(, ($arg) as libc::c_long)*);
        ret
    }};
}

const CHILD_ENV: &str = "AGENT_SANDBOX_SECCOMP_CHILD";
const PORT_ENV: &str = "AGENT_SANDBOX_SECCOMP_PORT";
const FILE_ENV: &str = "AGENT_SANDBOX_SECCOMP_FILE";
const BUSYBOX: &str = "/bin/busybox";
const TEST_NAME: &str = "filter_blocks_required_syscalls_and_keeps_busybox_working";
const HTTP_BODY: &str = "hello through wget under seccomp\n";
const FILE_BODY: &str = "hello through cat under seccomp\n";

// Values from the kernel's uapi headers that `libc` lacks or spells differently.
const PF_KEY_V2: libc::c_long = 2;
const NETLINK_AUDIT: libc::c_long = 9;
const ADDR_NO_RANDOMIZE: libc::c_long = 0x0040000;
const PERSONALITY_QUERY: libc::c_long = 0xffff_ffff;
/// Size of `struct io_uring_params` (linux/io_uring.h).
const IO_URING_PARAMS_SIZE: usize = 120;

/// One raw syscall attempt.
struct Probe {
    name: &'static str,
    /// Whether the policy must deny it.
    blocked: bool,
    call: fn() -> libc::c_long,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn close_if_fd(ret: libc::c_long) {
    if let Ok(fd) = i32::try_from(ret)
        && fd > 2
    {
        // SAFETY: `fd` was just returned by the kernel to this process and nothing else
        // owns it.
        unsafe { libc::close(fd) };
    }
}

fn dev_null() -> std::fs::File {
    std::fs::File::open("/dev/null").expect("open /dev/null")
}

fn clone_with(flag: libc::c_int) -> libc::c_long {
    // CLONE_SIGHAND without CLONE_VM makes the kernel answer EINVAL before it creates
    // anything, so an unfiltered run never forks; the filter must answer first.
    let flags = libc::c_long::from(flag | libc::CLONE_SIGHAND);
    // SAFETY: raw clone with only null pointers; the flag combination is rejected by the
    // kernel (or the filter) before any process is created.
    unsafe { raw_syscall!(libc::SYS_clone, flags, 0, 0, 0, 0) }
}

fn socket(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_long) -> libc::c_long {
    // SAFETY: socket() takes no pointers; a returned descriptor is closed by the caller.
    unsafe {
        raw_syscall!(
            libc::SYS_socket,
            libc::c_long::from(domain),
            libc::c_long::from(kind),
            protocol,
        )
    }
}

fn ioctl_request(request: u64) -> libc::c_long {
    let file = dev_null();
    let mut byte: u8 = b'x';
    // SAFETY: the third argument points at a live local byte; on /dev/null every terminal
    // ioctl fails with ENOTTY without touching it.
    unsafe {
        raw_syscall!(
            libc::SYS_ioctl,
            libc::c_long::from(file.as_raw_fd()),
            request,
            &mut byte as *mut u8,
        )
    }
}

fn fionread(request: u64) -> libc::c_long {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a live array of two ints, as pipe(2) requires.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return -1;
    }
    let mut queued: libc::c_int = -1;
    // SAFETY: FIONREAD writes one int into `queued`, which is live for the call.
    let ret = unsafe {
        raw_syscall!(
            libc::SYS_ioctl,
            libc::c_long::from(fds[0]),
            request,
            &mut queued as *mut libc::c_int,
        )
    };
    let saved = errno();
    // SAFETY: both descriptors were just created by pipe() and are owned here.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    if ret != 0 {
        // SAFETY: errno is thread-local; restore it so the caller reports the ioctl's errno.
        unsafe { *libc::__errno_location() = saved };
    }
    ret
}

fn probes() -> Vec<Probe> {
    vec![
        Probe {
            name: "io_uring_setup",
            blocked: true,
            call: || {
                let mut params = [0u8; IO_URING_PARAMS_SIZE];
                // SAFETY: `params` is a zeroed, live buffer of the size of io_uring_params,
                // which the kernel reads and fills.
                let ret = unsafe { raw_syscall!(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "io_uring_enter",
            blocked: true,
            // SAFETY: invalid descriptor and null pointers; the kernel dereferences nothing.
            call: || unsafe { raw_syscall!(libc::SYS_io_uring_enter, -1, 0, 0, 0, 0, 0) },
        },
        Probe {
            name: "io_uring_register",
            blocked: true,
            // SAFETY: invalid descriptor and a null pointer.
            call: || unsafe { raw_syscall!(libc::SYS_io_uring_register, -1, 0, 0, 0) },
        },
        Probe {
            name: "ptrace",
            blocked: true,
            // SAFETY: PEEKDATA on a pid that cannot exist: nothing is attached or written.
            call: || unsafe {
                raw_syscall!(libc::SYS_ptrace, libc::PTRACE_PEEKDATA, i32::MAX, 0, 0)
            },
        },
        Probe {
            name: "process_vm_readv",
            blocked: true,
            // SAFETY: zero iovecs of our own process: the kernel copies nothing.
            call: || unsafe {
                raw_syscall!(libc::SYS_process_vm_readv, libc::getpid(), 0, 0, 0, 0, 0)
            },
        },
        Probe {
            name: "process_vm_writev",
            blocked: true,
            // SAFETY: zero iovecs of our own process: the kernel copies nothing.
            call: || unsafe {
                raw_syscall!(libc::SYS_process_vm_writev, libc::getpid(), 0, 0, 0, 0, 0)
            },
        },
        Probe {
            name: "bpf",
            blocked: true,
            // SAFETY: BPF_MAP_CREATE with a null attribute pointer fails before any use.
            call: || unsafe { raw_syscall!(libc::SYS_bpf, 0, 0, 0) },
        },
        Probe {
            name: "perf_event_open",
            blocked: true,
            // SAFETY: null attribute pointer: EFAULT at most.
            call: || unsafe { raw_syscall!(libc::SYS_perf_event_open, 0, 0, -1, -1, 0) },
        },
        Probe {
            name: "keyctl",
            blocked: true,
            // SAFETY: KEYCTL_GET_KEYRING_ID of the session keyring without creating it:
            // no pointers.
            call: || unsafe { raw_syscall!(libc::SYS_keyctl, 0, -3, 0) },
        },
        Probe {
            name: "add_key",
            blocked: true,
            // SAFETY: null type pointer: EFAULT at most.
            call: || unsafe { raw_syscall!(libc::SYS_add_key, 0, 0, 0, 0, -3) },
        },
        Probe {
            name: "request_key",
            blocked: true,
            // SAFETY: null type pointer: EFAULT at most.
            call: || unsafe { raw_syscall!(libc::SYS_request_key, 0, 0, 0, 0) },
        },
        Probe {
            name: "mount",
            blocked: true,
            // SAFETY: null paths: EFAULT at most, nothing is mounted.
            call: || unsafe { raw_syscall!(libc::SYS_mount, 0, 0, 0, 0, 0) },
        },
        Probe {
            name: "umount2",
            blocked: true,
            // SAFETY: null path.
            call: || unsafe { raw_syscall!(libc::SYS_umount2, 0, 0) },
        },
        Probe {
            name: "pivot_root",
            blocked: true,
            // SAFETY: null paths.
            call: || unsafe { raw_syscall!(libc::SYS_pivot_root, 0, 0) },
        },
        Probe {
            name: "move_mount",
            blocked: true,
            // SAFETY: invalid descriptors and null paths.
            call: || unsafe { raw_syscall!(libc::SYS_move_mount, -1, 0, -1, 0, 0) },
        },
        Probe {
            name: "fsopen",
            blocked: true,
            // SAFETY: null filesystem name.
            call: || unsafe { raw_syscall!(libc::SYS_fsopen, 0, 0) },
        },
        Probe {
            name: "fsmount",
            blocked: true,
            // SAFETY: invalid descriptor, no pointers.
            call: || unsafe { raw_syscall!(libc::SYS_fsmount, -1, 0, 0) },
        },
        Probe {
            name: "fsconfig",
            blocked: true,
            // SAFETY: invalid descriptor and null pointers.
            call: || unsafe { raw_syscall!(libc::SYS_fsconfig, -1, 0, 0, 0, 0) },
        },
        Probe {
            name: "fspick",
            blocked: true,
            // SAFETY: invalid descriptor and null path.
            call: || unsafe { raw_syscall!(libc::SYS_fspick, -1, 0, 0) },
        },
        Probe {
            name: "open_tree",
            blocked: true,
            // SAFETY: invalid descriptor and null path.
            call: || unsafe { raw_syscall!(libc::SYS_open_tree, -1, 0, 0) },
        },
        Probe {
            name: "unshare",
            blocked: true,
            // SAFETY: unshare(0) changes nothing and takes no pointers.
            call: || unsafe { raw_syscall!(libc::SYS_unshare, 0) },
        },
        Probe {
            name: "setns",
            blocked: true,
            // SAFETY: invalid descriptor.
            call: || unsafe { raw_syscall!(libc::SYS_setns, -1, 0) },
        },
        Probe {
            name: "clone(CLONE_NEWUSER)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWUSER),
        },
        Probe {
            name: "clone(CLONE_NEWNS)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWNS),
        },
        Probe {
            name: "clone(CLONE_NEWUTS)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWUTS),
        },
        Probe {
            name: "clone(CLONE_NEWIPC)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWIPC),
        },
        Probe {
            name: "clone(CLONE_NEWPID)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWPID),
        },
        Probe {
            name: "clone(CLONE_NEWNET)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWNET),
        },
        Probe {
            name: "clone(CLONE_NEWCGROUP)",
            blocked: true,
            call: || clone_with(libc::CLONE_NEWCGROUP),
        },
        Probe {
            name: "clone3",
            blocked: true,
            // SAFETY: null clone_args with size 0: rejected before anything is created.
            call: || unsafe { raw_syscall!(libc::SYS_clone3, 0, 0) },
        },
        Probe {
            name: "userfaultfd",
            blocked: true,
            call: || {
                // SAFETY: no pointers; a returned descriptor is closed.
                let ret = unsafe { raw_syscall!(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "kexec_load",
            blocked: true,
            // SAFETY: all-ones flags are invalid, so even a privileged caller loads and
            // unloads nothing; null segment pointer.
            call: || unsafe { raw_syscall!(libc::SYS_kexec_load, 0, 0, 0, 0xffff_ffffu32) },
        },
        Probe {
            name: "kexec_file_load",
            blocked: true,
            // SAFETY: invalid descriptors, null command line, invalid flags.
            call: || unsafe {
                raw_syscall!(libc::SYS_kexec_file_load, -1, -1, 0, 0, 0xffff_ffffu32)
            },
        },
        Probe {
            name: "open_by_handle_at",
            blocked: true,
            // SAFETY: invalid descriptor and null handle pointer.
            call: || unsafe { raw_syscall!(libc::SYS_open_by_handle_at, -1, 0, 0) },
        },
        Probe {
            name: "init_module",
            blocked: true,
            // SAFETY: null image of length 0 and null parameters.
            call: || unsafe { raw_syscall!(libc::SYS_init_module, 0, 0, 0) },
        },
        Probe {
            name: "finit_module",
            blocked: true,
            // SAFETY: invalid descriptor and null parameters.
            call: || unsafe { raw_syscall!(libc::SYS_finit_module, -1, 0, 0) },
        },
        Probe {
            name: "delete_module",
            blocked: true,
            // SAFETY: null module name.
            call: || unsafe { raw_syscall!(libc::SYS_delete_module, 0, 0) },
        },
        Probe {
            name: "personality(ADDR_NO_RANDOMIZE)",
            blocked: true,
            // SAFETY: no pointers; only this short-lived child's persona changes.
            call: || unsafe { raw_syscall!(libc::SYS_personality, ADDR_NO_RANDOMIZE) },
        },
        Probe {
            name: "socket(AF_VSOCK)",
            blocked: true,
            call: || socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
        },
        Probe {
            name: "socket(AF_ALG)",
            blocked: true,
            call: || socket(libc::AF_ALG, libc::SOCK_SEQPACKET, 0),
        },
        Probe {
            name: "socket(AF_PACKET)",
            blocked: true,
            call: || {
                let ret = socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socket(AF_KEY)",
            blocked: true,
            call: || {
                let ret = socket(libc::AF_KEY, libc::SOCK_RAW, PF_KEY_V2);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socket(AF_NETLINK, NETLINK_AUDIT)",
            blocked: true,
            call: || {
                let ret = socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_AUDIT);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socketpair(AF_INET)",
            blocked: true,
            call: || {
                let mut fds = [0 as libc::c_int; 2];
                // SAFETY: `fds` is a live array of two ints, as socketpair(2) requires.
                unsafe {
                    raw_syscall!(
                        libc::SYS_socketpair,
                        libc::AF_INET,
                        libc::SOCK_STREAM,
                        0,
                        fds.as_mut_ptr(),
                    )
                }
            },
        },
        Probe {
            name: "ioctl(TIOCSTI)",
            blocked: true,
            call: || ioctl_request(libc::TIOCSTI),
        },
        Probe {
            name: "ioctl(TIOCSTI | 1 << 32)",
            blocked: true,
            call: || ioctl_request(libc::TIOCSTI | 1 << 32),
        },
        Probe {
            name: "ioctl(TIOCLINUX)",
            blocked: true,
            call: || ioctl_request(libc::TIOCLINUX),
        },
        // --- allowed: must keep working under the filter ---
        Probe {
            name: "getpid",
            blocked: false,
            // SAFETY: no arguments.
            call: || unsafe { raw_syscall!(libc::SYS_getpid) },
        },
        Probe {
            name: "personality(query)",
            blocked: false,
            // SAFETY: the query value changes nothing.
            call: || unsafe { raw_syscall!(libc::SYS_personality, PERSONALITY_QUERY) },
        },
        Probe {
            name: "socket(AF_UNIX)",
            blocked: false,
            call: || {
                let ret = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socket(AF_INET)",
            blocked: false,
            call: || {
                let ret = socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socket(AF_INET6)",
            blocked: false,
            call: || {
                let ret = socket(libc::AF_INET6, libc::SOCK_DGRAM, 0);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "socket(AF_NETLINK, NETLINK_ROUTE)",
            blocked: false,
            call: || {
                let ret = socket(libc::AF_NETLINK, libc::SOCK_RAW, 0);
                close_if_fd(ret);
                ret
            },
        },
        Probe {
            name: "ioctl(FIONREAD)",
            blocked: false,
            call: || fionread(libc::FIONREAD),
        },
        Probe {
            name: "ioctl(FIONREAD, sign-extended)",
            blocked: false,
            call: || fionread(libc::FIONREAD | 0xffff_ffff_0000_0000),
        },
    ]
}

/// Child mode: optionally load the filter, run every probe and the busybox workload.
fn child(mode: &str) {
    if let Some(errno) = mode.strip_prefix("filtered:") {
        let errno = match errno {
            "EPERM" => DenyErrno::Eperm,
            "EACCES" => DenyErrno::Eacces,
            other => panic!("unknown errno {other}"),
        };
        let policy = SyscallPolicy {
            errno,
            ..SyscallPolicy::default()
        };
        let arch = Arch::host().expect("supported host architecture");
        let program = compile_bpf(&policy, arch).expect("compile the filter");
        // apply_filter sets PR_SET_NO_NEW_PRIVS itself, then loads the program into this
        // thread; processes spawned from it inherit both.
        seccompiler::apply_filter(&program).expect("load the filter");
    }
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
    for line in status.lines() {
        if line.starts_with("Seccomp:") || line.starts_with("NoNewPrivs:") {
            println!("SECCOMP-STATUS {}", line.replace('\t', ""));
        }
    }
    for probe in probes() {
        let ret = (probe.call)();
        let errno = if ret < 0 { errno() } else { 0 };
        let line =
            json!({"name": probe.name, "blocked": probe.blocked, "ret": ret, "errno": errno});
        println!("SECCOMP-PROBE {line}");
    }
    let port = std::env::var(PORT_ENV).expect("port");
    let file = std::env::var(FILE_ENV).expect("file");
    let script = format!(
        "set -e; {BUSYBOX} ls -l / >/dev/null; {BUSYBOX} cat '{file}'; \
         {BUSYBOX} wget -q -O - http://127.0.0.1:{port}/hello; echo done"
    );
    let out = Command::new(BUSYBOX)
        .args(["sh", "-c", &script])
        .output()
        .expect("spawn busybox under the filter");
    let line = json!({
        "code": out.status.code(),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
    });
    println!("SECCOMP-WORKLOAD {line}");
}

/// A fixture HTTP server on 127.0.0.1: answers every request with a fixed 200 response.
/// Written by hand (no HTTP crate) because it never parses more than the header terminator.
fn serve_http() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let response = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{HTTP_BODY}",
                HTTP_BODY.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

struct ChildRun {
    probes: BTreeMap<String, (bool, i64, i32)>,
    status: Vec<String>,
    workload: Value,
}

fn run_child(mode: &str, port: u16, file: &Path) -> ChildRun {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env(PORT_ENV, port.to_string())
        .env(FILE_ENV, file)
        .output()
        .expect("re-execute the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{mode} child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut run = ChildRun {
        probes: BTreeMap::new(),
        status: Vec::new(),
        workload: Value::Null,
    };
    // libtest prints "test NAME ... " before the test's own output on the same line.
    let tagged = stdout
        .lines()
        .filter_map(|line| line.find("SECCOMP-").map(|at| &line[at..]));
    for line in tagged {
        if let Some(rest) = line.strip_prefix("SECCOMP-PROBE ") {
            let v: Value = serde_json::from_str(rest).expect("probe line");
            let name = v["name"].as_str().expect("name").to_owned();
            let blocked = v["blocked"].as_bool().expect("blocked");
            let ret = v["ret"].as_i64().expect("ret");
            let errno = i32::try_from(v["errno"].as_i64().expect("errno")).expect("errno");
            run.probes.insert(name, (blocked, ret, errno));
        } else if let Some(rest) = line.strip_prefix("SECCOMP-STATUS ") {
            run.status.push(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("SECCOMP-WORKLOAD ") {
            run.workload = serde_json::from_str(rest).expect("workload line");
        }
    }
    assert_eq!(
        run.probes.len(),
        probes().len(),
        "{mode}: missing probe lines\n{stdout}"
    );
    run
}

fn errno_name(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[test]
fn filter_blocks_required_syscalls_and_keeps_busybox_working() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
        return;
    }
    assert!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing: install the Debian package busybox-static (hack/install-deps.sh)"
    );
    let port = serve_http();
    let file = std::env::temp_dir().join(format!("seccomp-child-{}.txt", std::process::id()));
    std::fs::write(&file, FILE_BODY).expect("write the fixture file");

    let open = run_child("unfiltered", port, &file);
    let eperm = run_child("filtered:EPERM", port, &file);
    let eacces = run_child("filtered:EACCES", port, &file);
    let _ = std::fs::remove_file(&file);

    let mut table = String::new();
    for (name, (blocked, ret, errno)) in &open.probes {
        let (_, fret, ferrno) = eperm.probes[name];
        table.push_str(&format!(
            "{name:40} blocked={blocked:5} unfiltered: ret={ret} {:25} filtered(EPERM): ret={fret} {}\n",
            if *ret < 0 { errno_name(*errno) } else { "ok".into() },
            if fret < 0 { errno_name(ferrno) } else { "ok".into() },
        ));
    }
    println!("{table}");

    // The filter is really loaded in the filtered children, and absent in the other.
    for run in [&eperm, &eacces] {
        assert!(
            run.status.contains(&"Seccomp:2".to_owned()),
            "{:?}",
            run.status
        );
        assert!(
            run.status.contains(&"NoNewPrivs:1".to_owned()),
            "{:?}",
            run.status
        );
    }
    assert!(
        open.status.contains(&"Seccomp:0".to_owned()),
        "{:?}",
        open.status
    );

    for (name, (blocked, _, _)) in &open.probes {
        for (run, configured) in [(&eperm, libc::EPERM), (&eacces, libc::EACCES)] {
            let (_, ret, errno) = run.probes[name];
            if *blocked {
                let expected = if name == "clone3" {
                    libc::ENOSYS
                } else {
                    configured
                };
                assert_eq!(
                    (ret, errno),
                    (-1, expected),
                    "{name} under the filter: {}\n{table}",
                    errno_name(errno)
                );
            } else {
                assert!(
                    ret >= 0,
                    "{name} must stay allowed: {}\n{table}",
                    errno_name(errno)
                );
            }
        }
    }

    // Without the filter nothing answers EACCES, so every denial above was the filter's.
    for (name, (_, ret, errno)) in &open.probes {
        assert!(
            !(*ret == -1 && *errno == libc::EACCES),
            "{name} fails with EACCES even without the filter\n{table}"
        );
    }
    // And the attacks that need no privilege do get through without it.
    for name in [
        "io_uring_setup",
        "unshare",
        "process_vm_readv",
        "personality(ADDR_NO_RANDOMIZE)",
    ] {
        let (_, ret, errno) = open.probes[name];
        assert!(
            ret >= 0,
            "{name} failed without the filter ({})\n{table}",
            errno_name(errno)
        );
    }
    let (_, ret, errno) = open.probes["clone3"];
    assert!(
        ret == -1 && errno != libc::ENOSYS,
        "clone3 exists without the filter\n{table}"
    );

    // The busybox workload: unchanged output with and without the filter.
    let expected = format!("{FILE_BODY}{HTTP_BODY}done\n");
    for (mode, run) in [
        ("unfiltered", &open),
        ("EPERM", &eperm),
        ("EACCES", &eacces),
    ] {
        assert_eq!(run.workload["code"], 0, "{mode} workload: {}", run.workload);
        assert_eq!(
            run.workload["stdout"],
            expected.as_str(),
            "{mode}: {}",
            run.workload
        );
    }
}

const INT80_ENV: &str = "AGENT_SANDBOX_SECCOMP_INT80";
const INT80_TEST: &str = "i386_syscalls_kill_the_process";

/// getpid through the i386 compat entry (`int 0x80`, eax = 20), which a filter that does
/// not check the audit architecture would judge by the *x86_64* meaning of number 20
/// (`writev`, allowed).
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> i64 {
    let ret: i64;
    // SAFETY: i386 getpid takes no arguments and touches no memory; the compat entry may
    // clobber r8-r11, which are declared as clobbered.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") 20i64 => ret,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack)
        );
    }
    ret
}

/// The BPF checks the audit architecture first and kills a process that enters through the
/// i386 table; without the filter the same call returns our pid.
#[cfg(target_arch = "x86_64")]
#[test]
fn i386_syscalls_kill_the_process() {
    use std::os::unix::process::ExitStatusExt;

    if let Ok(mode) = std::env::var(INT80_ENV) {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `no_core` is a live rlimit; lowering RLIMIT_CORE keeps the expected
        // SIGSYS from writing a core file.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) }, 0);
        if mode == "filtered" {
            let program = compile_bpf(&SyscallPolicy::default(), Arch::X86_64).unwrap();
            seccompiler::apply_filter(&program).unwrap();
        }
        println!("SECCOMP-INT80 {}", int80_getpid());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let run = |mode: &str| {
        Command::new(&exe)
            .args([INT80_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(INT80_ENV, mode)
            .output()
            .unwrap()
    };
    let open = run("open");
    let stdout = String::from_utf8_lossy(&open.stdout);
    assert!(open.status.success(), "{:?}\n{stdout}", open.status);
    let pid: i64 = stdout
        .lines()
        .find_map(|l| {
            l.find("SECCOMP-INT80 ")
                .map(|at| l[at + 14..].trim().to_owned())
        })
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pid > 0,
        "int 0x80 getpid works without the filter: {stdout}"
    );

    let filtered = run("filtered");
    assert_eq!(
        filtered.status.signal(),
        Some(libc::SIGSYS),
        "the filter must kill an i386 syscall: {:?}\n{}",
        filtered.status,
        String::from_utf8_lossy(&filtered.stdout)
    );
    assert!(!String::from_utf8_lossy(&filtered.stdout).contains("SECCOMP-INT80 "));
}

const TOOLS_ENV: &str = "AGENT_SANDBOX_SECCOMP_TOOLS";
const TOOLS_TEST: &str = "python_curl_and_git_work_under_both_levels";
const PYTHON: &str = "/usr/bin/python3";
const CURL: &str = "/usr/bin/curl";
const GIT: &str = "/usr/bin/git";
const PY_SCRIPT: &str = r#"
import multiprocessing, socket, subprocess, sys, threading, urllib.request
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(subprocess.run(["/bin/busybox", "echo", "subprocess"], capture_output=True, text=True).stdout.strip())
with multiprocessing.Pool(2) as pool: print(sum(pool.map(abs, [-1, -2])))
print(bool(socket.getaddrinfo("localhost", 80)))
print(urllib.request.urlopen("http://127.0.0.1:%s/py" % sys.argv[1]).read().decode().strip())
"#;

/// Child of `python_curl_and_git_work_under_both_levels`: load the filter at `level`, run the
/// tools, print one `SECCOMP-TOOL` line each.
fn tools_child(level: &str) {
    let policy: SyscallPolicy = serde_json::from_value(json!({ "level": level })).expect("level");
    let program = compile_bpf(&policy, Arch::host().expect("host arch")).expect("compile");
    seccompiler::apply_filter(&program).expect("load the filter");
    let port = std::env::var(PORT_ENV).expect("port");
    let dir = std::env::var(FILE_ENV).expect("dir");
    let repo = format!("{dir}/repo");
    let script = format!(
        "set -e; {GIT} init -q {repo}; \
         {GIT} -C {repo} -c user.name=agent -c user.email=agent@sandbox commit -q --allow-empty -m sandboxed; \
         {GIT} -C {repo} log --format=%s"
    );
    let runs: [(&str, Command); 3] = [
        ("python", {
            let mut c = Command::new(PYTHON);
            c.args(["-c", PY_SCRIPT, &port]);
            c
        }),
        ("curl", {
            let mut c = Command::new(CURL);
            c.args(["-sS", &format!("http://127.0.0.1:{port}/curl")]);
            c
        }),
        ("git", {
            let mut c = Command::new(BUSYBOX);
            c.args(["sh", "-c", &script])
                .env("HOME", &dir)
                .env("GIT_CONFIG_NOSYSTEM", "1");
            c
        }),
    ];
    for (tool, mut command) in runs {
        let out = command.output().expect("spawn under the filter");
        let line = json!({
            "tool": tool,
            "code": out.status.code(),
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
        });
        println!("SECCOMP-TOOL {line}");
    }
}

/// Real agent tools (python with threads, subprocess, multiprocessing, DNS and HTTP; curl;
/// git) keep working under the standard and the strict filter.
#[test]
fn python_curl_and_git_work_under_both_levels() {
    if let Ok(level) = std::env::var(TOOLS_ENV) {
        tools_child(&level);
        return;
    }
    for tool in [PYTHON, CURL, GIT, BUSYBOX] {
        assert!(
            Path::new(tool).is_file(),
            "{tool} is missing: install python3, curl, git and busybox-static (hack/install-deps.sh)"
        );
    }
    let port = serve_http();
    let exe = std::env::current_exe().unwrap();
    for level in ["standard", "strict"] {
        let dir =
            std::env::temp_dir().join(format!("seccomp-tools-{}-{level}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(&exe)
            .args([TOOLS_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(TOOLS_ENV, level)
            .env(PORT_ENV, port.to_string())
            .env(FILE_ENV, &dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{level}: {:?}\n{stdout}", out.status);
        let results: BTreeMap<String, Value> = stdout
            .lines()
            .filter_map(|l| l.find("SECCOMP-TOOL ").map(|at| &l[at + 13..]))
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["tool"].as_str().unwrap().to_owned(), v))
            .collect();
        let body = HTTP_BODY.trim_end();
        let expected = [
            ("python", format!("subprocess\n3\nTrue\n{body}\n")),
            ("curl", HTTP_BODY.to_owned()),
            ("git", "sandboxed\n".to_owned()),
        ];
        for (tool, stdout) in expected {
            let got = &results[tool];
            assert_eq!(got["code"], 0, "{level} {tool}: {got}");
            assert_eq!(got["stdout"], stdout.as_str(), "{level} {tool}: {got}");
        }
    }
}
