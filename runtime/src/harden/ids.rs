//! The sandbox's id mapping: container ids from 0 onwards to the host block it was given.

use agent_sandbox_policy::harden::IdMapping;
use libcontainer::oci_spec::runtime::Spec;

use crate::host::idmap::IdRange;

/// The sandbox's one id mapping: container id 0 onwards to its host block.
pub(super) fn id_mapping(ids: &IdRange) -> IdMapping {
    IdMapping {
        container_id: 0,
        host_id: ids.host_start,
        size: ids.size,
    }
}

/// The host ids of the spec's process user and group (container root's if unmapped).
pub(super) fn process_host_ids(spec: &Spec, map: &IdMapping) -> (u32, u32) {
    let host = |id: u32| {
        if id < map.size {
            map.host_id + id
        } else {
            map.host_id
        }
    };
    spec.process()
        .as_ref()
        .map(|p| (host(p.user().uid()), host(p.user().gid())))
        .unwrap_or((map.host_id, map.host_id))
}
