//! Transparent egress (`network.transparent = true`) through real podman: tools that ignore
//! the proxy variables (`curl --noproxy '*'`, a raw socket client) reach an allowed name over
//! IPv4 and IPv6 through the sandbox's DNS stub and the redirect to the proxy; an unlisted
//! name fails to resolve at once and a raw address is refused, each with an audit record. The
//! same clients under runc with the host's network reach both servers and leave no record, so
//! the test can fail.

use std::path::Path;
use std::time::Duration;

use agent_sandbox_e2e::harness::{self, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, COLLECTOR_IP, HttpServer, REGISTRY_HOST, REGISTRY_IP,
};
use agent_sandbox_e2e::podman::{Podman, Runtime, policy_flag};
use anyhow::{Context, ensure};

/// An address no test server uses and no rule names (TEST-NET-3): a raw-address connection.
const RAW_IP: &str = "203.0.113.10";

/// A raw socket client: resolves with getaddrinfo (family FAMILY: 4, 6), connects, sends a GET
/// and prints the status line; prints the lookup time and the error otherwise.
const RAW_CLIENT: &str = r#"
import socket, sys, time
host, port, family, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
fam = {"4": socket.AF_INET, "6": socket.AF_INET6}[family]
t = time.time()
try:
    infos = socket.getaddrinfo(host, port, fam, socket.SOCK_STREAM)
except Exception as e:
    print("lookup-failed %s %.3f" % (type(e).__name__, time.time() - t))
    sys.exit(0)
print("lookup-ok %s %.3f" % (infos[0][4][0], time.time() - t))
try:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(infos[0][4])
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
    data = s.recv(4096)
    print("reply", data.split(b"\r\n")[0].decode(errors="replace") if data else "empty")
except Exception as e:
    print("connect-failed", type(e).__name__, e)
"#;

fn raw(host: &str, port: u16, family: &str, path: &str) -> String {
    format!("python3 -c '{RAW_CLIENT}' {host} {port} {family} {path} 2>&1")
}

/// One script with marked sections.
fn script(registry: &HttpServer, collector: &HttpServer) -> String {
    let (rp, cp) = (registry.port(), collector.port());
    [
        (
            "curl-allowed",
            format!("curl -sS -m 15 --noproxy '*' http://{REGISTRY_HOST}:{rp}/t-curl 2>&1"),
        ),
        (
            "curl-unlisted",
            format!(
                "curl -sS -m 15 --noproxy '*' http://{COLLECTOR_HOST}:{cp}/t-curl-unlisted 2>&1"
            ),
        ),
        ("raw-allowed-v4", raw(REGISTRY_HOST, rp, "4", "/t-raw4")),
        ("raw-allowed-v6", raw(REGISTRY_HOST, rp, "6", "/t-raw6")),
        (
            "raw-unlisted",
            raw(COLLECTOR_HOST, cp, "4", "/t-raw-unlisted"),
        ),
        ("raw-address", raw(RAW_IP, 80, "4", "/t-raw-address")),
    ]
    .iter()
    .map(|(name, cmd)| format!("echo '=== {name}'\n{cmd}\necho \"[exit $?]\""))
    .collect::<Vec<_>>()
    .join("\n")
}

fn section<'a>(out: &'a Output, name: &str) -> &'a str {
    let marker = format!("=== {name}\n");
    out.stdout
        .split_once(&marker)
        .map(|(_, rest)| rest.split("=== ").next().unwrap_or(rest))
        .unwrap_or("")
}

fn lookup_seconds(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("lookup-failed "))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
}

#[test]
fn proxy_unaware_tools_reach_allowed_names_only_and_every_attempt_is_recorded_but_runc_reaches_all()
-> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let registry = HttpServer::start(REGISTRY_IP, "registry-transparent-body")?;
    let collector = HttpServer::start(COLLECTOR_IP, "collector-transparent-body")?;
    let dir = harness::temp_dir_for(User::Root)?;
    let allow = vec![
        format!("{REGISTRY_HOST}:{}", registry.port()),
        // The test registry lives on loopback: the proxy dials it only when its address is named.
        format!("{REGISTRY_IP}:{}", registry.port()),
    ];
    let policy = net::write_policy(dir.path(), &allow, &[])?;
    let text = std::fs::read_to_string(&policy)?;
    std::fs::write(
        &policy,
        text.replacen("[network]\n", "[network]\ntransparent = true\n", 1),
    )?;

    let podman = Podman::new(User::Root, Runtime::AgentSandbox);
    // --no-hosts: the test names are in the host's /etc/hosts, which podman would copy in;
    // a real sandbox resolves them through DNS, which here is the stub.
    let (guard, id) = podman.run_detached(
        &["--runtime-flag", &policy_flag(&policy)],
        "transparent",
        &["--no-hosts", TOOLS_IMAGE, "sleep", "600"],
    )?;
    let out = podman.run(&[
        "exec",
        &guard.name,
        "sh",
        "-c",
        &script(&registry, &collector),
    ])?;
    drop(guard);

    let s = |n: &str| section(&out, n).to_owned();
    ensure!(
        s("curl-allowed").contains("registry-transparent-body"),
        "curl --noproxy should reach the allowed name\n{out}"
    );
    ensure!(
        s("curl-unlisted").contains("Could not resolve host"),
        "curl --noproxy should not resolve the unlisted name\n{out}"
    );
    for family in ["raw-allowed-v4", "raw-allowed-v6"] {
        ensure!(
            s(family).contains("reply HTTP/1.1 200"),
            "{family}: the raw client should reach the allowed name\n{out}"
        );
    }
    ensure!(
        s("raw-allowed-v4").contains("lookup-ok 198.18.")
            && s("raw-allowed-v6").contains("lookup-ok 100::"),
        "the stub should answer with stand-in addresses\n{out}"
    );
    let seconds = lookup_seconds(&s("raw-unlisted"))
        .with_context(|| format!("the unlisted lookup should fail\n{out}"))?;
    ensure!(seconds < 1.0, "the unlisted lookup took {seconds} s\n{out}");
    ensure!(
        s("raw-address").contains("connect-failed") || s("raw-address").contains("reply empty"),
        "a raw address should be refused\n{out}"
    );
    let got = registry.received();
    for path in ["/t-curl", "/t-raw4", "/t-raw6"] {
        ensure!(
            got.iter().any(|r| r.starts_with(&format!("GET {path} "))),
            "the registry did not get {path}: {got:?}"
        );
    }
    ensure!(
        collector.received().is_empty(),
        "the unlisted collector was reached: {:?}",
        collector.received()
    );

    let log = Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl"));
    let mut records = Vec::new();
    for _ in 0..50 {
        records = net::read_audit(&log)?;
        if records.iter().filter(|r| r["kind"] == "net").count() >= 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let net: Vec<_> = records.iter().filter(|r| r["kind"] == "net").collect();
    let allowed = net
        .iter()
        .filter(|r| r["data"]["verdict"] == "allow" && r["data"]["host"] == REGISTRY_HOST)
        .count();
    ensure!(
        allowed >= 3,
        "three allowed connections should be recorded: {net:#?}"
    );
    ensure!(
        net.iter().any(|r| r["data"]["verdict"] == "deny"
            && r["data"]["host"] == COLLECTOR_HOST
            && r["data"]["port"] == 53),
        "the refused lookup should be recorded: {net:#?}"
    );
    ensure!(
        net.iter().any(|r| r["data"]["verdict"] == "deny"
            && r["data"]["host"] == RAW_IP
            && r["data"]["port"] == 80
            && r["data"]["rule"] == "default deny"),
        "the raw-address connection should be recorded as refused: {net:#?}"
    );

    // The same clients under runc with the host's network: both servers are reached (the
    // unlisted one too) and nothing is recorded anywhere.
    let base =
        Podman::new(User::Root, Runtime::Runc).host_net_sh(&[], &script(&registry, &collector))?;
    let b = |n: &str| section(&base, n).to_owned();
    ensure!(
        b("curl-unlisted").contains("collector-transparent-body")
            && b("raw-unlisted").contains("reply HTTP/1.1 200"),
        "under runc the unlisted collector should be reached\n{base}"
    );
    ensure!(
        collector
            .received()
            .iter()
            .any(|r| r.starts_with("GET /t-raw-unlisted ")),
        "the collector did not get the runc client's request"
    );
    Ok(())
}
