//! Edits a checkpoint image the way a user holding it could, for the VM suite's restore
//! attacks (hack/vm/checks.sh, docs/vm-suite.md): the same edits as the e2e suite's
//! (`agent_sandbox_e2e::criu_image`).
//!
//! ```sh
//! criu_edit drop-seccomp IMAGE_DIR/core-1.img   # the task restores without its filter
//! criu_edit add-sys-admin IMAGE_DIR/core-1.img  # ... with CAP_SYS_ADMIN
//! ```
//!
//! An agent-sandbox image (`agent-sandbox.json` beside the core) gets its manifest's digest
//! rewritten to the edited files' (`reseal_digest`), so the restore reaches the checks of the
//! tasks instead of stopping at the digest.

use std::path::PathBuf;

use agent_sandbox_e2e::criu_image::{add_sys_admin, drop_seccomp, edit_thread_core, reseal_digest};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Edit {
    /// `seccomp_mode` disabled, no filter
    DropSeccomp,
    /// CAP_SYS_ADMIN in the permitted, effective and bounding sets
    AddSysAdmin,
}

#[derive(Debug, Parser)]
struct Args {
    edit: Edit,
    /// CRIU's `core-PID.img`
    core: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let edit = match args.edit {
        Edit::DropSeccomp => drop_seccomp,
        Edit::AddSysAdmin => add_sys_admin,
    };
    edit_thread_core(&args.core, edit)?;
    if let Some(dir) = args.core.parent()
        && dir.join("agent-sandbox.json").is_file()
    {
        reseal_digest(dir)?;
    }
    Ok(())
}
