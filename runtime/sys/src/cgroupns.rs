//! A cgroup namespace of its own for a child process, made between fork and exec: CRIU
//! restores a sandbox's tasks in a new cgroup namespace rooted at the sandbox's cgroup,
//! which the runtime joined before it spawns CRIU, without a process of the runtime's own
//! in between (one more start of the runtime's binary, about 5 ms under load).

use std::os::unix::process::CommandExt;
use std::process::Command;

/// When `cmd` spawns, the child enters a new cgroup namespace before `execve`, rooted at the
/// cgroup the child is in (its parent's at fork).
pub fn new_cgroupns_at_exec(cmd: &mut Command) {
    let hook = || {
        // SAFETY: unshare(2) with a constant flag changes only this (forked, about to exec)
        // process's namespaces; a raw system call, async-signal-safe.
        if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec and makes one system call
    // (async-signal-safe); it allocates nothing and touches no lock.
    unsafe { cmd.pre_exec(hook) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_has_a_cgroup_namespace_of_its_own() {
        let mine = std::fs::read_link("/proc/self/ns/cgroup").unwrap();
        let mut cmd = Command::new("readlink");
        cmd.arg("/proc/self/ns/cgroup");
        new_cgroupns_at_exec(&mut cmd);
        match cmd.output() {
            Ok(out) if out.status.success() => {
                let theirs = String::from_utf8_lossy(&out.stdout);
                assert!(theirs.starts_with("cgroup:["), "{theirs}");
                assert_ne!(theirs.trim(), mine.to_string_lossy());
            }
            // Without CAP_SYS_ADMIN the kernel refuses: the spawn says so.
            Ok(out) => panic!("readlink failed: {out:?}"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
    }
}
