//! The `agent-sandbox` binary: parses the runc-style command line and delegates
//! to the library.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

use agent_sandbox::cli::{Cli, Outcome};

fn main() {
    // Before parsing: the process that re-executes itself would parse for nothing.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if agent_sandbox::cli::may_need_sealed_binary(&args)
        && let Err(err) = agent_sandbox_sys::reexec_from_sealed_copy()
    {
        fail(
            &Cli::parse_args(),
            &anyhow::Error::new(err).context("cannot re-execute from a sealed copy"),
        );
    }
    let cli = Cli::parse_args();
    if let Err(err) = agent_sandbox::logging::init(cli.log.as_deref(), cli.log_format, cli.debug) {
        eprintln!("agent-sandbox: {err}");
        std::process::exit(1);
    }
    let (log, format) = (cli.log.clone(), cli.log_format);
    match agent_sandbox::cli::run(cli) {
        Ok(Outcome::Exit(code)) => std::process::exit(code),
        Err(err) => {
            let err = anyhow::Error::new(err);
            report(log.as_deref(), format, &err);
            std::process::exit(1);
        }
    }
}

fn fail(cli: &Cli, err: &anyhow::Error) -> ! {
    report(cli.log.as_deref(), cli.log_format, err);
    std::process::exit(1);
}

/// Prints the whole error chain to stderr and, like runc, to the log file.
fn report(
    log: Option<&std::path::Path>,
    format: agent_sandbox::logging::LogFormat,
    err: &anyhow::Error,
) {
    let msg = format!("{err:#}");
    eprintln!("agent-sandbox: {msg}");
    if let Some(path) = log {
        let line = agent_sandbox::logging::format_line(format, &tracing::Level::ERROR, &msg, &[]);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            use std::io::Write;
            let _ = writeln!(f, "{line}");
        }
    }
}
