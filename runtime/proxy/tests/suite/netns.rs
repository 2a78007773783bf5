//! The deployment shape: the listener is bound inside a network namespace that has only `lo`
//! (as the runtime does with setns), the proxy serves it from the host namespace, and a real
//! client inside the namespace reaches an allowed server only through the proxy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use agent_sandbox_proxy::{
    ListenerError, Outcome, Protocol, StandIns, bind_in_netns, proxy_env, transparent_in_netns,
};

use super::harness::*;

/// A network namespace created for one test and deleted afterwards.
struct Netns {
    name: String,
}

impl Netns {
    fn create(tag: &str) -> Self {
        let name = format!("asb-proxy-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip_ok(&["netns", "add", &name]);
        ip_ok(&["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs a program inside the namespace with exactly `env` (plus PATH).
    fn run(&self, env: &[(String, String)], program: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg("env")
            .arg("-i")
            .arg("PATH=/usr/local/bin:/usr/bin:/bin")
            .args(env.iter().map(|(k, v)| format!("{k}={v}")))
            .args(program)
            .output()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn ip_ok(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`ip` (iproute2) is required by this test: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_inside_a_netns_is_the_only_way_out() {
    let web = Web::start(SERVER_IP).await;
    let ns = Netns::create("only-way");
    let listener = bind_in_netns(&ns.path(), 0).unwrap();
    let port = listener.local_addr().unwrap().port();
    let events = Recorder::default();
    let proxy = agent_sandbox_proxy::Proxy::new(
        std::sync::Arc::new(TestRules::allow(&["web.test"]).special_ok(&[ip(SERVER_IP)])),
        std::sync::Arc::new(resolver_for(&["web.test"], ip(SERVER_IP))),
        std::sync::Arc::new(events.clone()),
    );
    let serving = tokio::spawn(async move { proxy.serve_std(listener).await });

    // The listener is not reachable from the host namespace: it lives in the sandbox's.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "the proxy port must not be open in the host namespace"
    );

    let env = proxy_env(port);
    let web_port = web.addr.port();
    let url = format!("http://web.test:{web_port}/inside");
    let literal_url = format!("http://{SERVER_IP}:{web_port}/direct");
    // curl runs synchronously; keep the other worker free for the proxy.
    let curl = |env: &[(String, String)], url: &str| {
        tokio::task::block_in_place(|| ns.run(env, &["curl", "-sS", "--max-time", "5", url]))
    };

    // Through the proxy: the allowed name works.
    let allowed = curl(&env, &url);
    assert!(
        allowed.status.success(),
        "curl in netns: {}",
        text(&allowed.stderr)
    );
    assert_eq!(text(&allowed.stdout), "hello /inside (0 body bytes)");
    // Without the proxy: the server's address is unreachable from inside.
    let direct = curl(&[], &literal_url);
    assert!(
        !direct.status.success(),
        "direct connect from the netns succeeded"
    );
    // The address literal through the proxy: not on the allowlist.
    let literal = curl(&env, &literal_url);
    assert!(
        text(&literal.stdout).contains("denied by policy rule \"default deny\""),
        "{}",
        text(&literal.stdout)
    );
    assert_eq!(
        web.seen().len(),
        1,
        "only the proxied request reached the server"
    );

    let done = events.finished(2).await;
    assert!(
        done.iter().any(|e| e.protocol == Protocol::HttpForward
            && e.host.as_deref() == Some("web.test")
            && e.outcome == Outcome::Allowed),
        "{done:#?}"
    );
    assert!(
        done.iter()
            .any(|e| e.host.as_deref() == Some(SERVER_IP) && e.outcome == Outcome::Denied),
        "{done:#?}"
    );
    // Stop the proxy: the sandbox has no way out at all.
    serving.abort();
    let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
    let after = curl(&env, &url);
    assert!(
        !after.status.success(),
        "request succeeded with the proxy stopped"
    );
    assert!(
        text(&after.stderr).contains("Failed to connect"),
        "{}",
        text(&after.stderr)
    );
    assert_eq!(web.seen().len(), 1);
}

#[test]
fn binding_fails_clearly_when_lo_is_down_or_the_netns_is_missing() {
    // A fresh namespace whose `lo` was never brought up: the bind itself works, but nothing
    // inside could connect, so the helper refuses to hand the listener over.
    let name = format!("asb-proxy-lo-down-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &name]).output();
    ip_ok(&["netns", "add", &name]);
    let down = Netns { name };
    let err = bind_in_netns(&down.path(), 0).unwrap_err();
    assert!(
        matches!(err, ListenerError::Unreachable { port, .. } if port != 0),
        "{err:?}"
    );
    assert!(err.to_string().contains(&down.name), "{err}");

    let err = bind_in_netns(Path::new("/run/netns/asb-proxy-no-such-netns"), 0).unwrap_err();
    assert!(matches!(err, ListenerError::OpenNetns { .. }), "{err:?}");
    // Not a namespace file at all.
    let err = bind_in_netns(Path::new("/etc/hostname"), 0).unwrap_err();
    assert!(matches!(err, ListenerError::EnterNetns { .. }), "{err:?}");
}

/// A client that ignores proxies, run inside the namespace: resolves through whatever DNS
/// server resolv.conf names, connects and sends a GET; times the lookup of an unlisted name;
/// connects to a raw address.
const UNAWARE_CLIENT: &str = r#"
import socket, sys, time
port = int(sys.argv[1])
for fam, tag in ((socket.AF_INET, "v4"), (socket.AF_INET6, "v6")):
    try:
        addr = socket.getaddrinfo("web.test", port, fam, socket.SOCK_STREAM)[0][4]
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(addr)
        s.sendall(b"GET /unaware-" + tag.encode() + b" HTTP/1.1\r\nHost: web.test\r\n\r\n")
        print(tag, addr[0], s.recv(200).split(b"\r\n")[0].decode())
    except Exception as e:
        print(tag, "failed", e)
t = time.time()
try:
    socket.getaddrinfo("evil.test", 80, socket.AF_INET)
    print("evil resolved")
except Exception as e:
    print("evil lookup failed %.3f" % (time.time() - t))
try:
    socket.create_connection(("203.0.113.10", 80), timeout=5).recv(10)
    print("raw connected")
except Exception as e:
    print("raw refused", type(e).__name__)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_egress_serves_unaware_tools_for_allowed_names_only() {
    let web = Web::start(SERVER_IP).await;
    let ns = Netns::create("transparent");
    let listener = bind_in_netns(&ns.path(), 0).unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let sockets = transparent_in_netns(&ns.path(), &[proxy_port]).unwrap();
    let events = Recorder::default();
    let proxy = agent_sandbox_proxy::Proxy::new(
        std::sync::Arc::new(TestRules::allow(&["web.test"]).special_ok(&[ip(SERVER_IP)])),
        std::sync::Arc::new(resolver_for(&["web.test"], ip(SERVER_IP))),
        std::sync::Arc::new(events.clone()),
    );
    let task = tokio::spawn(async move {
        let _ = proxy
            .serve_transparent(
                sockets.tcp,
                sockets.dns,
                std::sync::Arc::new(StandIns::new()),
            )
            .await;
    });
    let port = web.addr.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        let out = ns.run(&[], &["python3", "-c", UNAWARE_CLIENT, &port]);
        drop(ns);
        out
    })
    .await
    .unwrap();
    task.abort();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("v4 198.18.0.1 HTTP/1.1 200") && stdout.contains("v6 100::1 HTTP/1.1 200"),
        "the allowed name over IPv4 and IPv6:\n{stdout}{}",
        text(&out.stderr)
    );
    let seconds: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("evil lookup failed "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("the unlisted name resolved:\n{stdout}"));
    assert!(seconds < 1.0, "the unlisted lookup took {seconds} s");
    assert!(stdout.contains("raw refused"), "{stdout}");
    let seen: Vec<String> = web.seen().into_iter().map(|s| s.head).collect();
    for path in ["/unaware-v4", "/unaware-v6"] {
        assert!(
            seen.iter().any(|h| h.starts_with(&format!("GET {path} "))),
            "{path} not served: {seen:?}"
        );
    }
    let events = events.all();
    let finished = |f: &dyn Fn(&agent_sandbox_proxy::EgressEvent) -> bool| {
        events
            .iter()
            .any(|e| e.stage == agent_sandbox_proxy::Stage::Finished && f(e))
    };
    assert!(
        finished(&|e| e.protocol == Protocol::Transparent
            && e.host.as_deref() == Some("web.test")
            && e.outcome == Outcome::Allowed),
        "{events:#?}"
    );
    assert!(
        finished(&|e| e.protocol == Protocol::Dns
            && e.host.as_deref() == Some("evil.test")
            && e.outcome == Outcome::Denied),
        "{events:#?}"
    );
    assert!(
        finished(&|e| e.protocol == Protocol::Transparent
            && e.host.as_deref() == Some("203.0.113.10")
            && e.rule.as_deref() == Some("default deny")
            && e.outcome == Outcome::Denied),
        "{events:#?}"
    );
}
