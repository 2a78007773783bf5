//! The running kernel's Landlock ABI version, for `agent-sandbox layers`.
//!
//! The `landlock` crate measures the same number but keeps it private (it only exposes what
//! a ruleset achieved), so the one query syscall is made here.

use std::io;

/// `LANDLOCK_CREATE_RULESET_VERSION` from `<linux/landlock.h>`.
const CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The highest Landlock ABI the kernel supports; `Ok(0)` when Landlock is built in but
/// disabled at boot (EOPNOTSUPP) or not built at all (ENOSYS).
pub fn landlock_abi() -> io::Result<u32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) reads no
    // memory (the attribute pointer is NULL and the size 0, as the version query requires)
    // and returns the ABI version or -1 with errno; it creates no descriptor.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => Ok(0),
            _ => Err(e),
        };
    }
    u32::try_from(v).map_err(io::Error::other)
}
