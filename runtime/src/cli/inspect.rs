//! The commands that report on containers or on the runtime: `state`, `ps`, `list`,
//! `features`, and `spec` (runc's template of a bundle's config).

use std::path::Path;

use crate::state::ContainerId;

use super::{Cli, CliError};

/// `state`: a container's state as JSON.
pub(super) fn state(cli: &Cli, id: &str) -> Result<(), CliError> {
    let state = cli.runtime()?.state(&ContainerId::try_from(id)?)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&state).unwrap_or_default()
    );
    Ok(())
}

/// `ps`: a container's processes, as a table or (`--format json`) a JSON array of pids.
pub(super) fn ps(cli: &Cli, id: &str, format: &str) -> Result<(), CliError> {
    let pids = cli.runtime()?.pids(&ContainerId::try_from(id)?)?;
    if format == "json" {
        println!("{}", serde_json::to_string(&pids).unwrap_or_default());
    } else {
        println!("PID");
        for p in pids {
            println!("{p}");
        }
    }
    Ok(())
}

/// `list`: the containers under the state root, as a table or (`--format json`) their states.
pub(super) fn list(cli: &Cli, format: &str) -> Result<(), CliError> {
    let runtime = cli.runtime()?;
    let ids = runtime.list();
    if format == "json" {
        let states: Vec<serde_json::Value> = ids
            .iter()
            .filter_map(|i| ContainerId::try_from(i.as_str()).ok())
            .filter_map(|i| runtime.state(&i).ok())
            .collect();
        println!("{}", serde_json::Value::Array(states));
    } else {
        println!("ID");
        for i in ids {
            println!("{i}");
        }
    }
    Ok(())
}

/// `features`: what the runtime supports, as JSON.
pub(super) fn features() {
    println!("{}", features_json());
}

/// `spec`: a default `config.json` in the bundle.
pub(super) fn spec(bundle: &Path) -> Result<(), CliError> {
    let path = bundle.join("config.json");
    let spec = libcontainer::oci_spec::runtime::Spec::default();
    let text = serde_json::to_string_pretty(&spec).unwrap_or_default();
    crate::files::write(&path, text)?;
    Ok(())
}

fn features_json() -> String {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.0.2",
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": ["ro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "private", "rprivate"],
        "linux": {
            "namespaces": ["user", "mount", "pid", "ipc", "uts", "network", "cgroup"],
            "capabilities": [],
            "cgroup": crate::host::cgroups::features(&crate::host::cgroups::RealHost),
            "seccomp": {"enabled": true, "actions": [], "operators": [], "archs": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]},
            "apparmor": {"enabled": crate::host::apparmor::host() != agent_sandbox_policy::layers::AppArmorHost::Absent},
            "selinux": {"enabled": false}
        },
        "annotations": {
            "io.agent.sandbox.enforced": "userns,readonly-rootfs,no-caps,no-new-privs,netns,seccomp,landlock,cgroups"
        }
    })
    .to_string()
}
