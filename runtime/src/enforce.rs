//! The runtime side of enforcement: facts only the runtime knows (the id range
//! it allocated, where it mounted the rootfs), and a last check of the
//! invariants every sandbox must satisfy, whatever produced the spec.
//!
//! The policy crate decides what a sandbox allows; this module refuses to start
//! a container whose spec does not carry the non-negotiable parts.

use std::path::Path;

use libcontainer::oci_spec::runtime::{
    LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, Spec,
};

use crate::idmap::IdRange;

/// Why a spec cannot be turned into a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("config.json has no {what} section")]
    Missing { what: &'static str },
    #[error("cannot build the {what} of the sandbox spec")]
    Build {
        what: &'static str,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error("hardened spec violates the sandbox invariant: {invariant}")]
    Invariant { invariant: &'static str },
}

/// Namespaces every sandbox gets fresh (no `path`): user, mount, pid, ipc,
/// uts, network, cgroup.
const FRESH: [LinuxNamespaceType; 7] = [
    LinuxNamespaceType::User,
    LinuxNamespaceType::Mount,
    LinuxNamespaceType::Pid,
    LinuxNamespaceType::Ipc,
    LinuxNamespaceType::Uts,
    LinuxNamespaceType::Network,
    LinuxNamespaceType::Cgroup,
];

/// Writes the runtime's facts into the spec: the user namespace mapping onto
/// `range`, fresh namespaces (the sandbox never joins a host or pod network
/// namespace), and the reachable, read-only rootfs mount.
pub fn apply_runtime_facts(
    spec: &mut Spec,
    range: IdRange,
    rootfs: &Path,
) -> Result<(), EnforceError> {
    let linux = spec
        .linux_mut()
        .as_mut()
        .ok_or(EnforceError::Missing { what: "linux" })?;
    let map = LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(range.host_start)
        .size(range.size)
        .build()
        .map_err(|source| EnforceError::Build {
            what: "id mapping",
            source,
        })?;
    linux.set_uid_mappings(Some(vec![map]));
    linux.set_gid_mappings(Some(vec![map]));
    let namespaces = FRESH
        .iter()
        .map(|typ| LinuxNamespaceBuilder::default().typ(*typ).build())
        .collect::<Result<Vec<LinuxNamespace>, _>>()
        .map_err(|source| EnforceError::Build {
            what: "namespaces",
            source,
        })?;
    linux.set_namespaces(Some(namespaces));
    let root = spec
        .root_mut()
        .as_mut()
        .ok_or(EnforceError::Missing { what: "root" })?;
    root.set_path(rootfs.to_owned());
    root.set_readonly(Some(true));
    Ok(())
}

/// Refuses specs that lack a non-negotiable protection.
pub fn verify(spec: &Spec) -> Result<(), EnforceError> {
    let linux = spec
        .linux()
        .as_ref()
        .ok_or(EnforceError::Missing { what: "linux" })?;
    let nss = linux.namespaces().clone().unwrap_or_default();
    for typ in [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Mount,
    ] {
        if !nss.iter().any(|n| n.typ() == typ && n.path().is_none()) {
            return Err(EnforceError::Invariant {
                invariant: "fresh user, mount and network namespaces",
            });
        }
    }
    let maps = linux.uid_mappings().clone().unwrap_or_default();
    if maps.is_empty() || maps.iter().any(|m| m.host_id() == 0) {
        return Err(EnforceError::Invariant {
            invariant: "uid mapping exists and never maps host uid 0",
        });
    }
    let gmaps = linux.gid_mappings().clone().unwrap_or_default();
    if gmaps.is_empty() || gmaps.iter().any(|m| m.host_id() == 0) {
        return Err(EnforceError::Invariant {
            invariant: "gid mapping exists and never maps host gid 0",
        });
    }
    if spec.root().as_ref().and_then(|r| r.readonly()) != Some(true) {
        return Err(EnforceError::Invariant {
            invariant: "read-only rootfs",
        });
    }
    let process = spec
        .process()
        .as_ref()
        .ok_or(EnforceError::Missing { what: "process" })?;
    verify_process(process)
}

/// The per-process part of the invariants (also used for exec).
pub fn verify_process(
    process: &libcontainer::oci_spec::runtime::Process,
) -> Result<(), EnforceError> {
    if process.no_new_privileges() != Some(true) {
        return Err(EnforceError::Invariant {
            invariant: "no_new_privileges",
        });
    }
    if let Some(caps) = process.capabilities() {
        let sets = [
            caps.bounding(),
            caps.effective(),
            caps.permitted(),
            caps.inheritable(),
            caps.ambient(),
        ];
        if sets
            .iter()
            .any(|s| s.as_ref().is_some_and(|s| !s.is_empty()))
        {
            return Err(EnforceError::Invariant {
                invariant: "no capabilities in any set",
            });
        }
    }
    Ok(())
}

/// Clamps a process (init or exec) to no capabilities and no_new_privs.
pub fn clamp_process(process: &mut libcontainer::oci_spec::runtime::Process) {
    use libcontainer::oci_spec::runtime::LinuxCapabilities;
    let empty = std::collections::HashSet::new();
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(empty.clone()));
    caps.set_effective(Some(empty.clone()));
    caps.set_permitted(Some(empty.clone()));
    caps.set_inheritable(Some(empty.clone()));
    caps.set_ambient(Some(empty));
    process.set_capabilities(Some(caps));
    process.set_no_new_privileges(Some(true));
}
