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
//!
//! Restores in place pass `--ignore-static-ip`: podman otherwise asks CNI's host-local
//! allocator for the container's old address, which sets the allocator's last reserved
//! address back to it, so the next container made by any test running in parallel can take
//! an address another checkpointed container waits to get back ("requested IP address ...
//! is not available"). That is podman's behaviour under runc too, not the runtime's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox_e2e::criu_image::{
    Field, add_sys_admin, drop_mount, drop_seccomp, edit_thread_core, map_root_to_host_root,
    permit_all_first_filter, reseal_digest,
};
use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag, unique_name};
use anyhow::{Context, bail, ensure};

/// The shell that counts in memory (and shows its count in a file on the sandbox's tmpfs,
/// which CRIU carries with the sandbox's mounts).
pub(super) const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// `container restore NAME` in place under `--runtime-flag FLAG`, whatever podman answers
/// (`--ignore-static-ip`: see the module's text).
fn restore_in_place(p: Podman, flag: &str, name: &str) -> anyhow::Result<harness::Output> {
    p.run(&[
        "--runtime-flag",
        flag,
        "container",
        "restore",
        "--ignore-static-ip",
        name,
    ])
}

/// `out`, if its command succeeded.
fn ok(out: harness::Output) -> anyhow::Result<harness::Output> {
    ensure!(out.success(), "command failed\n{out}");
    Ok(out)
}

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

/// A temporary directory holding an empty workspace `ws` and the agent policy with its
/// Landlock layer `landlock`.
pub(super) fn fixture(landlock: &str) -> anyhow::Result<(tempfile::TempDir, PathBuf, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    let policy = policy(dir.path(), landlock)?;
    Ok((dir, ws, policy))
}

/// A counting sandbox under `policy` with a workspace at `ws`; PID 1 is podman's init (the
/// runtime's own reaping init cannot be checkpointed: docs/checkpoint.md#init).
fn counting_sandbox(
    p: Podman,
    policy: &Path,
    ws: &Path,
) -> anyhow::Result<(ContainerGuard, String, String)> {
    running_sandbox(p, policy, ws, &["sh", "-c", COUNTER])
}

/// A sandbox running `command` under `policy` with a workspace at `ws`, as
/// [`counting_sandbox`].
fn running_sandbox(
    p: Podman,
    policy: &Path,
    ws: &Path,
    command: &[&str],
) -> anyhow::Result<(ContainerGuard, String, String)> {
    let flag = policy_flag(policy);
    let volume = format!("{}:/workspace", ws.display());
    let mut args = vec!["--init", "-v", &volume, TOOLS_IMAGE];
    args.extend_from_slice(command);
    let (guard, id) = p.run_detached(&["--runtime-flag", &flag], "ckpt", &args)?;
    Ok((guard, id, flag))
}

/// A sandbox running `command` under `policy` without a workspace, as [`running_sandbox`]:
/// its image names no change set, so an edit of its CRIU files with the manifest's digest
/// rewritten to match ([`reseal_digest`]) reaches the checks of what the files say (an image
/// with a change set is refused at once: its change set is bound to the unedited digest,
/// docs/checkpoint.md#refused).
fn bare_sandbox(
    p: Podman,
    policy: &Path,
    command: &[&str],
) -> anyhow::Result<(ContainerGuard, String, String)> {
    let flag = policy_flag(policy);
    let mut args = vec!["--init", TOOLS_IMAGE];
    args.extend_from_slice(command);
    let (guard, id) = p.run_detached(&["--runtime-flag", &flag], "ckpt", &args)?;
    Ok((guard, id, flag))
}

/// The count the sandbox shows now.
pub(super) fn count(p: Podman, name: &str) -> anyhow::Result<u64> {
    let out = p.run_ok(&["exec", name, "cat", "/tmp/count"])?;
    out.stdout
        .trim()
        .parse()
        .with_context(|| format!("no count\n{out}"))
}

/// Waits until the count reaches `at_least`.
pub(super) fn count_reaches(p: Podman, name: &str, at_least: u64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(n) = count(p, name)
            && n >= at_least
        {
            return Ok(n);
        }
        if Instant::now() >= deadline {
            let state = p.run(&[
                "inspect",
                "--format",
                "{{.State.Status}} exit {{.State.ExitCode}} {{.State.Error}}",
                name,
            ])?;
            let logs = p.run(&["logs", name])?;
            bail!("the count never reached {at_least}; the container: {state}\nits logs: {logs}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first record of `kind` in the audit log `json` (JSON lines).
pub(super) fn first_record(json: &str, kind: &str) -> Option<serde_json::Value> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["kind"] == kind)
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
    let (_dir, ws, policy) = fixture("optional")?;
    std::fs::write(ws.join("notes.txt"), "host\n")?;
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
    let out = restore_in_place(p, &flag, &name)?;
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
    let (_dir, ws, policy) = fixture("optional")?;
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

/// A podman storage of its own (`--root`/`--runroot` in a temporary directory, overlay as
/// the default storage: CRIU restores the root's mount as it was) holding the tools image;
/// everything in it is removed on drop.
struct OtherStorage {
    dir: tempfile::TempDir,
    podman: Podman,
}

impl OtherStorage {
    fn new(podman: Podman) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let other = Self { dir, podman };
        let archive = other.dir.path().join("tools.tar");
        let archive = archive.display().to_string();
        podman.run_ok(&[
            "save",
            "--format",
            "oci-archive",
            "-o",
            &archive,
            TOOLS_IMAGE,
        ])?;
        other.run_ok(&["load", "-i", &archive])?;
        other.run_ok(&["tag", TOOLS_IMAGE, TOOLS_IMAGE]).ok();
        Ok(other)
    }

    /// Its own root, run root and libpod tmp dir: podman keeps its `alive` marker and events
    /// in the tmp dir, and a podman that finds the marker gone takes the host for rebooted
    /// and resets the state of every container it knows, so sharing `/run/libpod` with the
    /// default storage would disturb every other test's containers.
    fn flags(&self) -> [String; 6] {
        let d = self.dir.path().display();
        [
            "--root".into(),
            format!("{d}/root"),
            "--runroot".into(),
            format!("{d}/runroot"),
            "--tmpdir".into(),
            format!("{d}/tmp"),
        ]
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<harness::Output> {
        let flags = self.flags();
        let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        self.podman.run(&all)
    }

    fn run_ok(&self, args: &[&str]) -> anyhow::Result<harness::Output> {
        let out = self.run(args)?;
        ensure!(out.success(), "podman (other storage) failed\n{out}");
        Ok(out)
    }
}

impl Drop for OtherStorage {
    /// Removes its containers and images, and unmounts what storage left mounted, so the
    /// temporary directory can go. Never `system reset`: podman 4.3's reset removes the
    /// configured tmp dir and all networks, which other tests share.
    fn drop(&mut self) {
        let _ = self.run(&["rm", "-a", "-f", "-t", "0"]);
        let _ = self.run(&["rmi", "-a", "-f"]);
        let root = self.dir.path().join("root");
        let _ = std::process::Command::new("umount")
            .args(["-R", "-l"])
            .arg(root.join("overlay"))
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A shell that starts a child and becomes `sleep` without reaping it: the child stays a
/// zombie for the container's life.
const ZOMBIE: &str = "true & exec sleep 100000";

/// The container's processes that are zombies (`State: Z`), as `podman exec` sees them.
fn zombies(p: Podman, name: &str) -> anyhow::Result<usize> {
    let out = p.run_ok(&[
        "exec",
        name,
        "sh",
        "-c",
        "grep -l '^State:.Z' /proc/[0-9]*/status || true",
    ])?;
    Ok(out.stdout.lines().count())
}

/// Checkpoints and restores `name` in place, and shows it running with its zombie kept.
fn restores_with_its_zombie(p: Podman, flags: &[&str], name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while zombies(p, name)? == 0 {
        ensure!(Instant::now() < deadline, "{name}: no zombie appeared");
        std::thread::sleep(Duration::from_millis(200));
    }
    let run = |args: &[&str]| {
        let mut all = flags.to_vec();
        all.extend_from_slice(args);
        p.run_ok(&all)
    };
    run(&["container", "checkpoint", name])?;
    run(&["container", "restore", "--ignore-static-ip", name])?;
    let state = p.run_ok(&["inspect", "--format", "{{.State.Status}}", name])?;
    ensure!(
        state.stdout.trim() == "running",
        "{name} after restore\n{state}"
    );
    ensure!(
        zombies(p, name)? == 1,
        "{name}: the zombie did not come back"
    );
    Ok(())
}

#[test]
fn a_sandbox_holding_an_unreaped_child_checkpoints_and_restores_as_under_runc() -> anyhow::Result<()>
{
    // CRIU dumps an exited, unreaped child as a core with no thread state; a shell loop
    // leaves one whenever the dump falls between a command's exit and the shell's wait.
    let runc = Podman::new(User::Root, Runtime::Runc);
    let (g, _) = runc.run_detached(&[], "ckpt-zombie-runc", &[TOOLS_IMAGE, "sh", "-c", ZOMBIE])?;
    restores_with_its_zombie(runc, &[], &g.name)?;
    drop(g);
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, ws, policy) = fixture("optional")?;
    let (g, id, flag) = running_sandbox(p, &policy, &ws, &["sh", "-c", ZOMBIE])?;
    restores_with_its_zombie(p, &["--runtime-flag", &flag], &g.name)?;
    harness::runtime_ok(&["audit", "verify", &id])?;
    Ok(())
}

/// `podman container checkpoint --export` of a counting sandbox of `p` (podman's init
/// under agent-sandbox), returning the archive and the sandbox's id.
fn export_counting(
    p: Podman,
    flags: &[&str],
    init: bool,
    ws: &Path,
    archive: &Path,
) -> anyhow::Result<(ContainerGuard, String, u64)> {
    let volume = format!("{}:/workspace", ws.display());
    let mut args = vec!["-v", volume.as_str(), TOOLS_IMAGE, "sh", "-c", COUNTER];
    if init {
        args.insert(0, "--init");
    }
    let (g, id) = p.run_detached(flags, "ckpt-exp", &args)?;
    p.run_ok(&[
        "exec",
        &g.name,
        "sh",
        "-c",
        "echo edited > /workspace/notes.txt",
    ])?;
    let before = count_reaches(p, &g.name, 10)?;
    let archive = archive.display().to_string();
    let mut all = flags.to_vec();
    all.extend(["container", "checkpoint", "--export", &archive, &g.name]);
    p.run_ok(&all)?;
    Ok((g, id, before))
}

/// The imported container `name` counts on from `before`: the memory came with the image.
fn counts_on(p: Podman, name: &str, before: u64) -> anyhow::Result<()> {
    let after = count(p, name)?;
    ensure!(
        after >= before && after < before + 15,
        "count {before} at the export, {after} after the import"
    );
    count_reaches(p, name, after + 2)?;
    Ok(())
}

#[test]
fn runc_export_then_import_under_a_new_name_counts_on() -> anyhow::Result<()> {
    // The reference: what podman and runc + CRIU do with an exported image.
    let p = Podman::new(User::Root, Runtime::Runc);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws)?;
    let archive = dir.path().join("export.tar.gz");
    let (_g, _id, before) = export_counting(p, &[], false, &ws, &archive)?;
    let new = ContainerGuard::new(p, &unique_name("ckpt-imp"));
    super::fork::restore_import(&|a| p.run_ok(a), &[], &archive, &new.name)?;
    counts_on(p, &new.name, before)
}

/// What an imported sandbox must show: a sandbox of its own (its own id, state and audit
/// log), the memory (the count goes on), the unpromoted edit in its `diff`, and an audit log
/// whose first record is `restored`, naming the image's digest and the original sandbox.
fn imported_is_a_sandbox(
    podman: &dyn Fn(&[&str]) -> anyhow::Result<harness::Output>,
    name: &str,
    new_id: &str,
    from: &str,
    before: u64,
    ws: &Path,
) -> anyhow::Result<()> {
    ensure!(new_id != from, "the import kept the original's id");
    let count = || -> anyhow::Result<u64> {
        let out = podman(&["exec", name, "cat", "/tmp/count"])?;
        out.stdout
            .trim()
            .parse()
            .with_context(|| format!("no count\n{out}"))
    };
    // A program started again would count from 1: this one goes on from its memory.
    let after = count()?;
    ensure!(
        after >= before && after < before + 20,
        "count {before} at the export, {after} after the import"
    );
    std::thread::sleep(Duration::from_secs(1));
    ensure!(count()? > after, "the imported sandbox does not count on");
    let edit = podman(&["exec", name, "cat", "/workspace/notes.txt"])?;
    ensure!(edit.stdout == "edited\n", "the edit is gone\n{edit}");
    let diff = harness::runtime_ok(&["diff", new_id])?;
    ensure!(
        diff.stdout.contains("notes.txt"),
        "the new sandbox's diff lacks the edit\n{diff}"
    );
    ensure!(
        std::fs::read_to_string(ws.join("notes.txt"))? == "host\n",
        "the edit reached the host checkout unpromoted"
    );
    harness::runtime_ok(&["state", new_id])?;
    names_its_parent(new_id, from)
}

/// A restored sandbox's first audit record (a fork's, an import's): `restored` from `parent`, naming the digest of the parent's
/// `checkpointed` record and the parent's chain head right after it (the SHA-256 of that
/// line of the parent's log); and the fork's log verifies.
pub(super) fn names_its_parent(fork: &str, parent: &str) -> anyhow::Result<()> {
    harness::runtime_ok(&["audit", "verify", fork])?;
    let parent_log = &harness::runtime_ok(&["audit", "--json", parent])?.stdout;
    let json = harness::runtime_ok(&["audit", "--json", fork])?.stdout;
    let first: serde_json::Value =
        serde_json::from_str(json.lines().next().context("an empty audit log")?)?;
    let checkpointed =
        first_record(parent_log, "checkpointed").context("the parent has no checkpointed")?;
    let data = &first["data"];
    ensure!(
        first["kind"] == "restored"
            && data["from"] == parent
            && data["image_digest"] == checkpointed["data"]["image_digest"],
        "the fork's first record does not name its parent and the image\n{json}"
    );
    let seq = data["from_head"]["seq"].as_u64().context("no from_head")?;
    ensure!(
        seq == checkpointed["seq"],
        "from_head is not the checkpoint's\n{json}"
    );
    let line = parent_log
        .lines()
        .nth(usize::try_from(seq)? - 1)
        .context("the parent's log is shorter than from_head")?;
    let sha = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh", line])
        .output()?;
    let sha = String::from_utf8(sha.stdout)?;
    ensure!(
        data["from_head"]["head"] == sha.split_whitespace().next().unwrap_or_default(),
        "from_head is not the hash of the parent's line {seq}\n{json}"
    );
    Ok(())
}

#[test]
fn podman_export_then_import_into_a_new_container_and_another_storage() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, policy) = fixture("optional")?;
    std::fs::write(ws.join("notes.txt"), "host\n")?;
    let flag = policy_flag(&policy);
    let archive = dir.path().join("export.tar.gz");
    let flags = ["--runtime-flag", flag.as_str()];
    let (_g, from, before) = export_counting(p, &flags, true, &ws, &archive)?;
    // Into the same storage under a new name.
    let new = super::fork::import(p, &flags, &archive)?;
    let new_id = p.run_ok(&["inspect", "--format", "{{.Id}}", &new.name])?;
    let run = |a: &[&str]| p.run_ok(a);
    imported_is_a_sandbox(&run, &new.name, new_id.stdout.trim(), &from, before, &ws)?;
    // Gone again: its id block and its copy of the changes go with it.
    drop(new);
    // Into another podman storage: the same image makes another new sandbox.
    let other = OtherStorage::new(p)?;
    let name = unique_name("ckpt-other");
    super::fork::restore_import(&|a| other.run_ok(a), &flags, &archive, &name)?;
    let id = other.run_ok(&["inspect", "--format", "{{.Id}}", &name])?;
    let run = |a: &[&str]| other.run_ok(a);
    imported_is_a_sandbox(&run, &name, id.stdout.trim(), &from, before, &ws)
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
        first_record(&json, kind)
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
    let (_dir, ws, policy) = fixture("required")?;
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

/// Counts on its terminal (`podman logs` shows each `tick N`), notes whether its standard
/// output is a terminal (`/tmp/tty`), and writes each line typed on the terminal to
/// `/tmp/typed` (a reader on a copy of the terminal's descriptor: a background job's own
/// standard input is `/dev/null`).
const TTY_COUNTER: &str = "exec 3<&0; (while read l <&3; do echo \"$l\" > /tmp/typed; done) & \
     i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; echo tick $i; \
     if [ -t 1 ]; then echo tty > /tmp/tty; else echo none > /tmp/tty; fi; sleep 0.2; done";

/// `line` typed on the terminal of `name` (`podman attach`, its input from a pipe; attach
/// does not end at the pipe's end, so it is stopped).
fn type_line(p: Podman, name: &str, line: &str) -> anyhow::Result<()> {
    let mut attach = p
        .command(&["attach", "--sig-proxy=false", name])?
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("podman attach")?;
    std::thread::sleep(Duration::from_secs(1));
    if let Some(stdin) = attach.stdin.as_mut() {
        std::io::Write::write_all(stdin, format!("{line}\n").as_bytes())?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let _ = attach.kill();
    let _ = attach.wait();
    Ok(())
}

/// Checkpoints and restores in place (`flags` before podman's command) the terminal counter
/// `name`, and shows it goes on on a terminal: the count continues, its output is a
/// terminal still, `podman logs` gets its new ticks, `podman exec` runs, what the sandbox
/// writes to `/dev/console` reaches the log, and a line typed on the terminal reaches it.
/// Returns the restored tasks' `CapEff`, `NoNewPrivs` and `Seccomp` lines (the init and
/// its children), read on the host.
fn terminal_carried(p: Podman, flags: &[&str], name: &str) -> anyhow::Result<Vec<String>> {
    let before = count_reaches(p, name, 5)?;
    let mut checkpoint = flags.to_vec();
    checkpoint.extend(["container", "checkpoint", name]);
    ok(p.run(&checkpoint)?)?;
    let mut restore = flags.to_vec();
    restore.extend(["container", "restore", "--ignore-static-ip", name]);
    ok(p.run(&restore)?)?;
    let after = count(p, name)?;
    ensure!(
        after >= before && after < before + 10,
        "count {before} before the checkpoint, {after} after the restore"
    );
    count_reaches(p, name, after + 3)?;
    let tty = p.run_ok(&["exec", name, "cat", "/tmp/tty"])?;
    ensure!(
        tty.stdout.trim() == "tty",
        "its output is no terminal after the restore\n{tty}"
    );
    let tick = format!("tick {}", after + 2);
    let logs = p.run_ok(&["logs", name])?;
    ensure!(
        logs.stdout.contains(&tick),
        "podman logs lacks {tick:?} after the restore\n{logs}"
    );
    p.run_ok(&["exec", name, "sh", "-c", "echo via-console > /dev/console"])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.run_ok(&["logs", name])?.stdout.contains("via-console") {
        ensure!(
            Instant::now() < deadline,
            "/dev/console did not reach the log"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    type_line(p, name, "typed-after-restore")?;
    let typed = p.run_ok(&["exec", name, "cat", "/tmp/typed"])?;
    ensure!(
        typed.stdout.trim() == "typed-after-restore",
        "a line typed on the terminal did not reach the program\n{typed}"
    );
    restored_credentials(p, name)
}

/// `CapEff NoNewPrivs Seccomp` of the init of `name` and of each of its children.
fn restored_credentials(p: Podman, name: &str) -> anyhow::Result<Vec<String>> {
    let pid = p.run_ok(&["inspect", "--format", "{{.State.Pid}}", name])?;
    let pid = pid.stdout.trim().to_owned();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    let mut out = Vec::new();
    for task in std::iter::once(pid.as_str()).chain(children.split_whitespace()) {
        let status = std::fs::read_to_string(format!("/proc/{task}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        out.push(format!(
            "{} {} {}",
            field("CapEff"),
            field("NoNewPrivs"),
            field("Seccomp")
        ));
    }
    ensure!(out.len() >= 2, "no child of the init: {out:?}");
    Ok(out)
}

#[test]
fn a_sandbox_with_a_terminal_checkpoints_and_restores_on_a_terminal_as_under_runc()
-> anyhow::Result<()> {
    // The reference: runc + CRIU carry a `podman run -t` container (without podman's init:
    // runc cannot restore its bind here, docs/checkpoint.md#cost).
    let runc = Podman::new(User::Root, Runtime::Runc);
    let (g, _) = runc.run_detached(
        &[],
        "ckpt-tty-runc",
        &["-t", TOOLS_IMAGE, "sh", "-c", TTY_COUNTER],
    )?;
    let runc_creds = terminal_carried(runc, &[], &g.name).context("under runc")?;
    // runc's restored program holds podman's default capabilities, without no_new_privs.
    ensure!(
        runc_creds
            .iter()
            .any(|c| !c.starts_with("0000000000000000 ") && c.contains(" 0 ")),
        "runc's restored tasks: {runc_creds:?}"
    );
    drop(g);
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, ws, policy) = fixture("optional")?;
    let flag = policy_flag(&policy);
    let volume = format!("{}:/workspace", ws.display());
    let (g, id) = p.run_detached(
        &["--runtime-flag", &flag],
        "ckpt-tty",
        &[
            "-t",
            "--init",
            "-v",
            &volume,
            TOOLS_IMAGE,
            "sh",
            "-c",
            TTY_COUNTER,
        ],
    )?;
    // The new terminal is the only thing that changed: every restored task has no
    // capability, no_new_privs and the sandbox's seccomp filter (the pre-resume check).
    let creds = terminal_carried(p, &["--runtime-flag", &flag], &g.name)?;
    ensure!(
        creds.iter().all(|c| c == "0000000000000000 1 2"),
        "restored tasks: {creds:?}"
    );
    harness::runtime_ok(&["audit", "verify", &id])?;
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

/// After a refused restore of `id`: no sandbox is left and its audit chain still verifies.
fn refused_cleanly(id: &str) -> anyhow::Result<()> {
    let state = harness::runtime(&["state", id])?;
    ensure!(!state.success(), "a refused sandbox is left\n{state}");
    ensure!(
        harness::runtime_ok(&["audit", "verify", id]).is_ok(),
        "the chain broke"
    );
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
    p.run_ok(&["container", "restore", "--ignore-static-ip", &g.name])?;
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
    let (_dir, _ws, policy) = fixture("optional")?;
    // The dropped filter is refused before CRIU runs (the image's filters are read), the
    // capability by the pre-resume check.
    for (edit, refusal, want) in [
        (
            drop_seccomp as fn(Vec<Field>) -> Vec<Field>,
            "the image's seccomp filters are not the sandbox's",
            "thread 1 of the image: 0 seccomp filters, the sandbox installs",
        ),
        (
            add_sys_admin,
            "does not match the sandbox's plan",
            "CapPrm is 0000000000200000, not 0",
        ),
    ] {
        let (g, id, flag) = bare_sandbox(p, &policy, &["sh", "-c", COUNTER])?;
        count_reaches(p, &g.name, 2)?;
        p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
        let image = PathBuf::from(format!(
            "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
        ));
        edit_thread_core(&image.join("core-1.img"), edit)?;
        reseal_digest(&image)?;
        let out = restore_in_place(p, &flag, &g.name)?;
        ensure!(!out.success(), "the edited image was restored\n{out}");
        ensure!(
            out.stderr.contains(refusal) && out.stderr.contains(want),
            "unclear refusal (wanted {want:?})\n{out}"
        );
        refused_cleanly(&id)?;
    }
    Ok(())
}

/// What `ls /sys/firmware` shows in a runc container whose image lost that mask.
fn runc_restored_unmasked() -> anyhow::Result<String> {
    let p = Podman::new(User::Root, Runtime::Runc);
    let (g, id) = p.run_detached(&[], "ckpt-runc-mask", &[TOOLS_IMAGE, "sh", "-c", COUNTER])?;
    count_reaches(p, &g.name, 2)?;
    let masked = p.run_ok(&["exec", &g.name, "ls", "/sys/firmware"])?;
    ensure!(
        masked.stdout.trim().is_empty(),
        "runc's /sys/firmware is not masked before the edit\n{masked}"
    );
    p.run_ok(&["container", "checkpoint", &g.name])?;
    let image = PathBuf::from(format!(
        "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
    ));
    drop_mount(&image, "/sys/firmware")?;
    p.run_ok(&["container", "restore", "--ignore-static-ip", &g.name])?;
    Ok(p.run_ok(&["exec", &g.name, "ls", "/sys/firmware"])?.stdout)
}

#[test]
fn restore_refuses_an_image_edited_to_drop_a_mask_that_runc_drops() -> anyhow::Result<()> {
    let shown = runc_restored_unmasked()?;
    ensure!(
        !shown.trim().is_empty(),
        "runc kept /sys/firmware masked after the edit"
    );
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, _ws, policy) = fixture("optional")?;
    let (g, id, flag) = bare_sandbox(p, &policy, &["sh", "-c", COUNTER])?;
    count_reaches(p, &g.name, 2)?;
    p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    let image = PathBuf::from(format!(
        "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
    ));
    drop_mount(&image, "/sys/firmware")?;
    reseal_digest(&image)?;
    let out = restore_in_place(p, &flag, &g.name)?;
    ensure!(!out.success(), "the edited image was restored\n{out}");
    ensure!(
        out.stderr.contains("does not match the sandbox's plan")
            && out
                .stderr
                .contains("the masked path \"/sys/firmware\" is not covered"),
        "unclear refusal\n{out}"
    );
    refused_cleanly(&id)
}

/// A loop that runs the probe's `personality` check (ADDR_NO_RANDOMIZE, which podman's
/// default filter and the sandbox's deny) in a child of the restored shell, so the child has
/// the shell's filters, and keeps its last answer in `/tmp/personality`.
const PERSONALITY: &str = "while :; do probe personality > /tmp/p.new; mv /tmp/p.new /tmp/personality; \
                           sleep 0.2; done";

/// Waits until the container's last `personality` answer is `outcome`.
fn personality_becomes(p: Podman, name: &str, outcome: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(out) = p.run(&["exec", name, "cat", "/tmp/personality"]) {
            last = out.stdout;
            if last.contains(&format!("\"outcome\":\"{outcome}\"")) {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    bail!("personality never became {outcome}: {last}")
}

#[test]
fn restore_refuses_an_image_whose_seccomp_filter_allows_everything_that_runc_runs()
-> anyhow::Result<()> {
    // runc: the restored shell's filter (podman's default) replaced by an allow-all
    // program of the same count, and its children run unconfined.
    let runc = Podman::new(User::Root, Runtime::Runc);
    let (g, id) = runc.run_detached(
        &[],
        "ckpt-runc-allow",
        &[TOOLS_IMAGE, "sh", "-c", PERSONALITY],
    )?;
    personality_becomes(runc, &g.name, "blocked")?;
    let filters = || -> anyhow::Result<String> {
        let pid = runc.run_ok(&["inspect", "--format", "{{.State.Pid}}", &g.name])?;
        let status = std::fs::read_to_string(format!("/proc/{}/status", pid.stdout.trim()))?;
        Ok(status
            .lines()
            .filter(|l| l.starts_with("Seccomp"))
            .collect::<Vec<_>>()
            .join(" "))
    };
    let before = filters()?;
    runc.run_ok(&["container", "checkpoint", &g.name])?;
    permit_all_first_filter(&podman_image_dir(&id))?;
    runc.run_ok(&["container", "restore", "--ignore-static-ip", &g.name])?;
    let after = filters()?;
    ensure!(
        after == before && before.contains("Seccomp:\t2"),
        "runc restored other filters: {before} / {after}"
    );
    personality_becomes(runc, &g.name, "allowed")?;
    drop(g);
    // agent-sandbox refuses the same edit before CRIU runs, and leaves nothing behind.
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, _ws, policy) = fixture("optional")?;
    let (g, id, flag) = bare_sandbox(p, &policy, &["sh", "-c", PERSONALITY])?;
    personality_becomes(p, &g.name, "blocked")?;
    p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    permit_all_first_filter(&podman_image_dir(&id))?;
    reseal_digest(&podman_image_dir(&id))?;
    let out = restore_in_place(p, &flag, &g.name)?;
    ensure!(!out.success(), "the edited image was restored\n{out}");
    ensure!(
        out.stderr
            .contains("the image's seccomp filters are not the sandbox's")
            && out.stderr.contains("is not the sandbox's own filter"),
        "unclear refusal\n{out}"
    );
    refused_cleanly(&id)
}

/// The image directory searchable and its `*.img` files readable, all owned by `uid`.
fn open_image_to(image: &Path, uid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(image, Some(uid), Some(uid))?;
    std::fs::set_permissions(image, std::fs::Permissions::from_mode(0o711))?;
    for entry in std::fs::read_dir(image)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "img") {
            std::os::unix::fs::lchown(&path, Some(uid), Some(uid))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// podman's checkpoint directory of container `id` (rootful, default storage).
fn podman_image_dir(id: &str) -> PathBuf {
    PathBuf::from(format!(
        "/var/lib/containers/storage/overlay-containers/{id}/userdata/checkpoint"
    ))
}

#[test]
fn restore_refuses_an_image_edited_to_map_root_to_host_root_that_runc_runs() -> anyhow::Result<()> {
    // runc with a user namespace of its own: the edited image restores with its root as
    // host root.
    let runc = Podman::new(User::Root, Runtime::Runc);
    let (g, id) = runc.run_detached(
        &[],
        "ckpt-runc-userns",
        &[
            "--uidmap",
            "0:300000:65536",
            "--gidmap",
            "0:300000:65536",
            TOOLS_IMAGE,
            "sleep",
            "600",
        ],
    )?;
    runc.run_ok(&["container", "checkpoint", &g.name])?;
    // runc + CRIU cannot restore a user namespace here unless the restored tasks can read
    // the image (`timens-0.img: Permission denied`): the access agent-sandbox gives CRIU
    // (docs/checkpoint.md#image).
    let image = podman_image_dir(&id);
    open_image_to(&image, 300_000)?;
    map_root_to_host_root(&image)?;
    // podman gave the container's files to its root (host 300000), which the edited map
    // no longer maps: back to host root, whom it maps now.
    let userdata = image.parent().context("no userdata")?;
    for d in [userdata.to_owned(), userdata.join("shm")] {
        std::os::unix::fs::chown(&d, Some(0), Some(0))?;
    }
    let out = runc.run(&["container", "restore", "--ignore-static-ip", &g.name])?;
    if !out.success() {
        let log = image.with_file_name("restore.log");
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        bail!("runc did not restore the edited image\n{out}\n{log}");
    }
    let pid = runc.run_ok(&["inspect", "--format", "{{.State.Pid}}", &g.name])?;
    let map = std::fs::read_to_string(format!("/proc/{}/uid_map", pid.stdout.trim()))?;
    ensure!(
        map.split_whitespace().take(2).eq(["0", "0"]),
        "runc did not restore the edited map: {map}"
    );
    drop(g);
    // agent-sandbox refuses the same edit, and leaves no sandbox behind.
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, _ws, policy) = fixture("optional")?;
    // A program holding no file open: the edited map leaves the sandbox's own files
    // unmapped, and CRIU would fail on an open one before the check is reached.
    let (g, id, flag) = bare_sandbox(p, &policy, &["sleep", "600"])?;
    p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    map_root_to_host_root(&podman_image_dir(&id))?;
    reseal_digest(&podman_image_dir(&id))?;
    let out = restore_in_place(p, &flag, &g.name)?;
    ensure!(!out.success(), "the edited image was restored\n{out}");
    ensure!(
        out.stderr.contains("does not match the sandbox's plan") && out.stderr.contains("uid_map"),
        "unclear refusal\n{out}"
    );
    let state = harness::runtime(&["state", &id])?;
    ensure!(!state.success(), "a refused sandbox is left\n{state}");
    let host_root_tasks = std::process::Command::new("pgrep")
        .args(["-x", "sleep"])
        .output()?;
    let left = String::from_utf8_lossy(&host_root_tasks.stdout).into_owned();
    for pid in left.split_whitespace() {
        let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap_or_default();
        let fields: Vec<&str> = map.split_whitespace().collect();
        // The host's own processes map everything; a restored one would map 0 0 65536.
        ensure!(
            fields.get(..2) != Some(&["0", "0"][..]) || fields == ["0", "0", "4294967295"],
            "a restored task with root mapped to host root is left: {pid} {map}"
        );
    }
    harness::runtime_ok(&["audit", "verify", &id])?;
    Ok(())
}

/// The agent policy (Landlock optional, allowing only a port nothing listens on) whose
/// approvals `ceiling` may be opened live, with `decider` asked about its hosts if given.
fn approvals_policy(
    dir: &Path,
    decider: Option<&super::approvals::Decider>,
    ceiling: &[String],
) -> anyhow::Result<PathBuf> {
    use agent_sandbox_e2e::net;
    net::ensure_test_hosts()?;
    let path = net::write_policy(dir, &[format!("{}:1", net::PKG_APEX)], &[])?;
    let text = std::fs::read_to_string(&path)?
        .replace("\nlandlock = \"required\"\n", "\nlandlock = \"optional\"\n");
    let quoted: Vec<String> = ceiling.iter().map(|r| format!("{r:?}")).collect();
    let mut approvals = String::from("\n[network.approvals]\ntimeout = \"10s\"\n");
    if let Some(d) = decider {
        approvals.push_str(&format!("decider = {:?}\n", d.path.display().to_string()));
    }
    approvals.push_str(&format!("ceiling = [{}]\n", quoted.join(", ")));
    std::fs::write(&path, text + &approvals)?;
    std::fs::create_dir_all(dir.join("ws"))?;
    Ok(path)
}

/// A counting sandbox whose proxy asks `decider` about the hosts of `ceiling`.
fn approvals_sandbox(
    p: Podman,
    dir: &Path,
    decider: &super::approvals::Decider,
    ceiling: &[String],
) -> anyhow::Result<(ContainerGuard, String, String)> {
    let policy = approvals_policy(dir, Some(decider), ceiling)?;
    counting_sandbox(p, &policy, &dir.join("ws"))
}

/// Edits the image's `agent-sandbox.json` as a user with the image could: one more live
/// allow rule.
fn add_live_allow(image: &Path, rule: &str) -> anyhow::Result<()> {
    let path = image.join("agent-sandbox.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let rules = manifest["live_rules"]
        .as_array_mut()
        .context("the image has no live_rules")?;
    rules.push(serde_json::json!([true, rule]));
    std::fs::write(&path, serde_json::to_vec(&manifest)?)?;
    Ok(())
}

#[test]
fn live_allow_and_approval_for_life_survive_a_restore_within_the_ceiling() -> anyhow::Result<()> {
    use agent_sandbox_e2e::net::{
        COLLECTOR_HOST, COLLECTOR_IP, HttpServer, REGISTRY_HOST, REGISTRY_IP,
    };
    let by_command = HttpServer::start(REGISTRY_IP, "allowed-by-command")?;
    let for_life = HttpServer::start(REGISTRY_IP, "approved-for-life")?;
    let outside = HttpServer::start(COLLECTOR_IP, "outside-the-ceiling")?;
    // Yes for life to the first question; after the restore every question is refused, so
    // only the carried rule can let the approved host through.
    let decider = super::approvals::Decider::start(|n, _| {
        super::approvals::reply(if n == 0 { "allow-always" } else { "deny" }, None)
    })?;
    let mut ceiling = Vec::new();
    for s in [&by_command, &for_life] {
        ceiling.push(format!("{REGISTRY_HOST}:{}", s.port()));
        ceiling.push(format!("{REGISTRY_IP}:{}", s.port()));
    }
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = harness::temp_dir_for(User::Root)?;
    let (g, id, flag) = approvals_sandbox(p, dir.path(), &decider, &ceiling)?;
    let fetch = |server: &HttpServer, host: &str| -> anyhow::Result<harness::Output> {
        let url = format!("http://{host}:{}/", server.port());
        p.run(&[
            "exec",
            &g.name,
            "sh",
            "-c",
            &format!("curl -sS -i -m 20 {url}"),
        ])
    };
    let command_rule = format!("{REGISTRY_HOST}:{}", by_command.port());
    harness::runtime_ok(&["allow", &id, &command_rule])?;
    let got = fetch(&by_command, REGISTRY_HOST)?;
    ensure!(
        got.stdout.contains("allowed-by-command"),
        "allow did not open it\n{got}"
    );
    let got = fetch(&for_life, REGISTRY_HOST)?;
    ensure!(
        got.stdout.contains("approved-for-life"),
        "not approved\n{got}"
    );
    count_reaches(p, &g.name, 3)?;
    p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    // The image names a rule the ceiling does not cover: it must not come back.
    let outside_rule = format!("{COLLECTOR_HOST}:{}", outside.port());
    add_live_allow(&podman_image_dir(&id), &outside_rule)?;
    ok(restore_in_place(p, &flag, &g.name)?)?;
    let asked = decider.questions().len();
    let got = fetch(&by_command, REGISTRY_HOST)?;
    ensure!(
        got.stdout.contains("allowed-by-command"),
        "the live allow is gone\n{got}"
    );
    let got = fetch(&for_life, REGISTRY_HOST)?;
    ensure!(
        got.stdout.contains("approved-for-life"),
        "the approval for life is gone\n{got}"
    );
    ensure!(
        decider.questions().len() == asked,
        "the decider was asked again about a host approved for life"
    );
    let got = fetch(&outside, COLLECTOR_HOST)?;
    ensure!(
        got.stdout.contains(" 403 ") && !got.stdout.contains("outside-the-ceiling"),
        "a rule outside the ceiling came back from the image\n{got}"
    );
    let json = harness::runtime_ok(&["audit", "--json", &id])?.stdout;
    let restored = first_record(&json, "restored").context("no restored record")?;
    ensure!(
        restored["data"]["rules_dropped"] == serde_json::json!([outside_rule]),
        "the dropped rule is not in the restored record\n{restored}"
    );
    harness::runtime_ok(&["audit", "verify", &id])?;
    Ok(())
}

/// A server on `REGISTRY_IP` that sends a response's head and first bytes, then holds the
/// connection (a download in progress) for two minutes.
fn holding_server() -> anyhow::Result<u16> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind((agent_sandbox_e2e::net::REGISTRY_IP, 0))?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ =
                    c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nfirst-bytes\n");
                std::thread::sleep(Duration::from_secs(120));
            });
        }
    });
    Ok(port)
}

/// The sandbox's `/tmp/out` once it contains `want` (within `secs` seconds).
fn out_with(p: Podman, name: &str, want: &str, secs: u64) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let out = p.run(&["exec", name, "cat", "/tmp/out"])?;
        if out.stdout.contains(want) {
            return Ok(out.stdout);
        }
        ensure!(
            Instant::now() < deadline,
            "/tmp/out never showed {want:?} within {secs} s\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_open_proxy_connection_is_refused_by_criu_or_reset_at_restore_never_left_hanging()
-> anyhow::Result<()> {
    use agent_sandbox_e2e::net::{REGISTRY_HOST, REGISTRY_IP};
    let port = holding_server()?;
    let ceiling = [
        format!("{REGISTRY_HOST}:{port}"),
        format!("{REGISTRY_IP}:{port}"),
    ];
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = harness::temp_dir_for(User::Root)?;
    let policy = approvals_policy(dir.path(), None, &ceiling)?;
    // The download runs in the init's tree (CRIU saves that tree, not `exec`ed processes).
    let script = format!(
        "sleep 2; curl -sS -N -m 100 http://{REGISTRY_HOST}:{port}/ > /tmp/out 2>&1; \
         echo rc=$? >> /tmp/out; sleep 600"
    );
    let (g, id, flag) =
        running_sandbox(p, &policy, &dir.path().join("ws"), &["sh", "-c", &script])?;
    harness::runtime_ok(&["allow", &id, &ceiling[0]])?;
    out_with(p, &g.name, "first-bytes", 30)?;
    // Without --tcp-established CRIU refuses the open connection, and the sandbox goes on.
    let out = p.run(&["--runtime-flag", &flag, "container", "checkpoint", &g.name])?;
    ensure!(
        !out.success() && out.stderr.contains("--tcp-established"),
        "a checkpoint with an open connection passed, or said nothing of it\n{out}"
    );
    let ps = p.run_ok(&["exec", &g.name, "ps", "-o", "comm"])?;
    ensure!(
        ps.stdout.contains("curl"),
        "the download did not go on\n{ps}"
    );
    // With it, the restored client's connection has no proxy end: reset at once.
    for action in ["checkpoint", "restore"] {
        p.run_ok(&[
            "--runtime-flag",
            &flag,
            "container",
            action,
            "--tcp-established",
            &g.name,
        ])?;
    }
    let out = out_with(p, &g.name, "rc=", 10)?;
    ensure!(
        out.contains("rc=56") && out.contains("reset"),
        "the held connection did not end with a reset\n{out}"
    );
    Ok(())
}

/// The runtime's host id allocation under rootful podman (`R/idmap.json`: container id, or
/// `checkpoint:ID` for a block held for a restore in place, to its slot).
fn id_allocation() -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string("/run/agent-sandbox/idmap.json")?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn a_held_id_block_is_released_after_podman_rm_and_kept_for_a_checkpoint_still_there()
-> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, _ws, policy) = fixture("optional")?;
    let (kept, kept_id, flag) = bare_sandbox(p, &policy, &["sh", "-c", COUNTER])?;
    let (removed, removed_id, _) = bare_sandbox(p, &policy, &["sleep", "600"])?;
    let before = count_reaches(p, &kept.name, 3)?;
    for name in [&kept.name, &removed.name] {
        p.run_ok(&["--runtime-flag", &flag, "container", "checkpoint", name])?;
    }
    let held = |id: &str| -> anyhow::Result<Option<u64>> {
        Ok(id_allocation()?
            .get(&format!("checkpoint:{id}"))
            .and_then(serde_json::Value::as_u64))
    };
    let kept_slot = held(&kept_id)?.context("no block held for the kept checkpoint")?;
    ensure!(
        held(&removed_id)?.is_some(),
        "no block held for the checkpoint"
    );
    // podman rm of a checkpointed container calls no runtime: its image directory goes.
    p.run_ok(&["rm", &removed.name])?;
    // The next sandbox's allocation releases the block whose image is gone, and only it.
    p.run_ok(&["--runtime-flag", &flag, "run", "--rm", TOOLS_IMAGE, "true"])?;
    ensure!(
        held(&removed_id)?.is_none(),
        "the block of the removed checkpoint is still held: {:?}",
        id_allocation()?
    );
    ensure!(
        held(&kept_id)? == Some(kept_slot),
        "the block of the checkpoint still there was released"
    );
    // The kept one restores in place under its block, and counts on.
    ok(restore_in_place(p, &flag, &kept.name)?)?;
    let pid = p.run_ok(&["inspect", "--format", "{{.State.Pid}}", &kept.name])?;
    let map = std::fs::read_to_string(format!("/proc/{}/uid_map", pid.stdout.trim()))?;
    let start: u64 = map
        .split_whitespace()
        .nth(1)
        .context("an empty uid_map")?
        .parse()?;
    ensure!(
        start == 1_000_000 + kept_slot * 65_536,
        "restored in host ids from {start}, not its held block (slot {kept_slot})"
    );
    ensure!(held(&kept_id)?.is_none(), "the hold outlived the restore");
    count_reaches(p, &kept.name, before + 2)?;
    Ok(())
}
