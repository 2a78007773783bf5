//! The init's `HOME`: moved to a scratch area when the image's home is on the read-only
//! root, with its protected names kept unwritable there.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Mount, Process, Spec};

use crate::policy::{SandboxPolicy, Scratch};

use super::{HardenError, HostFacts, Placeholders};

/// Points `HOME` at a scratch area when the image's home is on the read-only root (podman
/// and containerd give root `HOME=/root`): tools that write caches or their state there then
/// work ([`guard_home`] keeps its protected names, `~/.gitconfig` among them, unwritable). The policy's `/home` scratch is preferred, else `/tmp`, else the first one. A
/// `HOME` on a writable path, or on a mount the caller chose (a home shared read-only on
/// purpose), is left alone. `hardened` is the sandbox's spec: [`harden_spec`] applies this to
/// the init, and the runtime to each exec'd process with the saved spec.
pub fn writable_home(process: &mut Process, policy: &SandboxPolicy, hardened: &Spec) {
    let mut writable: Vec<PathBuf> = policy
        .filesystem
        .writable_paths()
        .iter()
        .map(|p| p.as_path().to_path_buf())
        .collect();
    writable.extend(
        hardened
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.destination().clone())
            .filter(|d| d != Path::new("/")),
    );
    let mut env = process.env().clone().unwrap_or_default();
    let current = env
        .iter()
        .find_map(|kv| kv.strip_prefix("HOME="))
        .map(str::to_owned);
    let on_writable = |home: &str| writable.iter().any(|w| Path::new(home).starts_with(w));
    if current.as_deref().is_some_and(on_writable) {
        return;
    }
    let scratch = &policy.filesystem.scratch;
    let Some(home) = ["/home", "/tmp"]
        .iter()
        .find_map(|p| scratch.iter().find(|s| s.path.as_str() == *p))
        .or_else(|| scratch.first())
        .map(|s| s.path.as_str().to_owned())
    else {
        return;
    };
    tracing::debug!(from = ?current, to = %home, "HOME moved to a writable scratch area");
    env.retain(|kv| !kv.starts_with("HOME="));
    env.push(format!("HOME={home}"));
    process.set_env(Some(env));
}

/// The scratch area `home` lies on, when the mount that holds `home` in `spec` is the
/// policy's tmpfs there (not a caller's bind beneath it, not the workspace).
pub(super) fn home_scratch<'a>(
    spec: &Spec,
    policy: &'a SandboxPolicy,
    home: &Path,
) -> Option<&'a crate::policy::Scratch> {
    let holder = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| home.starts_with(m.destination()))
        .max_by_key(|m| m.destination().components().count())?;
    if holder.typ().as_deref() != Some("tmpfs") {
        return None;
    }
    policy
        .filesystem
        .scratch
        .iter()
        .find(|s| s.path.as_path() == holder.destination())
}

/// Keeps every protected name of the init's HOME unwritable when HOME is on a scratch tmpfs
/// (where [`writable_home`] puts it), whether or not anything is there: an empty read-only
/// directory or file ([`HostFacts::placeholders`]) is bound at each protected name
/// before the program starts, so `echo x >> ~/.bashrc` fails with EROFS. A mount point cannot
/// be renamed or removed, but a directory holding one can: so HOME itself, when it lies below
/// the scratch area's top, and each directory on the way to a nested name (`.config` of
/// `.config/git/`) become tmpfs mounts of their own (writable, owned by the process's user).
/// The mounts go right after the scratch area's tmpfs, so a caller's mount beneath HOME
/// stays on top. Names inside a protected directory are covered by it. An exec that points
/// HOME elsewhere gets no such mounts (docs/policy.md#protected-names).
pub(super) fn guard_home(
    spec: &mut Spec,
    policy: &SandboxPolicy,
    ctx: &HostFacts,
) -> Result<(), HardenError> {
    let Some(process) = spec.process().as_ref() else {
        return Ok(());
    };
    let Some(home) = init_home(process) else {
        return Ok(());
    };
    let Some(scratch) = home_scratch(spec, policy, &home) else {
        return Ok(());
    };
    let placeholders =
        ctx.placeholders
            .as_ref()
            .ok_or_else(|| HardenError::MissingPlaceholders {
                home: home.display().to_string(),
                scratch: scratch.path.to_string(),
            })?;
    let guards = sorted_guards(process, &home, scratch, policy, placeholders);
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    let at = mounts
        .iter()
        .position(|m| {
            m.destination() == scratch.path.as_path() && m.typ().as_deref() == Some("tmpfs")
        })
        .map_or(mounts.len(), |i| i + 1);
    tracing::debug!(home = %home.display(), mounts = guards.len(), "protected names of HOME kept unwritable");
    mounts.splice(at..at, guards);
    spec.set_mounts(Some(mounts));
    Ok(())
}

/// [`home_guards`] in the order they are mounted: parents before children, each tmpfs
/// before the names inside it.
fn sorted_guards(
    process: &Process,
    home: &Path,
    scratch: &Scratch,
    policy: &SandboxPolicy,
    placeholders: &Placeholders,
) -> Vec<Mount> {
    let owner = (process.user().uid(), process.user().gid());
    let mut guards = home_guards(home, scratch, policy, placeholders, owner);
    guards.sort_by_key(|m| m.destination().components().count());
    guards
}

/// The mounts [`guard_home`] put in the hardened `spec`, split off so that the runtime
/// places them itself once the container exists (a few system calls each, where
/// libcontainer's checked path costs about 80): returns the spec without them, and them in
/// their order. Only where placing them last makes the same mounts: `None` (libcontainer
/// mounts them in the spec's order) when the spec has none, when a later mount lies at,
/// beneath or above HOME (it stays on top of, or covers, the guards), when the program's
/// working directory is beneath a guard's tmpfs (it would stay beneath it), or when the
/// spec asks for a mount label.
pub fn split_home_guards(
    spec: &Spec,
    policy: &SandboxPolicy,
    placeholders: &Placeholders,
) -> Option<(Spec, Vec<Mount>)> {
    let process = spec.process().as_ref()?;
    let home = init_home(process)?;
    if spec
        .linux()
        .as_ref()
        .is_some_and(|l| l.mount_label().is_some())
    {
        return None;
    }
    let mounts = spec.mounts().as_ref()?;
    // The deepest scratch tmpfs holding HOME, as guard_home found it before HOME got its own.
    let (at, scratch) = policy
        .filesystem
        .scratch
        .iter()
        .filter(|s| home.starts_with(s.path.as_path()))
        .filter_map(|s| {
            let at = mounts.iter().rposition(|m| {
                m.destination() == s.path.as_path() && m.typ().as_deref() == Some("tmpfs")
            })?;
            Some((at, s))
        })
        .max_by_key(|(_, s)| s.path.as_path().components().count())?;
    let guards = sorted_guards(process, &home, scratch, policy, placeholders);
    let run = at + 1..at + 1 + guards.len();
    if guards.is_empty() || mounts.get(run.clone())? != guards.as_slice() {
        return None;
    }
    let overlaps = |d: &Path| d.starts_with(&home) || home.starts_with(d);
    if mounts[run.end..].iter().any(|m| overlaps(m.destination())) {
        return None;
    }
    let cwd = process.cwd();
    let home_is_scratch = home == scratch.path.as_path();
    if cwd.starts_with(&home) && !(home_is_scratch && cwd == home.as_path()) {
        return None;
    }
    let mut rest = mounts.clone();
    rest.drain(run);
    let mut engine = spec.clone();
    engine.set_mounts(Some(rest));
    Some((engine, guards))
}

/// The init's `HOME`, absolute and with `.` and `..` resolved (`/home/./x/../y/` is
/// `/home/y`: the tmpfs holds no symlinks before the program runs); `None` without one.
fn init_home(process: &Process) -> Option<PathBuf> {
    let home = process
        .env()
        .iter()
        .flatten()
        .find_map(|kv| kv.strip_prefix("HOME="))
        .map(PathBuf::from)?;
    if !home.is_absolute() {
        return None;
    }
    // `/home/./x/../y/` is `/home/y`: the tmpfs holds no symlinks before the program runs.
    let mut normal = PathBuf::from("/");
    for c in home.components() {
        match c {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::Normal(n) => normal.push(n),
            _ => {}
        }
    }
    Some(normal)
}

/// The mounts that keep `home`'s protected names unwritable: a tmpfs of the user's own for
/// `home` (when it is not the scratch area itself) and for each parent of a name, and an
/// empty read-only placeholder bound at each name.
fn home_guards(
    home: &Path,
    scratch: &Scratch,
    policy: &SandboxPolicy,
    placeholders: &Placeholders,
    owner: (u32, u32),
) -> Vec<Mount> {
    let (uid, gid) = owner;
    let own_tmpfs = |dest: PathBuf| {
        let mut m = Mount::default();
        m.set_destination(dest);
        m.set_typ(Some("tmpfs".to_owned()));
        m.set_source(Some(PathBuf::from("tmpfs")));
        m.set_options(Some(vec![
            "nosuid".to_owned(),
            "nodev".to_owned(),
            "mode=0755".to_owned(),
            format!("uid={uid}"),
            format!("gid={gid}"),
            format!("size={}", scratch.size.bytes()),
        ]));
        m
    };
    let names = policy.filesystem.protected_names();
    let whole_dirs: Vec<&str> = names
        .iter()
        .filter(|n| n.is_dir())
        .map(|n| n.as_str())
        .collect();
    let mut guards: Vec<Mount> = Vec::new();
    if home != scratch.path.as_path() {
        guards.push(own_tmpfs(home.to_path_buf()));
    }
    let mut made: HashSet<PathBuf> = HashSet::new();
    for name in &names {
        let parts: Vec<&str> = name.as_str().split('/').collect();
        let inside_protected_dir =
            (1..parts.len()).any(|i| whole_dirs.contains(&parts[..i].join("/").as_str()));
        if inside_protected_dir {
            continue;
        }
        for i in 1..parts.len() {
            let dir = home.join(parts[..i].join("/"));
            if made.insert(dir.clone()) {
                guards.push(own_tmpfs(dir));
            }
        }
        let source = if name.is_dir() {
            &placeholders.dir
        } else {
            &placeholders.file
        };
        let mut m = Mount::default();
        m.set_destination(home.join(name.as_str()));
        m.set_typ(Some("bind".to_owned()));
        m.set_source(Some(source.clone()));
        m.set_options(Some(
            ["bind", "ro", "nosuid", "nodev", "noexec"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        ));
        guards.push(m);
    }
    guards
}
