//! The runc-compatible command line (parsed by the binary, run here): the clap definitions
//! and the dispatch; each command's work is in the file of its group:
//! - `create`: `create`, `run`
//! - `exec`: `exec`
//! - `control`: `start`, `pause`, `resume`, `kill`, `delete`, `update`
//! - `checkpoint`: `checkpoint`, `restore` (and the hidden `criu-as`)
//! - `inspect`: `state`, `ps`, `list`, `features`, `spec`
//! - `egress`: `allow`, `deny`
//! - `audit`: `audit` (show, verify, prune), `audit-exit`, `layers`
//! - `workspace`: `diff`, `export`, `promote`, `changes`
//! - `policy`: `policy explain`, `profile`
//! - `install`: `install containerd`, `install docker`
//! - `internal`: the hidden commands the runtime and the shim run as helper processes
//!   (`proxy`, `seccomp-supervise`, `watchdog`, `exec-exit`, `exit-recorder`, `hook`)

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::lifecycle::Runtime;
use crate::logging::LogFormat;

mod audit;
mod checkpoint;
mod control;
mod create;
mod egress;
mod exec;
mod inspect;
mod install;
mod internal;
mod policy;
mod workspace;

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
    /// Directory of the admin's profiles that the annotation io.agent.sandbox.profile may
    /// name (docs/policy.md#profiles-by-annotation)
    /// (default /etc/agent-sandbox/profiles)
    #[arg(
        long = "profiles-dir",
        global = true,
        env = "AGENT_SANDBOX_PROFILES_DIR"
    )]
    pub profiles_dir: Option<PathBuf>,
    /// Directory for new sandboxes' audit logs (default: ROOT/audit); kept after delete
    #[arg(long = "audit-dir", global = true, env = "AGENT_SANDBOX_AUDIT_DIR")]
    pub audit_dir: Option<PathBuf>,
    /// Print the version
    #[arg(short = 'v', long = "version")]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What `ID` may be for the review commands (`diff`, `export`, `promote`).
const REVIEW_ID_HELP: &str = "The sandbox: any name its entry point shows (ctr's container id, \
podman's name or id, CRI's POD/CONTAINER, Docker's short id) or a kept change set's id \
(`agent-sandbox changes`)";

/// The review commands, whose help lists only the global options they use (`--root`,
/// `--policy`, `--audit-dir`): the runtime's own options are accepted there but not shown.
const REVIEW_COMMANDS: [&str; 6] = ["diff", "export", "promote", "changes", "audit", "layers"];
/// The global options only the runtime itself (the engines' calls) uses.
const RUNTIME_OPTIONS: [&str; 5] = ["log", "log_format", "debug", "systemd_cgroup", "rootless"];

impl Cli {
    /// Parses the process's arguments (exits with clap's message and code on an error, as
    /// `Parser::parse`), with the runtime's options hidden from the review commands' help.
    /// As CRIU's action script at a restore ([`crate::create::restore::HOOK_ENV`]), the
    /// arguments are the hidden `restore-check`'s, or the process exits 0 at once.
    pub fn parse_args() -> Cli {
        // As CRIU's action script at a checkpoint: the workspace snapshot, then exit.
        if let Some(code) = crate::report::snapshots::run_hook() {
            std::process::exit(code);
        }
        let args = restore_hook_args().unwrap_or_else(|| std::env::args_os().collect());
        if let Some(cli) = Self::parse_plain(&args) {
            return cli;
        }
        let mut cmd = Self::command_for_help();
        match cmd.try_get_matches_from_mut(args) {
            Ok(m) => <Cli as clap::FromArgMatches>::from_arg_matches(&m)
                .unwrap_or_else(|e| e.format(&mut cmd).exit()),
            Err(e) => e.exit(),
        }
    }

    /// `args` parsed by the plain command, or `None` for help and errors. Every start of the
    /// runtime parses (create and its re-exec, the engines' calls, each sidecar), and
    /// building the command whose help hides the runtime's options, recursively, cost 0.3 ms
    /// of CPU per start; the plain one, built as far as the parse goes, parses alike
    /// (docs/benchmarks.md#where-the-time-goes).
    fn parse_plain(args: &[std::ffi::OsString]) -> Option<Cli> {
        let m = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(args)
            .ok()?;
        <Cli as clap::FromArgMatches>::from_arg_matches(&m).ok()
    }

    /// The clap command of [`Cli`] with the runtime's options hidden from the review
    /// commands' help.
    pub fn command_for_help() -> clap::Command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        // Globals reach the subcommands when the command is built. `mut_args` keeps each
        // argument where it is (the built lookup of long names points at positions; the
        // unit test parses hidden options after this).
        cmd.build();
        for name in REVIEW_COMMANDS {
            cmd = cmd.mut_subcommand(name, |sc| {
                sc.mut_args(|a| {
                    let runtime_only = RUNTIME_OPTIONS.contains(&a.get_id().as_str());
                    a.hide(runtime_only)
                })
            });
        }
        cmd
    }
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
    /// checkpoint a running container (with CRIU: docs/checkpoint.md)
    // podman passes a flag twice (`--leave-running --leave-running`); runc takes it.
    #[command(args_override_self = true)]
    Checkpoint(checkpoint::CheckpointArgs),
    /// restore a container from a previous checkpoint (with CRIU: docs/checkpoint.md)
    #[command(args_override_self = true)]
    Restore(checkpoint::RestoreArgs),
    /// Internal: CRIU's pre-resume hook, the check of every restored task
    #[command(name = "restore-check", hide = true)]
    RestoreCheck { id: String },
    /// Internal: CRIU under the sandbox's host root id (keeping the runtime's
    /// capabilities)
    #[command(name = "criu-as", hide = true)]
    CriuAs {
        #[arg(long)]
        uid: Option<u32>,
        /// CRIU's path and arguments
        #[arg(last = true, required = true)]
        argv: Vec<std::ffi::OsString>,
    },
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
        /// Descriptor 4 is the dead-man pipe's write end: this process is the sandbox's
        /// helper and also holds its wall clock (the kernel audit subscription moves to 5)
        #[arg(long)]
        dead_man: bool,
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
    /// Review what a sandbox changed in its workspace (A added, M modified, D deleted, O
    /// opaque dir): the files `promote` would bring, the agent's commits (not the files below
    /// .git), and apart the files the checkout's .gitignore ignores. Everything the sandbox
    /// wrote is escaped. The change set is kept after the container is deleted, until it is
    /// promoted or discarded (docs/workspace.md#retention)
    Diff {
        /// Show a unified diff of each file against the host's (escaped; binary and large
        /// files summarised by size and SHA-256)
        #[arg(long, conflicts_with = "stat")]
        patch: bool,
        /// Show the lines added and removed per file, and the totals
        #[arg(long)]
        stat: bool,
        /// List the ignored files one by one too
        #[arg(long)]
        ignored: bool,
        #[arg(value_name = "ID", help = REVIEW_ID_HELP)]
        id: String,
    },
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
        #[arg(value_name = "ID", help = REVIEW_ID_HELP)]
        id: String,
    },
    /// Apply a sandbox's workspace changes to a directory, refusing anything that could act
    /// on the host (links out of the tree, protected names, .git internals; docs/promote.md)
    Promote(PromoteArgs),
    /// Kept workspace change sets (docs/workspace.md): list them (`changes`), drop one
    /// (`changes discard ID`), or apply the retention limits now (`changes prune`)
    Changes {
        #[command(subcommand)]
        action: Option<crate::report::changes::Action>,
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
    /// Internal: the shim's writer of exec `exit` records, one JSON line in and one out per
    /// exit on stdin/stdout (`sidecars/exec_exit.rs`)
    #[command(name = "exit-recorder", hide = true)]
    ExitRecorder {
        /// End after this long without an exit to record
        #[arg(long = "idle-seconds", default_value_t = 60)]
        idle_seconds: u64,
        id: String,
    },
    /// Internal: the OOM watcher that `create` spawns for a podman container
    /// (`sidecars/podman_oom.rs`)
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
        #[arg(long, default_value = crate::install::containerd::DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// The `agent-sandbox` runtime of dockerd (`docker run --runtime agent-sandbox`)
    Docker(crate::install::docker::DockerArgs),
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// What the sandbox allows and denies
    Explain {
        /// Built-in profile name or policy file path
        profile: PathBuf,
    },
}

// `promote`'s arguments (no doc comment: clap would take it for the command's about).
#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The directory to apply the changes to (e.g. the checkout the workspace came from)
    #[arg(long = "to")]
    pub to: PathBuf,
    /// Print the plan (and what would be refused) without changing anything
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Apply only if the change set still has this digest (`sha256:…`, as the dry run
    /// printed it): what was reviewed is what is applied
    #[arg(long)]
    pub digest: Option<String>,
    /// Also fast-forward the target's current branch to the sandbox's commit for it,
    /// refusing if that branch moved (docs/promote.md#advance)
    #[arg(long)]
    pub advance: bool,
    /// Also promote the files the checkout's .gitignore ignores (`__pycache__`, build
    /// output), which are left out by default (docs/promote.md#ignored)
    #[arg(long = "include-ignored")]
    pub include_ignored: bool,
    #[arg(value_name = "ID", help = REVIEW_ID_HELP)]
    pub id: String,
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
    /// Internal (the shim): containerd's exec id, for the `exec` and `exit` records (a ctr
    /// exec id also names the tool call: docs/audit.md#tool-call-ids)
    #[arg(long = "exec-id", hide = true, value_parser = exec_id_arg)]
    pub exec_id: Option<String>,
    pub id: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `--exec-id` ([`crate::sidecars::exec_exit::valid_exec_id`]).
fn exec_id_arg(value: &str) -> Result<String, String> {
    if crate::sidecars::exec_exit::valid_exec_id(value) {
        Ok(value.to_owned())
    } else {
        Err("an exec id is 1 to 128 characters of A-Z a-z 0-9 . _ -".to_owned())
    }
}

/// Errors of the command line layer.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Id(#[from] crate::state::IdError),
    #[error(transparent)]
    Paths(#[from] crate::state::paths::PathsError),
    #[error(transparent)]
    Lookup(#[from] crate::lifecycle::LookupError),
    #[error(transparent)]
    Create(#[from] crate::lifecycle::CreateError),
    #[error(transparent)]
    State(#[from] crate::lifecycle::StateError),
    #[error(transparent)]
    Workspace(#[from] crate::lifecycle::WorkspaceError),
    #[error(transparent)]
    Checkpoint(#[from] crate::lifecycle::CheckpointError),
    #[error(transparent)]
    Sidecar(#[from] crate::lifecycle::SidecarError),
    #[error(transparent)]
    Delete(#[from] crate::lifecycle::DeleteError),
    #[error(transparent)]
    Kill(#[from] crate::lifecycle::KillError),
    #[error(transparent)]
    Start(#[from] crate::lifecycle::StartError),
    #[error(transparent)]
    Exec(#[from] crate::lifecycle::ExecError),
    #[error(transparent)]
    Pause(#[from] crate::lifecycle::PauseError),
    #[error(transparent)]
    Ps(#[from] crate::lifecycle::PsError),
    #[error(transparent)]
    Update(#[from] crate::lifecycle::UpdateError),
    #[error(transparent)]
    Run(#[from] crate::run::RunError),
    #[error(transparent)]
    Hook(#[from] crate::enforce::hooks::HookError),
    #[error(transparent)]
    PodmanOom(#[from] crate::sidecars::podman_oom::PodmanOomError),
    #[error("cannot run CRIU as the sandbox's host root id")]
    CriuAs(#[source] std::io::Error),
    #[error("no command given (try --help)")]
    NoCommand,
    #[error("audit takes ID, verify ID, prune or prune ID, not {args:?}")]
    AuditArgs { args: Vec<String> },
    #[error("sandbox {id} has no audit log at {path}")]
    NoAuditLog { id: String, path: PathBuf },
    #[error("audit trail")]
    Audit(#[from] agent_sandbox_audit::AuditError),
    #[error("audit prune")]
    Prune(#[from] crate::report::audit::PruneError),
    #[error("--older-than only goes with audit prune")]
    OlderThanWithoutPrune,
    #[error("workspace review")]
    Scratch(#[from] agent_sandbox_audit::ScratchError),
    #[error("workspace review")]
    Review(#[from] crate::report::review::ReviewError),
    #[error(transparent)]
    Promote(#[from] crate::report::promote::PromoteCmdError),
    #[error("workspace changes")]
    Changes(#[from] crate::report::changes::ChangesError),
    #[error(transparent)]
    Find(#[from] crate::report::find::FindError),
    #[error("--user {value:?} is not UID[:GID]")]
    User { value: String },
    #[error("--cap {cap}: the sandbox grants no capabilities")]
    Cap { cap: String },
    #[error("exec needs --process or a command")]
    NoExecCommand,
    #[error("exit recorder")]
    ExitRecorder(#[source] std::io::Error),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(transparent)]
    Sandbox(#[from] crate::harden::SandboxError),
    #[error(transparent)]
    Allow(#[from] crate::sidecars::allow::AllowError),
    #[error(transparent)]
    Install(#[from] crate::install::containerd::InstallError),
    #[error(transparent)]
    InstallDocker(#[from] crate::install::docker::DockerInstallError),
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

/// The arguments of CRIU's action script ([`crate::create::restore::HOOK_ENV`]): run
/// without arguments and with that variable, at `pre-resume` `--root ROOT restore-check
/// ID`; at CRIU's other stages the process exits 0 here. `None` for any other run.
fn restore_hook_args() -> Option<Vec<std::ffi::OsString>> {
    let mut argv = std::env::args_os();
    let argv0 = argv.next()?;
    if argv.next().is_some() {
        return None;
    }
    let hook = std::env::var(crate::create::restore::HOOK_ENV).ok()?;
    let action = std::env::var("CRTOOLS_SCRIPT_ACTION").ok()?;
    if action != "pre-resume" {
        std::process::exit(0);
    }
    let (root, id) = hook.split_once('\n')?;
    Some(vec![
        argv0,
        "--root".into(),
        root.into(),
        "restore-check".into(),
        id.into(),
    ])
}

/// Whether this command enters a container (and so must run from a sealed
/// copy of the binary first): the oracle [`may_need_sealed_binary`] is tested against.
#[cfg(test)]
fn needs_sealed_binary(cli: &Cli) -> bool {
    matches!(
        cli.command,
        Some(Command::Create(_)) | Some(Command::Exec(_)) | Some(Command::Run(_))
    )
}

/// Whether the command line `args` may enter a container (create, exec, run): any argument
/// spelling one of those commands. Decided before parsing, so that the caller's process,
/// which re-executes itself, does not parse too (0.5 ms of CPU per `create` and `exec`);
/// a false positive (an id named `run`) only costs that re-execution.
pub fn may_need_sealed_binary(args: &[std::ffi::OsString]) -> bool {
    args.iter()
        .skip(1)
        .any(|a| matches!(a.to_str(), Some("create" | "exec" | "run")))
}

/// Runs one command.
pub fn run(mut cli: Cli) -> Result<Outcome, CliError> {
    if cli.version {
        print!("{}", version_text());
        return Ok(Outcome::Exit(0));
    }
    let command = cli.command.take().ok_or(CliError::NoCommand)?;
    let cli = &cli;
    match command {
        Command::Create(a) => create::create(cli, a)?,
        Command::Run(a) => return create::run(cli, a),
        Command::Start { id } => control::start(cli, &id)?,
        Command::Pause { id } => control::pause(cli, &id, true)?,
        Command::Resume { id } => control::pause(cli, &id, false)?,
        Command::State { id } => inspect::state(cli, &id)?,
        Command::Kill { all, id, signal } => control::kill(cli, &id, &signal, all)?,
        Command::Delete {
            force,
            exit_pid,
            exit_status,
            id,
        } => control::delete(cli, &id, force, exit_pid, exit_status)?,
        Command::Exec(a) => return exec::exec(cli, a),
        Command::Checkpoint(a) => checkpoint::checkpoint(cli, a)?,
        Command::Restore(a) => checkpoint::restore(cli, a)?,
        Command::RestoreCheck { id } => checkpoint::restore_check(cli, &id)?,
        Command::CriuAs { uid, argv } => checkpoint::criu_as(uid, &argv)?,
        Command::Ps { format, id, .. } => inspect::ps(cli, &id, &format)?,
        Command::Update { resources, id } => control::update(cli, &id, &resources)?,
        Command::Features => inspect::features(),
        Command::Hook { bundle, argv } => internal::hook(&bundle, &argv)?,
        Command::Proxy { netns, id } => internal::proxy(cli, &id, &netns)?,
        Command::Allow { id, rule } => egress::allow(cli, &id, &rule)?,
        Command::Deny { id, rule } => egress::deny(cli, &id, &rule)?,
        Command::SeccompSupervise {
            errno,
            kernel_audit,
            dead_man,
            id,
        } => internal::seccomp_supervise(cli, &id, errno, kernel_audit, dead_man)?,
        Command::Audit {
            json,
            older_than,
            args,
        } => return audit::audit(cli, json, older_than.as_deref(), args),
        Command::AuditExit {
            process,
            pid,
            status,
            id,
        } => audit::audit_exit(cli, &id, process, pid, status)?,
        Command::Layers { id } => audit::layers(cli, &id)?,
        Command::Diff {
            patch,
            stat,
            ignored,
            id,
        } => workspace::diff(cli, &id, patch, stat, ignored)?,
        Command::Export { to_dir, to_tar, id } => workspace::export(cli, &id, to_dir, to_tar)?,
        Command::Promote(a) => workspace::promote(cli, a)?,
        Command::Changes { action } => workspace::changes(cli, action)?,
        Command::ExecExit { exec_id, pid, id } => internal::exec_exit(cli, &id, &exec_id, pid)?,
        Command::ExitRecorder { idle_seconds, id } => {
            internal::exit_recorder(cli, &id, idle_seconds)?
        }
        Command::OomWatch { bundle, cgroup, id } => internal::oom_watch(&bundle, &cgroup, &id)?,
        Command::Watchdog { seconds, pid, id } => internal::watchdog(cli, &id, seconds, pid)?,
        Command::Policy {
            action: PolicyAction::Explain { profile },
        } => policy::explain(&profile)?,
        Command::Profile { kind, profile } => policy::profile(&kind, &profile)?,
        Command::Spec { bundle } => inspect::spec(&bundle)?,
        Command::Install { target } => install::install(target)?,
        Command::List { format } => inspect::list(cli, &format)?,
    }
    Ok(Outcome::Exit(0))
}

impl Cli {
    /// The runtime on `--root`, with `--audit-dir` for the sandboxes it creates.
    fn runtime(&self) -> Result<Runtime, crate::state::paths::PathsError> {
        Runtime::new(self.root.as_deref()).map(|mut r| {
            r.audit_dir = self.audit_dir.clone();
            if let Some(dir) = &self.profiles_dir {
                r.profiles_dir = dir.clone();
            }
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("agent-sandbox").chain(args.iter().copied()))
    }

    /// A command line written as one string, split at spaces.
    fn argv(line: &str) -> Vec<std::ffi::OsString> {
        line.split(' ').map(std::ffi::OsString::from).collect()
    }

    #[test]
    fn every_command_line_that_enters_a_container_re_executes_before_parsing() {
        for line in [
            "agent-sandbox --root /r create --bundle b id",
            "agent-sandbox --log /l exec --process p.json id",
            "agent-sandbox run --bundle b id",
            "agent-sandbox --root /r start id",
            "agent-sandbox --root /r delete run",
            "agent-sandbox diff ID",
        ] {
            let cli = Cli::parse_plain(&argv(line)).expect("parses");
            if needs_sealed_binary(&cli) {
                assert!(may_need_sealed_binary(&argv(line)), "{line}");
            }
        }
        assert!(!may_need_sealed_binary(&argv("agent-sandbox start id")));
        assert!(
            !may_need_sealed_binary(&argv("create")),
            "argv[0] is no command"
        );
    }

    #[test]
    fn the_plain_parse_reads_arguments_as_the_help_command_does() {
        for line in [
            "agent-sandbox --root /r --log /l create --bundle b id",
            "agent-sandbox diff --root /r ID",
            "agent-sandbox --systemd-cgroup delete --force id",
            "agent-sandbox --version",
        ] {
            let plain = Cli::parse_plain(&argv(line)).expect("parses");
            let full = Cli::command_for_help().try_get_matches_from(argv(line));
            let full = <Cli as clap::FromArgMatches>::from_arg_matches(&full.unwrap()).unwrap();
            assert_eq!(format!("{plain:?}"), format!("{full:?}"), "{line}");
        }
        // Help and errors go through the command that hides the runtime's options.
        for line in [
            "agent-sandbox diff --help",
            "agent-sandbox --help",
            "agent-sandbox create",
            "agent-sandbox no-such-command",
        ] {
            assert!(Cli::parse_plain(&argv(line)).is_none(), "{line}");
        }
    }

    #[test]
    fn review_help_says_what_id_may_be_and_hides_the_runtimes_options()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut cmd = Cli::command_for_help();
        for name in ["diff", "promote", "export"] {
            let help = cmd
                .find_subcommand_mut(name)
                .ok_or("no such subcommand")?
                .render_long_help()
                .to_string();
            for hidden in ["--systemd-cgroup", "--rootless", "--log-format", "--debug"] {
                assert!(
                    !help.contains(hidden),
                    "{name} --help shows {hidden}\n{help}"
                );
            }
            for shown in ["--root", "--policy", "POD/CONTAINER", "Docker's short id"] {
                assert!(help.contains(shown), "{name} --help lacks {shown}\n{help}");
            }
        }
        // Still accepted where an engine passes them, and the main help keeps them.
        let m = Cli::command_for_help().try_get_matches_from([
            "agent-sandbox",
            "--systemd-cgroup",
            "diff",
            "--debug",
            "--patch",
            "pod/agent",
        ])?;
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m)?;
        assert!(cli.debug && cli.systemd_cgroup);
        assert!(matches!(
            cli.command,
            Some(Command::Diff { patch: true, stat: false, ref id, .. }) if id == "pod/agent"
        ));
        let main = Cli::command_for_help().render_long_help().to_string();
        assert!(main.contains("--systemd-cgroup"));
        Ok(())
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
    fn profiles_dir_is_optional_and_install_docker_forwards_it_only_when_given() {
        let docker_dir = |args: &[&str]| match parse(args).unwrap().command {
            Some(Command::Install {
                target: InstallTarget::Docker(d),
            }) => d.profiles_dir,
            other => panic!("not install docker: {other:?}"),
        };
        assert_eq!(docker_dir(&["install", "docker"]), None);
        assert_eq!(
            docker_dir(&["install", "docker", "--profiles-dir", "/p"]),
            Some(PathBuf::from("/p"))
        );
        let cli = parse(&["--profiles-dir", "/q", "state", "id1"]).unwrap();
        assert_eq!(cli.profiles_dir, Some(PathBuf::from("/q")));
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
}
