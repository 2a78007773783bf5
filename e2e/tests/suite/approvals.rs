//! Approvals (docs/egress.md, "Approvals"): a connection to an unlisted host within the
//! policy's `network.approvals.ceiling` is held while the test's own decider (a small server
//! on a Unix socket) is asked, and its answer is applied; `agent-sandbox allow`/`deny` change
//! a running sandbox's list. Real podman with the real runtime; the "internet" is the test's
//! own HTTP servers on the loopback names of `hack/test-hosts.sh`. Every refusal is paired
//! with the same request going through once the decider (or the ceiling) lets it, so each
//! test can fail.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox_e2e::harness::{self, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, DENIED_HEADER, HttpServer, INTERNAL_HOST, INTERNAL_IP, METADATA_HOST,
    METADATA_IP, PKG_APEX, REGISTRY_HOST, REGISTRY_IP,
};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag};
use anyhow::{Context, ensure};
use serde_json::Value;

const TOOL_CALL_HEADER: &str = "X-Agent-Sandbox-Tool-Call";

fn sandbox() -> Podman {
    Podman::new(User::Root, Runtime::AgentSandbox)
}

/// What the decider answers to question number `n` (0-based): `None` holds the connection
/// open without answering.
type Answerer = dyn Fn(usize, &Value) -> Option<String> + Send + Sync;

/// The test's decider: a Unix socket server speaking the documented protocol (one JSON
/// question, one JSON answer per connection), recording every question.
pub(super) struct Decider {
    pub(super) path: PathBuf,
    questions: Arc<Mutex<Vec<Value>>>,
    _dir: tempfile::TempDir,
}

impl Decider {
    pub(super) fn start(
        answer: impl Fn(usize, &Value) -> Option<String> + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("decider.sock");
        let listener = UnixListener::bind(&path)?;
        let questions = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&questions);
        let answer: Arc<Answerer> = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, answer) = (Arc::clone(&seen), Arc::clone(&answer));
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut text = Vec::new();
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let _ = (&mut stream).take(65536).read_to_end(&mut text);
                    let question: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
                    let n = {
                        let mut q = seen.lock().unwrap_or_else(|e| e.into_inner());
                        q.push(question.clone());
                        q.len() - 1
                    };
                    match answer(n, &question) {
                        Some(reply) => {
                            let _ = stream.write_all(reply.as_bytes());
                        }
                        // Hold the connection well past any timeout the tests set.
                        None => std::thread::sleep(Duration::from_secs(30)),
                    }
                });
            }
        });
        Ok(Self {
            path,
            questions,
            _dir: dir,
        })
    }

    pub(super) fn questions(&self) -> Vec<Value> {
        self.questions.lock().map(|q| q.clone()).unwrap_or_default()
    }
}

pub(super) fn reply(answer: &str, reason: Option<&str>) -> Option<String> {
    Some(match reason {
        Some(r) => serde_json::json!({"answer": answer, "reason": r}).to_string(),
        None => serde_json::json!({"answer": answer}).to_string(),
    })
}

/// A policy file: the agent profile allowing nothing the tests use, with `approvals` (TOML
/// body of `[network.approvals]`) appended.
struct Policy {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

fn policy(approvals: &str) -> anyhow::Result<Policy> {
    net::ensure_test_hosts()?;
    let dir = harness::temp_dir_for(User::Root)?;
    // `proxy` mode needs one allow rule: a port nothing here listens on.
    let path = net::write_policy(dir.path(), &[format!("{PKG_APEX}:1")], &[])?;
    let mut text = std::fs::read_to_string(&path)?;
    text.push_str("\n[network.approvals]\n");
    text.push_str(approvals);
    std::fs::write(&path, text)?;
    Ok(Policy { path, _dir: dir })
}

fn toml_list(rules: &[String]) -> String {
    let quoted: Vec<String> = rules.iter().map(|r| format!("{r:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The policy of a sandbox whose approvals ask `decider` about hosts within `ceiling`, with
/// `settings` (TOML lines of `[network.approvals]`, each ending in a newline) in between.
fn decider_policy(decider: &Decider, settings: &str, ceiling: &[String]) -> anyhow::Result<Policy> {
    policy(&format!(
        "decider = {:?}\n{settings}ceiling = {}\n",
        decider.path.display().to_string(),
        toml_list(ceiling)
    ))
}

/// `server`'s name and address on its port: what a ceiling lists to let it be approved.
fn registry_ceiling(server: &HttpServer) -> Vec<String> {
    vec![
        format!("{REGISTRY_HOST}:{}", server.port()),
        format!("{REGISTRY_IP}:{}", server.port()),
    ]
}

/// Starts a detached sandbox sleeping; returns its guard and full container id.
fn detached(policy: &Path, stem: &str) -> anyhow::Result<(ContainerGuard, String)> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    sandbox().run_detached(
        &["--runtime-flag", &policy_flag(policy)],
        stem,
        &[TOOLS_IMAGE, "sleep", "600"],
    )
}

fn exec(guard: &ContainerGuard, script: &str) -> anyhow::Result<Output> {
    sandbox().run(&["exec", &guard.name, "sh", "-c", script])
}

fn url(host: &str, server: &HttpServer, path: &str) -> String {
    format!("http://{host}:{}{path}", server.port())
}

/// The sandbox's audit records of `kind`, waiting a little for the proxy's writer.
fn audit_records(id: &str, kind: &str, at_least: usize) -> anyhow::Result<Vec<Value>> {
    let log = Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl"));
    let start = std::time::Instant::now();
    loop {
        let records: Vec<Value> = net::read_audit(&log)?
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect();
        if records.len() >= at_least || start.elapsed() > Duration::from_secs(5) {
            return Ok(records);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `agent-sandbox ARGS` on the host as `user`.
fn runtime_cli(user: User, args: &[&str]) -> anyhow::Result<Output> {
    let bin = harness::runtime_bin();
    let mut cmd = user.command(&bin.display().to_string());
    if user == User::Rootless {
        // The rootless user aims at root's sandboxes on purpose.
        cmd.args(["--root", "/run/agent-sandbox"]);
    }
    cmd.args(args);
    harness::run(&mut cmd, Duration::from_secs(30))
}

/// Held, approved once (asked again next time), then approved for life (not asked again);
/// the decider gets host, port, sandbox id and the tool call the header claims (only as
/// claimed: the exec named none), which never reaches the server.
#[test]
fn held_request_is_approved_once_then_for_life_and_the_decider_sees_the_tool_call()
-> anyhow::Result<()> {
    let server = HttpServer::start(REGISTRY_IP, "registry-approved")?;
    let decider = Decider::start(|n, _| {
        // Hold the first question a moment: the request waits for the answer.
        std::thread::sleep(Duration::from_millis(300));
        match n {
            0 => reply("allow-once", Some("first look")),
            1 => reply("allow-always", None),
            _ => reply("deny", Some("asked a third time")),
        }
    })?;
    let p = decider_policy(&decider, "timeout = \"20s\"\n", &registry_ceiling(&server))?;
    let (guard, id) = detached(&p.path, "happr-once")?;
    let fetch = |n: u32| {
        format!(
            "curl -sS -m 30 -H '{TOOL_CALL_HEADER}: toolu_happr_{n}' {}; echo \" rc=$?\"",
            url(REGISTRY_HOST, &server, &format!("/n{n}"))
        )
    };
    let out = exec(&guard, &format!("{}; {}; {}", fetch(1), fetch(2), fetch(3)))?;
    ensure!(
        out.stdout.matches("registry-approved rc=0").count() == 3,
        "every request should be let through\n{out}"
    );
    let questions = decider.questions();
    ensure!(
        questions.len() == 2,
        "the decider should be asked twice (once, then always), not {}: {questions:?}\n{out}",
        questions.len()
    );
    for (i, q) in questions.iter().enumerate() {
        ensure!(
            q["sandbox"] == id.as_str()
                && q["host"] == REGISTRY_HOST
                && q["port"] == server.port()
                && q["protocol"] == "http-forward"
                && q["tool_call_id"].is_null()
                && q["tool_call_claimed"] == format!("toolu_happr_{}", i + 1).as_str(),
            "question {i} lacks the sandbox, host, port or tool call: {q}"
        );
    }
    let received = server.received();
    ensure!(received.len() == 3, "the server got {received:?}");
    ensure!(
        !received.iter().any(|r| r
            .to_ascii_lowercase()
            .contains(&TOOL_CALL_HEADER.to_ascii_lowercase())),
        "the tool-call header reached the server: {received:?}"
    );
    let approvals = audit_records(&id, "approval", 2)?;
    let answers: Vec<(&str, &str, &str)> = approvals
        .iter()
        .map(|r| {
            (
                r["data"]["answer"].as_str().unwrap_or(""),
                r["data"]["by"].as_str().unwrap_or(""),
                r["data"]["tool_call_claimed"].as_str().unwrap_or(""),
            )
        })
        .collect();
    ensure!(
        answers
            == [
                ("allow-once", "decider", "toolu_happr_1"),
                ("allow-always", "decider", "toolu_happr_2")
            ],
        "approval records: {approvals:?}"
    );
    let nets = audit_records(&id, "net", 3)?;
    let rules: Vec<&str> = nets
        .iter()
        .map(|r| r["data"]["rule"].as_str().unwrap_or(""))
        .collect();
    ensure!(
        rules.first() == Some(&"allowed once by decider: first look")
            && rules.get(1) == Some(&"allowed always by decider")
            && rules.get(2).is_some_and(|r| r.ends_with("(decider)")),
        "net records: {rules:?}"
    );
    Ok(())
}

/// A decider's refusal reaches the tool with its reason (plain HTTP body and the CONNECT
/// answer's denial header); the same host goes through when the decider then allows it.
#[test]
fn decider_refusal_shows_its_reason_to_curl_and_an_allow_reaches_the_server() -> anyhow::Result<()>
{
    let server = HttpServer::start(REGISTRY_IP, "registry-after-deny")?;
    let decider = Decider::start(|n, _| match n {
        0 | 1 => reply("deny", Some("not needed for this task")),
        _ => reply("allow-once", None),
    })?;
    let p = decider_policy(&decider, "", &registry_ceiling(&server))?;
    let (guard, _id) = detached(&p.path, "happr-deny")?;
    let https = format!("https://{REGISTRY_HOST}:{}/", server.port());
    let script = format!(
        "curl -sS -i -m 20 {plain}; echo rc=$?; echo =====; curl -sS -v -m 20 {https} 2>&1; echo rc=$?; echo =====; curl -sS -m 20 {plain}; echo \" rc=$?\"",
        plain = url(REGISTRY_HOST, &server, "/x"),
    );
    let out = exec(&guard, &script)?;
    let parts: Vec<&str> = out.stdout.split("=====").collect();
    ensure!(parts.len() == 3, "missing sections\n{out}");
    ensure!(
        parts[0].contains(" 403 ")
            && parts[0].contains(&format!(
                "{DENIED_HEADER}: denied by decider: not needed for this task"
            ))
            && parts[0].contains("not needed for this task\""),
        "the plain refusal should carry the decider's reason\n{out}"
    );
    ensure!(
        parts[1].contains("< HTTP/1.1 403 Forbidden by agent-sandbox policy")
            && parts[1].contains(&format!(
                "< {DENIED_HEADER}: denied by decider: not needed for this task"
            ))
            && !parts[1].contains("rc=0"),
        "the CONNECT refusal should carry the decider's reason\n{out}"
    );
    ensure!(
        parts[2].contains("registry-after-deny rc=0"),
        "the allowed request should reach the server\n{out}"
    );
    ensure!(
        server.received().len() == 1,
        "only the allowed request may reach the server: {:?}",
        server.received()
    );
    ensure!(decider.questions().len() == 3, "{:?}", decider.questions());
    Ok(())
}

/// A decider that does not answer within the timeout gets the policy's default: `deny`
/// (the tool is told why) or, in the paired run, `allow-once` (the server is reached).
#[test]
fn silent_decider_gets_the_default_answer_deny_or_allow_once() -> anyhow::Result<()> {
    let server = HttpServer::start(REGISTRY_IP, "registry-by-default")?;
    let decider = Decider::start(|_, _| None)?;
    let ceiling = registry_ceiling(&server);
    let fetch = format!(
        "curl -sS -i -m 20 {}; echo rc=$?",
        url(REGISTRY_HOST, &server, "/t")
    );
    for (default, reached) in [("deny", false), ("allow-once", true)] {
        let settings = format!("timeout = \"1s\"\ndefault = \"{default}\"\n");
        let p = decider_policy(&decider, &settings, &ceiling)?;
        let before = server.received().len();
        let (guard, id) = detached(&p.path, "happr-silent")?;
        let out = exec(&guard, &fetch)?;
        ensure!(
            out.elapsed >= Duration::from_secs(1) && out.elapsed < Duration::from_secs(15),
            "the request should be held about the timeout ({:?})\n{out}",
            out.elapsed
        );
        let got = server.received().len() - before;
        if reached {
            ensure!(
                out.stdout.contains("registry-by-default") && got == 1,
                "default allow-once should let the request through\n{out}"
            );
        } else {
            ensure!(
                out.stdout.contains(" 403 ")
                    && out.stdout.contains(&format!(
                        "{DENIED_HEADER}: denied by default answer: decider did not answer within 1s"
                    ))
                    && got == 0,
                "default deny should refuse with the cause\n{out}"
            );
        }
        let records = audit_records(&id, "approval", 1)?;
        ensure!(
            records.iter().any(|r| r["data"]["by"] == "default"
                && r["data"]["answer"] == default
                && r["data"]["reason"]
                    .as_str()
                    .is_some_and(|t| t.contains("did not answer"))),
            "no default approval record: {records:?}"
        );
    }
    Ok(())
}

/// `agent-sandbox allow` opens a host for a running sandbox, `deny` closes it again, an
/// `allow` outside the ceiling is refused (and changes nothing), and a host user other than
/// the proxy's (root) cannot use the control socket. No socket is visible inside.
#[test]
fn allow_and_deny_change_a_running_sandbox_within_the_ceiling() -> anyhow::Result<()> {
    let server = HttpServer::start(REGISTRY_IP, "registry-allowed-live")?;
    let collector = HttpServer::start(net::COLLECTOR_IP, "collected")?;
    let ceiling = registry_ceiling(&server);
    let rule = ceiling[0].clone();
    let p = policy(&format!("ceiling = {}\n", toml_list(&ceiling)))?;
    let (guard, id) = detached(&p.path, "happr-cmd")?;
    let fetch = format!(
        "curl -sS -i -m 20 {}; echo rc=$?",
        url(REGISTRY_HOST, &server, "/live")
    );
    let denied = |out: &Output, rule_text: &str| {
        out.stdout.contains(" 403 ")
            && out
                .stdout
                .contains(&format!("{DENIED_HEADER}: {rule_text}"))
    };

    let out = exec(&guard, &fetch)?;
    ensure!(denied(&out, "default deny"), "unlisted before allow\n{out}");

    // The rootless test user cannot reach root's control socket.
    let other = runtime_cli(User::Rootless, &["allow", &id, &rule])?;
    ensure!(
        !other.success(),
        "a non-root host user changed the allowlist\n{other}"
    );
    let out = exec(&guard, &fetch)?;
    ensure!(
        denied(&out, "default deny"),
        "still unlisted after the refused allow\n{out}"
    );

    let allowed = runtime_cli(User::Root, &["allow", &id, &rule])?;
    ensure!(allowed.success(), "allow failed\n{allowed}");
    let out = exec(&guard, &fetch)?;
    ensure!(
        out.stdout.contains("registry-allowed-live"),
        "allowed host not reached after allow\n{out}"
    );

    let refused = runtime_cli(
        User::Root,
        &[
            "allow",
            &id,
            &format!("{COLLECTOR_HOST}:{}", collector.port()),
        ],
    )?;
    ensure!(
        !refused.success()
            && refused.stderr.contains("network.approvals.ceiling")
            && refused.stderr.contains("docs/egress.md"),
        "allow outside the ceiling should be refused naming the ceiling and the docs\n{refused}"
    );
    let out = exec(
        &guard,
        &format!(
            "curl -sS -i -m 20 {}; echo rc=$?",
            url(COLLECTOR_HOST, &collector, "/")
        ),
    )?;
    ensure!(
        denied(&out, "default deny") && collector.received().is_empty(),
        "the host outside the ceiling must stay refused\n{out}"
    );

    let denied_cmd = runtime_cli(User::Root, &["deny", &id, &rule])?;
    ensure!(denied_cmd.success(), "deny failed\n{denied_cmd}");
    let out = exec(&guard, &fetch)?;
    ensure!(
        denied(&out, &format!("deny {rule} (agent-sandbox deny)")),
        "denied host still reached after deny\n{out}"
    );
    ensure!(server.received().len() == 1, "{:?}", server.received());

    let inside = exec(
        &guard,
        "find / -xdev -name 'egress.sock' 2>/dev/null | wc -l",
    )?;
    ensure!(
        inside.stdout.trim() == "0",
        "the control socket is visible inside\n{inside}"
    );

    let records = audit_records(&id, "approval", 2)?;
    let changes: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["data"]["by"] == "command")
        .map(|r| {
            (
                r["data"]["answer"].as_str().unwrap_or(""),
                r["data"]["target"].as_str().unwrap_or(""),
            )
        })
        .collect();
    ensure!(
        changes == [("allow-always", rule.as_str()), ("deny", rule.as_str())],
        "audit should record exactly the applied allow and deny: {records:?}"
    );
    Ok(())
}

/// A decider that allows everything cannot open a loopback/private or metadata address: the
/// proxy's address check still refuses them. The paired run lists the exact addresses in
/// the ceiling: the private server is reached and the metadata address is dialled (the
/// address check passed; nothing listens there on this host).
#[test]
fn decider_allowing_private_or_metadata_addresses_is_still_refused() -> anyhow::Result<()> {
    let internal = HttpServer::start(INTERNAL_IP, "internal-secret")?;
    let decider = Decider::start(|_, _| reply("allow-once", Some("anything goes")))?;
    let port = internal.port();
    let names = vec![
        format!("{INTERNAL_HOST}:{port}"),
        format!("{METADATA_HOST}:{port}"),
    ];
    let mut with_ips = names.clone();
    with_ips.push(format!("{INTERNAL_IP}:{port}"));
    with_ips.push(format!("{METADATA_IP}:{port}"));
    let script = format!(
        "curl -sS -i -m 30 http://{INTERNAL_HOST}:{port}/; echo rc=$?; echo =====; curl -sS -i -m 30 http://{METADATA_HOST}:{port}/latest/meta-data/; echo rc=$?"
    );
    for (ceiling, opened) in [(names, false), (with_ips, true)] {
        let p = decider_policy(&decider, "", &ceiling)?;
        let before = internal.received().len();
        let (guard, _id) = detached(&p.path, "happr-special")?;
        let out = exec(&guard, &script)?;
        let (private, metadata) = out
            .stdout
            .split_once("=====")
            .with_context(|| format!("no separator\n{out}"))?;
        let got = internal.received().len() - before;
        if opened {
            ensure!(
                private.contains("internal-secret") && got == 1,
                "with the address in the ceiling the private server should be reached\n{out}"
            );
            ensure!(
                !metadata.contains(&format!("{DENIED_HEADER}:")),
                "with the address in the ceiling the metadata address should pass the check\n{out}"
            );
        } else {
            ensure!(
                private.contains(" 403 ")
                    && private
                        .contains(&format!("{DENIED_HEADER}: loopback address {INTERNAL_IP}"))
                    && got == 0,
                "an approved name on a private address must be refused\n{out}"
            );
            ensure!(
                metadata.contains(" 403 ")
                    && metadata.contains(&format!(
                        "{DENIED_HEADER}: cloud-metadata address {METADATA_IP}"
                    )),
                "an approved name on the metadata address must be refused\n{out}"
            );
        }
    }
    ensure!(
        decider.questions().len() == 4,
        "the decider should have been asked (and allowed) every time: {:?}",
        decider.questions()
    );
    Ok(())
}

/// The same approval flow through containerd (`ctr` with our shim): the decider's refusal
/// reaches curl with its reason, and its allow-once lets the next request through.
#[test]
fn ctr_decider_refusal_reaches_curl_and_its_allow_reaches_the_server() -> anyhow::Result<()> {
    use agent_sandbox_e2e::ctr::{self, Shim};
    ctr::require_containerd()?;
    let server = HttpServer::start(REGISTRY_IP, "registry-via-ctr")?;
    let decider = Decider::start(|n, _| match n {
        0 => reply("deny", Some("ask the operator")),
        _ => reply("allow-once", None),
    })?;
    let p = decider_policy(&decider, "", &registry_ceiling(&server))?;
    let config = p._dir.path().join("runtime-config.toml");
    std::fs::write(
        &config,
        format!("Policy = {:?}\n", p.path.display().to_string()),
    )?;
    let id = ctr::unique_id("happr-ctr");
    let fetch = format!(
        "curl -sS -i -m 20 {}; echo rc=$?",
        url(REGISTRY_HOST, &server, "/c")
    );
    let out = ctr::run_rm(
        Shim::AgentSandbox,
        &["--runtime-config-path", &config.display().to_string()],
        TOOLS_IMAGE,
        &id,
        &["sh", "-c", &format!("{fetch}; echo =====; {fetch}")],
    )?;
    let (denied, allowed) = out
        .stdout
        .split_once("=====")
        .with_context(|| format!("no separator\n{out}"))?;
    ensure!(
        denied.contains(" 403 ")
            && denied.contains(&format!(
                "{DENIED_HEADER}: denied by decider: ask the operator"
            )),
        "the decider's refusal should reach curl\n{out}"
    );
    ensure!(
        allowed.contains("registry-via-ctr") && server.received().len() == 1,
        "the allowed request should reach the server once\n{out}"
    );
    let questions = decider.questions();
    ensure!(
        questions.len() == 2 && questions.iter().all(|q| q["sandbox"] == id.as_str()),
        "the decider should be asked twice about sandbox {id}: {questions:?}"
    );
    Ok(())
}
