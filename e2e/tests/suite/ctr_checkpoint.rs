//! Checkpoint and restore through containerd and our shim's task API (issue 36).
//!
//! containerd 1.6's way, with the real `ctr`: `ctr containers checkpoint --task ID REF` (the
//! shim's Checkpoint, the task left running, the CRIU image stored in containerd's content
//! store), the task and container removed, then `ctr containers restore --live ID REF` (a
//! Create with the checkpoint, whose Start runs the runtime's `restore`). `ctr task checkpoint`
//! of a runtime not named runc reaches the shim without options on 1.6, so the containers
//! command is the one that exercises the options.
//!
//! The task is a busybox shell that draws a random token once, keeps it and a counter in
//! its memory only, and writes both to `/dev/shm/count` 20 times a second. After the
//! restore the file must show the same token counting on: a task started afresh would draw
//! another token, and a file restored without a running task would not count.
//!
//! containerd 2.x sends runc's checkpoint options for every runtime; 1.6's ctr cannot send
//! `exit` to ours, so those tests send the task API's Checkpoint to the task's shim over
//! ttrpc themselves, as containerd would.
//!
//! The same scenario runs under containerd's own runc shim first, so a host where CRIU
//! cannot checkpoint at all fails there and not in our shim's test. Needs CRIU on
//! containerd's PATH (`hack/criu.sh`).

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::ctr::{self, Container, Events, Shim, unique_id};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT};
use anyhow::{Context, bail, ensure};
use containerd_shim_protos::api::CheckpointTaskRequest;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::shim::oci::CheckpointOptions;
use containerd_shim_protos::ttrpc::{self, Code};
use containerd_shim_protos::{Client, TaskClient};

/// Counts in memory; the token and the count reach the host only through the file.
const COUNTER: &str = "read t < /proc/sys/kernel/random/uuid; i=0; \
     while :; do i=$((i+1)); echo \"$t $i\" > /dev/shm/count; sleep 0.05; done";

/// The count the task must reach before the checkpoint: well past what a fresh start
/// reaches while the test reads it.
const COUNT_BEFORE_CHECKPOINT: u64 = 40;

/// Which runtime binary the shim drives.
enum Behind {
    /// runc itself (`BinaryName = "/usr/sbin/runc"` in the runtime config).
    Runc,
    /// The shim's default, agent-sandbox.
    AgentSandbox,
}

/// The token and the count in task `pid`'s `/dev/shm/count`, read from the host through
/// `/proc/PID/root` (no exec: containerd 1.6 can lose a fast exec's output, and runc behind
/// our shim takes no `--exec-id`). The file is the task's: the last component is not
/// followed, at most 256 bytes are read, and a write caught half-way is read again.
fn read_count(pid: u32) -> anyhow::Result<(String, u64)> {
    let path = format!("/proc/{pid}/root/dev/shm/count");
    let mut last = String::new();
    for _ in 0..20 {
        let mut text = String::new();
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&path)
            .with_context(|| format!("cannot open {path}"))?
            .take(256)
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read {path}"))?;
        if let Some((token, count)) = text.trim().split_once(' ')
            && let Ok(count) = count.parse()
        {
            return Ok((token.to_owned(), count));
        }
        last = text;
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("{path} holds no token and count: {last:?}")
}

/// Reads until the count reaches `at_least`.
fn wait_count(pid: u32, at_least: u64) -> anyhow::Result<(String, u64)> {
    let start = Instant::now();
    let file = format!("/proc/{pid}/root/dev/shm/count");
    loop {
        let (token, count) = match read_count(pid) {
            Ok(read) => read,
            // A task just started under load may not have written its first count yet.
            Err(_)
                if std::fs::symlink_metadata(&file).is_err()
                    && start.elapsed() < Duration::from_secs(60) =>
            {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            Err(e) => return Err(e),
        };
        if count >= at_least {
            return Ok((token, count));
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("pid {pid} counted only to {count} in 60 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes the checkpoint image whatever happened.
struct ImageGuard(String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let _ = harness::run(
            ctr::ctr().args(["images", "rm", &self.0]),
            Duration::from_secs(30),
        );
    }
}

/// The whole scenario under `shim` with the extra `ctr run` arguments `run_args`.
fn checkpoint_and_restore(shim: Shim, run_args: &[&str]) -> anyhow::Result<()> {
    let id = unique_id("ckpt");
    let reference = format!("localhost/e2e-checkpoint/{id}:1");
    let _image = ImageGuard(reference.clone());
    let events = Events::start()?;
    let container =
        Container::start_detached(shim, run_args, BUSYBOX_IMAGE, &id, &["sh", "-c", COUNTER])?;
    let pid = container.wait_status("RUNNING", Duration::from_secs(30))?;
    let (token, before) = wait_count(pid, COUNT_BEFORE_CHECKPOINT)?;

    let out = harness::run(
        ctr::ctr().args(["containers", "checkpoint", "--task", &id, &reference]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(out.success(), "{shim:?}: checkpoint failed\n{out}");
    if shim == Shim::AgentSandbox {
        let seen = events.wait_for(&id, "/tasks/checkpointed", Duration::from_secs(10))?;
        let (_, body) = seen
            .iter()
            .find(|(t, _)| t == "/tasks/checkpointed")
            .context("no checkpointed event")?;
        ensure!(
            body.contains("\"checkpoint\":\"/"),
            "the checkpointed event names no image directory: {body}"
        );
    }
    // Left running (runc's default): the same task counts on.
    let (still, after) = read_count(pid)?;
    ensure!(
        still == token && after >= before,
        "{shim:?}: the checkpointed task did not keep running: {token} {before} -> {still} {after}"
    );
    drop(container);

    let restored = Container::guard(&id);
    let out = harness::run(
        ctr::ctr().args(["containers", "restore", "--live", &id, &reference]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(out.success(), "{shim:?}: restore failed\n{out}");
    let pid = restored.wait_status("RUNNING", Duration::from_secs(30))?;
    let (first_token, first) = read_count(pid)?;
    std::thread::sleep(Duration::from_millis(500));
    let (second_token, second) = read_count(pid)?;
    ensure!(
        first_token == token && second_token == token,
        "{shim:?}: the restored task is not the checkpointed one: token {token}, then \
         {first_token} and {second_token}"
    );
    ensure!(
        first >= before && second > first,
        "{shim:?}: the restored task does not count on from {before}: {first}, then {second}"
    );
    // The restored init is the shim's like a started one: its exit is reaped and published.
    let kill = restored.task_cmd(&["kill", "-s", "SIGKILL"], &[])?;
    ensure!(
        kill.success(),
        "{shim:?}: kill of the restored task failed\n{kill}"
    );
    restored.wait_status("STOPPED", Duration::from_secs(30))?;
    let unpacked = restored_from(&events, &id)
        .with_context(|| format!("{shim:?}: the restored task's create event"))?;
    // containerd unpacks the image into a directory of its own and never removes it.
    if Path::new(&unpacked)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("ctrd-checkpoint"))
    {
        let _ = fs::remove_dir_all(&unpacked);
    }
    Ok(())
}

/// The checkpoint directory named by the second TaskCreate of `id` (its restore).
fn restored_from(events: &Events, id: &str) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        let creates: Vec<String> = events
            .task_events(id)
            .into_iter()
            .filter(|(t, _)| t == "/tasks/create")
            .map(|(_, body)| body)
            .collect();
        if let Some(body) = creates.get(1) {
            let event: serde_json::Value =
                serde_json::from_str(body).with_context(|| format!("not JSON: {body:?}"))?;
            let dir = event["checkpoint"].as_str().unwrap_or_default();
            ensure!(dir.starts_with('/'), "names no checkpoint: {body:?}");
            return Ok(dir.to_owned());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("no second create event for {id}: {creates:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Our shim under test with `behind` as its runtime, after containerd's runc shim ran the
/// same scenario as the reference.
fn shim_checkpoints_and_restores(behind: &Behind) -> anyhow::Result<()> {
    ctr::require_containerd()?;
    checkpoint_and_restore(Shim::RuncV2, &[]).context("reference: runc-v2 with runc")?;
    let dir = tempfile::tempdir()?;
    let args = match behind {
        Behind::Runc => runc_behind_our_shim(dir.path())?,
        Behind::AgentSandbox => checkpointable_policy(dir.path())?,
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    checkpoint_and_restore(Shim::AgentSandbox, &args)
}

/// Where containerd 1.6 keeps a task's bundle (with the shim's `address` file).
const TASK_DIR: &str = "/run/containerd/io.containerd.runtime.v2.task";

/// The task API's Checkpoint of task `id`, sent to its shim over ttrpc with runc's options.
fn checkpoint_over_ttrpc(
    id: &str,
    image: &Path,
    opts: &CheckpointOptions,
) -> anyhow::Result<Result<(), ttrpc::Error>> {
    let bundle = Path::new(TASK_DIR).join(ctr::NAMESPACE).join(id);
    let address = fs::read_to_string(bundle.join("address"))
        .with_context(|| format!("no shim address in {}", bundle.display()))?;
    let client = TaskClient::new(Client::connect(address.trim())?);
    let request = CheckpointTaskRequest {
        id: id.to_owned(),
        path: image.to_string_lossy().into_owned(),
        options: Some(Any {
            type_url: "containerd.runc.v1.CheckpointOptions".to_owned(),
            value: opts.write_to_bytes()?,
            ..Default::default()
        })
        .into(),
        ..Default::default()
    };
    let timeout = i64::try_from(DEFAULT_TIMEOUT.as_nanos())?;
    Ok(client
        .checkpoint(ttrpc::context::with_timeout(timeout), &request)
        .map(drop))
}

/// A runtime config whose policy a checkpoint accepts (docs/checkpoint.md): the `agent`
/// profile with Landlock optional (CRIU does not carry a Landlock domain) and the program
/// as PID 1 (the runtime's own init cannot be dumped from inside its user namespace).
fn checkpointable_policy(dir: &Path) -> anyhow::Result<Vec<String>> {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/agent.toml");
    let text = fs::read_to_string(&agent)?;
    ensure!(
        text.contains("\nlandlock = \"required\"\n") && text.contains("\n[resources]\n"),
        "profiles/agent.toml changed shape: no `landlock = \"required\"` or [resources]"
    );
    let text = text
        .replace("\nlandlock = \"required\"\n", "\nlandlock = \"optional\"\n")
        .replace("\n[resources]\n", "\n[resources]\ninit = \"never\"\n");
    let policy = dir.join("checkpointable.toml");
    fs::write(&policy, text)?;
    let file = dir.join("runtime.toml");
    fs::write(
        &file,
        format!("Policy = {:?}\n", policy.display().to_string()),
    )?;
    Ok(vec![
        "--runtime-config-path".to_owned(),
        file.to_string_lossy().into_owned(),
    ])
}

/// A runtime config naming runc, and the `ctr run` arguments that pass it to our shim.
fn runc_behind_our_shim(dir: &Path) -> anyhow::Result<Vec<String>> {
    let file = dir.join("runtime.toml");
    fs::write(&file, "BinaryName = \"/usr/sbin/runc\"\n")?;
    Ok(vec![
        "--runtime-config-path".to_owned(),
        file.to_string_lossy().into_owned(),
    ])
}

/// `exit` set: the task is dumped to the image directory, CRIU's log stays in the client's
/// work directory, and the task ends with a TaskExit, under runc-v2 and under our shim.
#[test]
fn shim_checkpoint_with_exit_ends_the_task_like_runc_v2() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let dir = tempfile::tempdir()?;
    let ours = runc_behind_our_shim(dir.path())?;
    let ours: Vec<&str> = ours.iter().map(String::as_str).collect();
    for (shim, args) in [(Shim::RuncV2, &[][..]), (Shim::AgentSandbox, &ours[..])] {
        let id = unique_id("ckptexit");
        let events = Events::start()?;
        let container =
            Container::start_detached(shim, args, BUSYBOX_IMAGE, &id, &["sh", "-c", COUNTER])?;
        let pid = container.wait_status("RUNNING", Duration::from_secs(30))?;
        wait_count(pid, 5)?;
        let (image, work) = (
            dir.path().join(format!("{id}-img")),
            dir.path().join(format!("{id}-work")),
        );
        let opts = CheckpointOptions {
            exit: true,
            work_path: work.to_string_lossy().into_owned(),
            ..Default::default()
        };
        checkpoint_over_ttrpc(&id, &image, &opts)?
            .map_err(|e| anyhow::anyhow!("{shim:?}: checkpoint failed: {e:?}"))?;
        events.wait_for(&id, "/tasks/exit", Duration::from_secs(30))?;
        container.wait_status("STOPPED", Duration::from_secs(30))?;
        ensure!(
            image.join("inventory.img").is_file(),
            "{shim:?}: no CRIU image in {}",
            image.display()
        );
        ensure!(
            work.join("dump.log").is_file(),
            "{shim:?}: CRIU's log is not in the work path {}",
            work.display()
        );
        if shim == Shim::AgentSandbox {
            events.wait_for(&id, "/tasks/checkpointed", Duration::from_secs(10))?;
        }
    }
    Ok(())
}

/// Options that cannot be passed on are refused by name, before the runtime runs: the task
/// keeps counting and no image is written. (Refused in the shim, so the default runtime.)
#[test]
fn shim_refuses_bad_checkpoint_options_by_name() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let dir = tempfile::tempdir()?;
    let id = unique_id("ckptbad");
    let container = Container::start_detached(
        Shim::AgentSandbox,
        &[],
        BUSYBOX_IMAGE,
        &id,
        &["sh", "-c", COUNTER],
    )?;
    let pid = container.wait_status("RUNNING", Duration::from_secs(30))?;
    let (token, before) = wait_count(pid, 1)?;
    let image = dir.path().join("img");
    let bad = [
        (
            CheckpointOptions {
                cgroups_mode: "loose".into(),
                ..Default::default()
            },
            "cgroups_mode",
        ),
        (
            CheckpointOptions {
                work_path: "relative/work".into(),
                ..Default::default()
            },
            "work_path",
        ),
        (
            CheckpointOptions {
                empty_namespaces: vec!["--leave-running".into()],
                ..Default::default()
            },
            "empty_namespaces",
        ),
    ];
    for (opts, key) in bad {
        match checkpoint_over_ttrpc(&id, &image, &opts)? {
            Err(ttrpc::Error::RpcStatus(status)) => {
                ensure!(
                    status.code() == Code::INVALID_ARGUMENT && status.message().contains(key),
                    "{key}: want InvalidArgument naming it, got {status:?}"
                );
                ensure!(
                    status
                        .message()
                        .contains("docs/contracts.md#checkpoint-and-restore-task-api"),
                    "{key}: the error points at no docs: {}",
                    status.message()
                );
            }
            other => bail!("{key}: want InvalidArgument, got {other:?}"),
        }
    }
    ensure!(
        !image.exists(),
        "a refused checkpoint wrote {}",
        image.display()
    );
    let (still, after) = wait_count(pid, before + 1)?;
    ensure!(
        still == token,
        "the task changed: {token} -> {still} ({after})"
    );
    Ok(())
}

/// Drives runc: the shim's part (options, image, restore at Start, events) on its own.
#[test]
fn ctr_checkpoint_and_restore_continue_a_count_with_runc_behind_our_shim() -> anyhow::Result<()> {
    shim_checkpoints_and_restores(&Behind::Runc)
}

/// Drives agent-sandbox: the whole path through the sandbox runtime.
#[test]
fn ctr_checkpoint_and_restore_continue_a_count_of_an_agent_sandbox() -> anyhow::Result<()> {
    shim_checkpoints_and_restores(&Behind::AgentSandbox)
}
