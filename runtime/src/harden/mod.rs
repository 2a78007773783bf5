//! The bridge between a container and the policy crate: which policy is the
//! ceiling, hardening the spec with the runtime's facts (id mapping, overlay
//! dirs, protected paths found on the host), the layer plan, the in-process
//! layers handed to the executor (seccomp BPF, Landlock). Cgroups are
//! `crate::host::cgroups`.

use std::path::PathBuf;
use std::sync::Arc;

use agent_sandbox_policy::harden::HardenError;
use agent_sandbox_policy::layers::{LayerError, LayerPlan};
use agent_sandbox_policy::seccomp::{Arch, SeccompError};
use agent_sandbox_policy::{Layer, PolicyError, SandboxPolicy};

use crate::enforce::executor::{LandlockApply, SandboxExecutor};
use crate::enforce::mounts;
use crate::state::paths;

mod ceiling;
mod exec;
mod ids;
mod mount_dir;
mod overlay;
mod plan;
mod prepare;
mod protected;

pub use ceiling::{Ceiling, DEFAULT_PROFILE};
pub use exec::{effective_for_exec, harden_exec};
pub use mount_dir::mount_dir;
pub use overlay::overlay_dirs;
pub use plan::host_support;
pub use prepare::{Facts, Prepared, prepare, requested_seccomp};
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
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Builds the executor for the layers in `plan`.
pub fn executor_for(
    policy: &SandboxPolicy,
    plan: &LayerPlan,
) -> Result<SandboxExecutor, SandboxError> {
    let mut executor = SandboxExecutor::default();
    if plan.apply.contains(&Layer::Seccomp) {
        let arch = Arch::host().ok_or(SandboxError::NoArch)?;
        let bpf = agent_sandbox_policy::seccomp::compile_bpf(&policy.syscalls, arch)
            .map_err(SandboxError::Seccomp)?;
        executor.seccomp = Some(Arc::new(bpf));
    }
    if plan.apply.contains(&Layer::Landlock) {
        // The ruleset at the kernel's ABI, as the plan decided (never the newest ABI's
        // rights on an older kernel: HardRequirement below would refuse them).
        let ruleset =
            plan.landlock
                .as_ref()
                .map(|at| at.ruleset.clone())
                .ok_or(SandboxError::Layer(LayerError::Unavailable {
                    layer: Layer::Landlock,
                }))?;
        executor.landlock = Some(Arc::new(LandlockRules(ruleset)));
    }
    Ok(executor)
}

/// The policy's Landlock ruleset, applied inside the container.
struct LandlockRules(agent_sandbox_policy::landlock::LandlockRuleset);

impl LandlockApply for LandlockRules {
    fn apply(&self, audit: bool) -> Result<Option<u16>, String> {
        use landlock::{
            CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
            RulesetCreatedAttr, RulesetStatus,
        };
        let rs = &self.0;
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(rs.handled_fs_flags())
            .map_err(|e| e.to_string())?;
        // Below ABI 4 the ruleset handles no TCP right (an empty set is an error).
        if !rs.handled_net.is_empty() {
            ruleset = ruleset
                .handle_access(rs.handled_net_flags())
                .map_err(|e| e.to_string())?;
        }
        let mut created = ruleset.create().map_err(|e| e.to_string())?;
        for rule in &rs.paths {
            // A path missing in this container gets no rights, which is narrower.
            let Ok(fd) = PathFd::new(&rule.path) else {
                continue;
            };
            created = created
                .add_rule(PathBeneath::new(fd, rule.flags()))
                .map_err(|e| format!("{}: {e}", rule.path))?;
        }
        for rule in &rs.net {
            created = created
                .add_rule(NetPort::new(rule.port, rule.flags()))
                .map_err(|e| format!("port {}: {e}", rule.port))?;
        }
        if audit {
            // By default the kernel logs only denials of the process that restricted
            // itself, before it execs (none in a sandbox: this process execs the
            // workload next); the workload's denials need LOG_NEW_EXEC_ON (ABI 7, which
            // the supervisor checked before it turned `fs_denied` reporting on).
            created = created.log_new_exec(true).map_err(|e| e.to_string())?;
        }
        let status = created.restrict_self().map_err(|e| e.to_string())?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(format!("ruleset only {:?}", status.ruleset));
        }
        // The probe needs a TCP port Landlock refuses; a ruleset without TCP rights
        // (transparent egress, docs/egress.md) cannot make one, and this process's Landlock
        // denials go unclaimed (no `fs_denied` records for it).
        if !audit || rs.handled_net.is_empty() {
            return Ok(None);
        }
        let port = probe_port(rs);
        match std::net::TcpStream::connect((agent_sandbox_audit::kernel::PROBE_ADDR, port)) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(Some(port)),
            other => Err(format!(
                "the TCP connect probe to port {port} was not refused by Landlock ({other:?})"
            )),
        }
    }
}

/// The port of the Landlock probe: the lowest one the ruleset grants no connect to.
fn probe_port(rs: &agent_sandbox_policy::landlock::LandlockRuleset) -> u16 {
    (1..=u16::MAX)
        .find(|p| !rs.net.iter().any(|r| r.port == *p))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Landlock before ABI 3 does not handle truncate(2): the right is missing, and only the
    /// layers the plan names (read-only mounts, AppArmor) stop it. Proven on this kernel by
    /// applying the real ruleset code at ABI 2, then at the kernel's own ABI.
    #[test]
    fn an_abi_2_ruleset_lets_truncate_through_where_the_kernels_own_abi_refuses_it() {
        use agent_sandbox_policy::landlock::{
            CoverFacts, FsAccess, LandlockRuleset, PathRule, at_abi,
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("victim");
        let full = LandlockRuleset {
            min_abi: 5,
            handled_fs: FsAccess::ALL.into_iter().collect(),
            handled_net: Default::default(),
            paths: vec![PathRule {
                path: "/".to_owned(),
                access: [FsAccess::Execute, FsAccess::ReadFile, FsAccess::ReadDir]
                    .into_iter()
                    .collect(),
            }],
            net: Vec::new(),
        };
        // Landlock restricts the calling thread only: each attempt runs on a thread of its own.
        let attempt = |abi: u32| {
            std::fs::write(&file, b"data").unwrap();
            let rules = LandlockRules(at_abi(&full, abi, &CoverFacts::default()).ruleset);
            let f = file.clone();
            std::thread::spawn(move || {
                rules.apply(false).unwrap();
                let write = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .err()
                    .and_then(|e| e.raw_os_error());
                (nix::unistd::truncate(&f, 0), write)
            })
            .join()
            .unwrap()
        };
        let (truncate, write) = attempt(2);
        assert_eq!(write, Some(libc::EACCES), "ABI 2 still refuses writes");
        assert_eq!(
            truncate,
            Ok(()),
            "ABI 2 has no truncate right: the gap is real"
        );
        let kernel = agent_sandbox_sys::landlock_abi().unwrap();
        assert!(
            kernel >= 3,
            "this test needs a kernel with Landlock ABI 3 (has {kernel})"
        );
        let (truncate, write) = attempt(kernel);
        assert_eq!(write, Some(libc::EACCES));
        assert_eq!(
            truncate,
            Err(nix::errno::Errno::EACCES),
            "ABI {kernel} refuses it"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
    }
}
