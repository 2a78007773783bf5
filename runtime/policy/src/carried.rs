//! What a checkpoint image carries of its sandbox's policy, so that a restore (in place or a
//! fork) may not change it (docs/checkpoint.md#fork).
//!
//! A restore compiles its plan from the restoring sandbox's own policy, and most of it is
//! applied again from that plan: the egress proxy's allowlist and credentials, the cgroup
//! limits, the wall clock, the change store's caps. Some of it is not: CRIU gives the restored
//! tasks the mount tree, the seccomp filters, the credentials and the process tree the image
//! recorded, whatever the restoring plan says. A restoring policy that changes one of those
//! keys would leave a plan (and `layers`) claiming what the tasks do not have, so
//! [`changed_carried_key`] names it and the restore is refused.

use crate::SandboxPolicy;

/// A key of the policy whose effect is in the image's kernel state, and what carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarriedKey {
    /// The key, as the policy file spells it.
    pub key: &'static str,
    /// What of the restored tasks holds its effect, as the image recorded it.
    pub carried_by: &'static str,
}

const MOUNTS: &str = "the restored mount tree";
const SECCOMP: &str = "the restored tasks' seccomp filters";
const IDS: &str = "the restored user namespace's id maps";
const CREDS: &str = "the restored tasks' credentials";

/// The first key (in policy-file order) whose value differs between the policy the image's
/// sandbox ran under (`image`) and the restoring sandbox's (`restoring`) and whose effect
/// the image carries; `None` when the restoring policy changes only keys a restore applies
/// again. Whether an `https` credential exists is carried (the CA's mounts), which
/// credentials they are is not.
pub fn changed_carried_key(image: &SandboxPolicy, restoring: &SandboxPolicy) -> Option<CarriedKey> {
    // Each key compared by the field it names, so a key's name cannot drift from its field.
    macro_rules! same {
        ($first:ident $(. $rest:ident)* => $carried_by:expr) => {
            (
                image.$first$(.$rest)* == restoring.$first$(.$rest)*,
                concat!(stringify!($first) $(, ".", stringify!($rest))*),
                $carried_by,
            )
        };
    }
    let checks = [
        same!(filesystem.readonly_rootfs => MOUNTS),
        same!(filesystem.scratch => MOUNTS),
        same!(filesystem.workspace => MOUNTS),
        same!(filesystem.protected => MOUNTS),
        same!(filesystem.masked_paths => MOUNTS),
        same!(filesystem.readonly_paths => MOUNTS),
        same!(identity.user_namespace => IDS),
        same!(identity.id_range => IDS),
        same!(privileges.no_new_privs => CREDS),
        same!(privileges.capabilities => CREDS),
        same!(syscalls => SECCOMP),
        same!(resources.init => "the restored process tree (its PID 1)"),
        (
            image.network.terminates_tls() == restoring.network.terminates_tls(),
            "network.credentials",
            "the restored mount tree (the sandbox CA's mounts exist only with an https \
             credential)",
        ),
    ];
    checks
        .into_iter()
        .find(|(same, _, _)| !same)
        .map(|(_, key, carried_by)| CarriedKey { key, carried_by })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> SandboxPolicy {
        SandboxPolicy::builtin("agent").unwrap()
    }

    fn parse(extra: &str) -> SandboxPolicy {
        let text = crate::policy::builtin_text("agent").unwrap();
        SandboxPolicy::parse(&format!("{text}\n{extra}"), "fork.toml").unwrap()
    }

    #[test]
    fn keys_a_restore_applies_again_may_change() {
        let mut fork = agent();
        fork.network.allow.truncate(1);
        fork.network.deny = fork.network.allow.clone();
        fork.resources.memory = crate::value::ByteSize::from_trusted(256 << 20);
        fork.resources.pids = 64;
        fork.resources.wall_clock = crate::value::Seconds::from_trusted(60);
        fork.filesystem.workspace_size = None;
        fork.ucounts.inotify_instances = 1;
        fork.description = "claimed".to_owned();
        assert_eq!(changed_carried_key(&agent(), &fork), None);
        assert_eq!(changed_carried_key(&agent(), &agent()), None);
    }

    #[test]
    fn a_changed_syscall_table_is_named() {
        let fork = parse("[syscalls]\ndeny = [\"personality\"]\n");
        let got = changed_carried_key(&agent(), &fork).unwrap();
        assert_eq!(got.key, "syscalls");
        assert_eq!(got.carried_by, SECCOMP);
    }

    #[test]
    fn a_changed_mount_key_is_named_first_in_file_order() {
        let mut fork = agent();
        fork.filesystem.masked_paths = vec![crate::value::AbsPath::from_trusted("/proc/cpuinfo")];
        fork.privileges.capabilities.clear();
        fork.syscalls.deny = parse("[syscalls]\ndeny = [\"personality\"]\n")
            .syscalls
            .deny;
        let got = changed_carried_key(&agent(), &fork).unwrap();
        assert_eq!(got.key, "filesystem.masked_paths");
        assert_eq!(got.carried_by, MOUNTS);
        let mut fork = agent();
        fork.filesystem.scratch.pop();
        assert_eq!(
            changed_carried_key(&agent(), &fork).map(|k| k.key),
            Some("filesystem.scratch")
        );
    }

    /// Another secret, header or domain for an `https` credential is applied again (the
    /// proxy); an `https` credential where the image had none, or none where it had one, is
    /// not (the CA's mounts are in the image).
    #[test]
    fn only_whether_tls_is_terminated_is_carried_of_the_credentials() {
        let cred = |file: &str, header: &str| {
            parse(&format!(
                "[[network.credentials]]\ndomain = \"pypi.org:443\"\nheader = \"{header}\"\n\
                 file = \"{file}\"\nhttps = true\n"
            ))
        };
        let parent = cred("/etc/a", "Authorization");
        assert_eq!(
            changed_carried_key(&parent, &cred("/etc/b", "X-Api-Key")),
            None
        );
        assert_eq!(
            changed_carried_key(&agent(), &parent).map(|k| k.key),
            Some("network.credentials")
        );
        assert_eq!(
            changed_carried_key(&parent, &agent()).map(|k| k.key),
            Some("network.credentials")
        );
    }
}
