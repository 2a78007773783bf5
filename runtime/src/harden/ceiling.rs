//! The ceiling: the policy that bounds a sandbox (the admin's file or a built-in profile),
//! saved in the sandbox dir at create so that every later command uses the same one.

use std::path::Path;

use agent_sandbox_policy::SandboxPolicy;

use super::SandboxError;
use crate::state::SandboxDir;

/// The profile used when nothing else selects one.
pub const DEFAULT_PROFILE: &str = "agent";

/// The ceiling policy: the admin's file, or the built-in `agent`. Saved in the
/// sandbox dir at create so every exec uses the same one.
#[derive(Debug, Clone)]
pub struct Ceiling {
    pub policy: SandboxPolicy,
    /// Built-in name or file path, for logs.
    pub origin: String,
    text: String,
}

impl Ceiling {
    /// `admin` (from `--policy` / `AGENT_SANDBOX_POLICY`) is a file path or a
    /// built-in profile name.
    pub fn load(admin: Option<&Path>) -> Result<Self, SandboxError> {
        match admin {
            None => Self::builtin(DEFAULT_PROFILE),
            Some(p)
                if !p.exists()
                    && agent_sandbox_policy::builtin_names()
                        .contains(&p.to_string_lossy().as_ref()) =>
            {
                Self::builtin(&p.to_string_lossy())
            }
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| {
                    // Not the io error's text: podman reads "no such file or directory" in
                    // a runtime's error as its own "command not found" (exit 127).
                    if source.kind() == std::io::ErrorKind::NotFound {
                        SandboxError::MissingPolicy {
                            path: path.to_owned(),
                        }
                    } else {
                        SandboxError::ReadPolicy {
                            path: path.to_owned(),
                            source,
                        }
                    }
                })?;
                let origin = path.display().to_string();
                let policy = SandboxPolicy::parse(&text, &origin).map_err(SandboxError::Policy)?;
                Ok(Self {
                    policy,
                    origin,
                    text,
                })
            }
        }
    }

    fn builtin(name: &str) -> Result<Self, SandboxError> {
        let text =
            agent_sandbox_policy::policy::builtin_text(name).map_err(SandboxError::Policy)?;
        let policy = SandboxPolicy::builtin(name).map_err(SandboxError::Policy)?;
        Ok(Self {
            policy,
            origin: name.to_owned(),
            text: text.to_owned(),
        })
    }

    pub fn save(&self, dir: &SandboxDir) -> Result<(), SandboxError> {
        let text = format!("# origin: {}\n{}", self.origin, self.text);
        Ok(crate::files::write(&dir.ceiling(), text)?)
    }

    /// The ceiling saved at create (exec uses it, whatever flags it got).
    pub fn load_saved(dir: &SandboxDir) -> Result<Self, SandboxError> {
        let path = dir.ceiling();
        let text = std::fs::read_to_string(&path).map_err(|source| SandboxError::ReadPolicy {
            path: path.clone(),
            source,
        })?;
        let origin = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# origin: "))
            .unwrap_or("saved")
            .to_owned();
        let policy = SandboxPolicy::parse(&text, &path.display().to_string())
            .map_err(SandboxError::Policy)?;
        Ok(Self {
            policy,
            origin,
            text,
        })
    }
}
