//! A readable timeline of audit records, one line per record.

use std::fmt::Write as _;

use crate::record::{Event, ExitStatus, Record, Verdict};

/// Renders one line per record: `TIME  #SEQ  KIND  details`. Times are shown as in the log
/// (UTC, nanoseconds); the sandbox id is left out because a log holds one sandbox.
pub fn render_timeline(records: &[Record]) -> String {
    let mut out = String::new();
    for r in records {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{}  #{:<4} {:<14} {}",
            r.time,
            r.seq,
            r.event.kind(),
            details(&r.event)
        );
    }
    out
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
                format!("{a:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn details(event: &Event) -> String {
    match event {
        Event::Create {
            policy_digest,
            layers_active,
            layers_inactive,
        } => {
            let mut s = format!(
                "policy {policy_digest}; active: {}",
                layers_active.join(",")
            );
            if !layers_inactive.is_empty() {
                let _ = write!(s, "; INACTIVE: {}", layers_inactive.join(","));
            }
            s
        }
        Event::Exec {
            argv,
            env_keys,
            cwd,
            uid,
            tool_call_id,
        } => {
            let mut s = format!("uid {uid} cwd {cwd:?} $ {}", quote_args(argv));
            if !env_keys.is_empty() {
                let _ = write!(s, "  [env: {}]", env_keys.join(","));
            }
            if let Some(t) = tool_call_id {
                let _ = write!(s, "  [tool call {t}]");
            }
            s
        }
        Event::Exit {
            status,
            oom,
            tool_call_id,
            process,
            pid,
            reaped_by,
        } => {
            let mut s = String::new();
            if let Some(p) = process {
                let _ = write!(s, "{p} ");
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
                let _ = write!(s, " (reaped by {r})");
            }
            if *oom {
                s.push_str(" (OOM)");
            }
            if let Some(t) = tool_call_id {
                let _ = write!(s, "  [tool call {t}]");
            }
            s
        }
        Event::Net {
            verdict,
            rule,
            host,
            port,
            bytes_up,
            bytes_down,
            duration_ms,
        } => {
            let v = match verdict {
                Verdict::Allow => "ALLOW",
                Verdict::Deny => "DENY",
            };
            format!(
                "{v} {host}:{port} by {rule}; up {bytes_up} B, down {bytes_down} B, {duration_ms} ms"
            )
        }
        Event::SyscallDenied {
            syscall,
            nr,
            pid,
            comm,
            exe,
            errno,
            suppressed,
        } => {
            let mut s = format!("{syscall} (nr {nr}) by pid {pid} ({comm})");
            if let Some(exe) = exe {
                let _ = write!(s, " {exe}");
            }
            if let Some(e) = errno {
                let _ = write!(s, ", errno {e}");
            }
            if *suppressed > 0 {
                let _ = write!(s, "; {suppressed} more not recorded (rate limit)");
            }
            s
        }
        Event::FsDenied {
            path,
            access,
            pid,
            comm,
            exe,
            syscall,
            domain: _,
            suppressed,
        } => {
            let mut s = format!("{access} {path:?}");
            if let Some(sc) = syscall {
                let _ = write!(s, " in {sc}");
            }
            if let Some(p) = pid {
                let _ = write!(s, " by pid {p}");
            }
            if let Some(c) = comm {
                let _ = write!(s, " ({c})");
            }
            if let Some(exe) = exe {
                let _ = write!(s, " {exe}");
            }
            if *suppressed > 0 {
                let _ = write!(s, "; {suppressed} more not recorded (rate limit)");
            }
            s
        }
        Event::FilesChanged {
            added,
            modified,
            deleted,
            opaque_dirs,
            paths,
            truncated,
        } => {
            let mut s = format!(
                "{added} added, {modified} modified, {deleted} deleted, {opaque_dirs} opaque dirs"
            );
            if !paths.is_empty() {
                let _ = write!(s, ": {}", paths.join(", "));
            }
            if *truncated {
                s.push_str(", …");
            }
            s
        }
        Event::Delete {} => "sandbox deleted".to_owned(),
        Event::Clamped {
            key,
            requested,
            granted,
        } => format!("{key}: asked {requested:?}, granted {granted:?}"),
        Event::LayerInactive { layer, reason } => format!("{layer}: {reason}"),
    }
}
