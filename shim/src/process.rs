//! The lifecycle of one container process (the init or an exec), as a pure state machine.
//!
//! `Created -> Running <-> Paused -> Stopped`, with a start in flight marked on the side: an
//! exit reaped while the start is in flight is held here until the start is announced (see
//! [`crate::exits`]). Moves the state does not allow are refused with a [`WrongState`] that the
//! task service turns into FailedPrecondition.

use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::types::task::Status;

/// A process's state as containerd's task API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    Created,
    Running,
    Paused,
    Stopped,
}

impl ProcState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
        }
    }

    pub fn status(self) -> Status {
        match self {
            Self::Created => Status::CREATED,
            Self::Running => Status::RUNNING,
            Self::Paused => Status::PAUSED,
            Self::Stopped => Status::STOPPED,
        }
    }
}

/// How a process ended: its wait status as containerd reports it, and when it was reaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    pub code: u32,
    pub at: Timestamp,
}

/// A move the process's state does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongState {
    pub state: ProcState,
    pub expected: &'static str,
}

/// What a reaped exit means to the process it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub enum Reaped {
    /// Its start is in flight: the exit is held until the start has been announced.
    Held,
    /// Finish it now: drain its output, record and publish the exit.
    Finish(Exit),
}

/// One process's lifecycle: its pid, state, a start in flight and its exit.
#[derive(Debug)]
pub struct Lifecycle {
    pid: u32,
    state: ProcState,
    /// Start is in flight: an exit now is held until the start event went out.
    starting: bool,
    held: Option<Exit>,
    exit: Option<Exit>,
}

impl Lifecycle {
    /// A created process; `pid` is 0 for an exec until its start reports one.
    pub fn created(pid: u32) -> Self {
        Self {
            pid,
            state: ProcState::Created,
            starting: false,
            held: None,
            exit: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn state(&self) -> ProcState {
        self.state
    }

    pub fn exit(&self) -> Option<&Exit> {
        self.exit.as_ref()
    }

    /// Refuses anything but `expected`.
    pub fn require(&self, expected: ProcState) -> Result<(), WrongState> {
        if self.state == expected {
            Ok(())
        } else {
            Err(WrongState {
                state: self.state,
                expected: expected.name(),
            })
        }
    }

    /// Refuses a running or paused process (Delete); `expected` names what would do.
    pub fn require_not_live(&self, expected: &'static str) -> Result<(), WrongState> {
        match self.state {
            ProcState::Running | ProcState::Paused => Err(WrongState {
                state: self.state,
                expected,
            }),
            ProcState::Created | ProcState::Stopped => Ok(()),
        }
    }

    /// Start goes out to the runtime: only a created process starts.
    pub fn begin_start(&mut self) -> Result<(), WrongState> {
        self.require(ProcState::Created)?;
        self.starting = true;
        Ok(())
    }

    /// The start succeeded with `pid`: the process runs. Returns the exit held meanwhile.
    pub fn start_succeeded(&mut self, pid: u32) -> Option<Exit> {
        self.starting = false;
        self.pid = pid;
        self.state = ProcState::Running;
        self.held.take()
    }

    /// The start failed: the state stays. Returns the exit held meanwhile.
    pub fn start_failed(&mut self) -> Option<Exit> {
        self.starting = false;
        self.held.take()
    }

    /// An exit of this process's pid was reaped. `None`: it already has its exit.
    pub fn reaped(&mut self, exit: Exit) -> Option<Reaped> {
        if self.state == ProcState::Stopped || self.exit.is_some() {
            return None;
        }
        if self.starting {
            self.held = Some(exit);
            return Some(Reaped::Held);
        }
        Some(Reaped::Finish(exit))
    }

    /// The pause went through, unless something else moved the process meanwhile.
    pub fn paused(&mut self) {
        if self.state == ProcState::Running {
            self.state = ProcState::Paused;
        }
    }

    /// The resume went through, unless something else moved the process meanwhile.
    pub fn resumed(&mut self) {
        if self.state == ProcState::Paused {
            self.state = ProcState::Running;
        }
    }

    /// The process is gone: its exit is final.
    pub fn stop(&mut self, exit: Exit) {
        self.state = ProcState::Stopped;
        self.exit = Some(exit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: u32) -> Exit {
        Exit {
            code,
            at: Timestamp::default(),
        }
    }

    #[test]
    fn created_runs_pauses_resumes_and_stops() {
        let mut p = Lifecycle::created(0);
        assert_eq!(p.state(), ProcState::Created);
        p.begin_start().unwrap();
        assert_eq!(p.start_succeeded(42), None);
        assert_eq!((p.pid(), p.state()), (42, ProcState::Running));
        p.paused();
        assert_eq!(p.state(), ProcState::Paused);
        p.resumed();
        assert_eq!(p.state(), ProcState::Running);
        p.stop(exit(3));
        assert_eq!(p.state(), ProcState::Stopped);
        assert_eq!(p.exit(), Some(&exit(3)));
    }

    #[test]
    fn only_a_created_process_starts() {
        let mut p = Lifecycle::created(7);
        p.begin_start().unwrap();
        p.start_succeeded(7);
        assert_eq!(
            p.begin_start(),
            Err(WrongState {
                state: ProcState::Running,
                expected: "created"
            })
        );
        p.stop(exit(0));
        assert_eq!(p.begin_start().unwrap_err().state, ProcState::Stopped);
    }

    #[test]
    fn a_failed_start_leaves_the_state() {
        let mut p = Lifecycle::created(7);
        p.begin_start().unwrap();
        assert_eq!(p.start_failed(), None);
        assert_eq!(p.state(), ProcState::Created);
        // No longer starting: an exit now is finished at once.
        assert_eq!(p.reaped(exit(1)), Some(Reaped::Finish(exit(1))));
    }

    #[test]
    fn pause_and_resume_do_not_undo_a_stop() {
        let mut p = Lifecycle::created(7);
        p.begin_start().unwrap();
        p.start_succeeded(7);
        assert!(p.require(ProcState::Running).is_ok());
        // The pause was checked, the process exited while the runtime paused it.
        p.stop(exit(9));
        p.paused();
        p.resumed();
        assert_eq!(p.state(), ProcState::Stopped);
        assert_eq!(
            p.require(ProcState::Paused),
            Err(WrongState {
                state: ProcState::Stopped,
                expected: "paused"
            })
        );
    }

    #[test]
    fn delete_refuses_a_live_process() {
        let mut p = Lifecycle::created(7);
        assert!(p.require_not_live("stopped or created").is_ok());
        p.begin_start().unwrap();
        p.start_succeeded(7);
        assert_eq!(
            p.require_not_live("stopped"),
            Err(WrongState {
                state: ProcState::Running,
                expected: "stopped"
            })
        );
        p.paused();
        assert!(p.require_not_live("stopped").is_err());
        p.stop(exit(0));
        assert!(p.require_not_live("stopped").is_ok());
    }

    #[test]
    fn a_stopped_process_takes_no_second_exit() {
        let mut p = Lifecycle::created(7);
        p.stop(exit(1));
        assert_eq!(p.reaped(exit(2)), None);
        assert_eq!(p.exit(), Some(&exit(1)));
    }

    #[test]
    fn states_map_to_task_api_statuses() {
        assert_eq!(ProcState::Created.status(), Status::CREATED);
        assert_eq!(ProcState::Running.status(), Status::RUNNING);
        assert_eq!(ProcState::Paused.status(), Status::PAUSED);
        assert_eq!(ProcState::Stopped.status(), Status::STOPPED);
    }
}
