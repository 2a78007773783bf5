//! Fault suite: the sandbox under things going wrong. Each fault must leave the host clean
//! (no process, mount, cgroup, state directory or id block left once the container is
//! deleted), the sandbox fail-closed (never more access than before), and a clear error or
//! event.
//!
//! Covered elsewhere and not repeated: a SIGKILLed shim cleaned up by `ctr task delete`
//! (`ctr::ctr_sigkilled_shim_is_cleaned_up_without_leftovers`); a killed proxy leaves no
//! network (`egress::killing_the_proxy_leaves_the_sandbox_with_no_network`,
//! `egress::ctr_direct_connect_fails_killed_proxy_*`); a fork bomb held by the pids limit
//! (`hostile::*::fork_bomb_stops_at_the_pids_limit_*`).

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{self, REGISTRY_HOST, REGISTRY_IP};
use agent_sandbox_e2e::podman::{Podman, Runtime, policy_flag};
use anyhow::{Context, bail, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn sandbox() -> Podman {
    Podman::new(User::Root, Runtime::AgentSandbox)
}

fn runc() -> Podman {
    Podman::new(User::Root, Runtime::Runc)
}

fn sigkill(pid: u32) -> anyhow::Result<()> {
    kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGKILL)
        .with_context(|| format!("cannot SIGKILL {pid}"))
}

/// Pids of processes whose command line or cgroup names `needle`.
fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && ctr::alive(*pid))
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            (cmdline.contains(needle) || cgroup.contains(needle))
                .then(|| (pid, cmdline.trim().to_owned()))
        })
        .collect()
}

/// Everything a runtime-level container `id` (state under `root`) could leave behind.
fn runtime_leftovers(root: &Path, id: &str) -> Vec<String> {
    let mut found: Vec<String> = processes_naming(id)
        .into_iter()
        .map(|(pid, cmd)| format!("process {pid}: {cmd}"))
        .collect();
    found.extend(ctr::leftovers(id, &[]));
    if let Ok(entries) = fs::read_dir(root) {
        for e in entries.flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == "audit") {
                continue;
            }
            if p.to_string_lossy().contains(id) {
                found.push(format!("state {}", p.display()));
            }
            if p.is_dir()
                && let Ok(inner) = fs::read_dir(&p)
            {
                for i in inner.flatten() {
                    if i.file_name().to_string_lossy().contains(id) {
                        found.push(format!("state {}", i.path().display()));
                    }
                }
            }
        }
    }
    let idmap = root.join("idmap.json");
    if fs::read_to_string(&idmap).unwrap_or_default().contains(id) {
        found.push(format!(
            "id block of {id} still allocated in {}",
            idmap.display()
        ));
    }
    found.extend(
        net::proxy_pids(id)
            .into_iter()
            .map(|p| format!("proxy {p}")),
    );
    found
}

fn wait_clean(root: &Path, id: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = runtime_leftovers(root, id);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A busybox bundle (the benchmark's shape) running `args`.
fn bundle(dir: &Path, args: &[&str]) -> anyhow::Result<PathBuf> {
    let bundle = dir.join("bundle");
    let rootfs = bundle.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox")).context("busybox-static is needed")?;
    for applet in ["sh", "true", "sleep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    for d in ["proc", "dev", "sys", "tmp", "etc"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    harness::runc_spec(&bundle, args, |_| {})?;
    for p in [
        dir,
        &bundle,
        &rootfs,
        &rootfs.join("bin"),
        &rootfs.join("tmp"),
    ] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    Ok(bundle)
}

fn runtime(root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(harness::runtime_bin());
    cmd.arg("--root").arg(root).args(args);
    cmd
}

/// `agent-sandbox --root ROOT [--log LOG] create --bundle B --pid-file P ID`, stdin and
/// stdout on /dev/null (the init keeps them: no pipe a capture would wait on).
fn create_command(
    root: &Path,
    log: Option<&Path>,
    bundle: &Path,
    pid_file: &Path,
    id: &str,
) -> Command {
    let mut cmd = runtime(root, &[]);
    if let Some(log) = log {
        cmd.arg("--log").arg(log);
    }
    cmd.args(["create", "--bundle"])
        .arg(bundle)
        .arg("--pid-file")
        .arg(pid_file)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// The security state of a running process, read from the host.
fn confinement(pid: u32) -> anyhow::Result<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .map(str::trim)
            .unwrap_or("?")
            .to_owned()
    };
    let uid_map = fs::read_to_string(format!("/proc/{pid}/uid_map"))?;
    Ok(format!(
        "CapEff {} NoNewPrivs {} Seccomp {} uid_map {}",
        field("CapEff"),
        field("NoNewPrivs"),
        field("Seccomp"),
        uid_map.split_whitespace().collect::<Vec<_>>().join(" ")
    ))
}

fn confined(state: &str) -> bool {
    state.contains("CapEff 0000000000000000")
        && state.contains("NoNewPrivs 1")
        && state.contains("Seccomp 2")
        && !state.contains("uid_map 0 0 ")
}

/// SIGKILL the runtime at several points of `create`. Whatever state it left: `start` either
/// fails with an error or starts a confined process (never an unconfined one), `state`
/// answers, and `delete --force` leaves nothing behind.
#[test]
fn runtime_killed_mid_create_never_runs_unconfined_and_delete_force_leaves_nothing()
-> anyhow::Result<()> {
    harness::require_file(harness::runtime_bin())?;
    let dir = tempfile::tempdir()?;
    let bundle = bundle(dir.path(), &["sleep", "300"])?;
    let root = dir.path().join("root");
    let mut seen = Vec::new();
    let mut leaks = Vec::new();
    // Every 8 ms through a create (about 100 ms here), then once after it finished.
    for delay_ms in (0u64..=144).step_by(8).chain([300]) {
        let id = format!("fault-create-{}-{delay_ms}", std::process::id());
        let pid_file = dir.path().join(format!("{id}.pid"));
        let log = dir.path().join(format!("{id}.log"));
        let mut child = create_command(&root, Some(&log), &bundle, &pid_file, &id)
            .stderr(Stdio::piped())
            .spawn()?;
        thread::sleep(Duration::from_millis(delay_ms));
        let finished_first = child.try_wait()?.is_some();
        if !finished_first {
            sigkill(child.id())?;
        }
        let status = child.wait()?;
        let state = harness::run(&mut runtime(&root, &["state", &id]), DEFAULT_TIMEOUT)?;
        let start = harness::run(&mut runtime(&root, &["start", &id]), DEFAULT_TIMEOUT)?;
        let mut verdict = format!(
            "{delay_ms} ms: create {} ({status}), state {}, start {}",
            if finished_first { "finished" } else { "killed" },
            if state.success() { "answers" } else { "fails" },
            if start.success() { "ok" } else { "fails" }
        );
        if start.success() {
            thread::sleep(Duration::from_millis(200));
            let pid: u32 = fs::read_to_string(&pid_file)
                .context("start succeeded without a pid file")?
                .trim()
                .parse()?;
            let c = confinement(pid)?;
            verdict.push_str(&format!(", init {c}"));
            ensure!(
                confined(&c),
                "after a runtime killed at {delay_ms} ms, start ran an unconfined init: {c}"
            );
            // The cgroup limits hold too (the agent profile: 1024 pids, 2 GiB).
            // A cgroup without the files (the host's root cgroup) has no limits: named, not
            // an I/O error.
            let cgroup = harness::pids_cgroup(pid)?;
            let limit = |path: &Path| {
                fs::read_to_string(path).with_context(|| {
                    format!(
                        "after a runtime killed at {delay_ms} ms, start ran an init (pid \
                         {pid}) whose cgroup has no {} (its cgroups: {:?}): {verdict}",
                        path.display(),
                        fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
                    )
                })
            };
            let pids_max = limit(&cgroup.join("pids.max"))?;
            let mem = cgroup.to_string_lossy().replacen("/pids/", "/memory/", 1);
            let mem_max = limit(&Path::new(&mem).join("memory.limit_in_bytes"))?;
            verdict.push_str(&format!(
                ", pids.max {} memory {}",
                pids_max.trim(),
                mem_max.trim()
            ));
            ensure!(
                pids_max.trim().parse::<u64>().is_ok_and(|n| n <= 1024)
                    && mem_max.trim().parse::<u64>().is_ok_and(|n| n <= 2 << 30),
                "after a runtime killed at {delay_ms} ms, start ran an init without the \
                 policy's cgroup limits: {verdict}"
            );
        } else {
            ensure!(
                !start.stderr.trim().is_empty(),
                "start of a half-created container failed without an error\n{start}"
            );
        }
        if !state.success() {
            ensure!(
                state.stderr.contains("does not exist") || !state.stderr.trim().is_empty(),
                "state failed without an error\n{state}"
            );
        }
        let del = harness::run(
            &mut runtime(&root, &["delete", "--force", &id]),
            DEFAULT_TIMEOUT,
        )?;
        ensure!(del.success(), "delete --force after the kill failed\n{del}");
        let left = wait_clean(&root, &id);
        if !left.is_empty() {
            leaks.push(format!("{verdict}; after delete --force: {left:?}"));
            // Leave the next round (and the machine) a clean slate.
            let _ = fs::remove_file(root.join("idmap.json"));
            for (pid, _) in processes_naming(&id) {
                let _ = sigkill(pid);
            }
        }
        seen.push(verdict);
    }
    eprintln!("{}", seen.join("\n"));
    ensure!(
        leaks.is_empty(),
        "a runtime SIGKILLed mid-create left these behind after delete --force:\n{}",
        leaks.join("\n")
    );
    Ok(())
}

/// The runtime's helper processes beside sandbox `id` of state root `root` (the seccomp
/// supervisor, the wall-clock watchdog, the egress proxy): `agent-sandbox --root ROOT ... ID`.
fn helpers_of(root: &Path, id: &str) -> Vec<(u32, String)> {
    let root = format!("--root {} ", root.display());
    processes_naming(id)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&root) && cmd.ends_with(id))
        .collect()
}

/// A caller that removes the runtime's state root without `delete` leaves no helper behind
/// once the sandbox is gone: the sandbox's helper (the seccomp supervisor, holding the wall
/// clock), and where they run the egress proxy and a wall-clock watchdog, end with the init (ARCHITECTURE.md, "Helpers end with their sandbox"). The root is moved away rather than
/// deleted (for the runtime and its helpers, which name it by path, it is gone) so that the
/// test can put it back and `delete --force` what the host still holds. The control is a
/// helper not tied to the init, as the watchdog was (a detached sleep of the limit): it
/// still runs after the same events.
#[test]
fn helpers_end_with_a_sandbox_whose_state_root_was_removed() -> anyhow::Result<()> {
    harness::require_file(harness::runtime_bin())?;
    let dir = tempfile::tempdir()?;
    let sandbox = Started::new(dir.path(), None, "fault-helpers")?;
    let (root, id, init) = (sandbox.root.clone(), sandbox.id.clone(), sandbox.init);
    let gone = root.with_extension("gone");
    let mut naive = Command::new("setsid")
        .args(["sleep", "300"])
        .stdin(Stdio::null())
        .spawn()?;
    let result = (|| -> anyhow::Result<()> {
        let helpers: Vec<(u32, String)> = helpers_of(&root, &id)
            .into_iter()
            .filter(|(pid, _)| *pid != init)
            .collect();
        let names = format!("{helpers:#?}");
        // The supervisor holds the wall clock too: no watchdog process.
        ensure!(
            helpers
                .iter()
                .any(|(_, c)| c.contains(" seccomp-supervise "))
                && !helpers.iter().any(|(_, c)| c.contains(" watchdog ")),
            "expected the supervisor and no watchdog beside the sandbox: {names}"
        );
        fs::rename(&root, &gone)?;
        // Removing the root alone ends nothing: the sandbox still runs, and needs them.
        thread::sleep(Duration::from_millis(500));
        let alive: Vec<u32> = helpers
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| ctr::alive(*p))
            .collect();
        ensure!(
            alive.len() == helpers.len(),
            "helpers ended while the sandbox still ran: {alive:?} of {names}"
        );
        sigkill(init)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = helpers.clone();
        while !left.is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
            left.retain(|(p, _)| ctr::alive(*p));
        }
        ensure!(
            left.is_empty(),
            "helpers outlived their sandbox by 10 s: {left:#?}"
        );
        ensure!(
            naive.try_wait()?.is_none(),
            "the control (a helper not tied to the init) ended too: the test shows nothing"
        );
        Ok(())
    })();
    let _ = naive.kill();
    let _ = naive.wait();
    if gone.exists() {
        fs::rename(&gone, &root)?;
    }
    let del = harness::run(
        &mut runtime(&root, &["delete", "--force", &id]),
        DEFAULT_TIMEOUT,
    )?;
    result?;
    ensure!(del.success(), "{del}");
    let left = wait_clean(&root, &id);
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// A policy file: profiles/agent.toml with a wall clock of `seconds` and `resources.init`
/// set to `init` (`always`: the reaper is PID 1; `never`: the program is).
fn wall_clock_policy(dir: &Path, seconds: u32, init: &str) -> anyhow::Result<PathBuf> {
    let base = net::repo_root().join("profiles/agent.toml");
    let text =
        fs::read_to_string(&base).with_context(|| format!("cannot read {}", base.display()))?;
    let line = "wall_clock = \"2h\"";
    ensure!(text.contains(line), "{} has no `{line}`", base.display());
    let text = text.replace(
        line,
        &format!("wall_clock = \"{seconds}s\"\ninit = \"{init}\""),
    );
    let path = dir.join(format!("policy-{init}.toml"));
    fs::write(&path, text)?;
    Ok(path)
}

/// A started sandbox of the runtime CLI running `sleep 300` under `policy`, its init's
/// stderr in a file.
struct Started {
    root: PathBuf,
    id: String,
    init: u32,
    stderr: PathBuf,
}

impl Started {
    /// `name` under `dir`, with `policy` (else the runtime's default profile).
    fn new(dir: &Path, policy: Option<&Path>, name: &str) -> anyhow::Result<Self> {
        let work = dir.join(name);
        fs::create_dir_all(&work)?;
        let bundle = bundle(&work, &["sleep", "300"])?;
        let root = work.join("root");
        let id = format!("{name}-{}", std::process::id());
        let pid_file = work.join("init.pid");
        // stderr in a file: the init inherits it, and a pipe would stay open while it runs.
        let stderr = work.join("init.err");
        let mut create = create_command(&root, None, &bundle, &pid_file, &id);
        if let Some(policy) = policy {
            create.env("AGENT_SANDBOX_POLICY", policy);
        }
        let create = create.stderr(fs::File::create(&stderr)?).status()?;
        ensure!(
            create.success(),
            "create: {create}: {}",
            fs::read_to_string(&stderr)?
        );
        let started = harness::run(&mut runtime(&root, &["start", &id]), DEFAULT_TIMEOUT)?;
        ensure!(started.success(), "{started}");
        let init = fs::read_to_string(&pid_file)?.trim().parse()?;
        Ok(Self {
            root,
            id,
            init,
            stderr,
        })
    }

    /// [`Started::new`] under a [`wall_clock_policy`] of `seconds` and `init`.
    fn with_wall_clock(dir: &Path, seconds: u32, init: &str, name: &str) -> anyhow::Result<Self> {
        let policy = wall_clock_policy(dir, seconds, init)?;
        Self::new(dir, Some(&policy), name)
    }

    /// The helper processes beside the sandbox (every `agent-sandbox --root ROOT ... ID`
    /// but the init).
    fn helpers(&self) -> Vec<(u32, String)> {
        helpers_of(&self.root, &self.id)
            .into_iter()
            .filter(|(pid, _)| *pid != self.init)
            .collect()
    }

    /// Waits up to `limit` for the init to end; whether it did.
    fn ended_within(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while ctr::alive(self.init) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        !ctr::alive(self.init)
    }

    /// `delete --force`, then the sandbox's audit records.
    fn delete(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let del = harness::run(
            &mut runtime(&self.root, &["delete", "--force", &self.id]),
            DEFAULT_TIMEOUT,
        )?;
        ensure!(del.success(), "{del}");
        net::read_audit(&self.root.join("audit").join(format!("{}.jsonl", self.id)))
    }
}

/// One helper per sandbox, and its death is fail-closed (ARCHITECTURE.md, "One helper per
/// sandbox"): beside a sandbox whose reaper is PID 1 runs one helper process (the seccomp
/// supervisor, holding the wall clock too: no watchdog); SIGKILL it and the sandbox ends at
/// once (its reaper reads end-of-file on a pipe whose only write end the helper held), says
/// so on its stderr, and `delete` records the death. The control is the design of separate
/// processes, which the runtime keeps where no reaper watches (`resources.init = "never"`):
/// the same kill of every helper leaves that sandbox running past its wall clock.
#[test]
fn killing_the_helper_ends_the_sandbox_while_a_killed_watchdog_lets_it_run_on() -> anyhow::Result<()>
{
    harness::require_file(harness::runtime_bin())?;
    let dir = tempfile::tempdir()?;
    let ours = Started::with_wall_clock(dir.path(), 8, "always", "fault-helper")?;
    let result = (|| -> anyhow::Result<()> {
        let helpers = ours.helpers();
        let supervisors: Vec<u32> = helpers
            .iter()
            .filter(|(_, c)| c.contains(" seccomp-supervise "))
            .map(|(p, _)| *p)
            .collect();
        ensure!(
            supervisors.len() == 1 && !helpers.iter().any(|(_, c)| c.contains(" watchdog ")),
            "expected one supervisor and no watchdog: {helpers:#?}"
        );
        sigkill(supervisors[0])?;
        ensure!(
            ours.ended_within(Duration::from_secs(3)),
            "the sandbox ran on 3 s after its helper died (its wall clock is 8 s)"
        );
        let err = fs::read_to_string(&ours.stderr)?;
        ensure!(
            err.contains("the sandbox's helper process died: ending the sandbox"),
            "the init's stderr does not say why it ended: {err:?}"
        );
        Ok(())
    })();
    let records = ours.delete()?;
    result?;
    let died: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["kind"] == "layer_inactive" && r["data"]["layer"] == "helper")
        .collect();
    ensure!(
        died.len() == 1,
        "the audit log does not record the helper's death once: {:?}",
        net::kinds(&records)
    );

    let control = Started::with_wall_clock(dir.path(), 2, "never", "fault-watchdog")?;
    let result = (|| -> anyhow::Result<()> {
        let helpers = control.helpers();
        ensure!(
            helpers.iter().any(|(_, c)| c.contains(" watchdog ")),
            "the control has no watchdog of its own: {helpers:#?}"
        );
        for (pid, _) in &helpers {
            sigkill(*pid)?;
        }
        ensure!(
            !control.ended_within(Duration::from_secs(5)),
            "the control ended although its watchdog was killed: the test shows nothing"
        );
        Ok(())
    })();
    control.delete()?;
    result
}

/// The helper's death through podman: `podman run -d` of a sandbox with an 8 s wall clock,
/// SIGKILL its helper (the seccomp supervisor), and the container exits 137 within 3 s,
/// `podman logs` says why, and after `podman rm` the audit log records the death. The
/// control is the same container under `--init` (catatonit is PID 1, so the wall clock is a
/// watchdog of its own): with every helper killed it still runs past a 2 s wall clock.
#[test]
fn podman_sandbox_ends_with_its_helper_while_one_with_its_own_init_runs_on() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let p = sandbox();
    let state = |name: &str| -> anyhow::Result<String> {
        let out = p.run_ok(&[
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            name,
        ])?;
        Ok(out.stdout.trim().to_owned())
    };
    let helpers = |id: &str| -> Vec<(u32, String)> {
        processes_naming(id)
            .into_iter()
            .filter(|(_, c)| c.contains(" seccomp-supervise ") || c.contains(" watchdog "))
            .collect()
    };
    // `podman run -d [FLAGS] --annotation WALL_CLOCK busybox sleep 300`: its guard, id and
    // helpers.
    let sleeper = |stem: &str, flags: &[&str], wall_clock: &str| {
        let annotation = format!("io.agent.sandbox.wall-clock={wall_clock}");
        let mut args = flags.to_vec();
        args.extend(["--annotation", &annotation, BUSYBOX_IMAGE, "sleep", "300"]);
        let (guard, id) = p.run_detached(&[], stem, &args)?;
        let found = helpers(&id);
        anyhow::Ok((guard, id, found))
    };
    let (guard, id, found) = sleeper("fault-helper", &[], "8s")?;
    ensure!(
        found.len() == 1 && found[0].1.contains(" seccomp-supervise "),
        "expected the supervisor alone, no watchdog: {found:#?}"
    );
    sigkill(found[0].0)?;
    let deadline = Instant::now() + Duration::from_secs(3);
    while state(&guard.name)? != "exited 137" && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        state(&guard.name)? == "exited 137",
        "the sandbox ran on 3 s after its helper died: {}",
        state(&guard.name)?
    );
    let logs = p.run_ok(&["logs", &guard.name])?;
    ensure!(
        format!("{}{}", logs.stdout, logs.stderr).contains("the sandbox's helper process died"),
        "podman logs does not say why the sandbox ended\n{logs}"
    );
    p.run_ok(&["rm", "-f", &guard.name])?;
    drop(guard);
    let records =
        net::read_audit(&Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl")))?;
    ensure!(
        records
            .iter()
            .any(|r| r["kind"] == "layer_inactive" && r["data"]["layer"] == "helper"),
        "the audit log does not record the helper's death: {:?}",
        net::kinds(&records)
    );

    let (control, _, found) = sleeper("fault-own-init", &["--init"], "2s")?;
    ensure!(
        found.iter().any(|(_, c)| c.contains(" watchdog ")),
        "the control has no watchdog of its own: {found:#?}"
    );
    for (pid, _) in &found {
        sigkill(*pid)?;
    }
    thread::sleep(Duration::from_secs(5));
    ensure!(
        state(&control.name)?.starts_with("running"),
        "the control ended although its watchdog was killed: the test shows nothing ({})",
        state(&control.name)?
    );
    p.run_ok(&["rm", "-f", "-t", "0", &control.name])?;
    Ok(())
}

/// An HTTP server that answers every request with a 100 MB body sent slowly (64 KiB every
/// 10 ms) and counts the bytes it got out.
struct SlowServer {
    addr: std::net::SocketAddr,
    sent: Arc<AtomicU64>,
}

impl SlowServer {
    fn start(ip: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((ip, 0))?;
        let addr = listener.local_addr()?;
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counter = Arc::clone(&counter);
                thread::spawn(move || Self::serve(stream, &counter));
            }
        });
        Ok(Self { addr, sent })
    }

    fn serve(mut stream: TcpStream, sent: &AtomicU64) {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let total: u64 = 100 << 20;
        if write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
        )
        .is_err()
        {
            return;
        }
        let chunk = vec![b'x'; 64 << 10];
        let mut left = total;
        while left > 0 {
            if stream.write_all(&chunk).is_err() {
                return;
            }
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            left = left.saturating_sub(chunk.len() as u64);
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// SIGKILL the proxy while a download runs through it: the download fails (it does not
/// hang, nor go on another way), later connections fail, and the audit log records that the
/// sandbox lost its network.
#[test]
fn proxy_killed_mid_transfer_breaks_the_transfer_cuts_the_network_and_is_recorded()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    net::ensure_test_hosts()?;
    let server = SlowServer::start(REGISTRY_IP)?;
    let port = server.addr.port();
    let dir = tempfile::tempdir()?;
    let policy = net::write_policy(
        dir.path(),
        &[
            format!("{REGISTRY_HOST}:{port}"),
            format!("{REGISTRY_IP}:{port}"),
        ],
        &[],
    )?;
    let (guard, id) = sandbox().run_detached(
        &["--runtime-flag", &policy_flag(&policy)],
        "fault-proxy",
        &[TOOLS_IMAGE, "sleep", "600"],
    )?;
    let name = guard.name.clone();
    let proxies = net::proxy_pids(&id);
    ensure!(
        proxies.len() == 1,
        "expected one proxy for {id}: {proxies:?}"
    );
    let url = format!("http://{REGISTRY_HOST}:{port}/big");
    let mut download: Child = sandbox()
        .command(&[
            "exec",
            &name,
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "got %{size_download}\\n",
            &url,
        ])?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.sent.load(Ordering::Relaxed) < (2 << 20) {
        ensure!(
            Instant::now() < deadline,
            "the download never got going ({} bytes sent)",
            server.sent.load(Ordering::Relaxed)
        );
        thread::sleep(Duration::from_millis(50));
    }
    sigkill(proxies[0])?;
    let killed_at = Instant::now();
    let status = loop {
        if let Some(s) = download.try_wait()? {
            break s;
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            let _ = download.kill();
            bail!("the download hung for 30 s after the proxy was killed");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let mut text = String::new();
    if let Some(mut o) = download.stdout.take() {
        o.read_to_string(&mut text)?;
    }
    if let Some(mut e) = download.stderr.take() {
        e.read_to_string(&mut text)?;
    }
    ensure!(
        !status.success(),
        "the download completed although its proxy was killed: {text}"
    );
    let got: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("got "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    ensure!(got < (100 << 20), "the whole body arrived: {text}");
    let after = sandbox().run(&["exec", &name, "curl", "-sS", "-m", "10", &url])?;
    ensure!(
        !after.success(),
        "a new download worked without the proxy\n{after}"
    );
    let direct = sandbox().run(&[
        "exec",
        &name,
        "curl",
        "--noproxy",
        "*",
        "-sS",
        "-m",
        "10",
        &format!("http://{REGISTRY_IP}:{port}/"),
    ])?;
    ensure!(!direct.success(), "a direct download worked\n{direct}");
    sandbox().run_ok(&["rm", "-f", "-t", "0", &name])?;
    drop(guard);
    let log = Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl"));
    let records = net::read_audit(&log)?;
    ensure!(
        records
            .iter()
            .any(|r| r.to_string().contains("proxy had died")),
        "the audit log does not record the proxy's death: {:?}",
        net::kinds(&records)
    );
    Ok(())
}

/// Fills each scratch tmpfs: the write stops at the policy's size with ENOSPC, the sandbox
/// keeps running (and answers exec), the host's filesystems are untouched. runc, without a
/// size, writes the same amount.
#[test]
fn filling_the_scratch_tmpfs_stops_at_its_size_and_the_sandbox_survives() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let (guard, _) = sandbox().run_detached(&[], "fault-fill", &[BUSYBOX_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    // /run is 16M and /home 128M in the agent profile.
    for (path, limit_mib) in [("/run", 16u64), ("/home", 128)] {
        let script = format!(
            "dd if=/dev/zero of={path}/fill bs=1M count={} 2>&1; echo rc=$?; df -m {path} | tail -1",
            limit_mib + 32
        );
        let out = sandbox().run(&["exec", &name, "sh", "-c", &script])?;
        ensure!(
            out.stdout.contains("No space left on device") && !out.stdout.contains("rc=0"),
            "filling {path} did not stop with ENOSPC\n{out}"
        );
        let alive = sandbox().run(&[
            "exec",
            &name,
            "sh",
            "-c",
            &format!("rm {path}/fill; echo ok"),
        ])?;
        ensure!(
            alive.success() && alive.stdout.contains("ok"),
            "the sandbox did not survive a full {path}\n{alive}"
        );
    }
    let base = runc().run(&[
        "run",
        "--rm",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "dd if=/dev/zero of=/run/fill bs=1M count=48 2>&1; echo rc=$?",
    ])?;
    ensure!(
        base.stdout.contains("rc=0"),
        "runc baseline: 48 MiB in /run should fit\n{base}"
    );
    Ok(())
}

/// Exhausts the pids limit from inside: a new exec gets a clear error instead of hanging,
/// and killing and removing the sandbox still works and leaves no process.
#[test]
fn exhausted_pids_give_exec_a_clear_error_and_rm_still_cleans_up() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let (guard, id) = sandbox().run_detached(
        &[],
        "fault-pids",
        &[
            "--annotation",
            "io.agent.sandbox.pids=64",
            BUSYBOX_IMAGE,
            "sleep",
            "600",
        ],
    )?;
    let name = guard.name.clone();
    let init: u32 = sandbox()
        .run_ok(&["inspect", "-f", "{{.State.Pid}}", &name])?
        .stdout
        .trim()
        .parse()?;
    // The shell forks sleeps until fork fails, then dies; the sleeps hold every pid.
    sandbox().run_ok(&[
        "exec",
        "-d",
        &name,
        "sh",
        "-c",
        "while :; do sleep 600 & done",
    ])?;
    let cgroup = harness::pids_cgroup(init)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = fs::read_to_string(cgroup.join("pids.current"))?;
        let max = fs::read_to_string(cgroup.join("pids.max"))?;
        if current.trim().parse::<u64>()? + 1 >= max.trim().parse::<u64>().unwrap_or(u64::MAX) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "pids.current {} never reached pids.max {}",
            current.trim(),
            max.trim()
        );
        thread::sleep(Duration::from_millis(200));
    }
    let start = Instant::now();
    let exec = sandbox().run(&["exec", &name, "true"])?;
    ensure!(
        start.elapsed() < Duration::from_secs(60),
        "exec into a sandbox without free pids took {:?}",
        start.elapsed()
    );
    ensure!(
        !exec.success() && !exec.stderr.trim().is_empty(),
        "exec with the pids limit exhausted should fail with an error\n{exec}"
    );
    let procs = processes_naming(&id);
    ensure!(
        procs.len() >= 32,
        "the loop should hold many processes, found {}",
        procs.len()
    );
    sandbox().run_ok(&["rm", "-f", "-t", "0", &name])?;
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_naming(&id);
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} processes outlived rm: {:?}",
            left.len(),
            &left[..left.len().min(3)]
        );
        thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

// ---- a private containerd, restarted with a sandbox running

/// A containerd of this test's own (socket, root, state, config), never the shared one.
struct PrivateContainerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateContainerd {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("state/containerd.sock")
    }

    fn config(dir: &Path) -> anyhow::Result<PathBuf> {
        let path = dir.join("config.toml");
        // The CRI plugin is disabled: this instance serves ctr only, and must not touch the
        // shared CNI set-up.
        fs::write(
            &path,
            format!(
                "version = 2\nroot = {root:?}\nstate = {state:?}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = {sock:?}\n[ttrpc]\n  address = {ttrpc:?}\n[debug]\n  address = {debug:?}\n",
                root = dir.join("root").display().to_string(),
                state = dir.join("state").display().to_string(),
                sock = dir.join("state/containerd.sock").display().to_string(),
                ttrpc = dir
                    .join("state/containerd.sock.ttrpc")
                    .display()
                    .to_string(),
                debug = dir.join("state/debug.sock").display().to_string(),
            ),
        )?;
        Ok(path)
    }

    fn start() -> anyhow::Result<Self> {
        harness::require_tool("containerd")?;
        let dir = tempfile::Builder::new()
            .prefix("as-faults-ctd-")
            .tempdir_in("/var/tmp")?;
        let mut me = Self { dir, child: None };
        me.spawn()?;
        Ok(me)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let config = Self::config(self.dir.path())?;
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start a private containerd")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ctr(&["version"]).is_ok_and(|o| o.success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the private containerd did not answer within 30 s: {}",
                    fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            sigkill(c.id())?;
            c.wait()?;
        }
        Ok(())
    }

    fn ctr(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.socket())
            .args(["-n", "faults"])
            .args(args);
        harness::run(&mut cmd, DEFAULT_TIMEOUT)
    }

    fn ctr_ok(&self, args: &[&str]) -> anyhow::Result<Output> {
        let out = self.ctr(args)?;
        ensure!(out.success(), "{out}");
        Ok(out)
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.ctr(&["task", "kill", "-a", "-s", "SIGKILL", "fault-restart"]);
            thread::sleep(Duration::from_millis(300));
            let _ = self.ctr(&["task", "delete", "-f", "fault-restart"]);
            let _ = self.ctr(&["containers", "rm", "fault-restart"]);
            let _ = self.kill();
        }
        // The snapshotter's mounts must go before the directory does.
        let root = self.dir.path().display().to_string();
        if let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") {
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(4))
                .filter(|p| p.starts_with(&root))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// containerd is SIGKILLed and restarted while a sandbox runs: the sandbox keeps running,
/// still confined; the restarted containerd reconnects to its shim, execs into it (confined),
/// kills and deletes it, and nothing is left behind.
#[test]
fn private_containerd_restart_keeps_the_sandbox_confined_and_manageable() -> anyhow::Result<()> {
    harness::require_file(harness::shim_bin())?;
    harness::require_file(harness::runtime_bin())?;
    let archive = Path::new(harness::IMAGE_ARCHIVE_DIR).join("busybox.tar");
    harness::require_file(&archive)?;
    let mut ctd = PrivateContainerd::start()?;
    ctd.ctr_ok(&[
        "images",
        "import",
        "--base-name",
        "localhost/agent-sandbox/busybox",
        &archive.display().to_string(),
    ])?;
    let shim = harness::shim_bin().display().to_string();
    let id = "fault-restart";
    ctd.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        &shim,
        BUSYBOX_IMAGE,
        id,
        "sleep",
        "600",
    ])?;
    let task_pid = |ctd: &PrivateContainerd| -> anyhow::Result<u32> {
        let out = ctd.ctr_ok(&["task", "ls"])?;
        out.stdout
            .lines()
            .find(|l| l.starts_with(id) && l.contains("RUNNING"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .with_context(|| format!("task {id} not running\n{out}"))
    };
    let pid = task_pid(&ctd)?;
    let before = confinement(pid)?;
    ensure!(
        confined(&before),
        "not confined before the restart: {before}"
    );
    let shims = ctr::shim_pids(Shim::AgentSandbox, id);
    ensure!(shims.len() == 1, "expected one shim for {id}: {shims:?}");

    ctd.kill()?;
    thread::sleep(Duration::from_millis(500));
    ensure!(ctr::alive(pid), "the sandbox died with containerd");
    ensure!(ctr::alive(shims[0]), "the shim died with containerd");
    let during = confinement(pid)?;
    ensure!(
        during == before,
        "confinement changed: {before} -> {during}"
    );

    ctd.spawn()?;
    ensure!(
        task_pid(&ctd)? == pid,
        "the restarted containerd lost the task"
    );
    let exec = ctd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "after",
        id,
        "sh",
        "-c",
        "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status",
    ])?;
    ensure!(exec.success(), "exec after the restart failed\n{exec}");
    ensure!(
        exec.stdout.contains("CapEff:\t0000000000000000")
            && exec.stdout.contains("NoNewPrivs:\t1")
            && exec.stdout.contains("Seccomp:\t2"),
        "the exec after the restart is not confined\n{exec}"
    );
    ctd.ctr_ok(&["task", "kill", "-s", "SIGKILL", id])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while ctr::alive(pid) {
        ensure!(Instant::now() < deadline, "the task survived SIGKILL");
        thread::sleep(Duration::from_millis(100));
    }
    thread::sleep(Duration::from_millis(300));
    ctd.ctr_ok(&["task", "delete", id])?;
    ctd.ctr_ok(&["containers", "rm", id])?;
    let mut left = ctr::leftovers(id, &[pid, shims[0]]);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
        left = ctr::leftovers(id, &[pid, shims[0]]);
    }
    ensure!(left.is_empty(), "leftovers after the restart: {left:#?}");
    Ok(())
}
