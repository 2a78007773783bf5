//! The kept change sets: where a sandbox's workspace changes live, from `create` until they
//! are promoted, discarded or expire (docs/workspace.md).
//!
//! One store per host user, whatever the entry point or `--root`: as real root
//! `/var/lib/agent-sandbox/changes` (disk, not `/run`: changes survive a reboot), rootless
//! `$XDG_DATA_HOME/agent-sandbox/changes` (else `~/.local/share/...`, else under
//! `$XDG_RUNTIME_DIR`); the environment
//! variable `AGENT_SANDBOX_CHANGES_DIR` overrides both. The store and each entry are 0700:
//! nothing of the sandbox can reach them once its mount namespace is gone. An entry
//! `<store>/<change>/` holds
//! - `change.json`: the index record ([`Record`]), replaced atomically (write, fsync, rename);
//! - `snapshots/`: the layer as it was at each checkpoint of the sandbox, by image digest
//!   (`crate::report::snapshots`), which restores start from;
//! - `upper/` + `work/`: the overlay's layer, or, with the policy's `workspace_size`,
//!   `layer.img`: a sparse ext4 image of that size, loop-mounted while the sandbox runs, whose
//!   `upper/` and `work/` the overlay uses. Past the size the sandbox gets ENOSPC and the
//!   host's disk grows by at most the image's size.
//!
//! A change set is found by its change id, its container id, its name (podman's
//! `--name`, CRI's `POD/CONTAINER`) or a unique prefix of either id, through the resolver
//! every command shares (`crate::report::find`), then [`of_sandbox`].

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::enforce::mounts::WorkspaceOverlay;
use crate::files::FileError;
use crate::state::SandboxDir;

/// The index record of one change set.
pub const INDEX_FILE: &str = "change.json";
/// The ext4 image of a size-capped change set.
pub const IMAGE_FILE: &str = "layer.img";

/// Errors of the change-set store; each names the path or key.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("cannot prepare the change store {path}")]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a directory owned by this user (refusing to keep changes there)")]
    Untrusted { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("change record {path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot run {program} for the workspace quota (docs/workspace.md)")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed for {path}: {stderr}")]
    Tool {
        program: &'static str,
        path: PathBuf,
        stderr: String,
    },
    #[error(
        "the workspace quota needs loop devices, which a rootless runtime cannot use (docs/workspace.md)"
    )]
    QuotaRootless,
    #[error("{key:?} matches several change sets ({candidates}); name one by its change id")]
    Ambiguous { key: String, candidates: String },
    #[error("no kept change set of sandbox {key:?} (see `agent-sandbox changes`)")]
    NotFound { key: String },
    #[error(transparent)]
    Find(#[from] Box<crate::report::find::FindError>),
    #[error("change set {change} belongs to a sandbox that still exists; delete it first")]
    Live { change: String },
    #[error(
        "the checkpoint image's change set {change} is of workspace {theirs}, not of this \
         sandbox's {ours} (docs/checkpoint.md#what-is-carried)"
    )]
    OtherWorkspace {
        change: String,
        theirs: PathBuf,
        ours: PathBuf,
    },
    #[error(
        "change set {change} was not kept by a checkpoint of image {digest}: the image's \
         manifest names it, the host does not (docs/checkpoint.md#refused)"
    )]
    Unbound { change: String, digest: String },
    #[error(
        "change set {change} holds no snapshot of image {digest} (an image taken by an older \
         agent-sandbox, or its snapshot was removed): checkpoint the sandbox again \
         (docs/checkpoint.md#what-is-carried)"
    )]
    NoSnapshot { change: String, digest: String },
    #[error(
        "cannot remove {path} (files a rootless sandbox's non-root users made belong to subordinate ids: run this under `podman unshare`)"
    )]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, ChangesError>;

/// The index record of a change set (`change.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The change id: 12 hex digits, unique in the store.
    pub change: String,
    /// The container id the entry point used.
    pub container: String,
    /// A human name: podman's `--name`, CRI's container name; none for ctr and runc-style use.
    pub name: Option<String>,
    /// `podman`, `containerd`, `cri` or `runtime`.
    pub entry_point: String,
    /// The runtime state root of the sandbox.
    pub root: PathBuf,
    /// Seconds since the epoch.
    pub created: u64,
    /// The host directory the workspace came from (the overlay's lower layer).
    pub workspace: PathBuf,
    /// The workspace's writable layer cap (`layer.img`), if any.
    pub quota_bytes: Option<u64>,
    /// After this (seconds since the epoch) an ended change set is removed.
    pub keep_until: u64,
    /// When the sandbox was deleted.
    pub ended: Option<u64>,
    /// Disk used, measured when the sandbox was deleted.
    pub size_bytes: Option<u64>,
    /// The sandbox changed nothing: its layer is gone and only this record and an empty
    /// `upper/` stay, so review says "no changes" instead of not finding the sandbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty: bool,
    /// The digests of the checkpoint images taken of the sandbox while this was its change
    /// set, as `checkpoint` computed them ([`bind_checkpoint`]). A restore reopens or copies
    /// this change set only for an image of one of these digests: the host's word, written
    /// where only the store's owner writes, never the image's (docs/checkpoint.md#refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<String>,
}

/// One entry of the store.
#[derive(Debug, Clone)]
pub struct Entry {
    pub dir: PathBuf,
    pub record: Record,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The store of this host user.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    /// The default store (see the module docs).
    pub fn locate() -> Result<Store> {
        if let Some(dir) = std::env::var_os("AGENT_SANDBOX_CHANGES_DIR").filter(|d| !d.is_empty()) {
            return Ok(Store {
                dir: PathBuf::from(dir),
            });
        }
        let rootless = crate::state::paths::rootless().unwrap_or(true);
        if !rootless {
            return Ok(Store {
                dir: PathBuf::from("/var/lib/agent-sandbox/changes"),
            });
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/share"))
            })
            // Without a home, the runtime directory (not kept across a reboot).
            .or_else(|| {
                std::env::var_os("XDG_RUNTIME_DIR")
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
            })
            .ok_or_else(|| ChangesError::Store {
                path: PathBuf::from("$HOME"),
                source: std::io::Error::other(
                    "none of XDG_DATA_HOME, HOME and XDG_RUNTIME_DIR is set",
                ),
            })?;
        Ok(Store {
            dir: base.join("agent-sandbox/changes"),
        })
    }

    /// Creates the store (0700, ours) if needed.
    fn ensure(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|source| ChangesError::Store {
            path: self.dir.clone(),
            source,
        })?;
        private_dir(&self.dir)
    }

    /// Every readable entry, oldest first. Unreadable records are logged and skipped.
    pub fn entries(&self) -> Vec<Entry> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Entry> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| match Entry::load(&e.path()) {
                Ok(entry) => Some(entry),
                Err(err) => {
                    tracing::warn!(path = %e.path().display(), error = %err, "skipping an unreadable change set");
                    None
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (a.record.created, &a.record.change).cmp(&(b.record.created, &b.record.change))
        });
        out
    }
}

/// Makes `dir` 0700 after checking it is a directory we own (not a planted link).
fn private_dir(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|source| ChangesError::Store {
        path: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(ChangesError::Untrusted {
            path: dir.to_owned(),
        });
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        ChangesError::Store {
            path: dir.to_owned(),
            source,
        }
    })
}

impl Entry {
    pub fn load(dir: &Path) -> Result<Entry> {
        let path = dir.join(INDEX_FILE);
        let text = crate::files::read(&path)?;
        let record = serde_json::from_slice(&text)
            .map_err(|source| ChangesError::Corrupt { path, source })?;
        Ok(Entry {
            dir: dir.to_owned(),
            record,
        })
    }

    /// Writes the record atomically: a temporary file, fsync'd, renamed over the old one.
    pub fn save(&self) -> Result<()> {
        let path = self.dir.join(INDEX_FILE);
        let text =
            serde_json::to_vec_pretty(&self.record).map_err(|e| FileError::encode(&path, e))?;
        // The temporary file is 0600, as the record must be; it is removed on failure.
        crate::state::paths::write_atomic(&path, &text).map_err(|e| FileError::write(&path, e))?;
        Ok(())
    }

    pub fn image(&self) -> PathBuf {
        self.dir.join(IMAGE_FILE)
    }

    /// The workspace record of the sandbox that still uses this change set, if any.
    pub fn live(&self) -> Option<WorkspaceOverlay> {
        // The index names the container: a name that is not a container id names no sandbox.
        let sandbox = SandboxDir::of(&self.record.root, &self.record.container).ok()?;
        let ws: WorkspaceOverlay = sandbox.workspace().read().ok()?;
        (ws.change.as_deref() == Some(self.record.change.as_str())).then_some(ws)
    }

    /// Disk the entry takes (allocated blocks, so a sparse image counts what was written).
    pub fn disk_usage(&self) -> u64 {
        du(&self.dir)
    }
}

use std::os::unix::fs::OpenOptionsExt;

fn du(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(rd) = std::fs::read_dir(path)
    {
        for e in rd.filter_map(|e| e.ok()) {
            total += du(&e.path());
        }
    }
    total
}

/// Where the sandbox came from, for the record: entry point and a human name.
pub fn origin(
    annotations: &std::collections::HashMap<String, String>,
    root: &Path,
) -> (String, Option<String>) {
    if let Some(name) = annotations.get("io.kubernetes.cri.container-name") {
        let pod = annotations
            .get("io.kubernetes.cri.sandbox-name")
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        return ("cri".to_owned(), Some(format!("{pod}{name}")));
    }
    if annotations.get("io.container.manager").map(String::as_str) == Some("libpod") {
        return ("podman".to_owned(), conmon_name());
    }
    if root.starts_with("/run/containerd") || root.starts_with("/var/run/containerd") {
        return ("containerd".to_owned(), None);
    }
    ("runtime".to_owned(), None)
}

/// podman's container name: conmon, the runtime's parent, carries it as `-n NAME`.
fn conmon_name() -> Option<String> {
    let ppid = nix::unistd::getppid().as_raw();
    let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let is_conmon = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "conmon");
    if !is_conmon {
        return None;
    }
    args.windows(2)
        .find(|w| w[0] == "-n" || w[0] == "--name")
        .map(|w| w[1].clone())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--name=").map(str::to_owned))
        })
}

/// What `create` asks of the store.
pub struct NewChangeSet<'a> {
    pub container: &'a str,
    pub root: &'a Path,
    pub annotations: &'a std::collections::HashMap<String, String>,
    pub workspace: &'a Path,
    pub fs: &'a agent_sandbox_policy::policy::Filesystem,
    /// Where a size-capped layer is mounted while the sandbox runs.
    pub mount_point: &'a Path,
    pub rootless: bool,
}

/// A new change set, and the directory in which the overlay's `upper`/`work` go.
pub struct Created {
    pub entry: Entry,
    pub base: PathBuf,
}

/// Creates the change set of a new sandbox: the entry, its record, and (with a quota) the
/// mounted ext4 image; then applies the retention limits to the others.
pub fn create(store: &Store, new: &NewChangeSet<'_>) -> Result<Created> {
    // Loop devices are real root's: a rootless runtime keeps its changes in plain dirs,
    // and says so (docs/workspace.md, "Rootless").
    let quota = new.fs.workspace_size.filter(|_| !new.rootless);
    if new.fs.workspace_size.is_some() && new.rootless {
        tracing::warn!(
            layer = "workspace_quota",
            reason = %ChangesError::QuotaRootless,
            "workspace quota inactive"
        );
    }
    store.ensure()?;
    let created = now();
    let change = {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(new.root.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update(new.container.as_bytes());
        h.update(format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes());
        hex::encode(&h.finalize()[..6])
    };
    let dir = store.dir.join(&change);
    std::fs::create_dir(&dir).map_err(|source| ChangesError::Store {
        path: dir.clone(),
        source,
    })?;
    private_dir(&dir)?;
    let (entry_point, name) = origin(new.annotations, new.root);
    let entry = Entry {
        dir: dir.clone(),
        record: Record {
            change,
            container: new.container.to_owned(),
            name,
            entry_point,
            root: new.root.to_owned(),
            created,
            workspace: new.workspace.to_owned(),
            quota_bytes: quota.map(|s| s.bytes()),
            keep_until: created.saturating_add(new.fs.changes_max_age.get()),
            ended: None,
            size_bytes: None,
            empty: false,
            checkpoints: Vec::new(),
        },
    };
    entry.save()?;
    let base = match quota {
        Some(size) => {
            let mounted = make_image(&entry.image(), size.bytes())
                .and_then(|()| {
                    crate::enforce::mounts::mkdir_traversable(new.mount_point).map_err(|e| {
                        ChangesError::Store {
                            path: new.mount_point.to_owned(),
                            source: std::io::Error::other(e.to_string()),
                        }
                    })
                })
                .and_then(|()| loop_mount(&entry.image(), new.mount_point, false));
            if let Err(e) = mounted {
                // Nothing was kept yet: no entry either.
                let _ = remove(&entry);
                return Err(e);
            }
            new.mount_point.to_owned()
        }
        None => dir,
    };
    prune(store, new.fs.changes_max_total.bytes());
    Ok(Created { entry, base })
}

pub(crate) fn run_tool(
    program: &'static str,
    args: &[&std::ffi::OsStr],
    path: &Path,
) -> Result<()> {
    let out = std::process::Command::new(program)
        .args(args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ChangesError::Spawn { program, source })?;
    if !out.status.success() {
        return Err(ChangesError::Tool {
            program,
            path: path.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// A sparse file of `bytes` with an ext4 filesystem (no journal: the layer is scratch
/// until reviewed; no reserved blocks: the sandbox gets all of it).
fn make_image(image: &Path, bytes: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| FileError::write(image, e))?;
    f.set_len(bytes).map_err(|e| FileError::write(image, e))?;
    drop(f);
    let args: [&std::ffi::OsStr; 10] = [
        "-q".as_ref(),
        "-F".as_ref(),
        "-t".as_ref(),
        "ext4".as_ref(),
        "-m".as_ref(),
        "0".as_ref(),
        "-O".as_ref(),
        "^has_journal".as_ref(),
        "-E".as_ref(),
        "nodiscard,lazy_itable_init=1".as_ref(),
    ];
    let mut all: Vec<&std::ffi::OsStr> = args.to_vec();
    all.push(image.as_os_str());
    run_tool("mke2fs", &all, image)
}

/// Loop-mounts `image` on `at` (nosuid, nodev, noexec; `ro` for review). mount(8) picks a
/// free loop device, reuses one already backed by this image (so the kernel keeps one
/// superblock for it) and sets autoclear: the device goes with the last unmount.
fn loop_mount(image: &Path, at: &Path, ro: bool) -> Result<()> {
    let opts = if ro {
        "loop,ro,nosuid,nodev,noexec"
    } else {
        "loop,nosuid,nodev,noexec"
    };
    run_tool(
        "mount",
        &[
            "-n".as_ref(),
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            opts.as_ref(),
            image.as_os_str(),
            at.as_os_str(),
        ],
        image,
    )
}

/// A read-only mount of an ended change set's image, for review; unmounted on drop.
#[derive(Debug)]
pub struct ReviewMount {
    at: PathBuf,
}

impl Drop for ReviewMount {
    fn drop(&mut self) {
        let _ = crate::enforce::mounts::detach(&self.at);
        let _ = std::fs::remove_dir(&self.at);
    }
}

/// The overlay dirs of a change set for review: the live sandbox's, else the kept ones
/// (an image is mounted read-only for as long as the result lives).
pub fn open(entry: &Entry) -> Result<WorkspaceOverlay> {
    if let Some(ws) = entry.live() {
        return Ok(ws);
    }
    let lower = entry.record.workspace.clone();
    if entry.record.quota_bytes.is_none() || entry.record.empty {
        return Ok(WorkspaceOverlay {
            lower,
            upper: entry.dir.join("upper"),
            change: Some(entry.record.change.clone()),
            change_dir: Some(entry.dir.clone()),
            held: None,
        });
    }
    let at = entry.dir.join(format!("review-{}", std::process::id()));
    std::fs::create_dir_all(&at).map_err(|source| ChangesError::Store {
        path: at.clone(),
        source,
    })?;
    let guard = ReviewMount { at: at.clone() };
    loop_mount(&entry.image(), &at, true)?;
    Ok(WorkspaceOverlay {
        lower,
        upper: at.join("upper"),
        change: Some(entry.record.change.clone()),
        change_dir: Some(entry.dir.clone()),
        held: Some(Arc::new(guard)),
    })
}

/// The change set of sandbox `id` of state root `root` (`crate::report::find` resolved the
/// user's key to them): the one `change` names, else its only one; a reused id with several
/// kept sets is ambiguous (the error lists their change ids).
pub fn of_sandbox(store: &Store, root: &Path, id: &str, change: Option<&str>) -> Result<Entry> {
    let mine: Vec<Entry> = store
        .entries()
        .into_iter()
        .filter(|e| {
            e.record.container == id
                && crate::report::find::same_root(&e.record.root, root)
                && change.is_none_or(|c| e.record.change == c)
        })
        .collect();
    match mine.as_slice() {
        [] => Err(ChangesError::NotFound { key: id.to_owned() }),
        [one] => Ok(one.clone()),
        many => Err(ChangesError::Ambiguous {
            key: id.to_owned(),
            candidates: many
                .iter()
                .map(|e| e.record.change.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// At `restore` of sandbox `container` (state root `root`): its ended change set `change`,
/// live again, with its layer where `create` would put it (a size-capped one mounted on
/// `mount_point`), so the restored processes see their unpromoted edits and `diff` shows
/// them. Only a change set of the same sandbox id, bound to the image's `digest` by its
/// checkpoint ([`bind_checkpoint`]), is reopened: an image cannot name another sandbox's
/// changes.
pub fn reopen(
    store: &Store,
    image: &ImageRef<'_>,
    root: &Path,
    mount_point: &Path,
) -> Result<Created> {
    let mut entry = of_sandbox(store, root, image.container, Some(image.change))?;
    if entry.live().is_some() {
        return Err(ChangesError::NotFound {
            key: image.change.to_owned(),
        });
    }
    bound(&entry, image.digest)?;
    let snapshot = crate::report::snapshots::of_image(&entry, image.digest)?;
    let base = if entry.image().is_file() {
        crate::enforce::mounts::mkdir_traversable(mount_point).map_err(|e| {
            ChangesError::Store {
                path: mount_point.to_owned(),
                source: std::io::Error::other(e.to_string()),
            }
        })?;
        loop_mount(&entry.image(), mount_point, false)?;
        mount_point.to_owned()
    } else {
        entry.dir.clone()
    };
    // The workspace as it was at the checkpoint: what the sandbox wrote after it (a
    // `--leave-running` checkpoint) is not the image's (docs/checkpoint.md#what-is-carried).
    crate::report::snapshots::restore_into(&snapshot, &base.join("upper"))?;
    entry.record.ended = None;
    entry.record.size_bytes = None;
    entry.record.empty = false;
    entry.save()?;
    Ok(Created { entry, base })
}

/// At `restore` under a new sandbox id (podman's `--import` with `--name`), before anything
/// is made for it: the change set the image names and its snapshot of the image, if it may
/// be copied. Only a kept change set of the sandbox the image names, bound to the image's
/// digest by its checkpoint ([`bind_checkpoint`]), of the restoring sandbox's `workspace`
/// directory, is (the image names it, the store vouches for it). Its sandbox may run on (a
/// `--leave-running` checkpoint, a restore in place): the copy is of the snapshot.
pub fn copy_source(
    store: &Store,
    image: &ImageRef<'_>,
    root: &Path,
    workspace: &Path,
) -> Result<CopySource> {
    let entry = of_sandbox(store, root, image.container, Some(image.change))?;
    bound(&entry, image.digest)?;
    same_workspace(&entry, workspace)?;
    let snapshot = crate::report::snapshots::of_image(&entry, image.digest)?;
    Ok(CopySource { entry, snapshot })
}

/// What a fork copies ([`copy_source`]): the change set and its snapshot of the image.
#[derive(Debug, Clone)]
pub struct CopySource {
    pub entry: Entry,
    pub snapshot: PathBuf,
}

fn same_workspace(entry: &Entry, workspace: &Path) -> Result<()> {
    if entry.record.workspace == workspace {
        return Ok(());
    }
    Err(ChangesError::OtherWorkspace {
        change: entry.record.change.clone(),
        theirs: entry.record.workspace.clone(),
        ours: workspace.to_owned(),
    })
}

/// The snapshot of `source` ([`copy_source`]) copied into the new sandbox's own change set
/// `into`, before its overlay is mounted, if both are of the same workspace; it stays in
/// the store. `cp -a` keeps owners, modes, overlay whiteouts and xattrs, and copies links
/// as links (`crate::report::snapshots::copy_tree`).
pub fn copy_layer(source: &CopySource, into: &Created) -> Result<()> {
    same_workspace(&source.entry, &into.entry.record.workspace)?;
    crate::report::snapshots::copy_tree(&source.snapshot, &into.base.join("upper"))
}

/// What a checkpoint image says of its change set, with the digest the restoring runtime
/// computed of its own copy of the image's files.
#[derive(Debug, Clone, Copy)]
pub struct ImageRef<'a> {
    /// The sandbox the image names as the one it was taken of.
    pub container: &'a str,
    /// The change set the image names.
    pub change: &'a str,
    /// SHA-256 of the image's CRIU files (`crate::host::criu::image_digest`), computed by
    /// the restoring runtime, not read from the image.
    pub digest: &'a str,
}

/// At `checkpoint`: the change set whose entry is `dir` is bound to the image `digest` the
/// runtime just wrote (kept in its record, which only the store's owner writes), so that a
/// restore of exactly that image may reopen or copy it ([`reopen`], [`copy_layer`]).
pub fn bind_checkpoint(dir: &Path, digest: &str) -> Result<()> {
    let mut entry = Entry::load(dir)?;
    if !entry.record.checkpoints.iter().any(|d| d == digest) {
        entry.record.checkpoints.push(digest.to_owned());
        entry.save()?;
    }
    Ok(())
}

/// The change set of `entry` was kept by a checkpoint whose image has `digest`.
fn bound(entry: &Entry, digest: &str) -> Result<()> {
    if entry.record.checkpoints.iter().any(|d| d == digest) {
        return Ok(());
    }
    tracing::warn!(change = %entry.record.change, digest, "refused: the change set is not bound to the image");
    Err(ChangesError::Unbound {
        change: entry.record.change.clone(),
        digest: digest.to_owned(),
    })
}

/// Called at delete, before the sandbox's mounts go: an empty change set keeps only its
/// record (review then says "no changes"), any other one is stamped ended with its size. An
/// empty one of a sandbox that never `ran` (its create failed) is removed whole.
pub fn ended(ws: &WorkspaceOverlay, ran: bool) -> Option<Entry> {
    let change = ws.change.as_ref()?;
    let dir = match &ws.change_dir {
        Some(dir) => dir.clone(),
        None => Store::locate().ok()?.dir.join(change),
    };
    let mut entry = Entry::load(&dir).ok()?;
    let empty = std::fs::read_dir(&ws.upper).is_ok_and(|mut rd| rd.next().is_none());
    if empty && !ran {
        if let Err(e) = remove(&entry) {
            tracing::warn!(error = %e, "cannot remove the change set of a failed create");
        }
        return None;
    }
    if empty {
        tracing::debug!(change = %change, "no workspace changes: only the record is kept");
        if let Err(e) = keep_record_only(&mut entry) {
            tracing::warn!(error = %e, "cannot drop the layer of an empty change set");
            if let Err(e) = remove(&entry) {
                tracing::warn!(error = %e, "cannot remove an empty change set");
            }
        }
        return None;
    }
    entry.record.ended = Some(now());
    entry.record.size_bytes = Some(entry.disk_usage());
    if let Err(e) = entry.save() {
        tracing::error!(change = %change, error = %e, "cannot stamp the change set ended");
    }
    tracing::info!(change = %change, size = entry.record.size_bytes, "workspace changes kept for review");
    Some(entry)
}

/// Removes an entry: first whatever is still mounted under it (review mounts), then its files.
fn remove(entry: &Entry) -> Result<()> {
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        for p in info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&entry.dir))
        {
            let _ = crate::enforce::mounts::detach(&p);
        }
    }
    // The layer first, the record last: an entry that cannot be removed whole stays listed.
    let rd = std::fs::read_dir(&entry.dir).map_err(|source| ChangesError::Remove {
        path: entry.dir.clone(),
        source,
    })?;
    for e in rd.filter_map(|e| e.ok()) {
        if e.file_name() == INDEX_FILE {
            continue;
        }
        let path = e.path();
        let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&path)
        } else {
            std::fs::remove_file(&path)
        };
        gone.map_err(|source| ChangesError::Remove { path, source })?;
    }
    remove_tree(&entry.dir).map_err(|source| ChangesError::Remove {
        path: entry.dir.clone(),
        source,
    })
}

/// `remove_dir_all`, first giving this user back the right to list and empty the
/// directories it owns: overlayfs leaves `work/work` mode 0000, and a rootless sandbox's root
/// (the invoking user) may make directories of any mode. Symlinks are never followed; other
/// owners' directories are left as they are (their removal fails as before).
pub(crate) fn remove_tree(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let me = nix::unistd::geteuid().as_raw();
            let mut stack = vec![dir.to_owned()];
            while let Some(d) = stack.pop() {
                let Ok(meta) = std::fs::symlink_metadata(&d) else {
                    continue;
                };
                if !meta.is_dir() || meta.uid() != me {
                    continue;
                }
                if meta.mode() & 0o700 != 0o700 {
                    std::fs::set_permissions(&d, PermissionsExt::from_mode(meta.mode() | 0o700))?;
                }
                if let Ok(rd) = std::fs::read_dir(&d) {
                    stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
                }
            }
            std::fs::remove_dir_all(dir)
        }
        other => other,
    }
}

/// An empty change set's layer goes (its mounts are detached by the caller's delete first;
/// a quota image is removed whole), leaving the record, stamped ended and empty, and an
/// empty `upper/` that review reads as "no changes".
fn keep_record_only(entry: &mut Entry) -> Result<()> {
    let rd = std::fs::read_dir(&entry.dir).map_err(|source| ChangesError::Remove {
        path: entry.dir.clone(),
        source,
    })?;
    for e in rd.filter_map(|e| e.ok()) {
        let path = e.path();
        // The snapshots stay: a restore of a checkpoint starts from its own.
        let gone = if [INDEX_FILE, "upper", crate::report::snapshots::DIR]
            .iter()
            .any(|n| e.file_name() == *n)
        {
            continue;
        } else if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&path)
        } else {
            std::fs::remove_file(&path)
        };
        gone.map_err(|source| ChangesError::Remove { path, source })?;
    }
    let upper = entry.dir.join("upper");
    std::fs::create_dir_all(&upper).map_err(|source| ChangesError::Store {
        path: upper.clone(),
        source,
    })?;
    entry.record.ended = Some(now());
    entry.record.size_bytes = Some(0);
    entry.record.empty = true;
    entry.save()
}

/// `changes discard KEY`: removes a change set whose sandbox is gone.
pub fn discard(entry: Entry) -> Result<Record> {
    if entry.live().is_some() {
        return Err(ChangesError::Live {
            change: entry.record.change,
        });
    }
    remove(&entry)?;
    tracing::info!(change = %entry.record.change, "change set discarded");
    Ok(entry.record)
}

/// Applies the retention limits: ended change sets past their `keep_until` go, then the
/// oldest ended ones until the rest fit in `max_total` bytes. A live one is never removed.
pub fn prune(store: &Store, max_total: u64) -> Vec<Record> {
    let now = now();
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for e in store.entries() {
        if e.live().is_some() {
            continue;
        }
        if now >= e.record.keep_until {
            if let Err(err) = remove(&e) {
                tracing::warn!(error = %err, "cannot remove an expired change set");
                continue;
            }
            removed.push(e.record);
        } else {
            kept.push(e);
        }
    }
    let size = |e: &Entry| e.record.size_bytes.unwrap_or_else(|| e.disk_usage());
    let mut total: u64 = kept.iter().map(size).sum();
    for e in kept {
        if total <= max_total {
            break;
        }
        total = total.saturating_sub(size(&e));
        if let Err(err) = remove(&e) {
            tracing::warn!(error = %err, "cannot remove a change set past the total");
            continue;
        }
        removed.push(e.record);
    }
    for r in &removed {
        tracing::info!(change = %r.change, container = %r.container, "change set expired (retention)");
    }
    removed
}

/// `agent-sandbox changes ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List the kept change sets (the default)
    List {
        /// One JSON record per line
        #[arg(long)]
        json: bool,
    },
    /// Remove a kept change set: change id, container id, name or unique prefix
    Discard { id: String },
    /// Remove the change sets past their age, then the oldest past the total size
    Prune,
}

/// Where `changes discard KEY` looks for KEY: `--root` and `--audit-dir`, if given.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope<'a> {
    pub root: Option<&'a Path>,
    pub audit_dir: Option<&'a Path>,
}

/// Runs `changes`; returns what to print. The total size limit of `prune` is the policy's.
pub fn run(
    action: Option<Action>,
    policy: &agent_sandbox_policy::SandboxPolicy,
    at: Scope<'_>,
) -> Result<String> {
    let store = Store::locate()?;
    match action.unwrap_or(Action::List { json: false }) {
        Action::List { json: false } => Ok(table(&store.entries())),
        Action::List { json: true } => Ok(store
            .entries()
            .iter()
            .filter_map(|e| serde_json::to_string(&e.record).ok())
            .map(|l| l + "\n")
            .collect()),
        // The key is resolved as every command's is (`crate::report::find`).
        Action::Discard { id } => {
            let found = crate::report::find::find(at.root, at.audit_dir, &id).map_err(Box::new)?;
            let entry = of_sandbox(
                &store,
                &found.root,
                found.id.as_str(),
                found.change.as_deref(),
            )?;
            let r = discard(entry)?;
            Ok(format!(
                "discarded {} ({})\n",
                r.change,
                printable(&r.container)
            ))
        }
        Action::Prune => {
            let removed = prune(&store, policy.filesystem.changes_max_total.bytes());
            let mut out: String = removed
                .iter()
                .map(|r| format!("removed {} ({})\n", r.change, printable(&r.container)))
                .collect();
            out.push_str(&format!("{} removed\n", removed.len()));
            Ok(out)
        }
    }
}

/// A name or path from a sandbox or a user, safe for a terminal: control characters escaped.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// The table of `agent-sandbox changes`.
pub fn table(entries: &[Entry]) -> String {
    let mut out = String::from(
        "CHANGE        CONTAINER     NAME                  ENTRY       STATE    SIZE       CREATED               WORKSPACE\n",
    );
    for e in entries {
        let r = &e.record;
        let state = if e.live().is_some() {
            "live"
        } else if r.empty {
            "empty"
        } else {
            "ended"
        };
        let size = r
            .size_bytes
            .map(|b| format!("{:.1}M", b as f64 / 1_048_576.0))
            .unwrap_or_else(|| "-".to_owned());
        let created = chrono::DateTime::from_timestamp(i64::try_from(r.created).unwrap_or(0), 0)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        // podman's 64-hex ids as their 12-character short form; other ids (ctr's) whole.
        let long_hex =
            r.container.len() == 64 && r.container.bytes().all(|b| b.is_ascii_hexdigit());
        let short: String = if long_hex {
            r.container.chars().take(12).collect()
        } else {
            r.container.clone()
        };
        out.push_str(&format!(
            "{:<13} {:<13} {:<21} {:<11} {:<8} {:<10} {:<21} {}\n",
            r.change,
            printable(&short),
            printable(r.name.as_deref().unwrap_or("-")),
            r.entry_point,
            state,
            size,
            created,
            printable(&r.workspace.display().to_string()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(change: &str, container: &str, name: Option<&str>, created: u64) -> Record {
        Record {
            change: change.to_owned(),
            container: container.to_owned(),
            name: name.map(str::to_owned),
            entry_point: "runtime".to_owned(),
            root: PathBuf::from("/nonexistent-root"),
            created,
            workspace: PathBuf::from("/w"),
            quota_bytes: None,
            keep_until: created + 100,
            ended: Some(created),
            size_bytes: Some(10),
            empty: false,
            checkpoints: vec![IMAGE.to_owned()],
        }
    }

    /// The digest of the image every test record was checkpointed to.
    const IMAGE: &str = "sha256:aaaa";

    /// The snapshot a checkpoint to `image` keeps of its change set's layer as it is now, if
    /// the change set is bound to the image.
    fn snapshot(store: &Store, image: &ImageRef<'_>) {
        let dir = store.dir.join(image.change);
        if let Ok(e) = Entry::load(&dir)
            && e.record.checkpoints.iter().any(|d| d == image.digest)
        {
            let p = crate::report::snapshots::pending(&dir).unwrap();
            crate::report::snapshots::copy_tree(&dir.join("upper"), &p.join("upper")).unwrap();
            crate::report::snapshots::keep(&dir, &p, image.digest).unwrap();
        }
    }

    /// A checkpoint's [`snapshot`], then [`copy_source`] and [`copy_layer`], as a fork's
    /// restore does.
    fn copy_layer(store: &Store, image: &ImageRef<'_>, root: &Path, into: &Created) -> Result<()> {
        snapshot(store, image);
        let source = copy_source(store, image, root, &into.entry.record.workspace)?;
        super::copy_layer(&source, into)
    }

    /// A sandbox that wrote nothing keeps its record and an empty upper dir, no layer: it is
    /// still found by its name, listed as empty, and opens as an empty change set.
    #[test]
    fn an_empty_change_set_keeps_only_its_record() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().to_owned(),
        };
        let mut r = record("c0ffee000001", "ctr-1", Some("nothing"), 1000);
        (r.ended, r.size_bytes) = (None, None);
        put(&store, r);
        let dir = store.dir.join("c0ffee000001");
        std::fs::create_dir_all(dir.join("work/work")).unwrap();
        let ws = WorkspaceOverlay {
            lower: PathBuf::from("/w"),
            upper: dir.join("upper"),
            change: Some("c0ffee000001".to_owned()),
            change_dir: Some(dir.clone()),
            held: None,
        };
        assert!(ended(&ws, true).is_none());
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [INDEX_FILE, "upper"]);
        let entry = store
            .entries()
            .into_iter()
            .find(|e| e.record.name.as_deref() == Some("nothing"))
            .unwrap();
        assert!(entry.record.empty && entry.record.ended.is_some());
        assert_eq!(entry.record.size_bytes, Some(0));
        let opened = open(&entry).unwrap();
        assert_eq!(std::fs::read_dir(&opened.upper).unwrap().count(), 0);
        assert!(table(&[entry]).lines().nth(1).unwrap().contains(" empty "));
        // A failed create leaves nothing.
        let mut r = record("c0ffee000002", "ctr-2", None, 1000);
        (r.ended, r.size_bytes) = (None, None);
        put(&store, r);
        let dir = store.dir.join("c0ffee000002");
        let ws = WorkspaceOverlay {
            upper: dir.join("upper"),
            change: Some("c0ffee000002".to_owned()),
            change_dir: Some(dir.clone()),
            ..ws
        };
        assert!(ended(&ws, false).is_none());
        assert!(!dir.exists());
    }

    fn put(store: &Store, r: Record) {
        let dir = store.dir.join(&r.change);
        std::fs::create_dir_all(dir.join("upper")).unwrap();
        Entry { dir, record: r }.save().unwrap();
    }

    #[test]
    fn a_sandboxs_change_set_is_its_only_one_or_the_one_named() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().to_owned(),
        };
        put(&store, record("aaaa11112222", "c0ffee01", Some("web"), 1));
        put(&store, record("cccc11112222", "reused", None, 3));
        put(&store, record("dddd11112222", "reused", None, 4));
        let root = Path::new("/nonexistent-root");
        let change =
            |id: &str, c: Option<&str>| of_sandbox(&store, root, id, c).map(|e| e.record.change);
        assert_eq!(change("c0ffee01", None).unwrap(), "aaaa11112222");
        assert_eq!(
            change("reused", Some("dddd11112222")).unwrap(),
            "dddd11112222"
        );
        assert!(matches!(
            change("reused", None),
            Err(ChangesError::Ambiguous { .. })
        ));
        assert!(matches!(
            change("zzz", None),
            Err(ChangesError::NotFound { .. })
        ));
        assert!(matches!(
            of_sandbox(&store, Path::new("/other"), "c0ffee01", None),
            Err(ChangesError::NotFound { .. })
        ));
    }

    #[test]
    fn prune_drops_expired_then_oldest_past_the_total() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().to_owned(),
        };
        let t = now();
        let mut old = record("000000000001", "a", None, t - 1000);
        old.keep_until = t - 1;
        put(&store, old);
        put(&store, record("000000000002", "b", None, t - 20));
        put(&store, record("000000000003", "c", None, t - 10));
        put(&store, record("000000000004", "d", None, t));
        let removed: Vec<String> = prune(&store, 20).into_iter().map(|r| r.change).collect();
        assert_eq!(removed, ["000000000001", "000000000002"]);
        let left: Vec<String> = store
            .entries()
            .into_iter()
            .map(|e| e.record.change)
            .collect();
        assert_eq!(left, ["000000000003", "000000000004"]);
    }

    #[test]
    fn records_are_replaced_atomically_and_names_are_escaped_in_the_table() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().to_owned(),
        };
        put(&store, record("eeee11112222", "x", Some("a\x1b[2Kb"), 5));
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("eeee11112222"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        let mode = std::fs::metadata(tmp.path().join("eeee11112222").join(INDEX_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let table = table(&store.entries());
        assert!(table.contains("a\\u{1b}[2Kb"), "{table}");
        assert!(!table.contains('\x1b'));
    }

    /// An import under a new id gets a copy of the named sandbox's ended layer (links as
    /// links), and nothing from another workspace's or a still-open change set.
    #[test]
    fn copy_layer_copies_an_ended_layer_of_the_same_workspace_only() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().join("store"),
        };
        put(&store, record("aaaa00000001", "old", None, 1));
        let upper = store.dir.join("aaaa00000001/upper");
        std::fs::create_dir(upper.join("sub")).unwrap();
        std::fs::write(upper.join("sub/notes.txt"), "edited\n").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", upper.join("link")).unwrap();
        let root = Path::new("/nonexistent-root");
        let into = |workspace: &str| Created {
            entry: Entry {
                dir: store.dir.join("bbbb00000002"),
                record: Record {
                    workspace: PathBuf::from(workspace),
                    ..record("bbbb00000002", "new", None, 2)
                },
            },
            base: tmp.path().join(format!("new{}", workspace.len())),
        };
        let image = |container, change| ImageRef {
            container,
            change,
            digest: IMAGE,
        };
        let new = into("/w");
        copy_layer(&store, &image("old", "aaaa00000001"), root, &new).unwrap();
        let copied = new.base.join("upper");
        assert_eq!(
            std::fs::read_to_string(copied.join("sub/notes.txt")).unwrap(),
            "edited\n"
        );
        assert_eq!(
            std::fs::read_link(copied.join("link")).unwrap(),
            Path::new("/etc/shadow")
        );
        let other = into("/other");
        assert!(matches!(
            copy_layer(&store, &image("old", "aaaa00000001"), root, &other),
            Err(ChangesError::OtherWorkspace { .. })
        ));
        assert!(!other.base.join("upper/sub").exists());
        // Another sandbox's change set is not found under this one's name.
        assert!(matches!(
            copy_layer(&store, &image("someone", "aaaa00000001"), root, &into("/w")),
            Err(ChangesError::NotFound { .. })
        ));
        // A change set whose sandbox runs on (not ended) is copied from its snapshot: what it
        // wrote after the checkpoint is not copied; without a snapshot nothing is.
        let mut open = record("cccc00000003", "old", None, 3);
        open.ended = None;
        put(&store, open);
        let open_upper = store.dir.join("cccc00000003/upper");
        std::fs::write(open_upper.join("before.txt"), "1").unwrap();
        assert!(matches!(
            copy_source(&store, &image("old", "cccc00000003"), root, Path::new("/w")),
            Err(ChangesError::NoSnapshot { .. })
        ));
        snapshot(&store, &image("old", "cccc00000003"));
        std::fs::write(open_upper.join("later.txt"), "2").unwrap();
        let source = copy_source(&store, &image("old", "cccc00000003"), root, Path::new("/w"));
        let third = into("/w3");
        super::copy_layer(
            &source.unwrap(),
            &Created {
                entry: Entry {
                    record: Record {
                        workspace: PathBuf::from("/w"),
                        ..third.entry.record.clone()
                    },
                    ..third.entry.clone()
                },
                base: third.base.clone(),
            },
        )
        .unwrap();
        assert!(third.base.join("upper/before.txt").exists());
        assert!(!third.base.join("upper/later.txt").exists());
    }

    /// The image's word alone opens nothing: a change set is reopened or copied only for an
    /// image whose digest its own checkpoint bound to it, and a refused copy copies nothing.
    #[test]
    fn a_change_set_is_reopened_or_copied_only_for_an_image_bound_to_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store {
            dir: tmp.path().join("store"),
        };
        let root = Path::new("/nonexistent-root");
        // B ended with edits kept, never checkpointed; A was checkpointed to IMAGE.
        let mut b = record("bbbb00000001", "b", None, 1);
        b.checkpoints.clear();
        put(&store, b);
        std::fs::write(store.dir.join("bbbb00000001/upper/secret"), "B's edit").unwrap();
        put(&store, record("aaaa00000002", "a", None, 2));
        let into = Created {
            entry: Entry {
                dir: store.dir.join("cccc00000003"),
                record: record("cccc00000003", "fork", None, 3),
            },
            base: tmp.path().join("fork"),
        };
        let refused = |got: Result<()>| {
            assert!(matches!(&got, Err(ChangesError::Unbound { .. })), "{got:?}");
            assert!(!into.base.join("upper/secret").exists());
        };
        // An image of A whose manifest names B's change set (and B): B's is bound to no image.
        let named_b = ImageRef {
            container: "b",
            change: "bbbb00000001",
            digest: IMAGE,
        };
        refused(copy_layer(&store, &named_b, root, &into));
        let mount = tmp.path().join("mnt");
        assert!(matches!(
            reopen(&store, &named_b, root, &mount),
            Err(ChangesError::Unbound { .. })
        ));
        // A's own change set, for an image of another digest (an edited image).
        let edited = ImageRef {
            container: "a",
            change: "aaaa00000002",
            digest: "sha256:bbbb",
        };
        refused(copy_layer(&store, &edited, root, &into));
        // Once bound (as B's checkpoint would), B's copy goes through, and the binding is
        // kept once.
        bind_checkpoint(&store.dir.join("bbbb00000001"), IMAGE).unwrap();
        bind_checkpoint(&store.dir.join("bbbb00000001"), IMAGE).unwrap();
        let entry = Entry::load(&store.dir.join("bbbb00000001")).unwrap();
        assert_eq!(entry.record.checkpoints, [IMAGE]);
        copy_layer(&store, &named_b, root, &into).unwrap();
        assert!(into.base.join("upper/secret").exists());
        let e = ChangesError::Unbound {
            change: "c".into(),
            digest: "d".into(),
        }
        .to_string();
        assert!(e.contains("docs/checkpoint.md#refused"), "{e}");
    }
}
