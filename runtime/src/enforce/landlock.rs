//! The policy's Landlock ruleset as the executor applies it in the container process, and the
//! connect probe that names the process's Landlock domain to the seccomp supervisor.

use super::executor::LandlockApply;

/// The policy's Landlock ruleset, applied inside the container.
pub(super) struct LandlockRules(pub(super) agent_sandbox_policy::landlock::LandlockRuleset);

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
