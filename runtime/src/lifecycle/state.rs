//! `state`, `list` and `layers`: what a caller (or the user) reads about a sandbox.

use super::{LookupError, Runtime, status_name};
use crate::state::ContainerId;

/// Errors of `state` and `layers`.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("layers record")]
    Layers(#[source] crate::report::layers::LayersError),
}

type Result<T> = std::result::Result<T, StateError>;

impl Runtime {
    /// `state`: runc's JSON.
    pub fn state(&self, id: &ContainerId) -> Result<serde_json::Value> {
        let c = self.load(id)?;
        let record = self.record(id).ok();
        let status = status_name(c.status());
        let pid = if status == "stopped" {
            0
        } else {
            c.pid().map(|p| p.as_raw()).unwrap_or(0)
        };
        let bundle = record
            .as_ref()
            .map(|r| r.bundle.clone())
            .unwrap_or_else(|| c.bundle().clone());
        let mut annotations = c.state.annotations.clone().unwrap_or_default();
        if let Some(r) = &record {
            annotations.insert("io.agent.sandbox.active-profile".into(), r.profile.clone());
        }
        Ok(serde_json::json!({
            "ociVersion": crate::enforce::hooks::OCI_VERSION,
            "id": id.as_str(),
            "pid": pid,
            "status": status,
            "bundle": bundle,
            "rootfs": record.as_ref().map(|r| r.rootfs_mount.clone()),
            "created": c.created().map(|t| t.to_rfc3339()),
            "owner": "",
            "annotations": annotations,
        }))
    }

    /// `layers`: the protections in force for a sandbox (see [`crate::report::layers`]).
    pub fn layers(&self, id: &ContainerId) -> Result<serde_json::Value> {
        let c = self.load(id)?;
        let pid = c.pid().map(|p| p.as_raw());
        crate::report::layers::report(&self.dirs, id, status_name(c.status()), pid)
            .map_err(StateError::Layers)
    }

    /// Ids of all containers in this state root.
    pub fn list(&self) -> Vec<String> {
        std::fs::read_dir(self.dirs.containers())
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}
