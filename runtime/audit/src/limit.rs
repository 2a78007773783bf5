//! What keeps the sandbox from filling or blinding its own audit log (docs/audit.md, "What
//! the sandbox can make the log hold"):
//!
//! - [`RateLimit`]: the writers' token bucket, one per [`Stream`] of records the sandbox
//!   can drive (connections, approvals, kernel denials): a burst, then a steady rate.
//! - [`Tally`]: what a bucket or the cap leaves out is counted per verdict and `host:port`
//!   (per answer and target for approvals) and written as a bounded `summary` record.
//! - [`Budget`]: how the log's size cap is shared: allowed connections only fill the flood
//!   share; the reserve behind it takes each other stream up to its own share, so what the
//!   sandbox floods cannot use up the room of the denials, approvals and credential uses.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::log::{AuditError, AuditLog};
use crate::record::{ApprovalCount, Event, KindCount, NetCount, SummaryCause, Verdict};

/// Records allowed in a burst.
pub const BURST: f64 = 50.0;
/// Records allowed per second after the burst.
pub const PER_SECOND: f64 = 10.0;

/// A token bucket: at most [`BURST`] records at once, [`PER_SECOND`] after.
#[derive(Debug)]
pub struct RateLimit {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimit {
    /// A full bucket.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A full bucket whose clock starts at `at`.
    pub fn starting_at(at: Instant) -> Self {
        Self {
            tokens: BURST,
            at,
            suppressed: 0,
        }
    }

    /// Whether a record may be written at `now`; a refusal is counted.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * PER_SECOND;
        self.tokens = (self.tokens + refill).min(BURST);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            false
        }
    }

    /// Counts `count` records left out by someone else (e.g. the kernel's audit queue), to
    /// be reported with the next record.
    pub fn add_suppressed(&mut self, count: u64) {
        self.suppressed = self.suppressed.saturating_add(count);
    }

    /// The records left out since the last call, for the record being written now.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }

    /// The records left out since the last [`RateLimit::take_suppressed`].
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

/// The streams of records the sandbox can drive, each with its own rate and share of the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Allowed connections without a credential: the records the sandbox can make fastest.
    /// Written only in the flood share of the cap.
    Allowed,
    /// Allowed connections that carried an injected credential.
    Credential,
    /// Refused connections.
    Denied,
    /// Applied approvals (a decider's answer, the default, a command).
    Approval,
    /// Denials of the kernel's layers (`syscall_denied`, `fs_denied`).
    Kernel,
}

impl Stream {
    /// The stream of a record the sandbox can drive; `None` for lifecycle records, which
    /// the runtime writes for the caller and which are never refused.
    pub fn of(event: &Event) -> Option<Self> {
        Some(match event {
            Event::Net {
                verdict: Verdict::Deny,
                ..
            } => Stream::Denied,
            Event::Net {
                credential: Some(_),
                ..
            } => Stream::Credential,
            Event::Net { .. } => Stream::Allowed,
            Event::Approval { .. } => Stream::Approval,
            Event::SyscallDenied { .. } | Event::FsDenied { .. } => Stream::Kernel,
            _ => return None,
        })
    }

    /// Its place in the reserve, `None` for the stream that only fills the flood share.
    fn reserved(self) -> Option<usize> {
        match self {
            Stream::Allowed => None,
            Stream::Credential => Some(0),
            Stream::Denied => Some(1),
            Stream::Approval => Some(2),
            Stream::Kernel => Some(3),
        }
    }
}

/// Reserved streams, and the fifth share kept for closing records (summaries, lifecycle).
const SHARES: u64 = 5;

/// How one writer uses the log's size cap. The first three quarters are the flood share:
/// every record fits there. The last quarter is the reserve: allowed connections never enter
/// it; each other stream ([`Stream::Credential`], [`Stream::Denied`], [`Stream::Approval`],
/// [`Stream::Kernel`]) may put a fifth of it there, and the last fifth is kept for the
/// closing records (the `truncated` record, summaries, the lifecycle records). Sizes are the
/// log's, read under its lock, so writers in other processes count too; each writer charges
/// its own streams.
#[derive(Debug, Clone)]
pub struct Budget {
    limit: u64,
    used: [u64; 4],
}

impl Budget {
    /// The budget of a log capped at `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: [0; 4],
        }
    }

    /// The cap.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes behind the flood share.
    pub fn reserve(&self) -> u64 {
        self.limit / 4
    }

    /// The end of the flood share.
    pub fn flood_limit(&self) -> u64 {
        self.limit - self.reserve()
    }

    /// The bytes of the reserve one stream may use.
    pub fn share(&self) -> u64 {
        self.reserve() / SHARES
    }

    /// Whether a record of `stream`, `len` bytes long, may be appended to a log of `size`
    /// bytes; when it may and it goes into the reserve, the stream's share is charged.
    pub fn admit(&mut self, stream: Stream, size: u64, len: u64) -> bool {
        let end = size.saturating_add(len);
        let flood = self.flood_limit();
        if end <= flood {
            return true;
        }
        let Some(i) = stream.reserved() else {
            return false;
        };
        let in_reserve = end - size.max(flood);
        let share = self.share();
        let Some(used) = self.used.get_mut(i) else {
            return false;
        };
        if end > self.limit || used.saturating_add(in_reserve) > share {
            return false;
        }
        *used += in_reserve;
        true
    }
}

/// Most entries of one table in a summary; further keys are counted under `*`.
pub const MAX_SUMMARY_ENTRIES: usize = 64;

/// Most methods counted per connection entry; further ones are counted under `*`.
const MAX_METHODS: usize = 8;

/// The longest method name kept (longer ones are counted under `*`).
const MAX_METHOD_CHARS: usize = 16;

/// Records counted instead of written, per verdict and `host:port` (connections), per
/// answer, target and answerer (approvals), per kind (kernel denials). Bounded: at most
/// [`MAX_SUMMARY_ENTRIES`] keys a table, the rest counted under host or target `*`, so its
/// [`Event::Summary`] stays far below a line's limit whatever the sandbox does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    net: BTreeMap<(Verdict, String, u16), NetCount>,
    approvals: BTreeMap<(String, String, String), u64>,
    records: BTreeMap<String, u64>,
}

impl Tally {
    /// Whether nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.net.is_empty() && self.approvals.is_empty() && self.records.is_empty()
    }

    /// Counts one record that is not written: a `net`, `approval`, `syscall_denied` or
    /// `fs_denied` record (with the denials its `suppressed` already counted). Returns false
    /// for another kind, which is not counted.
    pub fn count(&mut self, event: &Event) -> bool {
        match event {
            Event::Net {
                verdict,
                host,
                port,
                bytes_up,
                bytes_down,
                method,
                credential,
                ..
            } => {
                let mut key = (*verdict, host.clone(), *port);
                if !self.net.contains_key(&key) && self.net.len() >= MAX_SUMMARY_ENTRIES {
                    key = (*verdict, "*".to_owned(), 0);
                }
                let entry = self.net.entry(key).or_insert_with_key(|k| NetCount {
                    verdict: k.0,
                    host: k.1.clone(),
                    port: k.2,
                    ..NetCount::default()
                });
                entry.connections = entry.connections.saturating_add(1);
                entry.bytes_up = entry.bytes_up.saturating_add(*bytes_up);
                entry.bytes_down = entry.bytes_down.saturating_add(*bytes_down);
                entry.largest_up = entry.largest_up.max(*bytes_up);
                if let Some(m) = method {
                    let name = if m.chars().count() <= MAX_METHOD_CHARS
                        && (entry.methods.contains_key(m) || entry.methods.len() < MAX_METHODS)
                    {
                        m.clone()
                    } else {
                        "*".to_owned()
                    };
                    let n = entry.methods.entry(name).or_default();
                    *n = n.saturating_add(1);
                }
                if let Some(c) = credential {
                    entry.credential_requests =
                        entry.credential_requests.saturating_add(c.requests);
                }
                true
            }
            Event::Approval {
                answer, target, by, ..
            } => {
                let mut key = (answer.clone(), target.clone(), by.clone());
                if !self.approvals.contains_key(&key) && self.approvals.len() >= MAX_SUMMARY_ENTRIES
                {
                    key.1 = "*".to_owned();
                }
                let n = self.approvals.entry(key).or_default();
                *n = n.saturating_add(1);
                true
            }
            Event::SyscallDenied { suppressed, .. } | Event::FsDenied { suppressed, .. } => {
                self.add(event.kind(), suppressed.saturating_add(1));
                true
            }
            _ => false,
        }
    }

    /// Counts `n` records of `kind` left out elsewhere (e.g. a rate limit's count).
    pub fn add(&mut self, kind: &str, n: u64) {
        if n == 0 {
            return;
        }
        let c = self.records.entry(kind.to_owned()).or_default();
        *c = c.saturating_add(n);
    }

    /// Adds everything `other` counted.
    pub fn merge(&mut self, other: Tally) {
        for (_, n) in other.net {
            let key = (n.verdict, n.host.clone(), n.port);
            let key = if !self.net.contains_key(&key) && self.net.len() >= MAX_SUMMARY_ENTRIES {
                (n.verdict, "*".to_owned(), 0)
            } else {
                key
            };
            let entry = self.net.entry(key).or_insert_with_key(|k| NetCount {
                verdict: k.0,
                host: k.1.clone(),
                port: k.2,
                ..NetCount::default()
            });
            entry.connections = entry.connections.saturating_add(n.connections);
            entry.bytes_up = entry.bytes_up.saturating_add(n.bytes_up);
            entry.bytes_down = entry.bytes_down.saturating_add(n.bytes_down);
            entry.largest_up = entry.largest_up.max(n.largest_up);
            entry.credential_requests = entry
                .credential_requests
                .saturating_add(n.credential_requests);
            for (m, c) in n.methods {
                let name = if entry.methods.contains_key(&m) || entry.methods.len() < MAX_METHODS {
                    m
                } else {
                    "*".to_owned()
                };
                let e = entry.methods.entry(name).or_default();
                *e = e.saturating_add(c);
            }
        }
        for (mut key, c) in other.approvals {
            if !self.approvals.contains_key(&key) && self.approvals.len() >= MAX_SUMMARY_ENTRIES {
                key.1 = "*".to_owned();
            }
            let n = self.approvals.entry(key).or_default();
            *n = n.saturating_add(c);
        }
        for (kind, c) in other.records {
            self.add(&kind, c);
        }
    }

    /// The `summary` record of everything counted, which empties the tally; `None` when
    /// nothing was.
    pub fn take(&mut self, cause: SummaryCause) -> Option<Event> {
        if self.is_empty() {
            return None;
        }
        let t = std::mem::take(self);
        Some(Event::Summary {
            cause,
            net: t.net.into_values().collect(),
            approvals: t
                .approvals
                .into_iter()
                .map(|((answer, target, by), count)| ApprovalCount {
                    answer,
                    target,
                    by,
                    count,
                })
                .collect(),
            records: t
                .records
                .into_iter()
                .map(|(kind, count)| KindCount { kind, count })
                .collect(),
        })
    }
}

/// What [`Gate::offer`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// Written.
    Written,
    /// Counted instead (over its stream's rate, or the cap refused it after the
    /// `truncated` record): it is in a later `summary` record.
    Counted,
    /// The cap refused a record for the first time: the `truncated` record was written and
    /// the record counted. From now on allowed connections are only counted.
    Capped,
}

/// One writer's way into a capped log: a rate limit per [`Stream`], its [`Budget`], and
/// what it counted instead of writing: over the rate (written as a `summary` record, cause
/// `rate`, at each [`Gate::flush`]) and after the cap (cause `cap`, at [`Gate::finish`]).
#[derive(Debug)]
pub struct Gate {
    budget: Budget,
    buckets: [RateLimit; 5],
    rated: Tally,
    dropped: Tally,
    truncated: bool,
    /// Whether the log reached the reserve: from then on a key is written once.
    in_reserve: bool,
    /// The log's size at the last append this gate tried.
    last_size: u64,
    /// The keys written since the log reached the reserve.
    seen: std::collections::HashSet<String>,
}

/// Most keys a gate remembers in the reserve; further records are counted.
const MAX_RESERVE_KEYS: usize = 4096;

/// What makes two records of a stream the same in the reserve: the verdict and
/// `host:port` of a connection, the answer, target and answerer of an approval, the kind
/// and syscall or path of a kernel denial.
fn reserve_key(event: &Event) -> String {
    match event {
        Event::Net {
            verdict,
            host,
            port,
            credential,
            ..
        } => format!("net {verdict:?} {host}:{port} {}", credential.is_some()),
        Event::Approval {
            answer, target, by, ..
        } => format!("approval {answer} {target} {by}"),
        Event::SyscallDenied { syscall, .. } => format!("syscall {syscall}"),
        Event::FsDenied { path, access, .. } => format!("fs {access} {path}"),
        other => other.kind().to_owned(),
    }
}

impl Gate {
    /// A gate for a log capped at `limit` bytes, its buckets full at `now`.
    pub fn new(limit: u64, now: Instant) -> Self {
        Self {
            budget: Budget::new(limit),
            buckets: std::array::from_fn(|_| RateLimit::starting_at(now)),
            rated: Tally::default(),
            dropped: Tally::default(),
            truncated: false,
            in_reserve: false,
            last_size: 0,
            seen: std::collections::HashSet::new(),
        }
    }

    /// Whether the cap has refused one of this writer's records.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    fn bucket(&mut self, stream: Stream) -> &mut RateLimit {
        let i = match stream {
            Stream::Allowed => 0,
            Stream::Credential => 1,
            Stream::Denied => 2,
            Stream::Approval => 3,
            Stream::Kernel => 4,
        };
        &mut self.buckets[i]
    }

    /// Writes a record the sandbox drove, or counts it: over its stream's rate it is
    /// counted for the next `rate` summary (a denial that is written carries the count of
    /// those left out before it, as `suppressed`); past the cap it is counted for the `cap`
    /// summary. Records of no stream (lifecycle) are always written.
    pub fn offer(
        &mut self,
        log: &AuditLog,
        mut event: Event,
        now: Instant,
    ) -> Result<Passed, AuditError> {
        let Some(stream) = Stream::of(&event) else {
            log.append(&event)?;
            return Ok(Passed::Written);
        };
        if self.truncated && stream == Stream::Allowed {
            self.dropped.count(&event);
            return Ok(Passed::Counted);
        }
        if !self.bucket(stream).take(now) {
            self.rated.count(&event);
            return Ok(Passed::Counted);
        }
        if self.in_reserve {
            // In the reserve a stream's share goes to the first record of each key, so a
            // loop on one host or one question cannot use it up before a new one comes.
            let key = reserve_key(&event);
            if self.seen.contains(&key) || self.seen.len() >= MAX_RESERVE_KEYS {
                self.dropped.count(&event);
                return self.left_out(log, event.kind());
            }
            self.seen.insert(key);
        }
        let pending = self.bucket(stream).take_suppressed();
        match &mut event {
            Event::Net {
                verdict: Verdict::Deny,
                suppressed,
                ..
            }
            | Event::SyscallDenied { suppressed, .. }
            | Event::FsDenied { suppressed, .. } => {
                *suppressed = suppressed.saturating_add(pending)
            }
            _ => {}
        }
        self.write(log, stream, &event)
    }

    /// Writes `event` of `stream` within the budget, or counts it after the cap (writing the
    /// `truncated` record the first time).
    pub fn write(
        &mut self,
        log: &AuditLog,
        stream: Stream,
        event: &Event,
    ) -> Result<Passed, AuditError> {
        let mut size_at = 0;
        let budget = &mut self.budget;
        let flood = budget.flood_limit();
        let mut reached = false;
        let written = log.append_if(event, &mut |size, len| {
            size_at = size;
            reached = size.saturating_add(len) > flood;
            budget.admit(stream, size, len)
        })?;
        self.in_reserve |= reached;
        self.last_size = size_at;
        if written.is_some() {
            if reached
                && let Some(s) = Stream::of(event)
                && s != Stream::Allowed
            {
                self.seen.insert(reserve_key(event));
            }
            return Ok(Passed::Written);
        }
        if let Event::Summary { .. } = event {
            // A rate summary that no longer fits goes into the cap's.
            let mut t = Tally::default();
            if let Event::Summary {
                net,
                approvals,
                records,
                ..
            } = event
            {
                t.absorb(net, approvals, records);
            }
            self.dropped.merge(t);
        } else {
            self.dropped.count(event);
        }
        self.left_out(log, event.kind())
    }

    /// A record of `kind` was left out because of the cap (it is counted): the first time,
    /// the `truncated` record says so.
    fn left_out(&mut self, log: &AuditLog, kind: &str) -> Result<Passed, AuditError> {
        if self.truncated {
            return Ok(Passed::Counted);
        }
        self.truncated = true;
        log.append(&Event::Truncated {
            limit_bytes: self.budget.limit(),
            size_bytes: self.last_size,
            dropped_kind: kind.to_owned(),
        })?;
        Ok(Passed::Capped)
    }

    /// Writes what was counted over the rate as one `summary` record (cause `rate`) in the
    /// flood share; past it, the counts join the `cap` summary.
    pub fn flush(&mut self, log: &AuditLog) -> Result<Passed, AuditError> {
        if self.truncated {
            let rated = std::mem::take(&mut self.rated);
            self.dropped.merge(rated);
            return Ok(Passed::Counted);
        }
        match self.rated.take(SummaryCause::Rate) {
            Some(summary) => self.write(log, Stream::Allowed, &summary),
            None => Ok(Passed::Counted),
        }
    }

    /// The writer ends (the sandbox is deleted, or its init is gone): writes what it still
    /// counts, the `rate` summary (or, past the cap, everything in the `cap` summary, which
    /// names what was left out after the `truncated` record). These closing records are
    /// always written: they are bounded, and the reserve's last share is kept for them.
    pub fn finish(&mut self, log: &AuditLog) -> Result<(), AuditError> {
        if self.truncated {
            let rated = std::mem::take(&mut self.rated);
            self.dropped.merge(rated);
        } else if let Some(summary) = self.rated.take(SummaryCause::Rate) {
            log.append(&summary)?;
        }
        if let Some(summary) = self.dropped.take(SummaryCause::Cap) {
            log.append(&summary)?;
        }
        Ok(())
    }
}

impl Tally {
    /// Adds the entries of a summary record.
    fn absorb(&mut self, net: &[NetCount], approvals: &[ApprovalCount], records: &[KindCount]) {
        let mut t = Tally::default();
        for n in net {
            t.net.insert((n.verdict, n.host.clone(), n.port), n.clone());
        }
        for a in approvals {
            t.approvals
                .insert((a.answer.clone(), a.target.clone(), a.by.clone()), a.count);
        }
        for r in records {
            t.records.insert(r.kind.clone(), r.count);
        }
        self.merge(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bucket_allows_a_burst_then_counts_what_it_drops() {
        let t = Instant::now();
        let mut b = RateLimit::starting_at(t);
        let taken = (0..200).filter(|_| b.take(t)).count();
        assert_eq!(taken, 50);
        assert_eq!(b.suppressed(), 150);
        assert!(b.take(t + Duration::from_millis(150)));
        assert_eq!(b.take_suppressed(), 150);
        assert_eq!(b.suppressed(), 0);
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let t = Instant::now() + Duration::from_secs(10);
        let mut b = RateLimit::starting_at(t);
        for _ in 0..50 {
            assert!(b.take(t));
        }
        assert!(!b.take(t - Duration::from_secs(5)));
        assert!(!b.take(t));
    }

    fn net(verdict: Verdict, host: &str, method: &str, up: u64) -> Event {
        Event::Net {
            verdict,
            rule: "r".into(),
            host: host.into(),
            port: 443,
            bytes_up: up,
            bytes_down: 10,
            duration_ms: 1,
            method: Some(method.into()),
            path: Some("/x".into()),
            sni: None,
            suppressed: 0,
            credential: None,
            tool_call_id: None,
            tool_call_claimed: None,
            container: None,
        }
    }

    fn approval(answer: &str, target: &str) -> Event {
        Event::Approval {
            answer: answer.into(),
            target: target.into(),
            by: "decider".into(),
            reason: None,
            tool_call_id: None,
            tool_call_claimed: None,
        }
    }

    #[test]
    fn allowed_connections_never_enter_the_reserve_and_each_stream_keeps_its_share() {
        let mut b = Budget::new(40_000);
        assert_eq!(
            (b.flood_limit(), b.reserve(), b.share()),
            (30_000, 10_000, 2_000)
        );
        assert!(b.admit(Stream::Allowed, 29_800, 200));
        assert!(!b.admit(Stream::Allowed, 29_900, 200));
        // A denial straddling the flood limit is charged only what lies in the reserve.
        assert!(b.admit(Stream::Denied, 29_900, 200));
        let mut size = 30_100;
        while b.admit(Stream::Denied, size, 100) {
            size += 100;
        }
        // 100 + 19 x 100 = the share: the denials' flood stops there...
        assert_eq!(size, 30_100 + 1_900);
        // ...and the approvals, the credential uses and the kernel's denials still have theirs.
        for s in [Stream::Approval, Stream::Credential, Stream::Kernel] {
            assert!(b.admit(s, size, 1_000), "{s:?}");
            assert!(b.admit(s, size + 1_000, 1_000), "{s:?}");
            assert!(!b.admit(s, size + 2_000, 1), "{s:?}");
            size += 2_000;
        }
        // Never past the cap, whatever a share has left.
        let mut fresh = Budget::new(40_000);
        assert!(!fresh.admit(Stream::Approval, 39_950, 100));
    }

    #[test]
    fn a_tally_stays_bounded_and_counts_everything() {
        let mut t = Tally::default();
        for i in 0..1_000 {
            t.count(&net(Verdict::Allow, &format!("h{i}.test"), "GET", 1));
        }
        for i in 0..200 {
            t.count(&approval("deny", &format!("h{i}.test:443")));
        }
        for i in 0..20 {
            t.count(&net(Verdict::Allow, "h1.test", &format!("M{i}"), 5));
        }
        let Some(Event::Summary {
            net: entries,
            approvals,
            ..
        }) = t.take(SummaryCause::Cap)
        else {
            panic!("no summary");
        };
        assert!(
            entries.len() <= MAX_SUMMARY_ENTRIES + 1,
            "{}",
            entries.len()
        );
        assert_eq!(entries.iter().map(|n| n.connections).sum::<u64>(), 1_020);
        let h1 = entries.iter().find(|n| n.host == "h1.test").unwrap();
        assert!(h1.methods.len() <= MAX_METHODS + 1);
        assert_eq!(h1.methods.values().sum::<u64>(), 21);
        assert!(entries.iter().any(|n| n.host == "*" && n.port == 0));
        assert!(approvals.len() <= MAX_SUMMARY_ENTRIES + 1);
        assert_eq!(approvals.iter().map(|a| a.count).sum::<u64>(), 200);
        assert!(t.is_empty());
        assert_eq!(t.take(SummaryCause::Cap), None);
    }

    /// The escape: a sandbox floods allowed connections and decider questions until the log
    /// reaches its cap, then POSTs to the same allowed host and gets a decider's denial.
    /// Through the old capped append both leave no trace; through the gate the denial is a
    /// record of its own (the reserve) and the POST is in the `cap` summary, method and size.
    #[test]
    fn a_flood_cannot_hide_a_later_upload_or_denial() {
        let dir = tempfile::tempdir().unwrap();
        const CAP: u64 = 24_000;
        let t0 = Instant::now();
        let flood = |log: &AuditLog, gate: &mut Option<Gate>, i: u64| {
            let now = t0 + Duration::from_millis(i * 20);
            for event in [
                net(Verdict::Allow, "api.test", "GET", 100),
                approval("allow-once", "ask.test:443"),
            ] {
                match gate {
                    Some(g) => {
                        g.offer(log, event, now).unwrap();
                    }
                    None => {
                        log.append_capped(&event, CAP).unwrap();
                    }
                }
            }
            if i.is_multiple_of(50)
                && let Some(g) = gate
            {
                g.flush(log).unwrap();
            }
        };
        let upload = net(Verdict::Allow, "api.test", "POST", 5_000_000);
        let denial = approval("deny", "ask.test:443");

        // Without the fix: the old capped append.
        let old = dir.path().join("old.jsonl");
        let log = AuditLog::open(&old, "sb").unwrap();
        for i in 0..2_000 {
            flood(&log, &mut None, i);
        }
        assert!(matches!(
            log.append_capped(&upload, CAP).unwrap(),
            crate::log::Capped::Dropped
        ));
        assert!(matches!(
            log.append_capped(&denial, CAP).unwrap(),
            crate::log::Capped::Dropped
        ));
        let text = std::fs::read_to_string(&old).unwrap();
        assert!(!text.contains("POST") && !text.contains("\"deny\""));

        // With the gate.
        let new = dir.path().join("new.jsonl");
        let log = AuditLog::open(&new, "sb").unwrap();
        let mut gate = Some(Gate::new(CAP, t0));
        for i in 0..2_000 {
            flood(&log, &mut gate, i);
        }
        let mut gate = gate.unwrap();
        assert!(gate.truncated());
        let later = t0 + Duration::from_secs(3_600);
        assert_eq!(gate.offer(&log, upload, later).unwrap(), Passed::Counted);
        assert_eq!(gate.offer(&log, denial, later).unwrap(), Passed::Written);
        gate.finish(&log).unwrap();
        assert!(std::fs::metadata(&new).unwrap().len() < CAP + 8_192);
        let report = crate::log::verify(&new).unwrap();
        assert!(report.truncated.is_some());
        let records = crate::log::read_records(&new).unwrap();
        assert!(records.iter().any(|r| matches!(&r.event,
            Event::Approval { answer, .. } if answer == "deny")));
        let Some(Event::Summary {
            net: entries,
            approvals,
            ..
        }) = records.iter().map(|r| &r.event).find(|e| {
            matches!(
                e,
                Event::Summary {
                    cause: SummaryCause::Cap,
                    ..
                }
            )
        })
        else {
            panic!("no cap summary");
        };
        let api = entries.iter().find(|n| n.host == "api.test").unwrap();
        assert_eq!(api.methods.get("POST"), Some(&1));
        assert_eq!(api.largest_up, 5_000_000);
        assert!(
            approvals
                .iter()
                .any(|a| a.answer == "allow-once" && a.count > 0)
        );
        // Nothing the flood sent is lost: every connection is a record or counted.
        let recorded = records
            .iter()
            .filter(|r| matches!(&r.event, Event::Net { host, .. } if host == "api.test"))
            .count() as u64;
        let counted: u64 = records
            .iter()
            .filter_map(|r| match &r.event {
                Event::Summary { net, .. } => Some(
                    net.iter()
                        .filter(|n| n.host == "api.test")
                        .map(|n| n.connections)
                        .sum::<u64>(),
                ),
                _ => None,
            })
            .sum();
        assert_eq!(recorded + counted, 2_001);
    }

    #[test]
    fn over_the_rate_connections_are_counted_per_host_and_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.jsonl");
        let log = AuditLog::open(&path, "sb").unwrap();
        let t = Instant::now();
        let mut gate = Gate::new(16 << 20, t);
        for _ in 0..300 {
            gate.offer(&log, net(Verdict::Allow, "a.test", "GET", 1), t)
                .unwrap();
        }
        for _ in 0..100 {
            gate.offer(&log, net(Verdict::Deny, "b.test", "GET", 1), t)
                .unwrap();
        }
        gate.flush(&log).unwrap();
        // A denial after the refill carries the count of those left out.
        gate.offer(
            &log,
            net(Verdict::Deny, "b.test", "GET", 1),
            t + Duration::from_secs(1),
        )
        .unwrap();
        gate.finish(&log).unwrap();
        let records = crate::log::read_records(&path).unwrap();
        let nets = records
            .iter()
            .filter(|r| matches!(r.event, Event::Net { .. }))
            .count();
        assert_eq!(nets, 50 + 50 + 1);
        let Some(Event::Summary {
            cause,
            net: entries,
            ..
        }) = records
            .iter()
            .map(|r| &r.event)
            .find(|e| matches!(e, Event::Summary { .. }))
        else {
            panic!("no summary");
        };
        assert_eq!(*cause, SummaryCause::Rate);
        let count = |h: &str| entries.iter().find(|n| n.host == h).map(|n| n.connections);
        assert_eq!((count("a.test"), count("b.test")), (Some(250), Some(50)));
        assert!(matches!(
            records.last().map(|r| &r.event),
            Some(Event::Net { suppressed: 50, .. })
        ));
        assert_eq!(crate::log::verify(&path).unwrap().truncated, None);
    }

    /// Only approvals, all the same question: past the flood share the loop is counted, not
    /// written, and the log says it is truncated (what it left out is in the cap summary).
    #[test]
    fn a_loop_on_one_question_is_counted_in_the_reserve_and_marks_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.jsonl");
        let log = AuditLog::open(&path, "sb").unwrap();
        let t0 = Instant::now();
        let mut gate = Gate::new(20_000, t0);
        let mut capped = 0;
        for i in 0..200 {
            let now = t0 + Duration::from_millis(i * 100);
            if gate
                .offer(&log, approval("allow-once", "a.test:443"), now)
                .unwrap()
                == Passed::Capped
            {
                capped += 1;
            }
        }
        assert_eq!(capped, 1);
        // A new question still has room.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            gate.offer(&log, approval("deny", "a.test:443"), later)
                .unwrap(),
            Passed::Written
        );
        gate.finish(&log).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 20_000 + 2_048);
        let report = crate::log::verify(&path).unwrap();
        assert!(report.truncated.is_some());
        let records = crate::log::read_records(&path).unwrap();
        let written = records
            .iter()
            .filter(
                |r| matches!(&r.event, Event::Approval { answer, .. } if answer == "allow-once"),
            )
            .count() as u64;
        let counted: u64 = records
            .iter()
            .filter_map(|r| match &r.event {
                Event::Summary { approvals, .. } => Some(
                    approvals
                        .iter()
                        .filter(|a| a.answer == "allow-once")
                        .map(|a| a.count)
                        .sum::<u64>(),
                ),
                _ => None,
            })
            .sum();
        assert_eq!(written + counted, 200);
    }
}
