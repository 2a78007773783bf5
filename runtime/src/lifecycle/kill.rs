//! `kill`, with runc's answers for a created and a stopped container.

use libcontainer::container::{Container, ContainerStatus};

use super::{LookupError, Runtime};
use crate::state::ContainerId;

/// Errors of `kill`. The texts are runc's where callers match on them ("container not
/// running": podman and our shim read it as "already stopped").
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("invalid signal {signal:?}")]
    Signal { signal: String },
    #[error("cannot signal process {pid}")]
    SignalSend {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error("container not running")]
    NotRunning,
    #[error("kill failed")]
    Container(#[source] Box<libcontainer::error::LibcontainerError>),
}

type Result<T> = std::result::Result<T, KillError>;

fn container_err(source: libcontainer::error::LibcontainerError) -> KillError {
    KillError::Container(Box::new(source))
}

impl Runtime {
    pub fn kill(&self, id: &ContainerId, signal: &str, all: bool) -> Result<()> {
        let sig =
            libcontainer::signal::Signal::try_from(signal).map_err(|_| KillError::Signal {
                signal: signal.to_owned(),
            })?;
        let _lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if c.status() == ContainerStatus::Created {
            return self.kill_created(id, c, signal, all);
        }
        if c.status() == ContainerStatus::Stopped {
            if !all {
                return Err(KillError::NotRunning);
            }
            // containerd follows every init exit with `kill --all` (its Delete kills what may
            // be left in the cgroup). Under the systemd driver the scope went with the last
            // process, and libcontainer fails to list a cgroup that is not there: that failure
            // kept containerd from ever handling the exit. No cgroup, nothing left to signal
            // (runc answers the same).
            let cfg = c.spec().map_err(container_err)?;
            if crate::host::cgroups::is_gone(&cfg.cgroup_path, c.systemd(), id) {
                tracing::debug!(id = %id, "kill --all: the stopped container's cgroup is gone, nothing to signal");
                return Ok(());
            }
        }
        // A process-ending signal right after `start` waits for the program's handler (not
        // needed with the reaper as PID 1: it queues every signal it forwards).
        if let (Some(pid), Some(n)) = (c.pid(), nix_signal(signal))
            && crate::report::layers::reaper_procs(&self.dirs.sandbox(id)).is_none()
            && let Some(started) = std::fs::read_to_string(self.dirs.sandbox(id).started())
                .ok()
                .and_then(|t| t.trim().parse::<f64>().ok())
        {
            crate::enforce::init_exec::await_handler(pid.as_raw(), n as i32, started);
        }
        match c.kill(sig, all) {
            // It exited meanwhile (libcontainer looks again): as for a stopped one above.
            Err(libcontainer::error::LibcontainerError::IncorrectStatus(
                ContainerStatus::Stopped,
            )) if !all => Err(KillError::NotRunning),
            r => r.map_err(container_err),
        }
    }

    /// `kill` of a created container. Its init still waits for `start` inside the runtime's
    /// own code, where, as the pid namespace's init, it ignores every signal it has no
    /// handler for: only SIGKILL and SIGSTOP would reach it. runc's waiting init dies of any
    /// signal whose default action ends a process, so such a signal becomes SIGKILL here
    /// (the program never ran: nothing is lost), and `kill` returns once the init is gone,
    /// `state` then saying `stopped`. Other signals (SIGCHLD, SIGWINCH, ...) go to the init
    /// as they are and leave it `created`.
    fn kill_created(
        &self,
        id: &ContainerId,
        mut c: Container,
        signal: &str,
        all: bool,
    ) -> Result<()> {
        use nix::sys::signal::Signal as S;
        let Some(sig) = nix_signal(signal) else {
            return Err(KillError::Signal {
                signal: signal.to_owned(),
            });
        };
        let pid = c.pid().ok_or(KillError::NotRunning)?;
        if matches!(
            sig,
            S::SIGCHLD
                | S::SIGCONT
                | S::SIGURG
                | S::SIGWINCH
                | S::SIGSTOP
                | S::SIGTSTP
                | S::SIGTTIN
                | S::SIGTTOU
        ) {
            return match nix::sys::signal::kill(pid, sig) {
                Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
                Err(source) => Err(KillError::SignalSend {
                    pid: pid.as_raw(),
                    source,
                }),
            };
        }
        if sig != S::SIGKILL {
            tracing::debug!(id = %id, signal, "created container: the waiting init gets SIGKILL");
        }
        c.kill(libcontainer::signal::Signal::from(S::SIGKILL), all)
            .map_err(container_err)?;
        // Return once it is gone, so a `state` right after says `stopped` (libcontainer
        // counts a live init as running whatever it saved).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline && alive(pid.as_raw()) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }
}

/// A signal as `kill` takes it: a number, or a name with or without `SIG`.
fn nix_signal(text: &str) -> Option<nix::sys::signal::Signal> {
    use std::str::FromStr;
    if let Ok(n) = text.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).ok();
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    nix::sys::signal::Signal::from_str(&name).ok()
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X'))
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};

    use libcontainer::container::ContainerStatus;
    use libcontainer::oci_spec::runtime::Spec;

    use super::{KillError, nix_signal};
    use crate::create::fixture::Sandbox;

    /// A child of the test standing in for the sandbox's init: signals reach a real
    /// process, and what they did is read from its exit.
    struct Init(Child);

    impl Init {
        fn start() -> Self {
            Self(Command::new("sleep").arg("30").spawn().unwrap())
        }

        fn pid(&self) -> i32 {
            i32::try_from(self.0.id()).unwrap()
        }

        /// The signal it died of, if it has ended.
        fn ended_by(&mut self) -> Option<Option<i32>> {
            self.0.try_wait().unwrap().map(|s| s.signal())
        }
    }

    impl Drop for Init {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_signal_is_a_number_or_a_name_with_or_without_sig() {
        use nix::sys::signal::Signal as S;
        for (text, want) in [
            ("9", Some(S::SIGKILL)),
            ("KILL", Some(S::SIGKILL)),
            ("sigterm", Some(S::SIGTERM)),
            ("SIGWINCH", Some(S::SIGWINCH)),
            ("hup", Some(S::SIGHUP)),
            ("0", None),
            ("999", None),
            ("NOPE", None),
        ] {
            assert_eq!(nix_signal(text), want, "{text}");
        }
    }

    /// An unknown signal is refused by name before the sandbox is even loaded.
    #[test]
    fn an_unknown_signal_is_refused_before_anything_is_loaded() {
        let mut init = Init::start();
        let s = Sandbox::created("kill-badsig", &Spec::default(), init.pid());
        let calls = s.engine.calls().len();
        let err = s.runtime.kill(&s.id, "SIGNOPE", false).unwrap_err();
        assert_eq!(err.to_string(), "invalid signal \"SIGNOPE\"");
        assert_eq!(s.engine.calls().len(), calls, "nothing was loaded");
        assert_eq!(init.ended_by(), None);
    }

    /// runc's answer for a stopped container without `--all`.
    #[test]
    fn a_stopped_sandbox_is_not_running() {
        let mut init = Init::start();
        let s = Sandbox::created("kill-stopped", &Spec::default(), init.pid());
        s.engine.set_status(s.id.as_str(), ContainerStatus::Stopped);
        let err = s.runtime.kill(&s.id, "TERM", false).unwrap_err();
        assert!(matches!(err, KillError::NotRunning), "{err:?}");
        assert_eq!(err.to_string(), "container not running");
        assert_eq!(init.ended_by(), None, "nothing was signalled");
    }

    /// A created sandbox's init waits for `start` ignoring signals it has no handler for:
    /// a signal that ends a process becomes SIGKILL, and `kill` returns once it is gone.
    #[test]
    fn a_process_ending_signal_kills_a_created_init() {
        let mut init = Init::start();
        let s = Sandbox::created("kill-created", &Spec::default(), init.pid());
        s.runtime.kill(&s.id, "TERM", false).unwrap();
        assert_eq!(
            init.ended_by(),
            Some(Some(libc::SIGKILL)),
            "SIGKILL, not SIGTERM, and gone before kill returned"
        );
        assert_eq!(saved_status(&s), "stopped");
    }

    /// A signal that does not end a process (SIGWINCH) goes to the created init as it is
    /// and leaves it waiting.
    #[test]
    fn a_harmless_signal_leaves_a_created_init_waiting() {
        let mut init = Init::start();
        let s = Sandbox::created("kill-winch", &Spec::default(), init.pid());
        s.runtime.kill(&s.id, "WINCH", false).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(init.ended_by(), None);
        assert_eq!(saved_status(&s), "created");
    }

    /// The status libcontainer's `state.json` holds.
    fn saved_status(s: &Sandbox) -> String {
        let path = s.runtime.dirs.container(&s.id).join("state.json");
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        state["status"].as_str().unwrap().to_owned()
    }
}
