//! The artifacts committed under `profiles/generated/`, produced by the compilers from a
//! policy. `agent-sandbox profile seccomp|apparmor|landlock PROFILE` prints the same
//! text, and the golden test compares the files with it.

use crate::policy::{PolicyError, SandboxPolicy};
use crate::seccomp::{self, SeccompError};

/// Why an artifact could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum GeneratedError {
    #[error("cannot load profile")]
    Policy(#[from] PolicyError),
    #[error("cannot generate the seccomp profile")]
    Seccomp(#[from] SeccompError),
    #[error("unknown artifact kind `{kind}` (known: seccomp, apparmor, landlock)")]
    UnknownKind { kind: String },
}

/// The kinds of artifact, with their file suffix under `profiles/generated/`.
pub const KINDS: &[(&str, &str)] = &[
    ("seccomp", "seccomp.json"),
    ("apparmor", "apparmor"),
    ("landlock", "landlock.json"),
];

/// One artifact of `policy` (named `name`, e.g. `agent`) as text.
pub fn artifact(policy: &SandboxPolicy, name: &str, kind: &str) -> Result<String, GeneratedError> {
    match kind {
        "seccomp" => Ok(seccomp::oci_seccomp_json(&policy.syscalls)?),
        "apparmor" => Ok(crate::apparmor::profile(policy, name)),
        "landlock" => Ok(crate::landlock::ruleset(policy).to_json()),
        _ => Err(GeneratedError::UnknownKind {
            kind: kind.to_owned(),
        }),
    }
}

/// Every artifact of a built-in profile: `(file name, text)`.
pub fn builtin_artifacts(name: &str) -> Result<Vec<(String, String)>, GeneratedError> {
    let policy = SandboxPolicy::builtin(name)?;
    KINDS
        .iter()
        .map(|(kind, suffix)| Ok((format!("{name}.{suffix}"), artifact(&policy, name, kind)?)))
        .collect()
}
