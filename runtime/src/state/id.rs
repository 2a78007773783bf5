//! The validated container id.

use std::fmt;

/// Why a string is not a container id.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("container id is empty")]
    Empty,
    #[error("container id {id:?} is too long (max 1024 bytes)")]
    TooLong { id: String },
    #[error("container id {id:?} is not a valid file name")]
    Reserved { id: String },
    #[error("container id {id:?} contains {ch:?} (allowed: letters, digits, _ + - .)")]
    InvalidChar { id: String, ch: char },
}

/// A container id that is safe to use as a single path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerId(String);

impl ContainerId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for ContainerId {
    type Error = IdError;

    fn try_from(id: &str) -> Result<Self, IdError> {
        if id.is_empty() {
            return Err(IdError::Empty);
        }
        if id.len() > 1024 {
            return Err(IdError::TooLong { id: id.to_owned() });
        }
        if id == "." || id == ".." {
            return Err(IdError::Reserved { id: id.to_owned() });
        }
        if let Some(ch) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.')))
        {
            return Err(IdError::InvalidChar {
                id: id.to_owned(),
                ch,
            });
        }
        Ok(Self(id.to_owned()))
    }
}

impl std::str::FromStr for ContainerId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::try_from(s)
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_podman_ids() {
        let id = "3f1c0e9a8b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e";
        assert_eq!(ContainerId::try_from(id).unwrap().as_str(), id);
        assert!(ContainerId::try_from("a.b_c+d-1").is_ok());
    }

    #[test]
    fn rejects_path_tricks() {
        assert!(matches!(ContainerId::try_from(""), Err(IdError::Empty)));
        assert!(matches!(
            ContainerId::try_from(".."),
            Err(IdError::Reserved { .. })
        ));
        assert!(matches!(
            ContainerId::try_from("a/b"),
            Err(IdError::InvalidChar { ch: '/', .. })
        ));
        assert!(ContainerId::try_from("a b").is_err());
    }
}
