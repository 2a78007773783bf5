//! Profiles the annotation `io.agent.sandbox.profile` may name: a built-in one, or one of
//! the admin's files in the profiles directory. This crate does no I/O: the runtime reads
//! the admin's file (docs/policy.md#profiles-by-annotation) and hands it over parsed as an
//! [`AdminProfile`]; [`crate::harden::effective_policy_with`] checks it against the ceiling.
//!
//! The annotation's value is hostile input (any pod author, any `podman run --annotation`):
//! [`ProfileName`] admits only `[a-z0-9][a-z0-9_-]*` of at most [`NAME_MAX`] bytes, so a name
//! can never be a path, a hidden file or an option.

use std::collections::HashMap;
use std::fmt;

use oci_spec::runtime::Spec;

use crate::harden::{ANNOTATION_PROFILE, HardenError};
use crate::policy::{SandboxPolicy, builtin_names};

/// The longest profile name accepted.
pub const NAME_MAX: usize = 64;

/// The file name extension of a profile in the profiles directory.
pub const EXTENSION: &str = ".toml";

/// A profile name from an annotation: `[a-z0-9][a-z0-9_-]*`, 1 to [`NAME_MAX`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProfileName(String);

/// Why an annotation's value is not a profile name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileNameError {
    #[error("a profile name is not empty")]
    Empty,
    #[error("a profile name has at most {NAME_MAX} characters")]
    TooLong,
    #[error(
        "a profile name has only a-z, 0-9, `_` and `-`, and starts with a-z or 0-9 (no paths, no dots)"
    )]
    Characters,
}

impl TryFrom<&str> for ProfileName {
    type Error = ProfileNameError;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        let bytes = value.as_bytes();
        let Some(first) = bytes.first() else {
            return Err(ProfileNameError::Empty);
        };
        if bytes.len() > NAME_MAX {
            return Err(ProfileNameError::TooLong);
        }
        let plain = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !plain(first) || !bytes.iter().all(|b| plain(b) || *b == b'_' || *b == b'-') {
            return Err(ProfileNameError::Characters);
        }
        Ok(Self(value.to_owned()))
    }
}

impl ProfileName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The profile's file name in the profiles directory: `NAME.toml`, a single path
    /// component by construction.
    pub fn file_name(&self) -> String {
        format!("{}{EXTENSION}", self.0)
    }
}

impl fmt::Display for ProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the profile annotation asks for. A built-in name always means the built-in profile,
/// whatever the profiles directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    Builtin(&'static str),
    Admin(ProfileName),
}

/// The profile `annotations` ask for, if any (surrounding spaces ignored, as for every
/// `io.agent.sandbox.*` value).
pub fn requested(
    annotations: &HashMap<String, String>,
) -> Result<Option<Requested>, ProfileNameError> {
    let Some(value) = annotations.get(ANNOTATION_PROFILE) else {
        return Ok(None);
    };
    let value = value.trim();
    if let Some(builtin) = builtin_names().iter().find(|n| **n == value) {
        return Ok(Some(Requested::Builtin(builtin)));
    }
    ProfileName::try_from(value).map(|name| Some(Requested::Admin(name)))
}

/// The create-time equivalent of the annotation for engines that cannot set one (Docker
/// 20.10 has no `docker run --annotation`): `AGENT_SANDBOX_PROFILE=NAME` in the process
/// environment of the container's `config.json`.
pub const ENV_PROFILE: &str = "AGENT_SANDBOX_PROFILE";

/// Copies [`ENV_PROFILE`] of the spec's process environment into the annotation
/// [`ANNOTATION_PROFILE`], so every later step (and every exec, which reads the saved
/// spec's annotations) sees one request. Both given and different is an error naming both.
pub fn annotation_from_env(spec: &mut Spec) -> Result<(), HardenError> {
    let prefix = format!("{ENV_PROFILE}=");
    let Some(value) = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().as_ref())
        .and_then(|env| env.iter().rev().find_map(|e| e.strip_prefix(&prefix)))
        .map(str::to_owned)
    else {
        return Ok(());
    };
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    match annotations.get(ANNOTATION_PROFILE) {
        Some(given) if given.trim() != value.trim() => {
            return Err(HardenError::ProfileConflict {
                annotation: given.clone(),
                env: value,
            });
        }
        Some(_) => {}
        None => {
            annotations.insert(ANNOTATION_PROFILE.to_owned(), value);
            spec.set_annotations(Some(annotations));
        }
    }
    Ok(())
}

/// A profile the runtime read from the admin's profiles directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminProfile {
    pub name: ProfileName,
    /// Where it was read (for logs and errors).
    pub origin: String,
    pub policy: SandboxPolicy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_admit_only_plain_lowercase_words() {
        for good in ["pypi", "team-a_1", "0day", &"a".repeat(NAME_MAX)] {
            assert_eq!(ProfileName::try_from(good).unwrap().as_str(), good);
        }
        for (bad, why) in [
            ("", ProfileNameError::Empty),
            ("../etc/passwd", ProfileNameError::Characters),
            ("..", ProfileNameError::Characters),
            ("a/b", ProfileNameError::Characters),
            (".hidden", ProfileNameError::Characters),
            ("-rf", ProfileNameError::Characters),
            ("_x", ProfileNameError::Characters),
            ("Pypi", ProfileNameError::Characters),
            ("py pi", ProfileNameError::Characters),
            ("pypi.toml", ProfileNameError::Characters),
            ("p\0", ProfileNameError::Characters),
            ("é", ProfileNameError::Characters),
            (&"a".repeat(NAME_MAX + 1), ProfileNameError::TooLong),
        ] {
            assert_eq!(ProfileName::try_from(bad), Err(why), "{bad:?}");
        }
    }

    fn spec_with(env: &[&str], annotation: Option<&str>) -> Spec {
        let mut spec = Spec::default();
        let mut process = spec.process().clone().unwrap_or_default();
        process.set_env(Some(env.iter().map(|e| (*e).to_owned()).collect()));
        spec.set_process(Some(process));
        spec.set_annotations(
            annotation.map(|a| HashMap::from([(ANNOTATION_PROFILE.to_owned(), a.to_owned())])),
        );
        spec
    }

    fn annotation_of(spec: &Spec) -> Option<String> {
        spec.annotations()
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_PROFILE).cloned())
    }

    #[test]
    fn the_environment_names_a_profile_where_no_annotation_can() {
        let mut spec = spec_with(&["PATH=/bin", "AGENT_SANDBOX_PROFILE=pypi"], None);
        annotation_from_env(&mut spec).unwrap();
        assert_eq!(annotation_of(&spec).as_deref(), Some("pypi"));
        // The same name both ways is one request.
        let mut spec = spec_with(&["AGENT_SANDBOX_PROFILE=pypi"], Some("pypi"));
        annotation_from_env(&mut spec).unwrap();
        assert_eq!(annotation_of(&spec).as_deref(), Some("pypi"));
        // Without it, nothing changes.
        let mut spec = spec_with(&["PATH=/bin"], None);
        annotation_from_env(&mut spec).unwrap();
        assert_eq!(annotation_of(&spec), None);
    }

    #[test]
    fn an_environment_that_contradicts_the_annotation_is_an_error_naming_both() {
        let mut spec = spec_with(&["AGENT_SANDBOX_PROFILE=wide"], Some("strict"));
        let err = annotation_from_env(&mut spec).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(ANNOTATION_PROFILE) && text.contains(ENV_PROFILE),
            "{text}"
        );
        assert!(text.contains("wide") && text.contains("strict"), "{text}");
    }

    #[test]
    fn the_file_name_is_one_component_ending_in_toml() {
        let name = ProfileName::try_from("pypi").unwrap();
        assert_eq!(name.file_name(), "pypi.toml");
    }

    #[test]
    fn builtin_names_win_over_the_directory() {
        let ann = |v: &str| HashMap::from([(ANNOTATION_PROFILE.to_owned(), v.to_owned())]);
        assert_eq!(
            requested(&ann(" strict ")).unwrap(),
            Some(Requested::Builtin("strict"))
        );
        assert_eq!(
            requested(&ann("pypi")).unwrap(),
            Some(Requested::Admin(ProfileName::try_from("pypi").unwrap()))
        );
        assert_eq!(
            requested(&ann("../x")).unwrap_err(),
            ProfileNameError::Characters
        );
        assert_eq!(requested(&HashMap::new()).unwrap(), None);
    }
}
