//! Real client programs driven only by `proxy_env`: curl (plain HTTP, CONNECT, HTTPS against
//! `openssl s_server`, SOCKS5 with remote resolution), netcat-openbsd as ssh's ProxyCommand, and
//! git over ssh. Each program must be installed; a missing one fails the test.

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox_proxy::{
    EgressEvent, Outcome, Protocol, SshProxyTool, proxy_env, proxy_env_with, ssh_proxy_command,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;

use super::harness::*;

/// Runs `program` with exactly `env` (plus PATH and HOME), bounded to 30 s. Output goes
/// through files in `home`, so that a hung program's output can still be shown.
async fn run(program: &str, args: &[&str], env: &[(String, String)], home: &Path) -> Output {
    let name = Path::new(program)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let out_path = home.join(format!("{name}.stdout"));
    let err_path = home.join(format!("{name}.stderr"));
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{program} is required by this test and could not be started ({e}); install it (Debian: apt-get install {program})")
        });
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let stdout = std::fs::read(&out_path).unwrap();
    let stderr = std::fs::read(&err_path).unwrap();
    let Ok(status) = status else {
        panic!(
            "{program} {args:?} did not finish within 30 s; stdout: {}; stderr: {}",
            text(&stdout),
            text(&stderr)
        );
    };
    Output {
        status: status.unwrap(),
        stdout,
        stderr,
    }
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn without(env: &[(String, String)], names: &[&str]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| !names.iter().any(|n| k.eq_ignore_ascii_case(n)))
        .cloned()
        .collect()
}

struct Setup {
    web: Web,
    proxy: TestProxy,
    env: Vec<(String, String)>,
    home: tempfile::TempDir,
}

async fn setup() -> Setup {
    let web = Web::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["web.test", "tls.test", "git.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(
            &["web.test", "tls.test", "git.test", "blocked.test"],
            ip(SERVER_IP),
        ),
    )
    .await;
    let env = proxy_env(proxy.addr.port());
    Setup {
        web,
        proxy,
        env,
        home: tempfile::tempdir().unwrap(),
    }
}

/// Asserts that `program` succeeded and printed the test web server's answer for `path`.
fn assert_hello(program: &str, out: &Output, path: &str) {
    assert!(
        out.status.success(),
        "{program} failed: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), format!("hello {path} (0 body bytes)"));
}

/// Asserts that `program` asked through the proxy: the web server saw a request whose head
/// starts with `head`, and every finished connection (at least one) passes `ok`.
async fn assert_asked_through_proxy(
    s: &Setup,
    program: &str,
    out: &Output,
    head: &str,
    ok: impl Fn(&EgressEvent) -> bool,
) {
    let seen = s.web.seen();
    assert!(
        seen.iter().any(|r| r.head.starts_with(head)),
        "{seen:#?}; {program} said {}",
        text(&out.stderr)
    );
    let events = s.proxy.events.finished(1).await;
    assert!(events.iter().all(ok), "{events:#?}");
}

/// A plain HTTP request forwarded to the test web server.
fn forwarded_to_web(e: &EgressEvent) -> bool {
    e.protocol == Protocol::HttpForward && e.host.as_deref() == Some("web.test")
}

#[tokio::test]
async fn curl_plain_http_through_http_proxy_env() {
    let s = setup().await;
    let url = format!("http://web.test:{}/plain", s.web.addr.port());
    let out = run(
        "curl",
        &["-sS", "--max-time", "10", &url],
        &s.env,
        s.home.path(),
    )
    .await;
    assert_hello("curl", &out, "/plain");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::HttpForward);
    assert_outcome(&event, &Outcome::Allowed);
}

#[tokio::test]
async fn curl_connect_tunnel_through_http_proxy_env() {
    let s = setup().await;
    let url = format!("http://web.test:{}/tunnel", s.web.addr.port());
    let out = run(
        "curl",
        &["-sS", "--max-time", "10", "--proxytunnel", &url],
        &s.env,
        s.home.path(),
    )
    .await;
    assert_hello("curl", &out, "/tunnel");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::HttpConnect);
    assert_outcome(&event, &Outcome::Allowed);
}

#[tokio::test]
async fn curl_https_through_https_proxy_env() {
    let s = setup().await;
    let dir = s.home.path();
    let key = dir.join("key.pem");
    let cert = dir.join("cert.pem");
    let keygen = run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=tls.test",
            "-addext",
            "subjectAltName=DNS:tls.test",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ],
        &[],
        dir,
    )
    .await;
    assert!(
        keygen.status.success(),
        "openssl req: {}",
        text(&keygen.stderr)
    );
    // A free port on the server address for s_server.
    let port = unused_port();
    let accept = format!("{SERVER_IP}:{port}");
    let _server = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept", &accept])
        .args([
            "-cert",
            cert.to_str().unwrap(),
            "-key",
            key.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl is required by this test (Debian: apt-get install openssl)");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&accept).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "openssl s_server did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("https://tls.test:{port}/");
    let out = run(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            cert.to_str().unwrap(),
            &url,
        ],
        &s.env,
        dir,
    )
    .await;
    assert!(out.status.success(), "curl failed: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("s_server"),
        "{}",
        text(&out.stdout)
    );
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::HttpConnect);
    assert_eq!(event.host.as_deref(), Some("tls.test"));
    assert!(event.bytes_up > 0 && event.bytes_down > 0, "{event:#?}");
}

#[tokio::test]
async fn curl_socks5h_through_all_proxy_env() {
    let s = setup().await;
    // Only ALL_PROXY (socks5h://) left: curl must resolve through the proxy.
    let env = without(&s.env, &["http_proxy", "https_proxy"]);
    let url = format!("http://web.test:{}/socks", s.web.addr.port());
    let out = run(
        "curl",
        &["-sS", "--max-time", "10", &url],
        &env,
        s.home.path(),
    )
    .await;
    assert_hello("curl", &out, "/socks");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::Socks5);
    assert_eq!(event.host.as_deref(), Some("web.test"));
}

#[tokio::test]
async fn curl_sees_the_403_and_the_rule() {
    let s = setup().await;
    let port = s.web.addr.port();
    let url = format!("http://blocked.test:{port}/");
    let out = run(
        "curl",
        &["-sS", "--max-time", "10", "-D", "-", &url],
        &s.env,
        s.home.path(),
    )
    .await;
    let shown = text(&out.stdout);
    assert!(shown.starts_with("HTTP/1.1 403 Forbidden"), "{shown}");
    assert!(
        shown.contains("X-Agent-Sandbox-Denied: default deny"),
        "{shown}"
    );
    assert!(shown.contains("blocked.test"), "{shown}");
    // Through a CONNECT tunnel curl reports the proxy's refusal code.
    let url = format!("https://blocked.test:{port}/");
    let out = run(
        "curl",
        &["-sS", "--max-time", "10", &url],
        &s.env,
        s.home.path(),
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("403"), "{}", text(&out.stderr));
    assert!(s.web.seen().is_empty());
}

#[tokio::test]
async fn ssh_proxy_command_reaches_an_allowed_host_through_socks5() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("git.test").await;
    let command = "exec ".to_owned()
        + &ssh_proxy_command(proxy.addr.port(), SshProxyTool::OpenbsdNetcat)
            .replace("%h", "git.test")
            .replace("%p", &echo.addr.port().to_string());
    let mut child = Command::new("sh")
        .args(["-c", &command])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ping through socks\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
    let line = match line {
        Ok(Ok(Some(line))) => line,
        other => {
            let mut err = String::new();
            let _ = child.kill().await;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
            panic!(
                "no echo through `{command}` ({other:?}); stderr: {err} (netcat-openbsd installed?)"
            );
        }
    };
    assert_eq!(line, "ping through socks");
    drop(stdin);
    let _ = child.kill().await;
    let event = proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::Socks5);
    assert_eq!(event.host.as_deref(), Some("git.test"));
    assert_outcome(&event, &Outcome::Allowed);
}

#[tokio::test]
async fn git_over_ssh_goes_through_the_proxy_with_netcat() {
    git_over_ssh(SshProxyTool::OpenbsdNetcat, Protocol::Socks5).await;
}

#[tokio::test]
async fn git_over_ssh_goes_through_the_proxy_with_bash() {
    git_over_ssh(SshProxyTool::Bash, Protocol::HttpConnect).await;
}

async fn git_over_ssh(tool: SshProxyTool, protocol: Protocol) {
    // A fake ssh server: sends a banner, records the client's banner, then sends garbage.
    let listener = TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let banners = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&banners);
    let _server = tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.write_all(b"SSH-2.0-agentsandbox_test\r\n").await;
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while !line.ends_with(b"\n") && line.len() < 256 {
                match s.read(&mut byte).await {
                    Ok(1) => line.push(byte[0]),
                    _ => break,
                }
            }
            // An impossible packet length makes ssh give up at once (a bare hang-up would leave
            // ssh waiting on nc, which keeps its stdout open while ssh's stdin is open).
            let _ = s.write_all(&[0xff; 32]).await;
            record
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&line).trim().to_owned());
        }
    });
    let mut s = setup().await;
    s.env = proxy_env_with(s.proxy.addr.port(), tool);
    let url = format!("ssh://git@git.test:{port}/repo.git");
    let out = run("git", &["ls-remote", &url], &s.env, s.home.path()).await;
    // The fake server hangs up after the banners, so git fails; what matters is where ssh went.
    assert!(!out.status.success());
    let seen = banners.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "ssh never reached the server; git said: {}",
        text(&out.stderr)
    );
    assert!(seen[0].starts_with("SSH-2.0-OpenSSH"), "{seen:?}");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, protocol);
    assert_eq!(event.host.as_deref(), Some("git.test"));
    assert_eq!(event.port, Some(port));

    // A host the policy does not allow: refused at the proxy.
    let out = run(
        "git",
        &["ls-remote", "ssh://git@blocked.test:22/x.git"],
        &s.env,
        s.home.path(),
    )
    .await;
    assert!(!out.status.success());
    // The user sees that the policy refused it, not an outage.
    let said = text(&out.stderr);
    let refusal = match tool {
        SshProxyTool::Bash => {
            "agent-sandbox proxy: blocked.test:22: HTTP/1.1 403 Forbidden by agent-sandbox policy"
        }
        _ => "Connection not allowed by ruleset",
    };
    assert!(said.contains(refusal), "want {refusal:?} in {said}");
    let events = s.proxy.events.finished(2).await;
    assert!(
        events
            .iter()
            .any(|e| e.host.as_deref() == Some("blocked.test") && e.outcome == Outcome::Denied),
        "{events:#?}"
    );
}

#[tokio::test]
async fn python_urllib_follows_the_proxy_env() {
    let s = setup().await;
    let url = format!("http://web.test:{}/python", s.web.addr.port());
    let script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end='')";
    let out = run(
        "/usr/bin/python3",
        &["-c", script, &url],
        &s.env,
        s.home.path(),
    )
    .await;
    assert_hello("python", &out, "/python");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::HttpForward);
    assert_outcome(&event, &Outcome::Allowed);
}

#[tokio::test]
async fn java_follows_java_tool_options() {
    let s = setup().await;
    let source = s.home.path().join("Fetch.java");
    std::fs::write(
        &source,
        "public class Fetch { public static void main(String[] a) throws Exception {\n\
         var c = (java.net.HttpURLConnection) new java.net.URI(a[0]).toURL().openConnection();\n\
         System.out.print(new String(c.getInputStream().readAllBytes()));\n} }\n",
    )
    .unwrap();
    let url = format!("http://web.test:{}/java", s.web.addr.port());
    // Only JAVA_TOOL_OPTIONS: the JVM ignores HTTP_PROXY and friends.
    let env = only(&s.env, &["JAVA_TOOL_OPTIONS"]);
    let out = run(
        "java",
        &[source.to_str().unwrap(), &url],
        &env,
        s.home.path(),
    )
    .await;
    assert_hello("java", &out, "/java");
    let event = s.proxy.events.one().await;
    assert_eq!(event.protocol, Protocol::HttpForward);
    assert_eq!(event.host.as_deref(), Some("web.test"));
}

/// Keeps only the named variables of `env`.
fn only(env: &[(String, String)], names: &[&str]) -> Vec<(String, String)> {
    let kept: Vec<_> = env
        .iter()
        .filter(|(k, _)| names.contains(&k.as_str()))
        .cloned()
        .collect();
    assert_eq!(kept.len(), names.len(), "proxy_env lacks one of {names:?}");
    kept
}

#[tokio::test]
async fn pip_follows_pip_proxy() {
    let s = setup().await;
    let index = format!("http://web.test:{}/simple/", s.web.addr.port());
    let target = s.home.path().join("dl");
    let env = only(&s.env, &["PIP_PROXY"]);
    let out = run(
        "/usr/bin/python3",
        &[
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--retries",
            "0",
            "--timeout",
            "10",
            "--disable-pip-version-check",
            "--trusted-host",
            "web.test",
            "--index-url",
            &index,
            "-d",
            target.to_str().unwrap(),
            "agent-sandbox-probe-pkg",
        ],
        &env,
        s.home.path(),
    )
    .await;
    // The test index has no such package; what matters is that pip asked through the proxy.
    assert!(!out.status.success());
    assert_asked_through_proxy(
        &s,
        "pip",
        &out,
        "GET /simple/agent-sandbox-probe-pkg/ ",
        forwarded_to_web,
    )
    .await;
}

#[tokio::test]
async fn npm_follows_npm_config_proxy() {
    let s = setup().await;
    let registry = format!("http://web.test:{}/", s.web.addr.port());
    let env = only(&s.env, &["npm_config_proxy", "npm_config_https_proxy"]);
    let out = run(
        "npm",
        &[
            "view",
            "agent-sandbox-probe-pkg",
            "--registry",
            &registry,
            "--fetch-retries",
            "0",
        ],
        &env,
        s.home.path(),
    )
    .await;
    // The test registry answers text, not JSON; what matters is that npm asked through the proxy.
    assert!(!out.status.success());
    assert_asked_through_proxy(
        &s,
        "npm",
        &out,
        "GET /agent-sandbox-probe-pkg ",
        forwarded_to_web,
    )
    .await;
}

#[tokio::test]
async fn git_http_follows_git_config_env() {
    let s = setup().await;
    let url = format!("http://web.test:{}/repo.git", s.web.addr.port());
    let env = only(
        &s.env,
        &["GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0"],
    );
    let out = run("git", &["ls-remote", &url], &env, s.home.path()).await;
    // The test server is no git server (git may read its answer as an empty dumb-HTTP ref
    // list or fail); what matters is that git asked through the proxy.
    assert_asked_through_proxy(
        &s,
        "git",
        &out,
        "GET /repo.git/info/refs?service=git-upload-pack ",
        |e| e.protocol == Protocol::HttpForward && e.outcome == Outcome::Allowed,
    )
    .await;
}
