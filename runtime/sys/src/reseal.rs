//! Read-only again, in another process's mount namespace: a forked child joins the
//! namespace and bind-remounts each mount point read-only with the flags given. Only the
//! child resolves paths there, so the caller never reaches a file of that tree.

use std::ffi::CString;
use std::os::fd::AsFd;

use nix::mount::MsFlags;

/// Bind-remounts each `(point, flags)` read-only (`flags` are the mount's other per-mount
/// flags, kept) in the mount namespace `ns`; returns how many could not be remounted
/// (all of them when the namespace could not be joined).
pub fn remount_readonly_in(
    ns: &impl AsFd,
    points: &[(CString, MsFlags)],
) -> std::io::Result<usize> {
    // SAFETY: the child makes only system calls (setns, mount, _exit) on memory allocated
    // before the fork, then exits; the caller, CRIU's pre-resume hook, is single-threaded.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let mut failed = points.len();
            if nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS).is_ok() {
                failed = 0;
                for (point, flags) in points {
                    let flags =
                        *flags | MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
                    let done = nix::mount::mount(
                        None::<&str>,
                        point.as_c_str(),
                        None::<&str>,
                        flags,
                        None::<&str>,
                    );
                    failed += usize::from(done.is_err());
                }
            }
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(i32::try_from(failed.min(100)).unwrap_or(100)) }
        }
        nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None)? {
            nix::sys::wait::WaitStatus::Exited(_, code) => Ok(usize::try_from(code).unwrap_or(0)),
            _ => Ok(points.len()),
        },
    }
}
