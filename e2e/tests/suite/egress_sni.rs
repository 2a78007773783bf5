//! The TLS server name (SNI) of proxy tunnels, through real podman: a CONNECT to an allowed
//! host whose ClientHello names a host the policy does not allow is refused by default and
//! recorded; `network.sni_mismatch = "record"` lets it through and records the name. The same
//! client through a naive CONNECT proxy under runc reaches the foreign name and leaves no
//! record, so the test can fail.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use agent_sandbox_e2e::harness::{self, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{self, COLLECTOR_HOST, PyServer, REGISTRY_HOST, REGISTRY_IP, TestCa};
use agent_sandbox_e2e::podman::{Podman, Runtime, policy_flag};
use anyhow::{Context, bail, ensure};

const CA_DIR: &str = "/etc/agent-sandbox-test";
const CA_FILE: &str = "/etc/agent-sandbox-test/ca.pem";

/// A client that opens `CONNECT TARGET` through PROXY itself, then speaks TLS inside the tunnel
/// naming SNI (trusting CA) and GETs PATH: what a tool fronting through an allowed host does.
const FRONTING_CLIENT: &str = r#"
import socket, ssl, sys
proxy, target, sni, ca, path = sys.argv[1:6]
host, port = proxy.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=20)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c:
        break
    head += c
print("connect:", head.split(b"\r\n")[0].decode(errors="replace"))
try:
    t = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname=sni)
    t.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, sni)).encode())
    data = b""
    while True:
        d = t.recv(4096)
        if not d:
            break
        data += d
    print("body:", data.decode(errors="replace").split("\r\n\r\n", 1)[-1])
except Exception as e:
    print("tls-error:", e)
"#;

/// A naive CONNECT proxy (what a sandbox without the SNI check amounts to): dials the target
/// and relays, reading nothing. Prints its port.
const NAIVE_PROXY: &str = r#"
import socket, threading
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(16)
print(l.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except Exception:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except Exception:
        pass
def handle(c):
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(1)
        if not d:
            return
        head += d
    host, port = head.split(b" ")[1].decode().rsplit(":", 1)
    u = socket.create_connection((host, int(port)))
    c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    pipe(c, u)
while True:
    c, _ = l.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
"#;

/// The naive proxy's process; killed on drop.
struct NaiveProxy {
    port: u16,
    child: std::process::Child,
}

impl NaiveProxy {
    fn start() -> anyhow::Result<Self> {
        harness::require_tool("python3")?;
        let mut child = std::process::Command::new("python3")
            .args(["-c", NAIVE_PROXY])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("cannot start the naive proxy")?;
        let stdout = child.stdout.take().context("no naive proxy stdout")?;
        let mut first = String::new();
        std::io::BufReader::new(stdout).read_line(&mut first)?;
        let Ok(port) = first.trim().parse() else {
            let _ = child.kill();
            bail!("the naive proxy did not start ({first:?})");
        };
        Ok(Self { port, child })
    }
}

impl Drop for NaiveProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The scenario: an HTTPS server on the registry's address whose certificate also names the
/// collector (so a fronted handshake succeeds wherever it is let through), and a policy that
/// allows only the registry, with `extra` lines added to `[network]`.
struct World {
    ca: TestCa,
    server: PyServer,
    policy: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl World {
    fn start(extra: &str) -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        let ca = TestCa::generate(&[REGISTRY_HOST, COLLECTOR_HOST])?;
        let server = PyServer::https(REGISTRY_IP, &ca, "fronted-body")?;
        let dir = harness::temp_dir_for(User::Root)?;
        // The test server lives on loopback: the proxy dials it only when its address is named.
        let allow = vec![
            format!("{REGISTRY_HOST}:{}", server.port()),
            format!("{REGISTRY_IP}:{}", server.port()),
        ];
        let policy = net::write_policy(dir.path(), &allow, &[])?;
        let text = std::fs::read_to_string(&policy)?;
        std::fs::write(
            &policy,
            text.replacen("[network]\n", &format!("[network]\n{extra}"), 1),
        )?;
        Ok(Self {
            ca,
            server,
            policy,
            _dir: dir,
        })
    }

    /// `python3 FRONTING_CLIENT PROXY registry:PORT SNI CA PATH` as shell text.
    fn client(&self, proxy: &str, sni: &str, path: &str) -> String {
        format!(
            "python3 -c '{FRONTING_CLIENT}' {proxy} {REGISTRY_HOST}:{port} {sni} {CA_FILE} {path} 2>&1",
            port = self.server.port()
        )
    }

    /// Whether the HTTPS server answered a request for `path`.
    fn served(&self, path: &str) -> bool {
        self.server
            .requests()
            .iter()
            .any(|r| r.starts_with(&format!("REQ GET {path} ")))
    }

    /// Runs `script` in a detached sandbox under the world's policy; returns the output and
    /// the sandbox's audit records.
    fn in_sandbox(
        &self,
        stem: &str,
        script: &str,
    ) -> anyhow::Result<(Output, Vec<serde_json::Value>, String)> {
        harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
        let podman = Podman::new(User::Root, Runtime::AgentSandbox);
        let (guard, id) = podman.run_detached(
            &["--runtime-flag", &policy_flag(&self.policy)],
            stem,
            &[
                "-v",
                &format!("{}:{CA_DIR}:ro", self.ca.trust_dir().display()),
                TOOLS_IMAGE,
                "sleep",
                "600",
            ],
        )?;
        let out = podman.run(&["exec", &guard.name, "sh", "-c", script])?;
        drop(guard);
        let log = Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl"));
        // The proxy's writer thread appends records shortly after each connection ends.
        let mut records = Vec::new();
        for _ in 0..50 {
            records = net::read_audit(&log)?;
            if records.iter().any(|r| r["kind"] == "net") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok((out, records, id))
    }
}

/// The `net` records of a log.
fn net_records(records: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    records.iter().filter(|r| r["kind"] == "net").collect()
}

const SANDBOX_PROXY: &str = "${HTTPS_PROXY#http://}";

#[test]
fn connect_with_a_foreign_sni_is_refused_and_recorded_but_a_naive_proxy_delivers_it()
-> anyhow::Result<()> {
    let w = World::start("")?;
    let script = format!(
        "echo '=== fronted'; {}; echo '=== curl'; \
         curl -sS -m 20 --cacert {CA_FILE} --connect-to {COLLECTOR_HOST}:{port}:{REGISTRY_HOST}:{port} \
         https://{COLLECTOR_HOST}:{port}/curl-fronted 2>&1; echo rc=$?; echo '=== same'; {}",
        w.client(SANDBOX_PROXY, COLLECTOR_HOST, "/fronted"),
        w.client(SANDBOX_PROXY, REGISTRY_HOST, "/same-name"),
        port = w.server.port()
    );
    let (out, records, _) = w.in_sandbox("sni-deny", &script)?;
    let text = &out.stdout;
    ensure!(
        text.contains("connect: HTTP/1.1 200") && text.contains("tls-error:"),
        "the fronted handshake should be cut after the 200\n{out}"
    );
    ensure!(
        text.contains("alert access denied") && text.contains("rc=35"),
        "the tools should report the TLS access_denied alert\n{out}"
    );
    ensure!(
        !w.served("/fronted") && !w.served("/curl-fronted"),
        "a fronted request reached the server: {:?}\n{out}",
        w.server.requests()
    );
    ensure!(
        text.contains("body: fronted-body") && w.served("/same-name"),
        "the same client naming the tunnel's host should be served\n{out}"
    );
    let net = net_records(&records);
    let refused: Vec<_> = net
        .iter()
        .filter(|r| r["data"]["sni"] == COLLECTOR_HOST)
        .collect();
    ensure!(
        refused.len() == 2
            && refused.iter().all(|r| r["data"]["verdict"] == "deny"
                && r["data"]["rule"] == "sni mismatch"
                && r["data"]["host"] == REGISTRY_HOST),
        "expected two denied records naming the foreign SNI: {net:#?}"
    );
    ensure!(
        net.iter()
            .any(|r| r["data"]["sni"] == REGISTRY_HOST && r["data"]["verdict"] == "allow"),
        "the matching tunnel should be recorded with its SNI: {net:#?}"
    );

    // The same client through a naive proxy under runc: the foreign name is served, and no
    // record exists anywhere but the server's own log.
    let naive = NaiveProxy::start()?;
    let base = Podman::new(User::Root, Runtime::Runc).host_net_sh(
        &["-v", &format!("{}:{CA_DIR}:ro", w.ca.trust_dir().display())],
        &w.client(
            &format!("127.0.0.1:{}", naive.port),
            COLLECTOR_HOST,
            "/naive-fronted",
        ),
    )?;
    ensure!(
        base.stdout.contains("body: fronted-body") && w.served("/naive-fronted"),
        "the fronted request should pass a naive proxy under runc\n{base}"
    );
    Ok(())
}

#[test]
fn sni_mismatch_record_lets_the_tunnel_through_and_records_the_name() -> anyhow::Result<()> {
    let w = World::start("sni_mismatch = \"record\"\n")?;
    let script = w.client(SANDBOX_PROXY, COLLECTOR_HOST, "/recorded");
    let (out, records, id) = w.in_sandbox("sni-record", &script)?;
    ensure!(
        out.stdout.contains("body: fronted-body") && w.served("/recorded"),
        "under record the fronted request should pass\n{out}"
    );
    let net = net_records(&records);
    ensure!(
        net.iter().any(|r| r["data"]["sni"] == COLLECTOR_HOST
            && r["data"]["verdict"] == "allow"
            && r["data"]["host"] == REGISTRY_HOST),
        "the passed tunnel should be recorded with the foreign SNI: {net:#?}"
    );
    // The timeline marks the name as not the host's.
    let timeline = harness::run(
        std::process::Command::new(harness::runtime_bin()).args([
            "--root",
            "/run/agent-sandbox",
            "audit",
            &id,
        ]),
        Duration::from_secs(30),
    )?;
    ensure!(
        timeline
            .stdout
            .contains(&format!("sni {COLLECTOR_HOST} (not the host)")),
        "the timeline should show the foreign SNI\n{timeline}"
    );
    Ok(())
}
