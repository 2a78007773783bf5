//! Checkpoint and restore as containerd asks for them, mapped onto the runtime's runc-style
//! `checkpoint` and `restore` commands (docs/contracts.md#checkpoint-and-restore-task-api).
//!
//! - **Checkpoint.** containerd sends the image directory as the request's `path` (its own
//!   temporary directory, or the client's `image_path`) and, when the client gave any, runc's
//!   `containerd.runc.v1.CheckpointOptions`. ctr of containerd 1.6 sends those options only
//!   for runc's runtime names, so `ctr task checkpoint` of this runtime arrives without them
//!   (leave running, file locks off); `ctr containers checkpoint --task` and containerd 2.x
//!   send them for every runtime.
//! - **Restore.** A Create whose `checkpoint` names a directory (containerd unpacked the
//!   checkpoint image there) runs nothing yet: the runtime's `restore` runs at Start, as in
//!   containerd's runc shim, because containerd 2.x unpacks a CRI checkpoint's root
//!   filesystem changes into the bundle between the two.
//!
//! Everything here is pure: the options become a [`CheckpointPlan`] and the plans become the
//! runtime's arguments; the task service runs them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use containerd_shim::protos::protobuf::{Message, well_known_types::any::Any};
use containerd_shim::protos::shim::oci::CheckpointOptions;

/// The options type containerd's clients send (runc's, for every runtime).
const CHECKPOINT_OPTIONS_TYPE: &str = "containerd.runc.v1.CheckpointOptions";
/// The CRIU work directory in the bundle when the client names none; removed afterwards.
pub const DEFAULT_WORK_DIR: &str = "criu-work";
/// Where a failed checkpoint's CRIU log is kept (the runc shim's name for it).
pub const DUMP_LOG: &str = "criu-dump.log";
/// Where a failed restore's CRIU log is kept.
pub const RESTORE_LOG: &str = "criu-restore.log";

/// Namespaces `empty_namespaces` may name (runc's `--empty-ns`, the OCI namespace types).
const NAMESPACES: [&str; 8] = [
    "network", "ipc", "uts", "mount", "pid", "user", "cgroup", "time",
];
/// CRIU's cgroup modes (runc's `--manage-cgroups-mode`).
const CGROUP_MODES: [&str; 4] = ["soft", "full", "strict", "ignore"];

/// A checkpoint request containerd sent that cannot be carried out as asked.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "unsupported checkpoint options type {type_url} (expected {CHECKPOINT_OPTIONS_TYPE}, \
         docs/contracts.md#checkpoint-and-restore-task-api)"
    )]
    UnsupportedType { type_url: String },
    #[error("malformed {CHECKPOINT_OPTIONS_TYPE}")]
    Decode(#[source] containerd_shim::protos::protobuf::Error),
    #[error(
        "checkpoint option {key} {value:?}: {expected} \
         (docs/contracts.md#checkpoint-and-restore-task-api)"
    )]
    Invalid {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// One `checkpoint` run of the runtime: every runc flag the options map to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPlan {
    pub image_path: PathBuf,
    /// The client's work directory, or `None`: a fresh one in the bundle, removed after.
    pub work_path: Option<PathBuf>,
    /// `exit` unset: the task keeps running (`--leave-running`).
    pub leave_running: bool,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    /// `terminal`: CRIU dumps a task attached to a terminal (`--shell-job`).
    pub shell_job: bool,
    pub file_locks: bool,
    pub empty_ns: Vec<String>,
    pub cgroups_mode: Option<String>,
}

impl CheckpointPlan {
    /// The plan for a Checkpoint request: the image goes to `path` (containerd's choice; the
    /// options' `image_path` only when `path` is empty), the options as runc's shim reads them.
    pub fn from_request(path: &str, options: Option<&Any>) -> Result<Self, CheckpointError> {
        let opts = decode(options)?;
        let image = if path.is_empty() {
            opts.image_path.as_str()
        } else {
            path
        };
        let image_path = absolute("path", image)?;
        let work_path = if opts.work_path.is_empty() {
            None
        } else {
            Some(absolute("work_path", &opts.work_path)?)
        };
        for ns in &opts.empty_namespaces {
            one_of(
                "empty_namespaces",
                ns,
                &NAMESPACES,
                "a namespace type such as network",
            )?;
        }
        let cgroups_mode = if opts.cgroups_mode.is_empty() {
            None
        } else {
            one_of(
                "cgroups_mode",
                &opts.cgroups_mode,
                &CGROUP_MODES,
                "soft, full, strict or ignore",
            )?;
            Some(opts.cgroups_mode.clone())
        };
        Ok(Self {
            image_path,
            work_path,
            leave_running: !opts.exit,
            tcp_established: opts.open_tcp,
            ext_unix_sk: opts.external_unix_sockets,
            shell_job: opts.terminal,
            file_locks: opts.file_locks,
            empty_ns: opts.empty_namespaces.clone(),
            cgroups_mode,
        })
    }

    /// `checkpoint --image-path I --work-path W [flags] ID`, runc's command line.
    pub fn args(&self, id: &str, work_path: &Path) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "checkpoint".into(),
            "--image-path".into(),
            self.image_path.clone().into(),
            "--work-path".into(),
            work_path.into(),
        ];
        let flags = [
            (self.leave_running, "--leave-running"),
            (self.tcp_established, "--tcp-established"),
            (self.ext_unix_sk, "--ext-unix-sk"),
            (self.shell_job, "--shell-job"),
            (self.file_locks, "--file-locks"),
        ];
        args.extend(flags.iter().filter(|(on, _)| *on).map(|(_, f)| f.into()));
        // `--flag=value`: a value can never be read as a flag of its own.
        args.extend(
            self.empty_ns
                .iter()
                .map(|ns| format!("--empty-ns={ns}").into()),
        );
        if let Some(mode) = &self.cgroups_mode {
            args.push(format!("--manage-cgroups-mode={mode}").into());
        }
        args.push(id.into());
        args
    }
}

/// The runtime's `restore` of a task created from a checkpoint, run at its Start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    pub image_path: PathBuf,
    pub work_path: PathBuf,
}

impl RestorePlan {
    /// The plan for a Create whose `checkpoint` is `image`; CRIU works in the bundle.
    pub fn new(image: &str, bundle: &Path) -> Result<Self, CheckpointError> {
        Ok(Self {
            image_path: absolute("checkpoint", image)?,
            work_path: bundle.join(DEFAULT_WORK_DIR),
        })
    }

    /// `restore --image-path I --work-path W --bundle B --detach --pid-file F
    /// [--console-socket S] ID`, runc's command line as containerd's runc shim builds it.
    pub fn args(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "restore".into(),
            "--image-path".into(),
            self.image_path.clone().into(),
            "--work-path".into(),
            self.work_path.clone().into(),
            "--bundle".into(),
            bundle.into(),
            "--detach".into(),
            "--pid-file".into(),
            pid_file.into(),
        ];
        if let Some(socket) = console_socket {
            args.extend(["--console-socket".into(), socket.into()]);
        }
        args.push(id.into());
        args
    }
}

/// The options containerd sent: none (ctr 1.6 for a runtime not named runc) gives runc's
/// defaults, the zero message.
fn decode(options: Option<&Any>) -> Result<CheckpointOptions, CheckpointError> {
    let Some(any) = options else {
        return Ok(CheckpointOptions::default());
    };
    let type_url = any.type_url.rsplit('/').next().unwrap_or_default();
    if type_url.is_empty() && any.value.is_empty() {
        return Ok(CheckpointOptions::default());
    }
    if type_url != CHECKPOINT_OPTIONS_TYPE {
        return Err(CheckpointError::UnsupportedType {
            type_url: any.type_url.clone(),
        });
    }
    CheckpointOptions::parse_from_bytes(&any.value).map_err(CheckpointError::Decode)
}

fn absolute(key: &'static str, value: &str) -> Result<PathBuf, CheckpointError> {
    let path = PathBuf::from(value);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(CheckpointError::Invalid {
            key,
            value: value.to_owned(),
            expected: "expected an absolute path",
        })
    }
}

fn one_of(
    key: &'static str,
    value: &str,
    allowed: &[&str],
    expected: &'static str,
) -> Result<(), CheckpointError> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(CheckpointError::Invalid {
            key,
            value: value.to_owned(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(opts: &CheckpointOptions) -> Any {
        Any {
            type_url: CHECKPOINT_OPTIONS_TYPE.into(),
            value: opts.write_to_bytes().unwrap(),
            ..Default::default()
        }
    }

    fn words(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn no_options_leave_the_task_running_like_runc_shim() {
        // ctr 1.6's `ctr task checkpoint` of a runtime not named runc: no options at all.
        let plan = CheckpointPlan::from_request("/run/ctd-checkpoint1", None).unwrap();
        assert_eq!(
            words(&plan.args("c1", Path::new("/b/criu-work"))),
            [
                "checkpoint",
                "--image-path",
                "/run/ctd-checkpoint1",
                "--work-path",
                "/b/criu-work",
                "--leave-running",
                "c1"
            ]
        );
        assert_eq!(plan.work_path, None);
    }

    #[test]
    fn every_option_maps_to_its_runc_flag() {
        let opts = CheckpointOptions {
            exit: true,
            open_tcp: true,
            external_unix_sockets: true,
            terminal: true,
            file_locks: true,
            empty_namespaces: vec!["network".into(), "ipc".into()],
            cgroups_mode: "soft".into(),
            image_path: "/ignored/when/path/is/set".into(),
            work_path: "/var/work".into(),
            ..Default::default()
        };
        let plan = CheckpointPlan::from_request("/img", Some(&any(&opts))).unwrap();
        assert_eq!(plan.work_path.as_deref(), Some(Path::new("/var/work")));
        assert_eq!(
            words(&plan.args("c1", Path::new("/var/work"))),
            [
                "checkpoint",
                "--image-path",
                "/img",
                "--work-path",
                "/var/work",
                "--tcp-established",
                "--ext-unix-sk",
                "--shell-job",
                "--file-locks",
                "--empty-ns=network",
                "--empty-ns=ipc",
                "--manage-cgroups-mode=soft",
                "c1"
            ]
        );
    }

    #[test]
    fn ctr_containers_checkpoint_defaults_keep_file_locks() {
        // `ctr containers checkpoint --task` sends runc's defaults with file locks on, typed
        // the way containerd 2.x names it.
        let opts = CheckpointOptions {
            file_locks: true,
            ..Default::default()
        };
        let mut any = any(&opts);
        any.type_url = format!("type.googleapis.com/{CHECKPOINT_OPTIONS_TYPE}");
        let plan = CheckpointPlan::from_request("/img", Some(&any)).unwrap();
        assert!(plan.leave_running && plan.file_locks);
        assert!(!plan.tcp_established && !plan.ext_unix_sk && !plan.shell_job);
    }

    #[test]
    fn image_path_is_used_only_without_a_request_path() {
        let opts = CheckpointOptions {
            image_path: "/client/img".into(),
            ..Default::default()
        };
        let plan = CheckpointPlan::from_request("", Some(&any(&opts))).unwrap();
        assert_eq!(plan.image_path, Path::new("/client/img"));
        let e = CheckpointPlan::from_request("", None).unwrap_err();
        assert!(e.to_string().contains("checkpoint option path"), "{e}");
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        let cases = [
            (
                CheckpointOptions {
                    work_path: "relative/work".into(),
                    ..Default::default()
                },
                "work_path",
            ),
            (
                CheckpointOptions {
                    empty_namespaces: vec!["--leave-running".into()],
                    ..Default::default()
                },
                "empty_namespaces",
            ),
            (
                CheckpointOptions {
                    cgroups_mode: "loose".into(),
                    ..Default::default()
                },
                "cgroups_mode",
            ),
        ];
        for (opts, key) in cases {
            let e = CheckpointPlan::from_request("/img", Some(&any(&opts))).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(key), "{text}");
            assert!(text.contains("docs/contracts.md#"), "{text}");
        }
        let e = CheckpointPlan::from_request("img", None).unwrap_err();
        assert!(e.to_string().contains("\"img\""), "{e}");
    }

    #[test]
    fn other_option_types_are_refused_by_name() {
        let other = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: vec![8, 1],
            ..Default::default()
        };
        let e = CheckpointPlan::from_request("/img", Some(&other)).unwrap_err();
        assert!(e.to_string().contains("containerd.runc.v1.Options"), "{e}");
        let garbage = Any {
            type_url: CHECKPOINT_OPTIONS_TYPE.into(),
            value: vec![0xff, 0xff, 0xff],
            ..Default::default()
        };
        assert!(matches!(
            CheckpointPlan::from_request("/img", Some(&garbage)),
            Err(CheckpointError::Decode(_))
        ));
    }

    #[test]
    fn restore_runs_detached_with_the_bundle_and_pid_file() {
        let plan = RestorePlan::new("/run/ctrd-checkpoint2", Path::new("/b")).unwrap();
        assert_eq!(
            words(&plan.args("c1", Path::new("/b"), Path::new("/b/init.pid"), None)),
            [
                "restore",
                "--image-path",
                "/run/ctrd-checkpoint2",
                "--work-path",
                "/b/criu-work",
                "--bundle",
                "/b",
                "--detach",
                "--pid-file",
                "/b/init.pid",
                "c1"
            ]
        );
        let with_tty = plan.args(
            "c1",
            Path::new("/b"),
            Path::new("/b/init.pid"),
            Some(Path::new("/tmp/console.sock")),
        );
        let with_tty = words(&with_tty);
        assert_eq!(
            with_tty[with_tty.len() - 3..],
            ["--console-socket", "/tmp/console.sock", "c1"]
        );
        assert!(RestorePlan::new("relative", Path::new("/b")).is_err());
    }
}
