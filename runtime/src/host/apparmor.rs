//! AppArmor on the host: whether this runtime can use it, loading a sandbox's profile before
//! its init starts, and removing the profile when the last sandbox that uses it is deleted.
//!
//! Profiles are named by their content (`agent_sandbox_policy::apparmor::loaded_profile`), so
//! the sandboxes of one policy share one kernel profile. Who uses it is kept host-wide, not
//! per state root (podman's and containerd's sandboxes may share a profile): one marker file
//! per sandbox in `/run/agent-sandbox/apparmor/<profile>/`, named after a hash of the sandbox
//! directory and holding its path, changed only under `/run/agent-sandbox/apparmor/lock`.
//! A marker whose sandbox directory no longer exists (a runtime killed mid-delete, a crash)
//! is stale and does not count. The kernel's own list of loaded profiles decides whether a
//! create must run `apparmor_parser -r`: a profile of this name and hash can only be ours.
//!
//! libcontainer applies `process.apparmorProfile` by writing `exec <profile>` to
//! `/proc/self/attr/apparmor/exec` in the init and in every exec'd process; the transition
//! happens at the workload's `execve`, after Landlock and seccomp are in place.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_sandbox_policy::apparmor::LoadedProfile;
use agent_sandbox_policy::layers::AppArmorHost;
use nix::fcntl::{Flock, FlockArg};

use crate::files::FileError;
use crate::state::SandboxDir;

/// `Y` when the kernel's AppArmor is on.
const ENABLED: &str = "/sys/module/apparmor/parameters/enabled";
/// AppArmor's securityfs directory (profile list, `.remove`).
const SECURITYFS: &str = "/sys/kernel/security/apparmor";
/// Host-wide markers and the lock.
const STATE: &str = "/run/agent-sandbox/apparmor";

/// Errors of loading and removing profiles; each names the file or the command.
#[derive(Debug, thiserror::Error)]
pub enum AppArmorError {
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("cannot run {parser}")]
    Spawn {
        parser: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{parser} {flags} {file} failed: {stderr}")]
    Parser {
        parser: PathBuf,
        flags: &'static str,
        file: PathBuf,
        stderr: String,
    },
    #[error("profile {profile} is not in {SECURITYFS}/profiles after apparmor_parser -r")]
    NotLoaded { profile: String },
    #[error("apparmor_parser not found in /usr/sbin or /sbin (Debian and Ubuntu package apparmor)")]
    NoParser,
}

/// Whether this runtime can load and apply profiles here, and why not.
pub fn host() -> AppArmorHost {
    let enabled = std::fs::read_to_string(ENABLED).is_ok_and(|s| s.trim_start().starts_with('Y'));
    if !enabled {
        return AppArmorHost::Absent;
    }
    let reason = if !Path::new(SECURITYFS).join("profiles").exists() {
        format!("the kernel has AppArmor but securityfs is not mounted ({SECURITYFS})")
    } else if crate::state::paths::rootless().unwrap_or(true) {
        "rootless: loading a profile needs CAP_MAC_ADMIN in the host's user namespace".to_owned()
    } else if parser().is_none() {
        AppArmorError::NoParser.to_string()
    } else {
        return AppArmorHost::Usable;
    };
    AppArmorHost::Unusable { reason }
}

fn parser() -> Option<PathBuf> {
    ["/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Whether the kernel has a profile called `name` loaded.
pub fn is_loaded(name: &str) -> bool {
    std::fs::read_to_string(Path::new(SECURITYFS).join("profiles"))
        .is_ok_and(|text| listed(&text, name))
}

/// `profiles` lists one `NAME (MODE)` per line.
fn listed(profiles: &str, name: &str) -> bool {
    profiles.lines().any(|l| {
        l.strip_suffix(')')
            .and_then(|l| l.rsplit_once(" ("))
            .is_some_and(|(n, _)| n == name)
    })
}

/// The label of `pid` as the kernel reports it (`NAME (enforce)`, `unconfined`).
pub fn label_of(pid: i32) -> Option<String> {
    ["attr/apparmor/current", "attr/current"]
        .iter()
        .find_map(|f| std::fs::read_to_string(format!("/proc/{pid}/{f}")).ok())
        .map(|s| s.trim_end_matches(['\n', '\0']).to_owned())
}

/// Where the markers and the loaded text of one profile live.
struct Store {
    root: PathBuf,
}

impl Store {
    fn host() -> Self {
        Self {
            root: PathBuf::from(STATE),
        }
    }

    fn lock(&self) -> Result<Flock<File>, AppArmorError> {
        let path = self.root.join("lock");
        std::fs::create_dir_all(&self.root).map_err(|e| FileError::write(&self.root, e))?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| AppArmorError::Lock {
                path: path.clone(),
                source,
            })?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| AppArmorError::Lock {
            path,
            source: e.into(),
        })
    }

    fn users(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn text_file(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.profile"))
    }

    /// The marker of the sandbox in `sandbox_dir`.
    fn marker(&self, name: &str, sandbox_dir: &Path) -> PathBuf {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(sandbox_dir.as_os_str().as_encoded_bytes());
        self.users(name)
            .join(hex::encode(digest.get(..8).unwrap_or_default()))
    }

    /// Markers of sandboxes that still exist; stale ones are removed.
    fn live_users(&self, name: &str) -> usize {
        let Ok(entries) = std::fs::read_dir(self.users(name)) else {
            return 0;
        };
        let mut live = 0;
        for entry in entries.flatten() {
            let owner = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if !owner.is_empty() && Path::new(owner.trim_end()).is_dir() {
                live += 1;
            } else {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        live
    }
}

fn write(path: &Path, text: &str) -> Result<(), FileError> {
    let mut f = File::create(path).map_err(|e| FileError::write(path, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| FileError::write(path, e))
}

fn run_parser(flags: &'static str, file: &Path) -> Result<(), AppArmorError> {
    let parser = parser().ok_or(AppArmorError::NoParser)?;
    let out = Command::new(&parser)
        .args(flags.split(' '))
        .arg(file)
        .output()
        .map_err(|source| AppArmorError::Spawn {
            parser: parser.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(AppArmorError::Parser {
        parser,
        flags,
        file: file.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// Makes `profile` loaded for the sandbox in `sandbox_dir` (before its init starts): records
/// the sandbox as a user, then loads the profile unless the kernel has it already.
pub fn acquire(sandbox_dir: &SandboxDir, profile: &LoadedProfile) -> Result<(), AppArmorError> {
    let store = Store::host();
    let _lock = store.lock()?;
    // The sandbox dir names the profile first, so a failed create releases what it took.
    write(&sandbox_dir.apparmor_profile(), &profile.name)?;
    let users = store.users(&profile.name);
    std::fs::create_dir_all(&users).map_err(|e| FileError::write(&users, e))?;
    write(
        &store.marker(&profile.name, sandbox_dir.path()),
        &sandbox_dir.path().display().to_string(),
    )?;
    if is_loaded(&profile.name) {
        tracing::debug!(profile = %profile.name, "apparmor profile already loaded");
        return Ok(());
    }
    let file = store.text_file(&profile.name);
    write(&file, &profile.text)?;
    // -r: load or replace; -K: no cache (nothing written under /etc or /var/cache).
    run_parser("-r -K", &file)?;
    if !is_loaded(&profile.name) {
        return Err(AppArmorError::NotLoaded {
            profile: profile.name.clone(),
        });
    }
    tracing::info!(profile = %profile.name, "apparmor profile loaded");
    Ok(())
}

/// Drops the sandbox's marker (after its processes are gone) and removes the profile from
/// the kernel when no live sandbox uses it any more. Best effort: errors are logged.
pub fn release(sandbox_dir: &SandboxDir) {
    let Ok(name) = std::fs::read_to_string(sandbox_dir.apparmor_profile()) else {
        return;
    };
    let name = name.trim().to_owned();
    if let Err(e) = release_named(sandbox_dir.path(), &name) {
        tracing::error!(profile = %name, error = %e, "cannot release the apparmor profile");
    }
    let _ = std::fs::remove_file(sandbox_dir.apparmor_profile());
}

fn release_named(sandbox_dir: &Path, name: &str) -> Result<(), AppArmorError> {
    let store = Store::host();
    let _lock = store.lock()?;
    let _ = std::fs::remove_file(store.marker(name, sandbox_dir));
    if store.live_users(name) > 0 {
        return Ok(());
    }
    let file = store.text_file(name);
    if is_loaded(name) {
        if file.exists() {
            run_parser("-R -K", &file)?;
        } else {
            // The text is gone (e.g. /run was cleaned): the kernel's own interface.
            let remove = Path::new(SECURITYFS).join(".remove");
            write(&remove, name)?;
        }
        tracing::info!(profile = %name, "apparmor profile removed with its last sandbox");
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_dir(store.users(name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_list_lines_match_whole_names() {
        let text = "agent-sandbox-0123 (enforce)\nlsb_release (enforce)\n/usr/bin/man (complain)\n";
        assert!(listed(text, "agent-sandbox-0123"));
        assert!(listed(text, "/usr/bin/man"));
        assert!(!listed(text, "agent-sandbox-012"));
        assert!(!listed(text, "enforce"));
    }

    #[test]
    fn stale_markers_do_not_keep_a_profile() {
        let root = tempfile::tempdir().unwrap();
        let store = Store {
            root: root.path().to_owned(),
        };
        let live = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(store.users("p")).unwrap();
        write(
            &store.marker("p", live.path()),
            &live.path().display().to_string(),
        )
        .unwrap();
        let gone = root.path().join("deleted-sandbox");
        write(&store.marker("p", &gone), &gone.display().to_string()).unwrap();
        assert_ne!(store.marker("p", live.path()), store.marker("p", &gone));
        assert_eq!(store.live_users("p"), 1);
        assert!(
            !store.marker("p", &gone).exists(),
            "the stale marker is pruned"
        );
        std::fs::remove_file(store.marker("p", live.path())).unwrap();
        assert_eq!(store.live_users("p"), 0);
    }

    #[test]
    fn this_host_without_apparmor_reports_it_absent() {
        // The CI machine's kernel has no AppArmor (FIELD-NOTES); a host that has it must
        // report usable or name why not.
        let enabled = std::fs::read_to_string(ENABLED).is_ok_and(|s| s.starts_with('Y'));
        match host() {
            AppArmorHost::Absent => assert!(!enabled),
            AppArmorHost::Unusable { reason } => assert!(enabled && !reason.is_empty()),
            AppArmorHost::Usable => assert!(enabled && !is_loaded("")),
        }
    }
}
