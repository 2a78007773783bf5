//! The proxy's audit writer: every `net` and `approval` record the sandbox's traffic causes
//! goes through the audit gate on a thread of its own, and why the proxy stopped is recorded.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use agent_sandbox_audit::{AuditError, AuditLog, Event, Gate, Passed};
use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::policy::AuditAtCap;
use agent_sandbox_proxy::approval::{AnsweredBy, ApprovalRecord};
use agent_sandbox_proxy::{EgressEvent, Outcome, Stage};

use super::{END_WAIT, ns_id};

/// What the proxy's audit writer gets.
pub(super) enum Written {
    Net(Box<EgressEvent>),
    Approval(ApprovalRecord),
    /// The proxy ends: write what is still counted, then acknowledge.
    End(mpsc::Sender<()>),
}

/// Starts the audit writer ([`write_records`]) of the sandbox whose namespace is `netns`:
/// returns where its records go and its thread.
pub(super) fn start_writer(
    log: AuditLog,
    policy: &SandboxPolicy,
    netns: &Path,
    init: Option<i32>,
) -> (mpsc::Sender<Written>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Written>();
    let cap = policy.network.audit_max_bytes.bytes();
    let stop_at_cap = match (policy.network.audit_at_cap, init, ns_id(netns)) {
        (AuditAtCap::Stop, Some(init), Some(netns_id)) => Some(StopAtCap {
            init,
            netns: netns.to_path_buf(),
            netns_id,
        }),
        _ => None,
    };
    let writer = std::thread::spawn(move || write_records(log, rx, cap, stop_at_cap));
    (tx, writer)
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

/// How often what the rate limits counted is written as a `summary` record.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

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

/// Asks the audit writer to write what it still counts, and waits for it (at most
/// [`END_WAIT`]).
#[derive(Clone)]
pub(super) struct Ender(pub(super) mpsc::Sender<Written>);

impl Ender {
    pub(super) fn end(&self) {
        let (ack, done) = mpsc::channel();
        if self.0.send(Written::End(ack)).is_ok() {
            let _ = done.recv_timeout(END_WAIT);
        }
    }
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

/// Appends why the proxy stopped to the audit log: from then on the sandbox has no network.
pub(super) fn record_stop(audit: &Path, id: &str, reason: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
