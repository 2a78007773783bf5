//! `pause` and `resume`. A frozen sandbox's wall clock stands still: each freeze is noted in
//! the sandbox's `frozen.json`, which the wall-clock watchdog (another process) reads before
//! it kills, and recorded as `paused` and `resumed` in the audit trail.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{LookupError, Runtime};
use crate::state::{ContainerId, SandboxDir};

/// Errors of `pause` and `resume`.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// libcontainer's freeze or thaw (`op` is `pause` or `resume`).
    #[error("{op} failed")]
    Container {
        op: &'static str,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
}

/// The freezes of one sandbox, on the clock of `/proc/uptime` (seconds since boot).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Frozen {
    /// When the current freeze began; `None` while the sandbox runs.
    since: Option<f64>,
    /// The freezes that ended, in milliseconds.
    total_ms: u64,
}

impl Frozen {
    /// How long the sandbox has stood frozen up to `now`, the current freeze included.
    fn so_far(&self, now: f64) -> Duration {
        let current = self.since.map_or(0.0, |s| (now - s).max(0.0));
        Duration::from_millis(self.total_ms) + Duration::from_secs_f64(current)
    }

    /// A freeze begins at `now` (a second `pause` changes nothing).
    fn begin(&mut self, now: f64) {
        self.since.get_or_insert(now);
    }

    /// The current freeze ends at `now`; returns how long it lasted, in milliseconds.
    fn end(&mut self, now: f64) -> Option<u64> {
        let since = self.since.take()?;
        let ms = ((now - since).max(0.0) * 1000.0).round();
        // At most a u64 of milliseconds: uptimes are far below it.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ms = ms as u64;
        self.total_ms = self.total_ms.saturating_add(ms);
        Some(ms)
    }
}

/// How long the sandbox of `dir` has stood frozen so far. Nothing readable counts as never
/// frozen: the watchdog then kills on time, never later.
pub(crate) fn frozen_so_far(dir: &SandboxDir) -> Duration {
    let Some(now) = crate::enforce::init_exec::uptime() else {
        return Duration::ZERO;
    };
    dir.frozen()
        .read_if_present::<Frozen>()
        .ok()
        .flatten()
        .map_or(Duration::ZERO, |f| f.so_far(now))
}

impl Runtime {
    /// `pause` (`freeze = true`) and `resume`.
    pub fn pause(&self, id: &ContainerId, freeze: bool) -> Result<(), PauseError> {
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        let (op, result) = if freeze {
            ("pause", c.pause())
        } else {
            ("resume", c.resume())
        };
        result.map_err(|source| PauseError::Container {
            op,
            source: Box::new(source),
        })?;
        self.note_freeze(id, freeze);
        Ok(())
    }

    /// Notes a freeze's start or end for the watchdog and records it in the audit trail. The
    /// cgroup is already frozen or thawed: a failure here is logged, not returned.
    fn note_freeze(&self, id: &ContainerId, freeze: bool) {
        let dir = self.dirs.sandbox(id);
        let now = crate::enforce::init_exec::uptime().unwrap_or_default();
        let mut frozen = dir
            .frozen()
            .read_if_present::<Frozen>()
            .ok()
            .flatten()
            .unwrap_or_default();
        let ended = if freeze {
            frozen.begin(now);
            None
        } else {
            frozen.end(now)
        };
        if let Err(e) = dir.frozen().write(&frozen) {
            tracing::warn!(id = %id, error = %e, "cannot note the freeze for the wall clock");
        }
        let recorded = match (freeze, ended) {
            (true, _) => crate::sidecars::trail::paused(&self.dirs, id),
            (false, Some(ms)) => crate::sidecars::trail::resumed(&self.dirs, id, ms),
            // A resume of a sandbox this runtime never saw frozen: nothing to record.
            (false, None) => Ok(()),
        };
        if let Err(e) = recorded {
            tracing::warn!(id = %id, error = %e, "cannot record the freeze in the audit trail");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_counts_while_it_lasts_and_after_it_ended() {
        let mut f = Frozen::default();
        assert_eq!(f.so_far(100.0), Duration::ZERO);
        f.begin(100.0);
        f.begin(105.0); // a second pause keeps the first start
        assert_eq!(f.so_far(110.0), Duration::from_secs(10));
        assert_eq!(f.end(112.5), Some(12_500));
        assert_eq!(f.end(113.0), None, "no freeze to end");
        assert_eq!(f.so_far(200.0), Duration::from_millis(12_500));
        f.begin(300.0);
        assert_eq!(f.so_far(301.0), Duration::from_millis(13_500));
    }

    #[test]
    fn an_unreadable_note_counts_as_never_frozen() {
        let root = tempfile::tempdir().unwrap();
        let id = ContainerId::try_from("frozen-note").unwrap();
        let dir = SandboxDir::new(root.path(), &id);
        std::fs::create_dir_all(dir.path()).unwrap();
        assert_eq!(frozen_so_far(&dir), Duration::ZERO);
        std::fs::write(dir.frozen().path(), "not json").unwrap();
        assert_eq!(frozen_so_far(&dir), Duration::ZERO);
        let f = Frozen {
            since: None,
            total_ms: 2_000,
        };
        dir.frozen().write(&f).unwrap();
        assert_eq!(frozen_so_far(&dir), Duration::from_secs(2));
    }
}
