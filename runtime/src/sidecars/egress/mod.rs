//! The sandbox's one door to the network: a per-sandbox egress proxy that runs
//! outside the sandbox (a detached `agent-sandbox proxy` process) and listens on
//! `127.0.0.1:PORT` inside the sandbox's network namespace. The listening socket
//! is bound from outside (setns there and back), so no bridge process runs in the
//! sandbox. If the proxy dies the sandbox has no network at all: its namespace
//! has nothing but `lo`.
//!
//! Every decision the proxy takes is appended to the sandbox's audit log as a
//! `net` record.
//!
//! This module is the door as the runtime sees it: the proxy's start before the sandbox's
//! init exists, the secrets it reads, its environment in the sandbox's processes, its stop.
//! The proxy process's body is [`serve`] (`serve.rs`), its audit writer `records.rs`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_sandbox_audit::AuditError;
use agent_sandbox_policy::network::{SecretSource, header_value_ok};
use agent_sandbox_policy::policy::NetworkMode;
use agent_sandbox_policy::{SandboxPlan, SandboxPolicy};
use agent_sandbox_proxy::{Credentials, InjectedHeader};
use libcontainer::oci_spec::runtime::Process;

use crate::sidecars;
use crate::state::SandboxDir;

mod records;
mod serve;

pub use serve::serve;

/// Errors of the egress door.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("cannot start the egress proxy")]
    Spawn(#[source] std::io::Error),
    #[error("the egress proxy did not come up: {reason}")]
    NotReady { reason: String },
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("cannot bind the proxy listener in the sandbox network namespace")]
    Listener(#[source] agent_sandbox_proxy::ListenerError),
    #[error("cannot set up the proxy's host-side resolver")]
    Resolver(#[source] agent_sandbox_proxy::ResolveError),
    #[error("cannot set up transparent egress (policy network.transparent; docs/egress.md)")]
    Transparent(#[source] agent_sandbox_proxy::TransparentError),
    #[error("cannot start the proxy's event loop")]
    Runtime(#[source] std::io::Error),
    #[error("the egress proxy stopped")]
    Serve(#[source] agent_sandbox_proxy::ProxyError),
    #[error("cannot open the audit log")]
    Audit(#[source] AuditError),
    #[error("cannot read the secret of {key}: environment variable {name}")]
    SecretEnv {
        key: String,
        name: String,
        #[source]
        source: std::env::VarError,
    },
    #[error("cannot read the secret of {key} from {path}", path = path.display())]
    SecretFile {
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the secret of {key} is empty or contains control characters")]
    SecretValue { key: String },
    #[error("cannot set up the approvals control socket")]
    Control(#[source] Box<crate::sidecars::allow::AllowError>),
    #[error("cannot read the sandbox's CA from {path}", path = path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox's CA cannot sign")]
    Ca(#[source] agent_sandbox_proxy::ca::CaError),
    #[error("cannot set up TLS for https credential injection")]
    Tls(#[source] agent_sandbox_proxy::TlsSetupError),
    #[error("the egress proxy got signal {signal}")]
    Signalled { signal: &'static str },
}

/// Reads, on the host side, the secrets of the plan's credential rules and builds the
/// headers the proxy adds, each with the sandbox's own placeholder. The values exist only in
/// the proxy process: never in the sandbox's environment, files or config.
pub fn load_credentials(plan: &SandboxPlan) -> Result<Credentials, EgressError> {
    let policy = &plan.policy;
    let mut entries = Vec::new();
    for (i, c) in policy.network.credentials.iter().enumerate() {
        let key = format!("network.credentials[{i}]");
        let secret = match c.source() {
            // The policy's validation makes this unreachable; refuse rather than skip.
            None => return Err(EgressError::SecretValue { key }),
            Some(SecretSource::Env(name)) => {
                std::env::var(name).map_err(|source| EgressError::SecretEnv {
                    key: format!("{key}.env"),
                    name: name.to_owned(),
                    source,
                })?
            }
            Some(SecretSource::File(path)) => {
                let text = std::fs::read_to_string(path.as_str()).map_err(|source| {
                    EgressError::SecretFile {
                        key: format!("{key}.file"),
                        path: PathBuf::from(path.as_str()),
                        source,
                    }
                })?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                text.strip_suffix('\r').unwrap_or(text).to_owned()
            }
        };
        if secret.is_empty() || !header_value_ok(&secret) {
            return Err(EgressError::SecretValue { key });
        }
        entries.push(InjectedHeader {
            domain: c.domain.clone(),
            name: c.header.clone(),
            value: format!("{}{secret}", c.prefix),
            secret,
            https: c.https,
            placeholder: c
                .placeholder_env
                .as_deref()
                .map(|name| plan.credential_placeholder(name)),
            upstream_ca: c.upstream_ca.as_ref().map(|p| PathBuf::from(p.as_str())),
        });
    }
    Ok(Credentials::new(entries))
}

/// The TLS side of the policy's `https` credentials: the sandbox's CA, loaded from the files
/// `create` left in the sandbox's state directory (the key file is removed once read, so from
/// then on the key exists only in this process), and the upstream trust of each credential.
pub fn load_interceptor(
    policy: &SandboxPolicy,
    credentials: &Credentials,
    sandbox_dir: &SandboxDir,
    id: &str,
) -> Result<Option<Arc<agent_sandbox_proxy::TlsInterceptor>>, EgressError> {
    if !policy.network.terminates_tls() {
        return Ok(None);
    }
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| EgressError::CaFile { path, source })
    };
    let key = read(sandbox_dir.tls_key())?;
    let cert = read(sandbox_dir.tls_cert())?;
    let key_path = sandbox_dir.tls_key();
    std::fs::remove_file(&key_path).map_err(|source| EgressError::CaFile {
        path: key_path,
        source,
    })?;
    let ca = agent_sandbox_proxy::ca::SandboxCa::load(
        id,
        &crate::sidecars::tls_trust::bound_domains(policy),
        &key,
        &cert,
    )
    .map_err(EgressError::Ca)?;
    let tls =
        agent_sandbox_proxy::TlsInterceptor::new(ca, credentials).map_err(EgressError::Tls)?;
    Ok(Some(Arc::new(tls)))
}

/// Whether `policy` gives the sandbox an egress proxy.
pub fn wanted(policy: &SandboxPolicy) -> bool {
    policy.network.mode == NetworkMode::Proxy
}

/// Adds the proxy's environment (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY in both
/// cases, and the variables npm, pip, git and the JVM read) to a process of the
/// sandbox (init or exec). Adding these never widens the sandbox: without the
/// proxy they lead nowhere.
pub fn inject_env(process: &mut Process, policy: &SandboxPolicy) {
    if !wanted(policy) {
        return;
    }
    let mut env = process.env().clone().unwrap_or_default();
    add_env(&mut env, policy.network.proxy_port);
    process.set_env(Some(env));
}

/// Adds the proxy variables to a `KEY=VALUE` list, replacing any the caller set.
pub fn add_env(env: &mut Vec<String>, port: u16) {
    let vars = agent_sandbox_proxy::proxy_env(port);
    env.retain(|kv| {
        let key = kv.split('=').next().unwrap_or_default();
        !vars.iter().any(|(k, _)| k == key)
    });
    env.extend(vars.into_iter().map(|(k, v)| format!("{k}={v}")));
}

/// The value of `proxy --netns` that makes the proxy read its namespace's path from stdin.
pub const NETNS_ON_STDIN: &str = "-";

/// A proxy started before the sandbox's init exists ([`prespawn`]): it loads its policy, audit
/// log, credentials and resolver meanwhile, then waits on stdin for the namespace to bind in.
pub struct PendingProxy(sidecars::Pending);

/// Starts the sandbox's proxy before libcontainer creates the init, so that the proxy's start-up
/// overlaps the create; [`PendingProxy::finish`] gives it the init's network namespace. The pid
/// file is written at once, so a create that fails in between stops it like a running proxy
/// (and a proxy whose stdin closes without a path exits without binding anything).
pub fn prespawn(
    root: &Path,
    sandbox_dir: &SandboxDir,
    id: &str,
) -> Result<PendingProxy, EgressError> {
    // The proxy's own log (warnings, refusals of special addresses, why it stopped) goes to
    // `proxy.log` beside its pid file; its decisions go to the audit log.
    let log = sandbox_dir.proxy_log();
    let args: [&OsStr; 10] = [
        "--root".as_ref(),
        root.as_os_str(),
        "--log".as_ref(),
        log.as_os_str(),
        "--log-format".as_ref(),
        "json".as_ref(),
        "proxy".as_ref(),
        "--netns".as_ref(),
        NETNS_ON_STDIN.as_ref(),
        id.as_ref(),
    ];
    sidecars::start(&args, &sandbox_dir.proxy_pid(), Vec::new())
        .map(PendingProxy)
        .map_err(spawn_error)
}

impl PendingProxy {
    /// Hands the proxy the network namespace of the sandbox whose init is `pid` (with `lo`
    /// up) and waits until its listener is bound there. Returns the proxy's pid.
    pub fn finish(self, id: &str, pid: i32) -> Result<u32, EgressError> {
        let netns = format!("/proc/{pid}/ns/net");
        let proxy_pid = self.0.ready(Some(&netns)).map_err(spawn_error)?;
        tracing::info!(id, proxy_pid, "egress proxy ready");
        Ok(proxy_pid)
    }
}

fn spawn_error(e: sidecars::SpawnError) -> EgressError {
    match e {
        sidecars::SpawnError::Spawn(source) => EgressError::Spawn(source),
        sidecars::SpawnError::File(e) => EgressError::File(e),
        sidecars::SpawnError::NotReady { reason } => EgressError::NotReady { reason },
    }
}

/// Reads the network namespace path a [`prespawn`]ed proxy gets on stdin (one line).
pub fn netns_from_stdin() -> Result<std::path::PathBuf, EgressError> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(EgressError::Spawn)?;
    let path = line.trim_end_matches('\n');
    if path.is_empty() {
        return Err(EgressError::NotReady {
            reason: "no network namespace on stdin (the runtime's create ended)".to_owned(),
        });
    }
    Ok(std::path::PathBuf::from(path))
}

/// What `stop` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The sandbox had no proxy.
    NoProxy,
    /// The proxy was running and was killed.
    Killed,
    /// The proxy had already died: the sandbox had no network from then on.
    WasDead,
}

/// Stops the sandbox's proxy, if it has one: SIGTERM, so it writes what its audit writer
/// still counts (the pending rate and cap summaries), then SIGKILL if it is still there after
/// [`END_WAIT`]. Best effort: used on delete and on a failed create. The pid is only
/// signalled if it still is this sandbox's proxy (a dead proxy's pid may have been reused by
/// another process).
pub fn stop(sandbox_dir: &SandboxDir, id: &str) -> Stopped {
    match sidecars::stop_after(&sandbox_dir.proxy_pid(), "proxy", id, END_WAIT) {
        sidecars::Stopped::NoPidFile => Stopped::NoProxy,
        sidecars::Stopped::Killed => Stopped::Killed,
        sidecars::Stopped::WasDead => {
            tracing::warn!(id, "the egress proxy was not running");
            Stopped::WasDead
        }
    }
}

/// The identity (device, inode) of a namespace file.
fn ns_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// How long the proxy waits for its writer to write what it still counts when it ends.
const END_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn bare(policy: &SandboxPolicy) -> SandboxPlan {
        SandboxPlan::bare(
            policy.clone(),
            agent_sandbox_policy::layers::LayerPlan::default(),
        )
    }

    #[test]
    fn a_pid_that_is_not_the_sandbox_proxy_is_never_signalled() {
        let root = tempfile::tempdir().unwrap();
        let dir = crate::state::StateDirs::new(root.path().to_owned())
            .sandbox(&crate::state::ContainerId::try_from("sb").unwrap());
        std::fs::create_dir_all(dir.path()).unwrap();
        // This test process is alive but is no proxy: stop must leave it alone.
        std::fs::write(dir.proxy_pid(), std::process::id().to_string()).unwrap();
        assert_eq!(stop(&dir, "sb"), Stopped::WasDead);
        assert!(!dir.proxy_pid().exists());
        assert_eq!(stop(&dir, "sb"), Stopped::NoProxy);
    }

    fn policy_with_credential(source: &str) -> SandboxPolicy {
        let text = format!(
            "[network]\nmode = \"proxy\"\nallow = [\"registry.test:8080\"]\n\
             [[network.credentials]]\ndomain = \"registry.test:8080\"\nheader = \"Authorization\"\n\
             prefix = \"Bearer \"\n{source}\n"
        );
        SandboxPolicy::parse(&text, "test.toml").unwrap()
    }

    #[test]
    fn credentials_are_read_on_the_host_side() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let p = policy_with_credential(&format!("file = {:?}", file.display().to_string()));
        let c = load_credentials(&bare(&p)).unwrap();
        let host = agent_sandbox_proxy::Host::parse("registry.test").unwrap();
        let found = c.find(&host, 8080).unwrap();
        assert_eq!(found.value, "Bearer s3cret");

        let missing = policy_with_credential("env = \"AGENT_SANDBOX_TEST_NO_SUCH_VAR\"");
        let e = load_credentials(&bare(&missing)).unwrap_err();
        assert!(
            matches!(&e, EgressError::SecretEnv { key, .. } if key == "network.credentials[0].env"),
            "{e}"
        );
        std::fs::write(&file, "a\nInjected: 1\n").unwrap();
        assert!(matches!(
            load_credentials(&bare(&p)),
            Err(EgressError::SecretValue { .. })
        ));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            load_credentials(&bare(&p)),
            Err(EgressError::SecretFile { .. })
        ));
    }

    #[test]
    fn env_replaces_caller_proxy_variables() {
        let mut env = vec![
            "PATH=/bin".to_owned(),
            "HTTP_PROXY=http://evil.example:80".to_owned(),
        ];
        add_env(&mut env, 3128);
        assert!(env.contains(&"PATH=/bin".to_owned()));
        assert!(!env.iter().any(|kv| kv.contains("evil.example")));
        assert!(env.contains(&"HTTP_PROXY=http://127.0.0.1:3128".to_owned()));
    }
}
