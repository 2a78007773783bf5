//! Where the runtime keeps its state, and the one owner of every file in it.
//!
//! Layout under the state root `R` ([`paths::state_root`], [`StateDirs`]):
//! - `R/containers/<id>/`: libcontainer's state (`state.json`, its notify socket).
//! - `R/sandbox/<id>/`: ours, one directory per sandbox, owned by [`SandboxDir`]: each file
//!   has one method there, which documents it and the module that reads or writes it.
//! - `R/locks/<id>.lock`: serialises the lifecycle calls on one id ([`lock`]).
//! - `R/idmap.json` + `R/idmap.lock`: host id ranges handed to sandboxes (`idmap`).
//! - `R/audit/`: the default directory of the audit logs; a sandbox's own choice is saved in
//!   its [`SandboxDir::audit_dir`] file.
//!
//! Mount points live outside `R`, under `crate::harden::mount_dir`
//! (`/run/agent-sandbox/mnt/<tag>/<id>`, or `/tmp/agent-sandbox-<uid>/<tag>/<id>` rootless):
//! the reachable `rootfs`, the `workspace` overlay's `upper`/`work` (in the change set's
//! directory when changes are kept, `changes`) and its `workspace-merged` view (with
//! `workspace-lower`, where the idmapped lower layer is attached only while the overlay is
//! mounted), `binds/<n>` for re-bound sources (`mounts`), and `ns/` for a pod sandbox's
//! namespace pins (`pod`).

pub mod id;
pub mod lock;
pub mod paths;
mod sandbox_dir;

pub use id::{ContainerId, IdError};
pub use paths::{PathsError, StateDirs, write_atomic};
pub use sandbox_dir::{JsonFile, SandboxDir};
