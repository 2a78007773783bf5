//! `checkpoint`: the sandbox's processes saved to an image by CRIU, with runc's flags
//! (podman and containerd's runc shim pass them; docs/checkpoint.md).
//!
//! The recipe: refuse what cannot be honoured (a flag, a rootless runtime, a layer the
//! policy requires that CRIU cannot carry), dump, then write what the sandbox needs beyond
//! CRIU's files into the image (`agent-sandbox.json`, [`Manifest`]) and a `checkpointed`
//! record naming the image's digest. Without `--leave-running` CRIU ends the processes and
//! the sandbox is deleted as runc destroys its container; its workspace changes stay in the
//! change store for review. While CRIU holds the dumped tasks stopped, the workspace's
//! upper layer is copied into a snapshot bound to the image's digest
//! (`crate::report::snapshots`): every restore of the image starts from it.

use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::layers::{Layer, LayerPlan, Requirement};
use libcontainer::container::ContainerStatus;
use libcontainer::oci_spec::runtime::Spec;
use serde::{Deserialize, Serialize};

use super::{LookupError, PlanError, Runtime, status_name};
use crate::host::console::TtyKey;
use crate::host::criu::{self, CriuError, External};
use crate::host::idmap::IdRange;
use crate::state::ContainerId;

/// The image format the runtime writes (`agent-sandbox.json`'s `format`).
pub(crate) const FORMAT: u32 = 1;

/// The runc flags `checkpoint` and `restore` share, by runc's names.
#[derive(Debug, Default, Clone)]
pub struct CriuFlags {
    pub image_path: PathBuf,
    pub work_path: Option<PathBuf>,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    pub shell_job: bool,
    pub file_locks: bool,
    pub manage_cgroups_mode: Option<String>,
    pub empty_ns: Vec<String>,
    pub auto_dedup: bool,
    pub lazy_pages: bool,
}

impl CriuFlags {
    /// CRIU's options for the switches both commands pass on as they are.
    pub(crate) fn criu_options(&self) -> Vec<String> {
        [
            (self.tcp_established, "--tcp-established"),
            (self.ext_unix_sk, "--ext-unix-sk"),
            (self.shell_job, "--shell-job"),
            (self.file_locks, "--file-locks"),
            (self.auto_dedup, "--auto-dedup"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| f.to_owned())
        .collect()
    }

    /// The shared flag the runtime cannot honour, if one is given: its name and why.
    pub(crate) fn refused(&self) -> Option<(&'static str, &'static str)> {
        if self.lazy_pages {
            return Some((
                "--lazy-pages",
                "memory restored on demand would run before the restored tasks are checked",
            ));
        }
        (!self.empty_ns.is_empty()).then_some((
            "--empty-ns",
            "every namespace of the sandbox is saved and restored with it",
        ))
    }
}

/// Options of `checkpoint`: runc's flags, by runc's names.
#[derive(Debug, Default, Clone)]
pub struct CheckpointOpts {
    pub criu: CriuFlags,
    pub leave_running: bool,
    pub pre_dump: bool,
    pub parent_path: Option<PathBuf>,
    pub status_fd: Option<i32>,
    pub page_server: Option<String>,
}

/// Errors of `checkpoint`.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "checkpoint needs root: CRIU saves a sandbox only for a runtime that is real root \
         in the host's user namespace (docs/checkpoint.md#rootless)"
    )]
    Rootless,
    #[error("{flag} is not supported: {why} (docs/checkpoint.md#flags)")]
    Unsupported {
        flag: &'static str,
        why: &'static str,
    },
    #[error(
        "--manage-cgroups-mode {mode:?} is not one of soft, full, strict, ignore \
         (docs/checkpoint.md#flags)"
    )]
    CgroupsMode { mode: String },
    #[error(
        "the {layer} layer cannot be carried by a checkpoint ({reason}) and the sandbox's \
         policy requires it (layers.{layer} = \"required\"; docs/checkpoint.md#layers)"
    )]
    LayerRequired { layer: String, reason: String },
    #[error("cannot create the image directory {path}")]
    ImageDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the sandbox's mounts ({path})")]
    Mounts {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox has no init process")]
    NoInit,
    #[error(
        "the sandbox's PID 1 is agent-sandbox's reaping init, which CRIU cannot save (it \
         runs the runtime's own binary, from outside the sandbox): give the sandbox an init \
         of its own (podman --init, tini) or resources.init = \"never\" \
         (docs/checkpoint.md#init)"
    )]
    ReaperInit,
    #[error(transparent)]
    Console(#[from] crate::host::console::ConsoleError),
    #[error(transparent)]
    Criu(#[from] CriuError),
    #[error("container {id} is {status}, not {wanted}")]
    WrongState {
        id: ContainerId,
        status: &'static str,
        wanted: &'static str,
    },
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("resume failed")]
    Resume(#[source] Box<libcontainer::error::LibcontainerError>),
    #[error("audit trail")]
    Audit(#[source] agent_sandbox_audit::AuditError),
    #[error(transparent)]
    Paths(#[from] crate::state::paths::PathsError),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(transparent)]
    IdMap(#[from] crate::host::idmap::IdMapError),
    #[error(transparent)]
    Delete(#[from] super::DeleteError),
    #[error("workspace changes")]
    Changes(#[source] crate::report::changes::ChangesError),
}

type Result<T> = std::result::Result<T, CheckpointError>;

/// What the sandbox needs beyond CRIU's files, kept in the image as `agent-sandbox.json`.
/// It is the image's word, not the host's: `restore` takes the policy, the id block and the
/// mounts' sources from the restoring sandbox and checks the tasks against them
/// (`enforce::restored`); from here it takes only what narrows (the wall clock used) or
/// names (the change set, the digest).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub format: u32,
    /// The sandbox the image was taken of.
    pub id: String,
    /// SHA-256 of the image's CRIU files.
    pub image_digest: String,
    /// The digest of the sandbox's effective policy (as its `create` record has it).
    pub plan_digest: String,
    /// The sandbox's host id block (CRIU's image holds its id maps).
    pub ids: IdRange,
    /// The wall clock the sandbox had used, pauses excluded, in milliseconds.
    pub wall_clock_used_ms: u64,
    /// The audit chain's end after the `checkpointed` record.
    pub audit_head: Option<agent_sandbox_audit::Anchor>,
    /// The mounts whose sources lie outside the sandbox (`host::criu::externals`).
    pub externals: Vec<External>,
    /// The sandbox's workspace change set, whose upper layer the restore mounts again.
    pub change: Option<String>,
    /// Layers the image does not carry, with the reason (all optional in the policy).
    pub not_carried: Vec<(String, String)>,
    /// The proxy's live egress rules (`allow`: true, else deny), oldest first: a restore
    /// applies again those its own ceiling covers (`sidecars::trail::live_rules`).
    #[serde(default)]
    pub live_rules: Vec<(bool, String)>,
    /// What the init's descriptors 0, 1 and 2 were (`pipe:[INODE]`, ...): restore hands the
    /// caller's own in their place, as runc does.
    #[serde(default)]
    pub stdio: Vec<String>,
    /// CRIU's name of the sandbox's terminal (`tty[RDEV:DEV]`), dumped as external: a
    /// restore hands CRIU a new terminal under this name (`host::console`). The image's
    /// word, checked for CRIU's form.
    #[serde(default)]
    pub terminal: Option<String>,
    /// The sandbox's credential placeholders (`SandboxPlan::credential_placeholders`), which
    /// its processes hold in their environment: a restore in place keeps them, a fork gets
    /// new ones (docs/checkpoint.md#fork). The image's word: one that is not a placeholder
    /// of its name is replaced.
    #[serde(default)]
    pub placeholders: std::collections::BTreeMap<String, String>,
    /// The sandbox's effective policy: a restore whose own policy changes a key the image
    /// carries is refused, naming it (`agent_sandbox_policy::carried`). The image's word: it
    /// only names keys; what CRIU restores is checked on its own (docs/checkpoint.md#fork).
    #[serde(default)]
    pub policy: Option<SandboxPolicy>,
}

impl Manifest {
    pub(crate) fn read(dir: &Path) -> std::result::Result<Self, crate::files::FileError> {
        crate::files::read_json(&dir.join(criu::MANIFEST))
    }

    /// Writes `agent-sandbox.json` into the image directory `dir`, mode 0600.
    fn write(&self, dir: &Path) -> std::result::Result<(), crate::files::FileError> {
        let path = dir.join(criu::MANIFEST);
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| crate::files::FileError::encode(&path, e))?;
        crate::files::write(&path, json)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| crate::files::FileError::write(&path, e))
    }
}

/// The layers of `plan` that a CRIU image does not carry, each with its requirement and
/// why. `supervised`: the denied-syscall supervisor holds the seccomp filter's listener.
pub(crate) fn not_carried(
    policy: &SandboxPolicy,
    plan: &LayerPlan,
    supervised: bool,
) -> Vec<(String, Requirement, String)> {
    let mut out = Vec::new();
    if plan.apply.contains(&Layer::Landlock) {
        out.push((
            "landlock".to_owned(),
            policy.layers.landlock,
            "CRIU does not save Landlock domains: restored processes would run without \
             theirs"
                .to_owned(),
        ));
    }
    if supervised {
        out.push((
            "syscall_audit".to_owned(),
            Requirement::Optional,
            "the seccomp filter's listener is not carried: after restore a denied syscall \
             fails with ENOSYS and is not recorded"
                .to_owned(),
        ));
    }
    out
}

impl CheckpointOpts {
    /// runc flags the runtime cannot honour: an error naming the flag, never silence.
    fn refuse_unsupported(&self) -> std::result::Result<(), CheckpointError> {
        let refused = if self.pre_dump {
            Some(("--pre-dump", INCREMENTAL))
        } else if self.parent_path.is_some() {
            Some(("--parent-path", INCREMENTAL))
        } else if self.status_fd.is_some_and(|fd| fd >= 0) {
            Some(("--status-fd", "it only serves --lazy-pages"))
        } else if self.page_server.is_some() {
            Some(("--page-server", "the image is written only to --image-path"))
        } else {
            self.criu.refused()
        };
        if let Some((flag, why)) = refused {
            return Err(CheckpointError::Unsupported { flag, why });
        }
        match self.criu.manage_cgroups_mode.as_deref() {
            None | Some("soft" | "full" | "strict" | "ignore") => Ok(()),
            Some(mode) => Err(CheckpointError::CgroupsMode {
                mode: mode.to_owned(),
            }),
        }
    }

    /// CRIU's options for these flags (besides the tree, the image and the mounts).
    fn criu_flags(&self) -> Vec<String> {
        let mut out = vec![format!(
            "--manage-cgroups={}",
            self.criu.manage_cgroups_mode.as_deref().unwrap_or("soft")
        )];
        if self.leave_running {
            out.push("--leave-running".to_owned());
        }
        out.extend(self.criu.criu_options());
        out
    }
}

/// Refuses a sandbox the image cannot carry whole: a layer its policy requires that CRIU
/// does not save, or the runtime's own reaping init. A terminal is carried: the dump names
/// it external and the restore hands over a new one (`host::console`).
fn refuse_uncarriable(
    carried: &[(String, Requirement, String)],
    policy: &SandboxPolicy,
    spec: &Spec,
) -> std::result::Result<(), CheckpointError> {
    if let Some((layer, _, reason)) = carried.iter().find(|(_, r, _)| *r == Requirement::Required) {
        return Err(CheckpointError::LayerRequired {
            layer: layer.clone(),
            reason: reason.clone(),
        });
    }
    if crate::enforce::reaper::wanted(policy, spec) {
        return Err(CheckpointError::ReaperInit);
    }
    Ok(())
}

/// Why `--pre-dump` and `--parent-path` are refused.
const INCREMENTAL: &str = "incremental images are not checked as a whole at restore";

impl Runtime {
    /// `checkpoint`: see the module docs.
    pub fn checkpoint(&self, id: &ContainerId, opts: &CheckpointOpts) -> Result<()> {
        opts.refuse_unsupported()?;
        if crate::state::paths::rootless()? {
            return Err(CheckpointError::Rootless);
        }
        let lock = self.state_lock(id)?;
        let mut c = self.load(id)?;
        if !matches!(
            c.status(),
            ContainerStatus::Running | ContainerStatus::Paused
        ) {
            return Err(CheckpointError::WrongState {
                id: id.clone(),
                status: status_name(c.status()),
                wanted: "running",
            });
        }
        let pid = c.pid().ok_or(CheckpointError::NoInit)?.as_raw();
        let (policy, plan, spec) = self.saved_policy(id, c.bundle())?;
        let dir = self.dirs.sandbox(id);
        let carried = not_carried(&policy, &plan, dir.supervisor_pid().exists());
        refuse_uncarriable(&carried, &policy, &spec)?;
        let record = self.record(id)?;
        let workspace: Option<crate::enforce::mounts::WorkspaceOverlay> =
            dir.workspace().read_if_present()?;
        let snapshot = Snapshot::prepare(workspace.as_ref()).map_err(CheckpointError::Changes)?;
        let stdio = (0..3)
            .map(|fd| {
                std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            })
            .collect();
        let Dumped {
            externals,
            terminal,
        } = self
            .dump_thawed(&mut c, id, pid, &record, &spec, opts, snapshot.as_ref())
            .inspect_err(|_| Snapshot::abandon(snapshot.as_ref()))?;
        let image_digest = criu::image_digest(&opts.criu.image_path)?;
        Snapshot::keep(snapshot.as_ref(), &image_digest).map_err(CheckpointError::Changes)?;
        let wall_clock_used_ms = wall_clock_used(&dir);
        let audit_head =
            crate::sidecars::trail::checkpointed(&self.dirs, id, &image_digest, opts.leave_running)
                .map_err(CheckpointError::Audit)?;
        let manifest = Manifest {
            format: FORMAT,
            id: id.as_str().to_owned(),
            image_digest,
            plan_digest: crate::sidecars::trail::policy_digest(&policy),
            ids: record.ids,
            wall_clock_used_ms,
            audit_head: Some(audit_head),
            externals,
            change: workspace.and_then(|w| w.change),
            not_carried: carried.into_iter().map(|(l, _, r)| (l, r)).collect(),
            live_rules: crate::sidecars::trail::live_rules(&self.dirs, id),
            stdio,
            terminal: terminal.map(|k| k.to_string()),
            placeholders: dir
                .plan()
                .read_if_present::<agent_sandbox_policy::SandboxPlan>()?
                .map(|p| p.credential_placeholders)
                .unwrap_or_default(),
            policy: Some(policy),
        };
        manifest.write(&opts.criu.image_path)?;
        tracing::info!(id = %id, digest = %manifest.image_digest, "checkpointed");
        drop(lock);
        if !opts.leave_running {
            // The image holds id maps of this block: it waits for the restore.
            crate::host::idmap::hold_for_checkpoint(
                &self.dirs.idmap_db(),
                &self.dirs.idmap_lock(),
                id,
                &opts.criu.image_path,
            )?;
            // As runc destroys its container: CRIU ended the processes.
            self.delete(id, true, None)?;
        }
        Ok(())
    }

    /// [`Self::dump`] of a sandbox that may be paused. CRIU seizes the tasks with ptrace, and
    /// a task the cgroup freezer holds sits in D state, unseizable ("Unseizable non-zombie
    /// ... state D"): ctr pauses a task before its checkpoint. Thawed for the dump, frozen
    /// again when the sandbox stays.
    #[allow(clippy::too_many_arguments)]
    fn dump_thawed(
        &self,
        c: &mut libcontainer::container::Container,
        id: &ContainerId,
        pid: i32,
        record: &super::SandboxRecord,
        spec: &oci_spec::runtime::Spec,
        opts: &CheckpointOpts,
        snapshot: Option<&Snapshot>,
    ) -> Result<Dumped> {
        let was_paused = c.status() == ContainerStatus::Paused;
        if was_paused {
            c.resume()
                .map_err(|e| CheckpointError::Resume(Box::new(e)))?;
        }
        let dumped = self.dump(pid, record, spec, opts, snapshot);
        if was_paused
            && (opts.leave_running || dumped.is_err())
            && let Err(e) = c.pause()
        {
            tracing::warn!(id = %id, error = %e, "cannot freeze the sandbox again after its dump");
        }
        dumped
    }

    /// Runs `criu dump` of the tree of `pid` into the image directory, its action script
    /// copying the workspace into `snapshot` at `post-dump`; returns the external mounts and
    /// terminal it was told about.
    fn dump(
        &self,
        pid: i32,
        record: &super::SandboxRecord,
        spec: &libcontainer::oci_spec::runtime::Spec,
        opts: &CheckpointOpts,
        snapshot: Option<&Snapshot>,
    ) -> std::result::Result<Dumped, CheckpointError> {
        let runner = criu::Runner::locate()?;
        private_dir(&opts.criu.image_path)?;
        if let Some(work) = &opts.criu.work_path {
            private_dir(work)?;
        }
        let info_path = PathBuf::from(format!("/proc/{pid}/mountinfo"));
        let info =
            std::fs::read_to_string(&info_path).map_err(|source| CheckpointError::Mounts {
                path: info_path,
                source,
            })?;
        let externals = criu::externals(&info)?;
        let root = spec
            .root()
            .as_ref()
            .map_or_else(|| record.rootfs_mount.clone(), |r| r.path().clone());
        let mut args = vec![
            // Binds from the host are slaves of host mounts (the workspace overlay, volumes).
            "--enable-external-masters".to_owned(),
            "--enable-external-sharing".to_owned(),
            "--tree".to_owned(),
            pid.to_string(),
            "--images-dir".to_owned(),
            opts.criu.image_path.display().to_string(),
            "--root".to_owned(),
            root.display().to_string(),
        ];
        args.extend(opts.criu_flags());
        for e in &externals {
            args.push("--ext-mount-map".to_owned());
            args.push(format!("{0}:{0}", e.dest()));
        }
        // The terminal's master is the engine's, outside the sandbox: its slave is named
        // external, and a restore hands over a new one (docs/checkpoint.md#terminals).
        let terminal = if spec.process().as_ref().and_then(|p| p.terminal()) == Some(true) {
            TtyKey::of_init(Path::new("/proc"), pid)?
        } else {
            None
        };
        if let Some(key) = terminal {
            args.push("--external".to_owned());
            args.push(key.to_string());
        }
        // CRIU reads each process's rlimits with prlimit, which a root without
        // CAP_SYS_RESOURCE may do only as the processes' own user.
        let as_uid = criu::needs_sandbox_uid().then_some(record.ids.host_start);
        if as_uid.is_some() {
            args.push("--unprivileged".to_owned());
            // The sandbox's host root writes the image (its log too): it must be able to.
            // The caller's work directory is left as it is.
            chown_dir(&opts.criu.image_path, record.ids.host_start)?;
        }
        let mut env = Vec::new();
        // Held until CRIU is done: it runs the script from the runtime's descriptor.
        let mut script = None;
        if let Some(s) = snapshot {
            // While CRIU holds the tasks stopped, after the image is written: the runtime's
            // own binary copies the layer (`crate::report::snapshots::run_hook`).
            let exe = std::env::current_exe().map_err(|source| CheckpointError::ImageDir {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })?;
            let made = script.insert(criu::ActionScript::for_exe_at(&exe, "post-dump"));
            args.push("--action-script".to_owned());
            args.push(made.path().display().to_string());
            env.push((crate::report::snapshots::HOOK_ENV, s.hook_env()));
        }
        let ran = runner.run(
            "dump",
            &args,
            &opts.criu.image_path,
            "dump.log",
            as_uid,
            &env,
        );
        drop(script);
        // Nobody else reads the image: its pages are the sandbox's memory.
        private_files(&opts.criu.image_path)?;
        if let Some(work) = &opts.criu.work_path {
            // Where runc leaves CRIU's log and statistics (podman reads and exports them).
            for file in ["dump.log", "stats-dump"] {
                let _ = std::fs::copy(opts.criu.image_path.join(file), work.join(file));
            }
        }
        ran?;
        Ok(Dumped {
            externals,
            terminal,
        })
    }
}

/// What a dump told CRIU was outside the sandbox: its mounts and its terminal.
struct Dumped {
    externals: Vec<External>,
    terminal: Option<TtyKey>,
}

/// The workspace snapshot a checkpoint takes of the sandbox's change set, if it has one
/// (`crate::report::snapshots`).
pub(crate) struct Snapshot {
    /// The change set's entry in the store.
    entry_dir: PathBuf,
    /// The live upper layer.
    upper: PathBuf,
    /// Where the hook copies it.
    pending: PathBuf,
}

impl Snapshot {
    fn prepare(
        workspace: Option<&crate::enforce::mounts::WorkspaceOverlay>,
    ) -> std::result::Result<Option<Snapshot>, crate::report::changes::ChangesError> {
        let Some(ws) = workspace else {
            return Ok(None);
        };
        let entry_dir = match (&ws.change_dir, &ws.change) {
            (Some(dir), _) => dir.clone(),
            (None, Some(change)) => crate::report::changes::Store::locate()?.dir.join(change),
            (None, None) => return Ok(None),
        };
        crate::report::snapshots::drop_pending(&entry_dir);
        let pending = crate::report::snapshots::pending(&entry_dir)?;
        Ok(Some(Snapshot {
            entry_dir,
            upper: ws.upper.clone(),
            pending,
        }))
    }

    fn hook_env(&self) -> String {
        crate::report::snapshots::hook_env(&self.upper, &self.pending)
    }

    fn abandon(snapshot: Option<&Snapshot>) {
        if let Some(s) = snapshot {
            let _ = std::fs::remove_dir_all(&s.pending);
        }
    }

    /// The snapshot kept as the image `digest`'s, and the change set bound to the image (in
    /// its own record, in the root-owned store): a restore reuses a change set only for an
    /// image whose digest its checkpoint bound, whatever an image's manifest names.
    fn keep(
        snapshot: Option<&Snapshot>,
        digest: &str,
    ) -> std::result::Result<(), crate::report::changes::ChangesError> {
        let Some(s) = snapshot else {
            return Ok(());
        };
        crate::report::snapshots::keep(&s.entry_dir, &s.pending, digest)?;
        crate::report::changes::bind_checkpoint(&s.entry_dir, digest)
    }
}

/// Creates `dir` (and its parents) if missing, mode 0700.
fn private_dir(dir: &Path) -> std::result::Result<(), CheckpointError> {
    crate::files::create_private_dir(dir).map_err(|source| CheckpointError::ImageDir {
        path: dir.to_owned(),
        source,
    })
}

fn chown_dir(dir: &Path, uid: u32) -> std::result::Result<(), CheckpointError> {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).map_err(|source| {
        CheckpointError::ImageDir {
            path: dir.to_owned(),
            source,
        }
    })
}

/// The files in `dir` readable by their owner only (root, or the sandbox's host root id
/// that dumped them and that restores them).
fn private_files(dir: &Path) -> std::result::Result<(), CheckpointError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |path: &Path, source| CheckpointError::ImageDir {
        path: path.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(|e| err(dir, e))? {
        let path = entry.map_err(|e| err(dir, e))?.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| err(&path, e))?;
        if meta.file_type().is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| err(&path, e))?;
        }
    }
    Ok(())
}

/// The wall clock the sandbox has used: since `start`, pauses excluded.
fn wall_clock_used(dir: &crate::state::SandboxDir) -> u64 {
    let (Some(now), Ok(started)) = (
        crate::enforce::init_exec::uptime(),
        std::fs::read_to_string(dir.started()),
    ) else {
        return 0;
    };
    let Ok(started) = started.trim().parse::<f64>() else {
        return 0;
    };
    let ran = std::time::Duration::from_secs_f64((now - started).max(0.0));
    let used = ran.saturating_sub(super::pause::frozen_so_far(dir));
    u64::try_from(used.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_cannot_be_honoured_are_refused_by_name() {
        let base = CheckpointOpts::default();
        let criu = |f: CriuFlags| CheckpointOpts {
            criu: f,
            ..CheckpointOpts::default()
        };
        for (opts, flag) in [
            (
                CheckpointOpts {
                    pre_dump: true,
                    ..base.clone()
                },
                "--pre-dump",
            ),
            (
                CheckpointOpts {
                    parent_path: Some("/p".into()),
                    ..base.clone()
                },
                "--parent-path",
            ),
            (
                criu(CriuFlags {
                    lazy_pages: true,
                    ..CriuFlags::default()
                }),
                "--lazy-pages",
            ),
            (
                CheckpointOpts {
                    page_server: Some("10.0.0.1:27".into()),
                    ..base.clone()
                },
                "--page-server",
            ),
            (
                criu(CriuFlags {
                    empty_ns: vec!["network".into()],
                    ..CriuFlags::default()
                }),
                "--empty-ns",
            ),
        ] {
            let e = opts.refuse_unsupported().unwrap_err().to_string();
            assert!(e.starts_with(flag), "{e}");
            assert!(e.contains("docs/checkpoint.md#flags"), "{e}");
        }
        let bad = criu(CriuFlags {
            manage_cgroups_mode: Some("loose".into()),
            ..CriuFlags::default()
        });
        assert!(
            bad.refuse_unsupported()
                .unwrap_err()
                .to_string()
                .contains("\"loose\"")
        );
        // runc's default status fd (-1) is no request.
        let fine = CheckpointOpts {
            status_fd: Some(-1),
            leave_running: true,
            criu: CriuFlags {
                tcp_established: true,
                ..CriuFlags::default()
            },
            ..base
        };
        fine.refuse_unsupported().unwrap();
        assert_eq!(
            fine.criu_flags(),
            [
                "--manage-cgroups=soft",
                "--leave-running",
                "--tcp-established"
            ]
        );
    }

    #[test]
    fn landlock_is_not_carried_and_its_requirement_decides() {
        let mut policy = SandboxPolicy::builtin("agent").unwrap();
        let plan = LayerPlan {
            apply: vec![Layer::Seccomp, Layer::Landlock],
            inactive: Vec::new(),
            landlock: None,
        };
        let got = not_carried(&policy, &plan, true);
        let names: Vec<_> = got.iter().map(|(l, r, _)| (l.as_str(), *r)).collect();
        assert_eq!(
            names,
            [
                ("landlock", Requirement::Required),
                ("syscall_audit", Requirement::Optional)
            ]
        );
        policy.layers.landlock = Requirement::Optional;
        assert_eq!(
            not_carried(&policy, &plan, false)[0].1,
            Requirement::Optional
        );
        let no_landlock = LayerPlan {
            apply: vec![Layer::Seccomp],
            ..plan
        };
        assert!(not_carried(&policy, &no_landlock, false).is_empty());
    }
}
