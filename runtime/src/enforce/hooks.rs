//! OCI hooks with the state runc gives them: `bundle` is the caller's bundle (not the
//! runtime's hardened copy under its state dir) and `ociVersion` is what `state` reports.
//!
//! libcontainer runs the hooks itself with its own state (its bundle is the hardened copy,
//! its version its own), so the hooks it runs at create and start (`prestart`,
//! `createRuntime`, `createContainer`, `poststart`) are wrapped: each becomes
//! `/proc/self/exe hook --bundle B -- PATH ARGS...`, which rewrites the state on its stdin
//! and runs the real hook with it (`/proc/self/exe` is the runtime's own sealed copy for the
//! process that spawns the hook, in the runtime's namespaces or, before the pivot, in the
//! container's). `startContainer` runs after the pivot, where no host binary is reachable:
//! the executor runs those hooks itself ([`crate::enforce::executor`]). `poststop` hooks are kept
//! from libcontainer and run by `delete`, which warns about a failing one and goes on, as
//! the runtime spec asks (libcontainer would fail the delete and keep the container).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libcontainer::oci_spec::runtime::{Hook, Spec};

use crate::state::SandboxDir;

/// The runtime spec version that `state` and every hook's state report.
pub const OCI_VERSION: &str = "1.0.2";

/// Why a hook failed or its state could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("hook {path}: cannot start it")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("hook {path}: exited with {status}{stderr}")]
    Failed {
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("hook {path}: timed out after {seconds} s")]
    Timeout { path: PathBuf, seconds: i64 },
    #[error("hook state on stdin is not JSON")]
    State(#[source] serde_json::Error),
    #[error("cannot read the hook state on stdin")]
    Stdin(#[source] std::io::Error),
    #[error(transparent)]
    SavePoststop(#[from] crate::files::FileError),
}

/// The OCI state a hook reads on stdin.
pub fn state(
    id: &str,
    status: &str,
    pid: Option<i32>,
    bundle: &Path,
    annotations: &std::collections::HashMap<String, String>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "ociVersion": OCI_VERSION,
        "id": id,
        "status": status,
        "bundle": bundle,
        "annotations": annotations,
    });
    if let Some(pid) = pid {
        v["pid"] = pid.into();
    }
    v
}

/// Rewrites the hooks of a hardened `spec` for libcontainer (see the module docs): wraps the
/// create and start hooks so they see the caller's `bundle`, takes the `startContainer`
/// hooks out (returned, for the executor) and saves the `poststop` hooks in `sandbox_dir`.
pub fn prepare(
    spec: &mut Spec,
    bundle: &Path,
    sandbox_dir: &SandboxDir,
) -> Result<Vec<Hook>, HookError> {
    let Some(mut hooks) = spec.hooks().clone() else {
        return Ok(Vec::new());
    };
    let wrap = |list: &Option<Vec<Hook>>| {
        list.as_ref()
            .map(|l| l.iter().map(|h| wrapped(h, bundle)).collect::<Vec<_>>())
    };
    #[allow(deprecated)]
    hooks.set_prestart(wrap(hooks.prestart()));
    hooks.set_create_runtime(wrap(hooks.create_runtime()));
    hooks.set_create_container(wrap(hooks.create_container()));
    hooks.set_poststart(wrap(hooks.poststart()));
    let start_container = hooks.start_container().clone().unwrap_or_default();
    hooks.set_start_container(None);
    let poststop = hooks.poststop().clone().unwrap_or_default();
    hooks.set_poststop(None);
    if !poststop.is_empty() {
        sandbox_dir.poststop().write(&poststop)?;
    }
    spec.set_hooks(Some(hooks));
    Ok(start_container)
}

/// `hook` as `/proc/self/exe hook --bundle B -- PATH ARGS...`, with its env and timeout.
fn wrapped(hook: &Hook, bundle: &Path) -> Hook {
    let mut args = vec![
        "agent-sandbox".to_owned(),
        "hook".to_owned(),
        "--bundle".to_owned(),
        bundle.display().to_string(),
        "--".to_owned(),
        hook.path().display().to_string(),
    ];
    match hook.args() {
        Some(a) if !a.is_empty() => args.extend(a.iter().cloned()),
        _ => args.push(hook.path().display().to_string()),
    }
    let mut w = hook.clone();
    w.set_path(PathBuf::from("/proc/self/exe"));
    w.set_args(Some(args));
    w
}

/// The `poststop` hooks saved at create (none if the sandbox had none).
pub fn saved_poststop(sandbox_dir: &SandboxDir) -> Vec<Hook> {
    sandbox_dir.poststop().read().unwrap_or_default()
}

/// The body of the hidden `hook` command: reads the state libcontainer wrote on stdin, puts
/// the caller's `bundle` and [`OCI_VERSION`] in it and runs `argv` (path, then argv[0] and
/// the arguments) with it, in this process's environment (the hook's own).
pub fn relay(bundle: &Path, argv: &[String]) -> Result<(), HookError> {
    let mut text = Vec::new();
    std::io::stdin()
        .read_to_end(&mut text)
        .map_err(HookError::Stdin)?;
    let mut state: serde_json::Value = serde_json::from_slice(&text).map_err(HookError::State)?;
    state["bundle"] = bundle.display().to_string().into();
    state["ociVersion"] = OCI_VERSION.into();
    let (path, args) = argv
        .split_first()
        .map_or((String::new(), &[][..]), |(p, a)| (p.clone(), a));
    let mut hook = Hook::default();
    hook.set_path(PathBuf::from(path));
    hook.set_args(Some(args.to_vec()));
    hook.set_env(Some(
        std::env::vars().map(|(k, v)| format!("{k}={v}")).collect(),
    ));
    run(&hook, &state)
}

/// Runs one hook with `state` on its stdin: its own environment only, stdout discarded,
/// stderr kept for the error; killed at its timeout.
pub fn run(hook: &Hook, state: &serde_json::Value) -> Result<(), HookError> {
    use std::os::unix::process::CommandExt;
    let path = hook.path().clone();
    let mut cmd = Command::new(&path);
    if let Some((arg0, rest)) = hook.args().as_ref().and_then(|a| a.split_first()) {
        cmd.arg0(arg0).args(rest);
    }
    cmd.env_clear();
    for kv in hook.env().iter().flatten() {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HookError::Spawn {
            path: path.clone(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its state closes the pipe: not an error.
        let _ = stdin.write_all(state.to_string().as_bytes());
    }
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = (&mut e).take(4096).read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).trim().to_owned()
        })
    });
    let deadline = hook
        .timeout()
        .filter(|t| *t > 0)
        .map(|t| (t, Instant::now() + Duration::from_secs(t.unsigned_abs())));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                return Err(HookError::Spawn { path, source });
            }
        }
        if let Some((seconds, at)) = deadline
            && Instant::now() > at
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HookError::Timeout { path, seconds });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    Err(HookError::Failed {
        path,
        status: status.to_string(),
        stderr: if stderr.is_empty() {
            String::new()
        } else {
            format!(": {stderr}")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(path: &str, args: &[&str]) -> Hook {
        let mut h = Hook::default();
        h.set_path(PathBuf::from(path));
        h.set_args(Some(args.iter().map(|s| (*s).to_owned()).collect()));
        h
    }

    #[test]
    fn create_hooks_are_wrapped_start_container_goes_to_the_executor_poststop_to_delete() {
        let root = tempfile::tempdir().unwrap();
        let dir = crate::state::StateDirs::new(root.path().to_owned())
            .sandbox(&crate::state::ContainerId::try_from("h1").unwrap());
        std::fs::create_dir_all(dir.path()).unwrap();
        let mut hooks = libcontainer::oci_spec::runtime::Hooks::default();
        hooks.set_create_runtime(Some(vec![hook("/bin/cr", &["cr", "-x"])]));
        hooks.set_start_container(Some(vec![hook("/bin/sc", &["sc"])]));
        hooks.set_poststop(Some(vec![hook("/bin/ps", &[])]));
        let mut spec = Spec::default();
        spec.set_hooks(Some(hooks));
        let start = prepare(&mut spec, Path::new("/b"), &dir).unwrap();
        assert_eq!(start.len(), 1);
        let out = spec.hooks().clone().unwrap();
        let cr = &out.create_runtime().as_ref().unwrap()[0];
        assert_eq!(cr.path(), Path::new("/proc/self/exe"));
        assert_eq!(
            cr.args().as_deref().unwrap(),
            [
                "agent-sandbox",
                "hook",
                "--bundle",
                "/b",
                "--",
                "/bin/cr",
                "cr",
                "-x"
            ]
        );
        assert!(out.start_container().is_none() && out.poststop().is_none());
        assert_eq!(saved_poststop(&dir).len(), 1);
    }

    #[test]
    fn a_hook_reads_the_state_and_its_failure_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("state");
        let h = hook(
            "/bin/sh",
            &["sh", "-c", &format!("cat > {}", out.display())],
        );
        let st = state("c1", "stopped", None, Path::new("/b"), &Default::default());
        run(&h, &st).unwrap();
        let seen: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(seen["bundle"], "/b");
        assert_eq!(seen["ociVersion"], OCI_VERSION);
        let err = run(&hook("/bin/sh", &["sh", "-c", "echo no >&2; exit 3"]), &st).unwrap_err();
        assert!(
            err.to_string().contains("/bin/sh") && err.to_string().contains("no"),
            "{err}"
        );
    }
}
