//! The caller's OOM flag: `BUNDLE/oom`, created as soon as the sandbox's memory cgroup
//! counts an OOM kill, for podman's `OOMKilled` (docs/limits.md).
//!
//! conmon watches the memory cgroup itself, but creates `oom` in its own working directory
//! (and in `--persist-dir` when given), while podman 4.x reads `BUNDLE/oom` and starts conmon
//! in the working directory of the `podman` command without `--persist-dir`: `OOMKilled`
//! stays false whatever the runtime (podman issue 13102, fixed in podman 5.0; conmon 2.1.13
//! also creates `BUNDLE/oom`). podman checks the file as soon as conmon reports the init's
//! exit, before it calls the runtime again (`delete`), so the file must exist by then: the
//! wall-clock watchdog, which runs beside the sandbox from `start` on, waits on the memory
//! cgroup's OOM notification (v1: an eventfd on `memory.oom_control` through
//! `cgroup.event_control`, as conmon does; v2: a change of `memory.events`) while it sleeps.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What the watch needs: the memory cgroup, its kill counter at create and the caller's
/// bundle.
#[derive(Debug, Clone)]
pub struct Target {
    pub memory_cgroup: PathBuf,
    pub oom_at_create: u64,
    pub bundle: PathBuf,
}

/// Creates `BUNDLE/oom` once the memory cgroup counted more OOM kills than at create.
/// Returns whether it exists now.
fn mark_if_killed(t: &Target) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let killed = crate::audit::oom_kills(&t.memory_cgroup).is_some_and(|k| k > t.oom_at_create);
    if !killed {
        return false;
    }
    let path = t.bundle.join("oom");
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot mark the OOM kill for the caller");
            true
        }
    }
}

/// Sleeps for `total`, creating `BUNDLE/oom` as soon as the memory cgroup counts an OOM kill.
/// Without a target it only sleeps.
pub fn sleep_watching(total: Duration, target: Option<&Target>) {
    let Some(t) = target else {
        std::thread::sleep(total);
        return;
    };
    let deadline = Instant::now() + total;
    let n = agent_sandbox_sys::memory_events::Notifier::new(&t.memory_cgroup);
    let mut marked = mark_if_killed(t);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        if marked {
            std::thread::sleep(left);
            return;
        }
        n.wait(left);
        marked = mark_if_killed(t);
        if !marked && !t.memory_cgroup.is_dir() {
            // The cgroup is gone (the sandbox was deleted): nothing more to watch.
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_the_bundle_only_after_a_new_kill() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::create_dir_all(&bundle).unwrap();
        let control = cg.clone();
        let write = move |n: u64| {
            std::fs::write(
                control.join("memory.oom_control"),
                format!("oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"),
            )
            .unwrap();
        };
        write(2);
        let t = Target {
            memory_cgroup: cg.clone(),
            oom_at_create: 2,
            bundle: bundle.clone(),
        };
        assert!(!mark_if_killed(&t));
        assert!(!bundle.join("oom").exists());
        // A kill while the watch sleeps: the file appears before the sleep ends.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            write(3);
        });
        let start = Instant::now();
        let t2 = t.clone();
        let watch = std::thread::spawn(move || sleep_watching(Duration::from_secs(2), Some(&t2)));
        while !bundle.join("oom").exists() {
            assert!(start.elapsed() < Duration::from_secs(2), "no oom file");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(start.elapsed() < Duration::from_millis(1500));
        writer.join().unwrap();
        watch.join().unwrap();
    }
}
