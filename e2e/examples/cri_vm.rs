//! A small CRI client for the VM suite (hack/vm/checks.sh, docs/vm-suite.md): the calls
//! kubelet makes for a pod whose cgroup parent is a systemd slice, one per invocation, so a
//! shell script can look at the host side (cgroup files, systemd units) between them. Pods
//! outlive the invocation that started them; `remove` stops and removes one.
//!
//! ```sh
//! cri_vm run --handler runc --memory 67108864 --annotation io.agent.sandbox.pids=64 \
//!     -- sleep 600                       # prints {"pod":..,"container":..,"pid":..,"cgroup_parent":..}
//! cri_vm exec CONTAINER -- cat /proc/self/attr/current
//! cri_vm wait CONTAINER --timeout 120    # prints {"exit_code":..,"reason":..}
//! cri_vm checkpoint CONTAINER --location /tmp/c.tar  # CheckpointContainer, left running
//! cri_vm remove POD
//! ```
//! The pod's cgroup parent is `/kubepods.slice/kubepods-besteffort.slice/
//! kubepods-besteffort-pod<UID>.slice`, as kubelet's systemd cgroup driver names it (the
//! pod UID's dashes become underscores there; ours has none).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_sandbox_e2e::cri::{self, Cri, container_config, pod_config};
use agent_sandbox_e2e::harness::BUSYBOX_IMAGE;
use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use k8s_cri::v1::ContainerState;

#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// RunPodSandbox, CreateContainer and StartContainer of one container running CMD
    Run {
        /// The CRI runtime handler
        #[arg(long)]
        handler: String,
        /// The container's image
        #[arg(long, default_value = BUSYBOX_IMAGE)]
        image: String,
        /// The container's memory limit in bytes (0: none)
        #[arg(long, default_value_t = 0)]
        memory: i64,
        /// Pod annotations KEY=VALUE
        #[arg(long = "annotation")]
        annotations: Vec<String>,
        /// Wait until the container's process is running and print its pid (not for a
        /// command that may exit at once)
        #[arg(long)]
        pid: bool,
        /// The command
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// ExecSync CMD in a container; prints its stdout, stderr to stderr, exits with its code
    Exec {
        container: String,
        #[arg(long, default_value_t = 60)]
        timeout: i64,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Waits for a container to exit; prints its exit code and reason (`OOMKilled`, ...)
    Wait {
        container: String,
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// CheckpointContainer: the archive at LOCATION, the container left running
    Checkpoint {
        container: String,
        #[arg(long)]
        location: String,
    },
    /// StopPodSandbox and RemovePodSandbox
    Remove { pod: String },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cri = Cri::connect()?;
    match args.command {
        Command::Run {
            handler,
            image,
            memory,
            annotations,
            pid,
            cmd,
        } => run(&cri, &handler, &image, memory, &annotations, pid, &cmd),
        Command::Exec {
            container,
            timeout,
            cmd,
        } => {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let exec = cri.exec_sync(&container, &cmd, timeout)?;
            print!("{}", exec.stdout);
            eprint!("{}", exec.stderr);
            std::process::exit(exec.exit_code);
        }
        Command::Wait { container, timeout } => wait(&cri, &container, timeout),
        Command::Checkpoint {
            container,
            location,
        } => cri.checkpoint_container(&container, &location),
        Command::Remove { pod } => {
            cri.stop_pod(&pod)?;
            cri.remove_pod(&pod)
        }
    }
}

fn run(
    cri: &Cri,
    handler: &str,
    image: &str,
    memory: i64,
    annotations: &[String],
    want_pid: bool,
    cmd: &[String],
) -> anyhow::Result<()> {
    let annotations: Vec<(&str, &str)> = annotations
        .iter()
        .map(|a| a.split_once('=').context("an annotation is KEY=VALUE"))
        .collect::<anyhow::Result<_>>()?;
    let mut pod = pod_config("vm", &annotations);
    let uid = format!(
        "{:x}{:x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or_default(),
        std::process::id()
    );
    let parent =
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice");
    if let Some(meta) = pod.metadata.as_mut() {
        meta.uid.clone_from(&uid);
    }
    pod.log_directory = format!("{}/{}_vm_{uid}", cri::POD_LOG_ROOT, cri::POD_NAMESPACE);
    if let Some(linux) = pod.linux.as_mut() {
        linux.cgroup_parent.clone_from(&parent);
    }
    std::fs::create_dir_all(&pod.log_directory)
        .with_context(|| format!("cannot create {}", pod.log_directory))?;
    cri.require_image(cri::PAUSE_IMAGE)?;
    cri.require_image(image)?;
    let pod_id = cri.run_pod(&pod, handler)?;
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let mut app = container_config("app", image, &cmd, &[]);
    if memory > 0
        && let Some(r) = app.linux.as_mut().and_then(|l| l.resources.as_mut())
    {
        r.memory_limit_in_bytes = memory;
        r.memory_swap_limit_in_bytes = memory;
    }
    let id = cri
        .create_container(&pod_id, &pod, &app)
        .and_then(|id| cri.start_container(&id).map(|()| id));
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            // Leave nothing behind for a failed start: the error is what the caller reports.
            let _ = cri.stop_pod(&pod_id);
            let _ = cri.remove_pod(&pod_id);
            return Err(e);
        }
    };
    let pid = if want_pid { cri.container_pid(&id)? } else { 0 };
    let out = HashMap::from([
        ("pod", serde_json::Value::from(pod_id)),
        ("container", id.into()),
        ("pid", pid.into()),
        ("cgroup_parent", parent.into()),
    ]);
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn wait(cri: &Cri, id: &str, timeout: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        let status = cri.container_status(id)?;
        if status.state == ContainerState::ContainerExited as i32 {
            let out = HashMap::from([
                ("exit_code", serde_json::Value::from(status.exit_code)),
                ("reason", status.reason.into()),
                ("message", status.message.into()),
            ]);
            println!("{}", serde_json::to_string(&out)?);
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("container {id} did not exit within {timeout} s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
