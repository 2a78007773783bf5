//! `R/sandbox/<id>/`: one sandbox's own state, and the only place that names its files.
//!
//! Each file has one method below, which says what the file holds and which module reads or
//! writes it. Modules ask a [`SandboxDir`] for a path (or a [`JsonFile`], which also fixes the
//! file's encoding and mode); none joins a file name onto the directory itself.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::id::{ContainerId, IdError};
use super::paths::write_atomic_mode;
use crate::files::FileError;

/// How a JSON file is laid out (kept as each file has always been written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Pretty,
    Compact,
}

/// Mode of a file only the runtime reads.
const PRIVATE: u32 = 0o600;
/// Mode (before the umask) of a file written like `std::fs::write` writes one.
const DEFAULT: u32 = 0o666;

/// Whether a write of the file is synced before it replaces the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Synced: the records `delete` needs to undo `create` (the sandbox record, the
    /// workspace, the requested seccomp), which must survive a crash of the host.
    Synced,
    /// Replaced atomically without a sync: the files rewritten on every create or delete
    /// (audit state, layers, cgroups, ...), which were never synced; a sync each would add
    /// milliseconds to every lifecycle on a busy disk (docs/benchmarks.md).
    Replaced,
}

/// One JSON file of a sandbox: its path, how it is encoded and the mode it gets. Writes are
/// atomic (a reader sees the old file or the new one, never a part); reads name the file in
/// their error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonFile {
    path: PathBuf,
    layout: Layout,
    mode: u32,
    durability: Durability,
}

impl JsonFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file with `value`, atomically.
    pub fn write<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), FileError> {
        let text = match self.layout {
            Layout::Pretty => serde_json::to_vec_pretty(value),
            Layout::Compact => serde_json::to_vec(value),
        }
        .map_err(|e| FileError::encode(&self.path, e))?;
        match self.durability {
            Durability::Synced => write_atomic_mode(&self.path, &text, self.mode),
            Durability::Replaced => {
                agent_sandbox_sys::atomic_file::replace_mode(&self.path, &text, self.mode)
            }
        }
        .map_err(|e| FileError::write(&self.path, e))
    }

    /// The file's value; a missing file is an error (see [`Self::read_if_present`]).
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, FileError> {
        crate::files::read_json(&self.path)
    }

    /// The file's value, `None` when there is no file.
    pub fn read_if_present<T: DeserializeOwned>(&self) -> Result<Option<T>, FileError> {
        match self.read() {
            Err(e) if e.is_not_found() => Ok(None),
            other => other.map(Some),
        }
    }
}

/// The state directory of one sandbox, `R/sandbox/<id>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDir {
    dir: PathBuf,
}

impl SandboxDir {
    /// The directory under the state root that holds every sandbox's directory.
    pub(super) const PARENT: &str = "sandbox";

    /// The directory of sandbox `id` under state root `root`.
    pub fn new(root: &Path, id: &ContainerId) -> Self {
        Self {
            dir: root.join(Self::PARENT).join(id.as_str()),
        }
    }

    /// The directory of the sandbox named `id`, for a name read from a file or an argument:
    /// anything that is not a valid container id (`..`, a `/`, an empty name) is refused, so
    /// the result always lies directly under `R/sandbox/`.
    pub fn of(root: &Path, id: &str) -> Result<Self, IdError> {
        Ok(Self::new(root, &ContainerId::try_from(id)?))
    }

    /// The directory itself (created at `create`, removed at `delete`).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The state root this directory lies in (`R` of `R/sandbox/<id>/`).
    pub fn state_root(&self) -> Option<&Path> {
        self.dir.parent()?.parent()
    }

    pub fn exists(&self) -> bool {
        self.dir.exists()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn json(&self, name: &str, layout: Layout, mode: u32, durability: Durability) -> JsonFile {
        JsonFile {
            path: self.file(name),
            layout,
            mode,
            durability,
        }
    }

    /// `sandbox.json`: the sandbox record (bundle, ids, rootfs mount, profile) — `lifecycle`.
    pub fn record(&self) -> JsonFile {
        self.json("sandbox.json", Layout::Pretty, PRIVATE, Durability::Synced)
    }

    /// `bundle/`: the bundle libcontainer runs — `lifecycle`.
    pub fn bundle(&self) -> PathBuf {
        self.file("bundle")
    }

    /// `bundle/config.json`: the hardened spec — written by `lifecycle`, read by `pod` for a
    /// pod's members and by `exec`.
    pub fn hardened_spec(&self) -> PathBuf {
        self.bundle().join("config.json")
    }

    /// `bundle/engine/`: the bundle libcontainer creates the container from when the runtime
    /// places HOME's guards itself (its spec without them); its `config.json` is the whole
    /// hardened spec again once the container exists, for the commands that find the spec
    /// through libcontainer's state (`create::build`).
    pub fn engine_bundle(&self) -> PathBuf {
        self.bundle().join("engine")
    }

    /// `ceiling.toml`: the ceiling policy the sandbox was created under (every exec and a
    /// pod's members use it) — `harden::Ceiling`.
    pub fn ceiling(&self) -> PathBuf {
        self.file("ceiling.toml")
    }

    /// `plan.json`: the sandbox's compiled plan (`agent_sandbox_policy::SandboxPlan`: the
    /// effective policy, the layer plan, protected binds, clamps, the config's seccomp
    /// request), made once by create's hardening phase; start, exec, `update`, checkpoint,
    /// the sidecars and a pod's members read it instead of deriving it again — `harden`.
    pub fn plan(&self) -> JsonFile {
        self.json("plan.json", Layout::Pretty, PRIVATE, Durability::Synced)
    }

    /// `profile.toml`: the admin's profile that the sandbox's `io.agent.sandbox.profile`
    /// named, as create read it from the profiles directory (exec and a pod's members use
    /// this copy, never the directory again) — `harden::Ceiling`.
    pub fn admin_profile(&self) -> PathBuf {
        self.file("profile.toml")
    }

    /// `workspace.json`: the workspace overlay's placement — `lifecycle`, read by `changes`.
    pub fn workspace(&self) -> JsonFile {
        self.json(
            "workspace.json",
            Layout::Pretty,
            PRIVATE,
            Durability::Synced,
        )
    }

    /// `requested-seccomp.json`: the seccomp profile the caller's spec asked for, as a runtime
    /// before the plan held it saved it; read only for such a sandbox's execs (`harden`).
    pub fn requested_seccomp(&self) -> JsonFile {
        self.json(
            "requested-seccomp.json",
            Layout::Pretty,
            PRIVATE,
            Durability::Synced,
        )
    }

    /// `exec-<pid>.json`: the clamped process of an exec in flight, run by the runtime with
    /// `pid` and removed when its exec is built — `lifecycle`. Not synced: only that same
    /// run reads it (libcontainer, by path), and no later command needs it, so a sync bought
    /// nothing but a wait on the disk in every exec.
    pub fn exec_process(&self, pid: u32) -> JsonFile {
        self.json(
            &format!("exec-{pid}.json"),
            Layout::Pretty,
            PRIVATE,
            Durability::Replaced,
        )
    }

    /// `frozen.json`: when the sandbox was frozen and for how long, which its wall clock does
    /// not count — `lifecycle::pause`, read by the watchdog.
    pub fn frozen(&self) -> JsonFile {
        self.json(
            "frozen.json",
            Layout::Compact,
            DEFAULT,
            Durability::Replaced,
        )
    }

    /// `watchdog.pid`: the wall-clock watchdog's pid — `lifecycle`.
    pub fn watchdog_pid(&self) -> PathBuf {
        self.file("watchdog.pid")
    }

    /// `oom-watch.pid`: the OOM watcher of a podman container — `sidecars::podman_oom`.
    pub fn oom_watch_pid(&self) -> PathBuf {
        self.file("oom-watch.pid")
    }

    /// `created`: written as create's very last step (`create::record`), after the cgroup
    /// limits are verified and the records are in: `start` lets no init run without it,
    /// since a runtime killed mid-create can leave libcontainer's state `created` with an
    /// init outside the sandbox's cgroup (docs/reliability.md#a-runtime-killed-mid-create).
    pub fn create_done(&self) -> PathBuf {
        self.file("created")
    }

    /// `started`: uptime when the init executed the program — `lifecycle` (`init_exec`).
    /// Replaced without a sync: an uptime is meaningless after a reboot.
    pub fn started(&self) -> PathBuf {
        self.file("started")
    }

    /// `restore-check.json`: what every restored task must show, for the check CRIU's
    /// pre-resume hook runs — `create::restore`, `enforce::restored`.
    pub fn restore_check(&self) -> JsonFile {
        self.json(
            "restore-check.json",
            Layout::Compact,
            PRIVATE,
            Durability::Replaced,
        )
    }

    /// `restore-image/image/`: the restore's private copy of the checkpoint image, which every
    /// check and CRIU read (`host::criu_image::private_copy`), in a directory only root enters
    /// (`restore-image/`, 0700: the copy itself is opened to the sandbox's root id while CRIU
    /// restores); removed once the restore is done — `create::restore`.
    pub fn restore_image(&self) -> PathBuf {
        self.file("restore-image").join("image")
    }

    /// `restore-verdict`: the check's outcome, `ok PID` or the error — `create::restore`.
    pub fn restore_verdict(&self) -> PathBuf {
        self.file("restore-verdict")
    }

    /// `cgroup.json`: a cgroup v2 sandbox's cgroup or systemd scope — `host::cgroups`.
    pub fn cgroup(&self) -> JsonFile {
        self.json(
            "cgroup.json",
            Layout::Compact,
            DEFAULT,
            Durability::Replaced,
        )
    }

    /// `layers.json`: which layers were applied, for `layers` — `layers`.
    pub fn layers(&self) -> JsonFile {
        self.json("layers.json", Layout::Pretty, DEFAULT, Durability::Replaced)
    }

    /// `pod.json`: the pod role and the pinned namespaces (CRI only) — `pod`.
    pub fn pod(&self) -> JsonFile {
        self.json("pod.json", Layout::Pretty, DEFAULT, Durability::Replaced)
    }

    /// `poststop.json`: the poststop hooks to run at delete — `hooks`.
    pub fn poststop(&self) -> JsonFile {
        self.json(
            "poststop.json",
            Layout::Compact,
            DEFAULT,
            Durability::Replaced,
        )
    }

    /// `apparmor-profile`: the name of the AppArmor profile loaded for the sandbox —
    /// `apparmor`.
    pub fn apparmor_profile(&self) -> PathBuf {
        self.file("apparmor-profile")
    }

    /// `proxy.pid`: the egress proxy sidecar's pid — `egress`.
    pub fn proxy_pid(&self) -> PathBuf {
        self.file("proxy.pid")
    }

    /// `proxy.log`: the egress proxy's own log — `egress`.
    pub fn proxy_log(&self) -> PathBuf {
        self.file("proxy.log")
    }

    /// Name of the egress proxy's control socket (`allow`), bound through a descriptor of
    /// this directory because the full path may exceed `sun_path`.
    pub const EGRESS_SOCKET: &str = "egress.sock";

    /// `egress.sock`: the proxy's control socket, for `allow` — `egress`, `allow`.
    pub fn egress_socket(&self) -> PathBuf {
        self.file(Self::EGRESS_SOCKET)
    }

    /// `seccomp-supervisor.pid`: the syscall audit supervisor's pid — `syscall_audit`.
    pub fn supervisor_pid(&self) -> PathBuf {
        self.file("seccomp-supervisor.pid")
    }

    /// Name of the supervisor's socket, bound through a descriptor of this directory.
    pub const SECCOMP_SOCKET: &str = "seccomp.sock";

    /// `seccomp.sock`: where executors hand their seccomp listener to the supervisor —
    /// `syscall_audit`.
    pub fn seccomp_socket(&self) -> PathBuf {
        self.file(Self::SECCOMP_SOCKET)
    }

    /// `fs-audit.json`: whether Landlock denials are logged, and why not — `fs_audit`.
    pub fn fs_audit(&self) -> JsonFile {
        self.json(
            "fs-audit.json",
            Layout::Compact,
            DEFAULT,
            Durability::Replaced,
        )
    }

    /// `tls-ca.key`: the sandbox CA's key (mode 0600), removed once the proxy has read it —
    /// `tls_trust`, `egress`.
    pub fn tls_key(&self) -> PathBuf {
        self.file("tls-ca.key")
    }

    /// `tls-ca.pem`: the sandbox CA's certificate — `tls_trust`, `egress`.
    pub fn tls_cert(&self) -> PathBuf {
        self.file("tls-ca.pem")
    }

    /// `audit-dir`: the directory of the sandbox's audit log, fixed at create — `audit`.
    pub fn audit_dir(&self) -> PathBuf {
        self.file("audit-dir")
    }

    /// `audit-state.json`: what the exit records need (OOM kills seen, init recorded) —
    /// `audit`.
    pub fn audit_state(&self) -> JsonFile {
        self.json(
            "audit-state.json",
            Layout::Compact,
            DEFAULT,
            Durability::Replaced,
        )
    }

    /// `audit-exec/`: one file per exec, named by its pid, holding its tool-call id — `audit`.
    pub fn audit_exec_tags(&self) -> PathBuf {
        self.file("audit-exec")
    }

    /// `audit-exec/<pid>`: the tool-call id of the exec with `pid` — `audit`.
    pub fn audit_exec_tag(&self, pid: i32) -> PathBuf {
        self.audit_exec_tags().join(pid.to_string())
    }

    /// `audit-exec-exits/`: one empty file per exec exit already recorded — `audit`.
    pub fn audit_exec_exits(&self) -> PathBuf {
        self.file("audit-exec-exits")
    }

    /// `wall-clock-fired`: the watchdog's mark before it kills the sandbox — `audit`.
    pub fn wall_clock_fired(&self) -> PathBuf {
        self.file("wall-clock-fired")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(root: &Path) -> SandboxDir {
        SandboxDir::new(root, &ContainerId::try_from("c1").unwrap())
    }

    /// The names are part of the on-disk format: a running sandbox created by an older
    /// runtime must still be found by a newer one.
    #[test]
    fn layout_names() {
        let d = sandbox(Path::new("/r"));
        assert_eq!(d.path(), Path::new("/r/sandbox/c1"));
        let name = |p: &Path| {
            p.strip_prefix("/r/sandbox/c1")
                .unwrap()
                .display()
                .to_string()
        };
        let files = [
            (d.record().path().to_owned(), "sandbox.json"),
            (d.bundle(), "bundle"),
            (d.hardened_spec(), "bundle/config.json"),
            (d.engine_bundle(), "bundle/engine"),
            (d.ceiling(), "ceiling.toml"),
            (d.workspace().path().to_owned(), "workspace.json"),
            (
                d.requested_seccomp().path().to_owned(),
                "requested-seccomp.json",
            ),
            (d.exec_process(7).path().to_owned(), "exec-7.json"),
            (d.watchdog_pid(), "watchdog.pid"),
            (d.oom_watch_pid(), "oom-watch.pid"),
            (d.started(), "started"),
            (d.cgroup().path().to_owned(), "cgroup.json"),
            (d.layers().path().to_owned(), "layers.json"),
            (d.pod().path().to_owned(), "pod.json"),
            (d.poststop().path().to_owned(), "poststop.json"),
            (d.apparmor_profile(), "apparmor-profile"),
            (d.proxy_pid(), "proxy.pid"),
            (d.proxy_log(), "proxy.log"),
            (d.egress_socket(), "egress.sock"),
            (d.supervisor_pid(), "seccomp-supervisor.pid"),
            (d.seccomp_socket(), "seccomp.sock"),
            (d.fs_audit().path().to_owned(), "fs-audit.json"),
            (d.tls_key(), "tls-ca.key"),
            (d.tls_cert(), "tls-ca.pem"),
            (d.audit_dir(), "audit-dir"),
            (d.audit_state().path().to_owned(), "audit-state.json"),
            (d.audit_exec_tags(), "audit-exec"),
            (d.audit_exec_tag(42), "audit-exec/42"),
            (d.audit_exec_exits(), "audit-exec-exits"),
            (d.wall_clock_fired(), "wall-clock-fired"),
            (d.restore_check().path().to_owned(), "restore-check.json"),
            (d.restore_verdict(), "restore-verdict"),
        ];
        for (path, want) in &files {
            assert_eq!(name(path), *want);
        }
        let mut names: Vec<_> = files.iter().map(|(p, _)| p.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), files.len(), "two files share a name");
        assert_eq!(
            d.seccomp_socket(),
            d.path().join(SandboxDir::SECCOMP_SOCKET)
        );
        assert_eq!(d.egress_socket(), d.path().join(SandboxDir::EGRESS_SOCKET));
    }

    #[test]
    fn refuses_names_that_are_not_ids() {
        let root = Path::new("/r");
        for bad in ["", ".", "..", "../x", "a/b", "/etc", "a\0b", "x y"] {
            assert!(SandboxDir::of(root, bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            SandboxDir::of(root, "abc-1.2_3+4").unwrap().path(),
            Path::new("/r/sandbox/abc-1.2_3+4")
        );
    }

    #[test]
    fn only_the_records_delete_needs_are_synced() {
        let root = tempfile::tempdir().unwrap();
        let d = sandbox(root.path());
        for f in [d.record(), d.workspace(), d.requested_seccomp()] {
            assert_eq!(f.durability, Durability::Synced, "{}", f.path().display());
        }
        for f in [
            d.exec_process(7),
            d.cgroup(),
            d.layers(),
            d.pod(),
            d.poststop(),
            d.fs_audit(),
            d.audit_state(),
        ] {
            assert_eq!(f.durability, Durability::Replaced, "{}", f.path().display());
        }
    }

    #[test]
    fn json_files_round_trip_with_their_layout_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let d = sandbox(root.path());
        std::fs::create_dir_all(d.path()).unwrap();
        let value = serde_json::json!({"role": "member", "pod": "p"});
        d.pod().write(&value).unwrap();
        d.poststop().write(&value).unwrap();
        d.record().write(&value).unwrap();
        assert_eq!(
            std::fs::read(d.pod().path()).unwrap(),
            serde_json::to_vec_pretty(&value).unwrap()
        );
        assert_eq!(
            std::fs::read(d.poststop().path()).unwrap(),
            serde_json::to_vec(&value).unwrap()
        );
        let mode = |f: JsonFile| std::fs::metadata(f.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(d.record()), 0o600);
        // As `std::fs::write` would leave it: 0666 less the umask, which removes no owner bit.
        assert_eq!(mode(d.pod()) & 0o700, 0o600);
        assert_eq!(mode(d.pod()), mode(d.poststop()));
        assert_eq!(d.pod().read::<serde_json::Value>().unwrap(), value);
        assert!(
            d.layers()
                .read_if_present::<serde_json::Value>()
                .unwrap()
                .is_none()
        );
        let missing = d.layers().read::<serde_json::Value>().unwrap_err();
        assert_eq!(missing.path(), d.layers().path());
        std::fs::write(d.fs_audit().path(), b"{not json").unwrap();
        let bad = d.fs_audit().read::<serde_json::Value>().unwrap_err();
        assert_eq!(bad.op(), crate::files::FileOp::Parse, "{bad:?}");
        assert!(bad.to_string().contains("fs-audit.json"), "{bad}");
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_partial_one() {
        let root = tempfile::tempdir().unwrap();
        let d = sandbox(root.path());
        std::fs::create_dir_all(d.path()).unwrap();
        d.layers().write(&serde_json::json!({"old": true})).unwrap();
        // A map with non-string keys cannot be encoded as JSON: the encoder fails part way.
        let unencodable: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = d.layers().write(&unencodable).unwrap_err();
        assert_eq!(err.op(), crate::files::FileOp::Encode, "{err:?}");
        assert_eq!(
            d.layers().read::<serde_json::Value>().unwrap(),
            serde_json::json!({"old": true})
        );
        // A write that cannot be renamed into place (the target is a directory) leaves no
        // temporary file behind either.
        std::fs::create_dir(d.pod().path()).unwrap();
        assert!(d.pod().write(&1).is_err());
        let mut names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["layers.json", "pod.json"]);
    }
}
