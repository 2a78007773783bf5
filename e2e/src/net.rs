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
    for name in [REGISTRY_HOST, COLLECTOR_HOST] {
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
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"proxy".as_slice())
                && args.contains(&id.as_bytes())
                && crate::ctr::alive(*pid)
        })
        .collect()
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
