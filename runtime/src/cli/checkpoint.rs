//! `checkpoint` and `restore` (docs/checkpoint.md): runc's flags by runc's names, because
//! podman, containerd's runc shim and our shim pass them as they pass them to runc. Flags
//! the runtime cannot honour are refused by name (`lifecycle/checkpoint.rs`), never ignored.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::lifecycle::CheckpointOpts;
use crate::state::ContainerId;

use super::{Cli, CliError};

/// `checkpoint`'s flags, as runc's (`runc checkpoint --help`).
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// path for saving criu image files
    #[arg(long = "image-path", value_name = "value")]
    pub image_path: PathBuf,
    /// path for saving work files and logs
    #[arg(long = "work-path", value_name = "value")]
    pub work_path: Option<PathBuf>,
    /// path for previous criu image files in pre-dump (refused: docs/checkpoint.md#flags)
    #[arg(long = "parent-path", value_name = "value")]
    pub parent_path: Option<PathBuf>,
    /// leave the process running after checkpointing
    #[arg(long = "leave-running")]
    pub leave_running: bool,
    /// allow open tcp connections
    #[arg(long = "tcp-established")]
    pub tcp_established: bool,
    /// allow external unix sockets
    #[arg(long = "ext-unix-sk")]
    pub ext_unix_sk: bool,
    /// allow shell jobs
    #[arg(long = "shell-job")]
    pub shell_job: bool,
    /// use userfaultfd to lazily restore memory pages (refused: docs/checkpoint.md#flags)
    #[arg(long = "lazy-pages")]
    pub lazy_pages: bool,
    /// criu writes \0 to this FD once lazy-pages is ready (default: -1)
    #[arg(long = "status-fd", value_name = "value", allow_hyphen_values = true)]
    pub status_fd: Option<i32>,
    /// ADDRESS:PORT of the page server (refused: docs/checkpoint.md#flags)
    #[arg(long = "page-server", value_name = "value")]
    pub page_server: Option<String>,
    /// handle file locks, for safety
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// dump container's memory information only, leave the container running after this
    /// (refused: docs/checkpoint.md#flags)
    #[arg(long = "pre-dump")]
    pub pre_dump: bool,
    /// cgroups mode: 'soft' (default), 'full' and 'strict'
    #[arg(long = "manage-cgroups-mode", value_name = "value")]
    pub manage_cgroups_mode: Option<String>,
    /// create a namespace, but don't restore its properties (refused: docs/checkpoint.md#flags)
    #[arg(long = "empty-ns", value_name = "value")]
    pub empty_ns: Vec<String>,
    /// enable auto deduplication of memory images
    #[arg(long = "auto-dedup")]
    pub auto_dedup: bool,
    /// the name for the instance of the container to be checkpointed
    #[arg(value_name = "container-id")]
    pub id: String,
}

/// `checkpoint [options] ID`.
pub(super) fn checkpoint(cli: &Cli, a: CheckpointArgs) -> Result<(), CliError> {
    let opts = CheckpointOpts {
        image_path: std::path::absolute(&a.image_path)
            .map_err(|e| crate::files::FileError::read(&a.image_path, e))?,
        work_path: a.work_path,
        leave_running: a.leave_running,
        tcp_established: a.tcp_established,
        ext_unix_sk: a.ext_unix_sk,
        shell_job: a.shell_job,
        file_locks: a.file_locks,
        pre_dump: a.pre_dump,
        parent_path: a.parent_path,
        manage_cgroups_mode: a.manage_cgroups_mode,
        empty_ns: a.empty_ns,
        auto_dedup: a.auto_dedup,
        lazy_pages: a.lazy_pages,
        status_fd: a.status_fd,
        page_server: a.page_server,
    };
    cli.runtime()?
        .checkpoint(&ContainerId::try_from(a.id.as_str())?, &opts)?;
    Ok(())
}

/// The hidden `criu-as --uid N -- CRIU ARGS`: CRIU under the sandbox's host root id
/// (`host::criu::exec_as`). Returns only on an error.
pub(super) fn criu_as(uid: u32, argv: &[OsString]) -> Result<(), CliError> {
    Err(CliError::CriuAs(crate::host::criu::exec_as(uid, argv)))
}
