//! podman suite: real `podman run --runtime /usr/local/bin/agent-sandbox`, rootful
//! and rootless. Every security test is a self-contained pair: the probe shows the
//! property blocked under agent-sandbox and the same attempt allowed under runc
//! (so the test can fail), with the same image and the same podman flags unless
//! the runc side needs `--privileged` to get past podman's own seccomp profile.

use std::fs;

use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, Outcome, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, unique_name};
use anyhow::{Context, bail};

fn sandbox(user: User) -> Podman {
    Podman::new(user, Runtime::AgentSandbox)
}

fn runc(user: User) -> Podman {
    Podman::new(user, Runtime::Runc)
}

/// Identity, capabilities, no_new_privs, seccomp mode, rootfs, network: blocked
/// under the sandbox with podman's defaults.
const SANDBOX_BLOCKS: &[&str] = &[
    "cap_eff",
    "cap_bnd",
    "no_new_privs",
    "seccomp_mode",
    "write_rootfs",
    "net_ifaces",
    "ptrace",
    "mount",
    "unshare",
    "unshare_user",
    "io_uring",
    "keyctl",
];

fn sandbox_blocks_what_runc_allows(user: User) -> anyhow::Result<()> {
    let ours = sandbox(user).probe(&[], BUSYBOX_IMAGE, &["all"])?;
    ours.expect_blocked(SANDBOX_BLOCKS)?;
    // Scratch tmpfs stays usable: the sandbox is not just broken.
    ours.expect_allowed(&["write_tmp"])?;
    // The same attack surface is open under runc (privileged, so podman's own
    // seccomp profile and capability set do not hide it). Rootless runc cannot
    // create a nested user namespace even privileged, so that check is left out.
    let base = runc(user).probe(&["--privileged"], BUSYBOX_IMAGE, &["all"])?;
    let open: Vec<&str> = SANDBOX_BLOCKS
        .iter()
        .copied()
        .filter(|c| !(user == User::Rootless && *c == "unshare_user"))
        .collect();
    base.expect_allowed(&open)
}

#[test]
fn rootful_sandbox_blocks_caps_nnp_seccomp_rootfs_network_and_syscalls_that_runc_allows()
-> anyhow::Result<()> {
    sandbox_blocks_what_runc_allows(User::Root)
}

#[test]
fn rootless_sandbox_blocks_caps_nnp_seccomp_rootfs_network_and_syscalls_that_runc_allows()
-> anyhow::Result<()> {
    sandbox_blocks_what_runc_allows(User::Rootless)
}

/// `truncate(2)` by path of image files (to their own length): Landlock before ABI 3 has no
/// right for it (Debian 12, Ubuntu 22.04), so the read-only root and the files' ownership must
/// stop it on every kernel; runc lets it through. The probe is the one built with the binaries
/// under test, bound over the image's, so the check is as new as the build.
#[test]
fn rootful_truncate_by_path_of_image_files_fails_on_every_landlock_abi_but_runc_allows_it()
-> anyhow::Result<()> {
    let probe = harness::bin_dir().join("probe");
    harness::require_file(&probe)?;
    let bind = format!("{}:{}:ro", probe.display(), harness::PROBE);
    let ours = sandbox(User::Root).probe(&["-v", &bind], BUSYBOX_IMAGE, &["truncate_rootfs"])?;
    ours.expect_blocked(&["truncate_rootfs"])?;
    let base = runc(User::Root).probe(&["-v", &bind], BUSYBOX_IMAGE, &["truncate_rootfs"])?;
    base.expect_allowed(&["truncate_rootfs"])
}

#[test]
fn rootful_sandbox_maps_root_to_an_unprivileged_host_range_unlike_runc() -> anyhow::Result<()> {
    let ours = sandbox(User::Root).probe(&[], BUSYBOX_IMAGE, &["uid_map_identity", "host_uid0"])?;
    ours.expect_blocked(&["uid_map_identity", "host_uid0"])?;
    let base = runc(User::Root).probe(&[], BUSYBOX_IMAGE, &["uid_map_identity", "host_uid0"])?;
    base.expect_allowed(&["uid_map_identity", "host_uid0"])
}

#[test]
fn rootful_sandboxes_get_distinct_host_id_blocks() -> anyhow::Result<()> {
    let p = sandbox(User::Root);
    let a = unique_name("ida");
    let _ga = ContainerGuard {
        podman: p,
        name: a.clone(),
    };
    p.run_ok(&["run", "-d", "--name", &a, BUSYBOX_IMAGE, "sleep", "600"])?;
    let b = unique_name("idb");
    let _gb = ContainerGuard {
        podman: p,
        name: b.clone(),
    };
    p.run_ok(&["run", "-d", "--name", &b, BUSYBOX_IMAGE, "sleep", "600"])?;
    let map = |n: &str| -> anyhow::Result<String> {
        Ok(p.run_ok(&["exec", n, "cat", "/proc/self/uid_map"])?
            .stdout
            .trim()
            .to_owned())
    };
    let (ma, mb) = (map(&a)?, map(&b)?);
    let host = |m: &str| m.split_whitespace().nth(1).map(str::to_owned);
    if host(&ma).is_none() || host(&ma) == host(&mb) || host(&ma).as_deref() == Some("0") {
        bail!("expected two distinct non-zero host id blocks, got {ma:?} and {mb:?}");
    }
    // runc gives both the host's identity mapping.
    let r =
        runc(User::Root).run_ok(&["run", "--rm", BUSYBOX_IMAGE, "cat", "/proc/self/uid_map"])?;
    if r.stdout.split_whitespace().nth(1) != Some("0") {
        bail!("runc baseline unexpectedly not identity: {}", r.stdout);
    }
    Ok(())
}

/// A host workspace with a protected file and git hooks dir already present.
fn workspace(user: User) -> anyhow::Result<tempfile::TempDir> {
    let dir = harness::temp_dir_for(user)?;
    fs::write(dir.path().join(".bashrc"), "# host bashrc\n")?;
    fs::create_dir_all(dir.path().join(".git/hooks"))?;
    fs::write(dir.path().join("README"), "host file\n")?;
    if user == User::Rootless {
        let uid = nix::unistd::Uid::from_raw(harness::TEST_UID);
        for p in [".bashrc", ".git", ".git/hooks", "README"] {
            nix::unistd::chown(&dir.path().join(p), Some(uid), None)?;
        }
    }
    Ok(dir)
}

fn workspace_overlay_keeps_writes_off_host(user: User) -> anyhow::Result<()> {
    let checks = ["write_workspace", "write_bashrc", "write_git_hooks"];
    let dir = workspace(user)?;
    let volume = format!("{}:/workspace", dir.path().display());
    // A home shared read-only, as agents often get it: the sandbox keeps a HOME on a mount
    // the caller chose (one on the read-only image moves to its scratch area, where a
    // `.bashrc` dies with the sandbox: docs/workspace.md).
    let home = harness::temp_dir_for(user)?;
    fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let home_volume = format!("{}:/home/agent:ro", home.path().display());
    let args = [
        "-v",
        volume.as_str(),
        "-v",
        home_volume.as_str(),
        "-e",
        "WORKSPACE=/workspace",
        "-e",
        "HOME=/home/agent",
    ];
    let ours = sandbox(user).probe(&args, BUSYBOX_IMAGE, &checks)?;
    ours.expect(&[
        ("write_workspace", Outcome::Allowed),
        ("write_bashrc", Outcome::Blocked),
        ("write_git_hooks", Outcome::Blocked),
    ])?;
    if dir.path().join("agent-sandbox-probe.txt").exists() {
        bail!("the sandbox's workspace write reached the host\n{ours}");
    }
    let bashrc = fs::read_to_string(dir.path().join(".bashrc"))?;
    if bashrc != "# host bashrc\n" {
        bail!("host .bashrc changed under the sandbox: {bashrc:?}");
    }
    // Same flags under runc: everything lands on the host.
    let base = runc(user).probe(&args, BUSYBOX_IMAGE, &checks)?;
    base.expect_allowed(&checks)?;
    harness::require_file(dir.path().join("agent-sandbox-probe.txt"))
        .with_context(|| format!("runc baseline write did not reach the host\n{base}"))
}

#[test]
fn rootful_workspace_overlay_accepts_writes_that_never_reach_host_and_protects_bashrc_and_hooks()
-> anyhow::Result<()> {
    workspace_overlay_keeps_writes_off_host(User::Root)
}

#[test]
fn rootless_workspace_overlay_accepts_writes_that_never_reach_host_and_protects_bashrc_and_hooks()
-> anyhow::Result<()> {
    workspace_overlay_keeps_writes_off_host(User::Rootless)
}

fn memory_limit_kills_hog(user: User) -> anyhow::Result<()> {
    // The annotation narrows the policy's memory limit; runc ignores it.
    let args = [
        "run",
        "--rm",
        "--annotation",
        "io.agent.sandbox.memory=64M",
        BUSYBOX_IMAGE,
        harness::PROBE,
        "hog",
        "256",
    ];
    let ours = sandbox(user).run(&args)?;
    if ours.code != Some(137) {
        bail!("expected the hog to be OOM-killed (137) under the sandbox\n{ours}");
    }
    let base = runc(user).run(&args)?;
    if !base.success() {
        bail!("runc baseline: the hog should succeed without a limit\n{base}");
    }
    Ok(())
}

#[test]
fn rootful_memory_limit_from_policy_kills_a_hog_that_runc_lets_run() -> anyhow::Result<()> {
    memory_limit_kills_hog(User::Root)
}

#[test]
fn rootless_memory_limit_from_policy_kills_a_hog_that_runc_lets_run() -> anyhow::Result<()> {
    memory_limit_kills_hog(User::Rootless)
}

fn exec_gets_the_same_sandbox(user: User) -> anyhow::Result<()> {
    let checks = [
        "uid_map_identity",
        "cap_eff",
        "cap_bnd",
        "no_new_privs",
        "seccomp_mode",
        "write_rootfs",
    ];
    for (runtime, want) in [
        (Runtime::AgentSandbox, Outcome::Blocked),
        (Runtime::Runc, Outcome::Allowed),
    ] {
        let p = Podman::new(user, runtime);
        let name = unique_name("exec");
        let _g = ContainerGuard {
            podman: p,
            name: name.clone(),
        };
        let mut run = vec!["run", "-d", "--name", name.as_str()];
        if runtime == Runtime::Runc {
            run.push("--privileged");
        }
        run.extend([BUSYBOX_IMAGE, "sleep", "600"]);
        p.run_ok(&run)?;
        let mut exec = vec!["exec", "-t", name.as_str(), harness::PROBE];
        exec.extend(checks);
        let report = harness::ProbeReport::parse(p.run_ok(&exec)?)?;
        let expected: Vec<(&str, Outcome)> = checks
            .iter()
            .filter(|c| !(user == User::Rootless && **c == "uid_map_identity"))
            .map(|c| (*c, want))
            .collect();
        report
            .expect(&expected)
            .with_context(|| format!("podman exec -t under {runtime:?}"))?;
    }
    Ok(())
}

#[test]
fn rootful_exec_tty_process_gets_userns_no_caps_nnp_and_seccomp_unlike_runc() -> anyhow::Result<()>
{
    exec_gets_the_same_sandbox(User::Root)
}

#[test]
fn rootless_exec_tty_process_gets_no_caps_nnp_and_seccomp_unlike_runc() -> anyhow::Result<()> {
    exec_gets_the_same_sandbox(User::Rootless)
}

fn lifecycle(user: User) -> anyhow::Result<()> {
    let p = sandbox(user);
    // A non-zero exit code is reported.
    let out = p.run(&["run", "--rm", BUSYBOX_IMAGE, "sh", "-c", "exit 42"])?;
    if out.code != Some(42) {
        bail!("expected exit code 42\n{out}");
    }
    // stop: SIGTERM to a shell that traps it, then the container is exited.
    let name = unique_name("stop");
    let _g = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    p.run_ok(&[
        "run",
        "-d",
        "--name",
        &name,
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "trap 'exit 3' TERM; echo ready; while :; do sleep 0.1; done",
    ])?;
    // SIGTERM before the trap is set would be ignored by PID 1: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !p.run_ok(&["logs", &name])?.stdout.contains("ready") {
        if std::time::Instant::now() > deadline {
            bail!("the container never printed ready");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    p.run_ok(&["stop", "-t", "5", &name])?;
    let code = p.run_ok(&["inspect", "-f", "{{.State.ExitCode}}", &name])?;
    if code.stdout.trim() != "3" {
        bail!("stop: expected the TERM trap's exit code 3\n{code}");
    }
    // kill: SIGKILL ends it with 137.
    p.run_ok(&["start", &name])?;
    p.run_ok(&["kill", &name])?;
    p.run_ok(&["wait", &name])?;
    let state = p.run_ok(&[
        "inspect",
        "-f",
        "{{.State.Status}} {{.State.ExitCode}}",
        &name,
    ])?;
    if state.stdout.trim() != "exited 137" {
        bail!("kill: expected exited 137\n{state}");
    }
    // rm -f of a running container removes it and its sandbox state.
    p.run_ok(&["start", &name])?;
    let id = p
        .run_ok(&["inspect", "-f", "{{.Id}}", &name])?
        .stdout
        .trim()
        .to_owned();
    p.run_ok(&["rm", "-f", "-t", "0", &name])?;
    let exists = p.run(&["container", "exists", &name])?;
    if exists.code != Some(1) {
        bail!("rm -f left the container\n{exists}");
    }
    if user == User::Root {
        for dir in [
            format!("/run/agent-sandbox/containers/{id}"),
            format!("/run/agent-sandbox/sandbox/{id}"),
        ] {
            if std::path::Path::new(&dir).exists() {
                bail!("rm -f left {dir}");
            }
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo")?;
        if mounts.contains(&id) && mounts.contains("agent-sandbox") {
            bail!("rm -f left mounts of {id}");
        }
        let idmap = fs::read_to_string("/run/agent-sandbox/idmap.json").unwrap_or_default();
        if idmap.contains(&id) {
            bail!("rm -f left the id block of {id} allocated: {idmap}");
        }
    }
    Ok(())
}

#[test]
fn rootful_lifecycle_exit_code_stop_kill_rm_force_and_cleanup() -> anyhow::Result<()> {
    lifecycle(User::Root)
}

#[test]
fn rootless_lifecycle_exit_code_stop_kill_rm_force() -> anyhow::Result<()> {
    lifecycle(User::Rootless)
}

#[test]
fn runtime_state_reports_runc_statuses_and_unknown_ids_like_runc() -> anyhow::Result<()> {
    harness::require_file(harness::runtime_bin())?;
    let root = tempfile::tempdir()?;
    let root_s = root.path().to_string_lossy().into_owned();
    let rt = |args: &[&str]| {
        let mut cmd = std::process::Command::new(harness::runtime_bin());
        cmd.arg("--root").arg(&root_s).args(args);
        harness::run(&mut cmd, harness::DEFAULT_TIMEOUT)
    };
    let missing = rt(&["state", "nosuch"])?;
    if missing.success() || !missing.stderr.contains("does not exist") {
        bail!("state of an unknown id must fail with 'does not exist'\n{missing}");
    }
    let forced = rt(&["delete", "--force", "nosuch"])?;
    if !forced.success() {
        bail!("delete --force of an unknown id must succeed\n{forced}");
    }
    let bad = rt(&["create", "--bundle", "/nonexistent-bundle", "x1"])?;
    if bad.success() || !bad.stderr.contains("/nonexistent-bundle/config.json") {
        bail!("a missing bundle must be named in the error\n{bad}");
    }
    let flag = rt(&["create", "--no-such-flag", "x1"])?;
    if flag.success() || !flag.stderr.contains("--no-such-flag") {
        bail!("an unknown flag must be named in the error\n{flag}");
    }
    Ok(())
}

fn wall_clock_kills_long_runner(user: User) -> anyhow::Result<()> {
    let args = [
        "run",
        "--rm",
        "--annotation",
        "io.agent.sandbox.wall-clock=2s",
        BUSYBOX_IMAGE,
        "sleep",
        "6",
    ];
    let ours = sandbox(user).run(&args)?;
    if ours.code != Some(137) || ours.elapsed >= std::time::Duration::from_secs(6) {
        bail!("expected the wall-clock limit to kill the sandbox (137) before 6 s\n{ours}");
    }
    let base = runc(user).run(&args)?;
    if !base.success() {
        bail!("runc baseline: sleep 6 should finish without a wall clock\n{base}");
    }
    Ok(())
}

#[test]
fn rootful_wall_clock_limit_kills_a_sandbox_that_runc_lets_finish() -> anyhow::Result<()> {
    wall_clock_kills_long_runner(User::Root)
}

#[test]
fn rootless_wall_clock_limit_kills_a_sandbox_that_runc_lets_finish() -> anyhow::Result<()> {
    wall_clock_kills_long_runner(User::Rootless)
}

#[test]
fn rootful_update_cannot_lift_memory_above_the_policy_but_can_lower_it() -> anyhow::Result<()> {
    let p = sandbox(User::Root);
    let name = unique_name("upd");
    let _g = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    p.run_ok(&["run", "-d", "--name", &name, BUSYBOX_IMAGE, "sleep", "600"])?;
    let id = p
        .run_ok(&["inspect", "-f", "{{.Id}}", &name])?
        .stdout
        .trim()
        .to_owned();
    let dir = tempfile::tempdir()?;
    let res = |bytes: i64| -> anyhow::Result<harness::Output> {
        let f = dir.path().join("res.json");
        fs::write(&f, format!("{{\"memory\":{{\"limit\":{bytes}}}}}"))?;
        let mut cmd = std::process::Command::new(harness::runtime_bin());
        cmd.arg("update").arg("--resources").arg(&f).arg(&id);
        harness::run(&mut cmd, harness::DEFAULT_TIMEOUT)
    };
    let wider = res(64 << 30)?;
    if wider.success() || !wider.stderr.contains("above the policy") {
        bail!("a 64 GiB memory limit must be refused\n{wider}");
    }
    let narrower = res(128 << 20)?;
    if !narrower.success() {
        bail!("lowering the memory limit must work\n{narrower}");
    }
    let file = format!("/sys/fs/cgroup/memory/libpod_parent/libpod-{id}/memory.limit_in_bytes");
    let got = fs::read_to_string(&file).with_context(|| format!("cannot read {file}"))?;
    if got.trim() != (128u64 << 20).to_string() {
        bail!("memory limit after update is {got}");
    }
    Ok(())
}

#[test]
fn rootful_created_container_waits_in_a_write_protected_runtime_copy_and_rm_force_cleans_up()
-> anyhow::Result<()> {
    // CVE-2019-5736: a container process opens /proc/PID/exe of a runtime process that
    // entered the container, keeps the fd, and once that process is gone reopens it for
    // writing to overwrite the host's runtime binary. The container's init, waiting for
    // `start`, is such a runtime process; as host root (stronger than any container
    // process) this test holds its exe and tries the write after `rm -f`.
    let p = sandbox(User::Root);
    let name = unique_name("exe");
    let _g = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    let host_binary = harness::runtime_bin();
    let before =
        fs::read(&host_binary).with_context(|| format!("cannot read {}", host_binary.display()))?;
    p.run_ok(&["create", "--name", &name, BUSYBOX_IMAGE, "true"])?;
    p.run_ok(&["init", &name])?;
    let pid = p
        .run_ok(&["inspect", "-f", "{{.State.Pid}}", &name])?
        .stdout
        .trim()
        .to_owned();
    let exe = format!("/proc/{pid}/exe");
    let held = fs::File::open(&exe).with_context(|| format!("cannot open {exe}"))?;
    let target = fs::read_link(&exe)?;
    let id = p
        .run_ok(&["inspect", "-f", "{{.Id}}", &name])?
        .stdout
        .trim()
        .to_owned();
    p.run_ok(&["rm", "-f", &name])?;
    let attack = overwrite_through_fd(&held);
    if attack.is_ok() {
        bail!(
            "the runtime copy the init ran ({}) took a write",
            target.display()
        );
    }
    if fs::read(&host_binary)? != before {
        bail!("{} changed", host_binary.display());
    }
    for dir in [
        format!("/run/agent-sandbox/containers/{id}"),
        format!("/run/agent-sandbox/sandbox/{id}"),
    ] {
        if std::path::Path::new(&dir).exists() {
            bail!("rm -f of a created container left {dir}");
        }
    }
    // The same attack on a process that runs a binary straight from disk (a copy of
    // busybox in a temporary directory) overwrites it: the defence is what stops it.
    let dir = tempfile::tempdir()?;
    let plain = dir.path().join("busybox");
    fs::copy("/bin/busybox", &plain)?;
    let mut child = std::process::Command::new(&plain)
        .args(["sleep", "30"])
        .spawn()?;
    let held = fs::File::open(format!("/proc/{}/exe", child.id()))?;
    child.kill()?;
    child.wait()?;
    overwrite_through_fd(&held).context("the same attack on a plain binary must succeed")?;
    Ok(())
}

/// Reopens `held` through /proc/self/fd for writing and writes one byte (the
/// CVE-2019-5736 step).
fn overwrite_through_fd(held: &fs::File) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", held.as_raw_fd());
    let mut f = fs::OpenOptions::new().write(true).open(&path)?;
    f.write_all(b"x")?;
    Ok(())
}

#[test]
fn rootful_symlinked_protected_path_in_workspace_does_not_expose_the_host_target()
-> anyhow::Result<()> {
    // A workspace whose .bashrc links to a host file outside it: binding the
    // protected path read-only would follow the link on the host and show the
    // host file in the sandbox. The sandbox must resolve it in its own view.
    let secret_dir = tempfile::tempdir()?;
    let secret = secret_dir.path().join("secret");
    fs::write(&secret, "host-secret-4711\n")?;
    // World-readable in a traversable dir: a bind would make it visible.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(secret_dir.path(), fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o644))?;
    let ws = harness::temp_dir_for(User::Root)?;
    std::os::unix::fs::symlink(&secret, ws.path().join(".bashrc"))?;
    let volume = format!("{}:/workspace", ws.path().display());
    let out = sandbox(User::Root).run(&[
        "run",
        "--rm",
        "-v",
        &volume,
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "cat /workspace/.bashrc; true",
    ])?;
    if !out.success() || out.stdout.contains("host-secret-4711") {
        bail!("the sandbox showed the host file behind a symlinked protected path\n{out}");
    }
    Ok(())
}

#[test]
fn rootful_pause_and_unpause_freeze_the_sandbox() -> anyhow::Result<()> {
    let p = sandbox(User::Root);
    let name = unique_name("pause");
    let _g = ContainerGuard {
        podman: p,
        name: name.clone(),
    };
    p.run_ok(&["run", "-d", "--name", &name, BUSYBOX_IMAGE, "sleep", "600"])?;
    p.run_ok(&["pause", &name])?;
    let id = p
        .run_ok(&["inspect", "-f", "{{.Id}}", &name])?
        .stdout
        .trim()
        .to_owned();
    let mut cmd = std::process::Command::new(harness::runtime_bin());
    cmd.args(["state", &id]);
    let state = harness::run_ok(&mut cmd, harness::DEFAULT_TIMEOUT)?;
    if !state.stdout.contains("\"status\": \"paused\"") {
        bail!("runtime state must say paused\n{state}");
    }
    p.run_ok(&["unpause", &name])?;
    let st = p.run_ok(&["inspect", "-f", "{{.State.Status}}", &name])?;
    if st.stdout.trim() != "running" {
        bail!("unpause: expected running\n{st}");
    }
    Ok(())
}
