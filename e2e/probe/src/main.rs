//! The in-sandbox probe: a test tool that runs inside a container and deliberately
//! attempts what a sandboxed agent tool must not be able to do (raw syscalls such as
//! `io_uring_setup`, `bpf`, `keyctl`, namespace and mount operations, writes to
//! protected files), then prints one JSON line per check:
//! `{"check": NAME, "outcome": "blocked"|"allowed"|"n/a", "detail": TEXT}`.
//!
//! "allowed" means the attempt got through, "blocked" that the kernel refused it
//! (the detail names the errno), "n/a" that the check could not run here (the detail
//! says why). The probe never decides what is acceptable: the e2e suites do, and
//! they run the same probe under runc to show every check can report "allowed".
//!
//! Attempting forbidden syscalls needs raw `libc` calls, so this binary opts out of
//! the workspace's `unsafe_code` denial at its root; every block names its invariant.
#![allow(unsafe_code)]

mod checks;
mod hostile;

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

/// What one check observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    #[serde(rename = "blocked")]
    Blocked,
    #[serde(rename = "allowed")]
    Allowed,
    #[serde(rename = "n/a")]
    NotApplicable,
}

/// One JSON line of output.
#[derive(Debug, Serialize)]
pub struct Report {
    pub check: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

fn usage() -> String {
    let names: Vec<&str> = checks::ALL.iter().map(|(name, _)| *name).collect();
    let extra: Vec<&str> = hostile::EXTRA.iter().map(|(name, _)| *name).collect();
    format!(
        "usage: probe all | probe CHECK... | probe hog MIB | probe list\nchecks: {}\nrun only when named: {}",
        names.join(" "),
        extra.join(" ")
    )
}

fn emit(report: &Report) -> bool {
    match serde_json::to_string(report) {
        Ok(line) => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
        }
        Err(err) => {
            eprintln!("probe: cannot encode report for {}: {err}", report.check);
            false
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(first) = args.first() else {
        eprintln!("{}", usage());
        return ExitCode::from(2);
    };
    match first.as_str() {
        "list" => {
            for (name, _) in checks::ALL {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        "hog" => {
            let Some(mib) = args.get(1).and_then(|s| s.parse::<usize>().ok()) else {
                eprintln!("probe: hog needs a size in MiB, e.g. `probe hog 512`");
                return ExitCode::from(2);
            };
            if emit(&checks::memory_hog(mib)) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        "all" => {
            let mut ok = true;
            for (_, check) in checks::ALL {
                ok &= emit(&check());
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        "-h" | "--help" | "help" => {
            println!("{}", usage());
            ExitCode::SUCCESS
        }
        _ => {
            let mut selected = Vec::new();
            for name in &args {
                match checks::ALL
                    .iter()
                    .chain(hostile::EXTRA)
                    .find(|(n, _)| n == name)
                {
                    Some((_, check)) => selected.push(*check),
                    None => {
                        eprintln!("probe: unknown check {name:?}\n{}", usage());
                        return ExitCode::from(2);
                    }
                }
            }
            let mut ok = true;
            for check in selected {
                ok &= emit(&check());
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
