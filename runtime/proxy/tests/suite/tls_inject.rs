//! HTTPS credential injection against a real TLS server on loopback with a CA of its own: the
//! bound name is terminated and injected, every other name stays an opaque tunnel, and a
//! request for another host inside a bound tunnel is refused before it reaches the server.

use std::sync::{Arc, Mutex};

use agent_sandbox_policy::network::DomainRule;
use agent_sandbox_proxy::ca::SandboxCa;
use agent_sandbox_proxy::{
    Credentials, InjectedHeader, Outcome, ProxyConfig, Stage, TlsInterceptor,
};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::harness::{SERVER_IP, TestRules, ip, resolver_for, start_proxy_with};

const API: &str = "api.test";
const OTHER: &str = "other.test";
const SECRET: &str = "s3cret-token";
const PLACEHOLDER: &str = "agent-sandbox-placeholder-API_TOKEN-0123456789abcdef0123456789abcdef";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTPS server for API and OTHER (certificates from `internet`); keeps every request
/// (head and body) and answers each with 200, keeping the connection open. Like many APIs it
/// echoes: the `Authorization` it got in `X-Echo-Authorization`, and the request as its body.
async fn server(internet: &SandboxCa) -> (u16, Arc<Mutex<Vec<String>>>) {
    let mut sni = rustls::server::ResolvesServerCertUsingSni::new();
    for name in [API, OTHER] {
        let leaf = internet.leaf(name).unwrap();
        let key = provider().key_provider.load_private_key(leaf.key).unwrap();
        sni.add(name, rustls::sign::CertifiedKey::new(leaf.chain, key))
            .unwrap();
    }
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(sni));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                while let Some(request) = read_message(&mut tls).await {
                    let auth = request
                        .lines()
                        .find_map(|l| l.strip_prefix("Authorization: "))
                        .unwrap_or("")
                        .to_owned();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nX-Echo-Authorization: {auth}\r\nContent-Length: {}\r\n\r\n{request}",
                        request.len()
                    );
                    log.lock().unwrap().push(request);
                    if tls.write_all(reply.as_bytes()).await.is_err() || tls.flush().await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// One HTTP message (head and a Content-Length or chunked body) as text; `None` at EOF.
async fn read_message<S: AsyncRead + Unpin>(s: &mut S) -> Option<String> {
    let mut data = Vec::new();
    let mut b = [0u8; 1];
    while !data.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.ok()? == 0 {
            return None;
        }
        data.push(b[0]);
    }
    let head = String::from_utf8_lossy(&data).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        while !data.ends_with(b"\r\n0\r\n\r\n") {
            if s.read(&mut b).await.ok()? == 0 {
                return None;
            }
            data.push(b[0]);
        }
    } else if let Some(n) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        let mut body = vec![0u8; n];
        s.read_exact(&mut body).await.ok()?;
        data.extend_from_slice(&body);
    }
    Some(String::from_utf8_lossy(&data).into_owned())
}

fn connector(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// CONNECT through the proxy, then TLS to `name` trusting `client`'s CA.
async fn tunnel(
    proxy: std::net::SocketAddr,
    name: &str,
    port: u16,
    client: &tokio_rustls::TlsConnector,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut s = TcpStream::connect(proxy).await?;
    s.write_all(
        format!("CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await?, 1, "proxy closed during CONNECT");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    client
        .connect(ServerName::try_from(name.to_owned()).unwrap(), s)
        .await
}

struct Setup {
    proxy: super::harness::TestProxy,
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    internet_pem: String,
    sandbox_pem: String,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let names = [
        DomainRule::parse(API).unwrap(),
        DomainRule::parse(OTHER).unwrap(),
    ];
    let (internet, internet_pem) = SandboxCa::ephemeral("internet", &names).unwrap();
    let (port, seen) = server(&internet).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("internet.pem");
    std::fs::write(&ca_file, &internet_pem).unwrap();
    let rule = DomainRule::parse(&format!("{API}:{port}")).unwrap();
    let credentials = Credentials::new(vec![InjectedHeader {
        domain: rule.clone(),
        name: "Authorization".into(),
        value: format!("Bearer {SECRET}"),
        secret: SECRET.into(),
        https: true,
        placeholder: Some(PLACEHOLDER.into()),
        upstream_ca: Some(ca_file),
    }]);
    let (sandbox_ca, sandbox_pem) = SandboxCa::ephemeral("sandbox", &[rule]).unwrap();
    let tls = TlsInterceptor::new(sandbox_ca, &credentials).unwrap();
    let proxy = start_proxy_with(
        TestRules::allow(&[API, OTHER]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&[API, OTHER], ip(SERVER_IP)),
        ProxyConfig {
            credentials,
            tls: Some(Arc::new(tls)),
            ..ProxyConfig::default()
        },
    )
    .await;
    Setup {
        proxy,
        port,
        seen,
        internet_pem,
        sandbox_pem,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_name_gets_the_secret_and_other_names_stay_opaque() {
    let s = setup().await;
    // The bound name: the client trusts only the sandbox CA (its name constraints included).
    let mut api = tunnel(s.proxy.addr, API, s.port, &connector(&s.sandbox_pem))
        .await
        .unwrap();
    api.write_all(
        format!(
            "GET /one HTTP/1.1\r\nHost: {API}:{}\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n\
             POST /two HTTP/1.1\r\nHost: {API}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            s.port
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    for _ in 0..2 {
        let answer = read_message(&mut api).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    drop(api);
    // The unbound name: end-to-end TLS with the server's own certificate, nothing added.
    let mut other = tunnel(s.proxy.addr, OTHER, s.port, &connector(&s.internet_pem))
        .await
        .unwrap();
    other
        .write_all(
            format!("GET /other HTTP/1.1\r\nHost: {OTHER}\r\nX-Key: {PLACEHOLDER}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    assert!(
        read_message(&mut other)
            .await
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    drop(other);
    // The sandbox CA cannot pass for the unbound name: its TLS is not the proxy's.
    assert!(
        tunnel(s.proxy.addr, OTHER, s.port, &connector(&s.sandbox_pem))
            .await
            .is_err()
    );

    let events = s.proxy.events.finished(3).await;
    let seen = s.seen.lock().unwrap().clone();
    let one = seen.iter().find(|r| r.starts_with("GET /one ")).unwrap();
    assert!(
        one.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{one}"
    );
    assert!(
        !one.contains(PLACEHOLDER) && !one.contains("token "),
        "{one}"
    );
    let two = seen.iter().find(|r| r.starts_with("POST /two ")).unwrap();
    assert!(two.ends_with("5\r\nhello\r\n0\r\n\r\n"), "{two}");
    assert!(
        two.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{two}"
    );
    let other = seen.iter().find(|r| r.starts_with("GET /other ")).unwrap();
    assert!(
        other.contains(&format!("X-Key: {PLACEHOLDER}\r\n")),
        "{other}"
    );
    assert!(
        !other.contains(SECRET) && !other.contains("Authorization"),
        "{other}"
    );

    let injected: Vec<_> = events
        .iter()
        .filter(|e| e.stage == Stage::Finished && e.host.as_deref() == Some(API))
        .collect();
    let credential = injected[0].credential.as_ref().unwrap();
    assert_eq!(
        (
            credential.header.as_str(),
            credential.requests,
            credential.https
        ),
        ("Authorization", 2, true)
    );
    assert!(
        events
            .iter()
            .filter(|e| e.host.as_deref() == Some(OTHER))
            .all(|e| e.credential.is_none())
    );
    let json = serde_json::to_string(&events).unwrap();
    assert!(!json.contains(SECRET), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_another_host_in_a_bound_tunnel_is_refused_before_the_server() {
    let s = setup().await;
    let mut api = tunnel(s.proxy.addr, API, s.port, &connector(&s.sandbox_pem))
        .await
        .unwrap();
    api.write_all(format!("GET /fronted HTTP/1.1\r\nHost: {OTHER}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_message(&mut api).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("X-Agent-Sandbox-Denied: host header mismatch"),
        "{answer}"
    );
    let event = s.proxy.events.finished(1).await.remove(0);
    assert_eq!(event.outcome, Outcome::Denied);
    assert!(
        !s.seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.contains("/fronted")),
        "the fronted request reached the server"
    );
}

/// The echoing API hands the secret back to whoever sends it (the baseline, straight to the
/// server); through the proxy the sandbox gets the placeholder instead, and the requests that
/// would make the server echo the secret in a place the proxy does not rewrite are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_only_leaves_and_never_comes_back() {
    let s = setup().await;
    // Baseline: the same request with the real secret, straight to the server, gets it back.
    let direct = TcpStream::connect((SERVER_IP, s.port)).await.unwrap();
    let mut direct = connector(&s.internet_pem)
        .connect(ServerName::try_from(API.to_owned()).unwrap(), direct)
        .await
        .unwrap();
    direct
        .write_all(
            format!("GET /echo HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {SECRET}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let answer = read_message(&mut direct).await.unwrap();
    assert_eq!(
        answer.matches(SECRET).count(),
        2,
        "the server does not echo: {answer}"
    );

    // Through the proxy: the server gets the secret, the sandbox only the placeholder.
    let mut api = tunnel(s.proxy.addr, API, s.port, &connector(&s.sandbox_pem))
        .await
        .unwrap();
    api.write_all(
        format!("GET /echo HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let answer = read_message(&mut api).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains(SECRET), "the secret came back: {answer}");
    assert!(
        answer.contains(&format!("X-Echo-Authorization: Bearer {PLACEHOLDER}\r\n")),
        "{answer}"
    );
    assert!(answer.contains(&format!("Authorization: Bearer {PLACEHOLDER}\r\n\r\n")));
    drop(api);
    assert!(
        s.seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.contains(&format!("Bearer {SECRET}"))),
        "the server did not get the secret"
    );

    for (request, rule) in [
        (
            format!("GET /id HTTP/1.1\r\nHost: {API}\r\nX-Request-Id: {PLACEHOLDER}\r\n\r\n"),
            "placeholder outside the credential header",
        ),
        (
            format!("GET /cors HTTP/1.1\r\nHost: {API}\r\nOrigin: {PLACEHOLDER}\r\n\r\n"),
            "placeholder outside the credential header",
        ),
        (
            format!("GET /q?t={PLACEHOLDER} HTTP/1.1\r\nHost: {API}\r\n\r\n"),
            "placeholder outside the credential header",
        ),
        (
            format!(
                "POST /b HTTP/1.1\r\nHost: {API}\r\nContent-Length: {}\r\n\r\n{PLACEHOLDER}",
                PLACEHOLDER.len()
            ),
            "placeholder outside the credential header",
        ),
        (
            format!("TRACE / HTTP/1.1\r\nHost: {API}\r\n\r\n"),
            "trace on a credential-bound host",
        ),
        (
            format!(
                "GET /ws HTTP/1.1\r\nHost: {API}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            ),
            "protocol upgrade on a credential-bound host",
        ),
    ] {
        let mut api = tunnel(s.proxy.addr, API, s.port, &connector(&s.sandbox_pem))
            .await
            .unwrap();
        api.write_all(request.as_bytes()).await.unwrap();
        let answer = read_message(&mut api).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{request:?}: {answer}");
        assert!(
            answer.contains(&format!("X-Agent-Sandbox-Denied: {rule}\r\n")),
            "{answer}"
        );
        assert!(!answer.contains(SECRET), "{answer}");
    }
    let events = s.proxy.events.finished(7).await;
    let denied = events
        .iter()
        .filter(|e| e.outcome == Outcome::Denied)
        .filter_map(|e| e.rule.clone())
        .collect::<Vec<_>>();
    assert_eq!(denied.len(), 6, "{events:?}");
    let seen = s.seen.lock().unwrap().clone();
    for path in ["/id", "/cors", "/q", "/b", "/ws"] {
        assert!(
            !seen.iter().any(|r| r.contains(&format!(" {path}"))),
            "{path} reached the server"
        );
    }
    assert!(!seen.iter().any(|r| r.starts_with("TRACE")));
}
