//! Checks for the hostile-workload suite (`e2e/tests/suite/hostile.rs`). They are not part
//! of `probe all`: some are heavy (a bounded fork bomb) or need a target named in the
//! environment, so they run only when named.
//!
//! Environment they read:
//! - `PROBE_FDS_PASSED`: comma-separated descriptors the caller passed on purpose
//!   (`--preserve-fds`); `fd_leak` reports any other descriptor above 2.
//! - `PROBE_FORK_TARGET`: how many processes `fork_bomb` tries to hold (default 2000).
//! - `PROBE_PROXY_ID`: the sandbox id whose egress proxy `ptrace_proxy` looks for.
//! - `PROBE_DNS_TARGETS`: comma-separated `ip:port` resolvers `dns_udp` queries;
//!   `PROBE_DNS_RESOLV=1` adds the nameservers of `/etc/resolv.conf` (port 53).

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Report;
use crate::checks::{
    allowed, any_allowed, blocked, describe_child, errno, in_child, last_errno, not_applicable,
    try_create, unique_name, visible_pids,
};

type Check = fn() -> Report;

/// Checks run only when named (`probe fd_leak fork_bomb ...`).
pub const EXTRA: &[(&str, Check)] = &[
    ("fd_leak", fd_leak),
    ("path_plant", path_plant),
    ("bind_mount", bind_mount),
    ("pivot_root", pivot_root),
    ("userns_mount", userns_mount),
    ("ptrace_proxy", ptrace_proxy),
    ("fork_bomb", fork_bomb),
    ("dns_udp", dns_udp),
    ("unreviewed_syscall", crate::checks::unreviewed_syscall),
];

// ---------------------------------------------------------------- descriptors

/// Descriptors open in this process other than 0-2, those the caller says it passed, and the
/// directory handle used to list them. A runtime that forgets `O_CLOEXEC` on its own files
/// (state, audit log, memfd copy, sockets) hands them to the sandbox here.
fn fd_leak() -> Report {
    const CHECK: &str = "fd_leak";
    let passed: Vec<u32> = std::env::var("PROBE_FDS_PASSED")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let entries = match fs::read_dir("/proc/self/fd") {
        Ok(e) => e,
        Err(err) => return not_applicable(CHECK, format!("read /proc/self/fd: {err}")),
    };
    let own_dir = format!("/proc/{}/fd", std::process::id());
    let mut extra = Vec::new();
    let mut seen = 0u32;
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        seen += 1;
        let target = fs::read_link(entry.path())
            .map(|t| t.display().to_string())
            .unwrap_or_else(|e| format!("? ({e})"));
        if fd <= 2 || passed.contains(&fd) || target == own_dir {
            continue;
        }
        extra.push(format!("fd {fd} -> {target}"));
    }
    if extra.is_empty() {
        blocked(
            CHECK,
            format!("{seen} descriptors, none beyond 0-2 and the passed {passed:?}"),
        )
    } else {
        allowed(
            CHECK,
            format!("descriptors the caller did not pass: {}", extra.join(", ")),
        )
    }
}

// ---------------------------------------------------------------- files

/// Plants an executable name in every absolute `$PATH` directory: a tool that can do this
/// shadows `git` or `sh` for whatever runs next in the same filesystem.
fn path_plant() -> Report {
    const CHECK: &str = "path_plant";
    let path = std::env::var_os("PATH").unwrap_or_default();
    let attempts: Vec<_> = std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| try_create(&d.join(unique_name("probe-plant"))))
        .collect();
    if attempts.is_empty() {
        return not_applicable(CHECK, "PATH has no absolute directory");
    }
    any_allowed(CHECK, &attempts)
}

// ---------------------------------------------------------------- mounts and namespaces

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// `mount --bind / TMP/x`: a bind mount is how a tool would re-expose a masked or
/// read-only path somewhere writable. Not recursive, and undone with a plain `umount`: a
/// recursive bind of a shared `/` detached lazily propagates the detach to every submount's
/// peers, and run outside a container that unmounts the host's `/proc`, `/sys` and `/dev`.
fn bind_mount() -> Report {
    const CHECK: &str = "bind_mount";
    let target = std::env::temp_dir().join(unique_name("probe-bind"));
    if let Err(err) = fs::create_dir(&target) {
        return not_applicable(CHECK, format!("mkdir {}: {err}", target.display()));
    }
    let Some(ctarget) = c_path(&target) else {
        return not_applicable(CHECK, "target contains a NUL byte");
    };
    // SAFETY: both paths are valid C strings; fstype and data may be null for MS_BIND.
    let rc = unsafe {
        libc::mount(
            c"/".as_ptr(),
            ctarget.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    let result = if rc == 0 {
        // SAFETY: unmounting the single bind mount made just above.
        unsafe { libc::umount2(ctarget.as_ptr(), 0) };
        allowed(CHECK, format!("bind-mounted / on {}", target.display()))
    } else {
        blocked(
            CHECK,
            format!("mount --bind / {}: {}", target.display(), errno()),
        )
    };
    let _ = fs::remove_dir(&target);
    result
}

/// A directory for a child's namespace experiment, named after the parent so the child
/// (a plain `fn`) can find it.
fn scratch_for_child(stem: &str) -> PathBuf {
    // SAFETY: getppid has no arguments and cannot fail.
    let parent = unsafe { libc::getppid() };
    std::env::temp_dir().join(format!("{stem}-{parent}"))
}

fn scratch_for_parent(stem: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{stem}-{}", std::process::id()))
}

/// Runs in a forked child: a private mount namespace, a tmpfs, and `pivot_root` into it
/// (what a runtime does; a tool doing it can shed masked paths and read-only mounts).
fn pivot_root_child() -> i32 {
    let dir = scratch_for_child("probe-pivot");
    let (Some(new_root), Some(old_root)) = (c_path(&dir), c_path(&dir.join("old"))) else {
        return libc::EINVAL;
    };
    // SAFETY: unshare takes an integer and affects this child only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return last_errno();
    }
    // SAFETY: valid C strings or null; the propagation change stays in this child's namespace.
    if unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } != 0
    {
        return last_errno();
    }
    // SAFETY: as above.
    if unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            new_root.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    } != 0
    {
        return last_errno();
    }
    if fs::create_dir(dir.join("old")).is_err() {
        return last_errno();
    }
    // SAFETY: both are valid C strings; only this child's mount namespace changes.
    if unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), old_root.as_ptr()) } != 0 {
        return last_errno();
    }
    0
}

fn pivot_root() -> Report {
    const CHECK: &str = "pivot_root";
    let dir = scratch_for_parent("probe-pivot");
    if let Err(err) = fs::create_dir(&dir) {
        return not_applicable(CHECK, format!("mkdir {}: {err}", dir.display()));
    }
    let attempt = describe_child(
        in_child(pivot_root_child),
        &format!(
            "unshare(CLONE_NEWNS) + tmpfs + pivot_root({})",
            dir.display()
        ),
    );
    let _ = fs::remove_dir(&dir);
    any_allowed(CHECK, &[attempt])
}

/// Runs in a forked child: a new user namespace (where the child is root), then a mount
/// in a new mount namespace: the classic way to regain CAP_SYS_ADMIN over mounts.
fn userns_mount_child() -> i32 {
    let dir = scratch_for_child("probe-userns");
    let Some(target) = c_path(&dir) else {
        return libc::EINVAL;
    };
    // SAFETY: getuid/getgid have no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: unshare takes an integer and affects this child only.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        return last_errno();
    }
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_owned()),
        ("/proc/self/uid_map", format!("0 {uid} 1")),
        ("/proc/self/gid_map", format!("0 {gid} 1")),
    ] {
        if let Err(err) = fs::write(file, text) {
            return err.raw_os_error().unwrap_or(libc::EIO);
        }
    }
    // SAFETY: valid C strings; the mount lives in this child's mount namespace.
    if unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    } != 0
    {
        return last_errno();
    }
    0
}

fn userns_mount() -> Report {
    const CHECK: &str = "userns_mount";
    let dir = scratch_for_parent("probe-userns");
    if let Err(err) = fs::create_dir(&dir) {
        return not_applicable(CHECK, format!("mkdir {}: {err}", dir.display()));
    }
    let attempt = describe_child(
        in_child(userns_mount_child),
        &format!(
            "unshare(CLONE_NEWUSER|CLONE_NEWNS) + uid_map + mount tmpfs on {}",
            dir.display()
        ),
    );
    let _ = fs::remove_dir(&dir);
    any_allowed(CHECK, &[attempt])
}

// ---------------------------------------------------------------- processes

fn cmdline(pid: &str) -> Vec<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Looks for the sandbox's egress proxy (`... proxy --netns NS ID`) among the
/// processes this one can see, and tries to trace it. The proxy holds the policy's only
/// door out; a tool that can trace it can open any connection it likes.
fn ptrace_proxy() -> Report {
    const CHECK: &str = "ptrace_proxy";
    let id = std::env::var("PROBE_PROXY_ID").unwrap_or_default();
    let pids = match visible_pids() {
        Ok(p) => p,
        Err(err) => return not_applicable(CHECK, format!("read /proc: {err}")),
    };
    let mut visible = 0u32;
    let mut found = None;
    for pid in &pids {
        visible += 1;
        let args = cmdline(pid);
        // `agent-sandbox --root R proxy --netns /proc/PID/ns/net ID` (argv[0] may be
        // `/proc/self/exe`: the runtime starts it from its sealed copy).
        let is_proxy = args.iter().any(|a| a == "proxy")
            && args.iter().any(|a| a == "--netns")
            && (id.is_empty() || args.iter().any(|a| a.contains(&id)));
        if is_proxy {
            found = Some((pid.to_owned(), args.join(" ")));
            break;
        }
    }
    let Some((pid, args)) = found else {
        return blocked(
            CHECK,
            format!("no agent-sandbox proxy visible among {visible} processes"),
        );
    };
    let Ok(raw) = pid.parse::<libc::pid_t>() else {
        return not_applicable(CHECK, format!("pid {pid} out of range"));
    };
    // SAFETY: PTRACE_SEIZE takes no pointers; the tracee is detached when this process exits
    // and is never stopped (SEIZE does not stop it).
    let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, raw, 0, 0) };
    if rc == 0 {
        allowed(CHECK, format!("seized the proxy, pid {pid}: {args}"))
    } else {
        blocked(
            CHECK,
            format!(
                "proxy pid {pid} visible ({args}) but PTRACE_SEIZE: {}",
                errno()
            ),
        )
    }
}

/// Forks children that sleep until `PROBE_FORK_TARGET` (default 2000) exist or fork fails,
/// then kills them all. Allowed when the target was reached: nothing bounded the number of
/// processes.
fn fork_bomb() -> Report {
    const CHECK: &str = "fork_bomb";
    let target: usize = std::env::var("PROBE_FORK_TARGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let mut children: Vec<libc::pid_t> = Vec::with_capacity(target);
    let mut stop = String::new();
    while children.len() < target {
        // SAFETY: the probe is single-threaded; the child only sleeps until killed.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            stop = format!("fork: {}", errno());
            break;
        }
        if pid == 0 {
            // SAFETY: the child asks to die with its parent, then sleeps until killed.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                loop {
                    libc::pause();
                }
            }
        }
        children.push(pid);
    }
    let held = children.len();
    for pid in &children {
        let mut status = 0;
        // SAFETY: each pid is our child; it is killed and reaped exactly once.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
            libc::waitpid(*pid, &mut status, 0);
        }
    }
    if held >= target {
        allowed(CHECK, format!("held {held} processes (target {target})"))
    } else {
        blocked(
            CHECK,
            format!("stopped at {held} processes of {target}: {stop}"),
        )
    }
}

// ---------------------------------------------------------------- DNS

/// A DNS query (id 0x4242, recursion desired) for `probe.agent-sandbox.test` type A.
fn dns_query() -> Vec<u8> {
    let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["probe", "agent-sandbox", "test"] {
        q.push(u8::try_from(label.len()).unwrap_or(0));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

fn resolv_conf_servers() -> Vec<SocketAddr> {
    fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn udp_query(addr: SocketAddr) -> (String, bool) {
    let bind: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let attempt = || -> io::Result<usize> {
        let socket = UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send_to(&dns_query(), addr)?;
        let mut buf = [0u8; 512];
        socket.recv(&mut buf)
    };
    match attempt() {
        Ok(n) => (format!("udp {addr}: answered ({n} bytes)"), true),
        Err(err) => (format!("udp {addr}: {err}"), false),
    }
}

fn tcp_connect(addr: SocketAddr) -> (String, bool) {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(_) => (format!("tcp {addr}: connected"), true),
        Err(err) => (format!("tcp {addr}: {err}"), false),
    }
}

/// Sends a DNS query over UDP (and tries TCP) to every named resolver: a DNS tunnel needs
/// only one resolver that answers.
fn dns_udp() -> Report {
    const CHECK: &str = "dns_udp";
    let mut targets: Vec<SocketAddr> = std::env::var("PROBE_DNS_TARGETS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if std::env::var("PROBE_DNS_RESOLV").is_ok_and(|v| v == "1") {
        targets.extend(resolv_conf_servers());
    }
    if targets.is_empty() {
        return not_applicable(
            CHECK,
            "no resolver named (PROBE_DNS_TARGETS, PROBE_DNS_RESOLV)",
        );
    }
    let mut attempts = Vec::new();
    for t in targets {
        attempts.push(udp_query(t));
        attempts.push(tcp_connect(t));
    }
    any_allowed(CHECK, &attempts)
}
