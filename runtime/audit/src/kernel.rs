//! Landlock denials from the kernel's audit records, turned into `fs_denied` events.
//!
//! Landlock reports a denied access only to the kernel audit subsystem, as text records
//! (`AUDIT_LANDLOCK_ACCESS`, `AUDIT_LANDLOCK_DOMAIN`) that anyone holding CAP_AUDIT_READ
//! can read from the `AUDIT_NLGRP_READLOG` netlink group. This module is the pure part:
//! it parses those records (`audit(SECS.MS:SERIAL): key=value ...`) and, in
//! [`LandlockTracker`], joins the records of one event (access, domain, syscall, end of
//! event) and keeps to the Landlock domains of one sandbox.
//!
//! Which domains are the sandbox's: every process the runtime starts in a sandbox restricts
//! itself (a new domain), then, while it still waits before `execve`, makes one TCP connect
//! that its own ruleset refuses (the "probe"). That first denial makes the kernel describe
//! the domain (`status=allocated ... pid=CREATOR`), and the creator is known to the
//! supervisor (it received the process's seccomp listener with its credentials) and cannot
//! have exited or been replaced: it is blocked until the supervisor answers. So a domain is
//! claimed only while its creator provably holds its pid, never by a pid seen later.
//! Limit: a Landlock domain the workload nests inside its own (it restricts itself
//! further) is not claimed, so denials that only that inner domain makes are not recorded;
//! whatever the sandbox's domain refuses is, from any process under it.
//!
//! The one crate that parses audit text (`linux-audit-parser`) is LGPL-3.0; this project
//! is Apache-2.0 and links statically, and the subset needed here (one header, `key=value`
//! pairs, the kernel's hex encoding of untrusted strings) is small, so it is parsed here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// `AUDIT_SYSCALL`: the syscall a record belongs to (pid, comm, exe).
pub const AUDIT_SYSCALL: u16 = 1300;
/// `AUDIT_EOE`: end of a multi-record event.
pub const AUDIT_EOE: u16 = 1320;
/// `AUDIT_LANDLOCK_ACCESS`: one denied access.
pub const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
/// `AUDIT_LANDLOCK_DOMAIN`: a domain's description (first denial) or its end.
pub const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;

/// Address the probe connects to (in the sandbox's own network namespace; Landlock refuses
/// the connect before any packet is made).
pub const PROBE_ADDR: &str = "127.0.0.1";

/// How long a waiting creator's probe, and a probe nobody claimed yet, are kept.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an event's records are gathered before it is reported without its end marker
/// (a process started before audit was enabled has no syscall context, hence no end).
pub const EVENT_WAIT: Duration = Duration::from_millis(300);

/// Upper bounds on what the tracker keeps, so a flood of foreign records cannot grow it.
const MAX_PENDING: usize = 256;
const MAX_UNCLAIMED: usize = 256;

/// Keys whose values the kernel writes with `audit_log_untrustedstring`: quoted when
/// plain, hex-encoded (unquoted) when they hold a space, a quote or a control byte.
const UNTRUSTED: &[&str] = &["path", "dev", "comm", "exe", "name", "ocomm", "proctitle"];

/// A parsed kernel audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRecord {
    /// The netlink message type (e.g. [`AUDIT_LANDLOCK_ACCESS`]).
    pub kind: u16,
    /// The event's serial: records with the same serial (and time) describe one event.
    pub serial: u64,
    /// Fields in order, values decoded.
    pub fields: Vec<(String, String)>,
}

impl KernelRecord {
    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a record's text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelRecordError {
    #[error("audit record without an audit(TIME:SERIAL) header: {text:?}")]
    Header { text: String },
}

/// Parses the text of one record (`audit(1729738800.268:30): domain=1a6fdc66f ...`).
pub fn parse(kind: u16, text: &str) -> Result<KernelRecord, KernelRecordError> {
    let bad = || KernelRecordError::Header {
        text: text.chars().take(80).collect(),
    };
    let rest = text.strip_prefix("audit(").ok_or_else(bad)?;
    let (stamp, body) = rest.split_once("):").ok_or_else(bad)?;
    let serial = stamp
        .rsplit_once(':')
        .and_then(|(_, s)| s.parse().ok())
        .ok_or_else(bad)?;
    Ok(KernelRecord {
        kind,
        serial,
        fields: fields(body),
    })
}

/// The `key=value` pairs of a record body. A quoted value runs to the next quote.
fn fields(body: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let token_end = rest.find(' ').unwrap_or(rest.len());
        let Some(eq) = rest[..token_end].find('=') else {
            rest = rest[token_end..].trim_start();
            continue;
        };
        let key = &rest[..eq];
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (quoted[..end].to_owned(), &quoted[end + 1..]),
                None => (quoted.to_owned(), ""),
            }
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            let raw = &after[..end];
            let value = if UNTRUSTED.contains(&key) {
                decode_hex(raw).unwrap_or_else(|| raw.to_owned())
            } else {
                raw.to_owned()
            };
            (value, &after[end..])
        };
        out.push((key.to_owned(), value));
        rest = next.trim_start();
    }
    out
}

/// An untrusted string the kernel hex-encoded (`2F746D70` for `/tmp`).
fn decode_hex(raw: &str) -> Option<String> {
    if raw.is_empty() || !raw.len().is_multiple_of(2) || !raw.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let bytes = hex::decode(raw).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// One refused filesystem access of the sandbox, with what the kernel told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsDenial {
    pub path: String,
    /// The kernel's `blockers=` (e.g. `fs.make_reg`).
    pub access: String,
    /// The Landlock domain id (hex, as the kernel writes it).
    pub domain: String,
    pub pid: Option<i32>,
    pub comm: Option<String>,
    pub exe: Option<String>,
    /// Syscall number from the event's `SYSCALL` record.
    pub syscall_nr: Option<i64>,
}

/// What the tracker found in the records it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A filesystem denial in one of the sandbox's domains.
    Denied(FsDenial),
    /// The probe of waiting creator `pid` was seen: its domain is the sandbox's.
    Claimed { pid: i32, domain: String },
    /// No probe of waiting creator `pid` arrived in time: its domain is unknown, so its
    /// denials cannot be recorded.
    TimedOut { pid: i32 },
    /// A domain of the sandbox ended having refused `count` more accesses than the records
    /// that reached this reader (the kernel's audit queue dropped them under load).
    Unrecorded { domain: String, count: u64 },
}

/// A creator waiting for its probe's record.
#[derive(Debug, Clone)]
struct Waiting {
    pid: i32,
    port: u16,
    since: Instant,
}

/// A probe-shaped domain description nobody has claimed (yet).
#[derive(Debug, Clone)]
struct Unclaimed {
    pid: i32,
    port: u16,
    domain: String,
    at: Instant,
}

/// An event of one of the sandbox's domains, gathering its records.
#[derive(Debug, Clone)]
struct Pending {
    denial: FsDenial,
    since: Instant,
}

/// Joins kernel records into `fs_denied` events of one sandbox (see the module docs).
#[derive(Debug, Default)]
pub struct LandlockTracker {
    /// The sandbox's domains, with the access records seen of each.
    ours: HashMap<String, u64>,
    waiting: Vec<Waiting>,
    unclaimed: VecDeque<Unclaimed>,
    /// Probe-shaped access records by serial: (domain, port).
    probe_access: BTreeMap<u64, (String, u16)>,
    pending: BTreeMap<u64, Pending>,
}

impl LandlockTracker {
    /// Creator `pid` (host pid, blocked until answered) made its probe to `port`.
    pub fn wait_for(&mut self, pid: i32, port: u16, now: Instant) -> Vec<Found> {
        if let Some(i) = self
            .unclaimed
            .iter()
            .position(|u| u.pid == pid && u.port == port)
            && let Some(u) = self.unclaimed.remove(i)
        {
            self.ours.insert(u.domain.clone(), 1);
            return vec![Found::Claimed {
                pid,
                domain: u.domain,
            }];
        }
        self.waiting.push(Waiting {
            pid,
            port,
            since: now,
        });
        Vec::new()
    }

    /// Whether `domain` (hex id) is one of the sandbox's.
    pub fn is_ours(&self, domain: &str) -> bool {
        self.ours.contains_key(domain)
    }

    /// Feeds one record; returns what it completed (plus anything that timed out).
    pub fn feed(&mut self, record: &KernelRecord, now: Instant) -> Vec<Found> {
        let mut found = Vec::new();
        match record.kind {
            AUDIT_LANDLOCK_ACCESS => self.access(record, now),
            AUDIT_LANDLOCK_DOMAIN => self.domain(record, now, &mut found),
            AUDIT_SYSCALL => {
                if let Some(p) = self.pending.get_mut(&record.serial) {
                    let d = &mut p.denial;
                    d.pid = record.get("pid").and_then(|v| v.parse().ok());
                    d.comm = record.get("comm").map(str::to_owned);
                    d.exe = record.get("exe").map(str::to_owned);
                    d.syscall_nr = record.get("syscall").and_then(|v| v.parse().ok());
                }
            }
            AUDIT_EOE => {
                if let Some(p) = self.pending.remove(&record.serial) {
                    found.push(Found::Denied(p.denial));
                }
                self.probe_access.remove(&record.serial);
            }
            _ => {}
        }
        found.extend(self.expire(now));
        found
    }

    fn access(&mut self, record: &KernelRecord, now: Instant) {
        let (Some(domain), Some(blockers)) = (record.get("domain"), record.get("blockers")) else {
            return;
        };
        if let Some(seen) = self.ours.get_mut(domain) {
            *seen += 1;
        }
        if blockers == "net.connect_tcp"
            && record.get("daddr") == Some(PROBE_ADDR)
            && let Some(port) = record.get("dest").and_then(|p| p.parse().ok())
        {
            if self.probe_access.len() >= MAX_PENDING {
                self.probe_access.pop_first();
            }
            self.probe_access
                .insert(record.serial, (domain.to_owned(), port));
            return;
        }
        if !blockers.starts_with("fs.") || !self.ours.contains_key(domain) {
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_first();
        }
        self.pending.insert(
            record.serial,
            Pending {
                denial: FsDenial {
                    path: record.get("path").unwrap_or("?").to_owned(),
                    access: blockers.to_owned(),
                    domain: domain.to_owned(),
                    pid: None,
                    comm: None,
                    exe: None,
                    syscall_nr: None,
                },
                since: now,
            },
        );
    }

    fn domain(&mut self, record: &KernelRecord, now: Instant, found: &mut Vec<Found>) {
        let Some(domain) = record.get("domain") else {
            return;
        };
        if record.get("status") == Some("deallocated") {
            // The kernel counts every denial of the domain, logged or not.
            if let Some(seen) = self.ours.remove(domain)
                && let Some(denials) = record.get("denials").and_then(|d| d.parse::<u64>().ok())
                && denials > seen
            {
                found.push(Found::Unrecorded {
                    domain: domain.to_owned(),
                    count: denials - seen,
                });
            }
            return;
        }
        if record.get("status") != Some("allocated") {
            return;
        }
        // Only a domain whose first denial is a probe is a candidate.
        let Some((probe_domain, port)) = self.probe_access.remove(&record.serial) else {
            return;
        };
        let Some(pid) = record.get("pid").and_then(|p| p.parse::<i32>().ok()) else {
            return;
        };
        if probe_domain != domain {
            return;
        }
        if let Some(i) = self
            .waiting
            .iter()
            .position(|w| w.pid == pid && w.port == port)
        {
            self.waiting.remove(i);
            self.ours.insert(domain.to_owned(), 1);
            found.push(Found::Claimed {
                pid,
                domain: domain.to_owned(),
            });
            return;
        }
        if self.unclaimed.len() >= MAX_UNCLAIMED {
            self.unclaimed.pop_front();
        }
        self.unclaimed.push_back(Unclaimed {
            pid,
            port,
            domain: domain.to_owned(),
            at: now,
        });
    }

    /// Reports events whose end marker did not come, and drops stale probes; call it also
    /// when no record arrived for a while.
    pub fn expire(&mut self, now: Instant) -> Vec<Found> {
        let mut found = Vec::new();
        let stale: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.since) >= EVENT_WAIT)
            .map(|(s, _)| *s)
            .collect();
        for serial in stale {
            if let Some(p) = self.pending.remove(&serial) {
                found.push(Found::Denied(p.denial));
            }
        }
        self.waiting.retain(|w| {
            let keep = now.duration_since(w.since) < PROBE_TIMEOUT;
            if !keep {
                found.push(Found::TimedOut { pid: w.pid });
            }
            keep
        });
        self.unclaimed
            .retain(|u| now.duration_since(u.at) < PROBE_TIMEOUT);
        found
    }

    /// Whether something waits for a deadline (so the caller polls with a timeout).
    pub fn busy(&self) -> bool {
        !self.pending.is_empty() || !self.waiting.is_empty() || !self.unclaimed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured on this project's machine (kernel 6.18, Landlock ABI 7) from the
    // AUDIT_NLGRP_READLOG group: a sandboxed `touch` refused by a ruleset without make_reg,
    // and an untrusted value as the kernel hex-encodes it.
    const ACCESS: &str = r#"audit(1795344176.843:44): domain=11c438af0 blockers=fs.make_reg path="/tmp" dev="vda" ino=246951"#;
    const SYSCALL: &str = r#"audit(1795344176.843:44): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=7fff808ac931 a2=941 a3=1b6 items=0 ppid=22365 pid=22707 auid=4294967295 uid=0 gid=0 euid=0 suid=0 fsuid=0 egid=0 sgid=0 fsgid=0 tty=(none) ses=4294967295 comm="touch" exe="/usr/bin/touch" key=(null)"#;
    const EOE: &str = "audit(1795344176.843:44): ";
    const DOMAIN: &str = r#"audit(1795344176.835:43): domain=11c438af0 status=allocated mode=enforcing pid=22707 uid=0 exe="/root/.pyenv/versions/3.11.7/bin/python3.11" comm="python3""#;
    const DEALLOC: &str = "audit(1795344176.895:45): domain=11c438af0 status=deallocated denials=2";

    fn rec(kind: u16, text: &str) -> KernelRecord {
        parse(kind, text).unwrap()
    }

    fn probe(serial: u64, domain: &str, pid: i32, port: u16) -> [KernelRecord; 2] {
        [
            rec(
                AUDIT_LANDLOCK_ACCESS,
                &format!(
                    "audit(1795344176.835:{serial}): domain={domain} blockers=net.connect_tcp daddr=127.0.0.1 dest={port}"
                ),
            ),
            rec(
                AUDIT_LANDLOCK_DOMAIN,
                &format!(
                    "audit(1795344176.835:{serial}): domain={domain} status=allocated mode=enforcing pid={pid} uid=0 exe=\"/memfd:agent-sandbox (deleted)\" comm=\"agent-sandbox\""
                ),
            ),
        ]
    }

    #[test]
    fn records_parse_into_serial_and_decoded_fields() {
        let r = rec(AUDIT_LANDLOCK_ACCESS, ACCESS);
        assert_eq!(r.serial, 44);
        assert_eq!(r.get("domain"), Some("11c438af0"));
        assert_eq!(r.get("blockers"), Some("fs.make_reg"));
        assert_eq!(r.get("path"), Some("/tmp"));
        assert_eq!(r.get("ino"), Some("246951"));
        let s = rec(AUDIT_SYSCALL, SYSCALL);
        assert_eq!(s.get("pid"), Some("22707"));
        assert_eq!(s.get("exe"), Some("/usr/bin/touch"));
        assert_eq!(s.get("key"), Some("(null)"));
        assert!(rec(AUDIT_EOE, EOE).fields.is_empty());
        let d = rec(AUDIT_LANDLOCK_DOMAIN, DOMAIN);
        assert_eq!(d.get("status"), Some("allocated"));
        assert_eq!(d.get("pid"), Some("22707"));
        assert_eq!(
            d.get("exe"),
            Some("/root/.pyenv/versions/3.11.7/bin/python3.11")
        );
        // A path with a space is hex-encoded, unquoted.
        let hexed = rec(
            AUDIT_LANDLOCK_ACCESS,
            "audit(1.2:7): domain=1 blockers=fs.write_file path=2F746D702F6120622E747874 dev=\"tmpfs\" ino=5",
        );
        assert_eq!(hexed.get("path"), Some("/tmp/a b.txt"));
        // Hex-looking values of trusted keys stay as written.
        assert_eq!(hexed.get("domain"), Some("1"));
        assert!(matches!(
            parse(AUDIT_SYSCALL, "no header"),
            Err(KernelRecordError::Header { .. })
        ));
    }

    #[test]
    fn a_claimed_domain_reports_its_denials_with_the_syscall_process() {
        let now = Instant::now();
        let mut t = LandlockTracker::default();
        assert!(t.wait_for(22707, 1, now).is_empty());
        let [a, d] = probe(43, "11c438af0", 22707, 1);
        assert!(t.feed(&a, now).is_empty());
        assert_eq!(
            t.feed(&d, now),
            [Found::Claimed {
                pid: 22707,
                domain: "11c438af0".into()
            }]
        );
        assert!(t.feed(&rec(AUDIT_LANDLOCK_ACCESS, ACCESS), now).is_empty());
        assert!(t.feed(&rec(AUDIT_SYSCALL, SYSCALL), now).is_empty());
        let found = t.feed(&rec(AUDIT_EOE, EOE), now);
        assert_eq!(
            found,
            [Found::Denied(FsDenial {
                path: "/tmp".into(),
                access: "fs.make_reg".into(),
                domain: "11c438af0".into(),
                pid: Some(22707),
                comm: Some("touch".into()),
                exe: Some("/usr/bin/touch".into()),
                syscall_nr: Some(257),
            })]
        );
        // Once the domain ends, its id is forgotten; its two denials (probe and touch)
        // both reached this reader.
        assert!(t.feed(&rec(AUDIT_LANDLOCK_DOMAIN, DEALLOC), now).is_empty());
        assert!(!t.is_ours("11c438af0"));
    }

    #[test]
    fn denials_the_kernel_dropped_are_counted_when_the_domain_ends() {
        let now = Instant::now();
        let mut t = LandlockTracker::default();
        t.wait_for(22707, 1, now);
        for r in probe(43, "11c438af0", 22707, 1) {
            t.feed(&r, now);
        }
        t.feed(&rec(AUDIT_LANDLOCK_ACCESS, ACCESS), now);
        let dealloc = rec(
            AUDIT_LANDLOCK_DOMAIN,
            "audit(1795344176.895:45): domain=11c438af0 status=deallocated denials=9",
        );
        assert_eq!(
            t.feed(&dealloc, now),
            [Found::Unrecorded {
                domain: "11c438af0".into(),
                count: 7
            }]
        );
        // A foreign domain's end says nothing.
        assert!(t.feed(&rec(AUDIT_LANDLOCK_DOMAIN, DEALLOC), now).is_empty());
    }

    #[test]
    fn a_probe_seen_before_its_creator_registered_is_claimed_later() {
        let now = Instant::now();
        let mut t = LandlockTracker::default();
        for r in probe(50, "abc", 900, 1) {
            assert!(t.feed(&r, now).is_empty());
        }
        assert_eq!(
            t.wait_for(900, 1, now),
            [Found::Claimed {
                pid: 900,
                domain: "abc".into()
            }]
        );
        assert!(t.is_ours("abc"));
    }

    #[test]
    fn foreign_domains_and_other_pids_are_never_reported() {
        let now = Instant::now();
        let mut t = LandlockTracker::default();
        t.wait_for(900, 1, now);
        // Another process's probe (not waiting here), and a denial in a domain never claimed.
        for r in probe(60, "f00", 901, 1) {
            assert!(t.feed(&r, now).is_empty());
        }
        // A domain description whose first denial was not a probe does not count either.
        let plain = rec(
            AUDIT_LANDLOCK_DOMAIN,
            "audit(1.1:61): domain=f01 status=allocated mode=enforcing pid=900 uid=0 exe=\"/x\" comm=\"x\"",
        );
        assert!(t.feed(&plain, now).is_empty());
        assert!(t.feed(&rec(AUDIT_LANDLOCK_ACCESS, ACCESS), now).is_empty());
        assert!(t.feed(&rec(AUDIT_EOE, EOE), now).is_empty());
        assert!(!t.is_ours("f00") && !t.is_ours("f01") && !t.is_ours("11c438af0"));
        // The creator's wait ends without a claim.
        assert_eq!(
            t.expire(now + PROBE_TIMEOUT),
            [Found::TimedOut { pid: 900 }]
        );
        assert!(!t.busy());
    }

    #[test]
    fn an_event_without_an_end_marker_is_reported_after_a_wait() {
        let now = Instant::now();
        let mut t = LandlockTracker::default();
        t.wait_for(7, 2, now);
        for r in probe(70, "d1", 7, 2) {
            t.feed(&r, now);
        }
        let access = rec(
            AUDIT_LANDLOCK_ACCESS,
            "audit(1.1:71): domain=d1 blockers=fs.remove_file path=\"/dev\" dev=\"tmpfs\" ino=1",
        );
        assert!(t.feed(&access, now).is_empty());
        assert!(t.expire(now + EVENT_WAIT / 2).is_empty());
        let found = t.expire(now + EVENT_WAIT);
        assert!(
            matches!(&found[..], [Found::Denied(d)] if d.path == "/dev" && d.pid.is_none()),
            "{found:?}"
        );
    }
}
