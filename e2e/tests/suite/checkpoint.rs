//! Checkpoint/restore suite (docs/checkpoint.md): podman's `container checkpoint` and
//! `container restore` of a sandbox mid-task (a shell counting in memory, a workspace edit
//! not yet promoted), through the runtime's runc-compatible `checkpoint`/`restore`.
//!
//! What it shows: the count goes on from where it was (the memory came back, the program
//! was not started again), the edit is still there and in `diff`, the egress proxy still
//! answers for the allowlist in the restored network namespace, and the audit chain
//! verifies across `checkpointed` and `restored`. What must be refused is refused with an
//! error naming the reason: a policy whose Landlock layer is required (CRIU cannot carry a
//! Landlock domain), flags the runtime cannot honour, a rootless runtime, rootless podman.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox_e2e::criu_image::{Field, add_sys_admin, drop_seccomp, edit_thread_core};
use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag};
use anyhow::{Context, bail, ensure};

/// The shell that counts in memory (and shows its count in a file on the sandbox's tmpfs,
/// which CRIU carries with the sandbox's mounts).
const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done";

/// The built-in `agent` policy with its Landlock layer `landlock` (`required`/`optional`).
fn policy(dir: &Path, landlock: &str) -> anyhow::Result<PathBuf> {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/agent.toml");
    let text = std::fs::read_to_string(&agent)?;
    ensure!(
        text.contains("\nlandlock = \"required\"\n"),
        "profiles/agent.toml no longer says landlock = \"required\""
    );
    let path = dir.join(format!("ckpt-{landlock}.toml"));
    std::fs::write(
        &path,
        text.replace(
            "\nlandlock = \"required\"\n",
            &format!("\nlandlock = \"{landlock}\"\n"),
        ),
    )?;
    Ok(path)
}

/// A counting sandbox under `policy` with a workspace at `ws`; PID 1 is podman's init (the
/// runtime's own reaping init cannot be checkpointed: docs/checkpoint.md#init).
fn counting_sandbox(
    p: Podman,
    policy: &Path,
    ws: &Path,
) -> anyhow::Result<(ContainerGuard, String, String)> {
    let flag = policy_flag(policy);
    let volume = format!("{}:/workspace", ws.display());
    let (guard, id) = p.run_detached(
        &["--runtime-flag", &flag],
        "ckpt",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", COUNTER],
    )?;
    Ok((guard, id, flag))
}

/// The count the sandbox shows now.
fn count(p: Podman, name: &str) -> anyhow::Result<u64> {
    let out = p.run_ok(&["exec", name, "cat", "/tmp/count"])?;
    out.stdout
        .trim()
        .parse()
        .with_context(|| format!("no count\n{out}"))
}

/// Waits until the count reaches `at_least`.
fn count_reaches(p: Podman, name: &str, at_least: u64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(n) = count(p, name)
            && n >= at_least
        {
            return Ok(n);
        }
        ensure!(
            Instant::now() < deadline,
            "the count never reached {at_least}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn kinds(records: &str) -> Vec<String> {
    records
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["kind"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn podman_restore_goes_on_counting_keeps_the_edit_the_allowlist_and_the_chain() -> anyhow::Result<()>
{
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    std::fs::write(ws.join("notes.txt"), "host\n")?;
    let policy = policy(dir.path(), "optional")?;
    let (g, id, flag) = counting_sandbox(p, &policy, &ws)?;
    let name = g.name.clone();
    p.run_ok(&[
        "exec",
        &name,
        "sh",
        "-c",
        "echo edited > /workspace/notes.txt",
    ])?;
    let before = count_reaches(p, &name, 15)?;
    let out = p.run(&["--runtime-flag", &flag, "container", "checkpoint", &name])?;
    ensure!(out.success(), "checkpoint failed\n{out}");
    let state = p.run_ok(&["inspect", "--format", "{{.State.Status}}", &name])?;
    ensure!(
        state.stdout.trim() == "exited",
        "not stopped by the checkpoint\n{state}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let out = p.run(&["--runtime-flag", &flag, "container", "restore", &name])?;
    ensure!(out.success(), "restore failed\n{out}");
    // A program started again would count from 1: this one goes on from its memory.
    let after = count(p, &name)?;
    ensure!(
        after >= before && after < before + 10,
        "count {before} before the checkpoint, {after} after the restore"
    );
    count_reaches(p, &name, after + 3)?;
    let edit = p.run_ok(&["exec", &name, "cat", "/workspace/notes.txt"])?;
    ensure!(edit.stdout == "edited\n", "the edit is gone\n{edit}");
    let diff = harness::runtime_ok(&["diff", &id])?;
    ensure!(
        diff.stdout.contains("notes.txt"),
        "diff lost the edit\n{diff}"
    );
    ensure!(
        std::fs::read_to_string(ws.join("notes.txt"))? == "host\n",
        "the edit reached the host checkout unpromoted"
    );
    // The proxy is bound in the restored network namespace and still answers for the
    // allowlist: an unlisted host is refused by it, and there is no other way out.
    let denied = p.run(&[
        "exec",
        &name,
        "sh",
        "-c",
        "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://unlisted.example.invalid/",
    ])?;
    ensure!(
        denied.stdout.trim() == "403",
        "the proxy did not refuse\n{denied}"
    );
    let direct = p.run(&[
        "exec",
        &name,
        "sh",
        "-c",
        "curl --noproxy '*' -sS -m 5 http://192.0.2.1/",
    ])?;
    ensure!(!direct.success(), "a direct connection got out\n{direct}");
    audit_across(&id)?;
    let layers = harness::runtime_ok(&["layers", &id])?;
    let layers: serde_json::Value = serde_json::from_str(&layers.stdout)?;
    ensure!(
        layers
            .to_string()
            .contains("CRIU does not save Landlock domains"),
        "layers does not say Landlock was not carried\n{layers:#}"
    );
    Ok(())
}

#[test]
fn podman_checkpoint_leave_running_keeps_the_sandbox_counting() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    let policy = policy(dir.path(), "optional")?;
    let (g, id, flag) = counting_sandbox(p, &policy, &ws)?;
    let before = count_reaches(p, &g.name, 3)?;
    // podman 4.3 passes `--leave-running` twice, as runc accepts.
    let out = p.run(&[
        "--runtime-flag",
        &flag,
        "container",
        "checkpoint",
        "--leave-running",
        &g.name,
    ])?;
    ensure!(out.success(), "checkpoint --leave-running failed\n{out}");
    count_reaches(p, &g.name, before + 3)?;
    harness::runtime_ok(&["audit", "verify", &id])?;
    let json = harness::runtime_ok(&["audit", "--json", &id])?.stdout;
    let kinds = kinds(&json);
    ensure!(
        kinds.iter().any(|k| k == "checkpointed") && !kinds.iter().any(|k| k == "delete"),
        "{kinds:?}"
    );
    ensure!(json.contains("\"leave_running\":true"), "{json}");
    Ok(())
}

/// The chain verifies across the checkpoint, and the restored sandbox's first record is
/// `restored`, naming the digest `checkpointed` named.
fn audit_across(id: &str) -> anyhow::Result<()> {
    harness::runtime_ok(&["audit", "verify", id])?;
    let json = harness::runtime_ok(&["audit", "--json", id])?.stdout;
    let kinds = kinds(&json);
    let at = kinds
        .iter()
        .position(|k| k == "checkpointed")
        .context("no checkpointed record")?;
    let restored = kinds
        .iter()
        .position(|k| k == "restored")
        .context("no restored record")?;
    ensure!(
        kinds[at..restored].last().map(String::as_str) == Some("delete"),
        "the checkpoint did not end the sandbox before the restore: {kinds:?}"
    );
    let digest = |kind: &str| {
        json.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|r| r["kind"] == kind)
            .and_then(|r| r["data"]["image_digest"].as_str().map(str::to_owned))
    };
    ensure!(
        digest("checkpointed").is_some() && digest("checkpointed") == digest("restored"),
        "the digests differ\n{json}"
    );
    Ok(())
}

#[test]
fn checkpoint_is_refused_while_the_policy_requires_landlock() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    let policy = policy(dir.path(), "required")?;
    let (g, _id, flag) = counting_sandbox(p, &policy, &ws)?;
    let before = count_reaches(p, &g.name, 3)?;
    let out = p.run(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    ensure!(
        !out.success(),
        "checkpoint of a required Landlock layer passed\n{out}"
    );
    ensure!(
        out.stderr.contains("landlock") && out.stderr.contains("docs/checkpoint.md#layers"),
        "unclear error\n{out}"
    );
    // Nothing changed: the sandbox counts on.
    count_reaches(p, &g.name, before + 3)?;
    Ok(())
}

#[test]
fn runtime_speaks_runcs_checkpoint_flags_and_refuses_what_it_cannot_honour() -> anyhow::Result<()> {
    // podman 4 decides whether a runtime can checkpoint from `checkpoint --help`.
    let help = harness::runtime_ok(&["checkpoint", "--help"])?;
    for flag in [
        "--image-path",
        "--work-path",
        "--leave-running",
        "--tcp-established",
        "--ext-unix-sk",
        "--shell-job",
        "--file-locks",
        "--pre-dump",
        "--parent-path",
        "--manage-cgroups-mode",
        "--empty-ns",
        "--auto-dedup",
        "--lazy-pages",
        "--status-fd",
        "--page-server",
    ] {
        ensure!(
            help.stdout.contains(flag),
            "checkpoint --help lacks {flag}\n{help}"
        );
    }
    let help = harness::runtime_ok(&["restore", "--help"])?;
    for flag in [
        "--bundle",
        "--detach",
        "--pid-file",
        "--console-socket",
        "--no-pivot",
    ] {
        ensure!(
            help.stdout.contains(flag),
            "restore --help lacks {flag}\n{help}"
        );
    }
    for (args, want) in [
        (
            &[
                "checkpoint",
                "--pre-dump",
                "--image-path",
                "/nonexistent",
                "x",
            ][..],
            "--pre-dump is not supported",
        ),
        (
            &[
                "checkpoint",
                "--lazy-pages",
                "--image-path",
                "/nonexistent",
                "x",
            ][..],
            "--lazy-pages is not supported",
        ),
        (
            &[
                "restore",
                "--lazy-pages",
                "--image-path",
                "/nonexistent",
                "x",
            ][..],
            "--lazy-pages is not supported",
        ),
    ] {
        let out = harness::runtime(args)?;
        ensure!(
            !out.success()
                && out.stderr.contains(want)
                && out.stderr.contains("docs/checkpoint.md"),
            "{args:?}: expected {want:?}\n{out}"
        );
    }
    Ok(())
}

#[test]
fn rootless_checkpoint_is_a_clear_error_from_the_runtime_and_from_podman() -> anyhow::Result<()> {
    harness::require_file(harness::runtime_bin())?;
    let xdg = tempfile::tempdir()?;
    nix::unistd::chown(
        xdg.path(),
        Some(nix::unistd::Uid::from_raw(harness::TEST_UID)),
        None,
    )?;
    for action in ["checkpoint", "restore"] {
        let out = harness::run(
            std::process::Command::new("runuser")
                .args(["-u", harness::TEST_USER, "--", "env"])
                .arg(format!("XDG_RUNTIME_DIR={}", xdg.path().display()))
                .arg(harness::runtime_bin())
                .args([action, "--image-path", "/nonexistent", "x"])
                .current_dir("/"),
            harness::DEFAULT_TIMEOUT,
        )?;
        ensure!(
            !out.success()
                && out.stderr.contains(&format!("{action} needs root"))
                && out.stderr.contains("docs/checkpoint.md#rootless"),
            "rootless {action}: unclear error\n{out}"
        );
    }
    // Rootless podman refuses before it reaches the runtime (CRIU needs root).
    let p = Podman::new(User::Rootless, Runtime::AgentSandbox);
    let out = p.run(&["container", "checkpoint", "no-such-container"])?;
    if out.success() || !out.stderr.contains("requires root") {
        bail!("rootless podman checkpoint: unclear error\n{out}");
    }
    Ok(())
}

/// The init's `/proc/PID/status` line `field` under runc after podman restored it.
fn runc_restored_status(edit: fn(Vec<Field>) -> Vec<Field>, field: &str) -> anyhow::Result<String> {
    let p = Podman::new(User::Root, Runtime::Runc);
    // Without --init: runc + CRIU cannot restore podman's init bind here ("Can't remount
    // ... with MS_PRIVATE").
    let (g, id) = p.run_detached(&[], "ckpt-runc", &[TOOLS_IMAGE, "sh", "-c", COUNTER])?;
    count_reaches(p, &g.name, 2)?;
    p.run_ok(&["container", "checkpoint", &g.name])?;
    let image = PathBuf::from(format!(
        "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
    ));
    edit_thread_core(&image.join("core-1.img"), edit)?;
    p.run_ok(&["container", "restore", &g.name])?;
    let pid = p.run_ok(&["inspect", "--format", "{{.State.Pid}}", &g.name])?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.stdout.trim()))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .context("no such status line")
}

#[test]
fn restore_refuses_an_image_edited_to_drop_seccomp_or_add_a_capability_that_runc_runs()
-> anyhow::Result<()> {
    // The same edits, restored by runc: the init runs without its filter, with the cap.
    let seccomp = runc_restored_status(drop_seccomp, "Seccomp")?;
    ensure!(
        seccomp == "0",
        "runc restored the edited init with Seccomp {seccomp}"
    );
    let cap_eff = runc_restored_status(add_sys_admin, "CapEff")?;
    ensure!(
        u64::from_str_radix(&cap_eff, 16)? & (1 << 21) != 0,
        "runc restored the edited init without CAP_SYS_ADMIN ({cap_eff})"
    );
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    let policy = policy(dir.path(), "optional")?;
    for (edit, want) in [
        (
            drop_seccomp as fn(Vec<Field>) -> Vec<Field>,
            "Seccomp is 0, not 2",
        ),
        (add_sys_admin, "CapPrm is 0000000000200000, not 0"),
    ] {
        let (g, id, flag) = counting_sandbox(p, &policy, &ws)?;
        count_reaches(p, &g.name, 2)?;
        p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
        let image = PathBuf::from(format!(
            "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
        ));
        edit_thread_core(&image.join("core-1.img"), edit)?;
        let out = p.run(&["--runtime-flag", &flag, "container", "restore", &g.name])?;
        ensure!(!out.success(), "the edited image was restored\n{out}");
        ensure!(
            out.stderr.contains("does not match the sandbox's plan") && out.stderr.contains(want),
            "unclear refusal (wanted {want:?})\n{out}"
        );
        let state = harness::runtime(&["state", &id])?;
        ensure!(!state.success(), "a refused sandbox is left\n{state}");
        ensure!(
            harness::runtime_ok(&["audit", "verify", &id]).is_ok(),
            "the chain broke"
        );
    }
    Ok(())
}
