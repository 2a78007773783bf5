//! HTTPS credential injection through real podman (and ctr with our shim): a bearer-token API
//! on loopback with its own CA (the test's "internet"), a policy whose `https = true`
//! credential binds it, and a sandbox that calls it without ever holding the token. Each
//! property is paired with the same attack or call where it succeeds: the same call through a
//! plain tunnel gets 401, and the same secret hunt under runc finds a token handed over the
//! usual way (an environment variable).

use std::path::{Path, PathBuf};

use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{self, COLLECTOR_HOST, COLLECTOR_IP, REGISTRY_HOST, REGISTRY_IP};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag};
use agent_sandbox_e2e::script::{Checks, sectioned, sections};
use anyhow::{Context, ensure};

/// Where the test CA's certificate appears inside containers (to reach the unbound domain).
const TEST_CA_DIR: &str = "/etc/agent-sandbox-test";
/// The sandbox CA's name prefix (its certificate's CN).
const SANDBOX_CA_CN: &str = "agent-sandbox CA";
/// The variable the policy's placeholder lives in.
const TOKEN_ENV: &str = "API_TOKEN";

fn sandbox() -> Podman {
    Podman::new(User::Root, Runtime::AgentSandbox)
}

fn runc() -> Podman {
    Podman::new(User::Root, Runtime::Runc)
}

/// The test's internet and secret: a bearer-token API (bound), another HTTPS server (not
/// bound), a token file only root can read, and policies with and without the binding.
struct World {
    ca: net::TestCa,
    api: net::PyServer,
    other: net::PyServer,
    token: String,
    halves: (String, String),
    dir: tempfile::TempDir,
}

impl World {
    fn start() -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        let ca = net::TestCa::generate(&[REGISTRY_HOST, COLLECTOR_HOST])?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let halves = (
            "tlsTok".to_owned(),
            format!("{}q{nanos}", std::process::id()),
        );
        let token = format!("{}{}", halves.0, halves.1);
        let api = net::PyServer::https_requiring(
            REGISTRY_IP,
            &ca,
            "api-private-data",
            &format!("Bearer {token}"),
        )?;
        let other = net::PyServer::https(COLLECTOR_IP, &ca, "other-site-body")?;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("api-token");
        std::fs::write(&file, format!("{token}\n"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self {
            ca,
            api,
            other,
            token,
            halves,
            dir,
        })
    }

    fn allow(&self) -> Vec<String> {
        // The test servers live on loopback: their addresses are allowed too, as an exact IP
        // rule is the only way past the proxy's loopback guard.
        vec![
            format!("{REGISTRY_HOST}:{}", self.api.port()),
            format!("{REGISTRY_IP}:{}", self.api.port()),
            format!("{COLLECTOR_HOST}:{}", self.other.port()),
            format!("{COLLECTOR_IP}:{}", self.other.port()),
        ]
    }

    /// The agent profile allowing both servers; with `bound`, an `https` credential for the
    /// API (verified upstream against the test's CA).
    fn policy(&self, bound: bool) -> anyhow::Result<PathBuf> {
        let sub = self.dir.path().join(if bound { "bound" } else { "plain" });
        std::fs::create_dir_all(&sub)?;
        let path = net::write_policy(&sub, &self.allow(), &[])?;
        if bound {
            let mut text = std::fs::read_to_string(&path)?;
            text.push_str(&format!(
                "\n[[network.credentials]]\ndomain = \"{REGISTRY_HOST}:{}\"\nheader = \"Authorization\"\n\
                 prefix = \"Bearer \"\nfile = {:?}\nhttps = true\nplaceholder_env = \"{TOKEN_ENV}\"\n\
                 upstream_ca = {:?}\n",
                self.api.port(),
                self.dir.path().join("api-token").display().to_string(),
                self.ca.path("ca.pem").display().to_string(),
            ));
            std::fs::write(&path, text)?;
        }
        Ok(path)
    }

    fn api_url(&self, path: &str) -> String {
        format!("https://{REGISTRY_HOST}:{}{path}", self.api.port())
    }

    fn other_url(&self, path: &str) -> String {
        format!("https://{COLLECTOR_HOST}:{}{path}", self.other.port())
    }

    /// The token, rebuilt in the shell from its halves (the script's text never holds it),
    /// then `cmd`; in a subshell, so that the script's own shell never holds it in memory.
    fn with_token_sh(&self, cmd: &str) -> String {
        format!(
            "(s={}; s=\"${{s}}{}\"; {cmd})",
            self.halves.0, self.halves.1
        )
    }
}

/// A python process that calls the API with the token from its environment (through the proxy
/// when the environment names one), stays alive holding whatever it got, and prints `ready`.
fn holder(url: &str, cafile: Option<&str>) -> String {
    let ca = cafile.map_or("None".to_owned(), |f| format!("{f:?}"));
    format!(
        "python3 -c 'import os, ssl, sys, time, urllib.request
ctx = ssl.create_default_context(cafile={ca})
req = urllib.request.Request(sys.argv[1], headers={{\"Authorization\": \"Bearer \" + os.environ[\"{TOKEN_ENV}\"]}})
body = urllib.request.urlopen(req, context=ctx, timeout=20).read()
print(\"holder\", body.decode(), flush=True)
time.sleep(120)' {url} > /tmp/holder.out 2>&1 &
for i in $(seq 1 100); do grep -q holder /tmp/holder.out 2>/dev/null && break; sleep 0.2; done; cat /tmp/holder.out"
    )
}

/// Reads the memory of every other process it may read and counts where the token (rebuilt
/// from two arguments) appears.
const MEMORY_SCAN: &str = r#"
import os, sys
needle = (sys.argv[1] + sys.argv[2]).encode()
me = os.getpid()
found, scanned = set(), 0
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == me:
        continue
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", 0)
    except OSError:
        continue
    for line in maps:
        addr, perms = line.split()[:2]
        start, end = (int(x, 16) for x in addr.split("-"))
        if "r" not in perms or end - start > (256 << 20):
            continue
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        scanned += len(data)
        if needle in data:
            found.add(pid)
print("scanned=%d found=%s" % (scanned, ",".join(sorted(found)) or "none"))
"#;

/// Every directory of the sandbox's tree but the kernel's views.
const EVERY_DIR: &str =
    "for d in /*; do case $d in /proc|/sys|/dev) ;; *) echo \"$d\" ;; esac; done";

/// The secret hunt: environments, files, readable memory of other processes, and private keys.
fn hunt(w: &World, holder_script: &str) -> Vec<(&'static str, String)> {
    vec![
        ("holder", holder_script.to_owned()),
        (
            "secret-in-env",
            w.with_token_sh(
                "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done | grep -cF \"$s\"",
            ),
        ),
        (
            "secret-in-files",
            w.with_token_sh(&format!(
                "for d in $({EVERY_DIR}); do grep -rlF \"$s\" \"$d\" 2>/dev/null; done | head"
            )),
        ),
        (
            "ca-key",
            format!(
                "ls /run/agent-sandbox 2>&1; for d in $({EVERY_DIR}); do grep -rlE '^-----BEGIN (EC |)PRIVATE KEY-----' \"$d\" 2>/dev/null; done | grep -v '^/home/agent/.ssh/' | head; echo keys-done"
            ),
        ),
        (
            "secret-in-memory",
            format!(
                "python3 -c '{}' {} {} 2>&1",
                MEMORY_SCAN.replace('\'', "\""),
                w.halves.0,
                w.halves.1
            ),
        ),
    ]
}

/// `scanned=N found=LIST` of the memory scan: (bytes scanned, whether the token was found).
fn memory_result(text: &str) -> Option<(u64, bool)> {
    let line = text.lines().find(|l| l.starts_with("scanned="))?;
    let mut words = line.split_whitespace();
    let scanned = words.next()?.strip_prefix("scanned=")?.parse().ok()?;
    let found = words.next()?.strip_prefix("found=")? != "none";
    Some((scanned, found))
}

/// The sandbox's own placeholder from a `NAME=VALUE` line of `text`, if it is the fixed
/// prefix, the name and a 32-digit hex suffix (docs/egress.md#placeholders).
pub(super) fn own_placeholder(text: &str) -> Option<String> {
    let start = format!("agent-sandbox-placeholder-{TOKEN_ENV}-");
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{TOKEN_ENV}=")))
        .filter(|v| {
            v.strip_prefix(&start)
                .is_some_and(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .map(str::to_owned)
}

fn podman_run_detached(
    policy: &Path,
    trust: &Path,
    stem: &str,
) -> anyhow::Result<(ContainerGuard, String)> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    sandbox().run_detached(
        &["--runtime-flag", &policy_flag(policy)],
        stem,
        &[
            "-v",
            &format!("{}:{TEST_CA_DIR}:ro", trust.display()),
            TOOLS_IMAGE,
            "sleep",
            "600",
        ],
    )
}

#[test]
fn podman_https_api_gets_the_token_that_never_enters_the_sandbox() -> anyhow::Result<()> {
    let w = World::start()?;
    let policy = w.policy(true)?;
    let (guard, id) = podman_run_detached(&policy, &w.ca.trust_dir(), "htls-inject")?;
    let state = Path::new("/run/agent-sandbox/sandbox").join(&id);

    let curl = |extra: &str, url: &str| {
        format!(
            "curl -sS -m 20 {extra} -w '\\nstatus=%{{http_code}}\\n' -H \"Authorization: Bearer ${TOKEN_ENV}\" {url} 2>&1"
        )
    };
    let mut cases = vec![
        (
            "placeholder",
            format!("echo \"{TOKEN_ENV}=${TOKEN_ENV}\"; echo \"SSL_CERT_FILE=$SSL_CERT_FILE\""),
        ),
        ("api-curl", curl("", &w.api_url("/v1/curl"))),
        (
            "api-issuer",
            format!(
                "curl -sS -v -m 20 -o /dev/null {} 2>&1 | grep -i 'issuer:'",
                w.api_url("/v1/issuer")
            ),
        ),
        (
            "api-system-bundle",
            format!(
                "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS -m 20 -H \"Authorization: Bearer ${TOKEN_ENV}\" {} 2>&1",
                w.api_url("/v1/system-bundle")
            ),
        ),
        (
            "other",
            format!(
                "curl -sS -v -m 20 --cacert {TEST_CA_DIR}/ca.pem -H \"Authorization: Bearer ${TOKEN_ENV}\" {} 2>&1",
                w.other_url("/other")
            ),
        ),
    ];
    cases.extend(hunt(&w, &holder(&w.api_url("/v1/holder"), None)));
    let script = sectioned(&cases);
    let out = sandbox().run(&["exec", &guard.name, "sh", "-c", &script])?;
    let s = sections(&out);
    let get = |name: &str| s.get(name).cloned().unwrap_or_default();
    let mut c = Checks::default();
    let own = own_placeholder(&get("placeholder"));
    c.check(own.is_some(), || {
        format!(
            "the sandbox does not see a placeholder of its own: {}",
            get("placeholder")
        )
    });
    let own = own.unwrap_or_default();
    c.check(
        get("api-curl").contains("api-private-data") && get("api-curl").contains("status=200"),
        || "curl did not get the API's data with the injected token".into(),
    );
    c.check(get("api-issuer").contains(SANDBOX_CA_CN), || {
        "the bound domain was not served with the sandbox CA's certificate".into()
    });
    c.check(
        get("api-system-bundle").contains("api-private-data"),
        || {
            "curl without the trust variables (image system bundle) did not trust the sandbox CA"
                .into()
        },
    );
    c.check(get("holder").contains("holder api-private-data"), || {
        "python urllib (SSL_CERT_FILE) did not get the API's data".into()
    });
    let other = get("other");
    c.check(
        other.contains("other-site-body")
            && other.contains("agent-sandbox e2e test CA")
            && !other.contains(SANDBOX_CA_CN),
        || "the unbound domain was not an opaque tunnel with its server's own certificate".into(),
    );
    let seen = w.other.output();
    c.check(
        seen.iter()
            .any(|l| l == &format!("HDR Authorization: Bearer {own}"))
            && !seen.iter().any(|l| l.contains(&w.token)),
        || format!("the unbound server did not get the placeholder as sent: {seen:?}"),
    );
    let api_seen = w.api.output();
    c.check(
        api_seen
            .iter()
            .filter(|l| **l == format!("HDR Authorization: Bearer {}", w.token))
            .count()
            >= 4,
        || format!("the API did not get the token on each call: {api_seen:?}"),
    );
    c.check(get("secret-in-env").trim_start().starts_with("0\n"), || {
        "the token is in a process environment inside the sandbox".into()
    });
    let files = get("secret-in-files");
    c.check(files.lines().all(|l| l.starts_with("[exit ")), || {
        format!("the token is in files inside the sandbox: {files}")
    });
    match memory_result(&get("secret-in-memory")) {
        Some((scanned, found)) => {
            c.check(scanned > 1 << 20, || {
                format!("the memory scan read only {scanned} bytes")
            });
            c.check(!found, || {
                "the token is in the memory of a process inside the sandbox".into()
            });
        }
        None => c.check(false, || "the memory scan printed no result".into()),
    }
    let keys = get("ca-key");
    c.check(
        keys.contains("keys-done") && keys.lines().filter(|l| l.starts_with('/')).count() == 0,
        || format!("a private key is readable inside the sandbox: {keys}"),
    );
    c.check(
        !out.stdout.contains(&w.token) && !out.stderr.contains(&w.token),
        || "the sandbox printed the token".into(),
    );
    // Host side: the key left the state directory once the proxy read it; the audit log names
    // the header and never the token; no log holds the token.
    c.check(!state.join("tls-ca.key").exists(), || {
        format!("the CA key is still on disk in {}", state.display())
    });
    c.check(state.join("tls-ca.pem").exists(), || {
        "no CA certificate in the state directory".into()
    });
    let audit = Path::new("/run/agent-sandbox/audit").join(format!("{id}.jsonl"));
    let records = net::read_audit(&audit)?;
    let injected = records.iter().filter(|r| {
        r["kind"] == "net"
            && r["data"]["host"] == REGISTRY_HOST
            && r["data"]["credential"]["header"] == "Authorization"
            && r["data"]["credential"]["https"] == true
    });
    c.check(injected.count() >= 4, || {
        format!("no net records with the injected credential: {records:?}")
    });
    for log in [audit.clone(), state.join("proxy.log")] {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        c.check(!text.contains(&w.token), || {
            format!("{} holds the token", log.display())
        });
    }
    c.finish("podman https credential injection", &out)?;
    drop(guard);

    // Without the binding the same call is a plain tunnel and the API refuses it.
    let plain = w.policy(false)?;
    let out = sandbox().run(&[
        "--runtime-flag",
        &policy_flag(&plain),
        "run",
        "--rm",
        "-v",
        &format!("{}:{TEST_CA_DIR}:ro", w.ca.trust_dir().display()),
        "-e",
        &format!("{TOKEN_ENV}=not-the-token"),
        TOOLS_IMAGE,
        "sh",
        "-c",
        &curl(
            &format!("--cacert {TEST_CA_DIR}/ca.pem"),
            &w.api_url("/v1/plain"),
        ),
    ])?;
    ensure!(
        out.stdout.contains("status=401") && !out.stdout.contains("api-private-data"),
        "through a plain tunnel the API should answer 401\n{out}"
    );

    // Baseline: the usual way (the token in the environment) under runc; the same hunt finds
    // it in the environment and in memory, so the checks above can fail.
    let cafile = format!("{TEST_CA_DIR}/ca.pem");
    let script = sectioned(&hunt(&w, &holder(&w.api_url("/v1/runc"), Some(&cafile))));
    let base = runc().host_net_sh(
        &[
            "-v",
            &format!("{}:{TEST_CA_DIR}:ro", w.ca.trust_dir().display()),
            // A CA key handed to the container the naive way, for the key hunt to find.
            "-v",
            &format!("{}:/etc/test-ca-keys:ro", w.ca.dir.path().display()),
            "-e",
            &format!("{TOKEN_ENV}={}", w.token),
        ],
        &script,
    )?;
    let s = sections(&base);
    let get = |name: &str| s.get(name).cloned().unwrap_or_default();
    ensure!(
        get("holder").contains("holder api-private-data")
            && !get("secret-in-env").trim_start().starts_with("0\n")
            && memory_result(&get("secret-in-memory")).is_some_and(|(_, found)| found)
            && get("ca-key").contains("/etc/test-ca-keys/ca.key"),
        "the runc baseline did not find a token passed by environment (env, memory) or a CA key handed over\n{base}"
    );
    Ok(())
}

#[test]
fn ctr_https_api_gets_the_token_through_the_shim() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let w = World::start()?;
    let policy = w.policy(true)?;
    let config = w.dir.path().join("runtime-config.toml");
    std::fs::write(
        &config,
        format!("Policy = {:?}\n", policy.display().to_string()),
    )?;
    let script = sectioned(&[
        (
            "api",
            format!(
                "curl -sS -m 20 -w '\\nstatus=%{{http_code}}\\n' -H \"Authorization: Bearer ${TOKEN_ENV}\" {} 2>&1",
                w.api_url("/v1/ctr")
            ),
        ),
        (
            "secret-in-env",
            w.with_token_sh(
                "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done | grep -cF \"$s\"",
            ),
        ),
    ]);
    let out = ctr::run_rm(
        Shim::AgentSandbox,
        &["--runtime-config-path", &config.display().to_string()],
        TOOLS_IMAGE,
        &ctr::unique_id("htls-ctr"),
        &["sh", "-c", &script],
    )
    .context("ctr run")?;
    let s = sections(&out);
    let get = |name: &str| s.get(name).cloned().unwrap_or_default();
    let mut c = Checks::default();
    c.check(
        get("api").contains("api-private-data") && get("api").contains("status=200"),
        || "the API call through ctr did not carry the injected token".into(),
    );
    c.check(get("secret-in-env").trim_start().starts_with("0\n"), || {
        "the token is in a process environment inside the sandbox".into()
    });
    c.check(!out.stdout.contains(&w.token), || {
        "the sandbox printed the token".into()
    });
    c.finish("ctr https credential injection", &out)
}
