//! The egress proxy process's body ([`serve`]): its start-up steps, each of which tells the
//! spawner why it failed, then the proxy until the sandbox ends.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use agent_sandbox_audit::AuditLog;
use agent_sandbox_policy::policy::SniMismatch;
use agent_sandbox_policy::{SandboxPlan, SandboxPolicy};
use agent_sandbox_proxy::approval::ApprovalRecord;
use agent_sandbox_proxy::error_text::chain;
use agent_sandbox_proxy::{
    Approvals, DnsResolver, EgressEvent, Proxy, ProxyConfig, SniCheck, Stage, StandIns,
};

use super::records::{Ender, Written, record_stop, start_writer};
use super::{EgressError, load_credentials, load_interceptor, ns_id};
use crate::sidecars::READY;
use crate::state::SandboxDir;

/// The proxy process's body: binds `127.0.0.1:PORT` in `netns`, reports ready on
/// stdout, then serves until killed. Decisions go to the audit log at `audit`.
///
/// The steps up to the namespace run before the sandbox's init exists (`prespawn`); a step
/// that fails tells the spawner why on the status line, in place of [`READY`].
pub fn serve(
    netns: impl FnOnce() -> Result<std::path::PathBuf, EgressError>,
    plan: &SandboxPlan,
    audit: &Path,
    id: &str,
    sandbox_dir: &SandboxDir,
) -> Result<(), EgressError> {
    let policy = &plan.policy;
    let log = AuditLog::open(audit, id).map_err(EgressError::Audit)?;
    let credentials = reported(load_credentials(plan), |e| chain(e))?;
    let tls = reported(
        load_interceptor(policy, &credentials, sandbox_dir, id),
        |e| chain(e),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(EgressError::Runtime)?;
    let resolver = host_resolver(&runtime)?;
    let netns = reported(netns(), |e| chain(e))?;
    let doors = Doors::bind(policy, &netns)?;
    let init = init_of(&netns);
    let (records, writer) = start_writer(log, policy, &netns, init);
    let pid_file = sandbox_dir.proxy_pid();
    let ender = Ender(records.clone());
    watch_sandbox_init(&netns, pid_file.clone(), ender.clone());
    let approvals = live_approvals(id, policy, records.clone());
    let control = reported(bind_control(sandbox_dir), |e| chain(e))?;
    let proxy = build_proxy(
        policy,
        resolver,
        records,
        ProxyConfig {
            credentials,
            approvals: Some(Arc::clone(&approvals)),
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
    record_panics(audit, id);
    report(READY);
    let result = runtime.block_on(run(&proxy, approvals, control, doors));
    // What the writer still counts goes to the log first, whatever ended the proxy.
    ender.end();
    drop(writer);
    ended(result, &pid_file, audit, id)
}

/// Shows a failed step to the spawner as `line(error)` and passes the error on: every step
/// of [`serve`] before [`READY`] ends this way.
fn reported<T, E>(result: Result<T, E>, line: impl FnOnce(&E) -> String) -> Result<T, E> {
    result.inspect_err(|e| report(&line(e)))
}

/// Host-side DNS with a TTL-honouring cache; built inside the runtime it will run on.
fn host_resolver(runtime: &tokio::runtime::Runtime) -> Result<DnsResolver, EgressError> {
    let _entered = runtime.enter();
    reported(DnsResolver::from_system(), |e| chain(e)).map_err(EgressError::Resolver)
}

/// The sockets the sandbox's traffic arrives on, bound in its network namespace.
struct Doors {
    /// `127.0.0.1:PORT`, the proxy the sandbox's environment names.
    listener: std::net::TcpListener,
    /// With `network.transparent`, where the traffic that ignores the proxy is redirected.
    transparent: Option<agent_sandbox_proxy::TransparentSockets>,
}

impl Doors {
    fn bind(policy: &SandboxPolicy, netns: &Path) -> Result<Self, EgressError> {
        let listener = reported(
            agent_sandbox_proxy::bind_in_netns(netns, policy.network.proxy_port),
            |e| format!("cannot bind the proxy listener: {e}"),
        )
        .map_err(EgressError::Listener)?;
        let transparent = if policy.network.transparent {
            // The proxy's port and the local ports stay reachable on loopback; everything
            // else that leaves loopback is redirected to the proxy (docs/egress.md).
            let mut ports = vec![policy.network.proxy_port];
            ports.extend(policy.network.local_ports.iter().copied());
            let sockets = reported(
                agent_sandbox_proxy::transparent_in_netns(netns, &ports),
                |e| format!("cannot set up transparent egress: {}", chain(e)),
            )
            .map_err(EgressError::Transparent)?;
            Some(sockets)
        } else {
            None
        };
        Ok(Self {
            listener,
            transparent,
        })
    }
}

/// Live allow/deny rules and the decider (docs/egress.md, "Approvals"); their changes go to
/// the audit writer.
fn live_approvals(
    id: &str,
    policy: &SandboxPolicy,
    records: mpsc::Sender<Written>,
) -> Arc<Approvals> {
    Arc::new(Approvals::new(
        id,
        policy.network.approvals.as_ref(),
        Arc::new(move |record: &ApprovalRecord| {
            let _ = records.send(Written::Approval(record.clone()));
        }),
    ))
}

/// The proxy of the policy's allowlist and server-name check, with `config`'s credentials,
/// approvals, TLS and tool calls; its finished connections go to the audit writer.
fn build_proxy(
    policy: &SandboxPolicy,
    resolver: DnsResolver,
    records: mpsc::Sender<Written>,
    config: ProxyConfig,
) -> Proxy {
    // Only `finished` events become records: the others are not cloned, sent or woken for.
    let sink = move |event: &EgressEvent| {
        if event.stage == Stage::Finished {
            let _ = records.send(Written::Net(Box::new(event.clone())));
        }
    };
    Proxy::with_config(
        Arc::new(policy.network.allowlist()),
        Arc::new(resolver),
        Arc::new(sink),
        ProxyConfig {
            sni: match policy.network.sni_mismatch {
                SniMismatch::Deny => SniCheck::Deny,
                SniMismatch::Record => SniCheck::Record,
            },
            ..config
        },
    )
}

/// Release builds abort on panic: record why before the process goes.
fn record_panics(audit: &Path, id: &str) {
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
}

/// Serves the control socket, the proxy's port and the redirected traffic until one of them
/// fails or a signal ends the proxy.
async fn run(
    proxy: &Proxy,
    approvals: Arc<Approvals>,
    control: std::os::unix::net::UnixListener,
    doors: Doors,
) -> Result<(), EgressError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(EgressError::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(EgressError::Runtime)?;
    let mut hup = signal(SignalKind::hangup()).map_err(EgressError::Runtime)?;
    let control = tokio::net::UnixListener::from_std(control).map_err(EgressError::Runtime)?;
    tokio::spawn(approvals.serve_control(control));
    let redirected = async {
        match doors.transparent {
            Some(sockets) => {
                proxy
                    .serve_transparent(sockets.tcp, sockets.dns, Arc::new(StandIns::new()))
                    .await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        served = proxy.serve_std(doors.listener) => served.map_err(EgressError::Serve),
        served = redirected => served.map_err(EgressError::Serve),
        _ = term.recv() => Err(EgressError::Signalled { signal: "SIGTERM" }),
        _ = int.recv() => Err(EgressError::Signalled { signal: "SIGINT" }),
        _ = hup.recv() => Err(EgressError::Signalled { signal: "SIGHUP" }),
    }
}

/// The proxy's end: orderly when `delete` signalled it, else recorded in the audit log.
fn ended(
    result: Result<(), EgressError>,
    pid_file: &Path,
    audit: &Path,
    id: &str,
) -> Result<(), EgressError> {
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

/// Writes one status line to the spawner and closes stdout.
fn report(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    // Later writes to stdout (none are made) would go to a closed pipe.
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
