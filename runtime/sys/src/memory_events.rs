//! Waiting for a change of a memory cgroup (an OOM kill), for the runtime's OOM watch
//! (`agent_sandbox::oom_watch`): cgroup v1 signals an eventfd registered on
//! `memory.oom_control` through `cgroup.event_control` (as conmon does); v2 changes
//! `memory.events`, seen with inotify. Without either, the caller's counter is read every
//! [`POLL`].

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// How often [`Notifier::wait`] returns without a notification source.
pub const POLL: Duration = Duration::from_millis(100);

/// How a watch learns of a change of the memory cgroup.
pub enum Notifier {
    /// cgroup v1: an eventfd the kernel signals on an OOM in the cgroup (or its removal).
    EventFd(OwnedFd),
    /// cgroup v2: inotify on `memory.events`.
    Inotify(OwnedFd),
    /// Neither could be set up.
    Poll,
}

impl Notifier {
    /// The best source the memory cgroup directory `cgroup` offers.
    pub fn new(cgroup: &Path) -> Notifier {
        v1_eventfd(cgroup)
            .or_else(|| v2_inotify(cgroup))
            .unwrap_or(Notifier::Poll)
    }

    /// Waits for the next notification for at most `limit` (at most [`POLL`] without a
    /// source), and drains it.
    pub fn wait(&self, limit: Duration) {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let fd = match self {
            Notifier::EventFd(fd) | Notifier::Inotify(fd) => fd,
            Notifier::Poll => {
                std::thread::sleep(limit.min(POLL));
                return;
            }
        };
        let timeout = Timespec::try_from(limit).ok();
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        if matches!(poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0) {
            let mut buf = [0u8; 4096];
            let _ = rustix::io::read(fd.as_fd(), &mut buf);
        }
    }
}

fn v1_eventfd(cgroup: &Path) -> Option<Notifier> {
    let control = std::fs::File::open(cgroup.join("memory.oom_control")).ok()?;
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok()?;
    let line = format!("{} {}", efd.as_raw_fd(), control.as_raw_fd());
    // Never created: only a cgroup v1 memory controller has the file.
    let mut events = std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.event_control"))
        .ok()?;
    std::io::Write::write_all(&mut events, line.as_bytes()).ok()?;
    // The registration holds its own reference to `memory.oom_control`.
    Some(Notifier::EventFd(efd))
}

fn v2_inotify(cgroup: &Path) -> Option<Notifier> {
    use rustix::fs::inotify;
    let events = cgroup.join("memory.events");
    if !events.is_file() {
        return None;
    }
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).ok()?;
    inotify::add_watch(&fd, &events, inotify::WatchFlags::MODIFY).ok()?;
    Some(Notifier::Inotify(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_has_no_source_and_is_never_written() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(Notifier::new(dir.path()), Notifier::Poll));
        assert!(!dir.path().join("cgroup.event_control").exists());
    }
}
