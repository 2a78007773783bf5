//! The checks. Each returns a [`Report`]; none panics. Checks that change state
//! (mounts, files, personality) undo what they did when the attempt succeeds.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Outcome, Report};
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

type Check = fn() -> Report;

/// Every check `probe all` runs, in output order.
pub const ALL: &[(&str, Check)] = &[
    ("uid_map_identity", uid_map_identity),
    ("host_uid0", host_uid0),
    ("cap_eff", cap_eff),
    ("cap_bnd", cap_bnd),
    ("no_new_privs", no_new_privs),
    ("seccomp_mode", seccomp_mode),
    ("write_rootfs", write_rootfs),
    ("truncate_rootfs", truncate_rootfs),
    ("write_tmp", write_tmp),
    ("write_workspace", write_workspace),
    ("write_bashrc", write_bashrc),
    ("write_git_hooks", write_git_hooks),
    ("read_ssh_key", read_ssh_key),
    ("net_ifaces", net_ifaces),
    ("net_connect", net_connect),
    ("ptrace", ptrace),
    ("mount", mount),
    ("unshare", unshare),
    ("unshare_user", unshare_user),
    ("unshare_mount", unshare_mount),
    ("setns", setns),
    ("io_uring", io_uring),
    ("keyctl", keyctl),
    ("bpf", bpf),
    ("perf_event_open", perf_event_open),
    ("userfaultfd", userfaultfd),
    ("af_vsock", af_vsock),
    ("af_alg", af_alg),
    ("af_packet", af_packet),
    ("netlink_non_route", netlink_non_route),
    ("personality", personality),
    ("open_by_handle_at", open_by_handle_at),
    ("proc_sys_write", proc_sys_write),
    ("sysfs_write", sysfs_write),
    ("mknod", mknod),
    ("chroot", chroot),
    ("proc_root_escape", proc_root_escape),
];

pub(crate) fn report(check: &'static str, outcome: Outcome, detail: impl Into<String>) -> Report {
    Report {
        check,
        outcome,
        detail: detail.into(),
    }
}

pub(crate) fn allowed(check: &'static str, detail: impl Into<String>) -> Report {
    report(check, Outcome::Allowed, detail)
}

pub(crate) fn blocked(check: &'static str, detail: impl Into<String>) -> Report {
    report(check, Outcome::Blocked, detail)
}

pub(crate) fn not_applicable(check: &'static str, detail: impl Into<String>) -> Report {
    report(check, Outcome::NotApplicable, detail)
}

pub(crate) fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// Allowed if any attempt succeeded; the detail lists every attempt.
pub(crate) fn any_allowed(check: &'static str, attempts: &[(String, bool)]) -> Report {
    let detail = attempts
        .iter()
        .map(|(d, _)| d.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if attempts.iter().any(|(_, ok)| *ok) {
        allowed(check, detail)
    } else {
        blocked(check, detail)
    }
}

// ---------------------------------------------------------------- identity

/// The uid map as text and as parsed lines.
/// inside, outside, count
type IdRange = (u64, u64, u64);

fn uid_map() -> io::Result<(String, Vec<IdRange>)> {
    let text = fs::read_to_string("/proc/self/uid_map")?;
    let lines = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace().map(str::parse::<u64>);
            match (f.next(), f.next(), f.next()) {
                (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Some((a, b, c)),
                _ => None,
            }
        })
        .collect();
    Ok((text.split_whitespace().collect::<Vec<_>>().join(" "), lines))
}

fn uid_map_identity() -> Report {
    const CHECK: &str = "uid_map_identity";
    match uid_map() {
        Ok((text, map)) => {
            if map.iter().any(|&(inside, outside, count)| {
                inside == 0 && outside == 0 && count >= 4_294_967_295
            }) {
                allowed(
                    CHECK,
                    format!("identity mapping (initial user namespace): {text}"),
                )
            } else {
                blocked(CHECK, format!("uid_map: {text}"))
            }
        }
        Err(err) => not_applicable(CHECK, format!("cannot read /proc/self/uid_map: {err}")),
    }
}

fn host_uid0() -> Report {
    const CHECK: &str = "host_uid0";
    match uid_map() {
        // The outside ids are relative to the parent user namespace; for a single
        // level of nesting that is the host.
        Ok((text, map)) => match map
            .iter()
            .find(|&&(_, outside, count)| outside == 0 && count > 0)
        {
            Some(&(inside, _, _)) => {
                allowed(CHECK, format!("uid {inside} maps to parent uid 0: {text}"))
            }
            None => blocked(CHECK, format!("no id maps to parent uid 0: {text}")),
        },
        Err(err) => not_applicable(CHECK, format!("cannot read /proc/self/uid_map: {err}")),
    }
}

fn status_field(name: &str) -> io::Result<String> {
    let text = fs::read_to_string("/proc/self/status")?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no {name} in /proc/self/status"),
            )
        })
}

fn capability_set(check: &'static str, field: &str) -> Report {
    match status_field(field) {
        Ok(value) => match u64::from_str_radix(&value, 16) {
            Ok(0) => blocked(check, format!("{field} {value}")),
            Ok(bits) => allowed(
                check,
                format!("{field} {value} ({} capabilities)", bits.count_ones()),
            ),
            Err(err) => not_applicable(check, format!("{field} {value:?} is not hex: {err}")),
        },
        Err(err) => not_applicable(check, err.to_string()),
    }
}

fn cap_eff() -> Report {
    capability_set("cap_eff", "CapEff")
}

fn cap_bnd() -> Report {
    capability_set("cap_bnd", "CapBnd")
}

fn no_new_privs() -> Report {
    const CHECK: &str = "no_new_privs";
    match status_field("NoNewPrivs") {
        Ok(v) if v == "1" => blocked(CHECK, "NoNewPrivs 1"),
        Ok(v) => allowed(
            CHECK,
            format!("NoNewPrivs {v}: setuid binaries can raise privileges"),
        ),
        Err(err) => not_applicable(CHECK, err.to_string()),
    }
}

fn seccomp_mode() -> Report {
    const CHECK: &str = "seccomp_mode";
    match status_field("Seccomp") {
        Ok(v) if v == "2" => blocked(CHECK, "Seccomp 2 (filter)"),
        Ok(v) => allowed(CHECK, format!("Seccomp {v}: no syscall filter")),
        Err(err) => not_applicable(CHECK, err.to_string()),
    }
}

// ---------------------------------------------------------------- files

pub(crate) fn unique_name(stem: &str) -> String {
    format!("{stem}-{}", std::process::id())
}

pub(crate) fn try_create(path: &Path) -> (String, bool) {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
    {
        Ok(_) => {
            let cleanup = fs::remove_file(path)
                .err()
                .map(|e| format!(", not removed: {e}"))
                .unwrap_or_default();
            (format!("created {}{cleanup}", path.display()), true)
        }
        Err(err) => (format!("{}: {err}", path.display()), false),
    }
}

fn write_rootfs() -> Report {
    let name = unique_name("probe-write-rootfs");
    let attempts: Vec<_> = ["/", "/usr", "/etc"]
        .iter()
        .map(|dir| try_create(&Path::new(dir).join(&name)))
        .collect();
    any_allowed("write_rootfs", &attempts)
}

/// `truncate(2)` by path on image files, to their own length (the content stays the same;
/// the kernel checks write access all the same). Landlock before ABI 3 does not handle
/// truncate, so on those kernels the read-only root mount (EROFS) is what stops it.
fn truncate_rootfs() -> Report {
    let attempts: Vec<_> = ["/etc/passwd", "/bin/sh"]
        .iter()
        .map(|path| {
            let len = match fs::metadata(path) {
                Ok(m) => libc::off_t::try_from(m.len()).unwrap_or(0),
                Err(err) => return (format!("{path}: {err}"), false),
            };
            let Ok(c) = CString::new(*path) else {
                return (format!("{path}: not a C string"), false);
            };
            // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
            let rc = unsafe { libc::truncate(c.as_ptr(), len) };
            if rc == 0 {
                (format!("truncated {path} to its {len} bytes"), true)
            } else {
                (format!("{path}: {}", io::Error::last_os_error()), false)
            }
        })
        .collect();
    any_allowed("truncate_rootfs", &attempts)
}

/// A scratch write that a working sandbox allows: shows the probe is not merely
/// running somewhere where every write fails.
fn write_tmp() -> Report {
    let path = std::env::temp_dir().join(unique_name("probe-write-tmp"));
    any_allowed("write_tmp", &[try_create(&path)])
}

/// Writes `$WORKSPACE/agent-sandbox-probe.txt` (left in place, so a test can look
/// for it on the host side of a workspace overlay).
fn write_workspace() -> Report {
    const CHECK: &str = "write_workspace";
    let Some(ws) = workspace() else {
        return not_applicable(CHECK, "WORKSPACE is not set");
    };
    let path = ws.join("agent-sandbox-probe.txt");
    match fs::write(&path, b"written by the agent-sandbox probe\n") {
        Ok(()) => allowed(CHECK, format!("wrote {}", path.display())),
        Err(err) => blocked(CHECK, format!("{}: {err}", path.display())),
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

pub(crate) fn workspace() -> Option<PathBuf> {
    std::env::var_os("WORKSPACE")
        .filter(|w| !w.is_empty())
        .map(PathBuf::from)
}

/// Appends a marker line, creating the file if needed: what a persistence attack does.
fn try_append(path: &Path) -> (String, bool) {
    match OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
    {
        Ok(mut file) => match file.write_all(b"# agent-sandbox probe was here\n") {
            Ok(()) => (format!("appended to {}", path.display()), true),
            Err(err) => (
                format!("{} opened but write failed: {err}", path.display()),
                false,
            ),
        },
        Err(err) => (format!("{}: {err}", path.display()), false),
    }
}

fn write_bashrc() -> Report {
    let mut targets = vec![home().join(".bashrc")];
    if let Some(ws) = workspace() {
        targets.push(ws.join(".bashrc"));
    }
    let attempts: Vec<_> = targets.iter().map(|p| try_append(p)).collect();
    any_allowed("write_bashrc", &attempts)
}

fn write_git_hooks() -> Report {
    const CHECK: &str = "write_git_hooks";
    let Some(ws) = workspace() else {
        return not_applicable(CHECK, "WORKSPACE is not set");
    };
    let hooks = ws.join(".git/hooks");
    if let Err(err) = fs::create_dir_all(&hooks) {
        return blocked(CHECK, format!("cannot create {}: {err}", hooks.display()));
    }
    let hook = hooks.join("x");
    match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&hook)
    {
        Ok(mut file) => match file.write_all(b"#!/bin/sh\necho agent-sandbox probe hook\n") {
            Ok(()) => allowed(CHECK, format!("wrote {}", hook.display())),
            Err(err) => blocked(
                CHECK,
                format!("{} opened but write failed: {err}", hook.display()),
            ),
        },
        Err(err) => blocked(CHECK, format!("{}: {err}", hook.display())),
    }
}

fn read_ssh_key() -> Report {
    const CHECK: &str = "read_ssh_key";
    let key = home().join(".ssh/id_rsa");
    let mut buf = Vec::new();
    match fs::File::open(&key).and_then(|mut f| f.read_to_end(&mut buf)) {
        // Reading may be permitted by a policy; the suites decide.
        Ok(n) => allowed(CHECK, format!("read {n} bytes of {}", key.display())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            not_applicable(CHECK, format!("{} does not exist", key.display()))
        }
        Err(err) => blocked(CHECK, format!("{}: {err}", key.display())),
    }
}

// ---------------------------------------------------------------- network

/// Interface names from /proc/net/dev (no socket needed, so a seccomp filter that
/// denies netlink does not hide them).
fn proc_net_dev() -> io::Result<Vec<String>> {
    let text = fs::read_to_string("/proc/net/dev")?;
    Ok(text
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_owned())
        .collect())
}

/// Interface names from if_nameindex (a netlink socket underneath).
fn if_names() -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns a heap array terminated by a zero entry, or null;
    // we read it up to the terminator and free it once with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Err(errno());
        }
        let mut cursor = list;
        while (*cursor).if_index != 0 && !(*cursor).if_name.is_null() {
            names.push(
                std::ffi::CStr::from_ptr((*cursor).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            cursor = cursor.add(1);
        }
        libc::if_freenameindex(list);
    }
    Ok(names)
}

fn net_ifaces() -> Report {
    const CHECK: &str = "net_ifaces";
    let (source, names) = match proc_net_dev() {
        Ok(names) => ("/proc/net/dev", names),
        Err(proc_err) => match if_names() {
            Ok(names) => ("if_nameindex", names),
            Err(err) => {
                return not_applicable(
                    CHECK,
                    format!("/proc/net/dev: {proc_err}; if_nameindex: {err}"),
                );
            }
        },
    };
    let detail = format!("interfaces ({source}): {}", names.join(","));
    if names.iter().any(|n| n != "lo") {
        allowed(CHECK, detail)
    } else {
        blocked(CHECK, detail)
    }
}

fn net_connect() -> Report {
    const CHECK: &str = "net_connect";
    let Ok(target) = std::env::var("PROBE_TARGET") else {
        return not_applicable(CHECK, "PROBE_TARGET is not set");
    };
    let addr: SocketAddr = match target.parse() {
        Ok(a) => a,
        Err(err) => {
            return not_applicable(
                CHECK,
                format!("PROBE_TARGET {target:?} is not ip:port: {err}"),
            );
        }
    };
    match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
        Ok(_) => allowed(CHECK, format!("connected to {addr}")),
        Err(err) => blocked(CHECK, format!("connect {addr}: {err}")),
    }
}

fn socket_check(
    check: &'static str,
    domain: libc::c_int,
    kind: libc::c_int,
    protocol: libc::c_int,
    what: &str,
) -> Report {
    // SAFETY: socket takes plain integers; a returned fd is owned here and closed once.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd >= 0 {
        // SAFETY: fd is a valid descriptor we own.
        unsafe { libc::close(fd) };
        allowed(check, format!("{what} socket created"))
    } else {
        blocked(check, format!("{what} socket: {}", errno()))
    }
}

fn af_vsock() -> Report {
    socket_check("af_vsock", libc::AF_VSOCK, libc::SOCK_STREAM, 0, "AF_VSOCK")
}

fn af_alg() -> Report {
    socket_check("af_alg", libc::AF_ALG, libc::SOCK_SEQPACKET, 0, "AF_ALG")
}

fn af_packet() -> Report {
    socket_check(
        "af_packet",
        libc::AF_PACKET,
        libc::SOCK_RAW,
        0,
        "AF_PACKET raw",
    )
}

fn netlink_non_route() -> Report {
    socket_check(
        "netlink_non_route",
        libc::AF_NETLINK,
        libc::SOCK_RAW,
        libc::NETLINK_AUDIT,
        "NETLINK_AUDIT",
    )
}

// ---------------------------------------------------------------- processes

/// Runs `f` in a forked child and returns its errno (0 = success). The probe is
/// single-threaded, so the child may run arbitrary code before `_exit`.
pub(crate) fn in_child(f: fn() -> i32) -> io::Result<i32> {
    // SAFETY: the probe has one thread; the child only runs `f` and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(errno());
    }
    if pid == 0 {
        let code = f().clamp(0, 255);
        // SAFETY: terminating the child without running parent-owned destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: pid is our child; status is a valid out pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(errno());
    }
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(io::Error::other(format!(
            "child died with status {status:#x}"
        )))
    }
}

pub(crate) fn last_errno() -> i32 {
    errno().raw_os_error().unwrap_or(255)
}

pub(crate) fn describe_child(result: io::Result<i32>, what: &str) -> (String, bool) {
    match result {
        Ok(0) => (format!("{what} succeeded"), true),
        Ok(code) => (
            format!("{what}: {}", io::Error::from_raw_os_error(code)),
            false,
        ),
        Err(err) => (format!("{what}: cannot run: {err}"), false),
    }
}

fn ptrace() -> Report {
    const CHECK: &str = "ptrace";
    let traceme = describe_child(
        in_child(|| {
            // SAFETY: PTRACE_TRACEME takes no pointers.
            let rc = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
            if rc == 0 { 0 } else { last_errno() }
        }),
        "PTRACE_TRACEME",
    );
    // SAFETY: single-threaded; the child only pauses until killed.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return any_allowed(CHECK, &[traceme, (format!("fork: {}", errno()), false)]);
    }
    if pid == 0 {
        loop {
            // SAFETY: pause has no arguments.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: pid is our child; PTRACE_ATTACH takes no pointers.
    let rc = unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) };
    let attach = if rc == 0 {
        ("PTRACE_ATTACH to a child succeeded".to_owned(), true)
    } else {
        (format!("PTRACE_ATTACH: {}", errno()), false)
    };
    let mut status = 0;
    // SAFETY: pid is our child; we kill and reap it exactly once.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    any_allowed(CHECK, &[traceme, attach])
}

fn mount() -> Report {
    const CHECK: &str = "mount";
    let candidates = [
        std::env::temp_dir().join(unique_name("probe-mnt")),
        PathBuf::from("/mnt"),
        PathBuf::from("/tmp"),
    ];
    let mut made = None;
    for c in &candidates {
        if c.is_dir() || fs::create_dir(c).is_ok() {
            made = Some(c.clone());
            break;
        }
    }
    let Some(target) = made else {
        return not_applicable(CHECK, "no directory to mount on");
    };
    let Ok(ctarget) = CString::new(target.as_os_str().as_encoded_bytes()) else {
        return not_applicable(CHECK, "mount target contains a NUL byte");
    };
    let fstype = c"tmpfs";
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            ctarget.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    let result = if rc == 0 {
        // SAFETY: unmounting the tmpfs we just mounted.
        unsafe { libc::umount2(ctarget.as_ptr(), libc::MNT_DETACH) };
        allowed(CHECK, format!("mounted tmpfs on {}", target.display()))
    } else {
        blocked(
            CHECK,
            format!("mount tmpfs on {}: {}", target.display(), errno()),
        )
    };
    if target
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("probe-mnt"))
    {
        let _ = fs::remove_dir(&target);
    }
    result
}

fn unshare_flag(flag: libc::c_int) -> i32 {
    // SAFETY: unshare takes an integer; it only affects this (child) process.
    if unsafe { libc::unshare(flag) } == 0 {
        0
    } else {
        last_errno()
    }
}

fn unshare_user_attempt() -> (String, bool) {
    describe_child(
        in_child(|| unshare_flag(libc::CLONE_NEWUSER)),
        "unshare(CLONE_NEWUSER)",
    )
}

fn unshare_mount_attempt() -> (String, bool) {
    describe_child(
        in_child(|| unshare_flag(libc::CLONE_NEWNS)),
        "unshare(CLONE_NEWNS)",
    )
}

fn unshare() -> Report {
    any_allowed(
        "unshare",
        &[unshare_user_attempt(), unshare_mount_attempt()],
    )
}

fn unshare_user() -> Report {
    any_allowed("unshare_user", &[unshare_user_attempt()])
}

fn unshare_mount() -> Report {
    any_allowed("unshare_mount", &[unshare_mount_attempt()])
}

fn setns() -> Report {
    // Joining a network namespace needs CAP_SYS_ADMIN over it; our own one is
    // enough to tell whether the process may join namespaces at all.
    let attempt = describe_child(
        in_child(|| {
            // SAFETY: the path is a valid C string; the fd is used once then the child exits.
            unsafe {
                let fd = libc::open(
                    c"/proc/self/ns/net".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    return last_errno();
                }
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    0
                } else {
                    last_errno()
                }
            }
        }),
        "setns(/proc/self/ns/net)",
    );
    any_allowed("setns", &[attempt])
}

fn chroot() -> Report {
    let attempt = describe_child(
        in_child(|| {
            // SAFETY: "." is a valid C string; only this child's root changes.
            if unsafe { libc::chroot(c".".as_ptr()) } == 0 {
                0
            } else {
                last_errno()
            }
        }),
        "chroot(\".\")",
    );
    any_allowed("chroot", &[attempt])
}

/// The pids of the processes this one can see in /proc.
pub(crate) fn visible_pids() -> io::Result<Vec<String>> {
    Ok(fs::read_dir("/proc")?
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .map(str::to_owned)
        })
        .collect())
}

fn proc_root_escape() -> Report {
    const CHECK: &str = "proc_root_escape";
    let own = match fs::metadata("/") {
        Ok(m) => m,
        Err(err) => return not_applicable(CHECK, format!("stat /: {err}")),
    };
    let pids = match visible_pids() {
        Ok(p) => p,
        Err(err) => return not_applicable(CHECK, format!("read /proc: {err}")),
    };
    // Any visible process whose root is another filesystem root hands that root
    // to us through /proc/PID/root (pid namespace shared with the host).
    let (mut seen, mut denied) = (0u32, 0u32);
    for pid in &pids {
        seen += 1;
        match fs::metadata(format!("/proc/{pid}/root/")) {
            Ok(m) if (m.dev(), m.ino()) != (own.dev(), own.ino()) => {
                return allowed(
                    CHECK,
                    format!("/proc/{pid}/root is another filesystem root"),
                );
            }
            Ok(_) => {}
            Err(_) => denied += 1,
        }
    }
    blocked(
        CHECK,
        format!("{seen} processes visible, none with another root reachable ({denied} denied)"),
    )
}

fn personality() -> Report {
    const CHECK: &str = "personality";
    // SAFETY: 0xffffffff only queries the current persona.
    let current = unsafe { libc::personality(0xffff_ffff) };
    if current < 0 {
        return blocked(CHECK, format!("personality query: {}", errno()));
    }
    let Ok(current) = libc::c_ulong::try_from(current) else {
        return not_applicable(CHECK, "persona out of range");
    };
    // ADDR_NO_RANDOMIZE from <sys/personality.h>.
    let wanted = current | 0x0004_0000;
    // SAFETY: setting a persona flag on this process; restored below.
    let rc = unsafe { libc::personality(wanted) };
    if rc < 0 {
        return blocked(
            CHECK,
            format!("personality(ADDR_NO_RANDOMIZE): {}", errno()),
        );
    }
    // SAFETY: restoring the persona read above.
    unsafe { libc::personality(current) };
    allowed(
        CHECK,
        "personality(ADDR_NO_RANDOMIZE) succeeded: ASLR can be disabled",
    )
}

// ---------------------------------------------------------------- raw syscalls

fn io_uring() -> Report {
    const CHECK: &str = "io_uring";
    // struct io_uring_params is 120 bytes; zeroed means default flags.
    let mut params = [0u64; 15];
    // SAFETY: params is a writable, suitably aligned 120-byte buffer.
    let fd = unsafe { raw_syscall!(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        close_raw(fd);
        allowed(CHECK, "io_uring_setup succeeded")
    } else {
        let disabled = fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "?".to_owned());
        blocked(
            CHECK,
            format!(
                "io_uring_setup: {} (kernel.io_uring_disabled={disabled})",
                errno()
            ),
        )
    }
}

fn close_raw(fd: libc::c_long) {
    if let Ok(fd) = libc::c_int::try_from(fd) {
        // SAFETY: fd was just returned to us by the kernel and is closed once.
        unsafe { libc::close(fd) };
    }
}

fn keyctl() -> Report {
    const CHECK: &str = "keyctl";
    let payload = b"probe";
    // KEY_SPEC_PROCESS_KEYRING
    let keyring: libc::c_long = -2;
    // SAFETY: all pointers are valid for the call; the payload length matches.
    let rc = unsafe {
        raw_syscall!(
            libc::SYS_add_key,
            c"user".as_ptr(),
            c"agent-sandbox-probe".as_ptr(),
            payload.as_ptr(),
            payload.len(),
            keyring,
        )
    };
    if rc >= 0 {
        allowed(CHECK, format!("add_key created key {rc}"))
    } else {
        blocked(CHECK, format!("add_key: {}", errno()))
    }
}

/// A syscall number above every one the kernel knows (and so above any policy's review): a
/// filter that reports denials answers it itself. Run only when named.
pub(crate) fn unreviewed_syscall() -> Report {
    const CHECK: &str = "unreviewed_syscall";
    const NR: libc::c_long = 1000;
    // SAFETY: syscall 1000 does not exist; no argument is passed and no memory is touched.
    let rc = unsafe { raw_syscall!(NR) };
    if rc >= 0 {
        allowed(CHECK, format!("syscall {NR} returned {rc}"))
    } else {
        blocked(CHECK, format!("syscall {NR}: {}", errno()))
    }
}

fn bpf() -> Report {
    const CHECK: &str = "bpf";
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries.
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    let size = std::mem::size_of_val(&attr);
    // SAFETY: attr is a readable buffer of `size` bytes; 0 is BPF_MAP_CREATE.
    let fd = unsafe { raw_syscall!(libc::SYS_bpf, 0, attr.as_mut_ptr(), size) };
    if fd >= 0 {
        close_raw(fd);
        allowed(CHECK, "bpf(BPF_MAP_CREATE) succeeded")
    } else {
        blocked(CHECK, format!("bpf(BPF_MAP_CREATE): {}", errno()))
    }
}

fn perf_event_open() -> Report {
    const CHECK: &str = "perf_event_open";
    // struct perf_event_attr (128 bytes): type PERF_TYPE_SOFTWARE (1), size 128,
    // config PERF_COUNT_SW_CPU_CLOCK (0), flags disabled|exclude_kernel|exclude_hv.
    let mut attr = [0u64; 16];
    attr[0] = 1 | (128 << 32);
    attr[5] = 1 | (1 << 5) | (1 << 6);
    // SAFETY: attr is a readable 128-byte buffer; pid 0 / cpu -1 measures this process.
    let fd = unsafe { raw_syscall!(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0) };
    if fd >= 0 {
        close_raw(fd);
        allowed(CHECK, "perf_event_open succeeded")
    } else {
        blocked(CHECK, format!("perf_event_open: {}", errno()))
    }
}

fn userfaultfd() -> Report {
    const CHECK: &str = "userfaultfd";
    // UFFD_USER_MODE_ONLY (1) is what an unprivileged process may ask for.
    let mut attempts = Vec::new();
    for (flags, what) in [
        (libc::O_CLOEXEC | 1, "userfaultfd(UFFD_USER_MODE_ONLY)"),
        (libc::O_CLOEXEC, "userfaultfd()"),
    ] {
        // SAFETY: userfaultfd takes an integer flag.
        let fd = unsafe { raw_syscall!(libc::SYS_userfaultfd, flags) };
        if fd >= 0 {
            close_raw(fd);
            attempts.push((format!("{what} succeeded"), true));
        } else {
            attempts.push((format!("{what}: {}", errno()), false));
        }
    }
    any_allowed(CHECK, &attempts)
}

fn open_by_handle_at() -> Report {
    const CHECK: &str = "open_by_handle_at";
    // Overlayfs roots usually cannot export handles (EOPNOTSUPP), so try a few
    // filesystems a container commonly has: its root, /dev (tmpfs), /etc/hostname
    // (a bind mount from the host's disk), /tmp.
    let mut attempts = Vec::new();
    for path in [c"/", c"/dev", c"/etc/hostname", c"/tmp"] {
        let shown = path.to_string_lossy();
        // struct file_handle: handle_bytes u32, handle_type i32, then up to MAX_HANDLE_SZ bytes.
        let mut handle = [0u64; 17];
        handle[0] = 128;
        let mut mount_id: libc::c_int = 0;
        // SAFETY: handle is a writable buffer large enough for MAX_HANDLE_SZ; path is a C string.
        let rc = unsafe {
            raw_syscall!(
                libc::SYS_name_to_handle_at,
                libc::AT_FDCWD,
                path.as_ptr(),
                handle.as_mut_ptr(),
                &raw mut mount_id,
                0,
            )
        };
        if rc != 0 {
            attempts.push((format!("name_to_handle_at({shown}): {}", errno()), false));
            continue;
        }
        // SAFETY: path is a valid C string.
        let mount_fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if mount_fd < 0 {
            attempts.push((format!("open {shown}: {}", errno()), false));
            continue;
        }
        // SAFETY: mount_fd is a valid fd, handle was filled by the kernel above.
        let fd = unsafe {
            raw_syscall!(
                libc::SYS_open_by_handle_at,
                mount_fd,
                handle.as_mut_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: closing the fd opened above.
        unsafe { libc::close(mount_fd) };
        if fd >= 0 {
            close_raw(fd);
            attempts.push((
                format!("open_by_handle_at({shown}) succeeded: files reachable by handle"),
                true,
            ));
            break;
        }
        attempts.push((format!("open_by_handle_at({shown}): {}", errno()), false));
    }
    any_allowed(CHECK, &attempts)
}

/// Opens a file for writing without writing anything: enough to show the kernel
/// would let a write through, without changing host-global settings.
fn try_open_write(path: &str) -> (String, bool) {
    match OpenOptions::new().write(true).open(path) {
        Ok(_) => (format!("{path} opened for writing (nothing written)"), true),
        Err(err) => (format!("{path}: {err}"), false),
    }
}

fn proc_sys_write() -> Report {
    any_allowed(
        "proc_sys_write",
        &[
            try_open_write("/proc/sys/kernel/core_pattern"),
            try_open_write("/proc/sys/vm/drop_caches"),
        ],
    )
}

fn sysfs_write() -> Report {
    const CHECK: &str = "sysfs_write";
    let candidates = [
        "/sys/kernel/uevent_helper",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/profiling",
        "/sys/power/state",
    ];
    let attempts: Vec<_> = candidates
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| try_open_write(p))
        .collect();
    if attempts.is_empty() {
        return not_applicable(CHECK, format!("none of {} exists", candidates.join(", ")));
    }
    any_allowed(CHECK, &attempts)
}

fn mknod() -> Report {
    const CHECK: &str = "mknod";
    let mut attempts = Vec::new();
    for dir in [std::env::temp_dir(), PathBuf::from("/dev")] {
        let path = dir.join(unique_name("probe-null"));
        let Ok(cpath) = CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: cpath is a valid C string; the node is removed below if created.
        let rc = unsafe { libc::mknod(cpath.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
        if rc == 0 {
            let _ = fs::remove_file(&path);
            attempts.push((
                format!("mknod {} (char 1:3) succeeded", path.display()),
                true,
            ));
            break;
        }
        attempts.push((format!("mknod {}: {}", path.display(), errno()), false));
    }
    any_allowed(CHECK, &attempts)
}

// ---------------------------------------------------------------- resources

/// Allocates and touches `mib` MiB, one MiB at a time; a memory limit kills the
/// process before it reports. Progress goes to stderr.
pub fn memory_hog(mib: usize) -> Report {
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(mib);
    for i in 0..mib {
        chunks.push(vec![0xa5; 1 << 20]);
        if i % 64 == 63 {
            eprintln!("probe hog: {} MiB touched", i + 1);
        }
    }
    let total: usize = chunks.iter().map(Vec::len).sum();
    allowed(
        "memory_hog",
        format!("allocated and touched {} MiB", total >> 20),
    )
}
