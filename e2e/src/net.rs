//! Network helpers for the egress and audit suites: the tests' own "internet"
//! (HTTP and UDP servers on the loopback names of `hack/test-hosts.sh`), policy
//! files built from `profiles/agent.toml`, and the sandbox's proxy processes.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::harness::{self, DEFAULT_TIMEOUT};

/// The allowed test registry's name and address (`hack/test-hosts.sh`).
pub const REGISTRY_HOST: &str = "registry.agent-sandbox.test";
pub const REGISTRY_IP: &str = "127.0.0.2";
/// The exfiltration collector's name and address.
pub const COLLECTOR_HOST: &str = "collector.agent-sandbox.test";
pub const COLLECTOR_IP: &str = "127.0.0.3";
/// The wildcard zone: `*.pkg.agent-sandbox.test` rules, its apex, an allowed mirror and a
/// subdomain a deny rule carves out, all on one address.
pub const PKG_APEX: &str = "pkg.agent-sandbox.test";
pub const PKG_MIRROR: &str = "mirror.pkg.agent-sandbox.test";
pub const PKG_SECRET: &str = "secret.pkg.agent-sandbox.test";
pub const PKG_IP: &str = "127.0.0.4";
/// A name on loopback that policies allow by name only (so the address guard refuses it).
pub const INTERNAL_HOST: &str = "internal.agent-sandbox.test";
pub const INTERNAL_IP: &str = "127.0.0.5";
/// A name that resolves to the cloud metadata address.
pub const METADATA_HOST: &str = "metadata.agent-sandbox.test";
pub const METADATA_IP: &str = "169.254.169.254";
/// The header the proxy names a refusal in.
pub const DENIED_HEADER: &str = "X-Agent-Sandbox-Denied";
/// The env var that tags an exec with the agent's tool-call id.
pub const TOOL_CALL_ENV: &str = "AGENT_SANDBOX_TOOL_CALL_ID";

/// The repository root (the e2e crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Adds the test names to /etc/hosts (idempotent) and checks they are there.
pub fn ensure_test_hosts() -> anyhow::Result<()> {
    let script = repo_root().join("hack/test-hosts.sh");
    harness::require_file(&script)?;
    harness::run_ok(
        std::process::Command::new("bash").arg(&script),
        DEFAULT_TIMEOUT,
    )?;
    let hosts = fs::read_to_string("/etc/hosts").context("cannot read /etc/hosts")?;
    for name in [
        REGISTRY_HOST,
        COLLECTOR_HOST,
        PKG_APEX,
        PKG_MIRROR,
        PKG_SECRET,
        INTERNAL_HOST,
        METADATA_HOST,
    ] {
        if !hosts.contains(name) {
            bail!("/etc/hosts has no {name} after hack/test-hosts.sh");
        }
    }
    Ok(())
}

/// A plain HTTP server on `ip`, on a port of its own, that answers every
/// request with `200` and a fixed body and keeps every request it received.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub body: String,
    received: Arc<Mutex<Vec<String>>>,
}

impl HttpServer {
    /// Binds `ip:0` (the kernel picks a free port, so parallel tests never
    /// collide) and serves on a background thread for the rest of the process.
    pub fn start(ip: &str, body: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((ip, 0)).with_context(|| format!("cannot bind {ip}:0"))?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let (seen, answer) = (Arc::clone(&received), body.to_owned());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, answer) = (Arc::clone(&seen), answer.clone());
                thread::spawn(move || serve_one(stream, &seen, &answer));
            }
        });
        Ok(Self {
            addr,
            body: body.to_owned(),
            received,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request (head and body, lossy UTF-8) received so far.
    pub fn received(&self) -> Vec<String> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Reads one request and answers it. The test server only needs the head and a
/// `Content-Length` body of requests curl sends, so a few lines of reading do;
/// the code under test (the proxy) uses a real HTTP library.
fn serve_one(mut stream: TcpStream, seen: &Mutex<Vec<String>>, body: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        data.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&data);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                break;
            }
        }
    }
    if let Ok(mut r) = seen.lock() {
        r.push(String::from_utf8_lossy(&data).into_owned());
    }
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A UDP server on `ip` that echoes every datagram and keeps count (a stand-in
/// for a DNS resolver the sandbox must not reach).
pub struct UdpEcho {
    pub addr: SocketAddr,
    received: Arc<Mutex<usize>>,
}

impl UdpEcho {
    pub fn start(ip: &str) -> anyhow::Result<Self> {
        let socket = UdpSocket::bind((ip, 0)).with_context(|| format!("cannot bind udp {ip}:0"))?;
        let addr = socket.local_addr()?;
        let received = Arc::new(Mutex::new(0));
        let seen = Arc::clone(&received);
        thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if let Ok(mut c) = seen.lock() {
                    *c += 1;
                }
                let _ = socket.send_to(&buf[..n], from);
            }
        });
        Ok(Self { addr, received })
    }

    pub fn received(&self) -> usize {
        self.received.lock().map(|c| *c).unwrap_or_default()
    }
}

/// A CA and a server certificate for the test names, made with the host's `openssl`, in a
/// directory a sandbox can bind-mount read-only (`ca.pem` is what clients trust).
pub struct TestCa {
    pub dir: tempfile::TempDir,
}

impl TestCa {
    /// A fresh CA (P-256, valid two days) and a certificate signed by it for `names`.
    pub fn generate(names: &[&str]) -> anyhow::Result<Self> {
        harness::require_tool("openssl")?;
        let dir = tempfile::Builder::new()
            .prefix("agent-sandbox-e2e-ca-")
            .tempdir()
            .context("cannot create the CA directory")?;
        let p = dir.path();
        make_ca(p)?;
        sign_server(p, names)?;
        share_ca(p)?;
        Ok(Self { dir })
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The directory holding only `ca.pem`, for a read-only bind mount.
    pub fn trust_dir(&self) -> PathBuf {
        self.dir.path().join("trust")
    }
}

/// The key pair of the EC P-256 curve, as `openssl req` takes it.
const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("openssl");
    cmd.current_dir(dir).args(args);
    harness::run_ok(&mut cmd, DEFAULT_TIMEOUT).map(|_| ())
}

/// The CA's key and self-signed certificate (`ca.key`, `ca.pem`) in `p`.
fn make_ca(p: &Path) -> anyhow::Result<()> {
    openssl(
        p,
        &[
            &["req", "-x509", "-nodes", "-days", "2"][..],
            &EC,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=agent-sandbox e2e test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat(),
    )?;
    Ok(())
}

/// The server's key and its certificate for `names`, signed by the CA (`server.key`,
/// `server.pem`) in `p`.
fn sign_server(p: &Path, names: &[&str]) -> anyhow::Result<()> {
    let sans = names
        .iter()
        .map(|n| format!("DNS:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    fs::write(
        p.join("server.ext"),
        format!(
            "subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
        ),
    )?;
    openssl(
        p,
        &[
            &["req", "-nodes"][..],
            &EC,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                &format!("/CN={}", names.first().copied().unwrap_or("localhost")),
            ],
        ]
        .concat(),
    )?;
    openssl(
        p,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ],
    )?;
    Ok(())
}

/// The modes a sandbox needs to read the CA certificate, and a directory holding only it.
fn share_ca(p: &Path) -> anyhow::Result<()> {
    // The sandbox's root is an unprivileged id on the host: the directory and the CA
    // certificate must be world-readable (the keys never leave the host side).
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(p.join("ca.pem"), fs::Permissions::from_mode(0o644))?;
    for key in ["ca.key", "server.key"] {
        fs::set_permissions(p.join(key), fs::Permissions::from_mode(0o600))?;
    }
    // Only the CA certificate is given to sandboxes: a directory of its own to mount.
    fs::create_dir(p.join("trust"))?;
    fs::copy(p.join("ca.pem"), p.join("trust/ca.pem"))?;
    fs::set_permissions(p.join("trust"), fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A small HTTP(S) server run by the host's `python3` (the standard library's `http.server`
/// and `ssl`), optionally inside a network namespace. Prints its port, then one line per
/// request.
const PY_SERVER: &str = r#"
import http.server, os, ssl, sys
ip, port, cert, key, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].encode()
need = os.environ.get("AS_E2E_REQUIRED_AUTHORIZATION")
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        print("REQ %s %s host=%s len=%d" % (self.command, self.path, self.headers.get("Host"), len(data)), flush=True)
        for name, value in self.headers.items():
            print("HDR %s: %s" % (name, value), flush=True)
        if need is not None and self.headers.get("Authorization") != need:
            self.send_response(401)
            self.send_header("Content-Length", "13")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"unauthorized\n")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = answer
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((ip, port), Handler)
if cert != "-":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// An HTTP or HTTPS server process ([`PY_SERVER`]); killed on drop.
pub struct PyServer {
    pub addr: SocketAddr,
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl PyServer {
    /// HTTPS on `ip` (any port) with `ca`'s server certificate.
    pub fn https(ip: &str, ca: &TestCa, body: &str) -> anyhow::Result<Self> {
        let cert = ca.path("server.pem").display().to_string();
        let key = ca.path("server.key").display().to_string();
        Self::spawn(&[], ip, 0, &cert, &key, body, None)
    }

    /// HTTPS like [`PyServer::https`], answering `401` to every request whose `Authorization`
    /// header is not exactly `authorization` (a bearer-token API).
    pub fn https_requiring(
        ip: &str,
        ca: &TestCa,
        body: &str,
        authorization: &str,
    ) -> anyhow::Result<Self> {
        let cert = ca.path("server.pem").display().to_string();
        let key = ca.path("server.key").display().to_string();
        Self::spawn(&[], ip, 0, &cert, &key, body, Some(authorization))
    }

    /// Plain HTTP on `ip:port` inside the network namespace `netns` (`ip netns exec`).
    pub fn http_in_netns(netns: &str, ip: &str, port: u16, body: &str) -> anyhow::Result<Self> {
        Self::spawn(
            &["ip", "netns", "exec", netns],
            ip,
            port,
            "-",
            "-",
            body,
            None,
        )
    }

    fn spawn(
        prefix: &[&str],
        ip: &str,
        port: u16,
        cert: &str,
        key: &str,
        body: &str,
        authorization: Option<&str>,
    ) -> anyhow::Result<Self> {
        use std::io::BufRead;
        harness::require_tool("python3")?;
        let mut argv: Vec<String> = prefix.iter().map(|s| (*s).to_owned()).collect();
        argv.extend(
            [
                "python3",
                "-c",
                PY_SERVER,
                ip,
                &port.to_string(),
                cert,
                key,
                body,
            ]
            .map(str::to_owned),
        );
        let mut command = std::process::Command::new(&argv[0]);
        if let Some(a) = authorization {
            command.env("AS_E2E_REQUIRED_AUTHORIZATION", a);
        }
        let mut child = command
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {argv:?}"))?;
        let stdout = child.stdout.take().context("no server stdout")?;
        let mut reader = std::io::BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first)?;
        let Ok(port) = first.trim().parse::<u16>() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("test server {argv:?} did not start (printed {first:?})");
        };
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&lines);
        thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if let Ok(mut l) = seen.lock() {
                    l.push(line);
                }
            }
        });
        Ok(Self {
            addr: SocketAddr::new(ip.parse()?, port),
            child,
            lines,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The `REQ METHOD PATH host=HOST len=N` lines so far.
    pub fn requests(&self) -> Vec<String> {
        self.output()
            .into_iter()
            .filter(|l| l.starts_with("REQ "))
            .collect()
    }

    /// Every line printed so far (requests and their `HDR name: value` lines).
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace the test creates (`ip netns add`), with `lo` up and extra addresses on
/// it; deleted on drop. The host's own network is untouched.
pub struct TestNetns {
    pub name: String,
}

impl TestNetns {
    pub fn create(stem: &str, addrs: &[&str]) -> anyhow::Result<Self> {
        harness::require_tool("ip")?;
        let name = format!("as-e2e-{stem}-{}", std::process::id());
        let ip = |args: &[&str]| -> anyhow::Result<()> {
            harness::run_ok(std::process::Command::new("ip").args(args), DEFAULT_TIMEOUT)
                .map(|_| ())
        };
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        for addr in addrs {
            ip(&["-n", &ns.name, "addr", "add", addr, "dev", "lo"])?;
        }
        Ok(ns)
    }

    /// The namespace's path (for `podman --network ns:PATH`, `ctr --with-ns network:PATH`).
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The banner an [`SshBanner`] server sends.
pub const SSH_SERVER_VERSION: &str = "AgentSandboxTest";

/// An ssh-like server: sends an SSH identification line, records the client's, then sends an
/// SSH_MSG_DISCONNECT packet (so the client ends cleanly instead of waiting) and closes.
pub struct SshBanner {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<String>>>,
}

impl SshBanner {
    pub fn start(ip: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((ip, 0)).with_context(|| format!("cannot bind {ip}:0"))?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&received);
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::clone(&seen);
                thread::spawn(move || ssh_greet(stream, &seen));
            }
        });
        Ok(Self { addr, received })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The identification lines clients sent.
    pub fn received(&self) -> Vec<String> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// An unencrypted SSH binary packet (RFC 4253 §6) carrying SSH_MSG_DISCONNECT.
fn ssh_disconnect_packet(reason: &str) -> Vec<u8> {
    let mut payload = vec![1u8]; // SSH_MSG_DISCONNECT
    payload.extend_from_slice(&11u32.to_be_bytes()); // SSH_DISCONNECT_BY_APPLICATION
    payload.extend_from_slice(&u32::try_from(reason.len()).unwrap_or(0).to_be_bytes());
    payload.extend_from_slice(reason.as_bytes());
    payload.extend_from_slice(&0u32.to_be_bytes()); // language tag
    // 4 (length) + 1 (padding length) + payload + padding is a multiple of 8, padding >= 4.
    let mut padding = 8 - (5 + payload.len()) % 8;
    if padding < 4 {
        padding += 8;
    }
    let length = 1 + payload.len() + padding;
    let mut packet = u32::try_from(length).unwrap_or(0).to_be_bytes().to_vec();
    packet.push(u8::try_from(padding).unwrap_or(4));
    packet.extend_from_slice(&payload);
    packet.extend(std::iter::repeat_n(0u8, padding));
    packet
}

fn ssh_greet(mut stream: TcpStream, seen: &Mutex<Vec<String>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(stream, "SSH-2.0-{SSH_SERVER_VERSION}\r\n").is_err() {
        return;
    }
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 255 && !line.ends_with(b"\n") {
        match stream.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    if let Ok(mut r) = seen.lock() {
        r.push(String::from_utf8_lossy(&line).trim_end().to_owned());
    }
    let _ = stream.write_all(&ssh_disconnect_packet("agent-sandbox e2e server: bye"));
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut rest = [0u8; 4096];
    while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
}

/// Writes a policy file in `dir`: `profiles/agent.toml` with its `allow` and
/// `deny` lists replaced.
pub fn write_policy(dir: &Path, allow: &[String], deny: &[String]) -> anyhow::Result<PathBuf> {
    let base = repo_root().join("profiles/agent.toml");
    let text =
        fs::read_to_string(&base).with_context(|| format!("cannot read {}", base.display()))?;
    let quoted = |l: &[String]| {
        l.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    let mut in_allow = false;
    for line in text.lines() {
        if in_allow {
            if line.trim() == "]" {
                in_allow = false;
            }
            continue;
        }
        if line.starts_with("allow = [") {
            out.push_str(&format!("allow = [{}]\n", quoted(allow)));
            in_allow = !line.trim_end().ends_with(']');
        } else if line.starts_with("deny = ") {
            out.push_str(&format!("deny = [{}]\n", quoted(deny)));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let path = dir.join("policy.toml");
    fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Pids of `agent-sandbox ... proxy ... ID` processes serving sandbox `id`.
pub fn proxy_pids(id: &str) -> Vec<u32> {
    crate::harness::pids_with_args(|pid, args| {
        args.contains(&b"proxy".as_slice())
            && args.contains(&id.as_bytes())
            && crate::ctr::alive(pid)
    })
}

/// Waits up to `timeout` for the proxies of `id` to be gone; returns those left.
pub fn wait_proxies_gone(id: &str, timeout: Duration) -> Vec<u32> {
    let start = std::time::Instant::now();
    loop {
        let left = proxy_pids(id);
        if left.is_empty() || start.elapsed() > timeout {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The records of an audit log (one JSON object per line).
pub fn read_audit(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad audit line {l:?}")))
        .collect()
}

/// The `kind` of every record, in order.
pub fn kinds(records: &[serde_json::Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_replaces_allow_and_deny() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_policy(dir.path(), &["a.test:1".into()], &["b.test".into()]).unwrap();
        let text = fs::read_to_string(p).unwrap();
        assert!(text.contains("allow = [\"a.test:1\"]\n"), "{text}");
        assert!(text.contains("deny = [\"b.test\"]\n"), "{text}");
        assert!(!text.contains("pypi.org"), "{text}");
        assert!(text.contains("mode = \"proxy\""), "{text}");
    }

    #[test]
    fn http_server_records_requests() {
        let s = HttpServer::start("127.0.0.1", "hello").unwrap();
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.ends_with("hello"), "{answer}");
        assert!(s.received()[0].ends_with("abc"));
    }
}
