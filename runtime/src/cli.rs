//! The runc-compatible command line (parsed by the binary, run here).

use std::io::Read;
use std::path::PathBuf;

use agent_sandbox_proxy::approval::ChangeAction;
use clap::{Args, Parser, Subcommand};

use crate::id::ContainerId;
use crate::lifecycle::{CreateOpts, ExecOpts, Runtime};
use crate::logging::LogFormat;
use crate::sandbox::Ceiling;

/// agent-sandbox: an OCI runtime that runs every container as an AI-agent sandbox.
#[derive(Debug, Parser)]
#[command(name = "agent-sandbox", version = None, disable_version_flag = true)]
pub struct Cli {
    /// State directory (default: /run/agent-sandbox as root, $XDG_RUNTIME_DIR/agent-sandbox otherwise)
    #[arg(long, global = true)]
    pub root: Option<PathBuf>,
    /// Log file (default: errors only, on stderr; warnings need a log file)
    #[arg(long, global = true)]
    pub log: Option<PathBuf>,
    /// Log format: text or json (logrus style, as runc)
    #[arg(long = "log-format", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Debug logging
    #[arg(long, global = true)]
    pub debug: bool,
    /// Place containers with systemd (cgroup v2): a transient scope per container, as runc;
    /// a `slice:prefix:name` cgroupsPath selects it too
    #[arg(long = "systemd-cgroup", global = true)]
    pub systemd_cgroup: bool,
    /// Accepted for runc compatibility (rootless mode is detected)
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "auto")]
    pub rootless: Option<String>,
    /// Policy file that overrides the profile for every container (admin only)
    #[arg(long, global = true, env = "AGENT_SANDBOX_POLICY")]
    pub policy: Option<PathBuf>,
    /// Directory for new sandboxes' audit logs (default: ROOT/audit); kept after delete
    #[arg(long = "audit-dir", global = true, env = "AGENT_SANDBOX_AUDIT_DIR")]
    pub audit_dir: Option<PathBuf>,
    /// Print the version
    #[arg(short = 'v', long = "version")]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a container from a bundle; its process waits for `start`
    Create(CreateArgs),
    /// Create, start and wait for a container; exits with its status (`--detach`: after start)
    Run(RunArgs),
    /// Start a created container
    Start { id: String },
    /// Print the state of a container as JSON
    State { id: String },
    /// Freeze every process of a running container (cgroup freezer)
    Pause { id: String },
    /// Thaw a paused container
    Resume { id: String },
    /// Send a signal to a container's init (or all its processes with --all)
    Kill {
        #[arg(short, long)]
        all: bool,
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Delete a container (--force kills it first; unknown ids succeed)
    Delete {
        #[arg(short, long)]
        force: bool,
        /// Internal (the shim): the init's pid as reaped, for its `exit` record, written
        /// here instead of by a separate `audit-exit` run
        #[arg(long = "exit-pid", hide = true, requires = "exit_status")]
        exit_pid: Option<i32>,
        /// Internal (the shim): the init's status as the reaper folds it (128 + N for signal N)
        #[arg(long = "exit-status", hide = true)]
        exit_status: Option<i32>,
        id: String,
    },
    /// Run a process inside a running container
    Exec(ExecArgs),
    /// List the processes of a container
    Ps {
        #[arg(short, long, default_value = "table")]
        format: String,
        id: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        ps_args: Vec<String>,
    },
    /// Update the resource limits of a container
    Update {
        /// JSON file with linux.resources ("-" for stdin)
        #[arg(short, long)]
        resources: PathBuf,
        id: String,
    },
    /// Print the runtime's features as JSON
    Features,
    /// Write a default config.json into the bundle
    Spec {
        #[arg(short, long, default_value = ".")]
        bundle: PathBuf,
    },
    /// Explain a policy for a person: `policy explain PROFILE`
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Print a generated artifact: `profile seccomp|apparmor|landlock PROFILE`
    Profile {
        #[arg(value_parser = ["seccomp", "apparmor", "landlock"])]
        kind: String,
        /// Built-in profile name or policy file path
        profile: PathBuf,
    },
    /// Internal: the egress proxy that `create` spawns for a proxy-mode sandbox
    #[command(hide = true)]
    Proxy {
        /// The sandbox's network namespace (`-`: read its path from stdin, after loading
        /// everything else)
        #[arg(long)]
        netns: PathBuf,
        id: String,
    },
    /// Internal: runs an OCI hook with the caller's bundle in its state (see `hooks.rs`)
    #[command(hide = true)]
    Hook {
        #[arg(long)]
        bundle: PathBuf,
        /// The hook's path, then its argv (argv[0] first)
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Internal: the host-side supervisor that answers and records a sandbox's denied syscalls
    #[command(name = "seccomp-supervise", hide = true)]
    SeccompSupervise {
        /// The errno every denied syscall gets
        #[arg(long)]
        errno: i32,
        /// Descriptor 4 is the runtime's kernel audit subscription (descriptor 3, always
        /// there, is the listening socket)
        #[arg(long)]
        kernel_audit: bool,
        id: String,
    },
    /// Show a sandbox's audit trail (`audit ID [--json]`), check it (`audit verify ID`), or
    /// remove logs of deleted sandboxes (`audit prune [--older-than DUR] [ID]`)
    Audit {
        /// Print the records as JSON lines (for jq)
        #[arg(long)]
        json: bool,
        /// prune: only logs last written longer ago than this (e.g. 90m, 7d; default 0s)
        #[arg(long = "older-than")]
        older_than: Option<String>,
        /// `ID`, `verify ID`, `prune` or `prune ID`
        #[arg(num_args = 1..=2, value_name = "ID")]
        args: Vec<String>,
    },
    /// Internal: the shim reports a reaped process of the sandbox (appends an `exit` record)
    #[command(name = "audit-exit", hide = true)]
    AuditExit {
        /// `init` or the exec's id
        #[arg(long, default_value = "init")]
        process: String,
        #[arg(long)]
        pid: Option<i32>,
        /// The status as the reaper folds it (128 + N for signal N)
        #[arg(long)]
        status: i32,
        id: String,
    },
    /// Let a running sandbox reach RULE (a domain rule, e.g. `api.example.com:443`) for its
    /// life, within its policy's network.approvals.ceiling; recorded in the audit log
    Allow { id: String, rule: String },
    /// Refuse RULE to a running sandbox for its life (wins over its allow list); recorded in
    /// the audit log
    Deny { id: String, rule: String },
    /// Print which protections are in force for a sandbox, as JSON
    Layers { id: String },
    /// List what a sandbox changed in its workspace overlay (A added, M modified, D deleted,
    /// O opaque dir), before `delete` discards it
    Diff { id: String },
    /// Hand a sandbox's workspace changes out for review: `--to-dir DIR` or `--to-tar FILE`
    /// (new paths); nothing reaches the real workspace unless someone copies it there
    Export {
        #[arg(
            long = "to-dir",
            conflicts_with = "to_tar",
            required_unless_present = "to_tar"
        )]
        to_dir: Option<PathBuf>,
        #[arg(long = "to-tar")]
        to_tar: Option<PathBuf>,
        id: String,
    },
    /// Apply a sandbox's workspace changes to a directory, refusing anything that could act
    /// on the host (links out of the tree, protected names, .git internals; docs/promote.md)
    Promote {
        /// The directory to apply the changes to (e.g. the checkout the workspace came from)
        #[arg(long = "to")]
        to: PathBuf,
        /// Print the plan (and what would be refused) without changing anything
        #[arg(long = "dry-run")]
        dry_run: bool,
        /// Apply only if the change set still has this digest (`sha256:…`, as the dry run
        /// printed it): what was reviewed is what is applied
        #[arg(long)]
        digest: Option<String>,
        id: String,
    },
    /// Kept workspace change sets (docs/workspace.md): list them (`changes`), drop one
    /// (`changes discard ID`), or apply the retention limits now (`changes prune`)
    Changes {
        #[command(subcommand)]
        action: Option<crate::changes::Action>,
    },
    /// Internal: records the exit of a detached exec whose caller reaps it (descriptor 3:
    /// its pidfd)
    #[command(name = "exec-exit", hide = true)]
    ExecExit {
        #[arg(long = "exec-id")]
        exec_id: String,
        #[arg(long)]
        pid: i32,
        id: String,
    },
    /// Internal: the OOM watcher that `create` spawns for a podman container (`podman_oom.rs`)
    #[command(name = "oom-watch", hide = true)]
    OomWatch {
        /// The caller's bundle directory, where the `oom` marker goes
        #[arg(long)]
        bundle: PathBuf,
        /// The sandbox's memory cgroup directory
        #[arg(long)]
        cgroup: PathBuf,
        id: String,
    },
    /// Internal: the wall-clock watchdog that `start` spawns
    #[command(hide = true)]
    Watchdog {
        #[arg(long)]
        seconds: u64,
        /// The init's pid at start (saves loading the state again at once).
        #[arg(long)]
        pid: Option<i32>,
        id: String,
    },
    /// List containers
    List {
        #[arg(short, long, default_value = "table")]
        format: String,
    },
    /// Print the containerd CRI runtime entry for Kubernetes (`install containerd`) or the
    /// daemon.json runtime for Docker (`install docker`), or merge it in with `--write`
    Install {
        #[command(subcommand)]
        target: InstallTarget,
    },
}

#[derive(Debug, Subcommand)]
pub enum InstallTarget {
    /// The `agent-sandbox` runtime handler of containerd's CRI plugin
    Containerd {
        /// Merge it into the config file (keeping everything else) instead of printing it
        #[arg(long)]
        write: bool,
        /// containerd's config file
        #[arg(long, default_value = crate::install::DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// The `agent-sandbox` runtime of dockerd (`docker run --runtime agent-sandbox`)
    Docker(crate::install_docker::DockerArgs),
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// What the sandbox allows and denies
    Explain {
        /// Built-in profile name or policy file path
        profile: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    #[arg(long = "no-new-keyring")]
    pub no_new_keyring: bool,
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    pub id: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub create: CreateArgs,
    /// Return after the start instead of waiting for the container
    #[arg(short, long)]
    pub detach: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    #[arg(short, long)]
    pub env: Vec<String>,
    #[arg(short, long)]
    pub tty: bool,
    /// UID[:GID]
    #[arg(short, long)]
    pub user: Option<String>,
    #[arg(short = 'p', long)]
    pub process: Option<PathBuf>,
    #[arg(short, long)]
    pub detach: bool,
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    #[arg(long = "process-label")]
    pub process_label: Option<String>,
    #[arg(long)]
    pub apparmor: Option<String>,
    #[arg(long = "no-new-privs")]
    pub no_new_privs: bool,
    /// Extra capabilities are refused by the sandbox; accepted only to report that
    #[arg(short, long)]
    pub cap: Vec<String>,
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    pub id: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Errors of the command line layer.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Id(#[from] crate::id::IdError),
    #[error(transparent)]
    Lifecycle(#[from] crate::lifecycle::LifecycleError),
    #[error(transparent)]
    Run(#[from] crate::run::RunError),
    #[error(transparent)]
    Hook(#[from] crate::hooks::HookError),
    #[error(transparent)]
    PodmanOom(#[from] crate::podman_oom::PodmanOomError),
    #[error("no command given (try --help)")]
    NoCommand,
    #[error("audit takes ID, verify ID, prune or prune ID, not {args:?}")]
    AuditArgs { args: Vec<String> },
    #[error("sandbox {id} has no audit log at {path}")]
    NoAuditLog { id: String, path: PathBuf },
    #[error("audit trail")]
    Audit(#[from] agent_sandbox_audit::AuditError),
    #[error("audit prune")]
    Prune(#[from] crate::audit::PruneError),
    #[error("--older-than only goes with audit prune")]
    OlderThanWithoutPrune,
    #[error("workspace review")]
    Scratch(#[from] agent_sandbox_audit::ScratchError),
    #[error(transparent)]
    Promote(#[from] crate::promote::PromoteCmdError),
    #[error("workspace changes")]
    Changes(#[from] crate::changes::ChangesError),
    #[error(transparent)]
    Find(#[from] crate::find::FindError),
    #[error("--user {value:?} is not UID[:GID]")]
    User { value: String },
    #[error("--cap {cap}: the sandbox grants no capabilities")]
    Cap { cap: String },
    #[error("exec needs --process or a command")]
    NoExecCommand,
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error(transparent)]
    Allow(#[from] crate::allow::AllowError),
    #[error(transparent)]
    Install(#[from] crate::install::InstallError),
    #[error(transparent)]
    InstallDocker(#[from] crate::install_docker::DockerInstallError),
    #[error("profile {profile}")]
    Artifact {
        profile: String,
        #[source]
        source: agent_sandbox_policy::generated::GeneratedError,
    },
}

/// What `run` asks the binary to do at the end.
pub enum Outcome {
    /// Exit with this code.
    Exit(i32),
}

/// The version text (`--version`), runc's shape.
pub fn version_text() -> String {
    format!(
        "agent-sandbox version {}\nspec: 1.0.2\nlibcontainer: 0.7\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `allow` / `deny`: finds the sandbox as `audit` does and asks its proxy.
fn change_live(
    root: Option<&std::path::Path>,
    audit_dir: Option<&std::path::Path>,
    id: &str,
    action: ChangeAction,
    rule: &str,
) -> Result<(), CliError> {
    let found = crate::find::find(root, audit_dir, id)?;
    let dir = Runtime::new(Some(&found.root))?.dirs.sandbox(&found.id);
    println!(
        "{}",
        crate::allow::change(&dir, found.id.as_str(), action, rule)?
    );
    Ok(())
}

fn read_input(path: &PathBuf) -> Result<Vec<u8>, CliError> {
    let mut buf = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|source| CliError::Read {
                path: path.clone(),
                source,
            })?;
        Ok(buf)
    } else {
        std::fs::read(path).map_err(|source| CliError::Read {
            path: path.clone(),
            source,
        })
    }
}

/// Whether this command enters a container (and so must run from a sealed
/// copy of the binary first).
pub fn needs_sealed_binary(cli: &Cli) -> bool {
    matches!(
        cli.command,
        Some(Command::Create(_)) | Some(Command::Exec(_)) | Some(Command::Run(_))
    )
}

/// Runs one command.
pub fn run(cli: Cli) -> Result<Outcome, CliError> {
    if cli.version {
        print!("{}", version_text());
        return Ok(Outcome::Exit(0));
    }
    let command = cli.command.ok_or(CliError::NoCommand)?;
    let audit_dir = cli.audit_dir.clone();
    let rt = || {
        Runtime::new(cli.root.as_deref()).map(|mut r| {
            r.audit_dir = audit_dir.clone();
            r
        })
    };
    match command {
        Command::Create(a) => {
            let id = ContainerId::try_from(a.id.as_str())?;
            let ceiling = Ceiling::load(cli.policy.as_deref())?;
            rt()?.create(&id, &create_opts(a, cli.systemd_cgroup), &ceiling)?;
        }
        Command::Run(RunArgs { create, detach }) => {
            let id = ContainerId::try_from(create.id.as_str())?;
            let ceiling = Ceiling::load(cli.policy.as_deref())?;
            let opts = create_opts(create, cli.systemd_cgroup);
            let code = crate::run::run(&rt()?, &id, &opts, &ceiling, detach)?;
            return Ok(Outcome::Exit(code));
        }
        Command::Start { id } => rt()?.start(&ContainerId::try_from(id.as_str())?)?,
        Command::Pause { id } => rt()?.pause(&ContainerId::try_from(id.as_str())?, true)?,
        Command::Resume { id } => rt()?.pause(&ContainerId::try_from(id.as_str())?, false)?,
        Command::State { id } => {
            let state = rt()?.state(&ContainerId::try_from(id.as_str())?)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&state).unwrap_or_default()
            );
        }
        Command::Kill { all, id, signal } => {
            rt()?.kill(&ContainerId::try_from(id.as_str())?, &signal, all)?
        }
        Command::Delete {
            force,
            exit_pid,
            exit_status,
            id,
        } => {
            let reaped = exit_status.map(|status| crate::lifecycle::ReapedInit {
                pid: exit_pid,
                status: agent_sandbox_audit::ExitStatus::from_folded(status),
            });
            rt()?.delete(&ContainerId::try_from(id.as_str())?, force, reaped)?
        }
        Command::Exec(a) => {
            if let Some(cap) = a.cap.first() {
                return Err(CliError::Cap { cap: cap.clone() });
            }
            let id = ContainerId::try_from(a.id.as_str())?;
            let user = match &a.user {
                None => None,
                Some(u) => Some(parse_user(u)?),
            };
            if a.process.is_none() && a.command.is_empty() {
                return Err(CliError::NoExecCommand);
            }
            let runtime = rt()?;
            let opts = ExecOpts {
                process: a.process,
                args: a.command,
                env: a.env,
                cwd: a.cwd,
                tty: a.tty,
                user,
                detach: a.detach,
                pid_file: a.pid_file,
                console_socket: a.console_socket,
                preserve_fds: a.preserve_fds,
            };
            if let Some(code) = runtime.exec(&id, &opts)? {
                return Ok(Outcome::Exit(code));
            }
        }
        Command::Ps { format, id, .. } => {
            let pids = rt()?.pids(&ContainerId::try_from(id.as_str())?)?;
            if format == "json" {
                println!("{}", serde_json::to_string(&pids).unwrap_or_default());
            } else {
                println!("PID");
                for p in pids {
                    println!("{p}");
                }
            }
        }
        Command::Update { resources, id } => {
            let bytes = read_input(&resources)?;
            let res: libcontainer::oci_spec::runtime::LinuxResources =
                serde_json::from_slice(&bytes).map_err(|source| CliError::Parse {
                    path: resources.clone(),
                    source,
                })?;
            rt()?.update(&ContainerId::try_from(id.as_str())?, &res)?;
        }
        Command::Features => println!("{}", features_json()),
        Command::Hook { bundle, argv } => crate::hooks::relay(&bundle, &argv)?,
        Command::Proxy { netns, id } => {
            rt()?.proxy(&ContainerId::try_from(id.as_str())?, &netns)?
        }
        Command::Allow { id, rule } => {
            let (root, audit) = (cli.root.as_deref(), cli.audit_dir.as_deref());
            change_live(root, audit, &id, ChangeAction::Allow, &rule)?;
        }
        Command::Deny { id, rule } => {
            let (root, audit) = (cli.root.as_deref(), cli.audit_dir.as_deref());
            change_live(root, audit, &id, ChangeAction::Deny, &rule)?;
        }
        Command::SeccompSupervise {
            errno,
            kernel_audit,
            id,
        } => rt()?.seccomp_supervise(&ContainerId::try_from(id.as_str())?, errno, kernel_audit)?,
        Command::Audit {
            json,
            older_than,
            args,
        } => {
            if args.first().is_some_and(|a| a == "prune") && args.len() <= 2 {
                let runtime = rt()?;
                let age = crate::audit::parse_age(older_than.as_deref().unwrap_or("0s"))?;
                let only = match args.get(1) {
                    Some(id) => Some(ContainerId::try_from(id.as_str())?),
                    None => None,
                };
                let dir = match &only {
                    Some(id) => crate::audit::dir_of(&runtime.dirs, id, cli.audit_dir.as_deref()),
                    None => cli
                        .audit_dir
                        .clone()
                        .unwrap_or_else(|| crate::audit::dir(&runtime.dirs)),
                };
                let p = crate::audit::prune(&runtime.dirs, &dir, age, only.as_ref())?;
                for path in &p.removed {
                    println!("removed {}", path.display());
                }
                println!(
                    "{} removed, {} kept (sandbox live), {} kept (newer than the cut-off)",
                    p.removed.len(),
                    p.live.len(),
                    p.recent.len()
                );
                return Ok(Outcome::Exit(0));
            }
            if older_than.is_some() {
                return Err(CliError::OlderThanWithoutPrune);
            }
            let (verify, id) = match args.as_slice() {
                [id] => (false, id),
                [verb, id] if verb == "verify" => (true, id),
                _ => return Err(CliError::AuditArgs { args }),
            };
            let found = crate::find::find(cli.root.as_deref(), cli.audit_dir.as_deref(), id)?;
            let (runtime, id) = (Runtime::new(Some(&found.root))?, found.id);
            let log = crate::audit::locate(&runtime.dirs, &id, cli.audit_dir.as_deref())?;
            if !log.exists() {
                return Err(CliError::NoAuditLog {
                    id: id.to_string(),
                    path: log,
                });
            }
            if verify {
                let report = agent_sandbox_audit::verify(&log)?;
                println!(
                    "{}: {} records, chain intact (head {})",
                    log.display(),
                    report.records,
                    report.head
                );
            } else {
                print!("{}", crate::audit::show(&log, json)?);
            }
        }
        Command::AuditExit {
            process,
            pid,
            status,
            id,
        } => {
            let id = ContainerId::try_from(id.as_str())?;
            let runtime = rt()?;
            if !runtime.dirs.sandbox(&id).exists() {
                return Err(crate::lifecycle::LifecycleError::NotExist { id }.into());
            }
            crate::audit::exited(
                &runtime.dirs,
                &id,
                &crate::audit::ExitReport {
                    process,
                    pid,
                    status: agent_sandbox_audit::ExitStatus::from_folded(status),
                    reaped_by: None,
                },
            )?;
        }
        Command::Layers { id } => {
            let found = crate::find::find(cli.root.as_deref(), cli.audit_dir.as_deref(), &id)?;
            let report = Runtime::new(Some(&found.root))?.layers(&found.id)?;
            let json = serde_json::to_string_pretty(&report).unwrap_or_default();
            println!("{}", agent_sandbox_audit::escape::json_for_terminal(&json));
        }
        Command::Diff { id } => {
            let source = crate::review::source(&rt()?, &ContainerId::try_from(id.as_str())?)?;
            for c in source.changes()? {
                println!("{}", crate::review::diff_line(&c));
            }
        }
        Command::Export { to_dir, to_tar, id } => {
            let source = crate::review::source(&rt()?, &ContainerId::try_from(id.as_str())?)?;
            let target = match (to_dir, to_tar) {
                (Some(d), _) => agent_sandbox_audit::ExportTarget::Dir(d),
                (None, Some(t)) => agent_sandbox_audit::ExportTarget::Tar(t),
                (None, None) => return Err(CliError::NoCommand),
            };
            let s = agent_sandbox_audit::export(&source.upper, source.lower.as_deref(), &target)?;
            crate::review::write_export_summary(&mut std::io::stdout().lock(), &s).map_err(
                |source| CliError::Write {
                    path: PathBuf::from("-"),
                    source,
                },
            )?;
        }
        Command::Promote {
            to,
            dry_run,
            digest,
            id,
        } => {
            let id = ContainerId::try_from(id.as_str())?;
            // Absolute, so the audit record names the directory whatever the caller's cwd.
            let to = std::path::absolute(&to).unwrap_or(to);
            let req = crate::promote::Request {
                id: &id,
                to: &to,
                dry_run,
                digest: digest.as_deref(),
                policy: cli.policy.as_deref(),
                audit_dir: cli.audit_dir.as_deref(),
            };
            crate::promote::run(&rt()?, &req, &mut std::io::stdout().lock())?;
        }
        Command::Changes { action } => {
            let ceiling = Ceiling::load(cli.policy.as_deref())?;
            print!("{}", crate::changes::run(action, &ceiling.policy)?);
        }
        Command::ExecExit { exec_id, pid, id } => {
            let runtime = rt()?;
            crate::exec_exit::run(
                &runtime.dirs,
                &ContainerId::try_from(id.as_str())?,
                &exec_id,
                pid,
            )?;
        }
        Command::OomWatch { bundle, cgroup, id } => {
            crate::podman_oom::run(&bundle, &cgroup, &ContainerId::try_from(id.as_str())?)?
        }
        Command::Watchdog { seconds, pid, id } => {
            rt()?.watchdog(&ContainerId::try_from(id.as_str())?, seconds, pid)?
        }
        Command::Policy {
            action: PolicyAction::Explain { profile },
        } => {
            let c = Ceiling::load(Some(&profile))?;
            print!("{}", agent_sandbox_policy::explain::explain(&c.policy));
        }
        Command::Profile { kind, profile } => {
            let c = Ceiling::load(Some(&profile))?;
            let name = profile
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| c.origin.clone());
            let text = agent_sandbox_policy::generated::artifact(&c.policy, &name, &kind).map_err(
                |source| CliError::Artifact {
                    profile: c.origin.clone(),
                    source,
                },
            )?;
            print!("{text}");
        }
        Command::Spec { bundle } => {
            let path = bundle.join("config.json");
            let spec = libcontainer::oci_spec::runtime::Spec::default();
            let text = serde_json::to_string_pretty(&spec).unwrap_or_default();
            std::fs::write(&path, text).map_err(|source| CliError::Write { path, source })?;
        }
        Command::Install {
            target: InstallTarget::Containerd { write, config },
        } => {
            if !write {
                print!(
                    "{}",
                    crate::install::stanza(crate::install::version_of(&config)?)
                );
            } else if crate::install::write(&config)? {
                println!(
                    "merged the agent-sandbox runtime into {}; restart containerd",
                    config.display()
                );
            } else {
                println!("{} already has the agent-sandbox runtime", config.display());
            }
        }
        Command::Install {
            target: InstallTarget::Docker(args),
        } => crate::install_docker::run(&args)?,
        Command::List { format } => {
            let runtime = rt()?;
            let ids = runtime.list();
            if format == "json" {
                let states: Vec<serde_json::Value> = ids
                    .iter()
                    .filter_map(|i| ContainerId::try_from(i.as_str()).ok())
                    .filter_map(|i| runtime.state(&i).ok())
                    .collect();
                println!("{}", serde_json::Value::Array(states));
            } else {
                println!("ID");
                for i in ids {
                    println!("{i}");
                }
            }
        }
    }
    Ok(Outcome::Exit(0))
}

fn create_opts(a: CreateArgs, systemd_cgroup: bool) -> CreateOpts {
    CreateOpts {
        bundle: std::path::absolute(&a.bundle).unwrap_or(a.bundle.clone()),
        pid_file: a.pid_file,
        console_socket: a.console_socket,
        no_pivot: a.no_pivot,
        preserve_fds: a.preserve_fds,
        systemd_cgroup,
    }
}

fn parse_user(u: &str) -> Result<(u32, Option<u32>), CliError> {
    let bad = || CliError::User {
        value: u.to_owned(),
    };
    let (uid, gid) = match u.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (u, None),
    };
    let uid = uid.parse().map_err(|_| bad())?;
    let gid = match gid {
        Some(g) => Some(g.parse().map_err(|_| bad())?),
        None => None,
    };
    Ok((uid, gid))
}

fn features_json() -> String {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.0.2",
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": ["ro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "private", "rprivate"],
        "linux": {
            "namespaces": ["user", "mount", "pid", "ipc", "uts", "network", "cgroup"],
            "capabilities": [],
            "cgroup": crate::host::cgroups::features(&crate::host::cgroups::RealHost),
            "seccomp": {"enabled": true, "actions": [], "operators": [], "archs": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]},
            "apparmor": {"enabled": crate::apparmor::host() != agent_sandbox_policy::layers::AppArmorHost::Absent},
            "selinux": {"enabled": false}
        },
        "annotations": {
            "io.agent.sandbox.enforced": "userns,readonly-rootfs,no-caps,no-new-privs,netns,seccomp,landlock,cgroups"
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("agent-sandbox").chain(args.iter().copied()))
    }

    #[test]
    fn parses_what_conmon_passes_to_create() {
        let cli = parse(&[
            "--log-format",
            "json",
            "--log",
            "/l",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/p",
            "--console-socket",
            "/s",
            "--no-pivot",
            "--preserve-fds",
            "2",
            "id1",
        ])
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        assert!(cli.systemd_cgroup);
        let Some(Command::Create(c)) = cli.command else {
            panic!("not create");
        };
        assert_eq!(c.bundle, PathBuf::from("/b"));
        assert_eq!(c.preserve_fds, 2);
        assert!(c.no_pivot);
        assert_eq!(c.id, "id1");
    }

    #[test]
    fn parses_exec_with_process_file_and_inline_form() {
        let cli = parse(&[
            "exec",
            "--process",
            "/f",
            "--detach",
            "--pid-file",
            "/p",
            "--console-socket",
            "/s",
            "id1",
        ])
        .unwrap();
        let Some(Command::Exec(e)) = cli.command else {
            panic!("not exec");
        };
        assert!(e.detach && e.process.is_some() && e.command.is_empty());
        let cli = parse(&["exec", "-t", "id1", "sh", "-c", "echo -n x"]).unwrap();
        let Some(Command::Exec(e)) = cli.command else {
            panic!("not exec");
        };
        assert_eq!(e.command, ["sh", "-c", "echo -n x"]);
        assert!(e.tty);
    }

    #[test]
    fn parses_kill_numbers_names_and_all() {
        let cli = parse(&["kill", "--all", "id1", "9"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Kill { all: true, ref signal, .. }) if signal == "9")
        );
        let cli = parse(&["kill", "id1"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Kill { ref signal, .. }) if signal == "SIGTERM")
        );
    }

    #[test]
    fn parses_run_like_runc() {
        let cli = parse(&[
            "run",
            "--bundle",
            "/b",
            "--detach",
            "--pid-file",
            "/p",
            "id1",
        ])
        .unwrap();
        let Some(Command::Run(r)) = cli.command else {
            panic!("not run");
        };
        assert!(r.detach);
        assert_eq!(r.create.bundle, PathBuf::from("/b"));
        assert_eq!(r.create.pid_file, Some(PathBuf::from("/p")));
        assert_eq!(r.create.id, "id1");
    }

    #[test]
    fn unknown_flag_is_named() {
        let err = parse(&["create", "--frobnicate", "id1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--frobnicate"), "{err}");
    }

    #[test]
    fn user_spec_is_validated() {
        assert_eq!(parse_user("1000:100").unwrap(), (1000, Some(100)));
        assert_eq!(parse_user("7").unwrap(), (7, None));
        assert!(parse_user("root").is_err());
    }
}
