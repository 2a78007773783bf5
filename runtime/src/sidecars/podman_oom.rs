//! podman's OOM marker: the file `BUNDLE/oom` that podman 4 looks for when it handles a
//! container's exit, to set `OOMKilled` (docs/limits.md, "podman's `OOMKilled`").
//!
//! conmon 2.1.6 (Debian 12's, beside podman 4.3.1) creates `oom` in its working directory,
//! which podman 4 does not make the bundle (podman issue 13102); so the runtime creates the
//! marker itself. For a container that podman created (its spec's annotation
//! `io.container.manager` is `libpod`), `create` starts `agent-sandbox oom-watch`, a sidecar
//! that registers an OOM watch on the sandbox's memory cgroup ([`crate::host::cgroups::oom`])
//! and says it is ready before `create` returns, so before the program runs. At the first OOM
//! kill it creates the empty file `oom` in the bundle directory it opened at create, without
//! following a link there and never replacing a file, and exits; it exits too when the cgroup
//! is gone, and `delete` kills it. Nothing of this can fail the container: a watch that cannot
//! be set up or a marker that cannot be written is logged.
//!
//! Other callers get no marker: containerd's shims report OOM kills themselves (TaskOOM), and
//! the bundle of another caller is not podman's to write into.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;

use crate::host::cgroups::oom::{OomWatch, OomWatchError, Outcome};
use crate::sidecars;
use crate::state::ContainerId;
use crate::state::SandboxDir;

/// The annotation podman puts in every spec it writes, and its value.
const MANAGER_ANNOTATION: &str = "io.container.manager";
const PODMAN: &str = "libpod";
/// The marker's name in the bundle directory (podman 4's `oomFilePath`).
pub const MARKER: &str = "oom";
/// The watcher's subcommand.
const SUBCOMMAND: &str = "oom-watch";

/// Errors of the watcher (logged, never the container's).
#[derive(Debug, thiserror::Error)]
pub enum PodmanOomError {
    #[error("cannot open the bundle directory {path}")]
    Bundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Watch(#[from] OomWatchError),
    #[error("cannot start the OOM watcher: {reason}")]
    Spawn { reason: String },
    #[error("cannot create the OOM marker {path}")]
    Marker {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `spec` is podman's, so that its bundle gets the marker.
pub fn wanted(spec: &Spec) -> bool {
    spec.annotations()
        .as_ref()
        .and_then(|a| a.get(MANAGER_ANNOTATION))
        .is_some_and(|v| v == PODMAN)
}

/// At create, before the program runs: starts the watcher for the sandbox `id` whose memory
/// cgroup is `cgroup` and whose caller's bundle is `bundle`, and waits until its watch is
/// registered. `log` holds the runtime's own `--log`/`--log-format` arguments, so that the
/// watcher's errors land where the runtime's do.
pub fn start(
    sandbox_dir: &SandboxDir,
    root: &Path,
    bundle: &Path,
    cgroup: &Path,
    id: &str,
    log: &[std::ffi::OsString],
) -> Result<u32, PodmanOomError> {
    let mut args: Vec<&OsStr> = vec!["--root".as_ref(), root.as_os_str()];
    args.extend(log.iter().map(|a| a.as_os_str()));
    args.extend([
        SUBCOMMAND.as_ref(),
        "--bundle".as_ref(),
        bundle.as_os_str(),
        "--cgroup".as_ref(),
        cgroup.as_os_str(),
    ]);
    // The id stays last: `sidecars::stop` recognises its process by it.
    args.push(id.as_ref());
    sidecars::start(&args, &sandbox_dir.oom_watch_pid(), Vec::new())
        .and_then(|pending| pending.ready(None))
        .map_err(|e| PodmanOomError::Spawn {
            reason: match e {
                sidecars::SpawnError::Spawn(e) => e.to_string(),
                sidecars::SpawnError::File(e) => agent_sandbox_proxy::error_text::chain(&e),
                sidecars::SpawnError::NotReady { reason } => reason,
            },
        })
}

/// Kills the watcher (at delete), if it still is this sandbox's.
pub fn stop(sandbox_dir: &SandboxDir, id: &str) {
    sidecars::stop(&sandbox_dir.oom_watch_pid(), SUBCOMMAND, id);
}

/// The watcher's body: opens `bundle`, registers the watch on `cgroup`, prints the ready
/// line, and creates the marker at the first OOM kill. Returns once the marker is there or
/// the cgroup is gone.
pub fn run(bundle: &Path, cgroup: &Path, id: &ContainerId) -> Result<(), PodmanOomError> {
    let dir = open_dir(bundle)?;
    // A long-lived process pins no directory of its caller's (the bundle path is absolute
    // and is not used again).
    let _ = std::env::set_current_dir("/");
    let mut watch = OomWatch::register(cgroup)?;
    println!("{}", sidecars::READY);
    match watch.wait()? {
        Outcome::Gone => Ok(()),
        Outcome::Killed { kills } => {
            tracing::info!(id = %id, kills, "OOM kill: marking it for podman");
            create_marker(&dir, bundle)
        }
    }
}

/// The bundle directory, opened once at create (as the caller named it, before the
/// sandbox runs anything); the marker is created through this descriptor.
fn open_dir(bundle: &Path) -> Result<File, PodmanOomError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(bundle)
        .map_err(|source| PodmanOomError::Bundle {
            path: bundle.to_path_buf(),
            source,
        })
}

/// Creates the empty marker in `dir`, mode 0644: only a new file (`O_CREAT | O_EXCL`, which
/// never follows a link in its last component, with `O_NOFOLLOW` besides), through the
/// directory's descriptor. A marker already there (an earlier OOM kill) is left as it is.
fn create_marker(dir: &File, bundle: &Path) -> Result<(), PodmanOomError> {
    let through = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(MARKER);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&through)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            tracing::info!(path = %bundle.join(MARKER).display(), "OOM marker already there");
            Ok(())
        }
        Err(source) => Err(PodmanOomError::Marker {
            path: bundle.join(MARKER),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::spec_with_annotations;

    #[test]
    fn only_podmans_specs_get_the_marker() {
        assert!(wanted(&spec_with_annotations(&[(
            "io.container.manager",
            "libpod"
        )])));
        assert!(!wanted(&spec_with_annotations(&[(
            "io.container.manager",
            "cri-o"
        )])));
        assert!(!wanted(&spec_with_annotations(&[(
            "io.container.manager",
            "libpod "
        )])));
        assert!(!wanted(&spec_with_annotations(&[(
            "io.kubernetes.cri.container-type",
            "container"
        )])));
        assert!(!wanted(&Spec::default()));
    }

    #[test]
    fn the_marker_is_a_new_empty_file_and_never_follows_a_link() {
        let bundle = tempfile::tempdir().unwrap();
        let dir = open_dir(bundle.path()).unwrap();
        create_marker(&dir, bundle.path()).unwrap();
        let m = bundle.path().join(MARKER);
        assert_eq!(std::fs::read(&m).unwrap(), b"");
        // A second kill leaves it as it is.
        create_marker(&dir, bundle.path()).unwrap();

        // A link named `oom` is neither followed nor replaced.
        let other = tempfile::tempdir().unwrap();
        let target = other.path().join("target");
        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&target, linked.path().join(MARKER)).unwrap();
        let dir = open_dir(linked.path()).unwrap();
        create_marker(&dir, linked.path()).unwrap();
        assert!(!target.exists());
        assert!(
            std::fs::symlink_metadata(linked.path().join(MARKER))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn the_marker_goes_into_the_directory_opened_at_create() {
        let parent = tempfile::tempdir().unwrap();
        let bundle = parent.path().join("userdata");
        std::fs::create_dir(&bundle).unwrap();
        let dir = open_dir(&bundle).unwrap();
        // The path is replaced by a link elsewhere after create: the descriptor still names
        // the directory opened then.
        let moved = parent.path().join("moved");
        std::fs::rename(&bundle, &moved).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &bundle).unwrap();
        create_marker(&dir, &bundle).unwrap();
        assert!(moved.join(MARKER).is_file());
        assert!(!elsewhere.path().join(MARKER).exists());
    }

    #[test]
    fn a_marker_that_cannot_be_created_is_an_error_naming_it() {
        let parent = tempfile::tempdir().unwrap();
        let bundle = parent.path().join("userdata");
        std::fs::create_dir(&bundle).unwrap();
        let dir = open_dir(&bundle).unwrap();
        // The caller removed its bundle: nothing can be created in it any more.
        std::fs::remove_dir(&bundle).unwrap();
        let e = create_marker(&dir, &bundle).unwrap_err();
        assert!(
            matches!(&e, PodmanOomError::Marker { path, .. } if *path == bundle.join(MARKER)),
            "{e}"
        );
        let e = open_dir(&bundle).unwrap_err();
        assert!(e.to_string().contains("userdata"), "{e}");
    }
}
