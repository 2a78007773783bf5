//! Watching a memory cgroup for OOM kills as they happen, for callers that must learn of a
//! kill before the container's exit is handled (podman's `oom` marker, [`crate::podman_oom`]).
//!
//! - **cgroup v1**: an eventfd registered for `memory.oom_control` by writing
//!   `"<eventfd> <fd of memory.oom_control>"` to `cgroup.event_control` (kernel
//!   `Documentation/admin-guide/cgroup-v1/memory.rst`, "OOM Control"). The kernel signals it
//!   when the cgroup runs out of memory, before the OOM killer picks a victim, and when the
//!   cgroup is removed.
//! - **cgroup v2**: inotify on `memory.events`, whose value changes generate a "file
//!   modified" event (`Documentation/admin-guide/cgroup-v2.rst`, "memory.events"). The kernel
//!   rate-limits these notifications (at most one per 10 ms per file, a later change delayed,
//!   not dropped: `cgroup_file_notify`).
//!
//! Either way a notification is only a reason to look: a kill is counted when the `oom_kill`
//! counter (v1 `memory.oom_control`, v2 `memory.events`; kernel 4.13 and later) rises above
//! what it was when the watch was registered. An OOM that ends without a kill, or the
//! cgroup's removal, is no kill. On v1 the notification precedes the kill, so after one the
//! counter is read again for up to [`KILL_GRACE`]; on v2 the kill's own increment of the
//! counter is notified.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The v1 file that holds the counter and is registered for events.
const V1_CONTROL: &str = "memory.oom_control";
/// The v1 file an event is registered through.
const V1_EVENT_CONTROL: &str = "cgroup.event_control";
/// The v2 file that holds the counter and is watched.
const V2_EVENTS: &str = "memory.events";
/// The counter's key in both files.
const OOM_KILL: &str = "oom_kill";

/// How long the counter is read again after a notification that came before its kill.
pub const KILL_GRACE: Duration = Duration::from_millis(500);
/// How often the counter is read during [`KILL_GRACE`].
const GRACE_STEP: Duration = Duration::from_millis(2);
/// How often, without a notification, the watch checks that the cgroup still exists (v2
/// sends none at removal).
const ALIVE_CHECK: u16 = 1000;

/// Errors of registering or waiting on a watch; each names the cgroup file.
#[derive(Debug, thiserror::Error)]
pub enum OomWatchError {
    #[error(
        "{dir} has no OOM kill counter (`oom_kill` in {V2_EVENTS} or {V1_CONTROL}; kernel 4.13 or later)"
    )]
    NoCounter { dir: PathBuf },
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create an eventfd for {path}")]
    EventFd {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot register an OOM event through {path}")]
    Register {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch {path} with inotify")]
    Inotify {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot wait for OOM events of {dir}")]
    Wait {
        dir: PathBuf,
        #[source]
        source: nix::Error,
    },
}

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The OOM killer ended a process of the cgroup; `kills` is the counter now.
    Killed { kills: u64 },
    /// The cgroup is gone.
    Gone,
}

/// The kernel's notification source.
enum Source {
    /// v1: the eventfd, and the `memory.oom_control` descriptor it is registered with (the
    /// registration lasts while both are open).
    V1 { event: EventFd, _control: File },
    /// v2: inotify on `memory.events`.
    V2 { inotify: Inotify },
}

/// A registered watch on one memory cgroup.
pub struct OomWatch {
    dir: PathBuf,
    counter: PathBuf,
    seen: u64,
    source: Source,
}

impl OomWatch {
    /// Registers the watch on the memory cgroup `dir` (v2 if it has `memory.events`, else
    /// v1), then reads the counter's baseline: a kill after this returns is seen.
    pub fn register(dir: &Path) -> Result<Self, OomWatchError> {
        let events = dir.join(V2_EVENTS);
        let (counter, source) = if events.is_file() {
            let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(
                |source| OomWatchError::Inotify {
                    path: events.clone(),
                    source,
                },
            )?;
            inotify
                .add_watch(&events, AddWatchFlags::IN_MODIFY)
                .map_err(|source| OomWatchError::Inotify {
                    path: events.clone(),
                    source,
                })?;
            (events, Source::V2 { inotify })
        } else {
            let path = dir.join(V1_CONTROL);
            let control = File::open(&path).map_err(|source| OomWatchError::Open {
                path: path.clone(),
                source,
            })?;
            let event =
                EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                    .map_err(|source| OomWatchError::EventFd {
                        path: path.clone(),
                        source,
                    })?;
            let register = dir.join(V1_EVENT_CONTROL);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&register)
                .and_then(|mut f| {
                    f.write_all(format!("{} {}", event.as_raw_fd(), control.as_raw_fd()).as_bytes())
                })
                .map_err(|source| OomWatchError::Register {
                    path: register,
                    source,
                })?;
            (
                path,
                Source::V1 {
                    event,
                    _control: control,
                },
            )
        };
        let seen = read_kills(&counter).ok_or_else(|| OomWatchError::NoCounter {
            dir: dir.to_path_buf(),
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            counter,
            seen,
            source,
        })
    }

    /// The counter when the watch was registered, or at the last kill returned.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Blocks until the OOM killer ends a process of the cgroup, or the cgroup is gone.
    pub fn wait(&mut self) -> Result<Outcome, OomWatchError> {
        loop {
            let notified = self.next_notification()?;
            match read_kills(&self.counter) {
                Some(kills) if kills > self.seen => return Ok(self.killed(kills)),
                // v2 notifies the kill's own change of the counter; its other notifications
                // (every `max` or `high` event under memory pressure) need no second look.
                Some(_) if notified && matches!(self.source, Source::V1 { .. }) => {
                    if let Some(kills) = self.kill_after_notification() {
                        return Ok(self.killed(kills));
                    }
                }
                Some(_) | None => {}
            }
            if !self.dir.is_dir() {
                return Ok(Outcome::Gone);
            }
        }
    }

    fn killed(&mut self, kills: u64) -> Outcome {
        self.seen = kills;
        Outcome::Killed { kills }
    }

    /// Waits up to [`ALIVE_CHECK`] ms for the kernel's notification and consumes it; whether
    /// one came.
    fn next_notification(&self) -> Result<bool, OomWatchError> {
        let fd = match &self.source {
            Source::V1 { event, .. } => event.as_fd(),
            Source::V2 { inotify } => inotify.as_fd(),
        };
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let ready = match poll(&mut fds, PollTimeout::from(ALIVE_CHECK)) {
            Ok(n) => n > 0,
            Err(nix::errno::Errno::EINTR) => false,
            Err(source) => {
                return Err(OomWatchError::Wait {
                    dir: self.dir.clone(),
                    source,
                });
            }
        };
        if ready {
            // Non-blocking: a notification someone else consumed is no error.
            match &self.source {
                Source::V1 { event, .. } => drop(event.read()),
                Source::V2 { inotify } => drop(inotify.read_events()),
            }
        }
        Ok(ready)
    }

    /// After a notification without a new kill: the counter once it rises within
    /// [`KILL_GRACE`] (the v1 notification comes before the kill), if it does.
    fn kill_after_notification(&self) -> Option<u64> {
        let until = Instant::now() + KILL_GRACE;
        while Instant::now() < until {
            std::thread::sleep(GRACE_STEP);
            match read_kills(&self.counter) {
                Some(kills) if kills > self.seen => return Some(kills),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }
}

/// The `oom_kill` counter in the file at `path`, if it can be read and holds one.
fn read_kills(path: &Path) -> Option<u64> {
    flat_key(&std::fs::read_to_string(path).ok()?, OOM_KILL)
}

/// The value of `key` in a cgroup flat-keyed file (one `key value` line per key, the value
/// a decimal number): the first line whose first word is `key` decides, and anything but
/// exactly `key`, one space and ASCII digits that fit a u64 on it gives `None`.
pub fn flat_key(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(' ').next() == Some(key))?;
    let value = line.strip_prefix(key)?.strip_prefix(' ')?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_key_reads_the_kernels_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(flat_key(v1, "oom_kill"), Some(3));
        assert_eq!(flat_key(v1, "under_oom"), Some(0));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(flat_key(v2, "oom_kill"), Some(2));
        assert_eq!(flat_key(v2, "oom"), Some(2));
        // No trailing newline.
        assert_eq!(flat_key("oom_kill 7", "oom_kill"), Some(7));
    }

    #[test]
    fn flat_key_refuses_hostile_or_malformed_lines() {
        for text in [
            "",
            "oom_kill\n",
            "oom_kill \n",
            "oom_kill  4\n",
            "oom_kill 4 5\n",
            "oom_kill +4\n",
            "oom_kill -1\n",
            "oom_kill 4x\n",
            "oom_kill 0x10\n",
            "oom_kill 4\t\n",
            "oom_kill 18446744073709551616\n",
            "oom_kill 99999999999999999999999999999999\n",
            "oom_kill \u{0663}\n",
            "oom_kill 4\0\n",
            " oom_kill 4\n",
            "OOM_KILL 4\n",
            "oom_kill_disable 0\n",
            "oom_killer 9\n",
            "oom 3\n",
        ] {
            assert_eq!(flat_key(text, "oom_kill"), None, "{text:?}");
        }
        // The first line with the key decides; a later well-formed one does not override it.
        assert_eq!(flat_key("oom_kill x\noom_kill 9\n", "oom_kill"), None);
        assert_eq!(flat_key("oom_kill 1\noom_kill 9\n", "oom_kill"), Some(1));
        // A bare CR is no line end.
        assert_eq!(flat_key("oom_kill 5\r", "oom_kill"), None);
        assert_eq!(flat_key("oom_kill 5\rfoo\n", "oom_kill"), None);
        assert_eq!(
            flat_key("oom_kill 18446744073709551615\n", "oom_kill"),
            Some(u64::MAX)
        );
        let long = format!("oom_kill {}\n", "9".repeat(100_000));
        assert_eq!(flat_key(&long, "oom_kill"), None);
    }

    #[test]
    fn a_cgroup_without_a_counter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(V2_EVENTS), "low 0\noom 1\n").unwrap();
        let e = OomWatch::register(dir.path()).err().unwrap();
        assert!(matches!(e, OomWatchError::NoCounter { .. }), "{e}");
        let empty = tempfile::tempdir().unwrap();
        let e = OomWatch::register(empty.path()).err().unwrap();
        assert!(
            matches!(e, OomWatchError::Open { ref path, .. } if path.ends_with(V1_CONTROL)),
            "{e}"
        );
    }

    /// v2's mechanism on a plain directory standing for the cgroup: inotify on a written
    /// `memory.events` is what the kernel's modified event looks like to the watch.
    #[test]
    fn v2_sees_a_rising_counter_and_not_other_changes_or_removal() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("c1");
        std::fs::create_dir(&cg).unwrap();
        let events = cg.join(V2_EVENTS);
        std::fs::write(&events, "low 0\noom 0\noom_kill 2\n").unwrap();
        let mut w = OomWatch::register(&cg).unwrap();
        assert_eq!(w.seen(), 2);
        let writer = {
            let events = events.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                // An OOM without a kill, then a malformed counter, then the kill.
                std::fs::write(&events, "low 0\noom 1\noom_kill 2\n").unwrap();
                std::thread::sleep(Duration::from_millis(600));
                std::fs::write(&events, "low 0\noom 2\noom_kill -3\n").unwrap();
                std::thread::sleep(Duration::from_millis(600));
                std::fs::write(&events, "low 0\noom 2\noom_kill 3\n").unwrap();
            })
        };
        let began = Instant::now();
        assert_eq!(w.wait().unwrap(), Outcome::Killed { kills: 3 });
        assert!(began.elapsed() >= Duration::from_millis(1000));
        writer.join().unwrap();
        assert_eq!(w.seen(), 3);
        std::fs::remove_dir_all(&cg).unwrap();
        assert_eq!(w.wait().unwrap(), Outcome::Gone);
    }
}
