//! Audit suite: a real podman session through agent-sandbox leaves one
//! hash-chained log with the expected records in order; `audit verify` catches
//! edits, drops and swaps; the sandbox can neither see nor write its log; env
//! values never reach it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, COLLECTOR_IP, HttpServer, REGISTRY_HOST, REGISTRY_IP, TOOL_CALL_ENV,
};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag, unique_name};
use anyhow::{Context, ensure};
use serde_json::Value;

/// Rootful podman's runtime state root (the runtime's default as root).
const PODMAN_ROOT: &str = "/run/agent-sandbox";

fn sandbox() -> Podman {
    Podman::new(User::Root, Runtime::AgentSandbox)
}

fn log_path(root: &str, id: &str) -> PathBuf {
    Path::new(root).join("audit").join(format!("{id}.jsonl"))
}

/// `agent-sandbox --root ROOT audit ARGS...`.
fn audit_cmd(root: &Path, args: &[&str]) -> anyhow::Result<Output> {
    harness::require_file(harness::runtime_bin())?;
    harness::run(
        Command::new(harness::runtime_bin())
            .arg("--root")
            .arg(root)
            .arg("audit")
            .args(args),
        DEFAULT_TIMEOUT,
    )
}

/// What one session left behind.
struct Session {
    /// The runtime state root holding the log.
    root: String,
    id: String,
    records: Vec<Value>,
    raw: String,
    secret: String,
    tool_call: String,
    registry_port: u16,
    collector_port: u16,
    /// Through containerd (the shim reports exits) rather than podman (conmon reaps).
    via_ctr: bool,
}

/// `probe keyctl` (an `add_key` call, outside the policy's allowlist) was refused with the
/// policy's errno (EPERM), answered by the supervisor.
fn denied_syscall_answered(out: &Output) -> anyhow::Result<()> {
    ensure!(
        out.success() && out.stdout.contains("\"blocked\"") && out.stdout.contains("(os error 1)"),
        "add_key was not refused with EPERM\n{out}"
    );
    Ok(())
}

/// The memory limit sessions narrow the policy to (an annotation), so a hog is OOM-killed.
const SESSION_MEMORY: &str = "io.agent.sandbox.memory=64M";

/// An exec that allocates far beyond [`SESSION_MEMORY`].
const HOG: [&str; 3] = [harness::PROBE, "hog", "256"];

/// What both sessions run against: the registry the policy allows, the collector it does
/// not, and a workspace with two files.
struct SessionWorld {
    registry: HttpServer,
    collector: HttpServer,
    policy: PathBuf,
    workspace: PathBuf,
    dir: tempfile::TempDir,
}

impl SessionWorld {
    fn start() -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        let registry = HttpServer::start(REGISTRY_IP, "audit-registry")?;
        let collector = HttpServer::start(COLLECTOR_IP, "audit-collector")?;
        let dir = tempfile::tempdir()?;
        let policy = net::write_policy(
            dir.path(),
            &[
                format!("{REGISTRY_HOST}:{}", registry.port()),
                format!("{REGISTRY_IP}:{}", registry.port()),
            ],
            &[],
        )?;
        let workspace = dir.path().join("ws");
        fs::create_dir(&workspace)?;
        fs::write(workspace.join("old.txt"), "old\n")?;
        fs::write(workspace.join("keep.txt"), "keep\n")?;
        Ok(Self {
            registry,
            collector,
            policy,
            workspace,
            dir,
        })
    }

    /// The tagged exec's script ([`session_script`]) against this world's servers.
    fn script(&self) -> String {
        session_script(self.registry.port(), self.collector.port())
    }

    /// The tagged exec made the allowed and the denied request, and the workspace overlay
    /// kept the host copy untouched.
    fn check_exec(&self, exec: &Output) -> anyhow::Result<()> {
        ensure!(
            exec.stdout.contains("audit-registry") && exec.stdout.contains("403"),
            "session exec did not do the allowed and denied requests\n{exec}"
        );
        ensure!(
            self.workspace.join("old.txt").exists() && !self.workspace.join("new.txt").exists(),
            "the sandbox wrote through to the host workspace"
        );
        Ok(())
    }

    /// The session of sandbox `id`, whose log is under the state root `root`.
    fn finish(
        &self,
        root: String,
        id: String,
        secret: String,
        tool_call: String,
        via_ctr: bool,
    ) -> anyhow::Result<Session> {
        let path = log_path(&root, &id);
        let raw =
            fs::read_to_string(&path).with_context(|| format!("no log at {}", path.display()))?;
        let records = net::read_audit(&path)?;
        Ok(Session {
            root,
            id,
            records,
            raw,
            secret,
            tool_call,
            registry_port: self.registry.port(),
            collector_port: self.collector.port(),
            via_ctr,
        })
    }
}

/// Runs a whole session: create (with a secret env value and a workspace
/// bind), one tagged exec doing an allowed fetch, a denied post and file
/// changes, then stop and rm.
fn podman_session() -> anyhow::Result<Session> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let w = SessionWorld::start()?;
    let secret = format!("s3cr3t-value-{}-{}", std::process::id(), unique_name("v"));
    let tool_call = format!("toolu_x{}", std::process::id());
    let (guard, id) = sandbox().run_detached(
        &["--runtime-flag", &policy_flag(&w.policy)],
        "audit",
        &[
            "-e",
            &format!("AUDIT_SECRET={secret}"),
            "-v",
            &format!("{}:/workspace", w.workspace.display()),
            "--annotation",
            SESSION_MEMORY,
            TOOLS_IMAGE,
            "sleep",
            "600",
        ],
    )?;
    let name = guard.name.clone();
    let script = w.script();
    let exec = sandbox().run(&[
        "exec",
        "-e",
        &format!("{TOOL_CALL_ENV}={tool_call}"),
        "-e",
        &format!("EXEC_SECRET={secret}"),
        &name,
        "sh",
        "-c",
        &script,
    ])?;
    w.check_exec(&exec)?;
    let sys = sandbox().run(&["exec", name.as_str(), harness::PROBE, "keyctl"])?;
    denied_syscall_answered(&sys)?;
    let mut hog = vec!["exec", name.as_str()];
    hog.extend(HOG);
    let hog = sandbox().run(&hog)?;
    ensure!(hog.code == Some(137), "the hog was not OOM-killed\n{hog}");
    sandbox().run_ok(&["stop", "-t", "1", &name])?;
    sandbox().run_ok(&["rm", &name])?;
    drop(guard);
    w.finish(PODMAN_ROOT.to_owned(), id, secret, tool_call, false)
}

/// What the tagged exec of a session does: an allowed fetch, a denied post,
/// and an added, a deleted and a modified workspace file. (Files owned by a
/// host id outside the sandbox's mapping cannot be written in place, so the
/// modification replaces the file.)
fn session_script(registry_port: u16, collector_port: u16) -> String {
    format!(
        "curl -sS -m 20 http://{REGISTRY_HOST}:{registry_port}/; echo; \
         curl -sS -m 20 -o /dev/null -w '%{{http_code}}\\n' -d x=1 \
         http://{COLLECTOR_HOST}:{collector_port}/; \
         echo new > /workspace/new.txt; rm /workspace/old.txt; \
         (cat /workspace/keep.txt; echo more) > /tmp/keep && rm -f /workspace/keep.txt \
         && cp /tmp/keep /workspace/keep.txt"
    )
}

/// The same session through containerd: our shim with a policy from
/// `--runtime-config-path`, the tool-call id in the container's env, then
/// kill, `task delete` and `containers rm`.
fn ctr_session() -> anyhow::Result<Session> {
    ctr::require_containerd()?;
    let w = SessionWorld::start()?;
    let config = w.dir.path().join("runtime-config.toml");
    fs::write(
        &config,
        format!("Policy = {:?}\n", w.policy.display().to_string()),
    )?;
    let secret = format!(
        "s3cr3t-value-{}-{}",
        std::process::id(),
        ctr::unique_id("v")
    );
    let tool_call = format!("toolu_y{}", std::process::id());
    let id = ctr::unique_id("audit");
    let c = Container::start_detached(
        Shim::AgentSandbox,
        &[
            "--runtime-config-path",
            &config.display().to_string(),
            "--env",
            &format!("AUDIT_SECRET={secret}"),
            // `ctr task exec` has no --env: execs inherit the container's env,
            // so the tool-call id tags the container's processes from here.
            "--env",
            &format!("{TOOL_CALL_ENV}={tool_call}"),
            "--mount",
            &format!(
                "type=bind,src={},dst=/workspace,options=rbind:rw",
                w.workspace.display()
            ),
            "--annotation",
            SESSION_MEMORY,
        ],
        TOOLS_IMAGE,
        &id,
        &["sleep", "600"],
    )?;
    c.wait_status("RUNNING", std::time::Duration::from_secs(30))?;
    let exec = c.task_cmd(&["exec", "--exec-id", "tool"], &["sh", "-c", &w.script()])?;
    w.check_exec(&exec)?;
    let sys = c.task_cmd(&["exec", "--exec-id", "sys"], &[harness::PROBE, "keyctl"])?;
    denied_syscall_answered(&sys)?;
    let hog = c.task_cmd(&["exec", "--exec-id", "hog"], &HOG)?;
    ensure!(hog.code == Some(137), "the hog was not OOM-killed\n{hog}");
    c.task_cmd(&["kill", "-s", "SIGKILL"], &[])?;
    c.wait_status("STOPPED", std::time::Duration::from_secs(30))?;
    let del = c.task_cmd(&["delete"], &[])?;
    ensure!(del.success(), "ctr task delete failed\n{del}");
    drop(c);
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    w.finish(root, id, secret, tool_call, true)
}

/// Index of the first record at or after `from` matching `pred`.
fn find(records: &[Value], from: usize, pred: impl Fn(&Value) -> bool) -> Option<usize> {
    records
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, r)| pred(r))
        .map(|(i, _)| i)
}

#[test]
fn podman_session_records_create_exec_net_files_and_delete_in_order_and_verifies()
-> anyhow::Result<()> {
    check_session(&podman_session()?)
}

#[test]
fn ctr_session_records_create_exec_net_files_and_delete_in_order_and_verifies() -> anyhow::Result<()>
{
    check_session(&ctr_session()?)
}

/// The records of a session are complete, in order, verify, show as a
/// timeline, hold no env value, and every kind of tampering is detected.
fn check_session(s: &Session) -> anyhow::Result<()> {
    let r = &s.records;
    let dump = || s.raw.clone();
    let kind = |k: &'static str| move |v: &Value| v["kind"] == k;
    for (i, rec) in r.iter().enumerate() {
        ensure!(
            rec["seq"] == i as u64 + 1 && rec["sandbox"] == s.id.as_str(),
            "record {i} has a wrong seq or sandbox\n{}",
            dump()
        );
    }
    let create = find(r, 0, kind("create")).context(dump())?;
    ensure!(create == 0, "create is not first\n{}", dump());
    ensure!(
        r[create]["data"]["policy_digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "create has no policy digest\n{}",
        dump()
    );
    let init = find(r, create, |v| {
        v["kind"] == "exec" && v["data"]["argv"] == serde_json::json!(["sleep", "600"])
    })
    .context(format!("no init exec record\n{}", dump()))?;
    ensure!(
        r[init]["data"]["env_keys"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "AUDIT_SECRET")),
        "init exec lacks the env key\n{}",
        dump()
    );
    let tagged = find(r, init + 1, |v| {
        v["kind"] == "exec" && v["data"]["tool_call_id"] == s.tool_call.as_str()
    })
    .context(format!("no exec tagged {}\n{}", s.tool_call, dump()))?;
    ensure!(
        r[tagged]["data"]["argv"][0] == "sh",
        "tagged exec argv\n{}",
        dump()
    );
    let allow = find(r, tagged, |v| {
        v["kind"] == "net"
            && v["data"]["verdict"] == "allow"
            && v["data"]["host"] == REGISTRY_HOST
            && v["data"]["port"] == s.registry_port
    })
    .context(format!("no allowed net record\n{}", dump()))?;
    ensure!(
        r[allow]["data"]["bytes_down"].as_u64().unwrap_or(0) > 0,
        "allowed request has no bytes down\n{}",
        dump()
    );
    // The allowed request's record is written when its connection closes, the denial's at
    // once: the next command's denial may come first, so both are looked for after the exec.
    let deny = find(r, tagged, |v| {
        v["kind"] == "net"
            && v["data"]["verdict"] == "deny"
            && v["data"]["host"] == COLLECTOR_HOST
            && v["data"]["port"] == s.collector_port
    })
    .context(format!(
        "no denied net record after the tagged exec\n{}",
        dump()
    ))?;
    let sys = find(r, allow.max(deny), |v| {
        v["kind"] == "syscall_denied" && v["data"]["syscall"] == "add_key"
    })
    .context(format!("no syscall_denied record of add_key\n{}", dump()))?;
    let d = &r[sys]["data"];
    ensure!(
        d["comm"] == "probe"
            && d["pid"].as_i64().is_some_and(|p| p > 0)
            && d["exe"].as_str().is_some_and(|e| e.ends_with("/probe")),
        "syscall_denied: {d}\n{}",
        dump()
    );
    let exited = exits_in_order(s, deny)?;
    let files =
        find(r, exited, kind("files_changed")).context(format!("no files_changed\n{}", dump()))?;
    let d = &r[files]["data"];
    ensure!(
        d["added"] == 1 && d["modified"] == 1 && d["deleted"] == 1,
        "files_changed counts {d}\n{}",
        dump()
    );
    let paths = d["paths"].to_string();
    for p in ["/new.txt", "/keep.txt", "/old.txt"] {
        ensure!(paths.contains(p), "files_changed lacks {p}: {paths}");
    }
    let delete = find(r, files, kind("delete")).context(format!("no delete\n{}", dump()))?;
    ensure!(delete == r.len() - 1, "delete is not last\n{}", dump());

    let verify = audit_cmd(Path::new(&s.root), &["verify", &s.id])?;
    ensure!(verify.success(), "verify failed on the real log\n{verify}");
    let timeline = audit_cmd(Path::new(&s.root), &[&s.id])?;
    ensure!(
        timeline.success() && timeline.stdout.contains(COLLECTOR_HOST),
        "timeline\n{timeline}"
    );

    ensure!(
        !s.raw.contains(&s.secret),
        "an env value reached the audit log\n{}",
        dump()
    );
    tampering_is_detected(s)
}

/// The `exit` records after index `from`, in order; returns the index of the last. Through
/// containerd the shim reports each reaped process: the tagged exec (code 0), the hog
/// (SIGKILL, OOM) and the init (SIGKILL from `ctr task kill`, no new OOM). Through podman
/// conmon reaps everything: the runtime's pidfd watcher records each exec, and the runtime
/// writes the init's exit at delete: status unknown, reaped by the caller.
fn exits_in_order(s: &Session, from: usize) -> anyhow::Result<usize> {
    let r = &s.records;
    let dump = || s.raw.clone();
    let exit_of = |process: &'static str| {
        move |v: &Value| v["kind"] == "exit" && v["data"]["process"] == process
    };
    if s.via_ctr {
        let tool =
            find(r, from, exit_of("tool")).context(format!("no exit of the exec\n{}", dump()))?;
        let d = &r[tool]["data"];
        ensure!(
            d["status"] == serde_json::json!({"code": 0})
                && d["oom"] == false
                && d["tool_call_id"] == s.tool_call.as_str()
                && d["pid"].as_i64().is_some_and(|p| p > 0),
            "exit of the tagged exec: {d}\n{}",
            dump()
        );
        let sys = find(r, tool, exit_of("sys"))
            .context(format!("no exit of the keyctl exec\n{}", dump()))?;
        ensure!(
            r[sys]["data"]["status"] == serde_json::json!({"code": 0}),
            "exit of the keyctl exec: {}\n{}",
            r[sys]["data"],
            dump()
        );
        ensure!(
            r[..sys].iter().any(|v| v["kind"] == "syscall_denied"),
            "the keyctl exec ended before its syscall_denied record\n{}",
            dump()
        );
        let hog =
            find(r, sys, exit_of("hog")).context(format!("no exit of the hog\n{}", dump()))?;
        let d = &r[hog]["data"];
        ensure!(
            d["status"] == serde_json::json!({"signal": 9}) && d["oom"] == true,
            "exit of the hog: {d}\n{}",
            dump()
        );
        let init = find(r, hog, exit_of("init")).context(format!("no exit of init\n{}", dump()))?;
        let d = &r[init]["data"];
        ensure!(
            d["status"] == serde_json::json!({"signal": 9}) && d["oom"] == false,
            "exit of init: {d}\n{}",
            dump()
        );
        let n = r.iter().filter(|v| v["kind"] == "exit").count();
        ensure!(n == 4, "{n} exit records, wanted 4\n{}", dump());
        Ok(init)
    } else {
        // podman's execs are recorded by the runtime's pidfd watcher under their session ids
        // (docs/audit.md): the tagged exec (code 0, its tool-call id) and the hog (SIGKILL,
        // OOM); the init's record comes at delete and has no new OOM.
        let tool = find(r, from, |v: &Value| {
            v["kind"] == "exit" && v["data"]["tool_call_id"] == s.tool_call.as_str()
        })
        .context(format!("no exit of the tagged exec\n{}", dump()))?;
        ensure!(
            r[tool]["data"]["status"] == serde_json::json!({"code": 0}),
            "exit of the tagged exec: {}\n{}",
            r[tool]["data"],
            dump()
        );
        let hog = find(r, from, |v: &Value| {
            v["kind"] == "exit"
                && v["data"]["status"] == serde_json::json!({"signal": 9})
                && v["data"]["oom"] == true
        })
        .context(format!("no exit of the hog (SIGKILL, OOM)\n{}", dump()))?;
        let init = find(r, hog, exit_of("init")).context(format!("no exit of init\n{}", dump()))?;
        let d = &r[init]["data"];
        ensure!(
            d["status"] == "unknown" && d["reaped_by"] == "caller" && d["oom"] == false,
            "exit of init: {d}\n{}",
            dump()
        );
        let n = r.iter().filter(|v| v["kind"] == "exit").count();
        ensure!(
            n == 4,
            "{n} exit records, wanted 4 (three execs, the init)\n{}",
            dump()
        );
        Ok(init)
    }
}

/// Copies the log into a fresh state root, checks it verifies, then that each
/// kind of tampering makes `audit verify` fail.
fn tampering_is_detected(s: &Session) -> anyhow::Result<()> {
    let lines: Vec<&str> = s.raw.lines().collect();
    ensure!(lines.len() >= 5, "log too short to tamper with");
    let verify = |text: String| -> anyhow::Result<Output> {
        let root = tempfile::tempdir()?;
        fs::create_dir(root.path().join("audit"))?;
        fs::write(log_path(&root.path().display().to_string(), &s.id), text)?;
        audit_cmd(root.path(), &["verify", &s.id])
    };
    let join = |l: &[&str]| l.join("\n") + "\n";
    let intact = verify(join(&lines))?;
    ensure!(intact.success(), "the copied log does not verify\n{intact}");

    // One byte changed inside a string value: still valid JSON, wrong hash.
    let mut edited = lines.clone();
    let target = lines
        .iter()
        .position(|l| l.contains(COLLECTOR_HOST))
        .context("no collector line")?;
    let changed = lines[target].replacen("collector", "collectos", 1);
    edited[target] = &changed;
    let out = verify(join(&edited))?;
    ensure!(!out.success(), "verify passed an edited record\n{out}");

    let mut dropped = lines.clone();
    dropped.remove(2);
    let out = verify(join(&dropped))?;
    ensure!(!out.success(), "verify passed a dropped record\n{out}");

    let mut swapped = lines.clone();
    swapped.swap(1, 2);
    let out = verify(join(&swapped))?;
    ensure!(!out.success(), "verify passed swapped records\n{out}");
    Ok(())
}

/// The log still starts with `before`, has no forged line and verifies (the
/// runtime itself appends `exec` records meanwhile).
/// The marker is split in the script (`FOR GED`), so the `exec` record of the
/// attempt does not contain it.
fn log_untouched(log: &Path, id: &str, before: &str) -> anyhow::Result<()> {
    let now = fs::read_to_string(log)?;
    ensure!(
        now.starts_with(before) && !now.contains("FORGED"),
        "the log was changed by the sandbox
{now}"
    );
    let verify = audit_cmd(Path::new(PODMAN_ROOT), &["verify", id])?;
    ensure!(
        verify.success(),
        "the log no longer verifies
{verify}"
    );
    Ok(())
}

#[test]
fn sandbox_can_neither_see_nor_write_its_audit_log_but_a_runc_container_can() -> anyhow::Result<()>
{
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let (guard, id) = sandbox().run_detached(&[], "audit-reach", &[TOOLS_IMAGE, "sleep", "600"])?;
    let log = log_path(PODMAN_ROOT, &id);
    ensure!(log.exists(), "no log at {}", log.display());
    let before = fs::read_to_string(&log)?;
    let script = |dir: &str| {
        format!(
            "ls {dir} 2>&1; ls {dir}/audit/{id}.jsonl && echo log-visible; \
             printf %s%s FOR GED >> {dir}/audit/{id}.jsonl && echo log-written; \
             find / -xdev -name '{id}.jsonl' 2>/dev/null | grep . && echo log-found; true"
        )
    };
    let inside = sandbox().run_ok(&["exec", &guard.name, "sh", "-c", &script(PODMAN_ROOT)])?;
    ensure!(
        !inside.stdout.contains("log-visible")
            && !inside.stdout.contains("log-written")
            && !inside.stdout.contains("log-found"),
        "the sandbox reached its log\n{inside}"
    );
    log_untouched(&log, &id, &before)?;
    // Even with the state root bound in by the caller, the sandbox's root is an
    // unprivileged host id and cannot write root's 0700 audit directory.
    let bound = unique_name("audit-bind");
    let _bound_guard = ContainerGuard {
        podman: sandbox(),
        name: bound.clone(),
    };
    let bind = sandbox().run(&[
        "run",
        "--rm",
        "--name",
        &bound,
        "--user",
        "0",
        "-v",
        &format!("{PODMAN_ROOT}:/mnt/state"),
        TOOLS_IMAGE,
        "sh",
        "-c",
        &script("/mnt/state"),
    ])?;
    ensure!(
        !bind.stdout.contains("log-written"),
        "the sandbox wrote its log through a bind\n{bind}"
    );
    log_untouched(&log, &id, &before)?;
    // The same script under runc with a copy of the state root writes it.
    let copy = tempfile::tempdir()?;
    fs::create_dir(copy.path().join("audit"))?;
    fs::write(
        copy.path().join("audit").join(format!("{id}.jsonl")),
        &before,
    )?;
    let base = Podman::new(User::Root, Runtime::Runc).run(&[
        "run",
        "--rm",
        "--user",
        "0",
        "-v",
        &format!("{}:/mnt/state", copy.path().display()),
        TOOLS_IMAGE,
        "sh",
        "-c",
        &script("/mnt/state"),
    ])?;
    ensure!(
        base.stdout.contains("log-written"),
        "runc baseline could not write the copy\n{base}"
    );
    Ok(())
}

#[test]
fn diff_and_export_show_workspace_changes_for_review_while_the_host_keeps_its_files()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let dir = tempfile::tempdir()?;
    let workspace = dir.path().join("ws");
    fs::create_dir_all(workspace.join("sub"))?;
    fs::write(workspace.join("a.txt"), "original\n")?;
    fs::write(workspace.join("sub/old.txt"), "old\n")?;
    // The sandbox's users are unprivileged host ids: let them write through the overlay.
    harness::run_ok(
        Command::new("chmod").args(["-R", "a+rwX"]).arg(&workspace),
        DEFAULT_TIMEOUT,
    )?;
    let name = unique_name("review");
    let _guard = ContainerGuard {
        podman: sandbox(),
        name: name.clone(),
    };
    let script = "echo new > /workspace/new.txt && echo changed > /workspace/a.txt \
                  && rm /workspace/sub/old.txt && ln -s /etc/passwd /workspace/evil \
                  && touch /tmp/done && sleep 600";
    let out = sandbox().run_ok(&[
        "run",
        "-d",
        "--name",
        &name,
        "-v",
        &format!("{}:/workspace", workspace.display()),
        TOOLS_IMAGE,
        "sh",
        "-c",
        script,
    ])?;
    let id = out
        .stdout
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    ensure!(id.len() == 64, "no container id\n{out}");
    // Wait until the script has made its changes.
    let mut diff = harness::runtime(&["diff", &id])?;
    for _ in 0..50 {
        if diff.stdout.contains("/evil") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        diff = harness::runtime(&["diff", &id])?;
    }
    ensure!(diff.code == Some(0), "diff failed\n{diff}");
    for line in [
        "A /new.txt (file)",
        "M /a.txt (file)",
        "D /sub/old.txt (file)",
        "A /evil (symlink) -> /etc/passwd",
    ] {
        ensure!(diff.stdout.contains(line), "diff lacks {line:?}\n{diff}");
    }

    let export = dir.path().join("review");
    let out = harness::runtime(&["export", "--to-dir", &export.display().to_string(), &id])?;
    ensure!(out.code == Some(0), "export failed\n{out}");
    ensure!(
        fs::read_to_string(export.join("new.txt"))? == "new\n",
        "{out}"
    );
    ensure!(
        fs::read_to_string(export.join("a.txt"))? == "changed\n",
        "{out}"
    );
    let evil = fs::symlink_metadata(export.join("evil"))?;
    ensure!(
        evil.file_type().is_symlink(),
        "the symlink was followed on export"
    );
    let deleted = fs::read(export.join(".agent-sandbox-deleted"))?;
    ensure!(
        String::from_utf8_lossy(&deleted).contains("sub/old.txt"),
        "deleted manifest: {deleted:?}"
    );

    // Nothing reached the host workspace.
    ensure!(!workspace.join("new.txt").exists());
    ensure!(!workspace.join("evil").exists());
    ensure!(fs::read_to_string(workspace.join("a.txt"))? == "original\n");
    ensure!(workspace.join("sub/old.txt").exists());

    // Bad input: an unknown id, and a sandbox without a workspace.
    let unknown = harness::runtime(&["diff", "no-such-sandbox"])?;
    ensure!(
        unknown.code == Some(1) && unknown.stderr.contains("no sandbox \"no-such-sandbox\""),
        "{unknown}"
    );
    Ok(())
}

/// The records of `log` verify with `audit verify` (run against `root`, with `flags`).
fn verifies(flags: &[&str], id: &str) -> anyhow::Result<Output> {
    let mut args = flags.to_vec();
    args.extend(["audit", "verify", id]);
    harness::runtime(&args)
}

#[test]
fn layers_reports_the_protections_the_kernel_shows_on_a_running_sandbox() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let (_guard, id) = sandbox().run_detached(
        &[],
        "audit-layers",
        &["--annotation", SESSION_MEMORY, TOOLS_IMAGE, "sleep", "600"],
    )?;
    let out = harness::runtime(&["layers", &id])?;
    ensure!(out.success(), "layers failed\n{out}");
    let l: Value = serde_json::from_str(&out.stdout).context(out.to_string())?;
    // What the runtime saved at create.
    let mapping = l["userns"]["mapping"].as_str().unwrap_or_default();
    let host_start: u64 = mapping
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context(format!("bad mapping {mapping:?}"))?;
    ensure!(
        host_start >= 1_000_000,
        "container root maps to host id {host_start}\n{l:#}"
    );
    ensure!(
        l["readonly_rootfs"] == true
            && l["no_new_privs"] == true
            && l["capabilities"] == serde_json::json!([])
            && l["seccomp"]["supervisor_alive"] == true
            && l["seccomp"]["bpf_instructions"]
                .as_u64()
                .is_some_and(|n| n > 10)
            && l["landlock"]["kernel_abi"].as_u64().is_some_and(|n| n >= 1),
        "saved layers\n{l:#}"
    );
    check_lsm_layers(&l)?;
    ensure!(
        l["cgroups"]["limits"]["memory/memory.limit_in_bytes"] == "67108864",
        "the annotation's 64M limit is not in the cgroup\n{l:#}"
    );
    ensure!(
        l["network"]["mode"] == "proxy"
            && l["network"]["proxy_alive"] == true
            && l["network"]["proxy_port"].as_u64().is_some(),
        "network\n{l:#}"
    );
    // What the kernel shows for the init now: the same id mapping, seccomp filter mode,
    // no_new_privs and no capabilities in any set.
    let live = &l["live"];
    ensure!(
        live["uid_map"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("0 {host_start} ")))
            && live["seccomp_mode"] == "2"
            && live["no_new_privs"] == true
            && live["capabilities_empty"] == true,
        "live view\n{l:#}"
    );
    // The same reading of a runc container's init (what `live` would show without our
    // runtime): host root, capabilities, no user namespace.
    let runc = Podman::new(User::Root, Runtime::Runc);
    let (base, _) = runc.run_detached(&[], "audit-layers-runc", &[TOOLS_IMAGE, "sleep", "600"])?;
    let pid = runc.run_ok(&["inspect", "--format", "{{.State.Pid}}", &base.name])?;
    let pid = pid.stdout.trim();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uid_map = fs::read_to_string(format!("/proc/{pid}/uid_map"))?;
    ensure!(
        uid_map.split_whitespace().take(2).collect::<Vec<_>>() == ["0", "0"]
            && status
                .lines()
                .any(|l| l.starts_with("CapEff:") && !l.ends_with("0000000000000000")),
        "runc baseline init is not host root with capabilities\n{uid_map}\n{status}"
    );
    // Bad input names the sandbox.
    let unknown = harness::runtime(&["layers", "no-such-sandbox"])?;
    ensure!(
        unknown.code == Some(1) && unknown.stderr.contains("no-such-sandbox"),
        "{unknown}"
    );
    Ok(())
}

#[test]
fn audit_dir_flag_moves_logs_which_outlive_delete_until_pruned_but_never_while_live()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let dir = tempfile::tempdir()?;
    let logs = dir.path().join("logs");
    let logs_s = logs.display().to_string();
    let flag = format!("audit-dir={logs_s}");
    let (guard, id) = sandbox().run_detached(
        &["--runtime-flag", &flag],
        "audit-dir",
        &[TOOLS_IMAGE, "sleep", "600"],
    )?;
    let name = guard.name.clone();
    let log = logs.join(format!("{id}.jsonl"));
    ensure!(log.exists(), "no log at {}", log.display());
    ensure!(
        !log_path(PODMAN_ROOT, &id).exists(),
        "the log was also written to the default directory"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&logs)?.permissions());
    ensure!(mode & 0o777 == 0o700, "log dir mode {mode:o}");
    // exec appends to the same file without the flag (the choice is saved at create).
    sandbox().run_ok(&["exec", &name, "true"])?;
    // The exec's `exit` record comes from the runtime's pidfd watcher right after it ended.
    // Five lifecycle and exit records, besides one `clamped` record per engine default the
    // policy narrowed (docs/policy.md#widening-requests).
    let counts = || -> anyhow::Result<(usize, usize)> {
        let records = net::read_audit(&log)?;
        let others = records.iter().filter(|r| r["kind"] != "clamped").count();
        Ok((records.len(), others))
    };
    let start = std::time::Instant::now();
    while counts()?.1 < 5 && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (total, others) = counts()?;
    ensure!(
        others == 5,
        "{others} records besides `clamped` ones, expected 5"
    );
    let dirf = ["--audit-dir", logs_s.as_str()];
    let v = verifies(&dirf, &id)?;
    ensure!(
        v.success() && v.stdout.contains(&format!("{total} records")),
        "{v}"
    );

    // A live sandbox's log is never pruned.
    let mut args = dirf.to_vec();
    args.extend(["audit", "prune", &id]);
    let refused = harness::runtime(&args)?;
    ensure!(
        refused.code == Some(1) && refused.stderr.contains("is live") && log.exists(),
        "{refused}"
    );
    let mut args = dirf.to_vec();
    args.extend(["audit", "prune"]);
    let all = harness::runtime(&args)?;
    ensure!(
        all.success() && log.exists() && all.stdout.contains("1 kept (sandbox live)"),
        "{all}"
    );

    sandbox().run_ok(&["rm", "-f", &name])?;
    drop(guard);
    let records = net::read_audit(&log)?;
    ensure!(
        records.last().is_some_and(|r| r["kind"] == "delete"),
        "the log does not end with delete\n{}",
        fs::read_to_string(&log)?
    );
    // Kept after delete; still readable and verifiable.
    let v = verifies(&dirf, &id)?;
    ensure!(v.success(), "{v}");
    // Bad input changes nothing.
    let mut args = dirf.to_vec();
    args.extend(["audit", "prune", "--older-than", "5w"]);
    let bad = harness::runtime(&args)?;
    ensure!(
        bad.code == Some(1) && bad.stderr.contains("\"5w\"") && log.exists(),
        "{bad}"
    );
    // Too recent for an hour's cut-off, then pruned.
    let mut args = dirf.to_vec();
    args.extend(["audit", "prune", "--older-than", "1h"]);
    let recent = harness::runtime(&args)?;
    ensure!(recent.success() && log.exists(), "{recent}");
    let mut args = dirf.to_vec();
    args.extend(["audit", "prune", &id]);
    let pruned = harness::runtime(&args)?;
    ensure!(pruned.success() && !log.exists(), "{pruned}");
    Ok(())
}

/// A small tmpfs mounted by the test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        harness::run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
                .arg("tmpfs")
                .arg(dir.path()),
            DEFAULT_TIMEOUT,
        )?;
        Ok(Self { dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = harness::run(Command::new("umount").arg(self.dir.path()), DEFAULT_TIMEOUT);
    }
}

#[test]
fn full_audit_disk_refuses_execs_with_an_error_naming_the_log_and_loses_no_record()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let fs_ = Tmpfs::mount("256k")?;
    let logs = fs_.dir.path().join("logs");
    let logs_s = logs.display().to_string();
    let flag = format!("audit-dir={logs_s}");
    let (guard, id) = sandbox().run_detached(
        &["--runtime-flag", &flag],
        "audit-full",
        &[TOOLS_IMAGE, "sleep", "600"],
    )?;
    let name = guard.name.clone();
    let log = logs.join(format!("{id}.jsonl"));
    // Fill the file system (a write that stops at ENOSPC keeps what fit).
    let filler = fs_.dir.path().join("filler");
    let mut f = fs::File::create(&filler)?;
    let chunk = vec![0u8; 4096];
    let full = loop {
        match std::io::Write::write_all(&mut f, &chunk) {
            Ok(()) => continue,
            Err(e) => break e,
        }
    };
    ensure!(
        full.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32),
        "filling: {full}"
    );
    drop(f);
    // The log's last page may still hold a record or two: exec until one is refused.
    let dirf = ["--audit-dir", logs_s.as_str()];
    let mut ran = 0;
    let refused = loop {
        let marker = format!("marker-{ran}");
        let out = sandbox().run(&["exec", &name, "echo", &marker])?;
        if !out.success() {
            break out;
        }
        ensure!(out.stdout.contains(&marker), "{out}");
        ran += 1;
        ensure!(ran < 20, "20 execs succeeded on a full audit disk");
    };
    let text = format!("{}{}", refused.stdout, refused.stderr);
    ensure!(
        text.contains("audit log") && text.contains(&log.display().to_string()),
        "the refusal does not name the log\n{refused}"
    );
    ensure!(!text.contains("marker-"), "the refused exec ran\n{refused}");
    // Every exec that ran has its record; the refused one has none; the chain is intact.
    let raw = fs::read_to_string(&log)?;
    for i in 0..ran {
        ensure!(
            raw.contains(&format!("marker-{i}")),
            "no record of exec {i}\n{raw}"
        );
    }
    ensure!(
        !raw.contains(&format!("marker-{ran}")),
        "a record of the refused exec\n{raw}"
    );
    let v = verifies(&dirf, &id)?;
    ensure!(v.success(), "{v}");
    // Space back: execs work again and the log continues its chain.
    fs::remove_file(&filler)?;
    sandbox().run_ok(&["exec", &name, "echo", "after"])?;
    sandbox().run_ok(&["rm", "-f", &name])?;
    drop(guard);
    let v = verifies(&dirf, &id)?;
    ensure!(v.success(), "{v}");
    let raw = fs::read_to_string(&log)?;
    ensure!(
        raw.contains("\"after\"") && raw.trim_end().ends_with('}'),
        "{raw}"
    );
    drop(fs_);
    Ok(())
}

#[test]
fn log_survives_a_sigkilled_runtime_and_a_sigkilled_shim_and_still_verifies() -> anyhow::Result<()>
{
    // The runtime: a foreground `exec` waits for its process; SIGKILL it meanwhile.
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let (guard, id) = sandbox().run_detached(&[], "audit-kill", &[TOOLS_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    let log = log_path(PODMAN_ROOT, &id);
    let mut child = Command::new(harness::runtime_bin())
        .args(["exec", &id, "sleep", "137"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut seen = false;
    for _ in 0..100 {
        if fs::read_to_string(&log)?.contains("\"137\"") {
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill()?;
    let status = child.wait()?;
    ensure!(seen, "the exec record never appeared");
    ensure!(
        std::os::unix::process::ExitStatusExt::signal(&status) == Some(9),
        "the runtime was not SIGKILLed: {status}"
    );
    let before = fs::read_to_string(&log)?;
    let v = verifies(&[], &id)?;
    ensure!(v.success(), "{v}");
    sandbox().run_ok(&["exec", &name, "true"])?;
    sandbox().run_ok(&["rm", "-f", &name])?;
    drop(guard);
    let after = fs::read_to_string(&log)?;
    ensure!(
        after.starts_with(&before),
        "records before the kill changed\n{after}"
    );
    let v = verifies(&[], &id)?;
    ensure!(v.success() && after.contains("\"delete\""), "{v}\n{after}");

    // The shim: SIGKILL it after an exec and its exit were recorded.
    ctr::require_containerd()?;
    let cid = ctr::unique_id("audit-shim");
    let c = Container::start_detached(
        Shim::AgentSandbox,
        &[],
        TOOLS_IMAGE,
        &cid,
        &["sleep", "600"],
    )?;
    c.wait_status("RUNNING", std::time::Duration::from_secs(30))?;
    let exec = c.task_cmd(&["exec", "--exec-id", "before-kill"], &["true"])?;
    ensure!(exec.success(), "{exec}");
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    let clog = log_path(&root, &cid);
    let before = fs::read_to_string(&clog)?;
    ensure!(
        before.contains("before-kill"),
        "no exit record of the exec\n{before}"
    );
    let shims = ctr::shim_pids(Shim::AgentSandbox, &cid);
    ensure!(!shims.is_empty(), "no shim process for {cid}");
    for pid in &shims {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(*pid)?),
            nix::sys::signal::Signal::SIGKILL,
        )?;
    }
    let rootf = ["--root", root.as_str()];
    let v = verifies(&rootf, &cid)?;
    ensure!(v.success(), "{v}");
    drop(c);
    let after = fs::read_to_string(&clog)?;
    ensure!(
        after.starts_with(&before),
        "records before the kill changed\n{after}"
    );
    let v = verifies(&rootf, &cid)?;
    ensure!(v.success(), "after cleanup: {v}\n{after}");
    // containerd cleans up after the dead shim with the shim's `delete` action, whose
    // forced runtime delete SIGKILLs the init and records that.
    let records = net::read_audit(&clog)?;
    let init_exit = records
        .iter()
        .find(|r| r["kind"] == "exit" && r["data"]["process"] == "init")
        .context(format!("no exit record of init\n{after}"))?;
    ensure!(
        init_exit["data"]["status"] == serde_json::json!({"signal": 9})
            && init_exit["data"]["reaped_by"] == "delete --force"
            && records.last().is_some_and(|r| r["kind"] == "delete"),
        "{after}"
    );
    Ok(())
}

/// Pid of the sandbox's denied-syscall supervisor (`seccomp-supervise ... ID`).
fn supervisor_pid(id: &str) -> anyhow::Result<i32> {
    let path = Path::new(PODMAN_ROOT)
        .join("sandbox")
        .join(id)
        .join("seccomp-supervisor.pid");
    let pid: i32 = fs::read_to_string(&path)
        .with_context(|| format!("no {}", path.display()))?
        .trim()
        .parse()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))?;
    ensure!(
        String::from_utf8_lossy(&cmdline).contains("seccomp-supervise"),
        "pid {pid} is not the supervisor"
    );
    Ok(pid)
}

fn syscall_denials(log: &Path) -> anyhow::Result<Vec<Value>> {
    Ok(net::read_audit(log)?
        .into_iter()
        .filter(|r| r["kind"] == "syscall_denied")
        .collect())
}

#[test]
fn denied_syscalls_are_answered_outside_the_sandbox_rate_limited_and_fail_closed()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    // The init waits for /tmp/go, then makes one denied call (its output: `podman logs`).
    let init_script = format!(
        "while [ ! -e /tmp/go ]; do sleep 0.1; done; {} keyctl; sleep 600",
        harness::PROBE
    );
    // podman's `--init` (catatonit) is PID 1, not agent-sandbox's reaper: the supervisor is
    // then not the helper whose death ends the sandbox (ARCHITECTURE.md, "One helper per
    // sandbox"; `faults::killing_the_helper_ends_the_sandbox_*`), so the sandbox runs on
    // after the kill below and shows the kernel's answer without a supervisor.
    let (guard, id) = sandbox().run_detached(
        &[],
        "audit-sys",
        &["--init", TOOLS_IMAGE, "sh", "-c", &init_script],
    )?;
    let name = guard.name.clone();
    let log = log_path(PODMAN_ROOT, &id);
    let sup = supervisor_pid(&id)?;
    // The supervisor is a host process: the host's pid and user namespaces, not the sandbox's.
    let init = sandbox().run_ok(&["inspect", "--format", "{{.State.Pid}}", &name])?;
    let init = init.stdout.trim();
    let ns = |pid: &str, n: &str| fs::read_link(format!("/proc/{pid}/ns/{n}"));
    for n in ["pid", "user", "mnt"] {
        ensure!(
            ns(&sup.to_string(), n)? == ns("self", n)? && ns(init, n)? != ns("self", n)?,
            "the supervisor is not outside the sandbox's {n} namespace"
        );
    }
    // A flood: 300 denied calls are all answered at once, and the log gets at most the
    // burst (50) plus what the rate (10/s) refills meanwhile.
    let mut flood = vec!["exec", name.as_str(), harness::PROBE];
    flood.extend(std::iter::repeat_n("keyctl", 300));
    let out = sandbox().run_ok(&flood)?;
    let blocked = out.stdout.matches("(os error 1)").count();
    ensure!(
        blocked == 300,
        "{blocked} of 300 calls refused with EPERM\n{out}"
    );
    let recorded = syscall_denials(&log)?.len();
    let limit = 51 + usize::try_from(out.elapsed.as_millis() / 100 + 1)?;
    ensure!(
        (50..=limit).contains(&recorded),
        "{recorded} syscall_denied records for 300 calls in {:.2?} (limit {limit})",
        out.elapsed
    );
    // After a pause, the next record counts what the limit left out.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let one = sandbox().run_ok(&["exec", &name, harness::PROBE, "keyctl"])?;
    denied_syscall_answered(&one)?;
    let all = syscall_denials(&log)?;
    let last = all.last().context("no records")?;
    let total: u64 = all
        .iter()
        .map(|r| 1 + r["data"]["suppressed"].as_u64().unwrap_or(0))
        .sum();
    ensure!(
        last["data"]["suppressed"].as_u64().is_some_and(|n| n > 0) && total >= 301,
        "suppressed denials not counted: {total} in all\n{last}"
    );
    let v = verifies(&[], &id)?;
    ensure!(v.success(), "{v}");
    // Without the supervisor: a running process's denied call fails with ENOSYS (the
    // kernel's answer when no listener is left), and no new exec starts.
    sandbox().run_ok(&["exec", "-d", &name, "sh", "-c", "sleep 1; touch /tmp/go"])?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let mut logs = sandbox().run_ok(&["logs", &name])?;
    for _ in 0..50 {
        if logs.stdout.contains("keyctl") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        logs = sandbox().run_ok(&["logs", &name])?;
    }
    ensure!(
        logs.stdout.contains("\"blocked\"") && logs.stdout.contains("(os error 38)"),
        "add_key without the supervisor\n{logs}"
    );
    let refused = sandbox().run(&["exec", &name, "true"])?;
    ensure!(
        !refused.success() && refused.stderr.contains("seccomp supervisor"),
        "an exec started without the supervisor\n{refused}"
    );
    // Baseline: the same call succeeds in a runc container without a seccomp filter.
    let base = Podman::new(User::Root, Runtime::Runc).run_ok(&[
        "run",
        "--rm",
        "--security-opt",
        "seccomp=unconfined",
        TOOLS_IMAGE,
        harness::PROBE,
        "keyctl",
    ])?;
    ensure!(
        base.stdout.contains("\"allowed\""),
        "runc baseline did not allow add_key\n{base}"
    );
    Ok(())
}

/// Serialises the tests that depend on the kernel's audit setting (it is host-wide).
static KERNEL_AUDIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the kernel's `audit_enabled` (AUDIT_SET, needs CAP_AUDIT_CONTROL); returns the
/// previous value. agent-sandbox itself never changes it: an admin enables audit.
fn set_kernel_audit(enabled: Option<u32>) -> anyhow::Result<u32> {
    use netlink_packet_audit::{AuditMessage, StatusMessage};
    use netlink_packet_core::{
        NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_AUDIT};
    let mut sock = Socket::new(NETLINK_AUDIT)?;
    sock.bind_auto()?;
    let request = |payload: AuditMessage| -> anyhow::Result<()> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        sock.send_to(&buf, &SocketAddr::new(0, 0), 0)?;
        Ok(())
    };
    request(AuditMessage::GetStatus(None))?;
    let mut was = None;
    for _ in 0..4 {
        let mut reply = Vec::with_capacity(8192);
        sock.recv(&mut reply, 0)?;
        if let NetlinkPayload::InnerMessage(AuditMessage::GetStatus(Some(s))) =
            NetlinkMessage::<AuditMessage>::deserialize(&reply)?.payload
        {
            was = Some(s.enabled);
            break;
        }
    }
    let was = was.context("no audit status from the kernel")?;
    if let Some(enabled) = enabled {
        let mut status = StatusMessage::new();
        status.mask = 1; // AUDIT_STATUS_ENABLED
        status.enabled = enabled;
        request(AuditMessage::SetStatus(status))?;
        let mut reply = Vec::with_capacity(8192);
        sock.recv(&mut reply, 0)?;
        if let NetlinkPayload::Error(e) =
            NetlinkMessage::<AuditMessage>::deserialize(&reply)?.payload
            && e.code.is_some()
        {
            anyhow::bail!("AUDIT_SET enabled={enabled}: {}", e.to_io());
        }
    }
    Ok(was)
}

/// Kernel audit in a given state for one test, restored on drop; holds [`KERNEL_AUDIT`].
struct KernelAudit {
    was: u32,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl KernelAudit {
    fn set(enabled: u32) -> anyhow::Result<Self> {
        let lock = KERNEL_AUDIT.lock().unwrap_or_else(|e| e.into_inner());
        let was = set_kernel_audit(Some(enabled))?;
        Ok(Self { was, _lock: lock })
    }
}

impl Drop for KernelAudit {
    fn drop(&mut self) {
        let _ = set_kernel_audit(Some(self.was));
    }
}

/// A file Landlock refuses to create: `/dev` is a writable tmpfs in the sandbox, but the
/// policy grants no `make_reg` there.
const FS_DENIED_SCRIPT: &str = "touch /dev/agent-sandbox-fs-audit; echo rc=$?";

/// Waits until `log` holds an `fs_denied` record, then returns all records.
fn wait_fs_denied(log: &Path) -> anyhow::Result<Vec<Value>> {
    for _ in 0..50 {
        let records = net::read_audit(log)?;
        if records.iter().any(|r| r["kind"] == "fs_denied") {
            return Ok(records);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    net::read_audit(log)
}

/// Waits until `log` holds `n` `fs_denied` records.
fn wait_until_fs_denied_count(log: &Path, n: usize) -> anyhow::Result<()> {
    for _ in 0..50 {
        let have = net::read_audit(log)?
            .iter()
            .filter(|r| r["kind"] == "fs_denied")
            .count();
        if have >= n {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    anyhow::bail!("fewer than {n} fs_denied records in {}", log.display())
}

/// The records hold, in order: the exec of the refused write, its `fs_denied` record
/// naming `/dev` and the process, and the next exec (`marker`); the log verifies.
fn fs_denied_in_order(records: &[Value], raw: &str, marker: &str) -> anyhow::Result<()> {
    let touch = find(records, 0, |v| {
        v["kind"] == "exec" && v["data"]["argv"][2] == FS_DENIED_SCRIPT
    })
    .context(format!("no exec record of the write\n{raw}"))?;
    let denied = find(records, touch, |v| v["kind"] == "fs_denied")
        .context(format!("no fs_denied record after the write's exec\n{raw}"))?;
    let d = &records[denied]["data"];
    ensure!(
        d["path"] == "/dev"
            && d["access"] == "fs.make_reg"
            && d["comm"] == "touch"
            && d["pid"].as_i64().is_some_and(|p| p > 0)
            && d["syscall"].as_str().is_some_and(|s| s.starts_with("open"))
            && d["domain"].as_str().is_some_and(|s| !s.is_empty()),
        "fs_denied: {d}\n{raw}"
    );
    let after = find(records, denied, |v| {
        v["kind"] == "exec" && v["data"]["argv"] == serde_json::json!(["echo", marker])
    });
    ensure!(
        after.is_some(),
        "the next exec is not after the fs_denied record\n{raw}"
    );
    let n = records[..=denied]
        .iter()
        .filter(|v| v["kind"] == "fs_denied")
        .count();
    ensure!(
        n == 1,
        "{n} fs_denied records up to the write, wanted 1 (the probes are not records)\n{raw}"
    );
    Ok(())
}

/// The same write succeeds in a runc container (no Landlock): the test can fail.
fn runc_creates_the_file() -> anyhow::Result<()> {
    let base = Podman::new(User::Root, Runtime::Runc).run_ok(&[
        "run",
        "--rm",
        TOOLS_IMAGE,
        "sh",
        "-c",
        FS_DENIED_SCRIPT,
    ])?;
    ensure!(
        base.stdout.contains("rc=0"),
        "runc baseline could not create the file\n{base}"
    );
    Ok(())
}

#[test]
fn podman_landlock_denial_is_an_fs_denied_record_in_order_and_verifies_while_runc_allows_it()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let _audit = KernelAudit::set(1)?;
    let (guard, id) = sandbox().run_detached(&[], "audit-fs", &[TOOLS_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    let out = harness::runtime(&["layers", &id])?;
    let l: Value = serde_json::from_str(&out.stdout).context(out.to_string())?;
    ensure!(l["fs_denied"]["active"] == true, "layers\n{l:#}");
    let write = sandbox().run_ok(&["exec", &name, "sh", "-c", FS_DENIED_SCRIPT])?;
    ensure!(
        write.stdout.contains("rc=1") && write.stderr.contains("Permission denied"),
        "Landlock did not refuse the file\n{write}"
    );
    let log = log_path(PODMAN_ROOT, &id);
    wait_fs_denied(&log)?;
    sandbox().run_ok(&["exec", &name, "echo", "fs-after"])?;
    let raw = fs::read_to_string(&log)?;
    let records = net::read_audit(&log)?;
    fs_denied_in_order(&records, &raw, "fs-after")?;
    // A flood: 400 refused creates in one process. The log gets at most the burst (50) plus
    // what the rate (10/s) refills meanwhile; after a pause the next record counts what the
    // limit left out.
    let flood = sandbox().run_ok(&[
        "exec",
        &name,
        "sh",
        "-c",
        "i=0; while [ $i -lt 400 ]; do echo x 2>/dev/null > /dev/f$i; i=$((i+1)); done; echo flooded",
    ])?;
    ensure!(flood.stdout.contains("flooded"), "{flood}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let fs_records = |records: &[Value]| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r["kind"] == "fs_denied")
            .cloned()
            .collect()
    };
    let recorded = fs_records(&net::read_audit(&log)?).len() - 1;
    let limit = 51 + usize::try_from(flood.elapsed.as_millis() / 100 + 16)?;
    ensure!(
        (40..=limit).contains(&recorded),
        "{recorded} fs_denied records for 400 refused creates in {:.2?} (limit {limit})",
        flood.elapsed
    );
    let one = sandbox().run_ok(&["exec", &name, "sh", "-c", FS_DENIED_SCRIPT])?;
    ensure!(one.stdout.contains("rc=1"), "{one}");
    wait_until_fs_denied_count(&log, recorded + 2)?;
    let all = fs_records(&net::read_audit(&log)?);
    let last = all.last().context("no fs_denied records")?;
    ensure!(
        last["data"]["suppressed"].as_u64().is_some_and(|n| n > 0),
        "suppressed denials not counted\n{last}"
    );
    // Nothing goes missing unaccounted: the records plus what they say was left out (by
    // the rate limit, or dropped by the kernel's audit queue, from the kernel's own tally
    // when the flood's domain ended) are every refused access: 1 + 400 + 1.
    let total: u64 = all
        .iter()
        .map(|r| 1 + r["data"]["suppressed"].as_u64().unwrap_or(0))
        .sum();
    ensure!(
        total == 402,
        "{total} denials accounted for, wanted 402\n{last}"
    );
    sandbox().run_ok(&["rm", "-f", &name])?;
    drop(guard);
    let raw = fs::read_to_string(&log)?;
    let records = net::read_audit(&log)?;
    ensure!(
        records.last().is_some_and(|r| r["kind"] == "delete"),
        "delete is not last\n{raw}"
    );
    let v = verifies(&[], &id)?;
    ensure!(v.success(), "{v}");
    runc_creates_the_file()
}

#[test]
fn ctr_landlock_denial_is_an_fs_denied_record_in_order_and_verifies() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let _audit = KernelAudit::set(1)?;
    let id = ctr::unique_id("audit-fs");
    let c =
        Container::start_detached(Shim::AgentSandbox, &[], TOOLS_IMAGE, &id, &["sleep", "600"])?;
    c.wait_status("RUNNING", std::time::Duration::from_secs(30))?;
    let write = c.task_cmd(
        &["exec", "--exec-id", "fs"],
        &["sh", "-c", FS_DENIED_SCRIPT],
    )?;
    ensure!(
        write.stdout.contains("rc=1"),
        "Landlock did not refuse the file\n{write}"
    );
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    let log = log_path(&root, &id);
    wait_fs_denied(&log)?;
    let after = c.task_cmd(&["exec", "--exec-id", "after"], &["echo", "fs-after"])?;
    ensure!(after.success(), "{after}");
    c.task_cmd(&["kill", "-s", "SIGKILL"], &[])?;
    c.wait_status("STOPPED", std::time::Duration::from_secs(30))?;
    let del = c.task_cmd(&["delete"], &[])?;
    ensure!(del.success(), "ctr task delete failed\n{del}");
    drop(c);
    let raw = fs::read_to_string(&log)?;
    let records = net::read_audit(&log)?;
    fs_denied_in_order(&records, &raw, "fs-after")?;
    // Through containerd the shim reports the exec's exit: after its fs_denied record. The
    // kernel delivers Landlock's record to the supervisor asynchronously, so the exit record's
    // writer first waits for the supervisor to have read the kernel's records up to then
    // (`sidecars::fs_audit::fence`); without that wait the exit came 1.6 ms before the
    // denial in one of two CI runs.
    let denied = find(&records, 0, |v| v["kind"] == "fs_denied").context(raw.clone())?;
    ensure!(
        find(&records, denied, |v| v["kind"] == "exit"
            && v["data"]["process"] == "fs"
            && v["data"]["status"] == serde_json::json!({"code": 0}))
        .is_some(),
        "the write's exec ended before its fs_denied record\n{raw}"
    );
    let rootf = ["--root", root.as_str()];
    let v = verifies(&rootf, &id)?;
    ensure!(v.success(), "{v}");
    Ok(())
}

#[test]
fn fs_denied_is_reported_inactive_with_the_reason_when_kernel_audit_is_off() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let _audit = KernelAudit::set(0)?;
    let (guard, id) =
        sandbox().run_detached(&[], "audit-fs-off", &[TOOLS_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    let out = harness::runtime(&["layers", &id])?;
    let l: Value = serde_json::from_str(&out.stdout).context(out.to_string())?;
    ensure!(
        l["fs_denied"]["active"] == false
            && l["fs_denied"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("kernel audit is disabled")),
        "layers\n{l:#}"
    );
    // The write is still refused (the layer is Landlock, not its report), and no record
    // pretends otherwise.
    let write = sandbox().run_ok(&["exec", &name, "sh", "-c", FS_DENIED_SCRIPT])?;
    ensure!(write.stdout.contains("rc=1"), "{write}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let raw = fs::read_to_string(log_path(PODMAN_ROOT, &id))?;
    ensure!(
        !raw.contains("\"fs_denied\""),
        "an fs_denied record with audit off\n{raw}"
    );
    Ok(())
}

#[test]
fn a_syscall_newer_than_the_policy_review_is_answered_enosys_and_recorded_with_its_errno()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    // The probe built with this tree (its `unreviewed_syscall` check may be newer than the
    // image's copy), bound over the image's.
    let probe = harness::runtime_bin().with_file_name("probe");
    harness::require_file(&probe)?;
    let bind = format!("{}:{}:ro", probe.display(), harness::PROBE);
    let (guard, id) = sandbox().run_detached(
        &[],
        "audit-unrev",
        &["-v", &bind, TOOLS_IMAGE, "sleep", "600"],
    )?;
    let name = guard.name.clone();
    // The filter's prologue answers every number past the reviewed table ENOSYS (not the
    // policy's EPERM); the supervisor gives the same answer and records it.
    let out = sandbox().run_ok(&["exec", &name, harness::PROBE, "unreviewed_syscall"])?;
    ensure!(
        out.stdout.contains("\"blocked\"") && out.stdout.contains("(os error 38)"),
        "syscall 1000 was not refused with ENOSYS\n{out}"
    );
    let keyctl = sandbox().run_ok(&["exec", &name, harness::PROBE, "keyctl"])?;
    denied_syscall_answered(&keyctl)?;
    let log = log_path(PODMAN_ROOT, &id);
    let raw = fs::read_to_string(&log)?;
    let denials = syscall_denials(&log)?;
    let unrev = denials
        .iter()
        .find(|r| r["data"]["nr"] == 1000)
        .context(format!("no syscall_denied record of syscall 1000\n{raw}"))?;
    ensure!(
        unrev["data"]["errno"] == 38
            && unrev["data"]["syscall"] == "syscall 1000"
            && unrev["data"]["comm"] == "probe",
        "{unrev}"
    );
    let add_key = denials
        .iter()
        .find(|r| r["data"]["syscall"] == "add_key")
        .context(format!("no syscall_denied record of add_key\n{raw}"))?;
    ensure!(add_key["data"]["errno"] == 1, "{add_key}");
    sandbox().run_ok(&["rm", "-f", &name])?;
    drop(guard);
    let v = verifies(&[], &id)?;
    ensure!(v.success(), "{v}");
    Ok(())
}

#[test]
fn rootless_fs_denied_is_reported_inactive_because_the_audit_log_needs_cap_audit_read()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Rootless, TOOLS_IMAGE)?;
    // Kernel audit on: the reason must be the rootless runtime, not a disabled audit.
    let _audit = KernelAudit::set(1)?;
    let rootless = Podman::new(User::Rootless, Runtime::AgentSandbox);
    let (guard, id) = rootless.run_detached(&[], "audit-fs-rl", &[TOOLS_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    // `layers` from inside the rootless user namespace, where the runtime keeps its state.
    let runtime = harness::runtime_bin().display().to_string();
    let layers = harness::run_ok(
        User::Rootless
            .podman()
            .args(["unshare", &runtime, "layers", &id]),
        DEFAULT_TIMEOUT,
    )?;
    let l: Value = serde_json::from_str(&layers.stdout).context(layers.to_string())?;
    ensure!(
        l["fs_denied"]["active"] == false
            && l["fs_denied"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("rootless") && r.contains("CAP_AUDIT_READ")),
        "layers\n{l:#}"
    );
    // Landlock still refuses the write: only its report is missing.
    let write = rootless.run_ok(&["exec", &name, "sh", "-c", FS_DENIED_SCRIPT])?;
    ensure!(write.stdout.contains("rc=1"), "{write}");
    Ok(())
}

/// The LSM lines of `layers` as this host's kernel must show them: Landlock at the kernel's
/// ABI (at most 10) with every right an older kernel lacks named with what covers it, and
/// AppArmor active with the policy's profile on the init exactly where the kernel has it.
fn check_lsm_layers(l: &Value) -> anyhow::Result<()> {
    let landlock = &l["landlock"];
    let kernel_abi = landlock["kernel_abi"].as_u64().unwrap_or(0);
    ensure!(
        landlock["abi"].as_u64() == Some(kernel_abi.min(10)),
        "landlock abi\n{l:#}"
    );
    let missing: Vec<&str> = landlock["missing"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["right"].as_str())
        .collect();
    let expected: Vec<&str> = [
        ("refer", 2),
        ("truncate", 3),
        ("tcp_connect", 4),
        ("ioctl_dev", 5),
        ("scope", 6),
        ("resolve_unix", 9),
        ("udp_send", 10),
    ]
    .iter()
    .filter(|(_, since)| kernel_abi < *since)
    .map(|(r, _)| *r)
    .collect();
    ensure!(
        missing == expected,
        "missing landlock rights {missing:?}, want {expected:?}\n{l:#}"
    );
    ensure!(
        landlock["missing"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|g| g["covered_by"].is_array()),
        "a missing landlock right is uncovered\n{l:#}"
    );
    let has_apparmor = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.starts_with('Y'));
    let apparmor = &l["apparmor"];
    if has_apparmor {
        let profile = apparmor["profile"].as_str().unwrap_or_default();
        ensure!(
            apparmor["active"] == true
                && profile.starts_with("agent-sandbox-")
                && apparmor["init_label"]
                    .as_str()
                    .is_some_and(|label| label == format!("{profile} (enforce)")),
            "apparmor is not active on the init\n{l:#}"
        );
    } else {
        ensure!(
            apparmor["active"] == false
                && apparmor["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("Landlock enforces")),
            "apparmor\n{l:#}"
        );
    }
    Ok(())
}
