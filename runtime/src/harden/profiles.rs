//! The admin's profiles directory: where the annotation `io.agent.sandbox.profile` finds a
//! profile that is not built in (docs/policy.md#profiles-by-annotation).
//!
//! The name comes from whoever wrote the container's annotations (a pod author, a
//! `podman run --annotation`), so it is hostile: the policy crate admits only
//! `[a-z0-9][a-z0-9_-]*` (`ProfileName`), the file `NAME.toml` is opened beneath the directory
//! without following a symlink (pathrs, `O_NOFOLLOW`), and it is trusted only as the admin's:
//! a regular file, it and the directory owned by root (or by the runtime's own user, for a
//! rootless runtime's own directory), neither writable by group or others.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::harden::ANNOTATION_PROFILE;
use agent_sandbox_policy::profiles::{AdminProfile, ProfileName};

/// Where profiles are looked up unless `--profiles-dir` / `AGENT_SANDBOX_PROFILES_DIR` says
/// otherwise.
pub const DEFAULT_PROFILES_DIR: &str = "/etc/agent-sandbox/profiles";

/// A profile file larger than this is refused (the built-in ones are a few KiB).
const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// Why the profile an annotation names could not be used. Every message names the
/// annotation and points at the docs; none says "no such file" (podman reads that in a
/// runtime's error as its own "command not found").
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "annotation {ANNOTATION_PROFILE} names the profile `{name}`, which is neither built in nor a file {file} in the profiles directory {dir} (docs/policy.md#profiles-by-annotation)",
        file = name.file_name(), dir = dir.display()
    )]
    Missing { name: ProfileName, dir: PathBuf },
    #[error(
        "annotation {ANNOTATION_PROFILE} names the profile `{name}`, but the profiles directory {dir} does not exist (docs/policy.md#profiles-by-annotation)",
        dir = dir.display()
    )]
    NoDir { name: ProfileName, dir: PathBuf },
    #[error(
        "annotation {ANNOTATION_PROFILE}: the profiles directory {dir} cannot be opened (docs/policy.md#profiles-by-annotation)",
        dir = dir.display()
    )]
    OpenDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "annotation {ANNOTATION_PROFILE}: {path} is a symbolic link; a profile is a regular file in the profiles directory itself (docs/policy.md#profiles-by-annotation)",
        path = path.display()
    )]
    Symlink { path: PathBuf },
    #[error(
        "annotation {ANNOTATION_PROFILE}: {path} is not a regular file (docs/policy.md#profiles-by-annotation)",
        path = path.display()
    )]
    NotRegular { path: PathBuf },
    #[error(
        "annotation {ANNOTATION_PROFILE}: {path} is not trusted as the admin's: {why} (docs/policy.md#profiles-by-annotation)",
        path = path.display()
    )]
    Untrusted { path: PathBuf, why: Untrusted },
    #[error(
        "annotation {ANNOTATION_PROFILE}: cannot read the profile {path} (docs/policy.md#profiles-by-annotation)",
        path = path.display()
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "annotation {ANNOTATION_PROFILE}: the profile {path} is larger than {MAX_PROFILE_BYTES} bytes",
        path = path.display()
    )]
    TooLarge { path: PathBuf },
    #[error(
        "annotation {ANNOTATION_PROFILE}: the profile {path} is not a valid policy",
        path = path.display()
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<agent_sandbox_policy::PolicyError>,
    },
}

/// Why a profile or the directory is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("it is owned by uid {uid}, not by root")]
    Owner { uid: u32 },
    #[error("it is writable by group or others (mode {mode:04o})")]
    Writable { mode: u32 },
}

/// The owner and mode rule: owned by root or by `runtime_uid` (the runtime's effective uid:
/// root for a rootful runtime), and not writable by group or others.
pub fn trusted(uid: u32, mode: u32, runtime_uid: u32) -> Result<(), Untrusted> {
    if uid != 0 && uid != runtime_uid {
        return Err(Untrusted::Owner { uid });
    }
    if mode & 0o022 != 0 {
        return Err(Untrusted::Writable {
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// A profile read from the directory, with its text (saved in the sandbox dir so every exec
/// uses what create used).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub profile: AdminProfile,
    pub text: String,
}

/// The profiles directory, opened once: a directory owned by root or the runtime's user
/// that nobody else may write.
fn open_trusted_dir(
    dir: &Path,
    name: &ProfileName,
    runtime_uid: u32,
) -> Result<std::fs::File, ProfileError> {
    let opened = std::fs::File::open(dir).map_err(|source| {
        // Not the io error's text: podman reads "no such file or directory" in a runtime's
        // error as its own "command not found".
        if source.kind() == std::io::ErrorKind::NotFound {
            ProfileError::NoDir {
                name: name.clone(),
                dir: dir.to_owned(),
            }
        } else {
            ProfileError::OpenDir {
                dir: dir.to_owned(),
                source,
            }
        }
    })?;
    let meta = opened.metadata().map_err(|source| ProfileError::OpenDir {
        dir: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(ProfileError::OpenDir {
            dir: dir.to_owned(),
            source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
        });
    }
    trusted(meta.uid(), meta.mode(), runtime_uid).map_err(|why| ProfileError::Untrusted {
        path: dir.to_owned(),
        why,
    })?;
    Ok(opened)
}

/// The profile's file below the opened directory, never through a symlink.
fn open_profile(
    root: &pathrs::Root,
    dir: &Path,
    name: &ProfileName,
) -> Result<std::fs::File, ProfileError> {
    let path = dir.join(name.file_name());
    root.open_subpath(
        name.file_name(),
        pathrs::flags::OpenFlags::O_RDONLY
            | pathrs::flags::OpenFlags::O_NOFOLLOW
            | pathrs::flags::OpenFlags::O_NONBLOCK
            | pathrs::flags::OpenFlags::O_CLOEXEC,
    )
    .map_err(|e| match e.kind() {
        pathrs::error::ErrorKind::OsError(Some(libc::ENOENT)) => ProfileError::Missing {
            name: name.clone(),
            dir: dir.to_owned(),
        },
        pathrs::error::ErrorKind::OsError(Some(libc::ELOOP)) => {
            ProfileError::Symlink { path: path.clone() }
        }
        pathrs::error::ErrorKind::OsError(Some(errno)) => ProfileError::Read {
            path: path.clone(),
            source: std::io::Error::from_raw_os_error(errno),
        },
        _ => ProfileError::Read {
            path: path.clone(),
            source: std::io::Error::other(e),
        },
    })
}

/// Reads the profile `name` from `dir` under the rules of the module docs.
pub fn load(dir: &Path, name: &ProfileName) -> Result<Loaded, ProfileError> {
    let runtime_uid = nix::unistd::geteuid().as_raw();
    let opened = open_trusted_dir(dir, name, runtime_uid)?;
    let root = pathrs::Root::from_fd(opened);
    let path = dir.join(name.file_name());
    let file = open_profile(&root, dir, name)?;
    let meta = file.metadata().map_err(|source| ProfileError::Read {
        path: path.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ProfileError::NotRegular { path });
    }
    trusted(meta.uid(), meta.mode(), runtime_uid).map_err(|why| ProfileError::Untrusted {
        path: path.clone(),
        why,
    })?;
    let mut text = String::new();
    file.take(MAX_PROFILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| ProfileError::Read {
            path: path.clone(),
            source,
        })?;
    if text.len() as u64 > MAX_PROFILE_BYTES {
        return Err(ProfileError::TooLarge { path });
    }
    let origin = path.display().to_string();
    let policy = SandboxPolicy::parse(&text, &origin).map_err(|source| ProfileError::Parse {
        path: path.clone(),
        source: Box::new(source),
    })?;
    Ok(Loaded {
        profile: AdminProfile {
            name: name.clone(),
            origin,
            policy,
        },
        text,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const NARROW: &str = "[network]\nmode = \"none\"\n";

    fn name(s: &str) -> ProfileName {
        ProfileName::try_from(s).unwrap()
    }

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn write(dir: &Path, file: &str, text: &str, mode: u32) {
        let p = dir.join(file);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_owner_is_root_or_the_runtime_and_nobody_else_may_write() {
        assert_eq!(trusted(0, 0o100644, 0), Ok(()));
        assert_eq!(trusted(1000, 0o100600, 1000), Ok(()));
        assert_eq!(trusted(0, 0o100644, 1000), Ok(()));
        assert_eq!(
            trusted(1000, 0o100644, 0),
            Err(Untrusted::Owner { uid: 1000 })
        );
        assert_eq!(
            trusted(0, 0o100664, 0),
            Err(Untrusted::Writable { mode: 0o664 })
        );
        assert_eq!(
            trusted(0, 0o40777, 0),
            Err(Untrusted::Writable { mode: 0o777 })
        );
    }

    #[test]
    fn reads_a_profile_of_the_directory() {
        let d = dir();
        write(d.path(), "offline.toml", NARROW, 0o644);
        let loaded = load(d.path(), &name("offline")).unwrap();
        assert_eq!(loaded.text, NARROW);
        assert_eq!(loaded.profile.name, name("offline"));
        assert_eq!(
            loaded.profile.policy.network.mode,
            agent_sandbox_policy::policy::NetworkMode::None
        );
    }

    #[test]
    fn a_missing_profile_names_the_annotation_the_file_and_the_docs() {
        let d = dir();
        let err = load(d.path(), &name("absent")).unwrap_err();
        assert!(matches!(err, ProfileError::Missing { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(ANNOTATION_PROFILE), "{text}");
        assert!(text.contains("absent.toml"), "{text}");
        assert!(
            text.contains("docs/policy.md#profiles-by-annotation"),
            "{text}"
        );
        assert!(!text.to_lowercase().contains("no such file"), "{text}");
    }

    #[test]
    fn a_missing_directory_is_named_without_the_words_podman_misreads() {
        let d = dir();
        let err = load(&d.path().join("absent"), &name("x")).unwrap_err();
        assert!(matches!(err, ProfileError::NoDir { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(ANNOTATION_PROFILE) && text.contains("does not exist"),
            "{text}"
        );
        assert!(!text.to_lowercase().contains("no such file"), "{text}");
    }

    #[test]
    fn a_symlink_in_the_directory_is_refused_even_to_a_good_profile() {
        let d = dir();
        let outside = dir();
        write(outside.path(), "wide.toml", NARROW, 0o644);
        std::os::unix::fs::symlink(outside.path().join("wide.toml"), d.path().join("x.toml"))
            .unwrap();
        let err = load(d.path(), &name("x")).unwrap_err();
        assert!(matches!(err, ProfileError::Symlink { .. }), "{err:?}");
        assert!(err.to_string().contains(ANNOTATION_PROFILE));
    }

    #[test]
    fn a_group_writable_profile_or_directory_is_refused() {
        let d = dir();
        write(d.path(), "gw.toml", NARROW, 0o664);
        let err = load(d.path(), &name("gw")).unwrap_err();
        assert!(
            matches!(
                err,
                ProfileError::Untrusted {
                    why: Untrusted::Writable { mode: 0o664 },
                    ..
                }
            ),
            "{err:?}"
        );
        let open = dir();
        write(open.path(), "ok.toml", NARROW, 0o644);
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = load(open.path(), &name("ok")).unwrap_err();
        assert!(
            matches!(err, ProfileError::Untrusted { ref path, .. } if path == open.path()),
            "{err:?}"
        );
    }

    #[test]
    fn a_directory_or_fifo_named_like_a_profile_is_refused() {
        let d = dir();
        std::fs::create_dir(d.path().join("sub.toml")).unwrap();
        let err = load(d.path(), &name("sub")).unwrap_err();
        assert!(matches!(err, ProfileError::NotRegular { .. }), "{err:?}");
        nix::unistd::mkfifo(
            &d.path().join("pipe.toml"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let err = load(d.path(), &name("pipe")).unwrap_err();
        assert!(matches!(err, ProfileError::NotRegular { .. }), "{err:?}");
    }

    #[test]
    fn an_invalid_profile_names_its_file() {
        let d = dir();
        write(d.path(), "bad.toml", "[network]\nbogus = 1\n", 0o644);
        let err = load(d.path(), &name("bad")).unwrap_err();
        assert!(matches!(err, ProfileError::Parse { .. }), "{err:?}");
        assert!(err.to_string().contains("bad.toml"));
    }
}
