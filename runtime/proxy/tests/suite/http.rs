//! HTTP CONNECT and absolute-form forwarding.

use agent_sandbox_proxy::{Outcome, Protocol, Stage, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::harness::*;

#[tokio::test]
async fn connect_tunnels_bytes_both_ways() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("echo.test").await;
    let target = format!("echo.test:{}", echo.addr.port());
    let mut s = connect_tunnel(proxy.addr, &target).await;
    let data = payload(256 * 1024);
    assert_eq!(echo_through(&mut s, &data).await, data);
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());

    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.protocol, Protocol::HttpConnect);
    assert_eq!(event.host.as_deref(), Some("echo.test"));
    assert_eq!(event.port, Some(echo.addr.port()));
    assert_eq!(event.rule.as_deref(), Some("allow echo.test"));
    assert_eq!(event.resolved, Some(echo.addr));
    assert_eq!(event.bytes_up, data.len() as u64);
    assert_eq!(event.bytes_down, data.len() as u64);
    assert!(!event.duration.is_zero());
    let opened: Vec<_> = proxy
        .events
        .all()
        .into_iter()
        .filter(|e| e.stage == Stage::Opened)
        .collect();
    assert_eq!(opened.len(), 1, "one opened event");
    assert_eq!(opened[0].connection, event.connection);
}

#[tokio::test]
async fn connect_passes_bytes_sent_before_the_reply() {
    // A client may pipeline its first bytes (a TLS ClientHello) right after the CONNECT head.
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("echo.test").await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let target = format!("echo.test:{}", echo.addr.port());
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\nearly-bytes").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut back = [0u8; 11];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"early-bytes");
    drop(s);
    let event = proxy.events.one().await;
    assert_eq!(event.bytes_up, 11);
    assert_eq!(event.bytes_down, 11);
}

#[tokio::test]
async fn denied_domain_gets_403_naming_the_rule() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["echo.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test", "other.test"], ip(SERVER_IP)),
    )
    .await;
    let port = echo.addr.port();
    let answer = roundtrip(
        proxy.addr,
        format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 403 Forbidden by agent-sandbox policy\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("\r\nX-Agent-Sandbox-Denied: default deny\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with(&format!(
            "connection to other.test:{port} denied by policy rule \"default deny\"\n"
        )),
        "{answer}"
    );
    assert_eq!(
        echo.accepted(),
        0,
        "a denied request must not reach the server"
    );
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Denied);
    assert_eq!(event.rule.as_deref(), Some("default deny"));
    assert_eq!(event.resolved, None);
    assert_eq!((event.bytes_up, event.bytes_down), (0, 0));
}

#[tokio::test]
async fn deny_wins_over_allow() {
    let echo = Echo::start(SERVER_IP).await;
    let rules = TestRules::allow(&["both.test", "fine.test"])
        .deny(&["both.test"])
        .special_ok(&[ip(SERVER_IP)]);
    let proxy = start_proxy(
        rules,
        resolver_for(&["both.test", "fine.test"], ip(SERVER_IP)),
    )
    .await;
    let port = echo.addr.port();
    let answer = roundtrip(
        proxy.addr,
        format!("CONNECT both.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("X-Agent-Sandbox-Denied: deny both.test\r\n"),
        "{answer}"
    );
    // The same proxy lets the allowed-only name through, so the refusal is the deny rule's.
    let mut s = connect_tunnel(proxy.addr, &format!("fine.test:{port}")).await;
    assert_eq!(echo_through(&mut s, b"ok").await, b"ok");
    assert_eq!(echo.accepted(), 1);
}

#[tokio::test]
async fn absolute_form_request_is_forwarded_without_proxy_headers() {
    let web = Web::start(SERVER_IP).await;
    let proxy = proxy_allowing("web.test").await;
    let port = web.addr.port();
    let request = format!(
        "POST http://web.test:{port}/upload?x=1 HTTP/1.1\r\nHost: web.test:{port}\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\
         Connection: keep-alive, X-Hop\r\nX-Hop: drop me\r\nKeep-Alive: timeout=5\r\n\
         TE: trailers\r\nUser-Agent: test\r\nContent-Length: 5\r\n\r\nhello"
    );
    let answer = roundtrip(proxy.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with("hello /upload?x=1 (5 body bytes)"),
        "{answer}"
    );

    let seen = web.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].head,
        format!(
            "POST /upload?x=1 HTTP/1.1\r\nHost: web.test:{port}\r\nUser-Agent: test\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\n"
        )
    );
    assert_eq!(seen[0].body, b"hello");
    let event = proxy.events.one().await;
    assert_outcome(&event, &Outcome::Allowed);
    assert_eq!(event.protocol, Protocol::HttpForward);
    assert_eq!(event.bytes_up, (seen[0].head.len() + 5) as u64);
    assert_eq!(event.bytes_down, answer.len() as u64);
}

#[tokio::test]
async fn host_header_mismatch_is_refused() {
    let web = Web::start(SERVER_IP).await;
    let proxy = start_proxy(
        TestRules::allow(&["web.test", "other.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["web.test", "other.test"], ip(SERVER_IP)),
    )
    .await;
    let port = web.addr.port();
    for host in [
        "other.test".to_owned(),
        format!("web.test:{}", port + 1),
        "evil.example".to_owned(),
    ] {
        let answer = roundtrip(
            proxy.addr,
            format!("GET http://web.test:{port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 403 Forbidden by agent-sandbox policy\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains("X-Agent-Sandbox-Denied: host header mismatch\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains("does not match the request target"),
            "{answer}"
        );
    }
    assert!(
        web.seen().is_empty(),
        "no mismatched request may reach the server"
    );
    for event in proxy.events.finished(3).await {
        assert!(
            matches!(&event.outcome, Outcome::Denied)
                && event.rule.as_deref() == Some("host header mismatch"),
            "{event:#?}"
        );
    }
}

#[tokio::test]
async fn malformed_requests_get_400_and_the_proxy_keeps_serving() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = proxy_allowing("echo.test").await;
    let oversized = format!(
        "GET http://echo.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (
            b"GET / HTTP/1.1\r\nHost: echo.test\r\n\r\n".to_vec(),
            "not a proxy request",
        ),
        (
            b"GET http://echo.test/ HTTP/1.1\r\nno colon here\r\n\r\n".to_vec(),
            "malformed request head",
        ),
        (
            b"CONNECT echo.test HTTP/1.1\r\n\r\n".to_vec(),
            "needs host:port",
        ),
        (
            b"GET https://echo.test/ HTTP/1.1\r\n\r\n".to_vec(),
            "only http:// is",
        ),
        (
            b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n".to_vec(),
            "not allowed in a host name",
        ),
        (
            b"CONNECT [::1:443 HTTP/1.1\r\n\r\n".to_vec(),
            "not a valid URI",
        ),
        (
            b"CONNECT a..b:443 HTTP/1.1\r\n\r\n".to_vec(),
            "empty or over-long label",
        ),
        (oversized.into_bytes(), "larger than 32768 bytes"),
        // A TLS ClientHello sent straight to the proxy port.
        (
            vec![0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5],
            "unrecognised protocol",
        ),
    ];
    for (request, reason) in &bad {
        let answer = roundtrip(proxy.addr, request).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(answer.contains(reason), "want {reason:?} in {answer}");
    }
    let events = proxy.events.finished(bad.len()).await;
    assert!(
        events
            .iter()
            .all(|e| matches!(e.outcome, Outcome::BadRequest { .. })),
        "{events:#?}"
    );
    // Still serving.
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    assert_eq!(echo_through(&mut s, b"still here").await, b"still here");
}

#[tokio::test]
async fn unresolvable_name_gets_502() {
    let proxy = start_proxy(TestRules::allow(&["nowhere.test"]), StaticResolver::new()).await;
    let answer = roundtrip(proxy.addr, b"CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("X-Agent-Sandbox-Error: resolve\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("nowhere.test could not be resolved"),
        "{answer}"
    );
    let event = proxy.events.one().await;
    assert!(
        matches!(event.outcome, Outcome::ResolveFailed { .. }),
        "{event:#?}"
    );
}

#[tokio::test]
async fn refused_upstream_gets_502() {
    let closed = unused_port();
    let proxy = proxy_allowing("down.test").await;
    let answer = roundtrip(
        proxy.addr,
        format!("GET http://down.test:{closed}/ HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("X-Agent-Sandbox-Error: upstream\r\n"),
        "{answer}"
    );
    assert!(answer.contains("refused"), "{answer}");
    let event = proxy.events.one().await;
    assert!(
        matches!(event.outcome, Outcome::UpstreamFailed { .. }),
        "{event:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_never_breaks_the_proxy() {
    let echo = Echo::start(SERVER_IP).await;
    let proxy = start_proxy_with(
        TestRules::allow(&["echo.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["echo.test"], ip(SERVER_IP)),
        agent_sandbox_proxy::ProxyConfig {
            handshake_timeout: std::time::Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    // A fixed-seed generator, so a failure replays.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let prefixes: [&[u8]; 6] = [
        b"",
        b"\x05",
        b"\x05\x01\x00\x05\x01\x00\x03",
        b"CONNECT ",
        b"GET http://",
        b"GET http://echo.test/ HTTP/1.1\r\n",
    ];
    let mut tasks = Vec::new();
    for i in 0..300 {
        let mut input = prefixes[i % prefixes.len()].to_vec();
        let len = usize::try_from(next() % 200).unwrap();
        input.extend((0..len).map(|_| next().to_le_bytes()[0]));
        let addr = proxy.addr;
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(&input).await;
            let mut out = Vec::new();
            // Every input ends within the handshake timeout plus the drain.
            tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
                .await
                .unwrap_or_else(|_| panic!("input {i} left the connection hanging: {input:?}"))
                .ok();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        echo.accepted(),
        0,
        "garbage must not open upstream connections"
    );
    let events = proxy.events.finished(300).await;
    assert!(
        events.iter().all(|e| e.outcome != Outcome::Allowed),
        "{:#?}",
        events
            .iter()
            .filter(|e| e.outcome == Outcome::Allowed)
            .collect::<Vec<_>>()
    );
    let mut s = connect_tunnel(proxy.addr, &format!("echo.test:{}", echo.addr.port())).await;
    assert_eq!(echo_through(&mut s, b"alive").await, b"alive");
}

/// A plain-HTTP credential is added to forwarded requests; an origin that echoes the request
/// (as the body, delimited by closing) hands the secret back when called directly, but never
/// through the proxy, and TRACE is refused.
#[tokio::test]
async fn a_plain_credential_never_comes_back_from_an_echoing_origin() {
    const SECRET: &str = "s3cret-plain-credential";
    let listener = tokio::net::TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                let _ = s
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{head}").as_bytes(),
                    )
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    let rule =
        agent_sandbox_policy::network::DomainRule::parse(&format!("web.test:{port}")).unwrap();
    let proxy = start_proxy_with(
        TestRules::allow(&["web.test"]).special_ok(&[ip(SERVER_IP)]),
        resolver_for(&["web.test"], ip(SERVER_IP)),
        agent_sandbox_proxy::ProxyConfig {
            credentials: agent_sandbox_proxy::Credentials::new(vec![
                agent_sandbox_proxy::InjectedHeader {
                    domain: rule,
                    name: "Authorization".into(),
                    value: format!("Bearer {SECRET}"),
                    secret: SECRET.into(),
                    https: false,
                    placeholder: None,
                    upstream_ca: None,
                },
            ]),
            ..agent_sandbox_proxy::ProxyConfig::default()
        },
    )
    .await;
    let mut direct = TcpStream::connect((SERVER_IP, port)).await.unwrap();
    direct
        .write_all(format!("GET / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut back = String::new();
    direct.read_to_string(&mut back).await.unwrap();
    assert!(back.contains(SECRET), "the origin does not echo: {back}");

    let answer = roundtrip(
        proxy.addr,
        format!("GET http://web.test:{port}/echo HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("GET /echo HTTP/1.1"), "{answer}");
    assert!(!answer.contains(SECRET), "the secret came back: {answer}");
    assert!(
        answer.contains("Authorization: Bearer agent-sandbox-redacted"),
        "{answer}"
    );
    let event = proxy.events.one().await;
    assert_eq!(event.credential.as_ref().map(|c| c.requests), Some(1));

    let answer = roundtrip(
        proxy.addr,
        format!("TRACE http://web.test:{port}/ HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("X-Agent-Sandbox-Denied: trace on a credential-bound host"),
        "{answer}"
    );
}
