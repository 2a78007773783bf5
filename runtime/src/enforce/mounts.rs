//! Host-side mounts a sandbox needs before libcontainer takes over.
//!
//! The container's root user is an unprivileged host id, so it cannot traverse
//! the 0700, host-root-owned directories in which podman and containerd keep
//! the image rootfs (containerd's bundle dir is 0700). The runtime, still
//! privileged, bind-mounts the rootfs read-only onto a mount point inside a
//! per-container directory whose ancestors are traversable (mode 0711), and
//! hands that path to libcontainer. `delete` detaches the mounts again.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// Why a host-side mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot create {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind-mount {src} on {dst}")]
    Bind {
        src: PathBuf,
        dst: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot make {dst} read-only")]
    Remount {
        dst: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot unmount {path}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot create mount point {path} in the rootfs")]
    MountPoint {
        path: PathBuf,
        #[source]
        source: pathrs::error::Error,
    },
    #[error("the workspace overlay at {path} has no {option} option")]
    OverlayOption { path: PathBuf, option: &'static str },
    #[error("{path} is not a directory owned by this user (refusing to use it)")]
    Untrusted { path: PathBuf },
    #[error("the guard mount at {dest} has an option the runtime cannot place: {option}")]
    GuardOption { dest: PathBuf, option: String },
    #[error("cannot keep the protected names of HOME unwritable")]
    HomeGuards(#[source] agent_sandbox_sys::guard_mounts::GuardMountError),
}

/// Creates `dir` (and parents) and makes it traversable but not listable.
pub fn mkdir_traversable(dir: &Path) -> Result<(), MountError> {
    std::fs::create_dir_all(dir).map_err(|source| MountError::Mkdir {
        path: dir.to_owned(),
        source,
    })?;
    let meta = std::fs::symlink_metadata(dir).map_err(|source| MountError::Mkdir {
        path: dir.to_owned(),
        source,
    })?;
    use std::os::unix::fs::MetadataExt;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(MountError::Untrusted {
            path: dir.to_owned(),
        });
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(|source| {
        MountError::Mkdir {
            path: dir.to_owned(),
            source,
        }
    })
}

/// An empty file and an empty directory in `dir` (`dir/placeholder/{file,dir}`), owned by
/// the runtime and read-only: the hardened spec binds them read-only over each protected
/// name of a HOME on a scratch area (`agent_sandbox_policy::harden::Placeholders`), so
/// writing `~/.bashrc` fails whether or not the image had one. `dir`'s ancestors are
/// traversable, so the sandbox's root reaches them.
pub fn placeholders(dir: &Path) -> Result<agent_sandbox_policy::harden::Placeholders, MountError> {
    let base = dir.join("placeholder");
    mkdir_traversable(&base)?;
    let file = base.join("file");
    let empty_dir = base.join("dir");
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| MountError::Mkdir { path, source }
    };
    std::fs::File::create(&file).map_err(err(&file))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).map_err(err(&file))?;
    match std::fs::create_dir(&empty_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(&empty_dir)(e)),
    }
    std::fs::set_permissions(&empty_dir, std::fs::Permissions::from_mode(0o555))
        .map_err(err(&empty_dir))?;
    Ok(agent_sandbox_policy::harden::Placeholders {
        file,
        dir: empty_dir,
    })
}

/// Bind-mounts `src` on `dst` (created) and makes the mount read-only.
pub fn bind_readonly(src: &Path, dst: &Path) -> Result<(), MountError> {
    bind(src, dst, true)
}

/// Bind-mounts `src` (file or directory) on `dst`, which is created to match;
/// `readonly` remounts it read-only.
pub fn bind(src: &Path, dst: &Path, readonly: bool) -> Result<(), MountError> {
    if src.is_dir() {
        mkdir_traversable(dst)?;
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dst)
            .map_err(|source| MountError::Mkdir {
                path: dst.to_owned(),
                source,
            })?;
    }
    mount(
        Some(src),
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|source| MountError::Bind {
        src: src.to_owned(),
        dst: dst.to_owned(),
        source,
    })?;
    // Private, so the container's later remounts never travel back to the host.
    let _ = mount(
        None::<&str>,
        dst,
        None::<&str>,
        MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        None::<&str>,
    );
    if !readonly {
        return Ok(());
    }
    mount(
        None::<&str>,
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|source| {
        let _ = umount2(dst, MntFlags::MNT_DETACH);
        MountError::Remount {
            dst: dst.to_owned(),
            source,
        }
    })
}

/// Detaches `path` if it is mounted; a path that is not a mount point is fine.
pub fn detach(path: &Path) -> Result<(), MountError> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(MountError::Unmount {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Detaches every mount at or below `dir` (deepest first), from /proc/self/mountinfo.
pub fn detach_all_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = detach(&p);
    }
}

/// The bind sources `create` re-bound where the sandbox can reach them ([`rebind_sources`]):
/// for each re-bound mount, its index in the spec's mounts and its new source.
#[derive(Debug, Default)]
pub struct Rebinds(Vec<(usize, PathBuf)>);

impl Rebinds {
    /// Points the spec's bind mounts at their re-bound sources (the hardening phase of
    /// `create` does it, before the policy sees the mounts).
    pub fn apply(&self, spec: &mut libcontainer::oci_spec::runtime::Spec) {
        let Some(list) = spec.mounts_mut().as_mut() else {
            return;
        };
        for (n, dst) in &self.0 {
            if let Some(m) = list.get_mut(*n) {
                m.set_source(Some(dst.clone()));
            }
        }
    }
}

/// Re-binds every bind mount of `spec` through `dir` (`dir/binds/<n>`), so the
/// sandbox's unprivileged root can reach sources that live in directories only
/// host root can traverse. Returns the new sources, for [`Rebinds::apply`]; the mount
/// points are removed with `dir`.
pub fn rebind_sources(
    spec: &libcontainer::oci_spec::runtime::Spec,
    dir: &Path,
) -> Result<Rebinds, MountError> {
    let binds = dir.join("binds");
    mkdir_traversable(&binds)?;
    let mut created = Vec::new();
    let Some(list) = spec.mounts().as_ref() else {
        return Ok(Rebinds(created));
    };
    for (n, m) in list.iter().enumerate() {
        let opts = m.options().clone().unwrap_or_default();
        let is_bind =
            m.typ().as_deref() == Some("bind") || opts.iter().any(|o| o == "bind" || o == "rbind");
        if !is_bind {
            continue;
        }
        let Some(src) = m.source().clone() else {
            continue;
        };
        // Binds of the host's procfs are for the policy to replace or refuse (harden_spec);
        // re-bound here they would reach it under another name.
        if src.starts_with("/proc") {
            continue;
        }
        let readonly = opts.iter().any(|o| o == "ro");
        let dst = binds.join(n.to_string());
        bind(&src, &dst, readonly)?;
        created.push((n, dst));
    }
    Ok(Rebinds(created))
}

/// Creates the mount points of `spec` that the image lacks, inside `rootfs`
/// (host side, as the runtime, which the sandbox root could not do), resolving
/// every path inside the rootfs so image symlinks cannot point it elsewhere.
pub fn ensure_mount_points(
    rootfs: &Path,
    spec: &libcontainer::oci_spec::runtime::Spec,
) -> Result<(), MountError> {
    let root = pathrs::Root::open(rootfs).map_err(|source| MountError::MountPoint {
        path: rootfs.to_owned(),
        source,
    })?;
    let dir_perm = std::fs::Permissions::from_mode(0o755);
    let mut tmpfs: Vec<&Path> = Vec::new();
    for m in spec.mounts().iter().flatten() {
        let dest = m.destination();
        // Beneath a tmpfs mounted before it, libcontainer makes the mount point in that
        // tmpfs (the sandbox's root owns it): the image is not touched.
        let on_tmpfs = tmpfs.iter().any(|t| dest != *t && dest.starts_with(t));
        if m.typ().as_deref() == Some("tmpfs") {
            tmpfs.push(dest);
        }
        if on_tmpfs || root.resolve(dest).is_ok() {
            continue;
        }
        let file_source = m
            .source()
            .as_ref()
            .is_some_and(|s| s.is_absolute() && s.is_file());
        let err = |source: pathrs::error::Error| MountError::MountPoint {
            path: dest.clone(),
            source,
        };
        if file_source {
            if let Some(parent) = dest.parent() {
                root.mkdir_all(parent, &dir_perm).map_err(err)?;
            }
            root.create(
                dest,
                &pathrs::InodeType::File(std::fs::Permissions::from_mode(0o644)),
            )
            .map_err(err)?;
        } else {
            root.mkdir_all(dest, &dir_perm).map_err(err)?;
        }
    }
    Ok(())
}

/// The workspace overlay of a hardened spec, mounted by the runtime itself.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceOverlay {
    /// The read-only view of the host workspace (the overlay's lower dir).
    pub lower: PathBuf,
    /// Where the sandbox's changes land, for review (the overlay's upper dir).
    pub upper: PathBuf,
    /// The kept change set (`crate::report::changes`) that holds `upper`.
    #[serde(default)]
    pub change: Option<String>,
    /// That change set's directory in the store (found again at delete whatever the
    /// environment of the deleting process).
    #[serde(default)]
    pub change_dir: Option<PathBuf>,
    /// A review mount that `upper` lives on, released with the last clone.
    #[serde(skip)]
    pub held: Option<std::sync::Arc<crate::report::changes::ReviewMount>>,
}

/// Whose the workspace's files appear to be inside the sandbox (`overlay_as_bind`, `mount_overlay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxUser {
    /// The host ids of the sandbox's process user and group.
    pub host_uid: u32,
    pub host_gid: u32,
}

/// How the workspace's ownership was mapped, for logs and `workspace.json` readers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Host uid/gid `from` appear as the sandbox user's ids.
    Mapped { from: (u32, u32) },
    /// The lower layer is the host directory as it is.
    Unmapped { reason: String },
}

/// The workspace overlay a hardened spec asked for, taken out of the spec by
/// [`overlay_as_bind`] and mounted by the runtime itself with [`mount_overlay`].
#[derive(Debug, Clone)]
pub struct OverlayMount {
    /// Where the runtime mounts it (the spec binds this directory instead).
    pub merged: PathBuf,
    pub lower: PathBuf,
    pub upper: PathBuf,
    /// The spec's overlay options.
    options: Vec<String>,
}

/// Turns the spec's workspace overlay mount into a bind of `merged`, where
/// [`mount_overlay`] mounts the overlay from the host side. Only the spec changes here.
pub fn overlay_as_bind(
    spec: &mut libcontainer::oci_spec::runtime::Spec,
    merged: &Path,
) -> Result<Option<OverlayMount>, MountError> {
    let Some(list) = spec.mounts_mut().as_mut() else {
        return Ok(None);
    };
    let Some(m) = list
        .iter_mut()
        .find(|m| m.typ().as_deref() == Some("overlay"))
    else {
        return Ok(None);
    };
    let options = m.options().clone().unwrap_or_default();
    let value = |key: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(key).map(PathBuf::from))
    };
    let missing = |option| MountError::OverlayOption {
        path: merged.to_owned(),
        option,
    };
    let lower = value("lowerdir=").ok_or_else(|| missing("lowerdir"))?;
    let upper = value("upperdir=").ok_or_else(|| missing("upperdir"))?;
    m.set_typ(Some("bind".to_owned()));
    m.set_source(Some(merged.to_owned()));
    m.set_options(Some(
        ["rbind", "rw", "nosuid", "nodev"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
    ));
    Ok(Some(OverlayMount {
        merged: merged.to_owned(),
        lower,
        upper,
        options,
    }))
}

/// Mounts the workspace overlay on its `merged` directory from the host side.
///
/// Mounted inside the sandbox's user namespace, overlayfs would copy files up
/// with the sandbox's credentials, which cannot own (nor chown to) the host ids
/// of the workspace's files: every write to an existing directory fails with
/// EOVERFLOW. Mounted here, copy-up runs with the runtime's credentials while
/// each access is still checked against the caller's, so the sandbox can change
/// exactly what its users may write, and its changes still land in `upper` only.
///
/// With `user`, the lower layer is an idmapped, read-only clone of the workspace
/// (`agent_sandbox_sys::idmap_mount`) on which the owner of the workspace's top directory
/// (uid and gid) and the sandbox user trade places: an ordinary checkout, owned by the
/// developer, is the sandbox user's inside, copy-up gives the upper files the sandbox's host
/// ids, and nothing on the host changes. Where the clone cannot be made (a filesystem
/// without idmapped mounts), the host directory is the lower layer as before: the
/// sandbox then writes only what its ids may.
pub fn mount_overlay(
    overlay: &OverlayMount,
    user: Option<SandboxUser>,
) -> Result<(WorkspaceOverlay, Ownership), MountError> {
    let OverlayMount {
        merged,
        lower,
        upper,
        options,
    } = overlay;
    let attach_at = merged.with_file_name("workspace-lower");
    let (attached, ownership) = idmapped_lower(lower, user, &attach_at);
    let lower_option = format!(
        "lowerdir={}",
        attached.as_deref().unwrap_or(lower).display()
    );
    // Only overlay data options go to mount(2); nosuid/nodev become flags.
    let data = options
        .iter()
        .filter(|o| o.contains('=') || o.as_str() == "userxattr")
        .map(|o| {
            if o.starts_with("lowerdir=") {
                lower_option.clone()
            } else {
                o.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    let mounted = mkdir_traversable(merged).and_then(|()| {
        mount(
            Some("overlay"),
            merged.as_path(),
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .map_err(|source| MountError::Bind {
            src: lower.clone(),
            dst: merged.clone(),
            source,
        })
    });
    // The overlay holds its own private copy of the clone: the attached one goes.
    if let Some(at) = &attached {
        let _ = detach(at);
        let _ = std::fs::remove_dir(at);
    }
    mounted?;
    Ok((
        WorkspaceOverlay {
            lower: lower.clone(),
            upper: upper.clone(),
            change: None,
            change_dir: None,
            held: None,
        },
        ownership,
    ))
}

/// The idmapped clone of `lower` for `user`, attached at `at` (the overlay's lower layer),
/// or why there is none.
///
/// Attached, not named as `/proc/self/fd/N`: kernels before 6.15 (Debian 13's 6.12) refuse
/// a detached mount as an overlay layer with EINVAL (`agent_sandbox_sys::idmap_mount::attach`).
fn idmapped_lower(
    lower: &Path,
    user: Option<SandboxUser>,
    at: &Path,
) -> (Option<PathBuf>, Ownership) {
    use std::os::unix::fs::MetadataExt;
    let Some(user) = user else {
        return (
            None,
            Ownership::Unmapped {
                reason: "rootless: no idmapped mount (it needs real root); the sandbox's root is the invoking user, who owns the user's checkout"
                    .to_owned(),
            },
        );
    };
    let meta = match std::fs::metadata(lower) {
        Ok(m) => m,
        Err(e) => {
            return (
                None,
                Ownership::Unmapped {
                    reason: format!("cannot stat {}: {e}", lower.display()),
                },
            );
        }
    };
    let from = (meta.uid(), meta.gid());
    let attached = agent_sandbox_sys::idmap_mount::idmapped_clone(
        lower,
        (from.0, user.host_uid),
        (from.1, user.host_gid),
    )
    .and_then(|tree| {
        // Left over by an earlier attempt: never stack a second clone on it.
        let _ = detach(at);
        let _ = std::fs::DirBuilder::new().mode(0o700).create(at);
        agent_sandbox_sys::idmap_mount::attach(&tree, at)
    });
    match attached {
        Ok(()) => (Some(at.to_owned()), Ownership::Mapped { from }),
        Err(e) => {
            tracing::warn!(workspace = %lower.display(), error = %e, "workspace ownership not mapped: the sandbox writes only what its own ids may");
            (
                None,
                Ownership::Unmapped {
                    reason: e.to_string(),
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use libcontainer::oci_spec::runtime::{Mount, Spec};

    use super::{MountError, Rebinds, overlay_as_bind};

    fn mount(typ: &str, source: &str, dest: &str, options: &[&str]) -> Mount {
        let mut m = Mount::default();
        m.set_typ(Some(typ.to_owned()));
        m.set_source(Some(PathBuf::from(source)));
        m.set_destination(PathBuf::from(dest));
        m.set_options(Some(options.iter().map(|o| (*o).to_owned()).collect()));
        m
    }

    fn spec_with(mounts: Vec<Mount>) -> Spec {
        let mut spec = Spec::default();
        spec.set_mounts(Some(mounts));
        spec
    }

    /// Mount points beneath a tmpfs of the spec are made by libcontainer in that tmpfs: the
    /// image gets the tmpfs's own mount point and nothing of what lies beneath it (a scratch
    /// HOME's placeholders would otherwise land in the image's `/home`).
    #[test]
    fn mount_points_beneath_a_tmpfs_are_not_made_in_the_image()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir(&rootfs)?;
        let ph = super::placeholders(dir.path())?;
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&ph.file)?.len(), 0);
        assert_eq!(
            std::fs::metadata(&ph.file)?.permissions().mode() & 0o777,
            0o444
        );
        assert_eq!(
            std::fs::metadata(&ph.dir)?.permissions().mode() & 0o777,
            0o555
        );
        let file = ph.file.display().to_string();
        let empty = ph.dir.display().to_string();
        let spec = spec_with(vec![
            mount("tmpfs", "tmpfs", "/home", &["nosuid"]),
            mount("tmpfs", "tmpfs", "/home/.config", &["nosuid"]),
            mount("bind", &file, "/home/.bashrc", &["bind", "ro"]),
            mount("bind", &empty, "/home/.config/git", &["bind", "ro"]),
            mount("bind", &file, "/etc/hosts", &["bind", "ro"]),
        ]);
        super::ensure_mount_points(&rootfs, &spec)?;
        assert!(rootfs.join("home").is_dir());
        assert!(rootfs.join("etc/hosts").is_file());
        assert_eq!(std::fs::read_dir(rootfs.join("home"))?.count(), 0);
        Ok(())
    }

    /// The hardening phase turns the overlay into a bind of the merged dir and keeps the
    /// overlay's own options for the host-side mount; nothing else in the spec changes.
    #[test]
    fn the_workspace_overlay_becomes_a_bind_of_its_merged_dir() {
        let tmp = mount("tmpfs", "tmpfs", "/tmp", &["nosuid"]);
        let mut spec = spec_with(vec![
            tmp.clone(),
            mount(
                "overlay",
                "overlay",
                "/workspace",
                &[
                    "lowerdir=/srv/ws",
                    "upperdir=/m/upper",
                    "workdir=/m/work",
                    "userxattr",
                    "nosuid",
                ],
            ),
        ]);
        let merged = Path::new("/m/merged");
        let overlay = overlay_as_bind(&mut spec, merged).unwrap().unwrap();
        assert_eq!(overlay.merged, merged);
        assert_eq!(overlay.lower, Path::new("/srv/ws"));
        assert_eq!(overlay.upper, Path::new("/m/upper"));
        let mounts = spec.mounts().clone().unwrap();
        assert_eq!(mounts[0], tmp);
        let ws = &mounts[1];
        assert_eq!(ws.typ().as_deref(), Some("bind"));
        assert_eq!(ws.source().as_deref(), Some(merged));
        assert_eq!(ws.destination(), Path::new("/workspace"));
        assert_eq!(
            ws.options().clone().unwrap(),
            ["rbind", "rw", "nosuid", "nodev"]
        );
        // A spec without an overlay is left alone.
        let mut plain = spec_with(vec![tmp.clone()]);
        assert!(overlay_as_bind(&mut plain, merged).unwrap().is_none());
        assert_eq!(plain.mounts().clone().unwrap(), [tmp]);
    }

    #[test]
    fn an_overlay_without_an_upper_dir_is_an_error_naming_the_option() {
        let mut spec = spec_with(vec![mount(
            "overlay",
            "overlay",
            "/workspace",
            &["lowerdir=/srv/ws"],
        )]);
        let err = overlay_as_bind(&mut spec, Path::new("/m/merged")).unwrap_err();
        assert!(
            matches!(
                err,
                MountError::OverlayOption {
                    option: "upperdir",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// Re-bound sources land on the mounts they were made for, by index.
    #[test]
    fn rebinds_point_only_their_mounts_at_the_new_sources() {
        let mut spec = spec_with(vec![
            mount("bind", "/var/lib/c/hosts", "/etc/hosts", &["rbind"]),
            mount("proc", "proc", "/proc", &[]),
            mount("bind", "/srv/ws", "/workspace", &["rbind"]),
        ]);
        Rebinds(vec![
            (0, PathBuf::from("/m/binds/0")),
            (2, PathBuf::from("/m/binds/2")),
        ])
        .apply(&mut spec);
        let sources: Vec<Option<PathBuf>> = spec
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.source().clone())
            .collect();
        assert_eq!(
            sources,
            [
                Some(PathBuf::from("/m/binds/0")),
                Some(PathBuf::from("proc")),
                Some(PathBuf::from("/m/binds/2")),
            ]
        );
    }
}
