//! `restore`: a sandbox made again from a checkpoint image (runc's contract; podman's
//! `container restore`, also after `--import`; docs/checkpoint.md).
//!
//! A restored sandbox is a created one whose processes come from CRIU instead of
//! libcontainer: the same phases give it its id block, effective policy and plan (from the
//! restoring bundle and the ceiling, never from the image), mounts, workspace overlay (its
//! ended change set reopened for the same id) and egress proxy. Then:
//!
//! 1. the sandbox's cgroup is made and limited, and CRIU runs inside it, in a new cgroup
//!    namespace rooted there, so every restored task starts in the sandbox's cgroup;
//! 2. CRIU's pre-resume hook (the hidden `restore-check`) checks every restored task
//!    against the plan while CRIU still holds them stopped (`enforce::restored`), and kills
//!    them on any difference: no restored instruction runs unchecked;
//! 3. libcontainer's state is written for the restored init, the proxy is tied to its
//!    network namespace, the wall-clock watchdog owes only what was left, and the first
//!    audit record is `restored`, naming the image's digest.

use std::path::{Path, PathBuf};

use agent_sandbox_policy::layers::{Layer, Requirement};
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::Spec;

use super::{CreateError, Hardened, Host, Ids, Marks, Result};
use crate::enforce::restored::{self, Expected, ExpectedMounts};
use crate::harden::Ceiling;
use crate::host::console::{NewTerminal, TtyKey};
use crate::host::criu::{self, CriuError};
use crate::host::criu_image;
use crate::lifecycle::checkpoint::{CriuFlags, FORMAT, Manifest, not_carried};
use crate::lifecycle::{CreateOpts, RestoredChange, Runtime};
use crate::state::ContainerId;

/// Options of `restore`: runc's flags, by runc's names.
#[derive(Debug, Default, Clone)]
pub struct RestoreOpts {
    pub create: CreateOpts,
    pub criu: CriuFlags,
    pub detach: bool,
    pub lsm_profile: Option<String>,
    pub lsm_mount_context: Option<String>,
}

/// Errors of `restore`.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "restore needs root: CRIU restores a sandbox only for a runtime that is real root in \
         the host's user namespace (docs/checkpoint.md#rootless)"
    )]
    Rootless,
    #[error("{flag} is not supported: {why} (docs/checkpoint.md#flags)")]
    Unsupported {
        flag: &'static str,
        why: &'static str,
    },
    #[error("{path} is not an agent-sandbox checkpoint image (docs/checkpoint.md#image)")]
    Manifest {
        path: PathBuf,
        #[source]
        source: crate::files::FileError,
    },
    #[error("checkpoint image format {found} is not {FORMAT} (docs/checkpoint.md#image)")]
    Format { found: u32 },
    #[error(
        "the image was taken with host ids {image_start}+{image_size}, the sandbox has \
         {start}+{size}: CRIU would restore the image's id maps (docs/checkpoint.md#refused)"
    )]
    IdBlock {
        image_start: u32,
        image_size: u32,
        start: u32,
        size: u32,
    },
    #[error(
        "the {layer} layer cannot be restored from a checkpoint ({reason}) and the \
         sandbox's policy requires it (layers.{layer} = \"required\"; docs/checkpoint.md#layers)"
    )]
    LayerRequired { layer: String, reason: String },
    #[error("a Kubernetes pod member cannot be restored alone (docs/checkpoint.md#refused)")]
    PodMember,
    #[error(transparent)]
    Criu(#[from] CriuError),
    #[error(transparent)]
    Check(#[from] restored::RestoredError),
    #[error(
        "the image's seccomp filters are not the sandbox's: CRIU would restore them \
         (docs/checkpoint.md#refused)"
    )]
    ImageSeccomp(#[source] criu_image::CriuImageError),
    #[error("the check of the restored tasks did not pass: {verdict}")]
    Verdict { verdict: String },
    #[error("cannot prepare the image directory {path} for CRIU")]
    ImageDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot apply a live egress rule of the image again")]
    LiveRule(#[source] Box<crate::sidecars::allow::AllowError>),
    #[error("cannot place CRIU in the sandbox's cgroup")]
    Cgroup(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(
        "the image's manifest names digest {named}, its files have {computed} \
         (docs/checkpoint.md#refused)"
    )]
    Digest { named: String, computed: String },
    #[error("cannot copy the checkpoint image (docs/checkpoint.md#image)")]
    Copy(#[source] criu_image::CriuImageError),
    #[error("cannot give the fork its own host id block (docs/checkpoint.md#fork)")]
    ForkIds(#[source] criu_image::CriuImageError),
    #[error("cannot re-own the fork's copy of the workspace changes (docs/checkpoint.md#fork)")]
    Reown(#[source] crate::host::reown::ReownError),
    #[error(
        "the image's sandbox had a terminal: restore needs --console-socket, where its new \
         terminal goes (docs/checkpoint.md#terminals)"
    )]
    NoConsoleSocket,
    #[error(
        "--console-socket was given, but the image's sandbox had no terminal \
         (docs/checkpoint.md#terminals)"
    )]
    NoTerminal,
    #[error(transparent)]
    Terminal(#[from] crate::host::console::ConsoleError),
    #[error(
        "the restoring policy changes {key}, which the checkpoint image carries as its sandbox \
         had it ({carried_by}): a restore or a fork may change only the keys it applies again \
         (docs/checkpoint.md#the-policy-of-a-fork)"
    )]
    CarriedKey {
        key: &'static str,
        carried_by: &'static str,
    },
    #[error(
        "the image's manifest names no policy (an image of an older agent-sandbox, or an edited \
         one): what the image carries of its sandbox's policy cannot be compared with the \
         restoring one; checkpoint the sandbox again (docs/checkpoint.md#the-policy-of-a-fork)"
    )]
    NoPolicy,
}

fn fail(e: RestoreError) -> CreateError {
    CreateError::Restore(Box::new(e))
}

impl RestoreOpts {
    /// runc flags the runtime cannot honour: an error naming the flag, never silence.
    fn refuse_unsupported(&self) -> std::result::Result<(), RestoreError> {
        let refused = if self.lsm_profile.is_some() || self.lsm_mount_context.is_some() {
            Some((
                "--lsm-profile",
                "the sandbox's own AppArmor profile is applied, not one the caller names",
            ))
        } else if self
            .criu
            .manage_cgroups_mode
            .as_deref()
            .is_some_and(|m| m != "ignore")
        {
            Some((
                "--manage-cgroups-mode",
                "the runtime places the restored tasks in the sandbox's own cgroup itself",
            ))
        } else {
            self.criu.refused()
        };
        match refused {
            Some((flag, why)) => Err(RestoreError::Unsupported { flag, why }),
            None => Ok(()),
        }
    }
}

impl Runtime {
    /// `restore`: see the module docs.
    pub fn restore(&self, id: &ContainerId, opts: &RestoreOpts, ceiling: &Ceiling) -> Result<()> {
        opts.refuse_unsupported().map_err(fail)?;
        if crate::state::paths::rootless()? {
            return Err(fail(RestoreError::Rootless));
        }
        if self.dirs.container(id).exists() || self.dirs.sandbox(id).exists() {
            return Err(CreateError::Exists { id: id.clone() });
        }
        let config = opts.create.bundle.join("config.json");
        let spec = Spec::load(&config).map_err(|source| CreateError::BundleConfig {
            path: config.clone(),
            source,
        })?;
        let marks = Marks::start();
        let image = self.dirs.sandbox(id).restore_image();
        let manifest = self
            .private_image(id, &opts.criu.image_path, &image)
            .inspect_err(|_| {
                let _ = std::fs::remove_dir_all(self.dirs.sandbox(id).path());
            })?;
        marks.mark("image_copy");
        let mut restored_pid = None;
        let result = self.restore_inner(
            id,
            opts,
            &image,
            spec,
            ceiling,
            &manifest,
            &marks,
            &mut restored_pid,
        );
        if result.is_err() {
            if let Some(pid) = restored_pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            self.cleanup_sandbox(id);
        }
        marks.finish(id.as_str(), result.is_ok());
        result
    }

    /// The image's private copy at `copy`, in the sandbox's own directory (made here), and
    /// its manifest: every later check and CRIU read the copy, which the user cannot edit.
    fn private_image(&self, id: &ContainerId, image: &Path, copy: &Path) -> Result<Manifest> {
        crate::enforce::mounts::mkdir_traversable(self.dirs.sandbox(id).path())?;
        let private = copy.parent().unwrap_or(copy);
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(private)
            .map_err(|source| {
                fail(RestoreError::ImageDir {
                    path: private.to_owned(),
                    source,
                })
            })?;
        criu_image::private_copy(image, copy).map_err(|e| fail(RestoreError::Copy(e)))?;
        let manifest = Manifest::read(copy).map_err(|source| {
            fail(RestoreError::Manifest {
                path: image.join(criu::MANIFEST),
                source,
            })
        })?;
        if manifest.format != FORMAT {
            return Err(fail(RestoreError::Format {
                found: manifest.format,
            }));
        }
        if manifest.policy.is_none() {
            return Err(fail(RestoreError::NoPolicy));
        }
        // Of the copy, before a fork rewrites its id maps: the digest the change set's
        // binding is checked against, and the one the `restored` record names.
        let computed = criu::image_digest(copy).map_err(|e| fail(e.into()))?;
        if computed != manifest.image_digest {
            return Err(fail(RestoreError::Digest {
                named: manifest.image_digest,
                computed,
            }));
        }
        Ok(manifest)
    }

    /// The recipe: create's phases up to the mounts, then CRIU instead of libcontainer.
    #[allow(clippy::too_many_arguments)]
    fn restore_inner(
        &self,
        id: &ContainerId,
        opts: &RestoreOpts,
        image: &Path,
        spec: Spec,
        ceiling: &Ceiling,
        manifest: &Manifest,
        marks: &Marks,
        restored_pid: &mut Option<i32>,
    ) -> Result<()> {
        // `criu --version` runs while the sandbox is prepared; read before CRIU runs.
        let criu = criu::Runner::start_locating();
        let mut spec = spec;
        agent_sandbox_policy::profiles::annotation_from_env(&mut spec)
            .map_err(|e| CreateError::Sandbox(crate::harden::SandboxError::Harden(e)))?;
        terminal(opts, manifest).map_err(fail)?;
        let member = matches!(
            crate::pod::role(&spec, id)?,
            crate::pod::Role::Member { .. }
        );
        let ids = self.restore_ids(id, &spec, member, image, manifest)?;
        let annotations = spec.annotations().clone().unwrap_or_default();
        let ceiling = &ids
            .ceiling(ceiling)
            .with_profile_for(&annotations, &self.profiles_dir)?;
        // The change set the image names: this id's own is reopened; another sandbox's
        // (an `--import` under a new name) is copied, if it is of the same workspace.
        let mut create = opts.create.clone();
        create.reuse_change = manifest.change.as_ref().map(|change| RestoredChange {
            change: change.clone(),
            from: manifest.id.clone(),
            image_digest: manifest.image_digest.clone(),
            reown: is_fork(id, manifest).then_some((manifest.ids, ids.ids)),
        });
        create.keep_placeholders = kept_placeholders(id, manifest);
        create.image_policy = manifest.policy.clone().map(Box::new);
        let mut host = self.prepare_host(id, &create, &spec, &ids, ceiling, marks)?;
        let (mut hardened, mut executor) =
            self.harden(id, &create, spec, &ids, ceiling, &mut host)?;
        let lost = self.layers_not_restored(id, &mut hardened, manifest)?;
        self.install(id, &ids, &host, &hardened)?;
        marks.mark("mounts");
        let proxy = self.prespawn_restored_proxy(id, &host, &hardened)?;
        marks.mark("proxy");
        // The supervisor answers the denied syscalls of every later exec (the restored
        // tasks' own filters have no listener: see `not_carried`).
        // A checkpointed sandbox has no reaper: its wall clock is a watchdog of its own.
        let supervisor =
            self.notify_denials(id, &mut executor, &hardened.plan.policy, true, false)?;
        marks.mark("supervisor");
        let expected = Expected {
            ids: ids.ids,
            seccomp_filters: u32::from(executor.seccomp.is_some())
                + u32::try_from(executor.requested_seccomp.len()).unwrap_or(u32::MAX),
            host_ns: Expected::host_namespaces(Path::new("/proc"), "self")
                .map_err(|e| fail(e.into()))?,
            mounts: ExpectedMounts::of_spec(&hardened.spec, |p| Path::new(p).exists()),
        };
        // Before CRIU reads the image: the filters it would give every thread are exactly
        // the ones the executor installs (the pre-resume check sees only their count).
        criu_image::check_seccomp(image, &filter_slots(&executor))
            .map_err(|e| fail(RestoreError::ImageSeccomp(e)))?;
        let pid =
            self.run_criu_restore(criu, id, opts, image, &host, &hardened, manifest, &expected)?;
        *restored_pid = Some(pid);
        marks.mark("criu");
        if let Some(s) = supervisor {
            s.ready(pid).map_err(CreateError::SyscallAudit)?;
        }
        self.record_restored(
            id, opts, &ids, &host, &hardened, pid, proxy, manifest, &lost,
        )?;
        marks.mark("record");
        Ok(())
    }

    /// The restoring sandbox's host id block. Restored under the image's own sandbox id, it
    /// is the image's block (held for it since the checkpoint, or free), and nothing else
    /// will do. Under another id (a fork: podman's `--import` with `--name`), it is a new
    /// block from the allocator, whatever the image's block is doing, and the image copy's
    /// id maps are moved to it (docs/checkpoint.md#fork).
    fn restore_ids(
        &self,
        id: &ContainerId,
        spec: &Spec,
        member: bool,
        image: &Path,
        manifest: &Manifest,
    ) -> Result<Ids> {
        let fork = is_fork(id, manifest);
        if !member && !fork && !crate::state::paths::rootless()? {
            // The image's block, if it waits for this sandbox or is free (`assign_ids`
            // then finds it allocated).
            crate::host::idmap::allocate_for_restore(
                &self.dirs.idmap_db(),
                &self.dirs.idmap_lock(),
                id,
                manifest.ids.host_start,
            )?;
        }
        let ids = self.assign_ids(id, spec)?;
        if ids.member.is_some() {
            return Err(fail(RestoreError::PodMember));
        }
        if fork {
            criu_image::rebase_userns(image, manifest.ids, ids.ids)
                .map_err(|e| fail(RestoreError::ForkIds(e)))?;
            tracing::info!(id = %id, from = %manifest.id, start = ids.ids.host_start,
                image_start = manifest.ids.host_start, "fork: a host id block of its own");
        } else if ids.ids != manifest.ids {
            return Err(fail(RestoreError::IdBlock {
                image_start: manifest.ids.host_start,
                image_size: manifest.ids.size,
                start: ids.ids.host_start,
                size: ids.ids.size,
            }));
        }
        Ok(ids)
    }

    /// The layers the image cannot bring back: a required one refuses the restore; the
    /// others leave the plan as inactive with the reason (`layers` and the audit say so).
    /// The saved plan names Landlock as not restored and keeps it for later execs.
    fn layers_not_restored(
        &self,
        id: &ContainerId,
        hardened: &mut Hardened,
        manifest: &Manifest,
    ) -> Result<Vec<(String, String)>> {
        let mut lost: Vec<(String, String)> = Vec::new();
        for (layer, requirement, reason) in
            not_carried(&hardened.plan.policy, &hardened.plan.layers, false)
        {
            if requirement == Requirement::Required {
                return Err(fail(RestoreError::LayerRequired { layer, reason }));
            }
            lost.push((layer, reason));
        }
        if let Some((_, reason)) = lost.iter().find(|(l, _)| l == "landlock") {
            let restored = hardened.plan.restored_without(Layer::Landlock, reason);
            self.dirs.sandbox(id).plan().write(&hardened.plan)?;
            hardened.plan.layers = restored;
        }
        // What the image says it lost (the denied-syscall listener) is reported too: it
        // can only add to what is reported, never take a check away.
        for (layer, reason) in &manifest.not_carried {
            if !lost.iter().any(|(l, _)| l == layer) {
                lost.push((layer.clone(), reason.clone()));
            }
        }
        lost.push((
            "ucounts".to_owned(),
            "CRIU makes the restored user namespace: the policy's [ucounts] caps are not \
             written in it"
                .to_owned(),
        ));
        Ok(lost)
    }

    fn prespawn_restored_proxy(
        &self,
        id: &ContainerId,
        host: &Host,
        hardened: &Hardened,
    ) -> Result<Option<Box<dyn super::host_procs::StartingProxy>>> {
        if !crate::sidecars::egress::wanted(&hardened.plan.policy) {
            return Ok(None);
        }
        self.procs()
            .prespawn_proxy(&self.dirs.root, &host.sandbox_dir, id.as_str())
            .map(Some)
            .map_err(CreateError::Egress)
    }

    /// CRIU restores the tree of the image copy `image` inside the sandbox's cgroup; its
    /// pre-resume hook checks every task. Returns the restored init's host pid.
    #[allow(clippy::too_many_arguments)]
    fn run_criu_restore(
        &self,
        criu: criu::Locating,
        id: &ContainerId,
        opts: &RestoreOpts,
        image: &Path,
        host: &Host,
        hardened: &Hardened,
        manifest: &Manifest,
        expected: &Expected,
    ) -> Result<i32> {
        let runner = criu.finish().map_err(|e| fail(e.into()))?;
        let dir = &host.sandbox_dir;
        dir.restore_check().write(expected)?;
        let (hook, hook_env) = hook(&self.dirs.root, id).map_err(fail)?;
        let script = criu::ActionScript::for_exe(&hook);
        let _ = std::fs::remove_file(dir.restore_verdict());
        // Held until CRIU is done: CRIU inherits its slave.
        let terminal = new_terminal(opts, manifest, expected.ids.host_start)?;
        let work = opts
            .criu
            .work_path
            .clone()
            .unwrap_or_else(|| opts.criu.image_path.clone());
        let cgroups =
            SandboxCgroup::join(&hardened.spec, id, hardened.cgroups.systemd()).map_err(fail)?;
        let root = hardened
            .spec
            .root()
            .as_ref()
            .map_or_else(|| host.record.rootfs_mount.clone(), |r| r.path().clone());
        let mut args = vec![
            "--images-dir".to_owned(),
            image.display().to_string(),
            "--root".to_owned(),
            root.display().to_string(),
            "--manage-cgroups=ignore".to_owned(),
            "--enable-external-masters".to_owned(),
            "--enable-external-sharing".to_owned(),
            "--restore-detached".to_owned(),
            "--action-script".to_owned(),
            script.path().display().to_string(),
        ];
        args.extend(opts.criu.criu_options());
        args.extend(inherit_stdio(&manifest.stdio));
        if let Some((key, t)) = &terminal {
            args.extend(t.inherit_args(*key));
        }
        let console = terminal.as_ref().map(|(_, t)| t.path());
        let uid = expected.ids.host_start;
        let ran = external_args(&manifest.externals, &hardened.spec, &cgroups.dirs, console)
            .and_then(|ext| {
                args.extend(ext);
                image_access(image, uid)
            })
            .map_err(fail)
            .map(|()| {
                runner.restore_in_new_cgroupns(&args, (HOOK_ENV, &hook_env), &work, "restore.log")
            });
        // Whatever happened: the runtime back in its own cgroup, the copy gone (CRIU no
        // longer needs it; on tmpfs it holds memory).
        cgroups.leave();
        if let Err(e) = std::fs::remove_dir_all(image.parent().unwrap_or(image)) {
            tracing::warn!(path = %image.display(), error = %e, "cannot remove the image copy");
        }
        let ran = ran?;
        // The check's verdict first: a refusal ends CRIU too (`restore_check`).
        let verdict = std::fs::read_to_string(dir.restore_verdict()).unwrap_or_default();
        if let Some(pid) = verdict
            .strip_prefix("ok ")
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            ran.map_err(|e| fail(e.into()))?;
            return Ok(pid);
        }
        if verdict.trim().is_empty() {
            ran.map_err(|e| fail(e.into()))?;
        }
        Err(fail(RestoreError::Verdict {
            verdict: if verdict.trim().is_empty() {
                "the check never ran".to_owned()
            } else {
                verdict.trim().to_owned()
            },
        }))
    }
}

/// The image's terminal and the console socket its new one's master goes to: both or
/// neither (docs/checkpoint.md#terminals).
fn terminal<'a>(
    opts: &'a RestoreOpts,
    manifest: &Manifest,
) -> std::result::Result<Option<(TtyKey, &'a Path)>, RestoreError> {
    match (&manifest.terminal, &opts.create.console_socket) {
        (Some(key), Some(socket)) => Ok(Some((TtyKey::parse(key)?, socket.as_path()))),
        (Some(_), None) => Err(RestoreError::NoConsoleSocket),
        (None, Some(_)) => Err(RestoreError::NoTerminal),
        (None, None) => Ok(None),
    }
}

/// The restored sandbox's new terminal, if the image's sandbox had one: its master sent to
/// the console socket, its slave given to `uid` (the sandbox's host root id) for CRIU.
fn new_terminal(
    opts: &RestoreOpts,
    manifest: &Manifest,
    uid: u32,
) -> Result<Option<(TtyKey, NewTerminal)>> {
    let Some((key, socket)) = terminal(opts, manifest).map_err(fail)? else {
        return Ok(None);
    };
    let made = NewTerminal::make(uid, socket).map_err(|e| fail(e.into()))?;
    Ok(Some((key, made)))
}

/// A restore under another id than the image's sandbox: a fork (docs/checkpoint.md#fork).
fn is_fork(id: &ContainerId, manifest: &Manifest) -> bool {
    manifest.id != id.as_str()
}

/// The credential placeholders a restore keeps: the restored processes hold the image's in
/// their environment, so a restore in place keeps them; a fork keeps none and gets new ones,
/// so its proxy refuses its parent's and its siblings' (docs/checkpoint.md#fork).
fn kept_placeholders(
    id: &ContainerId,
    manifest: &Manifest,
) -> std::collections::BTreeMap<String, String> {
    if is_fork(id, manifest) {
        return std::collections::BTreeMap::new();
    }
    manifest.placeholders.clone()
}

/// A fork's copy of its parent's change-set layer, re-owned from the image's block `from`
/// to the fork's `to` before its overlay is mounted (`host::reown`).
pub(super) fn reown_layer(
    upper: &Path,
    from: crate::host::idmap::IdRange,
    to: crate::host::idmap::IdRange,
) -> Result<()> {
    let outside = crate::host::reown::shift_tree(upper, from, to)
        .map_err(|e| fail(RestoreError::Reown(e)))?;
    if outside > 0 {
        tracing::warn!(upper = %upper.display(), owners = outside,
            "owners outside the image's id block became the fork's nobody");
    }
    Ok(())
}

/// The filters the executor installs, first installed first: the sandbox's own (in either
/// form: the image may have been taken with or without the supervisor's notifications,
/// both compiled from this sandbox's policy), then the config's `linux.seccomp` ones.
fn filter_slots(executor: &crate::enforce::executor::SandboxExecutor) -> Vec<criu_image::Slot> {
    let bpf = |p: &seccompiler::BpfProgram| {
        criu_image::program_bytes(p.iter().map(|i| (i.code, i.jt, i.jf, i.k)))
    };
    let mut own: Vec<Vec<u8>> = executor.seccomp.iter().map(|p| bpf(p)).collect();
    if let Some(notify) = &executor.notify {
        own.push(criu_image::program_bytes(
            notify.program.iter().map(|i| (i.code, i.jt, i.jf, i.k)),
        ));
    }
    let mut slots = Vec::new();
    if !own.is_empty() {
        slots.push(criu_image::Slot {
            what: "the sandbox's own filter",
            programs: own,
        });
    }
    slots.extend(executor.requested_seccomp.iter().map(|p| criu_image::Slot {
        what: "the config's linux.seccomp filter",
        programs: vec![bpf(p)],
    }));
    slots
}

/// The variable that makes the runtime's own binary CRIU's action script at a restore:
/// `ROOT` and `ID`, a newline between. CRIU runs the script (`--action-script`, no
/// arguments) at every stage, the stage in `CRTOOLS_SCRIPT_ACTION`: at `pre-resume` the
/// binary runs as `--root ROOT restore-check ID` (`cli::Cli::parse_args`), at any other it
/// exits 0. CRIU executes [`criu::ActionScript`], a sealed shell script that runs the
/// binary at `pre-resume` only (or the binary itself where that script cannot be made).
pub const HOOK_ENV: &str = "AGENT_SANDBOX_RESTORE_HOOK";

/// CRIU's action script and the environment it finds the sandbox by ([`HOOK_ENV`]).
fn hook(root: &Path, id: &ContainerId) -> std::result::Result<(PathBuf, String), RestoreError> {
    let exe = std::env::current_exe().map_err(|source| RestoreError::ImageDir {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    Ok((exe, format!("{}\n{}", root.display(), id.as_str())))
}

/// The restored init's standard descriptors: each pipe it had (to podman's conmon, to a
/// shim) is the runtime's own descriptor of that number now, as runc hands them over.
fn inherit_stdio(stdio: &[String]) -> Vec<String> {
    stdio
        .iter()
        .enumerate()
        .filter(|(_, t)| is_pipe(t))
        .flat_map(|(i, t)| ["--inherit-fd".to_owned(), format!("fd[{i}]:{t}")])
        .collect()
}

/// `pipe:[INODE]`, as `/proc/PID/fd/N` shows a pipe.
fn is_pipe(target: &str) -> bool {
    target
        .strip_prefix("pipe:[")
        .and_then(|r| r.strip_suffix(']'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// CRIU opens some image files from the restored task before its id maps exist (as host
/// root without capabilities over the host's files): the image copy's files (never what a
/// link points to) belong to the sandbox's host root id and may be read by others, its
/// directory searched, while CRIU restores (CRIU opens them through its descriptor of the
/// directory); then the copy is removed. The directory above it is root's, 0700, so no
/// other user reaches the copy (`SandboxDir::restore_image`).
fn image_access(dir: &Path, uid: u32) -> std::result::Result<(), RestoreError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |path: &Path, source| RestoreError::ImageDir {
        path: path.to_owned(),
        source,
    };
    let (dir_mode, file_mode) = (0o711, 0o644);
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).map_err(|e| err(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))
        .map_err(|e| err(dir, e))?;
    for entry in std::fs::read_dir(dir).map_err(|e| err(dir, e))? {
        let path = entry.map_err(|e| err(dir, e))?.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| err(&path, e))?;
        if meta.file_type().is_file() && path.extension().is_some_and(|e| e == "img") {
            std::os::unix::fs::lchown(&path, Some(uid), Some(uid)).map_err(|e| err(&path, e))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file_mode))
                .map_err(|e| err(&path, e))?;
        }
    }
    Ok(())
}

/// `--ext-mount-map` pairs for the image's external mounts, from the restoring spec's binds,
/// the sandbox's cgroup directories and its new terminal (`host::criu::restore_map`).
fn external_args(
    image: &[criu::External],
    spec: &Spec,
    cgroups: &std::collections::BTreeMap<String, PathBuf>,
    console: Option<&Path>,
) -> std::result::Result<Vec<String>, RestoreError> {
    let binds: Vec<(String, PathBuf)> = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| {
            m.typ().as_deref() == Some("bind")
                || m.options()
                    .iter()
                    .flatten()
                    .any(|o| o == "bind" || o == "rbind")
        })
        .filter_map(|m| Some((m.destination().display().to_string(), m.source().clone()?)))
        .collect();
    let mut cgroups = cgroups.clone();
    cgroups
        .entry("systemd".to_owned())
        .or_insert_with(|| PathBuf::from("/sys/fs/cgroup/systemd"));
    let map = criu::restore_map(
        image,
        &criu::Sources {
            binds: &binds,
            cgroups: &cgroups,
            console,
        },
    )?;
    Ok(map
        .into_iter()
        .flat_map(|(k, v)| ["--ext-mount-map".to_owned(), format!("{k}:{}", v.display())])
        .collect())
}

/// The sandbox's cgroup, made and limited before CRIU runs, with the runtime inside it
/// while CRIU starts (CRIU's tasks inherit it); [`SandboxCgroup::leave`] takes the runtime
/// back to its own.
struct SandboxCgroup {
    /// The sandbox's directory per controller.
    dirs: std::collections::BTreeMap<String, PathBuf>,
    /// The runtime's own, to go back to.
    own: std::collections::BTreeMap<String, PathBuf>,
}

impl SandboxCgroup {
    fn join(
        spec: &Spec,
        id: &ContainerId,
        systemd: bool,
    ) -> std::result::Result<Self, RestoreError> {
        use libcgroups::common::CgroupManager;
        let boxed = |e: &dyn std::fmt::Display| RestoreError::Cgroup(e.to_string().into());
        let host = crate::host::cgroups::RealHost;
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let own = crate::host::cgroups::dirs_of(&host, me);
        let path = spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().clone())
            .unwrap_or_else(|| PathBuf::from(format!("/agent-sandbox/{id}")));
        let manager = libcgroups::common::create_cgroup_manager(libcgroups::common::CgroupConfig {
            cgroup_path: path,
            systemd_cgroup: systemd,
            container_name: id.as_str().to_owned(),
        })
        .map_err(|e| boxed(&e))?;
        manager
            .add_task(nix::unistd::Pid::from_raw(me))
            .map_err(|e| boxed(&e))?;
        let joined = Self {
            dirs: crate::host::cgroups::dirs_of(&host, me),
            own,
        };
        if let Some(res) = spec.linux().as_ref().and_then(|l| l.resources().as_ref()) {
            let applied = manager.apply(&libcgroups::common::ControllerOpt {
                resources: res,
                disable_oom_killer: false,
                oom_score_adj: None,
                freezer_state: None,
            });
            if let Err(e) = applied {
                joined.leave();
                return Err(boxed(&e));
            }
        }
        Ok(joined)
    }

    /// The runtime back in its own cgroups.
    fn leave(&self) {
        let me = std::process::id().to_string();
        for dir in self.own.values() {
            if let Err(e) = std::fs::write(dir.join("cgroup.procs"), &me) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot leave the sandbox's cgroup");
            }
        }
    }
}

impl Runtime {
    /// After CRIU: libcontainer's state for the restored init, the proxy, the pid file, the
    /// wall clock, the records. Keep `restored` the first record of the restored sandbox.
    #[allow(clippy::too_many_arguments)]
    fn record_restored(
        &self,
        id: &ContainerId,
        opts: &RestoreOpts,
        ids: &Ids,
        host: &Host,
        hardened: &Hardened,
        pid: i32,
        proxy: Option<Box<dyn super::host_procs::StartingProxy>>,
        manifest: &Manifest,
        lost: &[(String, String)],
    ) -> Result<()> {
        let (rules, dropped) = live_rules_within(&hardened.plan.policy, &manifest.live_rules);
        crate::sidecars::trail::restored(
            &self.dirs,
            id,
            &crate::sidecars::trail::Lineage {
                digest: &manifest.image_digest,
                from: &manifest.id,
                from_head: manifest.audit_head.as_ref(),
            },
            lost,
            &dropped,
        )
        .map_err(CreateError::Audit)?;
        crate::sidecars::trail::track_init(&self.dirs, id, pid);
        self.save_restored_state(id, &hardened.spec, hardened.cgroups.systemd(), pid)?;
        let proxy_pid = match proxy {
            Some(p) => Some(p.finish(id.as_str(), pid).map_err(CreateError::Egress)?),
            None => None,
        };
        if proxy_pid.is_some() {
            reapply_live_rules(&host.sandbox_dir, id, &rules)?;
        }
        if let Some(f) = &opts.create.pid_file {
            crate::files::write(f, pid.to_string())?;
        }
        crate::report::layers::record_create(
            &host.sandbox_dir,
            &ids.ids,
            &hardened.spec,
            hardened.seccomp_len,
            &hardened.plan.policy,
            &hardened.plan.layers,
            proxy_pid,
            pid,
            None,
            None,
            crate::report::layers::masked_secrets(
                &hardened.spec,
                &hardened.plan.policy,
                &host.placeholders,
            ),
        )
        .map_err(CreateError::Layers)?;
        self.rearm_wall_clock(id, &hardened.plan.policy, pid, manifest.wall_clock_used_ms)?;
        tracing::info!(id = %id, pid, digest = %manifest.image_digest, "sandbox restored");
        Ok(())
    }

    /// libcontainer's `state.json` (and its cgroup config) for a running init `pid`, so
    /// that state, kill, pause and delete treat the restored sandbox as a created one.
    fn save_restored_state(
        &self,
        id: &ContainerId,
        spec: &Spec,
        systemd: bool,
        pid: i32,
    ) -> Result<()> {
        let root = self.dirs.container(id);
        std::fs::create_dir_all(&root).map_err(|e| crate::files::FileError::write(&root, e))?;
        let mut c = Container::new(
            id.as_str(),
            ContainerStatus::Running,
            Some(pid),
            &self.dirs.sandbox(id).bundle(),
            &root,
        )
        .map_err(crate::lifecycle::container_err("restore"))?;
        c.set_systemd(systemd)
            .set_annotations(spec.annotations().clone())
            .set_creator(0);
        c.save()
            .map_err(crate::lifecycle::container_err("restore"))?;
        libcontainer::config::YoukiConfig::from_spec(spec, id.as_str())
            .and_then(|cfg| cfg.save(&root))
            .map_err(|e| crate::lifecycle::container_err("restore")(e.into()))?;
        Ok(())
    }

    /// The watchdog armed with what is left of the wall clock; `started` set back by what
    /// the sandbox had used, so a later checkpoint counts from its real start.
    fn rearm_wall_clock(
        &self,
        id: &ContainerId,
        policy: &agent_sandbox_policy::SandboxPolicy,
        pid: i32,
        used_ms: u64,
    ) -> Result<()> {
        let used = used_ms / 1000;
        if let Some(now) = crate::enforce::init_exec::uptime() {
            #[expect(clippy::cast_precision_loss)]
            let started = now - used_ms as f64 / 1000.0;
            let _ = crate::state::paths::write_atomic(
                &self.dirs.sandbox(id).started(),
                started.to_string().as_bytes(),
            );
        }
        let limit = policy.resources.wall_clock.get();
        if limit == 0 {
            return Ok(());
        }
        Ok(self.spawn_watchdog(id, Some(pid), limit.saturating_sub(used).max(1))?)
    }

    /// The hidden `restore-check ID`, CRIU's pre-resume hook: checks the restored tree of
    /// `CRTOOLS_INIT_PID` and writes the verdict; on any difference it kills the tree
    /// first, while CRIU still holds every task stopped.
    pub fn restore_check(&self, id: &ContainerId) -> Result<()> {
        let dir = self.dirs.sandbox(id);
        let verdict = dir.restore_verdict();
        let pid = std::env::var("CRTOOLS_INIT_PID")
            .ok()
            .and_then(|p| p.parse::<i32>().ok());
        let outcome = match pid {
            None => Err("CRIU gave no CRTOOLS_INIT_PID".to_owned()),
            Some(pid) => dir
                .restore_check()
                .read::<Expected>()
                .map_err(|e| e.to_string())
                .and_then(|exp| {
                    let proc = Path::new("/proc");
                    restored::reseal(proc, pid, &exp.mounts).map_err(|e| e.to_string())?;
                    restored::check(proc, pid, &exp).map_err(|e| e.to_string())
                }),
        };
        let refusal = match (outcome, pid) {
            (Ok(_), Some(pid)) => {
                crate::files::write(&verdict, format!("ok {pid}"))?;
                return Ok(());
            }
            (Err(e), _) => e,
            (Ok(_), None) => "CRIU gave no CRTOOLS_INIT_PID".to_owned(),
        };
        // The verdict first (the runtime reads it once CRIU is gone), then the kills: CRIU
        // holds every restored task stopped, so none runs another instruction. The init
        // first (its PID namespace goes with it), then CRIU, which would otherwise wait for
        // the tasks it holds and resume what is left.
        let written = crate::files::write(&verdict, &refusal);
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        kill_criu_parent();
        tracing::error!(id = %id, error = %refusal, "restored sandbox refused");
        written?;
        Ok(())
    }
}

/// The restoring sandbox's effective `policy` keeps every key whose effect the image
/// carries as the image's sandbox had it (`image`, the manifest's word): checked before the
/// host is prepared for the restore, so a refused restore copies and mounts nothing.
pub(super) fn keeps_carried_keys(
    image: &agent_sandbox_policy::SandboxPolicy,
    policy: &agent_sandbox_policy::SandboxPolicy,
) -> Result<()> {
    match agent_sandbox_policy::carried::changed_carried_key(image, policy) {
        None => Ok(()),
        Some(k) => Err(fail(RestoreError::CarriedKey {
            key: k.key,
            carried_by: k.carried_by,
        })),
    }
}

/// The image's live egress rules split into those the restoring sandbox's ceiling covers
/// (and every deny: it only narrows), and the others, dropped. The image is a file a user
/// may have edited; the proxy checks each allow against the ceiling again when it gets it.
fn live_rules_within(
    policy: &agent_sandbox_policy::SandboxPolicy,
    saved: &[(bool, String)],
) -> (Vec<(bool, String)>, Vec<String>) {
    let ceiling = policy.network.approvals.as_ref();
    let (kept, dropped): (Vec<_>, Vec<_>) = saved.iter().cloned().partition(|(allow, rule)| {
        !allow
            || agent_sandbox_policy::network::DomainRule::parse(rule)
                .is_ok_and(|r| ceiling.is_some_and(|c| c.ceiling_covers_rule(&r)))
    });
    (kept, dropped.into_iter().map(|(_, r)| r).collect())
}

/// The kept live rules, in their order, through the restored proxy's control socket (as
/// `agent-sandbox allow`/`deny` give them; each is an `approval` record).
fn reapply_live_rules(
    dir: &crate::state::SandboxDir,
    id: &ContainerId,
    rules: &[(bool, String)],
) -> Result<()> {
    use agent_sandbox_proxy::approval::ChangeAction;
    for (allow, rule) in rules {
        let action = if *allow {
            ChangeAction::Allow
        } else {
            ChangeAction::Deny
        };
        crate::sidecars::allow::change(dir, id.as_str(), action, rule)
            .map_err(|e| fail(RestoreError::LiveRule(Box::new(e))))?;
    }
    Ok(())
}

/// SIGKILL to the hook's parent if it is CRIU (the hook `exec`s the runtime).
fn kill_criu_parent() {
    let parent = nix::unistd::getppid();
    let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).unwrap_or_default();
    if comm.trim() == "criu" {
        let _ = nix::sys::signal::kill(parent, nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_cannot_be_honoured_are_refused_by_name() {
        let base = RestoreOpts::default();
        for (opts, flag) in [
            (
                RestoreOpts {
                    criu: CriuFlags {
                        lazy_pages: true,
                        ..CriuFlags::default()
                    },
                    ..base.clone()
                },
                "--lazy-pages",
            ),
            (
                RestoreOpts {
                    criu: CriuFlags {
                        empty_ns: vec!["network".into()],
                        ..CriuFlags::default()
                    },
                    ..base.clone()
                },
                "--empty-ns",
            ),
            (
                RestoreOpts {
                    lsm_profile: Some("apparmor:unconfined".into()),
                    ..base.clone()
                },
                "--lsm-profile",
            ),
            (
                RestoreOpts {
                    criu: CriuFlags {
                        manage_cgroups_mode: Some("full".into()),
                        ..CriuFlags::default()
                    },
                    ..base.clone()
                },
                "--manage-cgroups-mode",
            ),
        ] {
            let e = opts.refuse_unsupported().unwrap_err().to_string();
            assert!(e.starts_with(flag), "{e}");
        }
        let fine = RestoreOpts {
            detach: true,
            criu: CriuFlags {
                tcp_established: true,
                file_locks: true,
                manage_cgroups_mode: Some("ignore".into()),
                ..CriuFlags::default()
            },
            ..base
        };
        fine.refuse_unsupported().unwrap();
        assert_eq!(
            fine.criu.criu_options(),
            ["--tcp-established", "--file-locks"]
        );
    }

    #[test]
    fn a_terminal_needs_a_console_socket_and_a_console_socket_a_terminal() {
        let manifest = |terminal: Option<&str>| -> Manifest {
            serde_json::from_value(serde_json::json!({
                "format": FORMAT, "id": "c", "image_digest": "d", "plan_digest": "p",
                "ids": {"host_start": 1_000_000, "size": 65536}, "wall_clock_used_ms": 0,
                "audit_head": null, "externals": [], "change": null, "not_carried": [],
                "terminal": terminal,
            }))
            .unwrap()
        };
        let with_socket = RestoreOpts {
            create: CreateOpts {
                console_socket: Some("/tmp/conmon-term.x/sock".into()),
                ..CreateOpts::default()
            },
            ..RestoreOpts::default()
        };
        let none = RestoreOpts::default();
        let (key, socket) = terminal(&with_socket, &manifest(Some("tty[8800:4a]")))
            .unwrap()
            .unwrap();
        assert_eq!(key.to_string(), "tty[8800:4a]");
        assert_eq!(socket, Path::new("/tmp/conmon-term.x/sock"));
        assert!(terminal(&none, &manifest(None)).unwrap().is_none());
        for (opts, terminal_key, says) in [
            (&none, Some("tty[8800:4a]"), "needs --console-socket"),
            (&with_socket, None, "had no terminal"),
            (&with_socket, Some("tty[8800:4a]:fd[0]"), "not CRIU's name"),
        ] {
            let e = terminal(opts, &manifest(terminal_key))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(says) && e.contains("docs/checkpoint.md#terminals"),
                "{e}"
            );
        }
    }

    #[test]
    fn live_rules_outside_the_ceiling_are_dropped_and_denies_kept() {
        let text = "[network]\nmode = \"proxy\"\nallow = [\"pypi.org:443\"]\n\
                    [network.approvals]\nceiling = [\"*.example.com:443\"]\n";
        let policy = agent_sandbox_policy::SandboxPolicy::parse(text, "p.toml").unwrap();
        let saved = [
            (true, "api.example.com:443".to_owned()),
            (true, "evil.test:443".to_owned()),
            (true, "api.example.com".to_owned()),
            (false, "evil.test".to_owned()),
            (true, "not a rule".to_owned()),
        ];
        let (kept, dropped) = live_rules_within(&policy, &saved);
        assert_eq!(
            kept,
            [
                (true, "api.example.com:443".to_owned()),
                (false, "evil.test".to_owned()),
            ]
        );
        assert_eq!(dropped, ["evil.test:443", "api.example.com", "not a rule"]);
        // Without a ceiling no allow comes back.
        let none = agent_sandbox_policy::SandboxPolicy::parse(
            "[network]\nmode = \"proxy\"\nallow = [\"pypi.org:443\"]\n",
            "p.toml",
        )
        .unwrap();
        assert_eq!(
            live_rules_within(&none, &saved[..1]).1,
            ["api.example.com:443"]
        );
    }

    #[test]
    fn a_restore_in_place_keeps_the_images_placeholders_and_a_fork_none() {
        let own = agent_sandbox_policy::network::placeholder_value("API_TOKEN", &"7".repeat(32));
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "format": FORMAT, "id": "parent", "image_digest": "d", "plan_digest": "p",
            "ids": {"host_start": 1_000_000, "size": 65536}, "wall_clock_used_ms": 0,
            "audit_head": null, "externals": [], "change": null, "not_carried": [],
            "placeholders": {"API_TOKEN": own},
        }))
        .unwrap();
        let kept = kept_placeholders(&ContainerId::try_from("parent").unwrap(), &manifest);
        assert_eq!(kept.get("API_TOKEN"), Some(&own));
        let fork = kept_placeholders(&ContainerId::try_from("fork-1").unwrap(), &manifest);
        assert!(fork.is_empty());
    }

    #[test]
    fn the_hook_is_the_runtime_binary_told_the_root_and_the_id() {
        let id = ContainerId::try_from("c1").unwrap();
        let (exe, env) = hook(Path::new("/run/it's"), &id).unwrap();
        assert_eq!(exe, std::env::current_exe().unwrap());
        assert_eq!(env, "/run/it's\nc1");
    }
}
