//! The bridge between a container and the policy crate: which policy is the ceiling
//! (`ceiling`), hardening the spec with the runtime's facts (the id mapping in `ids`, the
//! workspace overlay's dirs in `overlay`, protected paths found on the host in `protected`)
//! handed to the policy crate's plan compiler in `prepare`, what the host supports (`plan`),
//! and the plan a created sandbox saved, for exec and every later command (`exec`). The in-process layers the plan applies (seccomp BPF, Landlock) are built
//! in `crate::enforce`; cgroups are `crate::host::cgroups`.

use std::path::PathBuf;

use agent_sandbox_policy::PolicyError;
use agent_sandbox_policy::harden::HardenError;
use agent_sandbox_policy::layers::LayerError;
use agent_sandbox_policy::seccomp::SeccompError;

use crate::enforce::mounts;
use crate::state::paths;

mod ceiling;
mod exec;
mod ids;
mod mount_dir;
mod overlay;
mod plan;
mod prepare;
pub mod profiles;
mod protected;

pub use ceiling::{Ceiling, DEFAULT_PROFILE};
pub use exec::saved_plan;
pub use mount_dir::mount_dir;
pub use overlay::overlay_dirs;
pub use plan::host_support;
pub use prepare::{compile, executor, spec_profile_name};
pub use profiles::DEFAULT_PROFILES_DIR;
pub use protected::check_writable_destinations;

/// Errors of the policy bridge; each names the layer, file or annotation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "policy file {path} does not exist (a path or a built-in profile name: docs/policy.md)"
    )]
    MissingPolicy { path: PathBuf },
    #[error("cannot read policy file {path}")]
    ReadPolicy {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid policy")]
    Policy(#[source] PolicyError),
    #[error(transparent)]
    Profile(#[from] profiles::ProfileError),
    #[error("cannot harden the container spec")]
    Harden(#[source] HardenError),
    #[error("layer plan")]
    Layer(#[source] LayerError),
    #[error("seccomp layer: cannot compile the filter")]
    Seccomp(#[source] SeccompError),
    #[error("seccomp layer: this architecture has no filter")]
    NoArch,
    #[error("seccomp layer: the config's own profile cannot be honoured")]
    SeccompRequest(#[source] agent_sandbox_policy::seccomp::RequestError),
    #[error(
        "seccomp layer: config.json asks for linux.seccomp but this host applies no seccomp filter"
    )]
    SeccompRequestWithoutLayer,
    #[error("writable mount {path} would land on a symlink in the rootfs ({component}); refusing")]
    SymlinkedWritable { path: PathBuf, component: PathBuf },
    #[error("cannot prepare the workspace overlay dir {path}")]
    Overlay {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroups layer")]
    Cgroups(#[from] crate::host::cgroups::CgroupsError),
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    #[error(transparent)]
    Paths(#[from] paths::PathsError),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

/// The plan compiler's errors keep their texts as this bridge's own variants.
impl From<agent_sandbox_policy::CompileError> for SandboxError {
    fn from(e: agent_sandbox_policy::CompileError) -> Self {
        match e {
            agent_sandbox_policy::CompileError::Harden(e) => Self::Harden(e),
            agent_sandbox_policy::CompileError::Layer(e) => Self::Layer(e),
        }
    }
}
