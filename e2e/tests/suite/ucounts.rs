//! Per-user kernel counts suite (docs/limits.md, "Per-user kernel counts"): a sandbox that
//! holds as many inotify instances as the kernel lets it, through podman and ctr, leaves host
//! root (containerd, podman, the runtime's own OOM watcher) and every other sandbox their own.
//! Under runc the same holder, in the same image, leaves host root none: runc's user
//! namespace is host root's, so the kernel charges what the sandbox holds to host root.
//!
//! Host root's budget is shared with containerd, podman and the suites that run beside this
//! one, so the runc reference holds its instances only as long as the one check takes: the
//! holder prints its count, the test tries one instance as host root and at once closes the
//! holder's stdin (it exits) and removes the container; a guard does the same on every path.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;

use agent_sandbox_e2e::ctr::{self, Shim, unique_id};
use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net;
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag, unique_name};
use anyhow::{Context, bail, ensure};
use nix::sys::inotify::{InitFlags, Inotify};
use serde_json::Value;

/// Makes inotify instances until the kernel refuses one, prints how many, then holds them
/// until its stdin ends or `argv[1]` seconds pass.
const HOLD: &str = r#"import ctypes, os, select, sys
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0o2000000)
    if fd < 0:
        break
    fds.append(fd)
print("held %d; then %s" % (len(fds), os.strerror(ctypes.get_errno())), flush=True)
select.select([sys.stdin], [], [], float(sys.argv[1]))
"#;

/// One inotify instance: `ok`, or `refused: ERROR`.
const ONE: &str = r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0o2000000)
print("ok" if fd >= 0 else "refused: " + os.strerror(ctypes.get_errno()))
"#;

/// The two tests hold a whole per-user budget each; host id blocks are allocated per state
/// root (podman's and containerd's each start at 1,000,000), so they take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long a holder holds at most, should its stdin never end.
const HOLD_SECS: &str = "60";

/// A container holding inotify instances; released (stdin closed, container removed, the
/// client killed) on drop, whatever the test did.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Removes the container (`podman rm -f`, ctr's kill and delete).
    remove: Option<Box<dyn FnOnce()>>,
    /// How many instances the holder got.
    held: usize,
    line: String,
}

impl Holder {
    /// Runs `cmd` (whose program is [`HOLD`]) and waits for its count.
    fn start(mut cmd: Command, remove: Box<dyn FnOnce()>) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("cannot run {cmd:?}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout")?;
        let mut holder = Holder {
            child,
            stdin,
            remove: Some(remove),
            held: 0,
            line: String::new(),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("held ") => {
                    holder.held = line
                        .trim_start_matches("held ")
                        .split(';')
                        .next()
                        .and_then(|n| n.trim().parse().ok())
                        .with_context(|| format!("bad holder line {line:?}"))?;
                    holder.line = line;
                    return Ok(holder);
                }
                Ok(_) => {}
                Err(_) => {
                    let mut err = String::new();
                    if let Some(mut e) = holder.child.stderr.take() {
                        holder.release();
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    bail!("the holder printed no count: {cmd:?}\n{err}");
                }
            }
        }
    }

    /// Closes the holder's stdin (it exits, releasing every instance), removes the container
    /// and reaps the client.
    fn release(&mut self) {
        self.stdin = None;
        if let Some(remove) = self.remove.take() {
            remove();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.release();
    }
}

/// One inotify instance made by host root, closed again.
fn host_root_inotify() -> nix::Result<()> {
    Inotify::init(InitFlags::IN_CLOEXEC).map(drop)
}

/// The host's per-user limit of inotify instances.
fn host_max_instances() -> anyhow::Result<usize> {
    let text = std::fs::read_to_string("/proc/sys/user/max_inotify_instances")?;
    Ok(text.trim().parse()?)
}

/// `profiles/agent.toml` with `[ucounts] inotify_instances` set to `n`, in `dir`.
fn policy_with_instances(dir: &std::path::Path, n: u32) -> anyhow::Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(net::repo_root().join("profiles/agent.toml"))?;
    ensure!(
        text.contains("inotify_instances = 32"),
        "profiles/agent.toml no longer sets inotify_instances = 32"
    );
    let path = dir.join("ucounts.toml");
    std::fs::write(
        &path,
        text.replace(
            "inotify_instances = 32",
            &format!("inotify_instances = {n}"),
        ),
    )?;
    Ok(path)
}

/// A podman holder (`podman run --rm -i ... tools python3 -c HOLD`).
fn podman_holder(p: Podman, flags: &[&str], stem: &str) -> anyhow::Result<(Holder, String)> {
    harness::require_podman_image(p.user, TOOLS_IMAGE)?;
    let name = unique_name(stem);
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["run", "--rm", "-i", "--network", "none", "--name", &name]);
    args.extend([TOOLS_IMAGE, "python3", "-c", HOLD, HOLD_SECS]);
    let guard = ContainerGuard::new(p, &name);
    let holder = Holder::start(p.command(&args)?, Box::new(move || drop(guard)))?;
    Ok((holder, name))
}

/// A ctr holder (`ctr run --rm --runtime R ARGS... tools ID python3 -c HOLD`).
fn ctr_holder(shim: Shim, args: &[&str], id: &str) -> anyhow::Result<Holder> {
    ctr::require_containerd()?;
    let mut cmd = ctr::ctr();
    cmd.args(["run", "--rm", "--runtime", &shim.runtime_name()])
        .args(args)
        .args([TOOLS_IMAGE, id, "python3", "-c", HOLD, HOLD_SECS]);
    let guard = ctr::Container::guard(id);
    Holder::start(cmd, Box::new(move || drop(guard)))
}

/// `agent-sandbox [--root ROOT] layers ID`'s `ucounts` section.
fn ucounts_layer(root: Option<&str>, id: &str) -> anyhow::Result<Value> {
    let mut args = Vec::new();
    if let Some(root) = root {
        args.extend(["--root", root]);
    }
    args.extend(["layers", id]);
    let out = harness::runtime_ok(&args)?;
    let v: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    Ok(v["ucounts"].clone())
}

/// The layers report names the owner the kernel reports for the running sandbox, a
/// sandbox id of its own (never host root), and the cap it was given.
fn expect_own_owner(layer: &Value, cap: u64) -> anyhow::Result<()> {
    ensure!(layer["active"] == true, "ucounts not active: {layer:#}");
    let owner = layer["charged_to_host_uid"].as_u64().unwrap_or(0);
    ensure!(
        owner >= 1_000_000,
        "the sandbox's user namespace is charged to host uid {owner}: {layer:#}"
    );
    ensure!(
        layer["owner_uid_now"].as_u64() == Some(owner),
        "the kernel reports another owner for the running sandbox: {layer:#}"
    );
    ensure!(
        layer["caps_per_user"]["inotify_instances"].as_u64() == Some(cap),
        "layers does not report the inotify cap {cap}: {layer:#}"
    );
    Ok(())
}

/// The same holder under runc: host root gets EMFILE while it holds (held as short as the
/// one check takes).
fn runc_starves_host_root() -> anyhow::Result<()> {
    let (mut holder, _) = podman_holder(Podman::new(User::Root, Runtime::Runc), &[], "uc-runc")?;
    let root = host_root_inotify();
    holder.release();
    ensure!(
        root == Err(nix::Error::EMFILE),
        "under runc, host root should get EMFILE while the container holds {} instances ({}), got {root:?}",
        holder.held,
        holder.line
    );
    Ok(())
}

#[test]
fn podman_sandbox_holding_every_inotify_instance_leaves_host_root_its_own_while_runc_starves_it()
-> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    // The default policy: capped at 32 per user inside the sandbox.
    let (holder, name) = podman_holder(p, &[], "uc-default")?;
    ensure!(
        holder.held == 32 && holder.line.contains("Too many open files"),
        "the agent profile's cap is 32 inotify instances: {}",
        holder.line
    );
    host_root_inotify().context("host root cannot make an inotify instance")?;
    let id = p.run_ok(&["inspect", "--format", "{{.Id}}", &name])?;
    expect_own_owner(&ucounts_layer(None, id.stdout.trim())?, 32)?;
    drop(holder);

    // Caps raised past the host's budget: what protects host root is the owner alone. The
    // sandbox gets the host's whole per-user budget, charged to its own id.
    let dir = tempfile::tempdir()?;
    let policy = policy_with_instances(dir.path(), 100_000)?;
    let flag = policy_flag(&policy);
    let (holder, name) = podman_holder(p, &["--runtime-flag", &flag], "uc-raised")?;
    ensure!(
        holder.held == host_max_instances()?,
        "the sandbox should hold the host's whole per-user budget, charged to its own id: {}",
        holder.line
    );
    host_root_inotify().context("host root cannot make an inotify instance")?;
    // Another sandbox (another id block of the same state root) still makes its own.
    let other = p.run(&[
        "run",
        "--rm",
        "--network",
        "none",
        TOOLS_IMAGE,
        "python3",
        "-c",
        ONE,
    ])?;
    ensure!(
        other.stdout.trim() == "ok",
        "another sandbox cannot make an inotify instance\n{other}"
    );
    let id = p.run_ok(&["inspect", "--format", "{{.Id}}", &name])?;
    expect_own_owner(&ucounts_layer(None, id.stdout.trim())?, 100_000)?;
    drop(holder);

    runc_starves_host_root()
}

#[test]
fn ctr_sandbox_holding_every_inotify_instance_leaves_host_root_and_other_sandboxes_their_own()
-> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir()?;
    let policy = policy_with_instances(dir.path(), 100_000)?;
    let options = dir.path().join("runtime.toml");
    std::fs::write(
        &options,
        format!("Policy = {:?}\n", policy.display().to_string()),
    )?;
    let options = options.display().to_string();
    let id = unique_id("uc-ctr");
    let holder = ctr_holder(
        Shim::AgentSandbox,
        &["--runtime-config-path", &options],
        &id,
    )?;
    ensure!(
        holder.held == host_max_instances()?,
        "the sandbox should hold the host's whole per-user budget, charged to its own id: {}",
        holder.line
    );
    host_root_inotify().context("host root cannot make an inotify instance")?;
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    expect_own_owner(&ucounts_layer(Some(&root), &id)?, 100_000)?;
    // Another sandbox (another id block of the same state root) still makes its own.
    let other = ctr::run_rm(
        Shim::AgentSandbox,
        &[],
        TOOLS_IMAGE,
        &unique_id("uc-other"),
        &["python3", "-c", ONE],
    )?;
    ensure!(
        other.stdout.trim() == "ok",
        "another sandbox cannot make an inotify instance\n{other}"
    );
    drop(holder);
    Ok(())
}
