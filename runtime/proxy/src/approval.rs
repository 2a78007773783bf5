//! Approvals: live changes to a running sandbox's allowlist (docs/egress.md, "Approvals").
//!
//! A connection to a host that the policy's allow list does not name, but the approvals
//! ceiling does, is held while a *decider* on the host is asked. The question is one JSON
//! object, the answer one JSON object, one exchange per connection, over a Unix socket or a
//! loopback HTTP `POST`:
//!
//! ```text
//! -> {"sandbox":"ID","host":"api.example.com","port":443,"protocol":"http-connect","tool_call_id":"toolu_1","tool_call_claimed":"toolu_2"}
//! <- {"answer":"allow-once"|"allow-always"|"deny","reason":"optional text shown to the tool"}
//! ```
//!
//! `allow-always` adds `host:port` to the sandbox's live allow rules for its life. The
//! decider's answer is hostile input: it is read up to [`MAX_ANSWER_BYTES`], must be exactly
//! that shape, and its reason is bounded and free of control characters; anything else, an
//! error or no answer within the timeout gets the policy's default answer, with the cause as
//! its reason. `agent-sandbox allow|deny ID RULE` reach the same live rules through a control
//! socket that only the proxy's own user can use ([`Approvals::serve_control`]).
//!
//! Whatever a decider or `allow` says, the policy's deny rules still win, nothing outside the
//! ceiling opens, and the proxy's address checks still refuse loopback, private and metadata
//! addresses unless the ceiling names that exact address.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox_policy::approvals::{Approvals as Policy, Decider, DefaultAnswer};
use agent_sandbox_policy::network::{Allowlist, DomainRule, HostPattern};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

use crate::error_text::chain;
use crate::events::Protocol;
use crate::rules::{EgressRules, Host, Verdict};

/// The request header a tool may set to name its tool call. The sandbox writes it, so the
/// decider and the audit get it only as `tool_call_claimed`, beside the runtime's own
/// `tool_call_id` ([`ToolCall`]); the proxy strips it before forwarding a plain HTTP request.
pub const TOOL_CALL_HEADER: &str = "X-Agent-Sandbox-Tool-Call";

/// The most bytes of a decider's answer read (HTTP: head and body).
pub const MAX_ANSWER_BYTES: usize = 8192;

/// The longest reason (in characters) a decider may give.
pub const MAX_REASON_CHARS: usize = 256;

/// The longest tool-call id passed on.
pub const MAX_TOOL_CALL_CHARS: usize = 128;

/// Decider questions in flight at once; further connections wait (within their timeout).
const MAX_PENDING: usize = 8;

/// The largest request on the control socket.
const MAX_CONTROL_BYTES: u64 = 4096;

/// The rule a connection is refused under when nothing matched.
const DEFAULT_DENY: &str = "default deny";

/// A tool-call id as sent in [`TOOL_CALL_HEADER`], if it is one: 1 to
/// [`MAX_TOOL_CALL_CHARS`] characters of `A-Z a-z 0-9 . _ : -`. Anything else is dropped.
pub fn tool_call_id(value: &[u8]) -> Option<String> {
    let ok = !value.is_empty()
        && value.len() <= MAX_TOOL_CALL_CHARS
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(b));
    ok.then(|| String::from_utf8_lossy(value).into_owned())
}

/// The tool call of a connection: the one the runtime attributes it to (the exec whose
/// process opened it, `crate::ToolCalls`), and the one its header claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolCall<'a> {
    /// The runtime's: the id the harness gave the exec whose process opened the connection.
    pub id: Option<&'a str>,
    /// The request's [`TOOL_CALL_HEADER`]: written by the sandbox, so only a claim.
    pub claimed: Option<&'a str>,
}

/// A decider's answer, and what the live rules record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// Let this one connection through.
    AllowOnce,
    /// Let this and every later connection to the same `host:port` through, for the
    /// sandbox's life.
    AllowAlways,
    /// Refuse this connection (the next one is asked again).
    Deny,
}

impl Answer {
    /// The answer's name as written in the protocol.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllowOnce => "allow-once",
            Self::AllowAlways => "allow-always",
            Self::Deny => "deny",
        }
    }
}

/// Who gave an answer that was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnsweredBy {
    /// The decider answered.
    Decider,
    /// The decider did not answer (in time, or validly): the policy's default applied.
    Default,
    /// `agent-sandbox allow` or `deny` on the host.
    Command,
}

/// One applied approval, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalRecord {
    /// The answer applied.
    pub answer: Answer,
    /// `host:port` asked about, or the rule a command added.
    pub target: String,
    /// Who answered.
    pub by: AnsweredBy,
    /// The decider's reason, or why the default applied.
    pub reason: Option<String>,
    /// The runtime's tool call of the connection ([`ToolCall::id`]).
    pub tool_call_id: Option<String>,
    /// The tool call the connection's header claimed ([`ToolCall::claimed`]).
    pub tool_call_claimed: Option<String>,
}

/// The question sent to the decider.
#[derive(Debug, Clone, Serialize)]
pub struct Question<'a> {
    /// The sandbox's id.
    pub sandbox: &'a str,
    /// The host asked for (a name, or an IP literal; IPv6 in brackets).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// How the tool spoke to the proxy.
    pub protocol: Protocol,
    /// The tool call of the exec whose process opened the connection, as the runtime knows
    /// it (never a header the sandbox wrote).
    pub tool_call_id: Option<&'a str>,
    /// The tool call the request's [`TOOL_CALL_HEADER`] claimed: the sandbox wrote it.
    pub tool_call_claimed: Option<&'a str>,
}

/// The decider's answer as it must be written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reply {
    answer: Answer,
    #[serde(default)]
    reason: Option<String>,
}

/// Why asking the decider gave no valid answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Connecting, writing or reading failed.
    #[error("decider unreachable")]
    Io(#[source] std::io::Error),
    /// More than [`MAX_ANSWER_BYTES`] came back.
    #[error("decider answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    /// The HTTP answer was not a complete `200` response.
    #[error("decider answered HTTP status {status}, not 200")]
    Status {
        /// The status.
        status: u16,
    },
    /// The HTTP answer's head did not parse.
    #[error("decider's HTTP answer is malformed")]
    Http,
    /// The body is not the answer object.
    #[error("decider answer is not valid")]
    Json(#[source] serde_json::Error),
    /// The reason is too long or holds control characters.
    #[error(
        "decider's reason is longer than {MAX_REASON_CHARS} characters or holds control characters"
    )]
    Reason,
}

/// A refusal of `agent-sandbox allow` or `deny`.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The rule does not parse.
    #[error("RULE `{rule}` is not a domain rule: {reason} (docs/egress.md)")]
    Rule {
        /// The rule as given.
        rule: String,
        /// Why.
        reason: String,
    },
    /// The policy has no approvals table.
    #[error(
        "the sandbox's policy has no network.approvals ceiling, so nothing can be allowed live (docs/egress.md, \"Approvals\")"
    )]
    NoCeiling,
    /// The rule reaches beyond the ceiling.
    #[error(
        "RULE `{rule}` is outside the sandbox's network.approvals.ceiling (docs/egress.md, \"Approvals\")"
    )]
    OutsideCeiling {
        /// The rule.
        rule: String,
    },
}

/// A change asked for on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// `allow` or `deny`.
    pub action: ChangeAction,
    /// The domain rule (as in `network.allow`).
    pub rule: String,
}

/// What a [`Change`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeAction {
    /// Add a live allow rule (within the ceiling).
    Allow,
    /// Add a live deny rule (always possible: it only narrows).
    Deny,
}

/// The control socket's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeReply {
    /// Whether the change was applied.
    pub ok: bool,
    /// What was applied, or why not.
    pub message: String,
}

/// How to reach the decider.
#[derive(Debug, Clone)]
enum Endpoint {
    Unix(PathBuf),
    Http {
        addr: std::net::SocketAddr,
        path: String,
    },
}

/// A live rule added by a decider's `allow-always` or by a command; the latest match wins.
#[derive(Debug, Clone)]
struct LiveRule {
    allow: bool,
    rule: DomainRule,
    by: &'static str,
}

/// The records an [`Approvals`] hands out: called on the proxy's tasks, must not block.
pub type ApprovalSink = Arc<dyn Fn(&ApprovalRecord) + Send + Sync>;

/// One sandbox's approvals: the ceiling, the decider, and the live rules.
pub struct Approvals {
    sandbox: String,
    policy: Option<Policy>,
    endpoint: Option<Endpoint>,
    /// The ceiling's exact IP rules: addresses an approved host may reach although they
    /// are in a refused range.
    special: Allowlist,
    live: Mutex<Vec<LiveRule>>,
    pending: Semaphore,
    sink: ApprovalSink,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("sandbox", &self.sandbox)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The verdict on a connection, and whether an approval (not the static list) gave it.
#[derive(Debug, Clone)]
pub struct Decided<'a> {
    /// The verdict, its rule naming who decided (shown to the tool on a refusal).
    pub verdict: Verdict,
    approved_by: Option<&'a Approvals>,
}

impl Decided<'_> {
    /// A verdict of the static policy alone (a proxy without approvals).
    pub fn fixed(verdict: Verdict) -> Decided<'static> {
        Decided {
            verdict,
            approved_by: None,
        }
    }

    /// The ceiling rule that lets an approved connection reach `addr` although it is in a
    /// refused range (none for connections the static policy decided).
    pub fn allows_special_address(&self, port: u16, addr: IpAddr) -> Option<String> {
        let approvals = self.approved_by?;
        let d = approvals
            .special
            .decide(&addr.to_canonical().to_string(), port);
        d.allowed
            .then(|| format!("{} (network.approvals.ceiling)", d.rule))
    }
}

impl Approvals {
    /// The approvals of sandbox `sandbox` under `policy` (none: only `deny` can be used).
    pub fn new(sandbox: &str, policy: Option<&Policy>, sink: ApprovalSink) -> Self {
        let endpoint = policy.and_then(|p| p.decider.as_ref()).map(|d| match d {
            Decider::Unix(path) => Endpoint::Unix(PathBuf::from(path)),
            Decider::Http { addr, port, path } => Endpoint::Http {
                addr: std::net::SocketAddr::new(*addr, *port),
                path: path.clone(),
            },
        });
        let special = Allowlist::new(
            policy
                .map(|p| {
                    p.ceiling
                        .iter()
                        .filter(|r| matches!(r.host(), HostPattern::Ip(_)))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            Vec::new(),
        );
        Self {
            sandbox: sandbox.to_owned(),
            policy: policy.cloned(),
            endpoint,
            special,
            live: Mutex::new(Vec::new()),
            pending: Semaphore::new(MAX_PENDING),
            sink,
        }
    }

    fn live_match(&self, host: &str, port: u16) -> Option<LiveRule> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.iter()
            .rev()
            .find(|l| l.rule.matches_host(host, port))
            .cloned()
    }

    /// Whether a connection to `host` could be opened by an approval on some port: the latest
    /// live rule naming it allows, or none does and a decider may be asked because the ceiling
    /// covers it. The DNS stub of `network.transparent` answers such names as well, so a
    /// proxy-unaware tool's connection reaches the proxy and is decided (and asked about)
    /// like a proxied one.
    pub fn may_open(&self, host: &Host) -> bool {
        let name = host.to_string();
        let port_of = |r: &DomainRule| r.port().unwrap_or(443);
        {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(latest) = live
                .iter()
                .rev()
                .find(|l| l.rule.matches_host(&name, port_of(&l.rule)))
            {
                return latest.allow;
            }
        }
        self.endpoint.is_some()
            && self
                .policy
                .as_ref()
                .is_some_and(|p| p.ceiling.iter().any(|r| r.matches_host(&name, port_of(r))))
    }

    fn push_live(&self, rule: LiveRule) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        // A tool looping on one host must not grow the list: replace an equal rule.
        live.retain(|l| l.rule != rule.rule);
        live.push(rule);
    }

    /// Decides a connection: the policy's deny rules, then the live rules (latest first),
    /// then the policy's allow rules, then, for a host within the ceiling, the decider.
    pub async fn decide(
        &self,
        rules: &dyn EgressRules,
        host: &Host,
        port: u16,
        protocol: Protocol,
        tool_call: ToolCall<'_>,
    ) -> Decided<'_> {
        let verdict = rules.decide(host, port);
        if !verdict.allowed && verdict.rule != DEFAULT_DENY {
            // A deny rule of the policy (or an invalid host): nothing overrides it.
            return Decided::fixed(verdict);
        }
        let name = host.to_string();
        if let Some(live) = self.live_match(&name, port) {
            return self.by_live_rule(&live);
        }
        if verdict.allowed {
            return Decided::fixed(verdict);
        }
        let (Some(policy), Some(endpoint)) = (&self.policy, &self.endpoint) else {
            return Decided::fixed(verdict);
        };
        if !policy.ceiling_covers_host(&name, port) {
            return Decided::fixed(verdict);
        }
        let question = Question {
            sandbox: &self.sandbox,
            host: name,
            port,
            protocol,
            tool_call_id: tool_call.id,
            tool_call_claimed: tool_call.claimed,
        };
        let answered = self.ask_within(policy, endpoint, &question).await;
        let target = format!("{}:{port}", question.host);
        self.record_answer(&question, &target, &answered);
        self.by_answer(&target, answered)
    }

    /// The verdict of the latest live rule that names the connection's host.
    fn by_live_rule(&self, live: &LiveRule) -> Decided<'_> {
        let rule = format!(
            "{} {} ({})",
            if live.allow { "allow" } else { "deny" },
            live.rule,
            live.by
        );
        if live.allow {
            Decided {
                verdict: Verdict::allow(rule),
                approved_by: Some(self),
            }
        } else {
            Decided::fixed(Verdict::deny(rule))
        }
    }

    /// Asks the decider within the policy's timeout (waiting for a place among the questions
    /// in flight counts in it); without a reply in time, the policy's default answers.
    async fn ask_within(
        &self,
        policy: &Policy,
        endpoint: &Endpoint,
        question: &Question<'_>,
    ) -> Answered {
        let wait = policy.timeout.as_duration();
        let asked = timeout(wait, async {
            // The permit bounds the questions in flight; waiting for it counts in the timeout.
            let _permit = self.pending.acquire().await;
            ask(endpoint, question).await
        })
        .await;
        match asked {
            Ok(Ok(reply)) => Answered {
                answer: reply.answer,
                by: AnsweredBy::Decider,
                reason: reply.reason,
            },
            Ok(Err(e)) => Answered {
                answer: default_answer(policy.default),
                by: AnsweredBy::Default,
                reason: Some(chain(&e)),
            },
            Err(_) => Answered {
                answer: default_answer(policy.default),
                by: AnsweredBy::Default,
                reason: Some(format!("decider did not answer within {}s", wait.as_secs())),
            },
        }
    }

    /// Logs the answer to `question` and hands its record to the sink.
    fn record_answer(&self, question: &Question<'_>, target: &str, answered: &Answered) {
        let Answered { answer, by, reason } = answered;
        tracing::info!(
            target: "agent_sandbox::egress",
            host = %question.host,
            port = question.port,
            answer = answer.name(),
            by = ?by,
            reason = reason.as_deref().unwrap_or(""),
            tool_call_id = question.tool_call_id.unwrap_or(""),
            tool_call_claimed = question.tool_call_claimed.unwrap_or(""),
            "egress approval"
        );
        (self.sink)(&ApprovalRecord {
            answer: *answer,
            target: target.to_owned(),
            by: *by,
            reason: reason.clone(),
            tool_call_id: question.tool_call_id.map(str::to_owned),
            tool_call_claimed: question.tool_call_claimed.map(str::to_owned),
        });
    }

    /// The verdict of an answer about `target`; "allow always" adds a live rule for it.
    fn by_answer(&self, target: &str, answered: Answered) -> Decided<'_> {
        let Answered { answer, by, reason } = answered;
        let who = match by {
            AnsweredBy::Default => "default answer",
            _ => "decider",
        };
        let with_reason = |text: String| match &reason {
            Some(r) if !r.is_empty() => format!("{text}: {r}"),
            _ => text,
        };
        match answer {
            Answer::Deny => Decided::fixed(Verdict::deny(with_reason(format!("denied by {who}")))),
            Answer::AllowOnce => Decided {
                verdict: Verdict::allow(with_reason(format!("allowed once by {who}"))),
                approved_by: Some(self),
            },
            Answer::AllowAlways => {
                if let Ok(rule) = DomainRule::parse(target) {
                    self.push_live(LiveRule {
                        allow: true,
                        rule,
                        by: "decider",
                    });
                }
                Decided {
                    verdict: Verdict::allow(with_reason(format!("allowed always by {who}"))),
                    approved_by: Some(self),
                }
            }
        }
    }

    /// Applies `agent-sandbox allow` or `deny`: adds a live rule (an allow only within the
    /// ceiling) and records it.
    pub fn apply(&self, change: &Change) -> Result<String, ChangeError> {
        let rule = DomainRule::parse(&change.rule).map_err(|e| ChangeError::Rule {
            rule: change.rule.clone(),
            reason: e.to_string(),
        })?;
        let allow = change.action == ChangeAction::Allow;
        if allow {
            let Some(policy) = &self.policy else {
                return Err(ChangeError::NoCeiling);
            };
            if !policy.ceiling_covers_rule(&rule) {
                return Err(ChangeError::OutsideCeiling {
                    rule: rule.to_string(),
                });
            }
        }
        let text = rule.to_string();
        let by = if allow {
            "agent-sandbox allow"
        } else {
            "agent-sandbox deny"
        };
        self.push_live(LiveRule { allow, rule, by });
        tracing::info!(target: "agent_sandbox::egress", rule = %text, allow, "egress rule changed live");
        (self.sink)(&ApprovalRecord {
            answer: if allow {
                Answer::AllowAlways
            } else {
                Answer::Deny
            },
            target: text.clone(),
            by: AnsweredBy::Command,
            reason: None,
            tool_call_id: None,
            tool_call_claimed: None,
        });
        Ok(format!(
            "{} {text} for the life of sandbox {}",
            if allow { "allowed" } else { "denied" },
            self.sandbox
        ))
    }

    /// Serves the control socket: one [`Change`] per connection, answered with a
    /// [`ChangeReply`]. Only a peer with the proxy's own effective uid is heard (the socket's
    /// directory is the sandbox's state directory on the host, which the sandbox never sees).
    pub async fn serve_control(self: Arc<Self>, listener: UnixListener) {
        let me = nix::unistd::geteuid().as_raw();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                let _ = timeout(Duration::from_secs(5), this.control_one(stream, me)).await;
            });
        }
    }

    async fn control_one(&self, mut stream: UnixStream, me: u32) {
        let reply = match stream.peer_cred() {
            Ok(cred) if cred.uid() == me => {
                let mut text = Vec::new();
                let read = (&mut stream)
                    .take(MAX_CONTROL_BYTES)
                    .read_to_end(&mut text)
                    .await;
                match read.map(|_| serde_json::from_slice::<Change>(&text)) {
                    Ok(Ok(change)) => match self.apply(&change) {
                        Ok(message) => ChangeReply { ok: true, message },
                        Err(e) => ChangeReply {
                            ok: false,
                            message: e.to_string(),
                        },
                    },
                    _ => ChangeReply {
                        ok: false,
                        message: "malformed control request".to_owned(),
                    },
                }
            }
            _ => {
                tracing::warn!("control socket peer is not the proxy's user; refused");
                ChangeReply {
                    ok: false,
                    message: "permission denied".to_owned(),
                }
            }
        };
        if let Ok(mut line) = serde_json::to_vec(&reply) {
            line.push(b'\n');
            let _ = stream.write_all(&line).await;
        }
        let _ = stream.shutdown().await;
    }
}

/// The answer to a question, who gave it and why.
struct Answered {
    answer: Answer,
    by: AnsweredBy,
    reason: Option<String>,
}

fn default_answer(d: DefaultAnswer) -> Answer {
    match d {
        DefaultAnswer::Deny => Answer::Deny,
        DefaultAnswer::AllowOnce => Answer::AllowOnce,
    }
}

/// Asks the decider once.
async fn ask(endpoint: &Endpoint, question: &Question<'_>) -> Result<Reply, AskError> {
    let body = serde_json::to_vec(question).map_err(AskError::Json)?;
    let raw = match endpoint {
        Endpoint::Unix(path) => {
            let mut stream = UnixStream::connect(path).await.map_err(AskError::Io)?;
            let mut line = body;
            line.push(b'\n');
            stream.write_all(&line).await.map_err(AskError::Io)?;
            stream.shutdown().await.map_err(AskError::Io)?;
            read_bounded(&mut stream).await?
        }
        Endpoint::Http { addr, path } => {
            let mut stream = TcpStream::connect(addr).await.map_err(AskError::Io)?;
            let mut request = format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            request.extend_from_slice(&body);
            stream.write_all(&request).await.map_err(AskError::Io)?;
            let raw = read_bounded(&mut stream).await?;
            http_body(&raw)?
        }
    };
    parse_reply(&raw)
}

/// Reads to EOF, refusing more than [`MAX_ANSWER_BYTES`].
async fn read_bounded<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Vec<u8>, AskError> {
    let mut raw = Vec::new();
    let limit = u64::try_from(MAX_ANSWER_BYTES).unwrap_or(u64::MAX) + 1;
    reader
        .take(limit)
        .read_to_end(&mut raw)
        .await
        .map_err(AskError::Io)?;
    if raw.len() > MAX_ANSWER_BYTES {
        return Err(AskError::TooLarge);
    }
    Ok(raw)
}

/// The body of a complete `200` HTTP response.
fn http_body(raw: &[u8]) -> Result<Vec<u8>, AskError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(raw) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return Err(AskError::Http),
    };
    let status = response.code.unwrap_or(0);
    if status != 200 {
        return Err(AskError::Status { status });
    }
    let body = raw.get(len..).unwrap_or_default();
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| {
            std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or(AskError::Http)
        })
        .transpose()?;
    match length {
        Some(n) => body.get(..n).map(<[u8]>::to_vec).ok_or(AskError::Http),
        None => Ok(body.to_vec()),
    }
}

fn parse_reply(raw: &[u8]) -> Result<Reply, AskError> {
    let reply: Reply = serde_json::from_slice(raw.trim_ascii()).map_err(AskError::Json)?;
    if let Some(reason) = &reply.reason
        && (reason.chars().count() > MAX_REASON_CHARS || reason.chars().any(char::is_control))
    {
        return Err(AskError::Reason);
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fixed(Allowlist);

    impl EgressRules for Fixed {
        fn decide(&self, host: &Host, port: u16) -> Verdict {
            let d = self.0.decide(&host.to_string(), port);
            Verdict {
                allowed: d.allowed,
                rule: d.rule,
            }
        }
    }

    fn rule(r: &str) -> DomainRule {
        DomainRule::parse(r).unwrap()
    }

    fn policy(decider: Option<Decider>, timeout_secs: &str, ceiling: &[&str]) -> Policy {
        Policy {
            decider,
            timeout: agent_sandbox_policy::value::Seconds::try_from(timeout_secs).unwrap(),
            default: DefaultAnswer::Deny,
            ceiling: ceiling.iter().map(|r| rule(r)).collect(),
        }
    }

    fn recorder() -> (ApprovalSink, Arc<Mutex<Vec<ApprovalRecord>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        (
            Arc::new(move |r: &ApprovalRecord| s.lock().unwrap().push(r.clone())),
            seen,
        )
    }

    /// A decider on a Unix socket answering `answers` in turn, counting questions.
    fn decider(dir: &std::path::Path, answers: Vec<&'static str>) -> (Decider, Arc<AtomicUsize>) {
        let path = dir.join("d.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let asked = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&asked);
        tokio::spawn(async move {
            for answer in answers {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut q = Vec::new();
                s.read_to_end(&mut q).await.unwrap();
                let q: serde_json::Value = serde_json::from_slice(&q).unwrap();
                assert_eq!(q["sandbox"], "sb");
                count.fetch_add(1, Ordering::SeqCst);
                if answer == "silent" {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        (Decider::Unix(path.display().to_string()), asked)
    }

    fn host(h: &str) -> Host {
        Host::parse(h).unwrap()
    }

    #[tokio::test]
    async fn answers_are_applied_once_or_for_life() {
        let dir = tempfile::tempdir().unwrap();
        let (d, asked) = decider(
            dir.path(),
            vec![
                r#"{"answer":"allow-once"}"#,
                r#"{"answer":"deny","reason":"not for this task"}"#,
                r#"{"answer":"allow-always","reason":"ok"}"#,
            ],
        );
        let (sink, seen) = recorder();
        let a = Approvals::new(
            "sb",
            Some(&policy(Some(d), "5s", &["*.example.com:443"])),
            sink,
        );
        let rules = Fixed(Allowlist::new(
            vec![rule("listed.org")],
            vec![rule("bad.example.com")],
        ));
        let ask = |h: &'static str, port| {
            let a = &a;
            let rules = &rules;
            async move {
                a.decide(
                    rules,
                    &host(h),
                    port,
                    Protocol::HttpConnect,
                    ToolCall {
                        id: Some("toolu_1"),
                        claimed: Some("toolu_forged"),
                    },
                )
                .await
                .verdict
            }
        };
        assert!(ask("listed.org", 443).await.allowed);
        // The policy's deny rule and hosts outside the ceiling are never asked about.
        assert_eq!(
            ask("bad.example.com", 443).await.rule,
            "deny bad.example.com"
        );
        assert_eq!(ask("api.example.com", 80).await.rule, "default deny");
        assert_eq!(asked.load(Ordering::SeqCst), 0);
        let v = ask("api.example.com", 443).await;
        assert!(v.allowed && v.rule == "allowed once by decider", "{v:?}");
        let v = ask("api.example.com", 443).await;
        assert_eq!(
            (v.allowed, v.rule.as_str()),
            (false, "denied by decider: not for this task")
        );
        assert!(ask("api.example.com", 443).await.allowed);
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // Allowed for life: not asked again.
        let v = ask("api.example.com", 443).await;
        assert!(v.allowed && v.rule.contains("(decider)"), "{v:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1].answer, Answer::Deny);
        assert_eq!(seen[1].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(seen[1].tool_call_claimed.as_deref(), Some("toolu_forged"));
    }

    #[tokio::test]
    async fn a_silent_or_hostile_decider_gets_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let long = Box::leak(
            format!(
                "{{\"answer\":\"allow-once\",\"reason\":\"{}\"}}",
                "x".repeat(9000)
            )
            .into_boxed_str(),
        );
        let (d, _) = decider(
            dir.path(),
            vec![
                "silent",
                r#"{"answer":"allow-once","extra":1}"#,
                r#"{"answer":"allow-once","reason":"a\u001b[2Jb"}"#,
                long,
            ],
        );
        let (sink, seen) = recorder();
        let a = Approvals::new("sb", Some(&policy(Some(d), "1s", &["x.example.com"])), sink);
        let rules = Fixed(Allowlist::new(vec![rule("listed.org")], vec![]));
        for _ in 0..4 {
            let v = a
                .decide(
                    &rules,
                    &host("x.example.com"),
                    443,
                    Protocol::Socks5,
                    ToolCall::default(),
                )
                .await
                .verdict;
            assert!(!v.allowed, "{v:?}");
            assert!(v.rule.starts_with("denied by default answer: "), "{v:?}");
        }
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|r| r.by == AnsweredBy::Default));
        assert!(seen[0].reason.as_deref().unwrap().contains("within 1s"));
    }

    #[test]
    fn commands_stay_within_the_ceiling_and_deny_wins_after() {
        let (sink, seen) = recorder();
        let a = Approvals::new(
            "sb",
            Some(&policy(None, "5s", &["*.example.com", "10.1.2.3"])),
            sink,
        );
        let change = |action, rule: &str| Change {
            action,
            rule: rule.to_owned(),
        };
        assert!(
            a.apply(&change(ChangeAction::Allow, "api.example.com:443"))
                .is_ok()
        );
        assert!(matches!(
            a.apply(&change(ChangeAction::Allow, "other.org")),
            Err(ChangeError::OutsideCeiling { .. })
        ));
        assert!(matches!(
            a.apply(&change(ChangeAction::Allow, "*")),
            Err(ChangeError::Rule { .. })
        ));
        assert_eq!(
            a.live_match("api.example.com", 443).map(|l| l.allow),
            Some(true)
        );
        a.apply(&change(ChangeAction::Deny, "*.example.com"))
            .unwrap();
        assert_eq!(
            a.live_match("api.example.com", 443).map(|l| l.allow),
            Some(false)
        );
        assert_eq!(seen.lock().unwrap().len(), 2);
        let none = Approvals::new("sb", None, Arc::new(|_: &ApprovalRecord| {}));
        assert!(matches!(
            none.apply(&change(ChangeAction::Allow, "a.example.com")),
            Err(ChangeError::NoCeiling)
        ));
        assert!(
            none.apply(&change(ChangeAction::Deny, "a.example.com"))
                .is_ok()
        );
    }

    #[test]
    fn names_a_decider_or_a_live_allow_may_open_are_the_ones_the_dns_stub_answers() {
        let sink = || Arc::new(|_: &ApprovalRecord| {}) as ApprovalSink;
        let d = Decider::Unix("/run/agent-approvals.sock".to_owned());
        let asked = Approvals::new(
            "sb",
            Some(&policy(Some(d), "5s", &["*.example.com"])),
            sink(),
        );
        assert!(asked.may_open(&host("api.example.com")));
        assert!(!asked.may_open(&host("example.com")));
        assert!(!asked.may_open(&host("evil.test")));
        let deny = Change {
            action: ChangeAction::Deny,
            rule: "api.example.com".to_owned(),
        };
        asked.apply(&deny).unwrap();
        assert!(!asked.may_open(&host("api.example.com")));
        assert!(asked.may_open(&host("www.example.com")));

        let commands_only =
            Approvals::new("sb", Some(&policy(None, "5s", &["*.example.com"])), sink());
        assert!(!commands_only.may_open(&host("api.example.com")));
        let allow = Change {
            action: ChangeAction::Allow,
            rule: "api.example.com:8443".to_owned(),
        };
        commands_only.apply(&allow).unwrap();
        assert!(commands_only.may_open(&host("api.example.com")));
        assert!(!commands_only.may_open(&host("www.example.com")));
    }

    #[test]
    fn special_addresses_need_a_ceiling_ip_rule_and_an_approval() {
        let a = Approvals::new(
            "sb",
            Some(&policy(None, "5s", &["*.example.com", "10.1.2.3:80"])),
            Arc::new(|_: &ApprovalRecord| {}),
        );
        let approved = Decided {
            verdict: Verdict::allow("x"),
            approved_by: Some(&a),
        };
        let fixed = Decided {
            verdict: Verdict::allow("x"),
            approved_by: None,
        };
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(approved.allows_special_address(80, ip).is_some());
        assert!(approved.allows_special_address(81, ip).is_none());
        assert!(
            approved
                .allows_special_address(80, "169.254.169.254".parse().unwrap())
                .is_none()
        );
        assert!(fixed.allows_special_address(80, ip).is_none());
    }

    /// An HTTP decider on 127.0.0.1 answering `responses` in turn; returns the requests.
    async fn http_decider(responses: Vec<&'static str>) -> (Decider, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::clone(&seen);
        tokio::spawn(async move {
            for response in responses {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                // Head, then the Content-Length body the proxy announces.
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .unwrap()
                            .parse()
                            .unwrap();
                        if body.len() >= len || n == 0 {
                            break;
                        }
                    }
                }
                requests
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).into_owned());
                s.write_all(response.as_bytes()).await.unwrap();
            }
        });
        (
            format!("http://127.0.0.1:{port}/decide").parse().unwrap(),
            seen,
        )
    }

    #[tokio::test]
    async fn an_http_decider_is_posted_the_question_and_a_bad_status_gets_the_default() {
        let (d, requests) = http_decider(vec![
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 43\r\n\r\n{\"answer\":\"allow-once\",\"reason\":\"via http\"}",
            "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let a = Approvals::new(
            "sb",
            Some(&policy(Some(d), "5s", &["*.example.com"])),
            Arc::new(|_: &ApprovalRecord| {}),
        );
        let rules = Fixed(Allowlist::new(vec![rule("listed.org")], vec![]));
        let first = a
            .decide(
                &rules,
                &host("a.example.com"),
                8443,
                Protocol::HttpConnect,
                ToolCall::default(),
            )
            .await
            .verdict;
        assert_eq!(
            (first.allowed, first.rule.as_str()),
            (true, "allowed once by decider: via http")
        );
        let second = a
            .decide(
                &rules,
                &host("a.example.com"),
                8443,
                Protocol::HttpConnect,
                ToolCall::default(),
            )
            .await
            .verdict;
        assert!(
            !second.allowed && second.rule.contains("HTTP status 503"),
            "{second:?}"
        );
        let requests = requests.lock().unwrap();
        assert!(
            requests[0].starts_with("POST /decide HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(
            requests[0].contains(r#""host":"a.example.com","port":8443,"protocol":"http-connect""#),
            "{}",
            requests[0]
        );
    }

    #[test]
    fn http_answers_and_tool_call_ids() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{\"answer\":\"deny\"}   trailing";
        assert_eq!(
            parse_reply(&http_body(ok).unwrap()).unwrap().answer,
            Answer::Deny
        );
        assert!(matches!(
            http_body(b"HTTP/1.1 500 No\r\n\r\n"),
            Err(AskError::Status { status: 500 })
        ));
        assert!(matches!(http_body(b"garbage"), Err(AskError::Http)));
        assert_eq!(
            tool_call_id(b"toolu_01:a-b.c").as_deref(),
            Some("toolu_01:a-b.c")
        );
        assert_eq!(tool_call_id(b"a b"), None);
        assert_eq!(tool_call_id(b""), None);
        assert_eq!(tool_call_id("x".repeat(129).as_bytes()), None);
    }
}
