//! `agent-sandbox-audit`: the audit library from a shell (append, verify, show, diff, export,
//! repair). The runtime's `agent-sandbox audit ...` subcommands call the same functions.
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

use std::io::Write as _;
use std::path::{Path, PathBuf};

use agent_sandbox_audit::{Event, ExportTarget};
use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Tamper-evident audit log and scratch review for agent-sandbox"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Append a record (event as JSON: {"kind": ..., "data": {...}})
    Append {
        log: PathBuf,
        #[arg(long)]
        sandbox: String,
        #[arg(long)]
        event: String,
        /// Append the event this many times (one locked append each)
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Write this many records per locked write + fsync
        #[arg(long, default_value_t = 1)]
        batch: u64,
    },
    /// Check the hash chain; exit 1 naming the first broken line
    Verify {
        log: PathBuf,
        /// Also require line SEQ to hash to HEAD (an anchor kept outside the log), as SEQ:HEAD
        #[arg(long)]
        anchor: Option<String>,
    },
    /// Print a readable timeline, or the raw JSON lines with --json
    Show {
        log: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// List changes of an overlay upper dir
    Diff {
        upper: PathBuf,
        #[arg(long)]
        lower: Option<PathBuf>,
    },
    /// Export changes of an overlay upper dir to a new directory or tar file
    Export {
        upper: PathBuf,
        #[arg(long)]
        lower: Option<PathBuf>,
        #[arg(long, conflicts_with = "to_tar", required_unless_present = "to_tar")]
        to_dir: Option<PathBuf>,
        #[arg(long)]
        to_tar: Option<PathBuf>,
        /// Refuse, before reading any file, a change set whose files take more than this
        /// many bytes on the target (holes kept, each hard-linked file once)
        #[arg(long, default_value_t = 4 << 30)]
        max_bytes: u64,
    },
    /// Cut an incomplete last line (printed to stdout as evidence)
    Repair { log: PathBuf },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("agent-sandbox-audit: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Append {
            log,
            sandbox,
            event,
            count,
            batch,
        } => append(&log, &sandbox, &event, count, batch)?,
        Cmd::Verify { log, anchor } => verify(&log, anchor.as_deref())?,
        Cmd::Show { log, json } => {
            if json {
                let data = std::fs::read(&log)
                    .with_context(|| format!("cannot read {}", log.display()))?;
                let complete = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                std::io::stdout().write_all(data.get(..complete).unwrap_or_default())?;
            } else {
                let records = agent_sandbox_audit::read_records(&log)?;
                print!("{}", agent_sandbox_audit::render_timeline(&records));
            }
        }
        Cmd::Diff { upper, lower } => {
            for c in agent_sandbox_audit::diff(&upper, lower.as_deref())? {
                println!("{c}");
            }
        }
        Cmd::Export {
            upper,
            lower,
            to_dir,
            to_tar,
            max_bytes,
        } => {
            let to = match (to_dir, to_tar) {
                (Some(d), None) => ExportTarget::Dir(d),
                (None, Some(t)) => ExportTarget::Tar(t),
                _ => bail!("give exactly one of --to-dir and --to-tar"),
            };
            export(&upper, lower.as_deref(), &to, max_bytes)?;
        }
        Cmd::Repair { log } => match agent_sandbox_audit::repair_torn_tail(&log)? {
            Some(t) => {
                eprintln!(
                    "cut {} bytes of line {} at offset {}",
                    t.fragment.len(),
                    t.line,
                    t.offset
                );
                std::io::stdout().write_all(&t.fragment)?;
            }
            None => eprintln!("log ends cleanly; nothing cut"),
        },
    }
    Ok(())
}

/// `append`: `count` copies of `event`, `batch` to a write.
fn append(log: &Path, sandbox: &str, event: &str, count: u64, batch: u64) -> Result<()> {
    let event: Event = serde_json::from_str(event).context("invalid --event JSON")?;
    let w = agent_sandbox_audit::AuditLog::open(log, sandbox)?;
    let mut left = count;
    while left > 0 {
        let n = left.min(batch.max(1));
        let events = vec![event.clone(); usize::try_from(n)?];
        w.append_all(&events)?;
        left -= n;
    }
    Ok(())
}

/// `verify`, against `--anchor SEQ:HEAD` when given.
fn verify(log: &Path, anchor: Option<&str>) -> Result<()> {
    let r = match anchor {
        None => agent_sandbox_audit::verify(log)?,
        Some(a) => {
            let (seq, head) = a.split_once(':').context("--anchor must be SEQ:HEAD")?;
            let anchor = agent_sandbox_audit::Anchor {
                seq: seq.parse().context("--anchor SEQ must be a number")?,
                head: head.to_owned(),
            };
            agent_sandbox_audit::verify_with_anchor(log, &anchor)?
        }
    };
    println!("ok: {} records, head {}", r.records, r.head);
    Ok(())
}

/// `export` to `to`, refused above `max_bytes`.
fn export(upper: &Path, lower: Option<&Path>, to: &ExportTarget, max_bytes: u64) -> Result<()> {
    let limit = agent_sandbox_audit::SizeLimit {
        bytes: max_bytes,
        source: "--max-bytes".to_owned(),
    };
    let s = agent_sandbox_audit::export(upper, lower, to, &limit)?;
    println!(
        "exported {} files ({} bytes of data, {} apparent) and {} hard links, {} dirs, {} symlinks, {} special; {} deleted, {} opaque, {} skipped",
        s.files,
        s.bytes,
        s.apparent,
        s.links,
        s.dirs,
        s.symlinks,
        s.special,
        s.deleted.len(),
        s.opaque.len(),
        s.skipped.len()
    );
    Ok(())
}
