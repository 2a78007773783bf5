//! Whether the sandbox's PID 1 is agent-sandbox's reaping init (`resources.init`,
//! docs/limits.md). The reaper itself is `agent_sandbox_sys::reaper`, started by the
//! executor after every layer is in force.
//!
//! The rule for `auto`: the program is an init itself when the file name of its
//! `process.args[0]` (what it executes; the last `/`-separated part) is one of [`INITS`].
//! Anything else (a shell, `sleep`, an agent's tool) gets the reaper. The name is the
//! caller's claim, not a check of the binary: a program that calls itself `tini` and does
//! not reap only harms its own sandbox, whose pids limit still holds.

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::policy::InitMode;
use libcontainer::oci_spec::runtime::Spec;

/// File names of programs that reap orphans as PID 1: tini (and Docker's `--init`, a tini
/// named docker-init), dumb-init, catatonit (podman's `--init`, mounted as
/// `/run/podman-init`), s6's s6-svscan, runit, systemd or a SysV/busybox `init`, and
/// Kubernetes' `pause` (the pod sandbox's init).
pub const INITS: &[&str] = &[
    "tini",
    "tini-static",
    "docker-init",
    "dumb-init",
    "catatonit",
    "podman-init",
    "s6-svscan",
    "runit",
    "runit-init",
    "systemd",
    "init",
    "pause",
];

/// Whether `program` (a `process.args[0]`) names a known init.
pub fn is_init(program: &str) -> bool {
    let name = program.rsplit('/').next().unwrap_or(program);
    INITS.contains(&name)
}

/// Whether `spec` gives the init a PID namespace of its own (not one it joins, as a pod's
/// container does when the pod shares one: its PID 1 is the pod's).
fn own_pid_namespace(spec: &Spec) -> bool {
    use libcontainer::oci_spec::runtime::LinuxNamespaceType;
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| {
            ns.iter()
                .any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_none())
        })
}

/// Whether the reaper runs as PID 1 of a sandbox whose init is `spec`'s process: never in
/// a PID namespace the init joins, else as `resources.init` says.
pub fn wanted(policy: &SandboxPolicy, spec: &Spec) -> bool {
    if !own_pid_namespace(spec) {
        return false;
    }
    match policy.resources.init {
        InitMode::Always => true,
        InitMode::Never => false,
        InitMode::Auto => {
            let program = spec
                .process()
                .as_ref()
                .and_then(|p| p.args().as_ref())
                .and_then(|a| a.first());
            !program.is_some_and(|p| is_init(p))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libcontainer::oci_spec::runtime::ProcessBuilder;

    fn spec_running(args: &[&str]) -> Spec {
        // The default spec has a new PID namespace.
        let mut spec = Spec::default();
        let process = ProcessBuilder::default()
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .build()
            .unwrap();
        spec.set_process(Some(process));
        spec
    }

    #[test]
    fn recognises_inits_by_file_name_only() {
        for p in [
            "tini",
            "/sbin/tini",
            "/sbin/docker-init",
            "/usr/bin/dumb-init",
            "/run/podman-init",
            "/usr/libexec/podman/catatonit",
            "/lib/systemd/systemd",
            "/sbin/init",
            "/command/s6-svscan",
        ] {
            assert!(is_init(p), "{p}");
        }
        for p in [
            "sh",
            "/bin/sh",
            "sleep",
            "/usr/bin/python3",
            "/init/tool",
            "initial",
            "tini.sh",
            "",
        ] {
            assert!(!is_init(p), "{p}");
        }
    }

    #[test]
    fn the_policy_key_decides_and_auto_looks_at_the_program() {
        let mut policy = SandboxPolicy::default();
        assert_eq!(policy.resources.init, InitMode::Auto);
        assert!(wanted(&policy, &spec_running(&["sh", "-c", "sleep 1"])));
        assert!(!wanted(
            &policy,
            &spec_running(&["/sbin/tini", "--", "sleep", "1"])
        ));
        policy.resources.init = InitMode::Always;
        assert!(wanted(&policy, &spec_running(&["/sbin/tini", "--", "sh"])));
        // A joined PID namespace (a pod's shared one) has its PID 1 already.
        let mut joined = spec_running(&["sh"]);
        let mut linux = joined.linux().clone().unwrap();
        let namespaces = linux
            .namespaces()
            .clone()
            .unwrap()
            .into_iter()
            .map(|mut n| {
                if n.typ() == libcontainer::oci_spec::runtime::LinuxNamespaceType::Pid {
                    n.set_path(Some("/proc/1/ns/pid".into()));
                }
                n
            })
            .collect::<Vec<_>>();
        linux.set_namespaces(Some(namespaces));
        joined.set_linux(Some(linux));
        assert!(!wanted(&policy, &joined));
        policy.resources.init = InitMode::Never;
        assert!(!wanted(&policy, &spec_running(&["sh"])));
    }

    #[test]
    fn the_key_parses_from_toml_and_a_wrong_value_names_it() {
        let p = SandboxPolicy::parse("[resources]\ninit = \"never\"\n", "t.toml").unwrap();
        assert_eq!(p.resources.init, InitMode::Never);
        let err = SandboxPolicy::parse("[resources]\ninit = \"maybe\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources.init"), "{err}");
    }
}
