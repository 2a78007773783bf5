//! The ceiling: the policy that bounds a sandbox (the admin's file or a built-in profile),
//! saved in the sandbox dir at create so that every later command uses the same one.

use std::path::Path;

use std::collections::HashMap;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::profiles::{self, AdminProfile, ProfileName, Requested};

use super::SandboxError;
use super::profiles::Loaded;
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
    /// The admin's profile the sandbox's `io.agent.sandbox.profile` names
    /// ([`Ceiling::with_profile_for`]); bounded by `policy` like every annotation.
    profile: Option<Loaded>,
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
                    profile: None,
                })
            }
        }
    }

    /// This ceiling with the admin's profile that `annotations` name read from `dir`
    /// (docs/policy.md#profiles-by-annotation). A built-in name or no annotation reads
    /// nothing; a profile this ceiling already carries (a pod's, for its members) is kept.
    /// Whether the profile is within the ceiling is checked where the policy is derived
    /// (`effective_policy_with`).
    pub fn with_profile_for(
        &self,
        annotations: &HashMap<String, String>,
        dir: &Path,
    ) -> Result<Self, SandboxError> {
        let name = match profiles::requested(annotations) {
            Ok(Some(Requested::Admin(name))) => name,
            // A bad name is reported, naming the annotation, by `effective_policy_with`.
            Ok(Some(Requested::Builtin(_)) | None) | Err(_) => return Ok(self.clone()),
        };
        if self.admin_profile().is_some_and(|p| p.name == name) {
            return Ok(self.clone());
        }
        let loaded = super::profiles::load(dir, &name)?;
        tracing::info!(
            profile = %name,
            origin = %loaded.profile.origin,
            "admin profile selected by annotation"
        );
        Ok(Self {
            profile: Some(loaded),
            ..self.clone()
        })
    }

    /// The admin's profile selected for this sandbox, if any.
    pub fn admin_profile(&self) -> Option<&AdminProfile> {
        self.profile.as_ref().map(|l| &l.profile)
    }

    fn builtin(name: &str) -> Result<Self, SandboxError> {
        let text =
            agent_sandbox_policy::policy::builtin_text(name).map_err(SandboxError::Policy)?;
        let policy = SandboxPolicy::builtin(name).map_err(SandboxError::Policy)?;
        Ok(Self {
            policy,
            origin: name.to_owned(),
            text: text.to_owned(),
            profile: None,
        })
    }

    pub fn save(&self, dir: &SandboxDir) -> Result<(), SandboxError> {
        let text = format!("# origin: {}\n{}", self.origin, self.text);
        crate::files::write(&dir.ceiling(), text)?;
        if let Some(loaded) = &self.profile {
            let text = format!(
                "# profile: {}\n# origin: {}\n{}",
                loaded.profile.name, loaded.profile.origin, loaded.text
            );
            crate::files::write(&dir.admin_profile(), text)?;
        }
        Ok(())
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
            profile: load_saved_profile(dir)?,
        })
    }
}

/// The admin's profile saved at create, if the sandbox has one.
fn load_saved_profile(dir: &SandboxDir) -> Result<Option<Loaded>, SandboxError> {
    let path = dir.admin_profile();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SandboxError::ReadPolicy { path, source }),
    };
    let mut lines = text.lines();
    let header = |line: Option<&str>, key: &str| {
        line.and_then(|l| l.strip_prefix(key))
            .map(str::to_owned)
            .ok_or_else(|| SandboxError::ReadPolicy {
                path: path.clone(),
                source: std::io::Error::other(format!("no `{key}` line")),
            })
    };
    let name = header(lines.next(), "# profile: ")?;
    let origin = header(lines.next(), "# origin: ")?;
    let name = ProfileName::try_from(name.as_str()).map_err(|e| SandboxError::ReadPolicy {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    let body: String = lines.map(|l| format!("{l}\n")).collect();
    let policy =
        SandboxPolicy::parse(&body, &path.display().to_string()).map_err(SandboxError::Policy)?;
    Ok(Some(Loaded {
        profile: AdminProfile {
            name,
            origin,
            policy,
        },
        text: body,
    }))
}
