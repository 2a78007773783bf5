//! The runtime side of enforcement: facts only the runtime knows (the id range
//! it allocated, where it mounted the rootfs), and a last check of the
//! invariants every sandbox must satisfy, whatever produced the spec.
//!
//! The policy crate decides what a sandbox allows; this module refuses to start
//! a container whose spec does not carry the non-negotiable parts.
//!
//! Beneath it, what enforces while the container is made and runs: the executor libcontainer
//! calls in the container's processes (`executor`, with the Landlock ruleset in `landlock`),
//! the runtime's host mounts (`mounts`), OCI hooks with runc's state (`hooks`), `start`'s wait
//! for the program (`init_exec`), and whether PID 1 is the reaping init (`reaper`).

use std::path::Path;

use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::host::idmap::{self, IdKind};

pub mod executor;
pub mod home_guards;
pub mod hooks;
pub mod init_exec;
mod landlock;
pub mod mounts;
pub mod reaper;
pub mod restored;

/// Why a spec cannot be turned into a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("config.json has no {what} section")]
    Missing { what: &'static str },
    #[error("cannot open the container's user namespace {path}")]
    OpenNs {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("hardened spec violates the sandbox invariant: {invariant}")]
    Invariant { invariant: &'static str },
}

/// Points the spec at the reachable, read-only rootfs mount the runtime made.
pub fn apply_runtime_facts(spec: &mut Spec, rootfs: &Path) -> Result<(), EnforceError> {
    let root = spec
        .root_mut()
        .as_mut()
        .ok_or(EnforceError::Missing { what: "root" })?;
    root.set_path(rootfs.to_owned());
    root.set_readonly(Some(true));
    if let Some(linux) = spec.linux_mut().as_mut()
        && let Some(mode) = linux.rootfs_propagation().clone()
    {
        linux.set_rootfs_propagation(Some(backend_propagation(&mode)?.to_owned()));
    }
    Ok(())
}

/// libcontainer 0.7 spells `linux.rootfsPropagation` without runc's `r` forms and always
/// applies its mode to `/` with `MS_REC` (so `slave` is runc's `rslave`); it refuses the `r`
/// forms. `unbindable` makes `/` itself unbindable after the pivot, its submounts stay
/// slaves. `shared` never arrives here: hardening narrows it to `rslave`.
fn backend_propagation(mode: &str) -> Result<&'static str, EnforceError> {
    match mode {
        "slave" | "rslave" => Ok("slave"),
        "private" | "rprivate" => Ok("private"),
        "unbindable" | "runbindable" => Ok("unbindable"),
        _ => Err(EnforceError::Invariant {
            invariant: "linux.rootfsPropagation is never shared",
        }),
    }
}

/// Refuses specs that lack a non-negotiable protection.
pub fn verify(spec: &Spec) -> Result<(), EnforceError> {
    let linux = spec
        .linux()
        .as_ref()
        .ok_or(EnforceError::Missing { what: "linux" })?;
    let nss = linux.namespaces().clone().unwrap_or_default();
    // Fresh pid and ipc namespaces too: rootless, the sandbox's root is the invoking user,
    // who may signal, trace and share memory with every process of that user it can name.
    for typ in [
        LinuxNamespaceType::User,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
    ] {
        if !nss.iter().any(|n| n.typ() == typ && n.path().is_none()) {
            return Err(EnforceError::Invariant {
                invariant: "fresh user, mount, pid, ipc and network namespaces",
            });
        }
    }
    let maps = linux.uid_mappings().clone().unwrap_or_default();
    if maps.is_empty() || maps_host_id_0(&maps, IdKind::Uid) {
        return Err(EnforceError::Invariant {
            invariant: "uid mapping exists and never maps host uid 0",
        });
    }
    let gmaps = linux.gid_mappings().clone().unwrap_or_default();
    if gmaps.is_empty() || maps_host_id_0(&gmaps, IdKind::Gid) {
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

/// Whether `maps` give the sandbox host id 0, judged in the initial user namespace: a spec's
/// host ids are ids of the runtime's own namespace, whose 0 is the invoking user when the
/// runtime is rootless (`crate::host::idmap`). An unreadable own map counts as host root.
fn maps_host_id_0(maps: &[libcontainer::oci_spec::runtime::LinuxIdMapping], kind: IdKind) -> bool {
    let ranges: Vec<(u32, u32)> = maps.iter().map(|m| (m.host_id(), m.size())).collect();
    idmap::own_map(kind).map_or(true, |own| idmap::maps_host_id_0(&ranges, &own))
}

/// [`verify`] for a sandbox whose user namespace the runtime made itself and pinned at `pin`
/// (`crate::host::userns`): the spec must join exactly that namespace, and every other
/// invariant holds as for a fresh one.
pub fn verify_in_userns(spec: &Spec, pin: &std::path::Path) -> Result<(), EnforceError> {
    let mut checked = spec.clone();
    let linux = checked
        .linux_mut()
        .as_mut()
        .ok_or(EnforceError::Missing { what: "linux" })?;
    let mut list = linux.namespaces().clone().unwrap_or_default();
    for n in &mut list {
        if n.typ() == LinuxNamespaceType::User {
            if n.path().as_deref() != Some(pin) {
                return Err(EnforceError::Invariant {
                    invariant: "the user namespace is the one the runtime made for the sandbox",
                });
            }
            n.set_path(None);
        }
    }
    linux.set_namespaces(Some(list));
    verify(&checked)
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

/// Rewrites a verified exec process for libcontainer's tenant path, which does
/// not join the user namespace: the process starts as host root holding only
/// CAP_SYS_ADMIN and CAP_SETGID, and the executor's [`JoinUserns`](executor::JoinUserns)
/// step joins the container's user namespace, takes the requested ids and drops every
/// capability before anything of the workload runs.
pub fn tenant_join_userns(
    mut process: libcontainer::oci_spec::runtime::Process,
    init_pid: i32,
) -> Result<
    (
        libcontainer::oci_spec::runtime::Process,
        crate::enforce::executor::JoinUserns,
    ),
    EnforceError,
> {
    use libcontainer::oci_spec::runtime::{Capability, LinuxCapabilities};
    let path = std::path::PathBuf::from(format!("/proc/{init_pid}/ns/user"));
    let ns = std::fs::File::open(&path).map_err(|source| EnforceError::OpenNs { path, source })?;
    let user = process.user().clone();
    let join = crate::enforce::executor::JoinUserns {
        ns: ns.into(),
        uid: user.uid(),
        gid: user.gid(),
        additional_gids: user.additional_gids().clone().unwrap_or_default(),
    };
    let mut host_user = user;
    host_user.set_uid(0);
    host_user.set_gid(0);
    host_user.set_additional_gids(None);
    process.set_user(host_user);
    let keep: std::collections::HashSet<Capability> = [Capability::SysAdmin, Capability::Setgid]
        .into_iter()
        .collect();
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(keep.clone()));
    caps.set_effective(Some(keep.clone()));
    caps.set_permitted(Some(keep));
    caps.set_inheritable(Some(Default::default()));
    caps.set_ambient(Some(Default::default()));
    process.set_capabilities(Some(caps));
    process.set_no_new_privileges(Some(true));
    Ok((process, join))
}

#[cfg(test)]
mod tests {
    use super::backend_propagation;

    #[test]
    fn the_user_namespace_must_be_exactly_the_runtimes_pin() {
        use super::{EnforceError, verify_in_userns};
        use libcontainer::oci_spec::runtime::{LinuxNamespaceBuilder, LinuxNamespaceType, Spec};
        let pin = std::path::Path::new("/run/agent-sandbox/mnt/t/c1/userns");
        let with_user = |path: Option<&str>| {
            let mut spec = Spec::default();
            let mut linux = spec.linux().clone().unwrap();
            let mut nss: Vec<_> = [
                LinuxNamespaceType::Network,
                LinuxNamespaceType::Mount,
                LinuxNamespaceType::Pid,
                LinuxNamespaceType::Ipc,
            ]
            .into_iter()
            .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build().unwrap())
            .collect();
            let mut user = LinuxNamespaceBuilder::default().typ(LinuxNamespaceType::User);
            if let Some(p) = path {
                user = user.path(p);
            }
            nss.push(user.build().unwrap());
            linux.set_namespaces(Some(nss));
            spec.set_linux(Some(linux));
            spec
        };
        let invariant = |r: Result<(), EnforceError>| match r {
            Err(EnforceError::Invariant { invariant }) => invariant,
            other => panic!("{other:?}"),
        };
        // The pin: the namespace part passes (the default spec then lacks mappings).
        assert_eq!(
            invariant(verify_in_userns(
                &with_user(Some(pin.to_str().unwrap())),
                pin
            )),
            "uid mapping exists and never maps host uid 0"
        );
        for other in [Some("/proc/1/ns/user"), None] {
            assert_eq!(
                invariant(verify_in_userns(&with_user(other), pin)),
                "the user namespace is the one the runtime made for the sandbox"
            );
        }
        // The host's pid namespace is refused (rootless, the sandbox's uid is the user's).
        let mut shared = with_user(Some(pin.to_str().unwrap()));
        let mut linux = shared.linux().clone().unwrap();
        let mut nss = linux.namespaces().clone().unwrap();
        nss.retain(|n| n.typ() != LinuxNamespaceType::Pid);
        linux.set_namespaces(Some(nss));
        shared.set_linux(Some(linux));
        assert_eq!(
            invariant(verify_in_userns(&shared, pin)),
            "fresh user, mount, pid, ipc and network namespaces"
        );
    }

    #[test]
    fn every_non_shared_propagation_reaches_libcontainer_in_its_spelling() {
        for (oci, backend) in [
            ("slave", "slave"),
            ("rslave", "slave"),
            ("private", "private"),
            ("rprivate", "private"),
            ("unbindable", "unbindable"),
            ("runbindable", "unbindable"),
        ] {
            assert_eq!(backend_propagation(oci).unwrap(), backend, "{oci}");
        }
        assert!(backend_propagation("shared").is_err());
        assert!(backend_propagation("rshared").is_err());
    }
}
