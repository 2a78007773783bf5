//! `policy explain` and `profile`: a policy for a person, and the artifacts compiled from it.

use std::path::Path;

use crate::harden::Ceiling;

use super::CliError;

/// `policy explain PROFILE`: what the sandbox allows and denies.
pub(super) fn explain(profile: &Path) -> Result<(), CliError> {
    let c = Ceiling::load(Some(profile))?;
    print!("{}", agent_sandbox_policy::explain::explain(&c.policy));
    Ok(())
}

/// `profile seccomp|apparmor|landlock PROFILE`: a generated artifact.
pub(super) fn profile(kind: &str, profile: &Path) -> Result<(), CliError> {
    let c = Ceiling::load(Some(profile))?;
    let name = profile
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| c.origin.clone());
    let text =
        agent_sandbox_policy::generated::artifact(&c.policy, &name, kind).map_err(|source| {
            CliError::Artifact {
                profile: c.origin.clone(),
                source,
            }
        })?;
    print!("{text}");
    Ok(())
}
