//! `agent-sandbox allow ID RULE` and `deny ID RULE`: change a running sandbox's egress
//! allowlist for its life (docs/egress.md, "Approvals").
//!
//! The runtime reaches the sandbox's proxy through a control socket in the sandbox's state
//! directory on the host (`ROOT/sandbox/ID/egress.sock`, mode 0600): the sandbox never sees
//! that directory, and the proxy answers only a peer with its own uid (root for a rootful
//! sandbox). The proxy checks an `allow` against the policy's `network.approvals.ceiling`
//! and records every change in the audit log.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_proxy::approval::{Change, ChangeAction, ChangeReply};

use crate::state::SandboxDir;

/// Errors of `allow` / `deny` and of the control socket.
#[derive(Debug, thiserror::Error)]
pub enum AllowError {
    #[error("sandbox {id} does not exist")]
    NoSandbox { id: String },
    #[error(
        "sandbox {id} has no egress proxy (its policy's network.mode is not `proxy`, or the proxy stopped; docs/egress.md)"
    )]
    NoProxy { id: String },
    #[error("cannot open the sandbox directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the egress proxy's control socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind the egress proxy's control socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the egress proxy's control socket {path} failed")]
    Exchange {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the egress proxy's answer is not valid")]
    Answer(#[source] serde_json::Error),
    #[error("{action} {rule} refused: {message}")]
    Refused {
        action: &'static str,
        rule: String,
        message: String,
    },
}

/// Runs `f` with a path to `name` in `dir` that fits a socket address however long `dir`
/// is: `/proc/self/fd/N/name`, through a descriptor of the directory.
fn via_dir_fd<T>(
    dir: &Path,
    name: &str,
    f: impl FnOnce(&Path) -> std::io::Result<T>,
) -> Result<std::io::Result<T>, AllowError> {
    let handle = std::fs::File::open(dir).map_err(|source| AllowError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{name}", handle.as_raw_fd()));
    let result = f(&short);
    drop(handle);
    Ok(result)
}

/// Binds the control socket in the sandbox directory `dir` (the proxy calls this), mode 0600.
pub fn bind(dir: &SandboxDir) -> Result<UnixListener, AllowError> {
    let path = dir.egress_socket();
    let bind_error = |source| AllowError::Bind {
        path: path.clone(),
        source,
    };
    let _ = std::fs::remove_file(&path);
    let listener = via_dir_fd(dir.path(), SandboxDir::EGRESS_SOCKET, |p| {
        UnixListener::bind(p)
    })?
    .map_err(bind_error)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    Ok(listener)
}

/// Sends `action rule` to the proxy of sandbox `id` (state directory `dir`) and returns the
/// proxy's confirmation.
pub fn change(
    dir: &SandboxDir,
    id: &str,
    action: ChangeAction,
    rule: &str,
) -> Result<String, AllowError> {
    if !dir.path().is_dir() {
        return Err(AllowError::NoSandbox { id: id.to_owned() });
    }
    let path = dir.egress_socket();
    if !path.exists() {
        return Err(AllowError::NoProxy { id: id.to_owned() });
    }
    let mut stream = via_dir_fd(dir.path(), SandboxDir::EGRESS_SOCKET, |p| {
        UnixStream::connect(p)
    })?
    .map_err(|source| match source.kind() {
        std::io::ErrorKind::ConnectionRefused => AllowError::NoProxy { id: id.to_owned() },
        _ => AllowError::Connect {
            path: path.clone(),
            source,
        },
    })?;
    let exchange = |source| AllowError::Exchange {
        path: path.clone(),
        source,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(exchange)?;
    let request = Change {
        action,
        rule: rule.to_owned(),
    };
    let body = serde_json::to_vec(&request).map_err(AllowError::Answer)?;
    stream.write_all(&body).map_err(exchange)?;
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(exchange)?;
    let mut answer = Vec::new();
    stream
        .take(64 * 1024)
        .read_to_end(&mut answer)
        .map_err(exchange)?;
    let reply: ChangeReply = serde_json::from_slice(&answer).map_err(AllowError::Answer)?;
    if reply.ok {
        Ok(reply.message)
    } else {
        Err(AllowError::Refused {
            action: match action {
                ChangeAction::Allow => "allow",
                ChangeAction::Deny => "deny",
            },
            rule: rule.to_owned(),
            message: reply.message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_directory_still_binds_and_connects() {
        let base = tempfile::tempdir().unwrap();
        let dir = crate::state::StateDirs::new(base.path().join("d".repeat(120)))
            .sandbox(&crate::state::ContainerId::try_from("sb").unwrap());
        std::fs::create_dir_all(dir.path()).unwrap();
        let listener = bind(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.egress_socket())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            let change: Change = serde_json::from_slice(&got).unwrap();
            assert_eq!(change.rule, "a.example.com");
            s.write_all(br#"{"ok":false,"message":"outside"}"#).unwrap();
        });
        let e = change(&dir, "sb", ChangeAction::Allow, "a.example.com").unwrap_err();
        assert!(
            e.to_string()
                .contains("allow a.example.com refused: outside"),
            "{e}"
        );
        server.join().unwrap();
        std::fs::remove_file(dir.egress_socket()).unwrap();
        assert!(matches!(
            change(&dir, "sb", ChangeAction::Deny, "a.example.com"),
            Err(AllowError::NoProxy { .. })
        ));
    }
}
