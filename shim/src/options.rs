//! Runtime options: which runtime binary the shim drives, where that runtime keeps its state,
//! which policy file (profile) it is asked to apply as the ceiling, which directory holds the
//! admin's profiles that an annotation may name (`ProfilesDir`), and whether systemd places
//! the containers' cgroups (`SystemdCgroup`, as for runc: the runtime gets `--systemd-cgroup`).
//!
//! containerd hands the shim whatever its configuration or the client supplied, wrapped in a
//! protobuf `Any`. Three shapes reach us:
//! - nothing (ctr without options): the defaults;
//! - `runtimeoptions.v1.Options` (CRI for a non-runc runtime type, `ctr --runtime-config-path`):
//!   a TOML table, inline as `config_body` or in the file named by `config_path`;
//! - `containerd.runc.v1.Options` (runc-style options): `binary_name`, `root` and
//!   `systemd_cgroup` are honoured.
//!
//! The shim never interprets the policy: it forwards the file's path to the runtime (the
//! runtime's `AGENT_SANDBOX_POLICY`, same as its `--policy`), which takes every policy decision.
//! An environment variable rather than a flag keeps the command line runc-compatible.

use std::path::{Path, PathBuf};

use containerd_shim::protos::protobuf::{
    CodedInputStream, Message, UnknownFields, rt::read_unknown_or_skip_group,
    well_known_types::any::Any,
};
use containerd_shim::protos::shim::oci::Options as RuncOptions;
use serde::{Deserialize, Serialize};

/// The runtime binary used when no option names one and none sits beside the shim.
pub const DEFAULT_RUNTIME: &str = "/usr/local/bin/agent-sandbox";

/// The runtime used when no option names one: `agent-sandbox` in the shim's own directory (so
/// that a shim started by absolute path, `ctr run --runtime /dir/containerd-shim-agent-sandbox`,
/// drives the runtime installed with it), else [`DEFAULT_RUNTIME`].
pub fn default_runtime() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("agent-sandbox")))
        .filter(|sibling| sibling.is_file())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME))
}
/// The runtime's state directories live below this path, one per containerd namespace.
pub const DEFAULT_ROOT_BASE: &str = "/run/containerd/agent-sandbox";
/// Environment variable through which the policy file reaches the runtime.
pub const POLICY_ENV: &str = "AGENT_SANDBOX_POLICY";
/// Environment variable through which the profiles directory reaches the runtime (its
/// `--profiles-dir`).
pub const PROFILES_DIR_ENV: &str = "AGENT_SANDBOX_PROFILES_DIR";
/// File in the bundle where the daemon records the options, so that `shim delete` after a crash
/// drives the same runtime with the same root.
pub const PERSISTED_FILE: &str = "agent-sandbox-shim.json";

const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";
const RUNC_OPTIONS_TYPES: [&str; 2] = [
    "containerd.runc.v1.Options",
    "io.containerd.runc.v1.Options",
];

/// Errors while reading runtime options.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("unsupported runtime options type {type_url}")]
    UnsupportedType { type_url: String },
    #[error("malformed {type_url} runtime options")]
    Decode {
        type_url: String,
        #[source]
        source: containerd_shim::protos::protobuf::Error,
    },
    #[error("cannot read runtime options file {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid runtime options TOML{}", origin.as_ref().map(|p| format!(" in {}", p.display())).unwrap_or_default())]
    Toml {
        origin: Option<PathBuf>,
        #[source]
        source: toml::de::Error,
    },
    #[error("runtime option {key} must be an absolute path, got {value:?}")]
    NotAbsolute { key: &'static str, value: String },
    #[error("cannot write {path}")]
    Persist {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}")]
    ParsePersisted {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The TOML table an administrator writes under
/// `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.agent-sandbox.options]`.
/// `TypeUrl` and `ConfigPath` are consumed by containerd itself and therefore tolerated.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OptionsTable {
    #[serde(rename = "BinaryName")]
    binary_name: Option<String>,
    #[serde(rename = "Root")]
    root: Option<String>,
    #[serde(rename = "Policy")]
    policy: Option<String>,
    #[serde(rename = "ProfilesDir")]
    profiles_dir: Option<String>,
    /// As in runc's options: kubelet's systemd cgroup driver (the runtime also picks systemd
    /// from a `slice:prefix:name` cgroupsPath on its own).
    #[serde(rename = "SystemdCgroup")]
    systemd_cgroup: Option<bool>,
    #[serde(rename = "TypeUrl")]
    _type_url: Option<String>,
    #[serde(rename = "ConfigPath")]
    _config_path: Option<String>,
}

/// The options the shim acts on, after defaults are applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeOptions {
    /// Absolute path of the runc-compatible runtime binary.
    pub runtime: PathBuf,
    /// The runtime's `--root` state directory.
    pub root: PathBuf,
    /// Policy file (the ceiling) forwarded to the runtime, if configured.
    pub policy: Option<PathBuf>,
    /// The directory of the admin's profiles forwarded to the runtime, if configured (else
    /// the runtime's default, docs/policy.md#profiles-by-annotation).
    #[serde(default)]
    pub profiles_dir: Option<PathBuf>,
    /// Pass `--systemd-cgroup` to the runtime.
    #[serde(default)]
    pub systemd_cgroup: bool,
}

impl RuntimeOptions {
    /// Defaults for a containerd namespace.
    pub fn defaults(namespace: &str) -> Self {
        Self {
            runtime: default_runtime(),
            root: Path::new(DEFAULT_ROOT_BASE).join(namespace),
            policy: None,
            profiles_dir: None,
            systemd_cgroup: false,
        }
    }

    /// Decodes the options containerd sent (absent, empty, or one of the supported types).
    pub fn from_any(any: Option<&Any>, namespace: &str) -> Result<Self, OptionsError> {
        let mut opts = Self::defaults(namespace);
        let Some(any) = any else { return Ok(opts) };
        let type_url = any.type_url.rsplit('/').next().unwrap_or_default();
        if type_url.is_empty() && any.value.is_empty() {
            return Ok(opts);
        }
        let decode_err = |source| OptionsError::Decode {
            type_url: any.type_url.clone(),
            source,
        };
        if type_url == RUNTIME_OPTIONS_TYPE {
            let (config_path, config_body) =
                decode_runtime_options(&any.value).map_err(decode_err)?;
            let (text, origin) = if config_path.is_empty() {
                (config_body, None)
            } else {
                let path = PathBuf::from(&config_path);
                let text =
                    std::fs::read_to_string(&path).map_err(|source| OptionsError::ReadFile {
                        path: path.clone(),
                        source,
                    })?;
                (text, Some(path))
            };
            let table: OptionsTable =
                toml::from_str(&text).map_err(|source| OptionsError::Toml { origin, source })?;
            opts.apply(table.binary_name, table.root, table.policy)?;
            if let Some(dir) = table.profiles_dir {
                opts.profiles_dir = Some(absolute("ProfilesDir", dir)?);
            }
            opts.systemd_cgroup = table.systemd_cgroup.unwrap_or(false);
        } else if RUNC_OPTIONS_TYPES.contains(&type_url) {
            let runc = RuncOptions::parse_from_bytes(&any.value).map_err(decode_err)?;
            let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
            opts.apply(non_empty(&runc.binary_name), non_empty(&runc.root), None)?;
            opts.systemd_cgroup = runc.systemd_cgroup;
        } else {
            return Err(OptionsError::UnsupportedType {
                type_url: any.type_url.clone(),
            });
        }
        Ok(opts)
    }

    fn apply(
        &mut self,
        binary: Option<String>,
        root: Option<String>,
        policy: Option<String>,
    ) -> Result<(), OptionsError> {
        if let Some(binary) = binary {
            self.runtime = absolute("BinaryName", binary)?;
        }
        if let Some(root) = root {
            self.root = absolute("Root", root)?;
        }
        if let Some(policy) = policy {
            self.policy = Some(absolute("Policy", policy)?);
        }
        Ok(())
    }

    /// Records the options in the bundle for a later `shim delete`.
    pub fn persist(&self, bundle: &Path) -> Result<(), OptionsError> {
        let path = bundle.join(PERSISTED_FILE);
        let text = serde_json::to_vec(self).map_err(|source| OptionsError::ParsePersisted {
            path: path.clone(),
            source,
        })?;
        agent_sandbox_sys::atomic_file::write_atomic(&path, text)
            .map_err(|source| OptionsError::Persist { path, source })
    }

    /// Reads the options recorded by [`RuntimeOptions::persist`]; defaults if there are none
    /// (the daemon died before it could write them).
    pub fn load_persisted(bundle: &Path, namespace: &str) -> Result<Self, OptionsError> {
        let path = bundle.join(PERSISTED_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| OptionsError::ParsePersisted { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::defaults(namespace)),
            Err(source) => Err(OptionsError::ReadFile { path, source }),
        }
    }
}

fn absolute(key: &'static str, value: String) -> Result<PathBuf, OptionsError> {
    let path = PathBuf::from(&value);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(OptionsError::NotAbsolute { key, value })
    }
}

/// Decodes `runtimeoptions.v1.Options { string type_url = 1; string config_path = 2;
/// bytes config_body = 3; }`. containerd-shim-protos does not ship this message, and three
/// fields do not justify generating code for it.
fn decode_runtime_options(
    bytes: &[u8],
) -> Result<(String, String), containerd_shim::protos::protobuf::Error> {
    let mut input = CodedInputStream::from_bytes(bytes);
    let (mut path, mut body) = (String::new(), String::new());
    while let Some(tag) = input.read_raw_tag_or_eof()? {
        match tag {
            10 => {
                input.read_string()?;
            }
            18 => path = input.read_string()?,
            26 => body = input.read_string()?,
            _ => read_unknown_or_skip_group(tag, &mut input, &mut UnknownFields::new())?,
        }
    }
    Ok((path, body))
}

/// The options CRI and `ctr --runtime-config-path` send: `runtimeoptions.v1.Options` with
/// the TOML table at `path` or as `body` (for unit tests).
#[cfg(test)]
pub(crate) fn runtime_any(path: &str, body: &str) -> Any {
    use containerd_shim::protos::protobuf::CodedOutputStream;
    let mut value = Vec::new();
    {
        let mut out = CodedOutputStream::vec(&mut value);
        out.write_string(1, "agent-sandbox").unwrap();
        if !path.is_empty() {
            out.write_string(2, path).unwrap();
        }
        if !body.is_empty() {
            out.write_bytes(3, body.as_bytes()).unwrap();
        }
        out.flush().unwrap();
    }
    Any {
        type_url: "runtimeoptions.v1.Options".into(),
        value,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_options_give_defaults() {
        let o = RuntimeOptions::from_any(None, "k8s.io").unwrap();
        assert_eq!(o.runtime, default_runtime());
        assert_eq!(o.root, Path::new("/run/containerd/agent-sandbox/k8s.io"));
        assert_eq!(o.policy, None);
    }

    #[test]
    fn cri_toml_body_selects_binary_and_policy() {
        let any = runtime_any(
            "",
            "BinaryName = \"/usr/sbin/runc\"\nPolicy = \"/etc/agent-sandbox/strict.toml\"\n",
        );
        let o = RuntimeOptions::from_any(Some(&any), "default").unwrap();
        assert_eq!(o.runtime, Path::new("/usr/sbin/runc"));
        assert_eq!(
            o.policy.as_deref(),
            Some(Path::new("/etc/agent-sandbox/strict.toml"))
        );
    }

    #[test]
    fn config_path_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shim.toml");
        std::fs::write(&file, "Root = \"/run/x\"\n").unwrap();
        let any = runtime_any(file.to_str().unwrap(), "");
        let o = RuntimeOptions::from_any(Some(&any), "default").unwrap();
        assert_eq!(o.root, Path::new("/run/x"));
    }

    #[test]
    fn systemd_cgroup_is_accepted_from_toml_and_runc_options() {
        let any = runtime_any("", "SystemdCgroup = true\n");
        assert!(
            RuntimeOptions::from_any(Some(&any), "k8s.io")
                .unwrap()
                .systemd_cgroup
        );
        let any = runtime_any("", "SystemdCgroup = false\n");
        assert!(
            !RuntimeOptions::from_any(Some(&any), "k8s.io")
                .unwrap()
                .systemd_cgroup
        );
        let runc = RuncOptions {
            systemd_cgroup: true,
            ..Default::default()
        };
        let any = Any {
            type_url: "io.containerd.runc.v1.Options".into(),
            value: runc.write_to_bytes().unwrap(),
            ..Default::default()
        };
        assert!(
            RuntimeOptions::from_any(Some(&any), "k8s.io")
                .unwrap()
                .systemd_cgroup
        );
    }

    #[test]
    fn persisted_options_without_systemd_cgroup_still_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(PERSISTED_FILE),
            r#"{"runtime":"/r","root":"/x","policy":null}"#,
        )
        .unwrap();
        let o = RuntimeOptions::load_persisted(dir.path(), "ns").unwrap();
        assert!(!o.systemd_cgroup);
    }

    #[test]
    fn unknown_key_is_named() {
        let any = runtime_any("", "SystemdCgroups = true\n");
        let err = RuntimeOptions::from_any(Some(&any), "default").unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(chain.contains("SystemdCgroups"), "{chain}");
    }

    #[test]
    fn relative_binary_is_rejected() {
        let any = runtime_any("", "BinaryName = \"runc\"\n");
        let err = RuntimeOptions::from_any(Some(&any), "default").unwrap_err();
        assert!(err.to_string().contains("BinaryName"), "{err}");
    }

    #[test]
    fn relative_policy_is_rejected() {
        let any = runtime_any("", "Policy = \"strict.toml\"\n");
        let err = RuntimeOptions::from_any(Some(&any), "default").unwrap_err();
        assert!(err.to_string().contains("Policy"), "{err}");
    }

    #[test]
    fn profiles_dir_is_forwarded_when_absolute_and_persisted() {
        let any = runtime_any("", "ProfilesDir = \"/etc/team/profiles\"\n");
        let o = RuntimeOptions::from_any(Some(&any), "default").unwrap();
        assert_eq!(
            o.profiles_dir.as_deref(),
            Some(Path::new("/etc/team/profiles"))
        );
        let bundle = tempfile::tempdir().unwrap();
        o.persist(bundle.path()).unwrap();
        let back = RuntimeOptions::load_persisted(bundle.path(), "default").unwrap();
        assert_eq!(back, o);
        let any = runtime_any("", "ProfilesDir = \"profiles\"\n");
        let err = RuntimeOptions::from_any(Some(&any), "default").unwrap_err();
        assert!(err.to_string().contains("ProfilesDir"), "{err}");
        // A file persisted by an older shim, without the key, still loads.
        std::fs::write(
            bundle.path().join(PERSISTED_FILE),
            r#"{"runtime":"/r","root":"/x","policy":null}"#,
        )
        .unwrap();
        let old = RuntimeOptions::load_persisted(bundle.path(), "default").unwrap();
        assert_eq!(old.profiles_dir, None);
    }

    #[test]
    fn runc_options_are_accepted() {
        let runc = RuncOptions {
            binary_name: "/usr/sbin/runc".into(),
            ..Default::default()
        };
        let any = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: runc.write_to_bytes().unwrap(),
            ..Default::default()
        };
        let o = RuntimeOptions::from_any(Some(&any), "default").unwrap();
        assert_eq!(o.runtime, Path::new("/usr/sbin/runc"));
    }

    #[test]
    fn unknown_type_is_named() {
        let any = Any {
            type_url: "example.com/Other".into(),
            value: vec![1],
            ..Default::default()
        };
        let err = RuntimeOptions::from_any(Some(&any), "default").unwrap_err();
        assert!(err.to_string().contains("example.com/Other"));
    }

    #[test]
    fn persisted_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = RuntimeOptions::defaults("ns");
        o.policy = Some("/etc/agent-sandbox/agent.toml".into());
        o.persist(dir.path()).unwrap();
        assert_eq!(RuntimeOptions::load_persisted(dir.path(), "ns").unwrap(), o);
    }
}
