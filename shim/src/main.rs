//! `containerd-shim-agent-sandbox`: the containerd shim v2 (task API v2) that runs every
//! container through the agent-sandbox runtime binary.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

mod cgroup;
mod checkpoint;
mod container;
mod error;
mod exit_recorder;
mod exits;
mod options;
mod process;
mod rootfs;
mod runtime;
mod shim;
mod stdio;
mod task;
#[cfg(test)]
mod test_util;

/// containerd resolves `--runtime io.agent.sandbox` to this binary's name.
const RUNTIME_ID: &str = "io.agent.sandbox";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-v" | "-version" | "--version"))
    {
        println!("containerd-shim-agent-sandbox:");
        println!("  Version:  {}", env!("CARGO_PKG_VERSION"));
        println!("  Runtime:  {RUNTIME_ID} (task API v2)");
        println!(
            "  Default runtime binary:  {}",
            options::default_runtime().display()
        );
        return;
    }
    // One thread: the shim waits on containerd, the runtime binary and a few fds; a
    // multi-threaded runtime would only add per-worker stacks and malloc arenas to its RSS.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("containerd-shim-agent-sandbox: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let config = containerd_shim::Config {
        default_log_level: "info".to_owned(),
        ..Default::default()
    };
    rt.block_on(containerd_shim::asynchronous::run::<shim::Shim>(
        RUNTIME_ID,
        Some(config),
    ));
}
