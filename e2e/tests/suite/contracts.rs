//! Runtime CLI contracts (issue 21, items 1-7 and 12-14): what runc promises its callers and
//! the hardening does not forbid must hold under agent-sandbox too. Every test drives both
//! runtimes with the same bundle through their command lines, runc (1.1.5, the reference)
//! first, so a test that expects runc's behaviour fails if runc's behaviour were different
//! from what the test claims. docs/contracts.md lists what the hardening refuses or clamps.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, Output};
use anyhow::{Context, ensure};
use serde_json::{Value, json};

/// The two runtimes under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rt {
    Runc,
    Sandbox,
}

const BOTH: [Rt; 2] = [Rt::Runc, Rt::Sandbox];

impl Rt {
    fn name(self) -> &'static str {
        match self {
            Rt::Runc => "runc",
            Rt::Sandbox => "agent-sandbox",
        }
    }

    /// `RUNTIME --root ROOT ARGS...`, each runtime with its own state root under `dir`.
    fn cmd(self, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = match self {
            Rt::Runc => Command::new("runc"),
            Rt::Sandbox => Command::new(harness::runtime_bin()),
        };
        cmd.arg("--root")
            .arg(dir.join(format!("root-{}", self.name())));
        cmd.args(args);
        cmd
    }

    fn run(self, dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
        harness::run(&mut self.cmd(dir, args), DEFAULT_TIMEOUT)
    }

    fn ok(self, dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
        harness::run_ok(&mut self.cmd(dir, args), DEFAULT_TIMEOUT)
    }

    /// Like [`Rt::ok`] for commands whose container keeps running (create, `run --detach`):
    /// its stdio goes to files, not to pipes the container would hold open.
    fn detached(self, dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tag = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (out_path, err_path) = (
            dir.join(format!("stdout-{tag}")),
            dir.join(format!("stderr-{tag}")),
        );
        let mut cmd = self.cmd(dir, args);
        let command = format!("{cmd:?}");
        let started = Instant::now();
        let status = cmd
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path)?)
            .stderr(fs::File::create(&err_path)?)
            .status()?;
        let output = Output {
            command,
            code: status.code(),
            signal: None,
            stdout: fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: fs::read_to_string(&err_path).unwrap_or_default(),
            elapsed: started.elapsed(),
        };
        ensure!(output.success(), "command failed\n{output}");
        Ok(output)
    }

    /// The status `state` reports, or `None` once the container is gone.
    fn status(self, dir: &Path, id: &str) -> anyhow::Result<Option<String>> {
        let out = self.run(dir, &["state", id])?;
        if !out.success() {
            return Ok(None);
        }
        let v: Value = serde_json::from_str(&out.stdout).with_context(|| out.to_string())?;
        Ok(v["status"].as_str().map(str::to_owned))
    }

    /// Waits (bounded) until `state` says `want`; returns what it said last.
    fn wait_status(self, dir: &Path, id: &str, want: &str) -> anyhow::Result<Option<String>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = self.status(dir, id)?;
            if got.as_deref() == Some(want) || Instant::now() > deadline {
                return Ok(got);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn cleanup(self, dir: &Path, id: &str) {
        let _ = self.run(dir, &["delete", "--force", id]);
    }
}

fn preflight() -> anyhow::Result<()> {
    harness::require_tool("runc")?;
    harness::require_file(harness::runtime_bin())?;
    harness::require_file("/bin/busybox")
}

/// A container id unique to this test run (prefix `oc-`).
fn id(name: &str, rt: Rt) -> String {
    format!("oc-{name}-{}-{}", rt.name(), std::process::id())
}

/// A busybox bundle in `dir/NAME` from `runc spec`, running `args`, with `edit` applied to
/// its config.json.
fn bundle(
    dir: &Path,
    name: &str,
    args: &[&str],
    edit: impl FnOnce(&mut Value),
) -> anyhow::Result<PathBuf> {
    let bundle = dir.join(name);
    let rootfs = bundle.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
    for applet in [
        "sh", "true", "false", "sleep", "cat", "grep", "echo", "id", "kill", "ls", "yes", "head",
        "timeout",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    for d in ["proc", "dev", "sys", "tmp", "etc"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    harness::runc_spec(&bundle, args, edit)?;
    for p in [dir, &bundle, &rootfs, &rootfs.join("bin")] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    Ok(bundle)
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// `run --bundle B ID` in the foreground: the container's output and status.
fn run_fg(rt: Rt, dir: &Path, bundle: &Path, id: &str) -> anyhow::Result<Output> {
    let out = rt.run(dir, &["run", "--bundle", path_str(bundle), id]);
    rt.cleanup(dir, id);
    out
}

/// Item 1: mounts are made in the order config.json lists them (runtime spec, "mounts":
/// "The runtime MUST mount entries in the listed order"). The bundle lists a deeper mount
/// before a shallower one; /proc/self/mountinfo shows the order they were made in.
#[test]
fn mounts_are_made_in_the_order_config_json_lists_them() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("src");
    fs::create_dir_all(&src)?;
    fs::write(src.join("marker"), "x")?;
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755))?;
    let b = bundle(dir.path(), "b", &["cat", "/proc/self/mountinfo"], |c| {
        let mounts = c["mounts"].as_array_mut().expect("runc spec has mounts");
        let bind = |dst: &str| {
            json!({"destination": dst, "type": "bind", "source": path_str(&src),
                   "options": ["rbind", "ro"]})
        };
        // Deepest first: a depth sort would move it behind /opt and /mnt.
        mounts.insert(0, bind("/opt/deep/er"));
        mounts.push(bind("/opt"));
        mounts.push(bind("/mnt"));
    })?;
    let config: Value = serde_json::from_str(&fs::read_to_string(b.join("config.json"))?)?;
    let listed: Vec<String> = config["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["destination"].as_str().map(str::to_owned))
        .collect();
    for rt in BOTH {
        let out = run_fg(rt, dir.path(), &b, &id("mounts", rt))?;
        ensure!(out.success(), "{}: run failed\n{out}", rt.name());
        let points: Vec<&str> = out
            .stdout
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .collect();
        let order: Vec<&String> = listed
            .iter()
            .filter(|d| points.contains(&d.as_str()))
            .collect();
        ensure!(
            order.len() == listed.len(),
            "{}: not every listed mount is in mountinfo: listed {listed:?}\n{out}",
            rt.name()
        );
        let seen: Vec<&str> = {
            let mut v: Vec<&str> = Vec::new();
            for p in &points {
                if listed.iter().any(|d| d == p) && !v.contains(p) {
                    v.push(p);
                }
            }
            v
        };
        ensure!(
            seen == listed.iter().map(String::as_str).collect::<Vec<_>>(),
            "{}: mounts made in the order {seen:?}, config.json lists {listed:?}",
            rt.name()
        );
    }
    Ok(())
}

/// Item 2: every `linux.rootfsPropagation` starts a container wherever runc starts one;
/// `shared` and `rshared` are narrowed (the sandbox's root never joins a shared peer group).
/// runc 1.1.5 itself fails `unbindable` and `runbindable` on this host (EINVAL binding the
/// rootfs onto itself), so for those only agent-sandbox is required to run.
#[test]
fn every_rootfs_propagation_runc_accepts_runs_and_shared_is_narrowed() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let runc_runs = [
        "shared", "rshared", "slave", "rslave", "private", "rprivate",
    ];
    let mut failures = Vec::new();
    for mode in runc_runs.iter().chain(&["unbindable", "runbindable"]) {
        let b = bundle(
            dir.path(),
            &format!("b-{mode}"),
            &["cat", "/proc/self/mountinfo"],
            |c| {
                c["linux"]["rootfsPropagation"] = json!(mode);
            },
        )?;
        for rt in BOTH {
            if rt == Rt::Runc && !runc_runs.contains(mode) {
                continue;
            }
            let out = run_fg(rt, dir.path(), &b, &id(&format!("prop-{mode}"), rt))?;
            let root = out
                .stdout
                .lines()
                .find(|l| l.split(' ').nth(4) == Some("/"))
                .unwrap_or_default()
                .to_owned();
            if !out.success() || root.is_empty() {
                failures.push(format!("{} {mode}: run failed\n{out}", rt.name()));
            } else if rt == Rt::Sandbox && root.contains("shared:") {
                failures.push(format!("{} {mode}: the root is shared: {root}", rt.name()));
            }
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Item 3: every hook reads the caller's bundle and the `ociVersion` that `state` reports.
/// The host-side hooks save their stdin; `startContainer` (inside the container, after the
/// pivot) checks its state itself and fails the start if it is wrong.
#[test]
fn hooks_read_the_callers_bundle_and_the_state_version() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let out_dir = dir.path().join("hooks-out");
    fs::create_dir_all(&out_dir)?;
    // createContainer runs as the sandbox's unprivileged root.
    fs::set_permissions(&out_dir, fs::Permissions::from_mode(0o777))?;
    for rt in BOTH {
        // The version `state` reports, from a plain container.
        let plain = bundle(
            dir.path(),
            &format!("plain-{}", rt.name()),
            &["true"],
            |_| {},
        )?;
        let pid = id("hooks-v", rt);
        rt.detached(dir.path(), &["create", "--bundle", path_str(&plain), &pid])?;
        let state: Value = serde_json::from_str(&rt.ok(dir.path(), &["state", &pid])?.stdout)?;
        rt.cleanup(dir.path(), &pid);
        let version = state["ociVersion"]
            .as_str()
            .context("state has no ociVersion")?
            .to_owned();

        let b = dir.path().join(format!("hooked-{}", rt.name()));
        let save = |kind: &str| {
            let file = out_dir.join(format!("{}-{kind}.json", rt.name()));
            json!({"path": "/bin/sh", "args": ["sh", "-c", format!("cat > {}", file.display())]})
        };
        let check = format!(
            "s=$(cat); echo \"$s\" | grep -q '\"bundle\":\"{}\"' && echo \"$s\" | grep -q '\"ociVersion\":\"{version}\"'",
            b.display()
        );
        let b = bundle(
            dir.path(),
            &format!("hooked-{}", rt.name()),
            &["true"],
            |c| {
                c["hooks"] = json!({
                    "prestart": [save("prestart")],
                    "createRuntime": [save("createRuntime")],
                    "createContainer": [save("createContainer")],
                    "startContainer": [{"path": "/bin/sh", "args": ["sh", "-c", check]}],
                    "poststart": [save("poststart")],
                    "poststop": [save("poststop")],
                });
            },
        )?;
        let cid = id("hooks", rt);
        let out = run_fg(rt, dir.path(), &b, &cid)?;
        ensure!(
            out.success(),
            "{}: run with hooks failed (startContainer's check?)\n{out}",
            rt.name()
        );
        for kind in [
            "prestart",
            "createRuntime",
            "createContainer",
            "poststart",
            "poststop",
        ] {
            let file = out_dir.join(format!("{}-{kind}.json", rt.name()));
            let text = fs::read_to_string(&file)
                .with_context(|| format!("{}: the {kind} hook did not run", rt.name()))?;
            let seen: Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: {kind} state {text:?}", rt.name()))?;
            ensure!(
                seen["bundle"] == json!(path_str(&b)) && seen["ociVersion"] == json!(version),
                "{}: the {kind} hook read bundle {} and ociVersion {} (want {} and {version})",
                rt.name(),
                seen["bundle"],
                seen["ociVersion"],
                b.display()
            );
        }
    }
    Ok(())
}

/// Item 4: a failing poststop hook is a warning: `delete` exits 0 and the container is gone.
#[test]
fn a_failing_poststop_hook_does_not_stop_delete() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let marker = dir.path().join("second-ran");
    let b = bundle(dir.path(), "b", &["true"], |c| {
        c["hooks"] = json!({"poststop": [
            {"path": "/bin/false", "args": ["false"]},
            {"path": "/bin/sh", "args": ["sh", "-c", format!("touch {}", marker.display())]},
        ]});
    })?;
    for rt in BOTH {
        let cid = id("poststop", rt);
        rt.detached(dir.path(), &["create", "--bundle", path_str(&b), &cid])?;
        rt.ok(dir.path(), &["start", &cid])?;
        let status = rt.wait_status(dir.path(), &cid, "stopped")?;
        ensure!(
            status.as_deref() == Some("stopped"),
            "{}: status {status:?}",
            rt.name()
        );
        let _ = fs::remove_file(&marker);
        let del = rt.run(dir.path(), &["delete", &cid])?;
        let after = rt.status(dir.path(), &cid)?;
        rt.cleanup(dir.path(), &cid);
        ensure!(
            del.success(),
            "{}: delete failed on the poststop hook\n{del}",
            rt.name()
        );
        ensure!(
            after.is_none(),
            "{}: the container is still there ({after:?})",
            rt.name()
        );
        // runc 1.1.5 stops at the first failing poststop hook; the runtime spec says the
        // remaining hooks run, and agent-sandbox runs them.
        ensure!(
            rt == Rt::Runc || marker.exists(),
            "{}: the hook after the failing one did not run",
            rt.name()
        );
    }
    Ok(())
}

/// Item 5: `kill` of a created container kills it: its status becomes `stopped` and it can
/// no longer be started.
#[test]
fn kill_of_a_created_container_stops_it() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let b = bundle(dir.path(), "b", &["sleep", "300"], |_| {})?;
    for rt in BOTH {
        let cid = id("kill", rt);
        let pid_file = dir.path().join(format!("{cid}.pid"));
        rt.detached(
            dir.path(),
            &[
                "create",
                "--bundle",
                path_str(&b),
                "--pid-file",
                path_str(&pid_file),
                &cid,
            ],
        )?;
        let pid: i32 = fs::read_to_string(&pid_file)?.trim().parse()?;
        rt.ok(dir.path(), &["kill", &cid, "TERM"])?;
        let status = rt.wait_status(dir.path(), &cid, "stopped")?;
        let gone = !Path::new(&format!("/proc/{pid}")).exists()
            || fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
        let start = rt.run(dir.path(), &["start", &cid])?;
        rt.cleanup(dir.path(), &cid);
        ensure!(
            status.as_deref() == Some("stopped"),
            "{}: after kill TERM the status is {status:?}",
            rt.name()
        );
        ensure!(
            gone,
            "{}: the init {pid} still lives after kill TERM",
            rt.name()
        );
        ensure!(
            !start.success(),
            "{}: a killed container started\n{start}",
            rt.name()
        );
    }
    Ok(())
}

/// Item 6: a caller that reads create's stdout and stderr to the end gets EOF when the
/// container exits; no helper the runtime leaves behind holds them.
#[test]
fn creates_stdio_reaches_eof_when_the_container_exits() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let b = bundle(
        dir.path(),
        "b",
        &["sh", "-c", "echo out; echo err >&2; sleep 1"],
        |_| {},
    )?;
    for rt in BOTH {
        let cid = id("stdio", rt);
        let mut child = rt
            .cmd(dir.path(), &["create", "--bundle", path_str(&b), &cid])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut out = child.stdout.take().context("stdout")?;
        let mut err = child.stderr.take().context("stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            let _ = tx.send(("stdout", s));
        });
        thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            let _ = tx2.send(("stderr", s));
        });
        let created = child.wait()?;
        ensure!(
            created.success(),
            "{}: create failed ({created})",
            rt.name()
        );
        rt.ok(dir.path(), &["start", &cid])?;
        let status = rt.wait_status(dir.path(), &cid, "stopped")?;
        let mut got = Vec::new();
        for _ in 0..2 {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(pair) => got.push(pair),
                Err(_) => break,
            }
        }
        rt.cleanup(dir.path(), &cid);
        ensure!(
            status.as_deref() == Some("stopped"),
            "{}: status {status:?}",
            rt.name()
        );
        ensure!(
            got.len() == 2,
            "{}: only {got:?} reached EOF within 5 s of the container's exit",
            rt.name()
        );
        ensure!(
            got.iter().any(|(n, s)| *n == "stdout" && s.trim() == "out")
                && got.iter().any(|(n, s)| *n == "stderr" && s.trim() == "err"),
            "{}: the container's output is not exactly its own: {got:?}",
            rt.name()
        );
    }
    Ok(())
}

/// Item 12: without `--log`, create's stderr (the container's own when the caller passes
/// none) carries nothing of the runtime's; with `--log` its warnings are in the log.
#[test]
fn runtime_warnings_never_reach_the_containers_stderr() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let b = bundle(dir.path(), "b", &["true"], |_| {})?;
    for rt in BOTH {
        let out = run_fg(rt, dir.path(), &b, &id("warn", rt))?;
        ensure!(out.success(), "{}: run failed\n{out}", rt.name());
        ensure!(
            out.stderr.trim().is_empty() && out.stdout.trim().is_empty(),
            "{}: the container printed nothing, yet its streams carry\n{out}",
            rt.name()
        );
    }
    // The warnings still exist: they go to the log file when there is one.
    let log = dir.path().join("sandbox.log");
    let cid = id("warn-log", Rt::Sandbox);
    let out = Rt::Sandbox.run(
        dir.path(),
        &[
            "--log",
            path_str(&log),
            "run",
            "--bundle",
            path_str(&b),
            &cid,
        ],
    )?;
    Rt::Sandbox.cleanup(dir.path(), &cid);
    ensure!(out.success() && out.stderr.trim().is_empty(), "{out}");
    let text = fs::read_to_string(&log).unwrap_or_default();
    ensure!(
        text.contains("level=warning"),
        "no warning in the log (this host has no AppArmor, which create reports):\n{text}"
    );
    Ok(())
}

/// Item 13: repeated `additionalGids` are folded into one group each, as runc 1.1.5 does.
#[test]
fn repeated_additional_gids_give_each_group_once() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let b = bundle(
        dir.path(),
        "b",
        &["grep", "^Groups:", "/proc/self/status"],
        |c| {
            c["process"]["user"]["additionalGids"] = json!([5, 7, 5, 7]);
        },
    )?;
    let mut seen = Vec::new();
    for rt in BOTH {
        let out = run_fg(rt, dir.path(), &b, &id("gids", rt))?;
        ensure!(out.success(), "{}: run failed\n{out}", rt.name());
        let groups: Vec<String> = out
            .stdout
            .trim()
            .trim_start_matches("Groups:")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        seen.push((rt.name(), groups));
    }
    ensure!(
        seen.iter().all(|(_, g)| g == &["5", "7"]),
        "supplementary groups differ from runc's folding: {seen:?}"
    );
    Ok(())
}

/// The program starts with runc's signal state: no standard signal ignored, nothing
/// blocked. The runtime is a Rust program, which ignores SIGPIPE from its start, and an
/// ignored signal stays ignored across execve; so in `yes | head` busybox's `yes` got EPIPE
/// instead of dying of SIGPIPE as under runc (a writer that ignores write errors then spins
/// at full CPU). The pipeline's first member is bounded by `timeout`, so a broken state
/// shows as a status other than 141, never as a hang. Real-time signals are left out of the
/// comparison: runc's Go runtime leaves signal 32 ignored, which glibc programs reset.
#[test]
fn the_program_starts_with_runcs_signal_state_and_dies_of_sigpipe() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let script = "grep -E '^Sig(Ign|Blk):' /proc/self/status; set -o pipefail; \
                  timeout -s KILL 5 yes X | head -c 1000 >/dev/null; echo \"pipe=$?\"";
    let b = bundle(dir.path(), "sigs", &["sh", "-c", script], |_| {})?;
    let mut seen = Vec::new();
    for rt in BOTH {
        let out = run_fg(rt, dir.path(), &b, &id("sigs", rt))?;
        ensure!(out.success(), "{}: run failed\n{out}", rt.name());
        let mask = |field: &str| {
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        };
        let standard = mask("SigIgn").map(|m| m & 0x7fff_ffff);
        let pipe = out.stdout.lines().find_map(|l| l.strip_prefix("pipe="));
        seen.push((rt.name(), standard, mask("SigBlk"), pipe.map(str::to_owned)));
    }
    let runc = &seen[0];
    ensure!(
        runc.1 == Some(0) && runc.2 == Some(0) && runc.3.as_deref() == Some("141"),
        "runc no longer starts the program with no standard signal ignored or blocked and \
         a SIGPIPE death, so this test cannot tell: {seen:?}"
    );
    ensure!(
        seen[1].1 == runc.1 && seen[1].2 == runc.2 && seen[1].3 == runc.3,
        "ignored (SigIgn of signals 1-31) or blocked signals, or the SIGPIPE death, differ \
         from runc's: {seen:?}"
    );
    Ok(())
}

/// Item 14: `run` creates, starts and waits, and exits with the container's status;
/// `--detach` returns once it runs and writes `--pid-file`.
#[test]
fn run_exits_with_the_containers_status_and_detaches_like_runc() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let exits = bundle(
        dir.path(),
        "exits",
        &["sh", "-c", "echo hello; exit 7"],
        |_| {},
    )?;
    let sleeps = bundle(dir.path(), "sleeps", &["sleep", "300"], |_| {})?;
    for rt in BOTH {
        let cid = id("run", rt);
        let out = run_fg(rt, dir.path(), &exits, &cid)?;
        ensure!(
            out.code == Some(7) && out.stdout.trim() == "hello",
            "{}: run should print hello and exit 7\n{out}",
            rt.name()
        );
        ensure!(
            rt.status(dir.path(), &cid)?.is_none(),
            "{}: run left the container behind",
            rt.name()
        );

        let cid = id("run-d", rt);
        let pid_file = dir.path().join(format!("{cid}.pid"));
        let out = rt.detached(
            dir.path(),
            &[
                "run",
                "--detach",
                "--bundle",
                path_str(&sleeps),
                "--pid-file",
                path_str(&pid_file),
                &cid,
            ],
        );
        let status = rt.status(dir.path(), &cid)?;
        let pid = fs::read_to_string(&pid_file).unwrap_or_default();
        rt.cleanup(dir.path(), &cid);
        let out = out?;
        ensure!(out.success(), "{}: run --detach failed\n{out}", rt.name());
        ensure!(
            status.as_deref() == Some("running"),
            "{}: after run --detach: {status:?}",
            rt.name()
        );
        ensure!(
            pid.trim().parse::<u32>().is_ok(),
            "{}: pid file holds {pid:?}",
            rt.name()
        );
    }
    Ok(())
}

/// Item 7: a stricter `linux.seccomp` (here: chmod denied with EPERM, which the policy
/// allows) is enforced in the init and in every exec, as runc enforces it; without the
/// profile the same chmod succeeds under both. A profile that cannot be honoured is refused
/// with the key named.
#[test]
fn a_stricter_config_seccomp_profile_is_enforced() -> anyhow::Result<()> {
    preflight()?;
    let dir = tempfile::tempdir()?;
    let script = "chmod 1777 /dev/shm && echo changed";
    let profile = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [{"names": ["chmod", "fchmod", "fchmodat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    });
    let open = bundle(dir.path(), "open", &["sh", "-c", script], |_| {})?;
    let strict = bundle(dir.path(), "strict", &["sh", "-c", script], |c| {
        c["linux"]["seccomp"] = profile.clone();
    })?;
    let idle = bundle(dir.path(), "idle", &["sleep", "300"], |c| {
        c["linux"]["seccomp"] = profile.clone();
    })?;
    for rt in BOTH {
        let out = run_fg(rt, dir.path(), &open, &id("sc-open", rt))?;
        ensure!(
            out.success() && out.stdout.contains("changed"),
            "{}: chmod without a profile should work\n{out}",
            rt.name()
        );
        let out = run_fg(rt, dir.path(), &strict, &id("sc-strict", rt))?;
        ensure!(
            !out.success() && out.stderr.contains("Operation not permitted"),
            "{}: chmod under a profile that denies it with EPERM\n{out}",
            rt.name()
        );
        let cid = id("sc-exec", rt);
        rt.detached(
            dir.path(),
            &["run", "--detach", "--bundle", path_str(&idle), &cid],
        )?;
        let exec = rt.run(dir.path(), &["exec", &cid, "sh", "-c", script]);
        rt.cleanup(dir.path(), &cid);
        let exec = exec?;
        ensure!(
            !exec.success() && exec.stderr.contains("Operation not permitted"),
            "{}: an exec'd chmod under the same profile\n{exec}",
            rt.name()
        );
    }
    let agent = bundle(dir.path(), "agent", &["true"], |c| {
        c["linux"]["seccomp"] =
            json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"});
    })?;
    let cid = id("sc-listener", Rt::Sandbox);
    let out = Rt::Sandbox.run(dir.path(), &["create", "--bundle", path_str(&agent), &cid])?;
    Rt::Sandbox.cleanup(dir.path(), &cid);
    ensure!(
        !out.success() && out.stderr.contains("linux.seccomp.listenerPath"),
        "a listener the sandbox cannot honour must be refused by name\n{out}"
    );
    Ok(())
}

/// Item 7 through podman: `--security-opt seccomp=FILE` (podman's way to a config
/// `linux.seccomp`) that denies chmod is enforced under agent-sandbox as under runc, and the
/// same chmod works with podman's default profile.
#[test]
fn podman_seccomp_profile_option_is_enforced_like_runc() -> anyhow::Result<()> {
    use agent_sandbox_e2e::harness::{BUSYBOX_IMAGE, User};
    use agent_sandbox_e2e::podman::{Podman, Runtime};
    preflight()?;
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let dir = tempfile::tempdir()?;
    let profile = dir.path().join("deny-chmod.json");
    fs::write(
        &profile,
        serde_json::to_vec(&json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["chmod", "fchmod", "fchmodat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
        }))?,
    )?;
    let opt = format!("seccomp={}", profile.display());
    let script = "chmod 1777 /tmp && echo changed";
    for runtime in [Runtime::Runc, Runtime::AgentSandbox] {
        let podman = Podman::new(User::Root, runtime);
        let open = podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            BUSYBOX_IMAGE,
            "sh",
            "-c",
            script,
        ])?;
        ensure!(
            open.success() && open.stdout.contains("changed"),
            "{runtime:?}: chmod with podman's default profile\n{open}"
        );
        let strict = podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--security-opt",
            &opt,
            BUSYBOX_IMAGE,
            "sh",
            "-c",
            script,
        ])?;
        ensure!(
            !strict.success() && strict.stderr.contains("Operation not permitted"),
            "{runtime:?}: chmod under a profile that denies it\n{strict}"
        );
    }
    Ok(())
}

/// This host's facts for the rlimit test: the hard `RLIMIT_NOFILE` the runtimes start with
/// (this test's own), `fs.nr_open` (the most any process may get), and whether root here
/// may raise a hard limit (CAP_SYS_RESOURCE in the initial user namespace).
fn nofile_facts() -> anyhow::Result<(u64, u64, bool)> {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    let nr_open: u64 = fs::read_to_string("/proc/sys/fs/nr_open")?.trim().parse()?;
    let status = fs::read_to_string("/proc/self/status")?;
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .context("no CapEff in /proc/self/status")?;
    const CAP_SYS_RESOURCE: u64 = 1 << 24;
    Ok((hard, nr_open, cap_eff & CAP_SYS_RESOURCE != 0))
}

/// `Max open files` (soft, hard) of a `/proc/self/limits` dump.
fn open_files(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut words = line["Max open files".len()..].split_whitespace();
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// The `clamped` records of a sandbox's audit log (its state root under `dir`): (key,
/// requested, granted).
fn clamped_records(dir: &Path, cid: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let out = Rt::Sandbox.ok(dir, &["audit", "--json", cid])?;
    let mut clamps = Vec::new();
    for line in out.stdout.lines().filter(|l| !l.trim().is_empty()) {
        let r: Value = serde_json::from_str(line).with_context(|| format!("audit line {line}"))?;
        if r["kind"] == "clamped" {
            let s = |k: &str| r["data"][k].as_str().unwrap_or_default().to_owned();
            clamps.push((s("key"), s("requested"), s("granted")));
        }
    }
    Ok(clamps)
}

/// docs/contracts.md#resource-limits-processrlimits: `process.rlimits` above the hard limit
/// the runtime starts with (podman 5 asks nofile and nproc 1048576 on every run). runc raises
/// it as real root, and fails where even root may not (no CAP_SYS_RESOURCE, as on this
/// project's machines: "error setting rlimit type 7"); agent-sandbox gives the init and an
/// exec what root could raise, and records each narrowed limit as `clamped`.
#[test]
fn rlimits_above_the_hard_limit_get_what_root_can_raise_with_a_clamped_record() -> anyhow::Result<()>
{
    preflight()?;
    let (hard, nr_open, can_raise) = nofile_facts()?;
    ensure!(
        hard < nr_open,
        "this test needs a hard RLIMIT_NOFILE ({hard}) below fs.nr_open ({nr_open}) to ask for more"
    );
    let asked = nr_open;
    let want = if can_raise { asked } else { hard };
    let rlimits = json!([{"type": "RLIMIT_NOFILE", "soft": asked, "hard": asked}]);
    let key = "process.rlimits.RLIMIT_NOFILE";
    let want_clamp = (!can_raise).then(|| {
        (
            key.to_owned(),
            format!("{asked}:{asked}"),
            format!("{hard}:{hard}"),
        )
    });
    let dir = tempfile::tempdir()?;
    let d = dir.path();

    // The init.
    let b = bundle(d, "init", &["cat", "/proc/self/limits"], |c| {
        c["process"]["rlimits"] = rlimits.clone();
    })?;
    for rt in BOTH {
        let cid = id("rlimit", rt);
        let out = run_fg(rt, d, &b, &cid)?;
        if rt == Rt::Runc && !can_raise {
            ensure!(
                !out.success() && out.stderr.contains("rlimit"),
                "runc: expected a failed create (root may not raise the hard limit here)\n{out}"
            );
            continue;
        }
        ensure!(out.success(), "{}: run failed\n{out}", rt.name());
        ensure!(
            open_files(&out.stdout) == Some((want, want)),
            "{}: nofile inside is {:?}, want {want}:{want}\n{out}",
            rt.name(),
            open_files(&out.stdout)
        );
        if rt == Rt::Sandbox {
            let clamps = clamped_records(d, &cid)?;
            let got = clamps.iter().find(|c| c.0 == key).cloned();
            ensure!(
                got == want_clamp,
                "the init's clamped record for {key}: got {got:?}, want {want_clamp:?}"
            );
        }
    }

    // An exec asking the same of a running container whose init asked nothing above it.
    let b = bundle(d, "exec", &["sleep", "300"], |_| {})?;
    let config: Value = serde_json::from_str(&fs::read_to_string(b.join("config.json"))?)?;
    let mut process = config["process"].clone();
    process["args"] = json!(["cat", "/proc/self/limits"]);
    process["rlimits"] = rlimits.clone();
    let process_file = d.join("exec-process.json");
    fs::write(&process_file, serde_json::to_vec(&process)?)?;
    for rt in BOTH {
        let cid = id("rlimit-exec", rt);
        rt.detached(d, &["create", "--bundle", path_str(&b), &cid])?;
        rt.ok(d, &["start", &cid])?;
        let out = rt.run(d, &["exec", "--process", path_str(&process_file), &cid]);
        let clamps = if rt == Rt::Sandbox {
            clamped_records(d, &cid)
        } else {
            Ok(Vec::new())
        };
        rt.cleanup(d, &cid);
        let out = out?;
        if rt == Rt::Runc && !can_raise {
            ensure!(
                !out.success() && out.stderr.contains("rlimit"),
                "runc exec: expected a failure (root may not raise the hard limit here)\n{out}"
            );
            continue;
        }
        ensure!(out.success(), "{}: exec failed\n{out}", rt.name());
        ensure!(
            open_files(&out.stdout) == Some((want, want)),
            "{}: nofile in the exec is {:?}, want {want}:{want}\n{out}",
            rt.name(),
            open_files(&out.stdout)
        );
        if rt == Rt::Sandbox {
            let got = clamps?.into_iter().find(|c| c.0 == key);
            ensure!(
                got == want_clamp,
                "the exec's clamped record for {key}: got {got:?}, want {want_clamp:?}"
            );
        }
    }
    Ok(())
}
