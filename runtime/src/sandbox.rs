//! The bridge between a container and its policy: which profile applies, the
//! spec hardening, the in-process layers (seccomp, Landlock) handed to the
//! executor, and the checks that the cgroup limits took.

use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{Process, Spec};

use crate::executor::SandboxExecutor;
use crate::id::ContainerId;
use crate::lifecycle::{LifecycleError, SandboxRecord};
use crate::mounts;
use crate::paths::{self, StateDirs};

/// Annotation that selects the profile.
pub const PROFILE_ANNOTATION: &str = "io.agent.sandbox.profile";
/// The profile used when nothing selects one.
pub const DEFAULT_PROFILE: &str = "agent";

/// The policy resolved for one container.
pub struct Resolved {
    pub name: String,
}

impl Resolved {
    /// Picks the profile: the admin override (`--policy` / `AGENT_SANDBOX_POLICY`)
    /// wins, then the annotation, then `agent`.
    pub fn resolve(admin: Option<&Path>, spec: Option<&Spec>) -> Result<Self, LifecycleError> {
        let name = if let Some(path) = admin {
            path.display().to_string()
        } else {
            spec.and_then(|s| s.annotations().as_ref())
                .and_then(|a| a.get(PROFILE_ANNOTATION).cloned())
                .unwrap_or_else(|| DEFAULT_PROFILE.to_owned())
        };
        Ok(Self { name })
    }

    /// Hardens `spec` for the sandbox described by `record`.
    pub fn harden(&self, spec: &mut Spec, _record: &SandboxRecord) -> Result<(), LifecycleError> {
        if let Some(process) = spec.process_mut().as_mut() {
            crate::enforce::clamp_process(process);
        }
        // A sandbox never sees the host's cgroup tree.
        if let Some(mounts) = spec.mounts_mut().as_mut() {
            mounts.retain(|m| m.typ().as_deref() != Some("cgroup"));
        }
        Ok(())
    }

    /// Clamps an exec'd process to the policy.
    pub fn clamp_exec(&self, process: &mut Process) {
        crate::enforce::clamp_process(process);
    }

    /// The executor carrying this policy's seccomp filter and Landlock rules.
    pub fn executor(&self) -> Result<SandboxExecutor, LifecycleError> {
        Ok(SandboxExecutor::default())
    }
}

/// Where the reachable mounts of a sandbox live. As real root: inside the
/// state root (`/run/agent-sandbox/sandbox/<id>/mnt`, ancestors 0711). Inside a
/// rootless user namespace the state root (`$XDG_RUNTIME_DIR`) is 0700 and
/// unreachable for the sandbox's root, so `/tmp/agent-sandbox-<host uid>/<id>`.
pub fn mount_dir(dirs: &StateDirs, id: &ContainerId) -> Result<PathBuf, LifecycleError> {
    if paths::rootless()? {
        let host_uid = host_uid_of_self().unwrap_or_else(|| nix::unistd::geteuid().as_raw());
        let base = PathBuf::from(format!("/tmp/agent-sandbox-{host_uid}"));
        mounts::mkdir_traversable(&base)?;
        Ok(base.join(id.as_str()))
    } else {
        for d in [dirs.root.clone(), dirs.root.join("sandbox")] {
            mounts::mkdir_traversable(&d)?;
        }
        Ok(dirs.sandbox(id).join("mnt"))
    }
}

/// The host uid that our uid 0 maps to, read from `/proc/self/uid_map`.
fn host_uid_of_self() -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let me = nix::unistd::geteuid().as_raw();
    map.lines().find_map(|l| {
        let f: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        (f.len() == 3 && me >= f[0] && me - f[0] < f[2]).then(|| f[1] + (me - f[0]))
    })
}

/// In a rootless user namespace on cgroup v1 only a delegated cgroup is
/// writable: put the sandbox under the runtime's own memory cgroup.
pub fn rootless_cgroups(spec: &mut Spec, id: &ContainerId) -> Result<(), LifecycleError> {
    let current = current_v1_cgroup("memory").ok_or(LifecycleError::Cgroup {
        detail: "cannot find the runtime's memory cgroup in /proc/self/cgroup".into(),
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(current.trim_start_matches('/'));
    if nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_err() {
        return Err(LifecycleError::Cgroup {
            detail: format!(
                "cgroup {} is not writable: delegate a v1 cgroup to this user (hack/setup.sh does) so limits can be enforced",
                dir.display()
            ),
        });
    }
    if let Some(linux) = spec.linux_mut().as_mut() {
        linux.set_cgroups_path(Some(
            PathBuf::from(&current).join(format!("agent-sandbox-{id}")),
        ));
    }
    Ok(())
}

fn current_v1_cgroup(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _n = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_owned())
    })
}

/// Reads the v1 limits back and compares them with the spec.
pub fn verify_cgroups(spec: &Spec, id: &ContainerId) -> Result<(), String> {
    let Some(linux) = spec.linux().as_ref() else {
        return Ok(());
    };
    let Some(res) = linux.resources().as_ref() else {
        return Ok(());
    };
    let rel = libcontainer::utils::get_cgroup_path(linux.cgroups_path(), id.as_str());
    let rel = rel.to_string_lossy().trim_start_matches('/').to_owned();
    let check = |ctrl: &str, file: &str, want: i64| -> Result<(), String> {
        let path = Path::new("/sys/fs/cgroup").join(ctrl).join(&rel).join(file);
        let got = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let got: i64 = got
            .trim()
            .parse()
            .map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
        if got != want {
            return Err(format!("{} is {got}, wanted {want}", path.display()));
        }
        Ok(())
    };
    if let Some(mem) = res.memory().as_ref()
        && let Some(limit) = mem.limit()
        && limit > 0
    {
        // The kernel rounds to pages.
        let page = 4096;
        check("memory", "memory.limit_in_bytes", limit / page * page)?;
    }
    if let Some(pids) = res.pids().as_ref()
        && pids.limit() > 0
    {
        let path = Path::new("/sys/fs/cgroup/pids").join(&rel).join("pids.max");
        let got = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if got.trim() != pids.limit().to_string() {
            return Err(format!(
                "{} is {}, wanted {}",
                path.display(),
                got.trim(),
                pids.limit()
            ));
        }
    }
    if let Some(cpu) = res.cpu().as_ref() {
        if let Some(q) = cpu.quota()
            && q > 0
        {
            check("cpu", "cpu.cfs_quota_us", q)?;
        }
        if let Some(s) = cpu.shares()
            && s > 0
        {
            check("cpu", "cpu.shares", i64::try_from(s).unwrap_or(i64::MAX))?;
        }
    }
    Ok(())
}
