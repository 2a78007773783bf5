//! The workload executor: runs inside the container's init (and inside every
//! exec'd process) after libcontainer has pivoted, dropped capabilities and
//! set no_new_privs, and applies the last two layers just before `execve`:
//! Landlock, then the seccomp filter (last, so it need not allow the Landlock
//! syscalls). libcontainer is built without libseccomp, so this is the only
//! place seccomp is applied, for init and exec alike.

use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError, default};
use seccompiler::BpfProgram;

/// A filesystem rule set applied with Landlock in the container process.
pub trait LandlockApply: Send + Sync {
    /// Restricts the calling thread; an error aborts the start.
    fn apply(&self) -> Result<(), String>;
}

/// Applies the sandbox's in-process layers, then execs the workload.
#[derive(Clone, Default)]
pub struct SandboxExecutor {
    pub seccomp: Option<Arc<BpfProgram>>,
    pub landlock: Option<Arc<dyn LandlockApply>>,
}

impl Executor for SandboxExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        if let Some(landlock) = &self.landlock {
            landlock
                .apply()
                .map_err(|e| ExecutorError::Other(format!("landlock layer: {e}")))?;
        }
        if let Some(bpf) = &self.seccomp {
            seccompiler::apply_filter(bpf)
                .map_err(|e| ExecutorError::Other(format!("seccomp layer: {e}")))?;
        }
        default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        default::get_executor().validate(spec)
    }
}
