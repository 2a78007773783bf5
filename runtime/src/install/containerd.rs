//! `agent-sandbox install containerd`: the containerd CRI runtime entry that makes a Kubernetes
//! RuntimeClass with `handler: agent-sandbox` run pods through our shim.
//!
//! Without `--write` it prints the stanza; with `--write` it merges it into containerd's
//! configuration (default `/etc/containerd/config.toml`), keeping every other key, comment and
//! the file's layout (`toml_edit`), and writes the result atomically. The stanza is in the
//! config version the file declares; a missing or empty file gets the version the installed
//! containerd reads natively (`containerd --version`: 3 for containerd 2.x, 2 for 1.6 and 1.7,
//! and 2 when there is no containerd to ask, which every containerd from 1.6 on reads), and
//! the command says which it chose and why ([`Choice`]). A file that is not TOML,
//! uses a config version this does not know, or has a non-table where the stanza goes is an
//! error naming the file and key, and nothing is written. Rerunning is a no-op.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use toml_edit::{Array, DocumentMut, Item, Table, value};

use crate::files::FileError;

/// containerd's default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// The RuntimeClass handler name.
pub const HANDLER: &str = "agent-sandbox";
/// containerd resolves it to the binary `containerd-shim-agent-sandbox` on its PATH.
pub const RUNTIME_TYPE: &str = "io.agent.sandbox";
/// Pod annotations containerd passes to the runtime (per-pod narrowing).
pub const POD_ANNOTATIONS: &str = "io.agent.sandbox.*";

/// The comment above the stanza: what a cluster admin may add.
const OPTIONS_HINT: &str = "\
# agent-sandbox: pods of a RuntimeClass with `handler: agent-sandbox` run as agent sandboxes.
# Ceiling policy: the built-in agent profile. For another one, add an options table with
# ConfigPath = \"/etc/agent-sandbox/runtime.toml\", a file holding Policy = \"/path/policy.toml\"
# (containerd 1.6 passes a non-runc runtime only the ConfigPath of its options).
";

/// Why the stanza could not be merged. Nothing was written when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} is not valid TOML")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml_edit::TomlError,
    },
    #[error(
        "{path} has config version {version}; only versions 2 and 3 are supported (run `containerd config migrate`)"
    )]
    Version { path: PathBuf, version: String },
    #[error("{path}: key {key} is not a table")]
    NotATable { path: PathBuf, key: String },
    #[error("{path}: key {key} is not a string")]
    NotAString { path: PathBuf, key: String },
}

/// containerd config versions and where the CRI runtimes table lives in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVersion {
    /// containerd 1.x: `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`.
    V2,
    /// containerd 2.x: `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`.
    V3,
}

impl ConfigVersion {
    fn runtimes_path(self) -> [&'static str; 4] {
        match self {
            ConfigVersion::V2 => [
                "plugins",
                "io.containerd.grpc.v1.cri",
                "containerd",
                "runtimes",
            ],
            ConfigVersion::V3 => [
                "plugins",
                "io.containerd.cri.v1.runtime",
                "containerd",
                "runtimes",
            ],
        }
    }
}

impl std::fmt::Display for ConfigVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConfigVersion::V2 => "2",
            ConfigVersion::V3 => "3",
        })
    }
}

/// The installed containerd, as `containerd --version` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containerd {
    pub major: u32,
    /// The version as printed (`2.1.9~ds1`, `v1.7.24`).
    pub version: String,
}

impl Containerd {
    /// Parses `containerd --version`: `containerd MODULE VERSION [REVISION]` (upstream
    /// `containerd github.com/containerd/containerd/v2 v2.1.9 SHA`, Debian `containerd
    /// github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1`).
    pub fn parse(output: &str) -> Option<Self> {
        let version = output.split_whitespace().nth(2)?;
        let major = version
            .trim_start_matches('v')
            .split('.')
            .next()?
            .parse()
            .ok()?;
        Some(Containerd {
            major,
            version: version.to_owned(),
        })
    }

    /// `containerd --version` of the containerd on PATH; `None` when there is none or it
    /// prints something else.
    pub fn installed() -> Option<Self> {
        let out = std::process::Command::new("containerd")
            .arg("--version")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| Self::parse(&String::from_utf8_lossy(&out.stdout)))
            .flatten()
    }
}

/// The config version the stanza is written in, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub version: ConfigVersion,
    pub reason: String,
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "config version {}: {}", self.version, self.reason)
    }
}

/// The version for a config without one (missing or empty file), from the installed
/// containerd.
pub fn default_for(installed: Option<&Containerd>) -> Choice {
    match installed {
        Some(c) if c.major >= 2 => Choice {
            version: ConfigVersion::V3,
            reason: format!("containerd {} reads version 3 natively", c.version),
        },
        Some(c) => Choice {
            version: ConfigVersion::V2,
            reason: format!("containerd {} reads versions 1 and 2", c.version),
        },
        None => Choice {
            version: ConfigVersion::V2,
            reason: "no containerd on PATH to ask (`containerd --version`); version 2 is read by \
                     containerd 1.6, 1.7 and 2.x"
                .to_owned(),
        },
    }
}

/// The stanza for a config of `version`, as TOML text.
pub fn stanza(version: ConfigVersion) -> String {
    let path = version.runtimes_path();
    format!(
        "{OPTIONS_HINT}[{}.\"{}\".{}.{}.{HANDLER}]\n  runtime_type = \"{RUNTIME_TYPE}\"\n  pod_annotations = [\"{POD_ANNOTATIONS}\"]\n",
        path[0], path[1], path[2], path[3]
    )
}

/// The result of merging the stanza into a config's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The new text.
    pub text: String,
    /// False when the config already had the stanza (the text is then unchanged).
    pub changed: bool,
    pub version: ConfigVersion,
    /// Which version, and why: the file's own, or `fresh`'s for an empty file.
    pub choice: Choice,
}

/// The config version of `doc`: the one it declares, or `fresh`'s for an empty document
/// (then written into it); version 1 and unknown versions are refused.
fn config_version(
    path: &Path,
    doc: &mut DocumentMut,
    fresh: &Choice,
) -> Result<Choice, InstallError> {
    let declared = |version| Choice {
        version,
        reason: format!("{} declares it", path.display()),
    };
    let choice = match doc.get("version") {
        None if doc.as_table().is_empty() => {
            let v = match fresh.version {
                ConfigVersion::V2 => 2,
                ConfigVersion::V3 => 3,
            };
            doc.insert("version", value(v));
            fresh.clone()
        }
        None => {
            return Err(InstallError::Version {
                path: path.to_owned(),
                version: "1 (no `version` key)".to_owned(),
            });
        }
        Some(v) => match v.as_integer() {
            Some(2) => declared(ConfigVersion::V2),
            Some(3) => declared(ConfigVersion::V3),
            _ => {
                return Err(InstallError::Version {
                    path: path.to_owned(),
                    version: v.to_string().trim().to_owned(),
                });
            }
        },
    };
    Ok(choice)
}

/// Sets the handler's `runtime_type` and adds the pod annotation pattern to its
/// `pod_annotations`; true when either was missing.
fn fill_handler(
    path: &Path,
    handler_key: &str,
    runtime: &mut dyn toml_edit::TableLike,
) -> Result<bool, InstallError> {
    let mut changed = false;
    match runtime.get("runtime_type") {
        Some(item) if item.as_str() == Some(RUNTIME_TYPE) => {}
        Some(item) if item.as_str().is_none() => {
            return Err(InstallError::NotAString {
                path: path.to_owned(),
                key: format!("{handler_key}.runtime_type"),
            });
        }
        _ => {
            runtime.insert("runtime_type", value(RUNTIME_TYPE));
            changed = true;
        }
    }
    let has_annotations = runtime
        .get("pod_annotations")
        .and_then(Item::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(POD_ANNOTATIONS)));
    if !has_annotations {
        let mut list = runtime
            .get("pod_annotations")
            .and_then(Item::as_array)
            .cloned()
            .unwrap_or_else(Array::new);
        list.push(POD_ANNOTATIONS);
        runtime.insert("pod_annotations", value(list));
        changed = true;
    }
    Ok(changed)
}

/// Merges the stanza into `text` (the content of `path`, named in errors). An empty text
/// becomes a config of `fresh`'s version holding only the stanza.
pub fn merge(path: &Path, text: &str, fresh: &Choice) -> Result<Merged, InstallError> {
    let mut doc: DocumentMut = text.parse().map_err(|source| InstallError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let choice = config_version(path, &mut doc, fresh)?;
    let version = choice.version;
    let mut table = doc.as_table_mut() as &mut dyn toml_edit::TableLike;
    let mut key = String::new();
    for part in version.runtimes_path() {
        key = if key.is_empty() {
            part.to_owned()
        } else if part.contains('.') {
            format!("{key}.\"{part}\"")
        } else {
            format!("{key}.{part}")
        };
        let entry = table.entry(part).or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(true);
            Item::Table(t)
        });
        table = entry
            .as_table_like_mut()
            .ok_or_else(|| InstallError::NotATable {
                path: path.to_owned(),
                key: key.clone(),
            })?;
    }
    let handler_key = format!("{key}.{HANDLER}");
    let fresh = !table.contains_key(HANDLER);
    let entry = table.entry(HANDLER).or_insert_with(|| {
        let mut t = Table::new();
        t.decor_mut().set_prefix(format!("\n{OPTIONS_HINT}"));
        Item::Table(t)
    });
    let runtime = entry
        .as_table_like_mut()
        .ok_or_else(|| InstallError::NotATable {
            path: path.to_owned(),
            key: handler_key.clone(),
        })?;
    let changed = fill_handler(path, &handler_key, runtime)? || fresh;
    Ok(Merged {
        text: if changed {
            doc.to_string()
        } else {
            text.to_owned()
        },
        changed,
        version,
        choice,
    })
}

/// The config version for the file at `path`: its own, else `fresh` (missing or empty file).
pub fn version_of(path: &Path, fresh: &Choice) -> Result<Choice, InstallError> {
    let text = read_or_empty(path)?;
    merge(path, &text, fresh).map(|m| m.choice)
}

fn read_or_empty(path: &Path) -> Result<String, FileError> {
    Ok(crate::files::read_to_string_if_present(path)?.unwrap_or_default())
}

/// Merges the stanza into the file at `path` (created if missing, in `fresh`'s version),
/// atomically, keeping its permissions. Returns whether the file changed and the version.
pub fn write(path: &Path, fresh: &Choice) -> Result<(bool, Choice), InstallError> {
    let text = read_or_empty(path)?;
    let merged = merge(path, &text, fresh)?;
    if !merged.changed {
        return Ok((false, merged.choice));
    }
    replace_atomically(path, &merged.text).map_err(|e| FileError::write(path, e))?;
    tracing::info!(path = %path.display(), version = %merged.version, "merged the agent-sandbox runtime into containerd's config");
    Ok((true, merged.choice))
}

/// Replaces the file at `path` with `text` atomically (a temporary file in the same directory,
/// synced, then renamed over it), keeping the old file's permissions (0644 for a new file).
/// Creates the directory if needed. On error the old file is untouched.
pub(crate) fn replace_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mode = fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
    let mut tmp = tempfile::Builder::new()
        .prefix(".agent-sandbox-install-")
        .tempfile_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/etc/containerd/config.toml")
    }

    fn v2() -> Choice {
        default_for(None)
    }

    fn merge(path: &Path, text: &str) -> Result<Merged, InstallError> {
        super::merge(path, text, &v2())
    }

    fn write(path: &Path) -> Result<bool, InstallError> {
        super::write(path, &v2()).map(|(changed, _)| changed)
    }

    #[test]
    fn parses_containerd_version_of_upstream_and_debian() {
        let upstream = "containerd github.com/containerd/containerd/v2 v2.1.9 1a2b3c\n";
        assert_eq!(
            Containerd::parse(upstream),
            Some(Containerd {
                major: 2,
                version: "v2.1.9".to_owned()
            })
        );
        let debian = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n";
        assert_eq!(Containerd::parse(debian).map(|c| c.major), Some(1));
        assert_eq!(Containerd::parse("containerd\n"), None);
        assert_eq!(Containerd::parse("containerd x abc\n"), None);
    }

    #[test]
    fn an_empty_config_gets_the_version_the_installed_containerd_reads() {
        let two = Containerd::parse("containerd github.com/containerd/containerd/v2 2.1.9~ds1 x");
        let choice = default_for(two.as_ref());
        assert_eq!(choice.version, ConfigVersion::V3);
        assert!(
            choice.to_string() == "config version 3: containerd 2.1.9~ds1 reads version 3 natively",
            "{choice}"
        );
        let m = super::merge(p(), "", &choice).unwrap();
        assert_eq!(m.version, ConfigVersion::V3);
        let doc: toml::Table = toml::from_str(&m.text).unwrap();
        assert_eq!(doc["version"].as_integer(), Some(3));
        assert!(
            doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
                .get(HANDLER)
                .is_some(),
            "{}",
            m.text
        );
        let one = Containerd::parse("containerd github.com/containerd/containerd 1.7.24~ds1 x");
        assert_eq!(default_for(one.as_ref()).version, ConfigVersion::V2);
        assert!(
            default_for(None)
                .to_string()
                .contains("no containerd on PATH")
        );
        // A file's own version wins over the installed containerd's.
        let m = super::merge(p(), "version = 2\n", &choice).unwrap();
        assert_eq!(m.version, ConfigVersion::V2);
        assert_eq!(
            m.choice.to_string(),
            "config version 2: /etc/containerd/config.toml declares it"
        );
    }

    #[test]
    fn empty_config_gets_version_2_and_the_stanza() {
        let m = merge(p(), "").unwrap();
        assert!(m.changed);
        let doc: toml::Table = toml::from_str(&m.text).unwrap();
        let rt = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][HANDLER];
        assert_eq!(rt["runtime_type"].as_str(), Some(RUNTIME_TYPE));
        assert_eq!(doc["version"].as_integer(), Some(2));
        // The merged text parses the same as the printed stanza does.
        let printed: toml::Table =
            toml::from_str(&format!("version = 2\n{}", stanza(ConfigVersion::V2))).unwrap();
        assert_eq!(doc, printed);
    }

    #[test]
    fn keeps_other_content_and_comments_and_is_idempotent() {
        let text = "# my containerd\nversion = 2\nroot = \"/var/lib/containerd\"\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  # keep me\n  sandbox_image = \"pause:3.9\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n    runtime_type = \"io.containerd.runc.v2\"\n";
        let m = merge(p(), text).unwrap();
        assert!(m.changed);
        assert!(m.text.starts_with(text), "{}", m.text);
        assert!(m.text.contains("# keep me"));
        assert!(m.text.contains("runtimes.agent-sandbox]"), "{}", m.text);
        let again = merge(p(), &m.text).unwrap();
        assert!(!again.changed);
        assert_eq!(again.text, m.text);
    }

    #[test]
    fn updates_an_existing_entry_keeping_its_options() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.agent-sandbox]\n  runtime_type = \"io.old.shim\"\n  pod_annotations = [\"x.*\"]\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.agent-sandbox.options]\n    ConfigPath = \"/etc/agent-sandbox/runtime.toml\"\n";
        let m = merge(p(), text).unwrap();
        let doc: toml::Table = toml::from_str(&m.text).unwrap();
        let rt = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][HANDLER];
        assert_eq!(rt["runtime_type"].as_str(), Some(RUNTIME_TYPE));
        assert_eq!(
            rt["pod_annotations"].as_array().unwrap().len(),
            2,
            "{}",
            m.text
        );
        assert_eq!(
            rt["options"]["ConfigPath"].as_str(),
            Some("/etc/agent-sandbox/runtime.toml")
        );
    }

    #[test]
    fn version_3_uses_the_containerd_2_plugin() {
        let m = merge(p(), "version = 3\n").unwrap();
        assert_eq!(m.version, ConfigVersion::V3);
        assert!(
            m.text.contains(
                "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.agent-sandbox]"
            ),
            "{}",
            m.text
        );
    }

    #[test]
    fn refuses_malformed_or_unknown_configs_naming_file_and_key() {
        let err = merge(p(), "version = 2\n[plugins\n").unwrap_err();
        assert!(matches!(err, InstallError::Parse { .. }));
        assert!(
            err.to_string().contains("/etc/containerd/config.toml"),
            "{err}"
        );
        let err = merge(p(), "root = \"/x\"\n").unwrap_err();
        assert!(err.to_string().contains("version 1"), "{err}");
        let err = merge(p(), "version = 7\n").unwrap_err();
        assert!(err.to_string().contains("version 7"), "{err}");
        let err = merge(p(), "version = 2\nplugins = 5\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/containerd/config.toml: key plugins is not a table"
        );
        let err = merge(
            p(),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = []\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains(
                "key plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes is not a table"
            ),
            "{err}"
        );
    }

    #[test]
    fn write_merges_atomically_keeps_mode_and_leaves_bad_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, "version = 2\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(write(&path).unwrap());
        assert!(!write(&path).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(fs::read_to_string(&path).unwrap().contains(RUNTIME_TYPE));

        let bad = dir.path().join("bad.toml");
        fs::write(&bad, "version = \n").unwrap();
        let err = write(&bad).unwrap_err();
        assert!(err.to_string().contains("bad.toml"), "{err}");
        assert_eq!(fs::read_to_string(&bad).unwrap(), "version = \n");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temp file left"
        );

        let fresh = dir.path().join("new/config.toml");
        assert!(write(&fresh).unwrap());
        assert_eq!(
            version_of(&fresh, &v2()).unwrap().version,
            ConfigVersion::V2
        );
    }
}
