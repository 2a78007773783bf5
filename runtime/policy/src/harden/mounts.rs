//! The mount list: a read-only root's binds, the policy's scratch tmpfs areas, the
//! workspace overlay and the read-only binds over its protected paths, in the spec's order.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceType, Mount};

use crate::policy::{Filesystem, SandboxPolicy};
use crate::value::AbsPath;

use super::{HardenError, HostFacts};

pub(super) fn union(existing: Option<Vec<String>>, required: Vec<AbsPath>) -> Vec<String> {
    let mut all: Vec<String> = existing.unwrap_or_default();
    all.extend(required.into_iter().map(String::from));
    all.sort();
    all.dedup();
    all
}

pub(super) fn is_bind(m: &Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .iter()
            .flatten()
            .any(|o| o == "bind" || o == "rbind")
}

/// Devices every container gets: null, zero, full, random, urandom, tty, console, ptmx and
/// the pty slaves.
pub(super) fn is_safe_device(typ: LinuxDeviceType, major: i64, minor: i64) -> bool {
    matches!(typ, LinuxDeviceType::C | LinuxDeviceType::U)
        && matches!(
            (major, minor),
            (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) | (5, 0) | (5, 1) | (5, 2)
        )
        || (typ == LinuxDeviceType::C && major == 136)
}

pub(super) const SAFE_DEV_SOURCES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

pub(super) fn with_options(mut mount: Mount, add: &[&str], remove: &[&str]) -> Mount {
    let mut options: Vec<String> = mount
        .options()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| !remove.contains(&o.as_str()) && !add.contains(&o.as_str()))
        .collect();
    options.extend(add.iter().map(|s| (*s).to_owned()));
    mount.set_options(Some(options));
    mount
}

pub(super) fn harden_mounts(
    incoming: Vec<Mount>,
    policy: &SandboxPolicy,
    ctx: &HostFacts,
) -> Result<Vec<Mount>, HardenError> {
    let fs = &policy.filesystem;
    let workspace = fs.workspace.as_ref();
    // Mounts keep the order the spec lists them in (the OCI spec says the runtime mounts
    // them in that order): the policy's mounts take the place of the ones they replace.
    let mut out: Vec<Slot> = Vec::new();
    let mut workspace_lower: Option<PathBuf> = None;
    // Writable mounts under /dev are safe only on the sandbox's own /dev tmpfs; on the
    // image's /dev a symlink (`/dev/shm -> /etc`) could redirect them.
    let dev_is_tmpfs = incoming
        .iter()
        .any(|m| m.destination() == Path::new("/dev") && m.typ().as_deref() == Some("tmpfs"));
    for mount in incoming {
        let dest = mount.destination().clone();
        check_path(&dest, &dest)?;
        if is_bind(&mount)
            && let Some(source) = mount.source()
        {
            check_path(&dest, source)?;
        }
        if fs.scratch.iter().any(|s| s.path.as_path() == dest) {
            out.push(Slot::Scratch(dest)); // the policy's tmpfs, below
        } else if workspace.is_some_and(|w| w.as_path() == dest) {
            if is_bind(&mount) {
                workspace_lower = mount.source().clone();
                out.push(Slot::Workspace); // the overlay, below
            }
        } else if is_bind(&mount) {
            out.push(harden_bind(mount, dest, dev_is_tmpfs)?);
        } else {
            out.push(harden_kernel_mount(mount, dest, dev_is_tmpfs)?);
        }
    }
    let tmpfs = scratch_mounts(fs);
    let overlay = match (workspace, workspace_lower) {
        (Some(workspace), Some(lower)) => workspace_mounts(workspace, &lower, ctx)?,
        _ => Vec::new(),
    };
    Ok(in_spec_order(out, tmpfs, overlay))
}

/// `..` or `.` in a mount's path would defeat every prefix check of [`harden_mounts`].
fn check_path(destination: &Path, path: &Path) -> Result<(), HardenError> {
    AbsPath::try_from(path.to_string_lossy().into_owned())
        .map(|_| ())
        .map_err(|source| HardenError::MountPath {
            destination: destination.to_path_buf(),
            source,
        })
}

/// A bind mount the spec asked for: read-only, or refused when it would show the host's
/// /proc or a host device; the engine's `/dev/shm` stays writable and never exec.
fn harden_bind(mount: Mount, dest: PathBuf, dev_is_tmpfs: bool) -> Result<Slot, HardenError> {
    let source = mount.source().clone().unwrap_or_default();
    if source.starts_with("/proc") {
        // Rootless podman binds the host's /proc for `--pid host`: it would list every
        // host process (and the egress proxy) inside the sandbox's own pid namespace.
        // The sandbox gets a fresh procfs for that namespace instead.
        if dest == Path::new("/proc") {
            let mut fresh = Mount::default();
            fresh.set_destination(dest);
            fresh.set_typ(Some("proc".to_owned()));
            fresh.set_source(Some(PathBuf::from("proc")));
            fresh.set_options(Some(vec![
                "nosuid".to_owned(),
                "nodev".to_owned(),
                "noexec".to_owned(),
            ]));
            return Ok(Slot::Mount(fresh));
        }
        return Err(HardenError::ProcBind {
            destination: dest,
            source_path: source,
        });
    }
    if source.starts_with("/dev") && !SAFE_DEV_SOURCES.iter().any(|s| Path::new(s) == source) {
        return Err(HardenError::DeviceMount {
            destination: dest,
            source_path: source,
        });
    }
    if dest == Path::new("/dev/shm") {
        if !dev_is_tmpfs {
            return Err(HardenError::DevNotTmpfs { destination: dest });
        }
        // The engine's per-container shm tmpfs: writable by design, never exec.
        return Ok(Slot::Mount(with_options(
            mount,
            &["nosuid", "nodev", "noexec"],
            &["suid", "dev", "exec"],
        )));
    }
    Ok(Slot::Mount(with_options(
        mount,
        &["ro", "nosuid", "nodev"],
        &["rw", "suid", "dev"],
    )))
}

/// A kernel filesystem or tmpfs the spec asked for: its options narrowed, or refused.
fn harden_kernel_mount(
    mount: Mount,
    dest: PathBuf,
    dev_is_tmpfs: bool,
) -> Result<Slot, HardenError> {
    let typ = mount.typ().clone().unwrap_or_default();
    let under_dev = dest.starts_with("/dev") && dest != Path::new("/dev");
    match typ.as_str() {
        "proc" | "mqueue" => Ok(Slot::Mount(with_options(
            mount,
            &["nosuid", "nodev"],
            &["suid", "dev"],
        ))),
        // No `nodev` on devpts, as runc: with it `/dev/ptmx` cannot be opened (EACCES) and
        // no terminal works (`podman run -t`, `exec -t`). A new devpts instance holds only
        // pty devices, and the device cgroup still limits them.
        "devpts" => Ok(Slot::Mount(with_options(
            mount,
            &["nosuid"],
            &["suid", "dev", "nodev"],
        ))),
        "sysfs" | "cgroup" | "cgroup2" => Ok(Slot::Mount(with_options(
            mount,
            &["ro", "nosuid", "nodev", "noexec"],
            &["rw", "suid", "dev", "exec"],
        ))),
        "tmpfs" if under_dev && !dev_is_tmpfs => {
            Err(HardenError::DevNotTmpfs { destination: dest })
        }
        "tmpfs" if dest.starts_with("/dev") => {
            Ok(Slot::Mount(with_options(mount, &["nosuid"], &["suid"])))
        }
        "tmpfs" => Err(HardenError::WritableMount {
            destination: dest,
            typ,
        }),
        _ => Err(HardenError::MountType {
            destination: dest,
            typ,
        }),
    }
}

/// The policy's scratch areas, each a tmpfs of its size.
fn scratch_mounts(fs: &Filesystem) -> Vec<Mount> {
    let mut tmpfs: Vec<Mount> = Vec::new();
    for s in &fs.scratch {
        let mut m = Mount::default();
        m.set_destination(s.path.as_path().to_path_buf());
        m.set_typ(Some("tmpfs".to_owned()));
        m.set_source(Some(PathBuf::from("tmpfs")));
        m.set_options(Some(vec![
            "nosuid".to_owned(),
            "nodev".to_owned(),
            "mode=1777".to_owned(),
            format!("size={}", s.size.bytes()),
        ]));
        tmpfs.push(m);
    }
    tmpfs
}

/// The workspace overlay over its host directory `lower`, then the protected binds on top.
fn workspace_mounts(
    workspace: &AbsPath,
    lower: &Path,
    ctx: &HostFacts,
) -> Result<Vec<Mount>, HardenError> {
    let mut overlay: Vec<Mount> = Vec::new();
    let dirs = ctx
        .workspace
        .as_ref()
        .ok_or_else(|| HardenError::MissingOverlayDirs {
            path: workspace.to_string(),
        })?;
    // Overlay options are a comma list and lowerdir a colon list: a `,` in a path
    // could add `upperdir=/etc` and send the sandbox's writes to the host.
    for path in [lower, dirs.upper.as_path(), dirs.work.as_path()] {
        let text = path.to_string_lossy();
        let safe = !text.contains([',', ':', '\\', '=']) && !text.chars().any(char::is_control);
        if !safe || !path.is_absolute() {
            return Err(HardenError::OverlayPath {
                path: path.to_path_buf(),
            });
        }
    }
    let mut m = Mount::default();
    m.set_destination(workspace.as_path().to_path_buf());
    m.set_typ(Some("overlay".to_owned()));
    m.set_source(Some(PathBuf::from("overlay")));
    m.set_options(Some(vec![
        format!("lowerdir={}", lower.display()),
        format!("upperdir={}", dirs.upper.display()),
        format!("workdir={}", dirs.work.display()),
        "userxattr".to_owned(),
        "nosuid".to_owned(),
        "nodev".to_owned(),
    ]));
    overlay.push(m);
    // The protected binds go on top of the overlay, right after it; a credential store
    // gets an empty placeholder instead of its host path (masked, not only read-only).
    // Nothing is bound at or beneath a mask: it hides the whole name, and a mount point
    // inside it would have to be made in the placeholder.
    let masks: Vec<&Path> = ctx
        .protected
        .iter()
        .filter(|p| p.secret)
        .map(|p| p.container_path.as_path())
        .collect();
    for p in &ctx.protected {
        if !p.secret && masks.iter().any(|m| p.container_path.starts_with(m)) {
            continue;
        }
        let source = if p.secret {
            let ph =
                ctx.placeholders
                    .as_ref()
                    .ok_or_else(|| HardenError::MissingMaskPlaceholders {
                        path: p.container_path.clone(),
                    })?;
            if p.dir { &ph.dir } else { &ph.file }
        } else {
            &p.host_path
        };
        let mut m = Mount::default();
        m.set_destination(p.container_path.clone());
        m.set_typ(Some("bind".to_owned()));
        m.set_source(Some(source.clone()));
        m.set_options(Some(
            ["rbind", "ro", "nosuid", "nodev"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        ));
        overlay.push(m);
    }
    Ok(overlay)
}

/// One entry of the hardened mount list before the policy's own mounts are placed.
pub(super) enum Slot {
    Mount(Mount),
    /// Where the spec had a mount at this scratch path.
    Scratch(PathBuf),
    /// Where the spec bound the workspace.
    Workspace,
}

/// The mount list in the spec's order: each scratch tmpfs where the spec had a mount at its
/// path (else just before the first mount beneath it, else last), the workspace overlay and
/// its protected binds where the spec bound the workspace (its last bind there).
pub(super) fn in_spec_order(
    slots: Vec<Slot>,
    tmpfs: Vec<Mount>,
    overlay: Vec<Mount>,
) -> Vec<Mount> {
    let last_workspace = slots.iter().rposition(|s| matches!(s, Slot::Workspace));
    let mut placed: HashSet<PathBuf> = HashSet::new();
    let mut out: Vec<Mount> = Vec::new();
    let mut overlay = Some(overlay);
    for (i, slot) in slots.into_iter().enumerate() {
        match slot {
            Slot::Mount(m) => out.push(m),
            Slot::Scratch(dest) => {
                if placed.insert(dest.clone())
                    && let Some(m) = tmpfs.iter().find(|m| m.destination() == &dest)
                {
                    out.push(m.clone());
                }
            }
            Slot::Workspace if Some(i) == last_workspace => {
                out.extend(overlay.take().into_iter().flatten());
            }
            Slot::Workspace => {}
        }
    }
    for m in tmpfs {
        if placed.contains(m.destination()) {
            continue;
        }
        let at = out
            .iter()
            .position(|o| {
                o.destination() != m.destination() && o.destination().starts_with(m.destination())
            })
            .unwrap_or(out.len());
        out.insert(at, m);
    }
    out
}
