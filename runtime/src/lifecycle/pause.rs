//! `pause` and `resume`.

use super::{Result, Runtime, container_err};
use crate::state::ContainerId;

impl Runtime {
    /// `pause` (`freeze = true`) and `resume`.
    pub fn pause(&self, id: &ContainerId, freeze: bool) -> Result<()> {
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        let (op, result) = if freeze {
            ("pause", c.pause())
        } else {
            ("resume", c.resume())
        };
        result.map_err(container_err(op))
    }
}
