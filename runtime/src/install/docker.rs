//! `agent-sandbox install docker`: the daemon.json entry that makes
//! `docker run --runtime agent-sandbox IMAGE CMD` run the container as an agent sandbox.
//!
//! Two forms (docs/docker.md):
//! - `"path": "/usr/local/bin/agent-sandbox"` (the default): dockerd's containerd shim
//!   (`io.containerd.runc.v2`) drives this binary as it drives runc. Works with dockerd 20.10+.
//! - `"runtimeType": "io.agent.sandbox"` (`--runtime-type`): containerd runs our shim,
//!   `containerd-shim-agent-sandbox`, from its PATH. Docker 23+ only: dockerd 20.10 ignores the
//!   key without a word and runs plain runc, so this refuses to write it for such a dockerd and
//!   warns when printing it.
//!
//! Without `--write` it prints the stanza; with `--write` it merges the entry into daemon.json
//! (default `/etc/docker/daemon.json`), keeping every other key, and replaces the file
//! atomically. A file that is not JSON, or has a non-object where the entry goes, is an error
//! naming the file and key, and nothing is written. Rerunning is a no-op.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Map, Value, json};

use crate::files::FileError;

/// dockerd's default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";
/// The runtime name `docker run --runtime` takes.
pub const DEFAULT_NAME: &str = "agent-sandbox";
/// The first Docker release whose dockerd accepts `runtimeType` (shim runtimes).
pub const RUNTIME_TYPE_SINCE_MAJOR: u32 = 23;

/// Why the entry could not be merged. Nothing was written when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum DockerInstallError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} is not valid JSON")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {key} is not a JSON object")]
    NotAnObject { path: PathBuf, key: String },
    #[error(
        "dockerd {version} ignores `runtimeType` (Docker {RUNTIME_TYPE_SINCE_MAJOR}+ only) and would run plain runc; use the `path` form (without --runtime-type), see docs/docker.md"
    )]
    RuntimeTypeIgnored { version: String },
    #[error("runtime path {path} is not absolute")]
    RelativePath { path: PathBuf },
}

/// How dockerd reaches the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// `"path"`: a runc-compatible binary behind dockerd's runc shim (dockerd 20.10+).
    Path(PathBuf),
    /// `"runtimeType": "io.agent.sandbox"`: our containerd shim (Docker 23+).
    RuntimeType,
}

/// One `runtimes` entry of daemon.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The runtime's name (`docker run --runtime NAME`).
    pub name: String,
    pub form: Form,
    /// Global flags dockerd passes to the runtime (`runtimeArgs`), e.g. `--policy=FILE`;
    /// `None` leaves an existing list alone.
    pub args: Option<Vec<String>>,
}

impl Entry {
    /// The entry's fields as daemon.json holds them.
    fn fields(&self) -> Map<String, Value> {
        let mut m = Map::new();
        match &self.form {
            Form::Path(p) => {
                m.insert("path".to_owned(), json!(p.display().to_string()));
            }
            Form::RuntimeType => {
                m.insert(
                    "runtimeType".to_owned(),
                    json!(crate::install::containerd::RUNTIME_TYPE),
                );
            }
        }
        if let Some(args) = &self.args {
            m.insert("runtimeArgs".to_owned(), json!(args));
        }
        m
    }
}

/// The stanza to merge into daemon.json, as pretty JSON.
pub fn stanza(entry: &Entry) -> String {
    let doc = json!({ "runtimes": { entry.name.clone(): Value::Object(entry.fields()) } });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// The result of merging the entry into a daemon.json's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The new text.
    pub text: String,
    /// False when the file already had the entry (the text is then unchanged).
    pub changed: bool,
}

/// Merges `entry` into `text` (the content of `path`, named in errors). An empty text becomes
/// a daemon.json holding only the entry. Other keys, other runtimes and the entry's other
/// fields are kept; the entry's form replaces the other form (dockerd refuses both at once).
pub fn merge(path: &Path, text: &str, entry: &Entry) -> Result<Merged, DockerInstallError> {
    if let Form::Path(p) = &entry.form
        && !p.is_absolute()
    {
        return Err(DockerInstallError::RelativePath { path: p.clone() });
    }
    let not_object = |key: &str| DockerInstallError::NotAnObject {
        path: path.to_owned(),
        key: key.to_owned(),
    };
    let mut doc: Value = if text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(text).map_err(|source| DockerInstallError::Parse {
            path: path.to_owned(),
            source,
        })?
    };
    let before = doc.clone();
    let top = doc
        .as_object_mut()
        .ok_or_else(|| not_object("the top level"))?;
    let runtimes = top
        .entry("runtimes")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object("runtimes"))?;
    let runtime = runtimes
        .entry(entry.name.clone())
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object(&format!("runtimes.{}", entry.name)))?;
    match entry.form {
        Form::Path(_) => runtime.remove("runtimeType"),
        Form::RuntimeType => runtime.remove("path"),
    };
    for (k, v) in entry.fields() {
        runtime.insert(k, v);
    }
    if doc == before {
        return Ok(Merged {
            text: text.to_owned(),
            changed: false,
        });
    }
    let mut out = serde_json::to_string_pretty(&doc).map_err(|e| FileError::encode(path, e))?;
    out.push('\n');
    Ok(Merged {
        text: out,
        changed: true,
    })
}

/// Merges `entry` into the file at `path` (created if missing), atomically, keeping its
/// permissions. Returns whether the file changed.
pub fn write(path: &Path, entry: &Entry) -> Result<bool, DockerInstallError> {
    let text = crate::files::read_to_string_if_present(path)?.unwrap_or_default();
    let merged = merge(path, &text, entry)?;
    if !merged.changed {
        return Ok(false);
    }
    crate::install::containerd::replace_atomically(path, &merged.text)
        .map_err(|e| FileError::write(path, e))?;
    tracing::info!(path = %path.display(), name = %entry.name, "merged the agent-sandbox runtime into dockerd's config");
    Ok(true)
}

/// A dockerd's version, as `dockerd --version` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerdVersion {
    pub major: u32,
    pub minor: u32,
    /// The version word as printed (`20.10.24+dfsg1`).
    pub text: String,
}

impl DockerdVersion {
    /// Parses `Docker version 20.10.24+dfsg1, build 297e128`.
    pub fn parse(output: &str) -> Option<Self> {
        let word = output
            .split_whitespace()
            .skip_while(|w| *w != "version")
            .nth(1)?
            .trim_end_matches(',');
        let mut parts = word.split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Self {
            major,
            minor,
            text: word.to_owned(),
        })
    }

    /// Whether this dockerd honours `runtimeType`.
    pub fn takes_runtime_type(&self) -> bool {
        self.major >= RUNTIME_TYPE_SINCE_MAJOR
    }

    /// The version of the `dockerd` on PATH, if there is one that answers `--version`.
    pub fn installed() -> Option<Self> {
        let out = Command::new("dockerd").arg("--version").output().ok()?;
        if !out.status.success() {
            return None;
        }
        Self::parse(&String::from_utf8_lossy(&out.stdout))
    }
}

/// What to tell the user about `entry` and the installed dockerd: an error for a form that
/// dockerd would ignore when `writing`, a warning line otherwise.
pub fn check_form(
    entry: &Entry,
    dockerd: Option<&DockerdVersion>,
    writing: bool,
) -> Result<Option<String>, DockerInstallError> {
    let Some(v) = dockerd else {
        return Ok(None);
    };
    if v.takes_runtime_type() {
        return Ok(None);
    }
    match entry.form {
        Form::RuntimeType if writing => Err(DockerInstallError::RuntimeTypeIgnored {
            version: v.text.clone(),
        }),
        Form::RuntimeType => Ok(Some(format!(
            "warning: {}",
            DockerInstallError::RuntimeTypeIgnored {
                version: v.text.clone()
            }
        ))),
        Form::Path(_) if writing => Ok(None),
        Form::Path(_) => Ok(Some(format!(
            "note: dockerd {} is older than {RUNTIME_TYPE_SINCE_MAJOR}: it would ignore `runtimeType`, so the entry uses `path`",
            v.text
        ))),
    }
}

/// `agent-sandbox install docker` arguments.
#[derive(Debug, clap::Args)]
pub struct DockerArgs {
    /// Merge it into daemon.json (keeping everything else) instead of printing it
    #[arg(long)]
    pub write: bool,
    /// dockerd's config file
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The runtime name for `docker run --runtime NAME`
    #[arg(long, default_value = DEFAULT_NAME)]
    pub name: String,
    /// The runtime binary dockerd runs (default: this binary)
    #[arg(long, conflicts_with = "runtime_type")]
    pub path: Option<PathBuf>,
    /// Use `runtimeType: io.agent.sandbox` (our containerd shim; Docker 23+) instead of `path`
    #[arg(long = "runtime-type")]
    pub runtime_type: bool,
    /// Ceiling policy for this runtime's containers (`runtimeArgs: ["--policy=FILE"]`)
    #[arg(long, conflicts_with = "runtime_type")]
    pub policy: Option<PathBuf>,
    /// Where this runtime's audit logs go (`runtimeArgs: ["--audit-dir=DIR"]`)
    #[arg(long = "audit-dir", conflicts_with = "runtime_type")]
    pub audit_dir: Option<PathBuf>,
    /// Where the profiles an annotation may name are (`runtimeArgs: ["--profiles-dir=DIR"]`)
    #[arg(long = "profiles-dir", conflicts_with = "runtime_type")]
    pub profiles_dir: Option<PathBuf>,
}

/// Runs `agent-sandbox install docker`: prints the stanza or merges it, with a warning (or, for
/// `--write`, an error) when the installed dockerd would ignore the chosen form.
pub fn run(args: &DockerArgs) -> Result<(), DockerInstallError> {
    let form = if args.runtime_type {
        Form::RuntimeType
    } else {
        let path = match &args.path {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .and_then(fs::canonicalize)
                .unwrap_or_else(|_| PathBuf::from("/usr/local/bin/agent-sandbox")),
        };
        Form::Path(path)
    };
    let mut runtime_args = Vec::new();
    if let Some(p) = &args.policy {
        runtime_args.push(format!("--policy={}", p.display()));
    }
    if let Some(d) = &args.audit_dir {
        runtime_args.push(format!("--audit-dir={}", d.display()));
    }
    if let Some(d) = &args.profiles_dir {
        runtime_args.push(format!("--profiles-dir={}", d.display()));
    }
    let entry = Entry {
        name: args.name.clone(),
        form,
        args: (!runtime_args.is_empty()).then_some(runtime_args),
    };
    let dockerd = DockerdVersion::installed();
    if let Some(message) = check_form(&entry, dockerd.as_ref(), args.write)? {
        eprintln!("{message}");
    }
    if !args.write {
        // Checked against the file, so that a bad daemon.json shows up before --write.
        if let Ok(text) = fs::read_to_string(&args.config) {
            merge(&args.config, &text, &entry)?;
        }
        print!("{}", stanza(&entry));
    } else if write(&args.config, &entry)? {
        println!(
            "merged the {} runtime into {}; reload dockerd (SIGHUP) or restart it",
            entry.name,
            args.config.display()
        );
    } else {
        println!(
            "{} already has the {} runtime",
            args.config.display(),
            entry.name
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn p() -> &'static Path {
        Path::new("/etc/docker/daemon.json")
    }

    fn path_entry() -> Entry {
        Entry {
            name: DEFAULT_NAME.to_owned(),
            form: Form::Path(PathBuf::from("/usr/local/bin/agent-sandbox")),
            args: None,
        }
    }

    #[test]
    fn empty_config_gets_the_printed_stanza() {
        let m = merge(p(), "", &path_entry()).unwrap();
        assert!(m.changed);
        let merged: Value = serde_json::from_str(&m.text).unwrap();
        let printed: Value = serde_json::from_str(&stanza(&path_entry())).unwrap();
        assert_eq!(merged, printed);
        assert_eq!(
            merged["runtimes"]["agent-sandbox"]["path"],
            "/usr/local/bin/agent-sandbox"
        );
    }

    #[test]
    fn keeps_other_keys_and_runtimes_and_is_idempotent() {
        let text = r#"{"data-root": "/srv/docker", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}, "log-level": "warn"}"#;
        let m = merge(p(), text, &path_entry()).unwrap();
        assert!(m.changed);
        let v: Value = serde_json::from_str(&m.text).unwrap();
        assert_eq!(v["data-root"], "/srv/docker");
        assert_eq!(v["log-level"], "warn");
        assert_eq!(v["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert_eq!(
            v["runtimes"]["agent-sandbox"]["path"],
            "/usr/local/bin/agent-sandbox"
        );
        let again = merge(p(), &m.text, &path_entry()).unwrap();
        assert!(!again.changed);
        assert_eq!(again.text, m.text);
    }

    #[test]
    fn switching_forms_drops_the_other_key_and_keeps_runtime_args() {
        let text =
            r#"{"runtimes": {"agent-sandbox": {"path": "/old", "runtimeArgs": ["--debug"]}}}"#;
        let entry = Entry {
            form: Form::RuntimeType,
            ..path_entry()
        };
        let m = merge(p(), text, &entry).unwrap();
        let v: Value = serde_json::from_str(&m.text).unwrap();
        let rt = &v["runtimes"]["agent-sandbox"];
        assert_eq!(rt["runtimeType"], "io.agent.sandbox");
        assert!(rt.get("path").is_none(), "{rt}");
        assert_eq!(rt["runtimeArgs"], json!(["--debug"]));
        let with_args = Entry {
            args: Some(vec!["--policy=/etc/agent-sandbox/p.toml".to_owned()]),
            ..path_entry()
        };
        let v: Value = serde_json::from_str(&merge(p(), text, &with_args).unwrap().text).unwrap();
        assert_eq!(
            v["runtimes"]["agent-sandbox"]["runtimeArgs"],
            json!(["--policy=/etc/agent-sandbox/p.toml"])
        );
    }

    #[test]
    fn refuses_bad_configs_naming_the_file_and_key() {
        let err = merge(p(), "{\"runtimes\": ", &path_entry()).unwrap_err();
        assert!(matches!(err, DockerInstallError::Parse { .. }));
        assert_eq!(err.to_string(), "/etc/docker/daemon.json is not valid JSON");
        let err = merge(p(), "[1]", &path_entry()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/docker/daemon.json: the top level is not a JSON object"
        );
        let err = merge(p(), r#"{"runtimes": []}"#, &path_entry()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/docker/daemon.json: runtimes is not a JSON object"
        );
        let err = merge(
            p(),
            r#"{"runtimes": {"agent-sandbox": "x"}}"#,
            &path_entry(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/docker/daemon.json: runtimes.agent-sandbox is not a JSON object"
        );
        let relative = Entry {
            form: Form::Path(PathBuf::from("agent-sandbox")),
            ..path_entry()
        };
        assert!(matches!(
            merge(p(), "", &relative).unwrap_err(),
            DockerInstallError::RelativePath { .. }
        ));
    }

    #[test]
    fn write_merges_atomically_keeps_mode_and_leaves_bad_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.json");
        fs::write(&path, "{\"debug\": true}\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(write(&path, &path_entry()).unwrap());
        assert!(!write(&path, &path_entry()).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let v: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["debug"], true);

        let bad = dir.path().join("bad.json");
        fs::write(&bad, "{\"debug\": tru").unwrap();
        let err = write(&bad, &path_entry()).unwrap_err();
        assert!(err.to_string().contains("bad.json"), "{err}");
        assert_eq!(fs::read_to_string(&bad).unwrap(), "{\"debug\": tru");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temp file left"
        );

        let fresh = dir.path().join("new/daemon.json");
        assert!(write(&fresh, &path_entry()).unwrap());
    }

    #[test]
    fn parses_dockerd_versions() {
        let v = DockerdVersion::parse("Docker version 20.10.24+dfsg1, build 297e128\n").unwrap();
        assert_eq!(
            (v.major, v.minor, v.text.as_str()),
            (20, 10, "20.10.24+dfsg1")
        );
        assert!(!v.takes_runtime_type());
        let v = DockerdVersion::parse("Docker version 28.2.2, build e6534b4").unwrap();
        assert_eq!((v.major, v.minor), (28, 2));
        assert!(v.takes_runtime_type());
        assert!(DockerdVersion::parse("dockerd: command not found").is_none());
    }

    #[test]
    fn runtime_type_is_refused_for_an_old_dockerd_and_warned_about_when_printed() {
        let old = DockerdVersion::parse("Docker version 20.10.24+dfsg1, build x").unwrap();
        let new = DockerdVersion::parse("Docker version 24.0.7, build x").unwrap();
        let shim = Entry {
            form: Form::RuntimeType,
            ..path_entry()
        };
        let err = check_form(&shim, Some(&old), true).unwrap_err();
        assert!(err.to_string().contains("20.10.24+dfsg1"), "{err}");
        assert!(err.to_string().contains("path"), "{err}");
        let warning = check_form(&shim, Some(&old), false).unwrap().unwrap();
        assert!(warning.starts_with("warning: "), "{warning}");
        assert!(warning.contains("runtimeType"), "{warning}");
        let note = check_form(&path_entry(), Some(&old), false)
            .unwrap()
            .unwrap();
        assert!(note.contains("older than 23"), "{note}");
        assert_eq!(check_form(&path_entry(), Some(&old), true).unwrap(), None);
        assert_eq!(check_form(&shim, Some(&new), true).unwrap(), None);
        assert_eq!(check_form(&shim, None, true).unwrap(), None);
    }
}
