//! The policy's Landlock ruleset as the executor applies it in the container process, and the
//! connect probe that names the process's Landlock domain to the seccomp supervisor.

use super::executor::LandlockApply;

/// The policy's Landlock ruleset, applied inside the container.
pub(super) struct LandlockRules(pub(super) agent_sandbox_policy::landlock::LandlockRuleset);

impl LandlockApply for LandlockRules {
    fn apply(&self, audit: bool) -> Result<Option<u16>, String> {
        use agent_sandbox_sys::landlock_ruleset::{RESTRICT_SELF_LOG_NEW_EXEC_ON, RawRuleset};
        use std::os::unix::fs::OpenOptionsExt as _;
        let rs = &self.0;
        // The rights are those of the kernel's ABI (`at_abi`): every one is enforced, or the
        // kernel refuses the ruleset (EINVAL) and the create fails.
        let ruleset = RawRuleset::create(rs.handled_fs_bits(), rs.handled_net_bits())
            .map_err(|e| format!("landlock_create_ruleset: {e}"))?;
        for rule in &rs.paths {
            // A path missing in this container gets no rights, which is narrower.
            let Ok(parent) = std::fs::File::options()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(&rule.path)
            else {
                continue;
            };
            ruleset
                .add_path(&parent, rule.bits())
                .map_err(|e| format!("{}: {e}", rule.path))?;
        }
        for rule in &rs.net {
            ruleset
                .add_port(rule.port, rule.bits())
                .map_err(|e| format!("port {}: {e}", rule.port))?;
        }
        // By default the kernel logs only denials of the process that restricted itself,
        // before it execs (none in a sandbox: this process execs the workload next); the
        // workload's denials need LOG_NEW_EXEC_ON (ABI 7, which the supervisor checked before
        // it turned `fs_denied` reporting on).
        let flags = if audit {
            RESTRICT_SELF_LOG_NEW_EXEC_ON
        } else {
            0
        };
        ruleset
            .restrict_self(flags)
            .map_err(|e| format!("landlock_restrict_self: {e}"))?;
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
