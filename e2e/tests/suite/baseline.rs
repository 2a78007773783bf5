//! The baseline: the same probe under plain runc, driven by podman the way a user
//! would run it (podman's defaults, and `--privileged` as users reach for when
//! something does not work). Every insecure state that the agent-sandbox suites
//! must see blocked is shown here as "allowed", so those suites can fail: the
//! probe tells a sandbox from a container.

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::process::Command;
use std::thread;

use agent_sandbox_e2e::harness::{
    self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Outcome, PROBE, ProbeReport, TOOLS_IMAGE, User,
};
use anyhow::{Context, bail};

/// `podman run --rm --runtime runc ARGS... IMAGE probe CHECKS...` as `user`.
fn runc_probe(
    user: User,
    args: &[&str],
    image: &str,
    checks: &[&str],
) -> anyhow::Result<ProbeReport> {
    harness::require_podman_image(user, image)?;
    let mut cmd = user.podman();
    cmd.args(["run", "--rm", "--runtime", "runc"])
        .args(args)
        .arg(image)
        .arg(PROBE)
        .args(checks);
    harness::probe(&mut cmd)
}

/// The checks the probe knows, from `probe list`.
fn probe_check_names(user: User) -> anyhow::Result<Vec<String>> {
    let mut cmd = user.podman();
    cmd.args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        BUSYBOX_IMAGE,
        PROBE,
        "list",
    ]);
    let out = harness::run_ok(&mut cmd, DEFAULT_TIMEOUT)?;
    Ok(out.stdout.lines().map(str::to_owned).collect())
}

#[test]
fn runc_rootful_default_exposes_host_root_capabilities_and_writable_rootfs() -> anyhow::Result<()> {
    let report = runc_probe(User::Root, &[], BUSYBOX_IMAGE, &["all"])?;
    report.expect_allowed(&[
        "uid_map_identity",
        "host_uid0",
        "cap_eff",
        "cap_bnd",
        "no_new_privs",
        "write_rootfs",
        "write_tmp",
        "write_bashrc",
        "net_ifaces",
        "ptrace",
        "chroot",
    ])?;
    // podman's default seccomp profile is on: the probe must read mode 2 as blocked.
    report.expect_blocked(&["seccomp_mode"])?;
    // `probe all` reports every check it knows, each once.
    let names = probe_check_names(User::Root)?;
    let reported: Vec<&String> = report.checks.keys().collect();
    let mut expected: Vec<&String> = names.iter().collect();
    expected.sort();
    if reported != expected {
        bail!("probe all reported {reported:?}, probe list says {expected:?}\n{report}");
    }
    Ok(())
}

#[test]
fn runc_rootful_privileged_allows_kernel_attack_surface() -> anyhow::Result<()> {
    let report = runc_probe(
        User::Root,
        &["--privileged", "--pid", "host"],
        BUSYBOX_IMAGE,
        &["all"],
    )?;
    report.expect_allowed(&[
        "seccomp_mode",
        "mount",
        "unshare",
        "unshare_user",
        "unshare_mount",
        "setns",
        "io_uring",
        "keyctl",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "af_packet",
        "netlink_non_route",
        "personality",
        "open_by_handle_at",
        "proc_sys_write",
        "sysfs_write",
        "mknod",
        "proc_root_escape",
    ])
}

#[test]
fn runc_rootless_default_grants_namespace_capabilities_and_writable_rootfs() -> anyhow::Result<()> {
    let report = runc_probe(User::Rootless, &[], BUSYBOX_IMAGE, &["all"])?;
    report.expect(&[
        // Rootless podman already keeps host root out of the mapping...
        ("uid_map_identity", Outcome::Blocked),
        ("host_uid0", Outcome::Blocked),
        // ...but the container still holds capabilities, no_new_privs is off, the
        // rootfs is writable and slirp4netns gives it a network interface.
        ("cap_eff", Outcome::Allowed),
        ("cap_bnd", Outcome::Allowed),
        ("no_new_privs", Outcome::Allowed),
        ("write_rootfs", Outcome::Allowed),
        ("write_bashrc", Outcome::Allowed),
        ("net_ifaces", Outcome::Allowed),
        ("ptrace", Outcome::Allowed),
    ])
}

#[test]
fn runc_rootless_privileged_allows_mount_unshare_and_kernel_syscalls() -> anyhow::Result<()> {
    let report = runc_probe(User::Rootless, &["--privileged"], BUSYBOX_IMAGE, &["all"])?;
    report.expect_allowed(&[
        "seccomp_mode",
        "mount",
        "unshare",
        "unshare_mount",
        "setns",
        "io_uring",
        "keyctl",
        "perf_event_open",
        "personality",
        "af_packet",
    ])
}

/// Bind-mounts a fresh host directory as the workspace and shows that the
/// probe's writes, including to protected workspace paths, reach the host.
fn workspace_writes_reach_host(user: User) -> anyhow::Result<()> {
    let dir = harness::temp_dir_for(user)?;
    let volume = format!("{}:/workspace", dir.path().display());
    let report = runc_probe(
        user,
        &["-v", &volume, "-e", "WORKSPACE=/workspace"],
        BUSYBOX_IMAGE,
        &["write_workspace", "write_bashrc", "write_git_hooks"],
    )?;
    report.expect_allowed(&["write_workspace", "write_bashrc", "write_git_hooks"])?;
    harness::require_file(dir.path().join("agent-sandbox-probe.txt"))
        .with_context(|| format!("workspace write did not reach the host\n{report}"))?;
    let bashrc = fs::read_to_string(dir.path().join(".bashrc"))
        .with_context(|| format!("host .bashrc missing\n{report}"))?;
    if !bashrc.contains("agent-sandbox probe") {
        bail!("host .bashrc lacks the probe's line: {bashrc:?}\n{report}");
    }
    harness::require_file(dir.path().join(".git/hooks/x"))
        .with_context(|| format!("hook did not reach the host\n{report}"))
}

#[test]
fn runc_rootful_workspace_mount_lets_tools_plant_bashrc_and_git_hooks() -> anyhow::Result<()> {
    workspace_writes_reach_host(User::Root)
}

#[test]
fn runc_rootless_workspace_mount_lets_tools_plant_bashrc_and_git_hooks() -> anyhow::Result<()> {
    workspace_writes_reach_host(User::Rootless)
}

#[test]
fn runc_agent_user_reads_ssh_key_and_writes_own_bashrc() -> anyhow::Result<()> {
    let report = runc_probe(
        User::Root,
        &["--user", "1000"],
        TOOLS_IMAGE,
        &["read_ssh_key", "write_bashrc"],
    )?;
    report.expect_allowed(&["read_ssh_key", "write_bashrc"])
}

#[test]
fn runc_host_network_reaches_host_loopback_and_none_does_not() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on loopback")?;
    let addr = listener.local_addr()?;
    let acceptor = thread::spawn(move || {
        // One connection is expected; the probe closes it right away.
        if let Ok((mut conn, _)) = listener.accept() {
            let _ = conn.read(&mut [0u8; 1]);
        }
    });
    let target = format!("PROBE_TARGET={addr}");
    let report = runc_probe(
        User::Root,
        &["--network", "host", "-e", &target],
        BUSYBOX_IMAGE,
        &["net_connect"],
    )?;
    report.expect_allowed(&["net_connect"])?;
    let _ = acceptor.join();
    let report = runc_probe(
        User::Root,
        &["--network", "none", "-e", &target],
        BUSYBOX_IMAGE,
        &["net_connect", "net_ifaces"],
    )?;
    report.expect_blocked(&["net_connect", "net_ifaces"])
}

#[test]
fn runc_memory_limit_kills_hog_and_unlimited_hog_completes() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let report = runc_probe(User::Root, &[], BUSYBOX_IMAGE, &["hog", "96"])?;
    report.expect_allowed(&["memory_hog"])?;
    let mut cmd = Command::new("podman");
    cmd.args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--memory",
        "64m",
        "--memory-swap",
        "64m",
        BUSYBOX_IMAGE,
        PROBE,
        "hog",
        "512",
    ]);
    let out = harness::run(&mut cmd, DEFAULT_TIMEOUT)?;
    if out.code != Some(137) {
        bail!("expected the hog to be OOM-killed (exit 137) under --memory 64m\n{out}");
    }
    Ok(())
}
