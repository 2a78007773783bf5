//! The injected credential only leaves, never returns: an HTTPS API on loopback (the test's
//! own) that reflects what it is sent, as APIs do (request id, CORS origin, TRACE, the
//! `Authorization` header in a JSON body, base64, URL-encoded, hex, chunked, a long body, a
//! gzip body), called from a sandbox whose policy binds a credential to it, through podman
//! and ctr. Everything the sandbox receives is searched for the secret and its encodings
//! (each echoed encoded value is decoded again); the requests that would make the API echo
//! the secret in a place the proxy does not rewrite are refused with a 403 naming the rule,
//! and an `Upgrade` request never reaches the API. The same script run under runc with the
//! real token, straight to the API, gets the secret back in every one of those places, so
//! each check can fail.

use std::path::PathBuf;

use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{self, COLLECTOR_HOST, REGISTRY_HOST, REGISTRY_IP};
use agent_sandbox_e2e::podman::{Podman, Runtime, policy_flag};
use agent_sandbox_e2e::script::{Checks, sectioned, sections};
use anyhow::{Context, bail};

/// Where the test CA's certificate appears inside containers (for the runc baseline).
const TEST_CA_DIR: &str = "/etc/agent-sandbox-test";
/// The variable the policy's placeholder lives in.
const TOKEN_ENV: &str = "API_TOKEN";
/// How the sandbox's own placeholder for [`TOKEN_ENV`] begins (a random suffix follows).
const PLACEHOLDER_START: &str = "agent-sandbox-placeholder-API_TOKEN-";

/// The echoing API (the standard library's `http.server` and `ssl`). Prints its port, then
/// `REQ METHOD PATH upgrade=VALUE` per request.
const ECHO_SERVER: &str = r#"
import base64, gzip, http.server, json, ssl, sys, urllib.parse
ip, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        print("REQ %s %s upgrade=%s" % (self.command, self.path, self.headers.get("Upgrade")), flush=True)
        auth = self.headers.get("Authorization") or ""
        raw = auth.encode()
        token = auth.split(" ", 1)[-1].encode()
        doc = {
            "method": self.command,
            "headers": dict(self.headers.items()),
            "body": data.decode("utf-8", "replace"),
            "authorization": auth,
            "b64": base64.b64encode(raw).decode(),
            "b64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
            "b64token": base64.b64encode(token).decode(),
            "b64wrapped": base64.b64encode(b'{"k": "' + raw + b'"}').decode(),
            "url": urllib.parse.quote(auth, safe=""),
            "form": urllib.parse.urlencode({"a": auth}),
            "hex": raw.hex(),
        }
        body = json.dumps(doc).encode()
        path = self.path.split("?")[0]
        if self.command == "TRACE":
            body = ("%s %s %s\r\n%s" % (self.command, self.path, self.request_version, self.headers)).encode()
        self.send_response(200)
        self.send_header("X-Request-Id", self.headers.get("X-Request-Id") or auth)
        self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin") or auth)
        self.send_header("X-Echo-B64", base64.b64encode(raw).decode())
        if path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):
                piece = body[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if path == "/big":
            body = b"z" * (1 << 20) + body + b"z" * 4096
        if path == "/gzip":
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_TRACE = do_OPTIONS = answer
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((ip, port), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The echo server process; killed on drop.
struct EchoApi {
    port: u16,
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl EchoApi {
    fn start(ca: &net::TestCa) -> anyhow::Result<Self> {
        use std::io::BufRead;
        harness::require_tool("python3")?;
        let mut child = std::process::Command::new("python3")
            .args(["-c", ECHO_SERVER, REGISTRY_IP, "0"])
            .arg(ca.path("server.pem"))
            .arg(ca.path("server.key"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .context("cannot start the echo API (python3)")?;
        let stdout = child.stdout.take().context("no echo API stdout")?;
        let mut reader = std::io::BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first)?;
        let Ok(port) = first.trim().parse::<u16>() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the echo API did not start (printed {first:?})");
        };
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if let Ok(mut l) = seen.lock() {
                    l.push(line);
                }
            }
        });
        Ok(Self { port, child, lines })
    }

    fn requests(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for EchoApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct World {
    ca: net::TestCa,
    api: EchoApi,
    token: String,
    dir: tempfile::TempDir,
}

impl World {
    fn start() -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        let ca = net::TestCa::generate(&[REGISTRY_HOST, COLLECTOR_HOST])?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        // `/` and `+` change under percent-encoding, so the URL forms differ from the secret.
        let token = format!("echoTok{}q{nanos}/Zx+Y", std::process::id());
        let api = EchoApi::start(&ca)?;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("api-token");
        std::fs::write(&file, format!("{token}\n"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self {
            ca,
            api,
            token,
            dir,
        })
    }

    /// The agent profile allowing the API, with an `https` credential bound to it.
    fn policy(&self) -> anyhow::Result<PathBuf> {
        let port = self.api.port;
        let allow = vec![
            format!("{REGISTRY_HOST}:{port}"),
            format!("{REGISTRY_IP}:{port}"),
        ];
        let path = net::write_policy(self.dir.path(), &allow, &[])?;
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(&format!(
            "\n[[network.credentials]]\ndomain = \"{REGISTRY_HOST}:{port}\"\nheader = \"Authorization\"\n\
             prefix = \"Bearer \"\nfile = {:?}\nhttps = true\nplaceholder_env = \"{TOKEN_ENV}\"\n\
             upstream_ca = {:?}\n",
            self.dir.path().join("api-token").display().to_string(),
            self.ca.path("ca.pem").display().to_string(),
        ));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    fn url(&self, path: &str) -> String {
        format!("https://{REGISTRY_HOST}:{}{path}", self.api.port)
    }

    /// The calls, each printing the response head (`-D -`) and body. `$CA` is empty in the
    /// sandbox (its CA is trusted already) and names the test CA for the baseline.
    fn script(&self, full: bool) -> String {
        let auth = format!("-H \"Authorization: Bearer ${TOKEN_ENV}\"");
        let curl = |extra: &str, path: &str| {
            format!(
                "curl -sS -m 20 $CA -D - {auth} {extra} '{}' 2>&1",
                self.url(path)
            )
        };
        let mut cases = vec![
            ("own", format!("printf '%s\\n' \"${TOKEN_ENV}\"")),
            ("echo", curl("", "/echo")),
            ("trace", curl("-X TRACE", "/trace")),
            (
                "reflect",
                curl(
                    &format!("-H \"X-Request-Id: ${TOKEN_ENV}\" -H \"Origin: ${TOKEN_ENV}\""),
                    "/reflect",
                ),
            ),
            (
                "upgrade",
                curl("-H 'Connection: Upgrade' -H 'Upgrade: websocket'", "/ws"),
            ),
        ];
        if full {
            cases.extend([
                ("chunked", curl("", "/chunked")),
                (
                    "big",
                    format!("{} -o /tmp/big; tr -s z < /tmp/big; echo", curl("", "/big")),
                ),
                ("gzip", curl("--compressed", "/gzip")),
                (
                    "url",
                    format!(
                        "curl -sS -m 20 $CA -D - {auth} \"{}?t=${TOKEN_ENV}\" 2>&1",
                        self.url("/query")
                    ),
                ),
                ("body", curl(&format!("--data \"t=${TOKEN_ENV}\""), "/body")),
                (
                    "python",
                    format!(
                        "python3 -c 'import os, ssl, urllib.request
ctx = ssl.create_default_context(cafile=os.environ.get(\"PYCA\") or None)
req = urllib.request.Request(\"{}\", headers={{\"Authorization\": \"Bearer \" + os.environ[\"{TOKEN_ENV}\"]}})
print(urllib.request.urlopen(req, context=ctx, timeout=20).read().decode())' 2>&1",
                        self.url("/python")
                    ),
                ),
            ]);
        }
        sectioned(&cases)
    }

    /// Every form of the secret a response could carry it in that the checks search for.
    fn needles(&self) -> Vec<(String, String)> {
        let auth = format!("Bearer {}", self.token);
        let wrapped = format!("{{\"k\": \"{auth}\"}}");
        vec![
            ("secret".into(), self.token.clone()),
            ("base64".into(), b64(auth.as_bytes(), false)),
            (
                "base64url".into(),
                b64(auth.as_bytes(), true).trim_end_matches('=').into(),
            ),
            ("base64 token".into(), b64(self.token.as_bytes(), false)),
            ("base64 wrapped".into(), b64(wrapped.as_bytes(), false)),
            ("url".into(), percent(&auth)),
            (
                "hex".into(),
                auth.bytes().map(|b| format!("{b:02x}")).collect(),
            ),
        ]
    }
}

fn b64(data: &[u8], url: bool) -> String {
    let alphabet: &[u8; 64] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for group in data.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Vec<u8> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().take_while(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => continue,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(((bits >> count) & 0xff) as u8);
        }
    }
    out
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    out
}

/// The values of the JSON string fields `name` wherever they appear in `text`.
fn fields<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let key = format!("\"{name}\": \"");
    text.match_indices(&key)
        .filter_map(|(at, _)| {
            let rest = &text[at + key.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// Every echoed encoded value decoded again: what the sandbox could recover from them.
fn decoded(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for name in ["b64", "b64url", "b64token", "b64wrapped"] {
        for v in fields(text, name) {
            out.push((format!("{name}={v}"), b64_decode(v)));
        }
    }
    for name in ["url", "form"] {
        for v in fields(text, name) {
            out.push((format!("{name}={v}"), percent_decode(v)));
        }
    }
    for v in fields(text, "hex") {
        let bytes = (0..v.len() / 2)
            .filter_map(|i| u8::from_str_radix(v.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        out.push((format!("hex={v}"), bytes));
    }
    for line in text.lines() {
        if let Some(v) = line
            .strip_prefix("X-Echo-B64: ")
            .or(line.strip_prefix("x-echo-b64: "))
        {
            out.push((line.to_owned(), b64_decode(v.trim())));
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The checks on what the sandbox received through the proxy.
fn check_sandbox(w: &World, out: &harness::Output, full: bool, c: &mut Checks) {
    let s = sections(out);
    let get = |name: &str| s.get(name).cloned().unwrap_or_default();
    let all = format!("{}{}", out.stdout, out.stderr);
    for (form, needle) in w.needles() {
        c.check(!all.contains(&needle), || {
            format!("the sandbox received the secret ({form})")
        });
    }
    for (value, bytes) in decoded(&all) {
        c.check(!contains(&bytes, w.token.as_bytes()), || {
            format!("an echoed value decodes to the secret: {value}")
        });
    }
    // The sandbox's own placeholder, which the secret is replaced with on the way back.
    let own = get("own")
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    c.check(
        own.strip_prefix(PLACEHOLDER_START)
            .is_some_and(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())),
        || format!("the sandbox's placeholder is not its own: {own:?}"),
    );
    let echo = get("echo");
    c.check(
        echo.contains(&format!("\"authorization\": \"Bearer {own}\""))
            && echo.contains(&format!("X-Request-Id: Bearer {own}")),
        || format!("the echo did not come back with the placeholder: {echo}"),
    );
    c.check(
        decoded(&echo)
            .iter()
            .any(|(_, b)| contains(b, own.as_bytes())),
        || "the base64 echo does not decode to the placeholder".into(),
    );
    for (name, rule) in [
        ("trace", "trace on a credential-bound host"),
        ("reflect", "placeholder outside the credential header"),
        ("upgrade", "protocol upgrade on a credential-bound host"),
    ] {
        let text = get(name);
        c.check(
            text.contains("HTTP/1.1 403")
                && text.contains(&format!("X-Agent-Sandbox-Denied: {rule}")),
            || format!("{name}: not refused with a 403 naming `{rule}`: {text}"),
        );
    }
    c.check(get("reflect").contains("X-Request-Id header"), || {
        format!("the refusal does not name the header: {}", get("reflect"))
    });
    if !full {
        return;
    }
    for name in ["chunked", "big", "python"] {
        let text = get(name);
        c.check(
            text.contains(&format!("\"authorization\": \"Bearer {own}\"")),
            || format!("{name}: the echo did not come back with the placeholder: {text}"),
        );
    }
    c.check(
        get("chunked").contains("Transfer-Encoding: chunked"),
        || format!("the chunked echo was not chunked: {}", get("chunked")),
    );
    c.check(
        get("gzip").contains("HTTP/1.1 502") && get("gzip").contains("compressed"),
        || format!("the gzip answer was not refused: {}", get("gzip")),
    );
    for name in ["url", "body"] {
        let text = get(name);
        c.check(
            text.contains("HTTP/1.1 403")
                && text
                    .contains("X-Agent-Sandbox-Denied: placeholder outside the credential header"),
            || format!("{name}: the placeholder was not refused: {text}"),
        );
    }
    let seen = w.api.requests();
    for refused in ["TRACE", "/reflect", "/ws", "/query", "/body"] {
        c.check(!seen.iter().any(|l| l.contains(refused)), || {
            format!("a refused request ({refused}) reached the API: {seen:?}")
        });
    }
    c.check(!seen.iter().any(|l| !l.ends_with("upgrade=None")), || {
        format!("an Upgrade request reached the API: {seen:?}")
    });
}

#[test]
fn podman_the_injected_secret_never_comes_back() -> anyhow::Result<()> {
    let w = World::start()?;
    let policy = w.policy()?;
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let out = Podman::new(User::Root, Runtime::AgentSandbox).run(&[
        "--runtime-flag",
        &policy_flag(&policy),
        "run",
        "--rm",
        "-e",
        "CA=",
        TOOLS_IMAGE,
        "sh",
        "-c",
        &w.script(true),
    ])?;
    let mut c = Checks::default();
    check_sandbox(&w, &out, true, &mut c);
    let audit_dir = std::path::Path::new("/run/agent-sandbox/audit");
    let mut denied = Vec::new();
    for entry in std::fs::read_dir(audit_dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.contains(&format!(":{}", w.api.port)) && !text.contains(&w.api.port.to_string()) {
            continue;
        }
        c.check(!text.contains(&w.token), || {
            format!("{} holds the secret", path.display())
        });
        for r in net::read_audit(&path).unwrap_or_default() {
            if r["kind"] == "net"
                && r["data"]["port"] == w.api.port
                && let Some(rule) = r["data"]["rule"].as_str()
            {
                denied.push(rule.to_owned());
            }
        }
    }
    c.check(
        denied
            .iter()
            .any(|r| r == "trace on a credential-bound host"),
        || format!("no audit record names the TRACE refusal: {denied:?}"),
    );
    c.finish("podman: the injected secret never comes back", &out)?;

    // Baseline: the same script with the real token, straight to the API (runc, host network):
    // the API hands the secret back in every one of the places searched above.
    let base = Podman::new(User::Root, Runtime::Runc).host_net_sh(
        &[
            "-v",
            &format!("{}:{TEST_CA_DIR}:ro", w.ca.trust_dir().display()),
            "-e",
            &format!("CA=--cacert {TEST_CA_DIR}/ca.pem"),
            "-e",
            &format!("PYCA={TEST_CA_DIR}/ca.pem"),
            "-e",
            &format!("{TOKEN_ENV}={}", w.token),
        ],
        &w.script(true),
    )?;
    let s = sections(&base);
    let all = format!("{}{}", base.stdout, base.stderr);
    let mut b = Checks::default();
    for (form, needle) in w.needles() {
        b.check(all.contains(&needle), || {
            format!("the baseline did not get the secret back as {form}")
        });
    }
    for name in [
        "echo", "trace", "reflect", "upgrade", "chunked", "big", "gzip", "url", "body", "python",
    ] {
        let text = s.get(name).cloned().unwrap_or_default();
        b.check(text.contains(&w.token), || {
            format!("baseline {name}: the API did not echo the secret: {text}")
        });
    }
    let reflect = s.get("reflect").cloned().unwrap_or_default();
    b.check(
        reflect.contains(&format!("X-Request-Id: {}", w.token))
            && reflect.contains(&format!("Access-Control-Allow-Origin: {}", w.token)),
        || format!("baseline: the API did not reflect the request id and origin: {reflect}"),
    );
    b.finish("runc baseline: the echoing API returns the secret", &base)
}

#[test]
fn ctr_the_injected_secret_never_comes_back() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let w = World::start()?;
    let policy = w.policy()?;
    let config = w.dir.path().join("runtime-config.toml");
    std::fs::write(
        &config,
        format!("Policy = {:?}\n", policy.display().to_string()),
    )?;
    let out = ctr::run_rm(
        Shim::AgentSandbox,
        &["--runtime-config-path", &config.display().to_string()],
        TOOLS_IMAGE,
        &ctr::unique_id("secret-echo"),
        &["sh", "-c", &format!("CA=; {}", w.script(false))],
    )
    .context("ctr run")?;
    let mut c = Checks::default();
    check_sandbox(&w, &out, false, &mut c);
    c.finish("ctr: the injected secret never comes back", &out)
}
