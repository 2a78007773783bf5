//! The order in which exits (and OOMs) reach containerd, as pure decisions.
//!
//! The shim is a subreaper: containerd-shim reaps every child and broadcasts `(pid, status)`.
//! The task service hands each reaped exit to [`route`] and acts on what comes back; the rules
//! it applies are all here:
//! - **Held exit.** An exit of a process whose Start is still in flight is held by the process
//!   ([`crate::process::Lifecycle::reaped`]) and finished only after TaskStart /
//!   TaskExecStarted went out ([`after_start`]): TaskExit never precedes the start event.
//! - **Exit before the pid is known.** An exec can die before the runtime's pid file is read.
//!   While any exec start is in flight, exits of unknown pids are buffered in [`EarlyExits`] and
//!   matched by pid when the start returns; once no start is in flight the buffer is dropped.
//! - **Late exits.** An exit of a pid no process claims (its container was deleted, or it is a
//!   runtime command's own child) is ignored, and so is a second exit of a stopped process.
//!   The init's audit `exit` record goes with the Delete that usually follows; if no Delete
//!   comes in time a separate run writes it. [`InitExitRecord`] hands it to exactly one of them.
//! - **OOM before exit.** When the init is finished, a memory cgroup whose OOM-kill counter
//!   rose since create gets TaskOOM before TaskExit unless the kernel's notification already
//!   published one ([`oom_before_exit`]).

use crate::process::{Exit, Lifecycle, Reaped};

/// Which process of a container an exit belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Init,
    Exec,
}

/// What the task service does with a reaped exit.
#[derive(Debug, PartialEq)]
pub enum Route<K> {
    /// The process `K`'s start is in flight: the process holds the exit.
    Held,
    /// Finish process `K` with this exit now.
    Finish(K, Exit),
    /// No process has this pid yet, but an exec start is in flight: buffered.
    Buffered,
    /// Nobody's: a runtime command, a deleted container's process, a second exit.
    Ignored,
}

/// Exits of pids no process claims yet, kept while exec starts are in flight.
#[derive(Debug, Default)]
pub struct EarlyExits {
    starts_in_flight: usize,
    exits: Vec<(u32, Exit)>,
}

impl EarlyExits {
    /// An exec start went out to the runtime; its pid is not known until it returns.
    pub fn start_begins(&mut self) {
        self.starts_in_flight += 1;
    }

    /// An exec start returned, with the pid it started or `None` if it failed. Returns the
    /// exit buffered for that pid, if the exec died before its start returned.
    pub fn start_ends(&mut self, pid: Option<u32>) -> Option<Exit> {
        self.starts_in_flight = self.starts_in_flight.saturating_sub(1);
        let early = pid.and_then(|pid| {
            let i = self.exits.iter().position(|(p, _)| *p == pid)?;
            Some(self.exits.remove(i).1)
        });
        if self.starts_in_flight == 0 {
            self.exits.clear();
        }
        early
    }
}

/// Routes the exit of `pid` to the live process with that pid among `procs` (each with its
/// key `K`), or buffers it while exec starts are in flight, or drops it.
pub fn route<'a, K>(
    pid: u32,
    exit: Exit,
    procs: impl IntoIterator<Item = (K, &'a mut Lifecycle)>,
    early: &mut EarlyExits,
) -> Route<K> {
    for (key, p) in procs {
        if p.pid() != pid {
            continue;
        }
        match p.reaped(exit.clone()) {
            Some(Reaped::Held) => return Route::Held,
            Some(Reaped::Finish(exit)) => return Route::Finish(key, exit),
            None => {}
        }
    }
    if early.starts_in_flight > 0 {
        early.exits.push((pid, exit));
        Route::Buffered
    } else {
        Route::Ignored
    }
}

/// What follows a start that returned.
#[derive(Debug, PartialEq)]
pub struct AfterStart {
    /// Publish TaskStart / TaskExecStarted.
    pub announce: bool,
    /// Then finish the process with this exit (it died before its start returned).
    pub finish: Option<Exit>,
}

/// The events after a start of `kind` returned (`started`), given the exit the process held
/// and, for an exec, the exit buffered for its pid. The start event always goes first. An
/// init whose start failed still gets its held exit finished (it was created and has a pid);
/// an exec whose start failed is recorded as stopped (255) by the caller and its exits are
/// dropped: containerd hears of that failure from Start itself.
pub fn after_start(
    kind: Kind,
    started: bool,
    held: Option<Exit>,
    early: Option<Exit>,
) -> AfterStart {
    match (kind, started) {
        (Kind::Init, _) => AfterStart {
            announce: started,
            finish: held,
        },
        (Kind::Exec, true) => AfterStart {
            announce: true,
            finish: held.or(early),
        },
        (Kind::Exec, false) => AfterStart {
            announce: false,
            finish: None,
        },
    }
}

/// Whether TaskOOM goes out (before TaskExit) as `kind` is finished: only for the init, and
/// only if the cgroup's OOM-kill counter (`kills`, if readable) rose since create. The
/// kernel's notification can be missed (only the task that wins the cgroup's OOM lock sends
/// it), so the counter is authoritative. `claim` marks the OOM as published and says whether
/// it was not already (by the notification or an earlier exit); it runs only if the counter
/// rose.
pub fn oom_before_exit(
    kind: Kind,
    kills: Option<u64>,
    kills_at_create: u64,
    claim: impl FnOnce() -> bool,
) -> bool {
    kind == Kind::Init && kills.is_some_and(|k| k > kills_at_create) && claim()
}

/// The init's reaped `(pid, status)` while its audit `exit` record is not written yet. Delete
/// takes it (and writes it in the same runtime run), or, after a delay without a Delete, a
/// separate run does: whoever takes it writes it, exactly once.
#[derive(Debug, Default)]
pub struct InitExitRecord(Option<(u32, u32)>);

impl InitExitRecord {
    /// The init was reaped: its record is pending.
    pub fn reaped(&mut self, pid: u32, code: u32) {
        self.0 = Some((pid, code));
    }

    /// Takes the pending record, if nobody took it yet.
    pub fn take(&mut self) -> Option<(u32, u32)> {
        self.0.take()
    }

    /// A Delete that took `taken` failed: it is pending again for the next taker.
    pub fn restore(&mut self, taken: Option<(u32, u32)>) {
        self.0 = taken;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;

    fn exit(code: u32) -> Exit {
        Exit {
            code,
            at: Timestamp::default(),
        }
    }

    fn running(pid: u32) -> Lifecycle {
        let mut p = Lifecycle::created(pid);
        p.begin_start().unwrap();
        p.start_succeeded(pid);
        p
    }

    #[test]
    fn an_exit_of_a_running_process_is_finished() {
        let (mut init, mut exec) = (running(10), running(11));
        let mut early = EarlyExits::default();
        let procs = [("init", &mut init), ("exec", &mut exec)];
        assert_eq!(
            route(11, exit(0), procs, &mut early),
            Route::Finish("exec", exit(0))
        );
    }

    #[test]
    fn an_exit_during_start_is_held_until_the_start_is_announced() {
        let mut init = Lifecycle::created(10);
        init.begin_start().unwrap();
        let mut early = EarlyExits::default();
        assert_eq!(
            route(10, exit(0), [("init", &mut init)], &mut early),
            Route::<&str>::Held
        );
        // The start returns: first TaskStart, then the held exit is finished.
        let held = init.start_succeeded(10);
        assert_eq!(
            after_start(Kind::Init, true, held, None),
            AfterStart {
                announce: true,
                finish: Some(exit(0))
            }
        );
    }

    #[test]
    fn an_init_whose_start_failed_still_finishes_its_held_exit() {
        let mut init = Lifecycle::created(10);
        init.begin_start().unwrap();
        let mut early = EarlyExits::default();
        route(10, exit(1), [((), &mut init)], &mut early);
        let held = init.start_failed();
        assert_eq!(
            after_start(Kind::Init, false, held, None),
            AfterStart {
                announce: false,
                finish: Some(exit(1))
            }
        );
    }

    #[test]
    fn an_exec_that_dies_before_its_pid_is_known_is_matched_when_its_start_returns() {
        let mut init = running(10);
        let mut exec = Lifecycle::created(0);
        exec.begin_start().unwrap();
        let mut early = EarlyExits::default();
        early.start_begins();
        // The exec (pid 12) is reaped before the runtime's pid file was read.
        let procs = [("init", &mut init), ("exec", &mut exec)];
        assert_eq!(route(12, exit(7), procs, &mut early), Route::Buffered);
        let buffered = early.start_ends(Some(12));
        assert_eq!(buffered, Some(exit(7)));
        let held = exec.start_succeeded(12);
        assert_eq!(
            after_start(Kind::Exec, true, held, buffered),
            AfterStart {
                announce: true,
                finish: Some(exit(7))
            }
        );
        // Matched once: the buffer is empty now.
        assert_eq!(early.start_ends(Some(12)), None);
    }

    #[test]
    fn buffered_exits_of_other_pids_are_dropped_once_no_start_is_in_flight() {
        let mut early = EarlyExits::default();
        early.start_begins();
        early.start_begins();
        let none: [((), &mut Lifecycle); 0] = [];
        assert_eq!(route(20, exit(0), none, &mut early), Route::Buffered);
        // One start returns with another pid: the other start may still claim pid 20.
        assert_eq!(early.start_ends(Some(21)), None);
        // The last start fails: nothing can claim pid 20 any more.
        assert_eq!(early.start_ends(None), None);
        early.start_begins();
        assert_eq!(early.start_ends(Some(20)), None);
    }

    #[test]
    fn an_exit_nobody_claims_is_ignored_without_a_start_in_flight() {
        let mut early = EarlyExits::default();
        let mut init = running(10);
        assert_eq!(
            route(99, exit(0), [((), &mut init)], &mut early),
            Route::Ignored
        );
    }

    #[test]
    fn a_failed_exec_start_drops_its_exits() {
        let mut exec = Lifecycle::created(0);
        exec.begin_start().unwrap();
        let mut early = EarlyExits::default();
        early.start_begins();
        assert_eq!(
            route(30, exit(1), [((), &mut exec)], &mut early),
            Route::Buffered
        );
        assert_eq!(early.start_ends(None), None);
        let held = exec.start_failed();
        assert_eq!(
            after_start(Kind::Exec, false, held, None),
            AfterStart {
                announce: false,
                finish: None
            }
        );
    }

    #[test]
    fn the_exit_the_exec_held_wins_over_a_buffered_one() {
        assert_eq!(
            after_start(Kind::Exec, true, Some(exit(1)), Some(exit(2))).finish,
            Some(exit(1))
        );
    }

    #[test]
    fn late_exits_are_ignored() {
        let mut early = EarlyExits::default();
        // After Delete the container's processes are gone from the table.
        let none: [((), &mut Lifecycle); 0] = [];
        assert_eq!(route(10, exit(137), none, &mut early), Route::Ignored);
        // A second exit of a stopped process (its pid reused by nobody we know).
        let mut init = running(10);
        init.stop(exit(0));
        assert_eq!(
            route(10, exit(137), [((), &mut init)], &mut early),
            Route::Ignored
        );
        assert_eq!(init.exit(), Some(&exit(0)));
    }

    #[test]
    fn the_inits_exit_record_is_taken_exactly_once() {
        let mut record = InitExitRecord::default();
        record.reaped(10, 0);
        // Delete takes it; the late writer finds nothing.
        assert_eq!(record.take(), Some((10, 0)));
        assert_eq!(record.take(), None);
        // The late writer took it first; Delete finds nothing.
        record.reaped(11, 1);
        assert_eq!(record.take(), Some((11, 1)));
        assert_eq!(record.take(), None);
    }

    #[test]
    fn a_failed_delete_puts_the_inits_exit_record_back() {
        let mut record = InitExitRecord::default();
        record.reaped(10, 0);
        let taken = record.take();
        record.restore(taken);
        assert_eq!(record.take(), Some((10, 0)));
    }

    #[test]
    fn oom_goes_out_before_the_inits_exit_when_the_counter_rose() {
        assert!(oom_before_exit(Kind::Init, Some(1), 0, || true));
    }

    #[test]
    fn oom_goes_out_once_when_the_notification_already_published_it() {
        assert!(!oom_before_exit(Kind::Init, Some(1), 0, || false));
    }

    #[test]
    fn no_oom_without_a_new_kill_or_for_an_exec() {
        let never = || -> bool { panic!("claimed without a new OOM kill") };
        assert!(!oom_before_exit(Kind::Init, Some(2), 2, never));
        assert!(!oom_before_exit(Kind::Init, None, 0, never));
        assert!(!oom_before_exit(Kind::Exec, Some(5), 0, never));
    }
}
