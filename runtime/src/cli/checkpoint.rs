//! `checkpoint` and `restore` (docs/checkpoint.md): runc's flags by runc's names, because
//! podman, containerd's runc shim and our shim pass them as they pass them to runc. Flags
//! the runtime cannot honour are refused by name (`lifecycle/checkpoint.rs`), never ignored.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::create::RestoreOpts;
use crate::harden::Ceiling;
use crate::lifecycle::{CheckpointOpts, CreateOpts, CriuFlags};
use crate::state::ContainerId;

use super::{Cli, CliError};

/// The flags `checkpoint` and `restore` share, as runc's.
#[derive(Debug, Args)]
pub struct CriuArgs {
    /// path for saving (checkpoint) or restoring from (restore) criu image files
    #[arg(long = "image-path", value_name = "value")]
    pub image_path: PathBuf,
    /// path for saving work files and logs
    #[arg(long = "work-path", value_name = "value")]
    pub work_path: Option<PathBuf>,
    /// allow open tcp connections
    #[arg(long = "tcp-established")]
    pub tcp_established: bool,
    /// allow external unix sockets
    #[arg(long = "ext-unix-sk")]
    pub ext_unix_sk: bool,
    /// allow shell jobs
    #[arg(long = "shell-job")]
    pub shell_job: bool,
    /// handle file locks, for safety
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// cgroups mode: 'soft' (default), 'full' and 'strict' (restore: only 'ignore', the
    /// runtime places the tasks itself)
    #[arg(long = "manage-cgroups-mode", value_name = "value")]
    pub manage_cgroups_mode: Option<String>,
    /// create a namespace, but don't restore its properties (refused: docs/checkpoint.md#flags)
    #[arg(long = "empty-ns", value_name = "value")]
    pub empty_ns: Vec<String>,
    /// enable auto deduplication of memory images
    #[arg(long = "auto-dedup")]
    pub auto_dedup: bool,
    /// use userfaultfd to lazily restore memory pages (refused: docs/checkpoint.md#flags)
    #[arg(long = "lazy-pages")]
    pub lazy_pages: bool,
}

impl From<CriuArgs> for CriuFlags {
    fn from(a: CriuArgs) -> Self {
        let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        CriuFlags {
            image_path: absolute(&a.image_path),
            work_path: a.work_path.as_ref().map(absolute),
            tcp_established: a.tcp_established,
            ext_unix_sk: a.ext_unix_sk,
            shell_job: a.shell_job,
            file_locks: a.file_locks,
            manage_cgroups_mode: a.manage_cgroups_mode,
            empty_ns: a.empty_ns,
            auto_dedup: a.auto_dedup,
            lazy_pages: a.lazy_pages,
        }
    }
}

/// `checkpoint`'s flags, as runc's (`runc checkpoint --help`).
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub criu: CriuArgs,
    /// path for previous criu image files in pre-dump (refused: docs/checkpoint.md#flags)
    #[arg(long = "parent-path", value_name = "value")]
    pub parent_path: Option<PathBuf>,
    /// leave the process running after checkpointing
    #[arg(long = "leave-running")]
    pub leave_running: bool,
    /// criu writes \0 to this FD once lazy-pages is ready (default: -1)
    #[arg(long = "status-fd", value_name = "value", allow_hyphen_values = true)]
    pub status_fd: Option<i32>,
    /// ADDRESS:PORT of the page server (refused: docs/checkpoint.md#flags)
    #[arg(long = "page-server", value_name = "value")]
    pub page_server: Option<String>,
    /// dump container's memory information only, leave the container running after this
    /// (refused: docs/checkpoint.md#flags)
    #[arg(long = "pre-dump")]
    pub pre_dump: bool,
    /// the name for the instance of the container to be checkpointed
    #[arg(value_name = "container-id")]
    pub id: String,
}

/// `restore`'s flags, as runc's (`runc restore --help`).
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub criu: CriuArgs,
    /// path to an AF_UNIX socket which will receive a file descriptor referencing the master
    /// end of the console's pseudoterminal (refused: docs/checkpoint.md#flags)
    #[arg(long = "console-socket", value_name = "value")]
    pub console_socket: Option<PathBuf>,
    /// path to the root of the bundle directory
    #[arg(short, long, value_name = "value", default_value = ".")]
    pub bundle: PathBuf,
    /// detach from the container's process
    #[arg(short, long)]
    pub detach: bool,
    /// specify the file to write the process id to
    #[arg(long = "pid-file", value_name = "value")]
    pub pid_file: Option<PathBuf>,
    /// disable the use of the subreaper used to reap reparented processes
    #[arg(long = "no-subreaper")]
    pub no_subreaper: bool,
    /// do not use pivot root to jail process inside rootfs
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    /// Specify an LSM profile to be used during restore in the form of TYPE:NAME (refused:
    /// the sandbox's own profile applies)
    #[arg(long = "lsm-profile", value_name = "value")]
    pub lsm_profile: Option<String>,
    /// Specify an LSM mount context to be used during restore (refused)
    #[arg(long = "lsm-mount-context", value_name = "value")]
    pub lsm_mount_context: Option<String>,
    /// the name for the instance of the container to be restored
    #[arg(value_name = "container-id")]
    pub id: String,
}

/// `restore [options] ID`: the restored sandbox runs on at once (runc's restore starts it),
/// so `--detach` only says the caller does not wait, which is always so here.
pub(super) fn restore(cli: &Cli, a: RestoreArgs) -> Result<(), CliError> {
    let id = ContainerId::try_from(a.id.as_str())?;
    let ceiling = Ceiling::load(cli.policy.as_deref())?;
    let opts = RestoreOpts {
        create: CreateOpts {
            bundle: std::path::absolute(&a.bundle).unwrap_or_else(|_| a.bundle.clone()),
            pid_file: a.pid_file,
            console_socket: a.console_socket,
            no_pivot: a.no_pivot,
            preserve_fds: 0,
            systemd_cgroup: cli.systemd_cgroup,
            reuse_change: None,
            keep_placeholders: std::collections::BTreeMap::new(),
        },
        criu: a.criu.into(),
        detach: a.detach,
        lsm_profile: a.lsm_profile,
        lsm_mount_context: a.lsm_mount_context,
    };
    cli.runtime()?.restore(&id, &opts, &ceiling)?;
    Ok(())
}

/// The hidden `restore-check ID`: CRIU's pre-resume hook (`create::restore`).
pub(super) fn restore_check(cli: &Cli, id: &str) -> Result<(), CliError> {
    cli.runtime()?.restore_check(&ContainerId::try_from(id)?)?;
    Ok(())
}

/// `checkpoint [options] ID`.
pub(super) fn checkpoint(cli: &Cli, a: CheckpointArgs) -> Result<(), CliError> {
    let opts = CheckpointOpts {
        criu: a.criu.into(),
        leave_running: a.leave_running,
        pre_dump: a.pre_dump,
        parent_path: a.parent_path,
        status_fd: a.status_fd,
        page_server: a.page_server,
    };
    cli.runtime()?
        .checkpoint(&ContainerId::try_from(a.id.as_str())?, &opts)?;
    Ok(())
}

/// The hidden `criu-as [--uid N] -- CRIU ARGS` (`host::criu::exec_as`). Returns only on an
/// error.
pub(super) fn criu_as(uid: Option<u32>, argv: &[OsString]) -> Result<(), CliError> {
    Err(CliError::CriuAs(crate::host::criu::exec_as(uid, argv)))
}
