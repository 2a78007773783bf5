//! Validated value types used by the policy: absolute container paths, protected path
//! names, byte sizes, durations and capability names. Each parses from the string form
//! written in a profile and refuses anything it cannot normalise.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a value in a policy is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("path `{path}` is not absolute")]
    RelativePath { path: String },
    #[error("path `{path}` contains `..`")]
    ParentComponent { path: String },
    #[error("path `{path}` is not normalized (use `{normalized}`)")]
    NotNormalized { path: String, normalized: String },
    #[error("path {path:?} contains a control character or is empty")]
    BadPath { path: String },
    #[error(
        "protected name `{name}` must be relative to a writable area (no leading `/`, no `..`)"
    )]
    BadProtectedName { name: String },
    #[error("size `{value}` is not a number of bytes with an optional K, M or G suffix")]
    BadSize { value: String },
    #[error("size `{value}` must be larger than zero")]
    ZeroSize { value: String },
    #[error("duration `{value}` is not a number with an s, m or h suffix")]
    BadDuration { value: String },
    #[error("duration `{value}` must be larger than zero")]
    ZeroDuration { value: String },
    #[error("unknown capability `{name}`")]
    UnknownCapability { name: String },
}

/// An absolute, normalized path inside the container (no `.`, no `..`, no `//`, no
/// trailing `/` except for the root itself).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AbsPath(String);

impl AbsPath {
    /// For crate constants that are valid by construction (checked by a unit test).
    pub(crate) fn from_trusted(path: &str) -> AbsPath {
        AbsPath(path.to_owned())
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path as a `Path`.
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// Whether `self` equals `other` or lies below it.
    pub fn is_within(&self, other: &AbsPath) -> bool {
        self.as_path().starts_with(other.as_path())
    }

    /// Whether one of the two paths contains the other.
    pub fn overlaps(&self, other: &AbsPath) -> bool {
        self.is_within(other) || other.is_within(self)
    }

    /// `self` joined with a protected name.
    pub fn join(&self, name: &ProtectedName) -> PathBuf {
        self.as_path().join(name.as_str())
    }
}

impl TryFrom<String> for AbsPath {
    type Error = ValueError;
    fn try_from(path: String) -> Result<Self, ValueError> {
        // Control characters (NUL, newline) would also break the generated profiles.
        if path.is_empty() || path.chars().any(char::is_control) {
            return Err(ValueError::BadPath { path });
        }
        if !path.starts_with('/') {
            return Err(ValueError::RelativePath { path });
        }
        let mut normalized = String::new();
        for component in Path::new(&path).components() {
            match component {
                Component::RootDir => {}
                Component::Normal(part) => {
                    normalized.push('/');
                    normalized.push_str(&part.to_string_lossy());
                }
                Component::ParentDir => return Err(ValueError::ParentComponent { path }),
                // `Path::components` folds `.` away except at the start, which a path
                // beginning with `/` cannot have; treat it as not normalized.
                Component::CurDir | Component::Prefix(_) => {
                    return Err(ValueError::BadPath { path });
                }
            }
        }
        if normalized.is_empty() {
            normalized.push('/');
        }
        if normalized != path {
            return Err(ValueError::NotNormalized { path, normalized });
        }
        Ok(AbsPath(path))
    }
}

impl TryFrom<&str> for AbsPath {
    type Error = ValueError;
    fn try_from(path: &str) -> Result<Self, ValueError> {
        AbsPath::try_from(path.to_owned())
    }
}

impl From<AbsPath> for String {
    fn from(path: AbsPath) -> String {
        path.0
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A path relative to a writable area that must stay read-only (`.git/hooks`, `.bashrc`).
/// A trailing `/` marks a directory (`.ssh/`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProtectedName {
    name: String,
    dir: bool,
}

impl ProtectedName {
    /// The relative path without the trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// Whether the name was written as a directory (`.ssh/`).
    pub fn is_dir(&self) -> bool {
        self.dir
    }
}

impl TryFrom<String> for ProtectedName {
    type Error = ValueError;
    fn try_from(raw: String) -> Result<Self, ValueError> {
        let dir = raw.ends_with('/');
        let name = raw.trim_end_matches('/');
        let valid = !name.is_empty()
            && !name.starts_with('/')
            && !name.chars().any(char::is_control)
            && name
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !valid {
            return Err(ValueError::BadProtectedName { name: raw });
        }
        Ok(ProtectedName {
            name: name.to_owned(),
            dir,
        })
    }
}

impl TryFrom<&str> for ProtectedName {
    type Error = ValueError;
    fn try_from(raw: &str) -> Result<Self, ValueError> {
        ProtectedName::try_from(raw.to_owned())
    }
}

impl From<ProtectedName> for String {
    fn from(name: ProtectedName) -> String {
        name.to_string()
    }
}

impl fmt::Display for ProtectedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dir {
            write!(f, "{}/", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// A positive number of bytes, written `65536`, `512K`, `64M` or `1G` (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ByteSize(u64);

impl ByteSize {
    /// For crate constants that are valid by construction.
    pub(crate) const fn from_trusted(bytes: u64) -> ByteSize {
        ByteSize(bytes)
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// A size of `bytes` bytes, if positive.
    pub fn from_bytes(bytes: u64) -> Option<ByteSize> {
        (bytes > 0).then_some(ByteSize(bytes))
    }
}

impl TryFrom<String> for ByteSize {
    type Error = ValueError;
    fn try_from(value: String) -> Result<Self, ValueError> {
        ByteSize::try_from(value.as_str())
    }
}

impl TryFrom<&str> for ByteSize {
    type Error = ValueError;
    fn try_from(value: &str) -> Result<Self, ValueError> {
        let bad = || ValueError::BadSize {
            value: value.to_owned(),
        };
        let (digits, multiplier) = match value.char_indices().last() {
            Some((i, 'K' | 'k')) => (&value[..i], 1u64 << 10),
            Some((i, 'M' | 'm')) => (&value[..i], 1 << 20),
            Some((i, 'G' | 'g')) => (&value[..i], 1 << 30),
            _ => (value, 1),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let number: u64 = digits.parse().map_err(|_| bad())?;
        let bytes = number.checked_mul(multiplier).ok_or_else(bad)?;
        // Cgroup and tmpfs limits are signed 64-bit in the OCI spec.
        if i64::try_from(bytes).is_err() {
            return Err(bad());
        }
        ByteSize::from_bytes(bytes).ok_or(ValueError::ZeroSize {
            value: value.to_owned(),
        })
    }
}

impl From<ByteSize> for String {
    fn from(size: ByteSize) -> String {
        size.to_string()
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
            if bytes.is_multiple_of(1u64 << shift) {
                return write!(f, "{}{unit}", bytes >> shift);
            }
        }
        write!(f, "{bytes}")
    }
}

/// A positive duration in whole seconds, written `90s`, `30m` or `2h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Seconds(u64);

impl Seconds {
    /// For crate constants that are valid by construction.
    pub(crate) const fn from_trusted(seconds: u64) -> Seconds {
        Seconds(seconds)
    }

    /// The duration in seconds.
    pub fn get(self) -> u64 {
        self.0
    }

    /// As a `std::time::Duration`.
    pub fn as_duration(self) -> std::time::Duration {
        std::time::Duration::from_secs(self.0)
    }
}

impl TryFrom<String> for Seconds {
    type Error = ValueError;
    fn try_from(value: String) -> Result<Self, ValueError> {
        Seconds::try_from(value.as_str())
    }
}

impl TryFrom<&str> for Seconds {
    type Error = ValueError;
    fn try_from(value: &str) -> Result<Self, ValueError> {
        let bad = || ValueError::BadDuration {
            value: value.to_owned(),
        };
        let (digits, multiplier) = match value.char_indices().last() {
            Some((i, 's')) => (&value[..i], 1u64),
            Some((i, 'm')) => (&value[..i], 60),
            Some((i, 'h')) => (&value[..i], 3600),
            Some((i, 'd')) => (&value[..i], 86_400),
            _ => return Err(bad()),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let number: u64 = digits.parse().map_err(|_| bad())?;
        let seconds = number.checked_mul(multiplier).ok_or_else(bad)?;
        if seconds == 0 {
            return Err(ValueError::ZeroDuration {
                value: value.to_owned(),
            });
        }
        Ok(Seconds(seconds))
    }
}

impl From<Seconds> for String {
    fn from(s: Seconds) -> String {
        s.to_string()
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.is_multiple_of(3600) {
            write!(f, "{}h", s / 3600)
        } else if s.is_multiple_of(60) {
            write!(f, "{}m", s / 60)
        } else {
            write!(f, "{s}s")
        }
    }
}

/// Every Linux capability name, as the OCI spec writes it.
pub const ALL_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The only capabilities a policy may ever grant: they act on files and processes the
/// sandbox already owns inside its user namespace. Everything else (SYS_ADMIN, NET_ADMIN,
/// SYS_PTRACE, NET_RAW, ...) widens the attack surface on the host kernel.
pub const GRANTABLE_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_NET_BIND_SERVICE",
];

/// A Linux capability name (`CAP_CHOWN`); `chown` and `cap_chown` are accepted too.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Capability(String);

impl Capability {
    /// The canonical name (`CAP_CHOWN`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a policy may grant this capability.
    pub fn is_grantable(&self) -> bool {
        GRANTABLE_CAPABILITIES.contains(&self.0.as_str())
    }
}

impl TryFrom<String> for Capability {
    type Error = ValueError;
    fn try_from(name: String) -> Result<Self, ValueError> {
        let upper = name.to_ascii_uppercase();
        let canonical = if upper.starts_with("CAP_") {
            upper
        } else {
            format!("CAP_{upper}")
        };
        if ALL_CAPABILITIES.contains(&canonical.as_str()) {
            Ok(Capability(canonical))
        } else {
            Err(ValueError::UnknownCapability { name })
        }
    }
}

impl From<Capability> for String {
    fn from(cap: Capability) -> String {
        cap.0
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_path_rejects_relative_dotdot_and_unnormalized() {
        assert!(matches!(
            AbsPath::try_from("tmp"),
            Err(ValueError::RelativePath { .. })
        ));
        assert!(matches!(
            AbsPath::try_from("/a/../b"),
            Err(ValueError::ParentComponent { .. })
        ));
        assert!(matches!(
            AbsPath::try_from("/a//b/"),
            Err(ValueError::NotNormalized { .. })
        ));
        assert!(matches!(
            AbsPath::try_from("/a/./b"),
            Err(ValueError::NotNormalized { .. })
        ));
        assert!(matches!(
            AbsPath::try_from("/tmp/a\nb"),
            Err(ValueError::BadPath { .. })
        ));
        assert!(ProtectedName::try_from(".bash\nrc").is_err());
        assert_eq!(AbsPath::try_from("/").map(String::from), Ok("/".to_owned()));
        assert_eq!(
            AbsPath::try_from("/a/b").map(String::from),
            Ok("/a/b".to_owned())
        );
    }

    #[test]
    fn overlap_is_component_wise() {
        let a = AbsPath::try_from("/tmp").unwrap();
        let b = AbsPath::try_from("/tmp/x").unwrap();
        let c = AbsPath::try_from("/tmpfoo").unwrap();
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(ByteSize::try_from("64M").unwrap().bytes(), 64 << 20);
        assert_eq!(ByteSize::try_from("1G").unwrap().to_string(), "1G");
        assert_eq!(ByteSize::try_from("1000").unwrap().to_string(), "1000");
        assert!(matches!(
            ByteSize::try_from("0"),
            Err(ValueError::ZeroSize { .. })
        ));
        for bad in ["", "M", "12MB", "-1", "1.5G", "99999999999G"] {
            assert!(
                matches!(ByteSize::try_from(bad), Err(ValueError::BadSize { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(Seconds::try_from("90s").unwrap().get(), 90);
        assert_eq!(Seconds::try_from("2h").unwrap().to_string(), "2h");
        assert!(Seconds::try_from("5").is_err());
        assert!(Seconds::try_from("0m").is_err());
    }

    #[test]
    fn protected_names() {
        let n = ProtectedName::try_from(".ssh/").unwrap();
        assert!(n.is_dir());
        assert_eq!(n.as_str(), ".ssh");
        assert_eq!(n.to_string(), ".ssh/");
        for bad in ["/etc", "../x", "a/../b", "", "/"] {
            assert!(ProtectedName::try_from(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capabilities() {
        assert_eq!(
            Capability::try_from("chown".to_owned()).unwrap().as_str(),
            "CAP_CHOWN"
        );
        assert!(Capability::try_from("CAP_BOGUS".to_owned()).is_err());
        assert!(
            !Capability::try_from("CAP_SYS_ADMIN".to_owned())
                .unwrap()
                .is_grantable()
        );
    }
}
