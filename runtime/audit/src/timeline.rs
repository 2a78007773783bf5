//! A readable timeline of audit records, one line per record.

use std::fmt::Write as _;

use crate::escape::escape as esc;
use crate::record::{Event, ExitCause, ExitStatus, Record, SummaryCause, Verdict};

/// Renders one line per record: `TIME  #SEQ  KIND  details`. Times are shown as in the log
/// (UTC, nanoseconds); the sandbox id is left out because a log holds one sandbox. Every
/// text that came from the sandbox (paths, names, arguments) is escaped
/// ([`crate::escape::escape`]), so a control character cannot rewrite the terminal.
pub fn render_timeline(records: &[Record]) -> String {
    let mut out = String::new();
    for r in records {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{}  #{:<4} {:<14} {}",
            esc(&r.time),
            r.seq,
            r.event.kind(),
            details(&r.event)
        );
    }
    out
}

/// `"…"` around escaped text, with `"` escaped too.
fn quoted(s: &str) -> String {
    format!("\"{}\"", esc(s).replace('"', "\\\""))
}

fn quote_args(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                a.clone()
            } else {
                quoted(a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn esc_list(items: &[String], sep: &str) -> String {
    items.iter().map(|i| esc(i)).collect::<Vec<_>>().join(sep)
}

/// The text of a record's fields. Each event with more than a line or two to say has a
/// function of its own, taking the event (the `else` of its pattern is never taken: this
/// match is the one that must name every event).
fn details(event: &Event) -> String {
    match event {
        Event::Create { .. } => create(event),
        Event::Exec { .. } => exec(event),
        Event::Exit { .. } => exit(event),
        Event::Net { .. } => net(event),
        Event::SyscallDenied { .. } => syscall_denied(event),
        Event::FsDenied { .. } => fs_denied(event),
        Event::FilesChanged { .. } => files_changed(event),
        Event::Promoted { .. } => promoted(event),
        Event::Delete {} => "sandbox deleted".to_owned(),
        Event::Clamped {
            key,
            requested,
            granted,
        } => format!(
            "{}: asked {}, granted {}",
            esc(key),
            quoted(requested),
            quoted(granted)
        ),
        Event::LayerInactive { layer, reason } => format!("{}: {}", esc(layer), esc(reason)),
        Event::Approval { .. } => approval(event),
        Event::Summary { .. } => summary(event),
        Event::Paused {} => "frozen; the wall clock stands still".to_owned(),
        Event::Resumed { frozen_ms } => {
            format!("thawed after {frozen_ms} ms frozen; the wall clock runs again")
        }
        Event::Checkpointed {
            image_digest,
            leave_running,
        } => {
            let then = if *leave_running {
                "running on"
            } else {
                "ended"
            };
            format!("saved to checkpoint image {}; {then}", esc(image_digest))
        }
        Event::Restored { .. } => restored(event),
        Event::LimitHit { limit, count, max } => {
            let mut s = format!("{}: the kernel refused {count} time(s)", esc(limit));
            if let Some(m) = max {
                let _ = write!(s, " (limit {m})");
            }
            s
        }
        Event::Truncated {
            limit_bytes,
            size_bytes,
            dropped_kind,
        } => format!(
            "log reached its cap of {limit_bytes} B at {size_bytes} B with a {} record; from here on the sandbox's records are counted (summary)",
            esc(dropped_kind)
        ),
    }
}

fn create(event: &Event) -> String {
    let Event::Create {
        policy_digest,
        layers_active,
        layers_inactive,
    } = event
    else {
        return String::new();
    };
    let mut s = format!(
        "policy {}; active: {}",
        esc(policy_digest),
        esc_list(layers_active, ",")
    );
    if !layers_inactive.is_empty() {
        let _ = write!(s, "; INACTIVE: {}", esc_list(layers_inactive, ","));
    }
    s
}

fn exec(event: &Event) -> String {
    let Event::Exec {
        argv,
        env_keys,
        cwd,
        uid,
        tool_call_id,
        process,
    } = event
    else {
        return String::new();
    };
    let mut s = String::new();
    if let Some(p) = process {
        let _ = write!(s, "{} ", esc(p));
    }
    let _ = write!(s, "uid {uid} cwd {} $ {}", quoted(cwd), quote_args(argv));
    if !env_keys.is_empty() {
        let _ = write!(s, "  [env: {}]", esc_list(env_keys, ","));
    }
    if let Some(t) = tool_call_id {
        let _ = write!(s, "  [tool call {}]", esc(t));
    }
    s
}

fn exit(event: &Event) -> String {
    let Event::Exit {
        status,
        oom,
        tool_call_id,
        process,
        pid,
        reaped_by,
        cause,
    } = event
    else {
        return String::new();
    };
    let mut s = String::new();
    if let Some(p) = process {
        let _ = write!(s, "{} ", esc(p));
    }
    if let Some(p) = pid {
        let _ = write!(s, "pid {p} ");
    }
    match status {
        ExitStatus::Code(c) => {
            let _ = write!(s, "exit code {c}");
        }
        ExitStatus::Signal(n) => {
            let _ = write!(s, "killed by signal {n}");
        }
        ExitStatus::Unknown => s.push_str("exit status unknown"),
    }
    if let Some(r) = reaped_by {
        let _ = write!(s, " (reaped by {})", esc(r));
    }
    match (cause, *oom) {
        (Some(ExitCause::WallClock), false) => s.push_str(" (wall-clock limit)"),
        (Some(ExitCause::WallClock), true) => {
            s.push_str(" (wall-clock limit; an earlier OOM kill in the sandbox)")
        }
        (None, true) => s.push_str(" (OOM)"),
        (None, false) => {}
    }
    if let Some(t) = tool_call_id {
        let _ = write!(s, "  [tool call {}]", esc(t));
    }
    s
}

fn net(event: &Event) -> String {
    let Event::Net {
        verdict,
        rule,
        host,
        port,
        bytes_up,
        bytes_down,
        duration_ms,
        method,
        path,
        sni,
        suppressed,
        credential,
        tool_call_id,
        tool_call_claimed,
        container,
    } = event
    else {
        return String::new();
    };
    let v = match verdict {
        Verdict::Allow => "ALLOW",
        Verdict::Deny => "DENY",
    };
    let mut s = format!("{v} {}:{port}", esc(host));
    if let (Some(m), Some(p)) = (method, path) {
        let _ = write!(s, " {} {}", esc(m), esc(p));
    }
    if let Some(name) = sni {
        let _ = write!(s, " sni {}", esc(name));
        if name != host {
            s.push_str(" (not the host)");
        }
    }
    let _ = write!(
        s,
        " by {}; up {bytes_up} B, down {bytes_down} B, {duration_ms} ms",
        esc(rule)
    );
    if *suppressed > 0 {
        let _ = write!(s, "; {suppressed} more denials not recorded (rate limit)");
    }
    if let Some(c) = credential {
        let _ = write!(
            s,
            "; credential {} added to {} request(s){}",
            esc(&c.header),
            c.requests,
            if c.https { " inside TLS" } else { "" }
        );
    }
    tool_calls(&mut s, tool_call_id, tool_call_claimed);
    if let Some(c) = container {
        let _ = write!(s, "  [container {}]", esc(c));
    }
    s
}

fn syscall_denied(event: &Event) -> String {
    let Event::SyscallDenied {
        syscall,
        nr,
        pid,
        comm,
        exe,
        errno,
        suppressed,
    } = event
    else {
        return String::new();
    };
    let mut s = format!("{} (nr {nr}) by pid {pid} ({})", esc(syscall), esc(comm));
    if let Some(exe) = exe {
        let _ = write!(s, " {}", esc(exe));
    }
    if let Some(e) = errno {
        let _ = write!(s, ", errno {e}");
    }
    if *suppressed > 0 {
        let _ = write!(s, "; {suppressed} more not recorded (rate limit)");
    }
    s
}

fn fs_denied(event: &Event) -> String {
    let Event::FsDenied {
        path,
        access,
        pid,
        comm,
        exe,
        syscall,
        domain: _,
        suppressed,
    } = event
    else {
        return String::new();
    };
    let mut s = format!("{} {}", esc(access), quoted(path));
    if let Some(sc) = syscall {
        let _ = write!(s, " in {}", esc(sc));
    }
    if let Some(p) = pid {
        let _ = write!(s, " by pid {p}");
    }
    if let Some(c) = comm {
        let _ = write!(s, " ({})", esc(c));
    }
    if let Some(exe) = exe {
        let _ = write!(s, " {}", esc(exe));
    }
    if *suppressed > 0 {
        let _ = write!(s, "; {suppressed} more not recorded (rate limit)");
    }
    s
}

fn files_changed(event: &Event) -> String {
    let Event::FilesChanged {
        added,
        modified,
        deleted,
        opaque_dirs,
        paths,
        truncated,
    } = event
    else {
        return String::new();
    };
    let mut s =
        format!("{added} added, {modified} modified, {deleted} deleted, {opaque_dirs} opaque dirs");
    push_paths(&mut s, paths, *truncated);
    s
}

fn promoted(event: &Event) -> String {
    let Event::Promoted {
        target,
        digest,
        entries,
        paths,
        truncated,
        complete,
    } = event
    else {
        return String::new();
    };
    let mut s = format!("{entries} entries to {} ({})", quoted(target), esc(digest));
    if !complete {
        s.push_str(" INCOMPLETE (an apply step failed)");
    }
    push_paths(&mut s, paths, *truncated);
    s
}

fn approval(event: &Event) -> String {
    let Event::Approval {
        answer,
        target,
        by,
        reason,
        tool_call_id,
        tool_call_claimed,
    } = event
    else {
        return String::new();
    };
    let mut s = format!("{} {} by {}", esc(answer), esc(target), esc(by));
    if let Some(r) = reason {
        let _ = write!(s, ": {}", esc(r));
    }
    tool_calls(&mut s, tool_call_id, tool_call_claimed);
    s
}

fn summary(event: &Event) -> String {
    let Event::Summary {
        cause,
        net,
        approvals,
        records,
    } = event
    else {
        return String::new();
    };
    let mut s = match cause {
        SummaryCause::Rate => "counted over the rate limit:".to_owned(),
        SummaryCause::Cap => "counted after the cap (not recorded one by one):".to_owned(),
    };
    for n in net {
        let v = match n.verdict {
            Verdict::Allow => "ALLOW",
            Verdict::Deny => "DENY",
        };
        let _ = write!(
            s,
            " {v} {}:{} x{} (up {} B, largest {} B, down {} B",
            esc(&n.host),
            n.port,
            n.connections,
            n.bytes_up,
            n.largest_up,
            n.bytes_down
        );
        for (m, c) in &n.methods {
            let _ = write!(s, ", {} x{c}", esc(m));
        }
        if n.credential_requests > 0 {
            let _ = write!(s, ", {} with the credential", n.credential_requests);
        }
        s.push_str(");");
    }
    for a in approvals {
        let _ = write!(
            s,
            " approval {} {} by {} x{};",
            esc(&a.answer),
            esc(&a.target),
            esc(&a.by),
            a.count
        );
    }
    for r in records {
        let _ = write!(s, " {} x{};", esc(&r.kind), r.count);
    }
    s.pop();
    s
}

fn restored(event: &Event) -> String {
    let Event::Restored {
        image_digest,
        from,
        not_carried,
        rules_dropped,
        from_head,
    } = event
    else {
        return String::new();
    };
    let mut s = format!(
        "restored from checkpoint image {} of {}",
        esc(image_digest),
        esc(from)
    );
    if let Some(head) = from_head {
        let _ = write!(s, " (its log's record {}, {})", head.seq, esc(&head.head));
    }
    s.push_str("; every task checked against the plan");
    if !not_carried.is_empty() {
        let _ = write!(s, "; not carried: {}", esc_list(not_carried, ", "));
    }
    if !rules_dropped.is_empty() {
        let _ = write!(
            s,
            "; live rules outside the ceiling dropped: {}",
            esc_list(rules_dropped, ", ")
        );
    }
    s
}

/// A record's list of paths, and an ellipsis when it was cut short.
fn push_paths(s: &mut String, paths: &[String], truncated: bool) {
    if !paths.is_empty() {
        let _ = write!(s, ": {}", esc_list(paths, ", "));
    }
    if truncated {
        s.push_str(", …");
    }
}

/// The runtime's tool call of a connection, and the one its header claimed.
fn tool_calls(s: &mut String, id: &Option<String>, claimed: &Option<String>) {
    if let Some(t) = id {
        let _ = write!(s, "  [tool call {}]", esc(t));
    }
    if let Some(t) = claimed {
        let _ = write!(s, "  [header claims tool call {}]", esc(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts of the two events whose path lists share a writer, as `details` wrote them
    /// when it was one match: the list, the ellipsis of a cut list, an incomplete promotion.
    #[test]
    fn path_lists_read_as_before() {
        let changed = Event::FilesChanged {
            added: 1,
            modified: 2,
            deleted: 0,
            opaque_dirs: 0,
            paths: vec!["A /a".to_owned(), "M /b\n".to_owned()],
            truncated: true,
        };
        assert_eq!(
            details(&changed),
            "1 added, 2 modified, 0 deleted, 0 opaque dirs: A /a, M /b\\x0a, …"
        );
        let promoted = Event::Promoted {
            target: "/t".to_owned(),
            digest: "sha256:ab".to_owned(),
            entries: 0,
            paths: Vec::new(),
            truncated: false,
            complete: false,
        };
        assert_eq!(
            details(&promoted),
            "0 entries to \"/t\" (sha256:ab) INCOMPLETE (an apply step failed)"
        );
    }
}
