//! The sandbox's one door to the network: a per-sandbox egress proxy that runs
//! outside the sandbox (a detached `agent-sandbox proxy` process) and listens on
//! `127.0.0.1:PORT` inside the sandbox's network namespace. The listening socket
//! is bound from outside (setns there and back), so no bridge process runs in the
//! sandbox. If the proxy dies the sandbox has no network at all: its namespace
//! has nothing but `lo`.
//!
//! Every decision the proxy takes is appended to the sandbox's audit log as a
//! `net` record.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use agent_sandbox_audit::{AuditError, AuditLog, Event, Gate, Passed};
use agent_sandbox_policy::network::{SecretSource, header_value_ok};
use agent_sandbox_policy::policy::{AuditAtCap, NetworkMode, SniMismatch};
use agent_sandbox_policy::{SandboxPlan, SandboxPolicy};
use agent_sandbox_proxy::approval::{AnsweredBy, ApprovalRecord};
use agent_sandbox_proxy::error_text::chain;
use agent_sandbox_proxy::{
    Approvals, Credentials, DnsResolver, EgressEvent, InjectedHeader, Outcome, Proxy, ProxyConfig,
    SniCheck, Stage, StandIns,
};
use libcontainer::oci_spec::runtime::Process;

use crate::sidecars::{self, READY};
use crate::state::SandboxDir;

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

/// Appends why the proxy stopped to the audit log: from then on the sandbox has no network.
fn record_stop(audit: &Path, id: &str, reason: &str) {
    tracing::error!(
        id,
        reason,
        "the egress proxy stopped; the sandbox has no network"
    );
    let event = Event::LayerInactive {
        layer: "egress-proxy".to_owned(),
        reason: format!("{reason}; the sandbox has no network from now on"),
    };
    match AuditLog::open(audit, id) {
        Ok(log) => {
            if let Err(e) = log.append(&event) {
                tracing::error!(error = %e, "cannot record the proxy's stop in the audit log");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot open the audit log to record the proxy's stop")
        }
    }
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

/// How often the proxy checks that the sandbox's init still holds the network namespace.
const INIT_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Ends the proxy once the sandbox's init is gone (`netns` is `/proc/PID/ns/net` of the init,
/// or of the pod's pause container): a sandbox whose init exited needs no door out, and a
/// create that was killed before it recorded the proxy's pid must not leak it. The identity
/// of the namespace (device and inode) is compared, so a reused pid cannot keep it alive. The
/// pid file is removed first so that `delete` does not report a dead proxy as a failure.
fn watch_sandbox_init(netns: &Path, pid_file: PathBuf, writer: Ender) {
    let Some(original) = ns_id(netns) else {
        return;
    };
    let netns = netns.to_path_buf();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(INIT_POLL);
            if ns_id(&netns) != Some(original) {
                tracing::info!(netns = %netns.display(), "the sandbox's init is gone; the egress proxy exits");
                let _ = std::fs::remove_file(&pid_file);
                writer.end();
                std::process::exit(0);
            }
        }
    });
}

/// The identity (device, inode) of a namespace file.
fn ns_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// The pid in `/proc/PID/ns/net`.
fn init_of(netns: &Path) -> Option<i32> {
    netns
        .strip_prefix("/proc")
        .ok()?
        .components()
        .next()?
        .as_os_str()
        .to_str()?
        .parse()
        .ok()
}

/// How often what the rate limits counted is written as a `summary` record.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the proxy waits for its writer to write what it still counts when it ends.
const END_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Asks the audit writer to write what it still counts, and waits for it (at most
/// [`END_WAIT`]).
#[derive(Clone)]
struct Ender(mpsc::Sender<Written>);

impl Ender {
    fn end(&self) {
        let (ack, done) = mpsc::channel();
        if self.0.send(Written::End(ack)).is_ok() {
            let _ = done.recv_timeout(END_WAIT);
        }
    }
}

/// The sandbox whose records reached the cap under `audit_at_cap = "stop"`: its init (and
/// with it its PID namespace) is SIGKILLed, while it is still the process that holds the
/// network namespace the proxy serves (a reused pid is left alone).
#[derive(Debug, Clone)]
struct StopAtCap {
    init: i32,
    netns: PathBuf,
    netns_id: (u64, u64),
}

impl StopAtCap {
    fn stop(&self, log: &AuditLog, cap: u64) {
        tracing::error!(
            init = self.init,
            cap,
            "the sandbox's records reached network.audit_max_bytes: stopping it (audit_at_cap = stop)"
        );
        let event = Event::LimitHit {
            limit: "audit_max_bytes".to_owned(),
            count: 1,
            max: Some(cap),
        };
        if let Err(e) = log.append(&event) {
            tracing::error!(error = %e, "cannot record the audit cap's stop");
        }
        if ns_id(&self.netns) == Some(self.netns_id) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.init),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The proxy's audit writer: every record the sandbox drives goes through the gate (a rate
/// per stream, the cap's reserve, counted summaries; docs/audit.md, "The size cap"), on its
/// own thread so the proxy's event loop never waits for an fsync.
fn write_records(
    log: AuditLog,
    rx: mpsc::Receiver<Written>,
    cap: u64,
    stop_at_cap: Option<StopAtCap>,
) {
    let mut gate = Gate::new(cap, Instant::now());
    let mut next_summary = Instant::now() + SUMMARY_EVERY;
    let report = |r: Result<Passed, AuditError>| match r {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot append a record to the audit log");
            Passed::Counted
        }
    };
    loop {
        let now = Instant::now();
        let passed = match rx.recv_timeout(next_summary.saturating_duration_since(now)) {
            Ok(Written::Net(event)) => match net_record(&event) {
                Some(record) => report(gate.offer(&log, record, now)),
                None => continue,
            },
            Ok(Written::Approval(record)) => {
                report(gate.offer(&log, approval_record(&record), now))
            }
            Ok(Written::End(ack)) => {
                if let Err(e) = gate.finish(&log) {
                    tracing::error!(error = %e, "cannot write the audit summaries");
                }
                let _ = ack.send(());
                return;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                next_summary = Instant::now() + SUMMARY_EVERY;
                report(gate.flush(&log))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if let Err(e) = gate.finish(&log) {
                    tracing::error!(error = %e, "cannot write the audit summaries");
                }
                return;
            }
        };
        if passed == Passed::Capped
            && let Some(s) = &stop_at_cap
        {
            s.stop(&log, cap);
        }
    }
}

/// The proxy process's body: binds `127.0.0.1:PORT` in `netns`, reports ready on
/// stdout, then serves until killed. Decisions go to the audit log at `audit`.
#[expect(clippy::too_many_lines)]
pub fn serve(
    netns: impl FnOnce() -> Result<std::path::PathBuf, EgressError>,
    plan: &SandboxPlan,
    audit: &Path,
    id: &str,
    sandbox_dir: &SandboxDir,
) -> Result<(), EgressError> {
    let policy = &plan.policy;
    let log = AuditLog::open(audit, id).map_err(EgressError::Audit)?;
    let credentials = match load_credentials(plan) {
        Ok(c) => c,
        Err(e) => {
            report(&chain(&e));
            return Err(e);
        }
    };
    let pid_file = sandbox_dir.proxy_pid();
    let tls = match load_interceptor(policy, &credentials, sandbox_dir, id) {
        Ok(t) => t,
        Err(e) => {
            report(&chain(&e));
            return Err(e);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(EgressError::Runtime)?;
    // Host-side DNS with a TTL-honouring cache; built inside the runtime it will run on.
    let resolver = {
        let _entered = runtime.enter();
        match DnsResolver::from_system() {
            Ok(r) => r,
            Err(e) => {
                report(&chain(&e));
                return Err(EgressError::Resolver(e));
            }
        }
    };
    // Everything above runs before the sandbox's namespace is known (`prespawn`).
    let netns = match netns() {
        Ok(n) => n,
        Err(e) => {
            report(&chain(&e));
            return Err(e);
        }
    };
    let listener = match agent_sandbox_proxy::bind_in_netns(&netns, policy.network.proxy_port) {
        Ok(l) => l,
        Err(e) => {
            report(&format!("cannot bind the proxy listener: {e}"));
            return Err(EgressError::Listener(e));
        }
    };
    let transparent = if policy.network.transparent {
        // The proxy's port and the local ports stay reachable on loopback; everything else
        // that leaves loopback is redirected to the proxy (docs/egress.md).
        let mut ports = vec![policy.network.proxy_port];
        ports.extend(policy.network.local_ports.iter().copied());
        match agent_sandbox_proxy::transparent_in_netns(&netns, &ports) {
            Ok(sockets) => Some(sockets),
            Err(e) => {
                report(&format!("cannot set up transparent egress: {}", chain(&e)));
                return Err(EgressError::Transparent(e));
            }
        }
    } else {
        None
    };
    let (tx, rx) = mpsc::channel::<Written>();
    let cap = policy.network.audit_max_bytes.bytes();
    let init = init_of(&netns);
    let stop_at_cap = match (policy.network.audit_at_cap, init, ns_id(&netns)) {
        (AuditAtCap::Stop, Some(init), Some(netns_id)) => Some(StopAtCap {
            init,
            netns: netns.clone(),
            netns_id,
        }),
        _ => None,
    };
    let writer = std::thread::spawn(move || write_records(log, rx, cap, stop_at_cap));
    let ender = Ender(tx.clone());
    watch_sandbox_init(&netns, pid_file.clone(), ender.clone());
    // Live allow/deny rules and the decider (docs/egress.md, "Approvals"); their changes go
    // to the same writer.
    let approval_tx = tx.clone();
    let approvals = Arc::new(Approvals::new(
        id,
        policy.network.approvals.as_ref(),
        Arc::new(move |record: &ApprovalRecord| {
            let _ = approval_tx.send(Written::Approval(record.clone()));
        }),
    ));
    let control = match bind_control(sandbox_dir) {
        Ok(c) => c,
        Err(e) => {
            report(&chain(&e));
            return Err(e);
        }
    };
    // Only `finished` events become records: the others are not cloned, sent or woken for.
    let sink = move |event: &EgressEvent| {
        if event.stage == Stage::Finished {
            let _ = tx.send(Written::Net(Box::new(event.clone())));
        }
    };
    let proxy = Proxy::with_config(
        Arc::new(policy.network.allowlist()),
        Arc::new(resolver),
        Arc::new(sink),
        ProxyConfig {
            credentials,
            approvals: Some(Arc::clone(&approvals)),
            sni: match policy.network.sni_mismatch {
                SniMismatch::Deny => SniCheck::Deny,
                SniMismatch::Record => SniCheck::Record,
            },
            tls,
            tool_calls: init.map(|init| {
                Arc::new(crate::sidecars::tool_calls::ExecTags::new(
                    sandbox_dir,
                    id,
                    init,
                )) as Arc<dyn agent_sandbox_proxy::ToolCalls>
            }),
            ..ProxyConfig::default()
        },
    );
    // Release builds abort on panic: record why before the process goes.
    let (hook_audit, hook_id) = (audit.to_path_buf(), id.to_owned());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        record_stop(
            &hook_audit,
            &hook_id,
            &format!("the egress proxy panicked: {info}"),
        );
        previous(info);
    }));
    report(READY);
    let result = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(EgressError::Runtime)?;
        let mut int = signal(SignalKind::interrupt()).map_err(EgressError::Runtime)?;
        let mut hup = signal(SignalKind::hangup()).map_err(EgressError::Runtime)?;
        let control = tokio::net::UnixListener::from_std(control).map_err(EgressError::Runtime)?;
        tokio::spawn(approvals.serve_control(control));
        let redirected = async {
            match transparent {
                Some(sockets) => {
                    proxy
                        .serve_transparent(sockets.tcp, sockets.dns, Arc::new(StandIns::new()))
                        .await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            served = proxy.serve_std(listener) => served.map_err(EgressError::Serve),
            served = redirected => served.map_err(EgressError::Serve),
            _ = term.recv() => Err(EgressError::Signalled { signal: "SIGTERM" }),
            _ = int.recv() => Err(EgressError::Signalled { signal: "SIGINT" }),
            _ = hup.recv() => Err(EgressError::Signalled { signal: "SIGHUP" }),
        }
    });
    // What the writer still counts goes to the log first, whatever ended the proxy.
    ender.end();
    drop(writer);
    match &result {
        // `delete` removes the pid file before it signals: the sandbox ends, orderly.
        Err(EgressError::Signalled { .. }) if !pid_file.exists() => {
            tracing::info!(id, "the sandbox ends; the egress proxy exits");
            Ok(())
        }
        Err(e) => {
            record_stop(audit, id, &chain(e));
            result
        }
        Ok(()) => result,
    }
}

/// What the proxy's audit writer gets.
enum Written {
    Net(Box<EgressEvent>),
    Approval(ApprovalRecord),
    /// The proxy ends: write what is still counted, then acknowledge.
    End(mpsc::Sender<()>),
}

/// Binds the control socket of `agent-sandbox allow`/`deny` in the sandbox's state directory
/// (which the sandbox never sees).
fn bind_control(sandbox_dir: &SandboxDir) -> Result<std::os::unix::net::UnixListener, EgressError> {
    let listener =
        crate::sidecars::allow::bind(sandbox_dir).map_err(|e| EgressError::Control(Box::new(e)))?;
    listener
        .set_nonblocking(true)
        .map_err(EgressError::Runtime)?;
    Ok(listener)
}

/// The audit record of an applied approval.
fn approval_record(record: &ApprovalRecord) -> Event {
    Event::Approval {
        answer: record.answer.name().to_owned(),
        target: record.target.clone(),
        by: match record.by {
            AnsweredBy::Decider => "decider",
            AnsweredBy::Default => "default",
            AnsweredBy::Command => "command",
        }
        .to_owned(),
        reason: record.reason.clone(),
        tool_call_id: record.tool_call_id.clone(),
        tool_call_claimed: record.tool_call_claimed.clone(),
    }
}

/// Writes one status line to the spawner and closes stdout.
fn report(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    // Later writes to stdout (none are made) would go to a closed pipe.
}

/// The audit record of a finished connection (one per connection; the writer's gate decides
/// whether it is written or counted).
fn net_record(event: &EgressEvent) -> Option<Event> {
    if event.stage != Stage::Finished {
        return None;
    }
    let verdict = match event.outcome {
        Outcome::Allowed => agent_sandbox_audit::Verdict::Allow,
        _ => agent_sandbox_audit::Verdict::Deny,
    };
    let suppressed = 0;
    let rule = match (&event.rule, &event.outcome) {
        (Some(rule), Outcome::Allowed | Outcome::Denied) => rule.clone(),
        (_, other) => serde_json::to_value(other)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "refused".to_owned()),
    };
    let duration_ms = u64::try_from(event.duration.as_millis()).unwrap_or(u64::MAX);
    Some(Event::Net {
        verdict,
        rule,
        host: event.host.clone().unwrap_or_default(),
        port: event.port.unwrap_or(0),
        bytes_up: event.bytes_up,
        bytes_down: event.bytes_down,
        duration_ms,
        method: event.method.clone(),
        path: event.path.clone(),
        sni: event.sni.clone(),
        suppressed,
        credential: event
            .credential
            .as_ref()
            .map(|c| agent_sandbox_audit::CredentialUse {
                header: c.header.clone(),
                requests: c.requests,
                https: c.https,
            }),
        tool_call_id: event.tool_call_id.clone(),
        tool_call_claimed: event.tool_call_claimed.clone(),
        container: event.container.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bare(policy: &SandboxPolicy) -> SandboxPlan {
        SandboxPlan::bare(
            policy.clone(),
            agent_sandbox_policy::layers::LayerPlan::default(),
        )
    }

    fn finished(outcome: Outcome) -> EgressEvent {
        EgressEvent {
            stage: Stage::Finished,
            connection: 1,
            client: "127.0.0.1:40000".parse().expect("address"),
            protocol: agent_sandbox_proxy::Protocol::HttpConnect,
            host: Some("blocked.example".to_owned()),
            port: Some(443),
            method: None,
            path: None,
            sni: None,
            rule: Some("default deny".to_owned()),
            address_rule: None,
            resolved: None,
            outcome,
            bytes_up: 0,
            bytes_down: 0,
            duration: std::time::Duration::ZERO,
            credential: None,
            tool_call_id: None,
            container: None,
            tool_call_claimed: None,
        }
    }

    #[test]
    fn denials_are_rate_limited_and_the_next_record_counts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path().join("l.jsonl"), "sb").unwrap();
        let t = Instant::now();
        let mut gate = Gate::new(16 << 20, t);
        let denied = finished(Outcome::Denied);
        let written = (0..1000)
            .filter(|_| {
                gate.offer(&log, net_record(&denied).unwrap(), t).unwrap() == Passed::Written
            })
            .count();
        assert_eq!(written, 50);
        // Allowed connections have their own rate and do not carry the count.
        let allowed = net_record(&finished(Outcome::Allowed)).unwrap();
        assert_eq!(gate.offer(&log, allowed, t).unwrap(), Passed::Written);
        let later = t + std::time::Duration::from_secs(1);
        assert_eq!(
            gate.offer(&log, net_record(&denied).unwrap(), later)
                .unwrap(),
            Passed::Written
        );
        let records = agent_sandbox_audit::read_records(log.path()).unwrap();
        match &records.last().unwrap().event {
            Event::Net { suppressed, .. } => assert_eq!(*suppressed, 950),
            other => panic!("no record after the refill: {other:?}"),
        }
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
