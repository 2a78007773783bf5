//! The task service's errors and the one place they become ttrpc status codes.

use std::path::PathBuf;

use containerd_shim::protos::ttrpc::{Code, Error, get_status};

use crate::cgroup::CgroupError;
use crate::checkpoint::CheckpointError;
use crate::options::OptionsError;
use crate::process::WrongState;
use crate::rootfs::RootfsError;
use crate::runtime::RuntimeError;
use crate::stdio::StdioError;

/// Errors of the task service. Each names the container, exec, file or field it is about.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("container {id} not found")]
    ContainerNotFound { id: String },
    #[error("exec {exec_id} not found in container {id}")]
    ExecNotFound { id: String, exec_id: String },
    #[error("container {id} already exists")]
    ContainerExists { id: String },
    #[error("exec {exec_id} already exists in container {id}")]
    ExecExists { id: String, exec_id: String },
    #[error("invalid {field} {value:?}: use letters, digits, '.', '_' or '-'")]
    InvalidId { field: &'static str, value: String },
    #[error("process {id} is {state}, expected {expected}")]
    WrongState {
        id: String,
        state: &'static str,
        expected: &'static str,
    },
    #[error("process {id} already finished")]
    Finished { id: String },
    #[error("invalid signal {signal}")]
    Signal { signal: u32 },
    #[error("exec {exec_id} has no process spec")]
    NoSpec { exec_id: String },
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Stdio(#[from] StdioError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("container {id} has no cgroup to read")]
    NoCgroup { id: String },
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("cannot encode the metrics")]
    Encode(#[source] containerd_shim::Error),
    #[error("cannot access {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid pid in {path}")]
    PidFile { path: PathBuf },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "{operation} of {id} failed{}",
        log.as_ref().map(|l| format!(" (CRIU log: {})", l.display())).unwrap_or_default()
    )]
    Criu {
        operation: &'static str,
        id: String,
        log: Option<PathBuf>,
        #[source]
        source: Box<RuntimeError>,
    },
}

impl TaskError {
    /// A refused state transition of the process named `id` (a container or an exec id).
    pub fn wrong_state(id: &str, wrong: WrongState) -> Self {
        Self::WrongState {
            id: id.to_owned(),
            state: wrong.state.name(),
            expected: wrong.expected,
        }
    }

    /// The ttrpc status code containerd sees; it decides, for example, that a kill of a
    /// process that is gone (NotFound) means "already stopped". NotFound means a missing
    /// container or process and nothing else, as from containerd's runc shim: a runtime
    /// failure is Unknown whatever its text says (an exec of a program not in `$PATH` is
    /// "not found" too, and CRI callers would read NotFound as "no such container"). The
    /// RPCs that expect a missing container from the runtime (kill) say so with their own
    /// variant.
    fn code(&self) -> Code {
        match self {
            Self::ContainerNotFound { .. } | Self::ExecNotFound { .. } | Self::Finished { .. } => {
                Code::NOT_FOUND
            }
            Self::ContainerExists { .. } | Self::ExecExists { .. } => Code::ALREADY_EXISTS,
            Self::InvalidId { .. }
            | Self::Signal { .. }
            | Self::NoSpec { .. }
            | Self::Options(_)
            | Self::Checkpoint(_) => Code::INVALID_ARGUMENT,
            Self::WrongState { .. } | Self::NoCgroup { .. } => Code::FAILED_PRECONDITION,
            Self::Runtime(_)
            | Self::Stdio(_)
            | Self::Cgroup(_)
            | Self::Rootfs(_)
            | Self::Encode(_)
            | Self::Criu { .. }
            | Self::File { .. }
            | Self::PidFile { .. } => Code::UNKNOWN,
        }
    }
}

impl From<TaskError> for Error {
    fn from(e: TaskError) -> Self {
        Error::RpcStatus(get_status(e.code(), error_chain(&e)))
    }
}

/// "outer: inner: innermost", the whole chain for the client.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcState;

    fn code(e: TaskError) -> Code {
        match Error::from(e) {
            Error::RpcStatus(s) => s.code(),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn errors_map_to_ttrpc_codes() {
        assert_eq!(
            code(TaskError::ContainerNotFound { id: "a".into() }),
            Code::NOT_FOUND
        );
        assert_eq!(
            code(TaskError::ContainerExists { id: "a".into() }),
            Code::ALREADY_EXISTS
        );
        assert_eq!(
            code(TaskError::InvalidId {
                field: "exec id",
                value: "../x".into()
            }),
            Code::INVALID_ARGUMENT
        );
        assert_eq!(
            code(TaskError::Checkpoint(CheckpointError::Invalid {
                key: "work_path",
                value: "w".into(),
                expected: "expected an absolute path",
            })),
            Code::INVALID_ARGUMENT
        );
        assert_eq!(
            code(TaskError::Runtime(RuntimeError::Failed {
                binary: "/r".into(),
                command: "exec",
                code: 1,
                message: "exec: \"nonexistent-binary\": executable file not found in $PATH".into(),
            })),
            Code::UNKNOWN
        );
        assert_eq!(
            code(TaskError::Runtime(RuntimeError::Failed {
                binary: "/r".into(),
                command: "kill",
                code: 1,
                message: "permission denied".into(),
            })),
            Code::UNKNOWN
        );
    }

    #[test]
    fn a_refused_transition_names_the_process_and_both_states() {
        let e = TaskError::wrong_state(
            "exec-1",
            WrongState {
                state: ProcState::Running,
                expected: "stopped",
            },
        );
        assert_eq!(e.to_string(), "process exec-1 is running, expected stopped");
        assert_eq!(code(e), Code::FAILED_PRECONDITION);
    }

    #[test]
    fn chain_carries_the_cause() {
        let e = TaskError::Runtime(RuntimeError::Failed {
            binary: "/r".into(),
            command: "create",
            code: 1,
            message: "seccomp layer cannot be applied".into(),
        });
        let Error::RpcStatus(s) = Error::from(e) else {
            panic!()
        };
        assert!(
            s.message().contains("seccomp layer cannot be applied"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn chain_names_the_file() {
        let e = TaskError::File {
            path: "/b/exec-1.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            error_chain(&e),
            "cannot access /b/exec-1.json: permission denied"
        );
    }
}
