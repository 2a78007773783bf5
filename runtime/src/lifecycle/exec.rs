//! `exec`: a process in a running sandbox, hardened like the init and under the same
//! in-process layers.

use std::collections::HashMap;
use std::sync::Arc;

use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::{Process, Spec};

use super::{BuildError, ExecOpts, LookupError, PlanError, Runtime, in_root_dir};
use crate::enforce;
use crate::state::ContainerId;

/// Errors of `exec`, by its phase: finding the container and its process, the saved plan,
/// clamping the process, recording it, building it with libcontainer, waiting for it. The
/// texts are runc's where callers match on them ("container not running").
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("container not running")]
    NotRunning,
    /// The process file (`--process`) or, for the inline form, the bundle's config.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("cannot read bundle config {path}")]
    BundleConfig {
        path: std::path::PathBuf,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error(transparent)]
    ToolCall(#[from] agent_sandbox_audit::ToolCallError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Clamping the process, or building the executor's layers from the plan.
    #[error(transparent)]
    Sandbox(#[from] crate::harden::SandboxError),
    #[error(transparent)]
    Rlimit(#[from] crate::host::rlimits::RlimitError),
    #[error(transparent)]
    Enforce(#[from] enforce::EnforceError),
    #[error("audit trail")]
    Audit(#[source] agent_sandbox_audit::AuditError),
    #[error("denied-syscall audit")]
    SyscallAudit(#[from] crate::sidecars::syscall_audit::SyscallAuditError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("exec failed")]
    Exec(#[source] Box<libcontainer::error::LibcontainerError>),
    #[error("cannot wait for process {pid}")]
    Wait {
        pid: i32,
        #[source]
        source: nix::Error,
    },
}

type Result<T> = std::result::Result<T, ExecError>;

impl Runtime {
    /// `exec`: runs a process in the sandbox, clamped like the init and under
    /// the same seccomp filter and Landlock rules. Returns the exit code when
    /// not detached.
    pub fn exec(&self, id: &ContainerId, opts: &ExecOpts) -> Result<Option<i32>> {
        let c = self.load(id)?;
        if c.status() != ContainerStatus::Running {
            return Err(ExecError::NotRunning);
        }
        crate::host::cgroups::warm::start();
        let mut process: Process = match &opts.process {
            Some(path) => crate::files::read_json(path)?,
            None => inline_process(&c, opts)?,
        };
        take_tool_call_argv(&mut process)?;
        let dir = self.dirs.sandbox(id);
        let (plan, hardened) = self.saved_plan(id, c.bundle())?;
        let policy = &plan.policy;
        let name = process_name(opts, &hardened);
        let mut process = plan
            .harden_exec(process)
            .map_err(crate::harden::SandboxError::Harden)?;
        // In this process, before libcontainer forks (crate::host::rlimits).
        let rlimit_clamps =
            crate::host::rlimits::raise(&crate::host::rlimits::ThisProcess, &mut process)?;
        agent_sandbox_policy::harden::writable_home(&mut process, policy, &hardened);
        crate::sidecars::egress::inject_env(&mut process, policy);
        crate::sidecars::tls_trust::inject_env(&mut process, &plan);
        crate::sidecars::trail::exec(&self.dirs, id, &process, &hardened, &name)
            .map_err(ExecError::Audit)?;
        crate::sidecars::trail::clamped(&self.dirs, id, &rlimit_clamps)
            .map_err(ExecError::Audit)?;
        let process_for_audit = process.clone();
        enforce::verify_process(&process)?;
        let mut executor = crate::harden::executor(&plan)?;
        let init_pid = c.pid().map(|p| p.as_raw()).ok_or(ExecError::NotRunning)?;
        let (process, join) = enforce::tenant_join_userns(process, init_pid)?;
        executor.join_userns = Some(Arc::new(join));
        self.notify_denials(id, &mut executor, policy, false, false)?;
        let clamped_file = dir.exec_process(std::process::id());
        clamped_file.write(&process)?;
        let clamped = clamped_file.path().to_owned();
        let tenant = self
            .builder(id)?
            .with_pid_file(opts.pid_file.as_ref())
            .map_err(|source| ExecError::Exec(Box::new(source)))?
            .with_console_socket(opts.console_socket.as_ref())
            .with_preserved_fds(opts.preserve_fds)
            .with_executor(executor)
            .as_tenant()
            .with_process(Some(&clamped))
            .with_detach(opts.detach);
        let result = in_root_dir(|| tenant.build());
        let _ = std::fs::remove_file(&clamped);
        let pid = result?.map_err(|source| ExecError::Exec(Box::new(source)))?;
        crate::sidecars::trail::tag_exec(
            &self.dirs,
            id,
            pid.as_raw(),
            &process_for_audit,
            &hardened,
            &name,
        );
        if opts.detach {
            let exec_id = name.id.as_deref().unwrap_or("exec");
            crate::sidecars::exec_exit::watch(&self.dirs, id, pid.as_raw(), exec_id);
            return Ok(None);
        }
        let status = wait_exit(pid.as_raw())?;
        crate::sidecars::trail::exited(
            &self.dirs,
            id,
            &crate::sidecars::trail::ExitReport {
                process: name.id.clone().unwrap_or_else(|| "exec".to_owned()),
                pid: Some(pid.as_raw()),
                status,
                reaped_by: None,
            },
        )
        .map_err(ExecError::Audit)?;
        Ok(Some(match status {
            agent_sandbox_audit::ExitStatus::Code(c) => c,
            agent_sandbox_audit::ExitStatus::Signal(n) => 128 + n,
            agent_sandbox_audit::ExitStatus::Unknown => 255,
        }))
    }
}

/// The argv form of a tool-call id (`env AGENT_SANDBOX_TOOL_CALL_ID=ID PROGRAM...`, for
/// CRI's `ExecSync`, whose request has no environment): stripped from argv and set in the
/// process's environment, as `env` would have set it, so the program runs as PROGRAM and the
/// id counts as the environment form's. Either form's id must be a valid one, or the exec
/// is refused before anything runs (docs/audit.md#tool-call-ids).
fn take_tool_call_argv(process: &mut Process) -> Result<()> {
    use agent_sandbox_audit::TOOL_CALL_ENV;
    let args = process.args().clone().unwrap_or_default();
    if let Some((call, rest)) = agent_sandbox_audit::split_tool_call_argv(&args)? {
        let mut env: Vec<String> = process
            .env()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|kv| kv.split_once('=').map_or(kv.as_str(), |(k, _)| k) != TOOL_CALL_ENV)
            .collect();
        env.push(format!("{TOOL_CALL_ENV}={call}"));
        process.set_args(Some(rest.to_vec()));
        process.set_env(Some(env));
    }
    agent_sandbox_audit::check_tool_call_env(process.env().as_deref().unwrap_or_default())?;
    Ok(())
}

/// The exec's name for its records: the exec id our shim passes (`--exec-id`), else the
/// one its caller's pid file names (podman's session, the runc shim's exec id). A ctr exec
/// id is chosen by the harness (`ctr task exec --exec-id ID`), so it also names the tool
/// call when nothing else does; CRI's are generated by containerd, so they do not.
fn process_name(opts: &ExecOpts, hardened: &Spec) -> crate::sidecars::trail::ProcessName {
    let cri = hardened
        .annotations()
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::pod::CONTAINER_TYPE_ANNOTATION));
    match &opts.exec_id {
        Some(id) => crate::sidecars::trail::ProcessName {
            id: Some(id.clone()),
            is_tool_call: !cri,
        },
        None => crate::sidecars::trail::ProcessName {
            id: Some(crate::sidecars::exec_exit::exec_id(
                opts.pid_file.as_deref().filter(|_| opts.detach),
            )),
            is_tool_call: false,
        },
    }
}

fn inline_process(c: &Container, opts: &ExecOpts) -> Result<Process> {
    let config = c.bundle().join("config.json");
    let spec = Spec::load(&config).map_err(|source| ExecError::BundleConfig {
        path: config.clone(),
        source,
    })?;
    let mut p = spec.process().clone().unwrap_or_default();
    p.set_args(Some(opts.args.clone()));
    let mut env: HashMap<String, String> = p
        .env()
        .clone()
        .unwrap_or_default()
        .iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    for kv in &opts.env {
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    p.set_env(Some(
        env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
    ));
    if let Some(cwd) = &opts.cwd {
        p.set_cwd(cwd.clone());
    }
    p.set_terminal(Some(opts.tty));
    if let Some((uid, gid)) = opts.user {
        let mut u = libcontainer::oci_spec::runtime::User::default();
        u.set_uid(uid);
        u.set_gid(gid.unwrap_or(0));
        p.set_user(u);
    }
    Ok(p)
}

fn wait_exit(pid: i32) -> Result<agent_sandbox_audit::ExitStatus> {
    use agent_sandbox_audit::ExitStatus;
    use nix::sys::wait::{WaitStatus, waitpid};
    let p = nix::unistd::Pid::from_raw(pid);
    loop {
        match waitpid(p, None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::Code(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(ExitStatus::Signal(sig as i32)),
            Ok(_) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(source) => return Err(ExecError::Wait { pid, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::fixture::Sandbox;

    fn opts() -> ExecOpts {
        ExecOpts {
            process: None,
            args: vec!["sh".to_owned()],
            env: Vec::new(),
            cwd: None,
            tty: false,
            user: None,
            detach: false,
            pid_file: None,
            console_socket: None,
            preserve_fds: 0,
            exec_id: None,
        }
    }

    /// This test process: an init that is read, never signalled.
    fn this_process() -> i32 {
        i32::try_from(std::process::id()).unwrap()
    }

    /// The records of execs in the sandbox's audit log (the init's included).
    fn exec_records(s: &Sandbox) -> usize {
        s.audit_events()
            .iter()
            .filter(|e| e["kind"] == "exec")
            .count()
    }

    /// runc's answer for a sandbox that is not running; nothing is recorded.
    #[test]
    fn an_exec_into_a_sandbox_that_is_not_running_is_refused() {
        let s = Sandbox::created("exec-created", &Spec::default(), this_process());
        let records = exec_records(&s);
        let err = s.runtime.exec(&s.id, &opts()).unwrap_err();
        assert!(matches!(err, ExecError::NotRunning), "{err:?}");
        assert_eq!(exec_records(&s), records);
    }

    /// A process whose tool-call id is not valid is refused before it is hardened,
    /// recorded or written for libcontainer.
    #[test]
    fn a_bad_tool_call_id_is_refused_before_anything_runs() {
        let s = Sandbox::created("exec-badid", &Spec::default(), this_process());
        s.engine.set_status(s.id.as_str(), ContainerStatus::Running);
        let records = exec_records(&s);
        let file = s.runtime.dirs.root.join("process.json");
        std::fs::write(
            &file,
            serde_json::to_vec(&process(&["true"], &["AGENT_SANDBOX_TOOL_CALL_ID=a b"])).unwrap(),
        )
        .unwrap();
        let run = ExecOpts {
            process: Some(file),
            ..opts()
        };
        let err = s.runtime.exec(&s.id, &run).unwrap_err();
        assert!(matches!(err, ExecError::ToolCall(_)), "{err:?}");
        assert_eq!(exec_records(&s), records);
        let clamped = s
            .runtime
            .dirs
            .sandbox(&s.id)
            .exec_process(std::process::id());
        assert!(!clamped.path().exists());
    }

    /// Our shim's exec id names a tool call, except under CRI, whose ids containerd makes
    /// up; without one, the caller's pid file names the exec.
    #[test]
    fn the_exec_id_names_a_tool_call_outside_cri_only() {
        let plain = Spec::default();
        let cri = crate::test_support::spec_with_annotations(&[(
            crate::pod::CONTAINER_TYPE_ANNOTATION,
            "container",
        )]);
        let shim = ExecOpts {
            exec_id: Some("call-1".to_owned()),
            ..opts()
        };
        let name = process_name(&shim, &plain);
        assert_eq!(
            (name.id.as_deref(), name.is_tool_call),
            (Some("call-1"), true)
        );
        let name = process_name(&shim, &cri);
        assert_eq!(
            (name.id.as_deref(), name.is_tool_call),
            (Some("call-1"), false)
        );
        let podman = ExecOpts {
            detach: true,
            pid_file: Some(std::path::PathBuf::from("/run/x/exec-abc123.pid")),
            ..opts()
        };
        let name = process_name(&podman, &plain);
        assert_eq!(
            (name.id.as_deref(), name.is_tool_call),
            (Some("abc123"), false)
        );
    }

    /// Without `--process`, the bundle's process with the command line's argv, extra
    /// environment (winning over the bundle's), cwd, terminal and user.
    #[test]
    fn an_inline_exec_takes_the_bundles_process_and_the_flags_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = Spec::default();
        let mut bundle_process = process(&["sleep", "1"], &["PATH=/bin", "HOME=/root"]);
        bundle_process.set_cwd("/".into());
        spec.set_process(Some(bundle_process));
        spec.save(dir.path().join("config.json")).unwrap();
        let mut c = Container::default();
        c.state.bundle = dir.path().to_owned();
        let flags = ExecOpts {
            args: vec!["id".to_owned(), "-u".to_owned()],
            env: vec!["HOME=/home/agent".to_owned(), "X=1".to_owned()],
            cwd: Some("/work".into()),
            tty: true,
            user: Some((1000, None)),
            ..opts()
        };
        let p = inline_process(&c, &flags).unwrap();
        assert_eq!(p.args().as_deref().unwrap(), ["id", "-u"]);
        let mut env = p.env().clone().unwrap();
        env.sort();
        assert_eq!(env, ["HOME=/home/agent", "PATH=/bin", "X=1"]);
        assert_eq!(p.cwd(), std::path::Path::new("/work"));
        assert_eq!(p.terminal(), Some(true));
        assert_eq!((p.user().uid(), p.user().gid()), (1000, 0));
        // A bundle without config is named in the error.
        let mut gone = Container::default();
        gone.state.bundle = dir.path().join("missing");
        let err = inline_process(&gone, &flags).unwrap_err();
        assert!(
            matches!(&err, ExecError::BundleConfig { path, .. } if path == &dir.path().join("missing").join("config.json")),
            "{err:?}"
        );
    }

    fn process(args: &[&str], env: &[&str]) -> Process {
        let mut p = Process::default();
        p.set_args(Some(args.iter().map(|a| (*a).to_owned()).collect()));
        p.set_env(Some(env.iter().map(|e| (*e).to_owned()).collect()));
        p
    }

    #[test]
    fn the_argv_form_moves_into_the_environment_replacing_an_env_id() {
        let mut p = process(
            &[
                "env",
                "AGENT_SANDBOX_TOOL_CALL_ID=toolu_argv",
                "sh",
                "-c",
                "true",
            ],
            &["PATH=/bin", "AGENT_SANDBOX_TOOL_CALL_ID=toolu_env"],
        );
        take_tool_call_argv(&mut p).unwrap();
        assert_eq!(p.args().as_deref().unwrap(), ["sh", "-c", "true"]);
        assert_eq!(
            p.env().as_deref().unwrap(),
            ["PATH=/bin", "AGENT_SANDBOX_TOOL_CALL_ID=toolu_argv"]
        );
        // Any other argv is left as it is; a bad id in the environment is refused.
        let mut p = process(&["/usr/bin/env", "AGENT_SANDBOX_TOOL_CALL_ID=t", "sh"], &[]);
        take_tool_call_argv(&mut p).unwrap();
        assert_eq!(p.args().as_deref().unwrap()[0], "/usr/bin/env");
        let mut p = process(&["true"], &["AGENT_SANDBOX_TOOL_CALL_ID=a b"]);
        assert!(matches!(
            take_tool_call_argv(&mut p),
            Err(ExecError::ToolCall(_))
        ));
    }
}
