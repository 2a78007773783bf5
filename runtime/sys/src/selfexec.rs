//! The CVE-2019-5736 defence: before the runtime touches a container, it
//! re-executes itself from a sealed, anonymous in-memory copy of its binary.
//!
//! A process inside the container that opens `/proc/<runtime pid>/exe` then
//! reaches the memfd, which is sealed against writes, shrinking and growing, so
//! it cannot overwrite the runtime binary on the host.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};

/// Why re-executing from a sealed copy failed.
#[derive(Debug, thiserror::Error)]
pub enum SelfExecError {
    #[error("cannot open /proc/self/exe")]
    OpenSelf(#[source] io::Error),
    #[error("cannot create the memfd copy of the runtime")]
    MemfdCreate(#[source] nix::Error),
    #[error("cannot copy the runtime binary into the memfd")]
    Copy(#[source] io::Error),
    #[error("cannot seal the memfd copy of the runtime")]
    Seal(#[source] nix::Error),
    #[error("argument or environment entry contains a NUL byte")]
    Nul(#[source] std::ffi::NulError),
    #[error("cannot execute the sealed copy of the runtime")]
    Exec(#[source] nix::Error),
}

/// The seals that make the copy immutable.
fn required_seals() -> SealFlag {
    SealFlag::F_SEAL_SEAL | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_WRITE
}

/// Whether the running binary already is a sealed memfd copy.
///
/// Decided from the kernel's seals on `/proc/self/exe`, not from an
/// environment variable a caller could set.
pub fn running_from_sealed_copy() -> Result<bool, SelfExecError> {
    let exe = File::open("/proc/self/exe").map_err(SelfExecError::OpenSelf)?;
    Ok(is_sealed(&exe))
}

fn is_sealed<F: AsFd>(file: &F) -> bool {
    match fcntl(file.as_fd().as_raw_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits).contains(required_seals()),
        // Regular files (and anything that is not a memfd) answer EINVAL.
        Err(_) => false,
    }
}

/// Adds the required seals. F_SEAL_WRITE fails with EBUSY while the kernel
/// still holds transient extra references to the copy's freshly written pages
/// (seen under load, about once in a few hundred creates); the kernel waits
/// only briefly for them, so retry a bounded number of times before failing.
fn seal(copy: &File) -> Result<(), SelfExecError> {
    const ATTEMPTS: u32 = 100;
    let mut attempt = 1;
    loop {
        match fcntl(
            copy.as_fd().as_raw_fd(),
            FcntlArg::F_ADD_SEALS(required_seals()),
        ) {
            Ok(_) => return Ok(()),
            Err(nix::Error::EBUSY) if attempt < ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(err) => return Err(SelfExecError::Seal(err)),
        }
    }
}

/// Re-executes the current binary from a sealed memfd copy, with the same
/// arguments and environment. Returns `Ok(())` without doing anything when the
/// process already runs from a sealed copy; otherwise it does not return on
/// success.
pub fn reexec_from_sealed_copy() -> Result<(), SelfExecError> {
    let mut exe = File::open("/proc/self/exe").map_err(SelfExecError::OpenSelf)?;
    if is_sealed(&exe) {
        return Ok(());
    }
    let memfd: OwnedFd = memfd_create(
        c"agent-sandbox",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(SelfExecError::MemfdCreate)?;
    let mut copy = File::from(memfd);
    io::copy(&mut exe, &mut copy).map_err(SelfExecError::Copy)?;
    seal(&copy)?;

    let args = std::env::args_os()
        .map(|a| CString::new(std::os::unix::ffi::OsStringExt::into_vec(a)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(SelfExecError::Nul)?;
    let env = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = std::os::unix::ffi::OsStringExt::into_vec(k);
            kv.push(b'=');
            kv.extend(std::os::unix::ffi::OsStringExt::into_vec(v));
            CString::new(kv)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(SelfExecError::Nul)?;
    // fexecve with MFD_CLOEXEC works for ELF binaries (no interpreter needs to
    // reopen the fd), which the runtime is.
    match nix::unistd::fexecve(copy.as_fd().as_raw_fd(), &args, &env) {
        Ok(never) => match never {},
        Err(err) => Err(SelfExecError::Exec(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_not_a_sealed_copy() {
        let exe = File::open("/proc/self/exe").unwrap();
        assert!(!is_sealed(&exe));
    }

    #[test]
    fn a_sealed_memfd_is_recognised() {
        let fd = memfd_create(c"t", MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        assert!(!is_sealed(&file));
        fcntl(
            file.as_fd().as_raw_fd(),
            FcntlArg::F_ADD_SEALS(required_seals()),
        )
        .unwrap();
        assert!(is_sealed(&file));
    }
}
