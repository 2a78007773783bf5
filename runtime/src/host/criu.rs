//! CRIU, the host tool that saves a sandbox's processes to an image and brings them back
//! (`checkpoint`, `restore`; docs/checkpoint.md). The runtime runs the `criu` binary, as
//! runc runs it through its RPC: the options are the same, the process is one per action.
//!
//! What is here: finding CRIU and checking its version, the mounts CRIU must be told about
//! (those whose source lies outside the sandbox's mount namespace), the image's digest, and
//! running `criu dump` / `criu restore`, where needed under the sandbox's host root id (see
//! [`Runner`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The oldest CRIU major version that works here: 3.x fails on kernels from 6.13 on
/// ("vdso: Unexpected rt vDSO area bounds", CRIU issue 2532).
pub const MIN_MAJOR: u32 = 4;

/// Where the runtime looks for CRIU, in order (`AGENT_SANDBOX_CRIU` first when set):
/// `hack/criu.sh` installs to the first, Debian's package to the second.
const SEARCH: [&str; 2] = ["/usr/local/sbin/criu", "/usr/sbin/criu"];

/// The devices a sandbox may have bound from the host (`/dev/NAME`): the OCI default set.
/// A masked file is `/dev/null` bound over it.
const DEVICES: [&str; 6] = ["null", "zero", "full", "tty", "random", "urandom"];

/// Errors of driving CRIU.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "CRIU is not installed (looked for {looked}); checkpoint and restore need CRIU \
         {MIN_MAJOR} or newer (docs/checkpoint.md#criu)"
    )]
    Missing { looked: String },
    #[error(
        "{binary} is CRIU {found}; checkpoint and restore need CRIU {MIN_MAJOR} or newer \
         (docs/checkpoint.md#criu)"
    )]
    TooOld { binary: PathBuf, found: String },
    #[error("cannot run {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("criu {action} failed ({status}): {cause} (its log: {log})")]
    Failed {
        action: &'static str,
        status: String,
        cause: String,
        log: PathBuf,
    },
    #[error("cannot read the checkpoint image {path}")]
    Image {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mount point {dest:?} cannot be named to CRIU (it holds ':' or a newline)")]
    MountName { dest: String },
    #[error(
        "the image asks for the external mount {dest} ({kind}), which the sandbox's spec \
         does not have (docs/checkpoint.md#refused)"
    )]
    UnknownExternal { dest: String, kind: &'static str },
}

/// A mount of the sandbox whose source lies outside its mount namespace. CRIU records it
/// by name at dump; at restore the runtime names the host path, from the restoring
/// sandbox's own spec and cgroups, never from the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum External {
    /// A bind mount the hardened spec names (a volume, podman's `/etc/hosts`, a protected
    /// name's placeholder): at restore, that spec's source for the same destination.
    Bind { dest: String },
    /// A host device node bound in (`/dev/NAME`; also `/dev/null` over a masked file).
    Device { dest: String, name: String },
    /// A cgroup v1 hierarchy (`/sys/fs/cgroup/CONTROLLER`), or the unified hierarchy
    /// (controller [`UNIFIED`]): at restore, the sandbox's directory in it.
    Cgroup { dest: String, controller: String },
    /// The sandbox's terminal bound over `/dev/console` (a pty slave of its devpts, whose
    /// master is the engine's): at restore, the new terminal's slave (`host::console`).
    Console { dest: String },
}

impl External {
    /// The mount point in the sandbox, which is CRIU's key for it.
    pub fn dest(&self) -> &str {
        match self {
            External::Bind { dest }
            | External::Device { dest, .. }
            | External::Cgroup { dest, .. }
            | External::Console { dest } => dest,
        }
    }
}

/// One line of a `/proc/PID/mountinfo`.
struct MountLine {
    device: String,
    root: String,
    point: String,
    fstype: String,
}

/// Decodes mountinfo's octal escapes (`\040` for a space).
pub(crate) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let oct = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
        match oct.and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok()) {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            Some(MountLine {
                device: (*f.get(2)?).to_owned(),
                root: unescape(f.get(3)?),
                point: unescape(f.get(4)?),
                fstype: right.split(' ').next()?.to_owned(),
            })
        })
        .collect()
}

/// The controller key of the unified (v2) hierarchy, as `host::cgroups::dirs_of` names it.
pub const UNIFIED: &str = "unified";

/// Filesystems the sandbox's own mount namespace makes (CRIU mounts them again itself).
const INTERNAL_FS: [&str; 6] = ["proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup2"];

/// The sandbox's external mounts, from its init's mountinfo: every mount the runtime or
/// the engine made from the host side (a bind, the workspace overlay, a device node, a
/// cgroup v1 hierarchy, which a user namespace cannot mount), and every mount of a part of
/// a filesystem whose whole is not mounted in the sandbox. The root is CRIU's `--root`.
pub fn externals(mountinfo: &str) -> Result<Vec<External>, CriuError> {
    let lines = parse_mountinfo(mountinfo);
    let whole: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l.root == "/" && INTERNAL_FS.contains(&l.fstype.as_str()))
        .map(|l| l.device.as_str())
        .collect();
    let mut out = Vec::new();
    for l in &lines {
        // One pty of the devpts bound alone: CRIU looks for its master in the image.
        let pty = l.fstype == "devpts" && l.root != "/" && l.root != "/ptmx";
        let external = l.point != "/"
            && (pty
                || !INTERNAL_FS.contains(&l.fstype.as_str())
                || !whole.contains(l.device.as_str()));
        if !external {
            continue;
        }
        if l.point.contains([':', '\n']) {
            return Err(CriuError::MountName {
                dest: l.point.clone(),
            });
        }
        let dest = l.point.clone();
        out.push(match l.fstype.as_str() {
            "cgroup" => External::Cgroup {
                controller: l.point.rsplit('/').next().unwrap_or_default().to_owned(),
                dest,
            },
            // The sandbox's cgroup namespace root, seen from the host as a part of the
            // unified hierarchy: at restore, the restoring sandbox's own directory.
            "cgroup2" => External::Cgroup {
                controller: UNIFIED.to_owned(),
                dest,
            },
            "devpts" => External::Console { dest },
            "devtmpfs" => External::Device {
                name: l.root.trim_start_matches('/').to_owned(),
                dest,
            },
            _ => External::Bind { dest },
        });
    }
    Ok(out)
}

/// What the restoring sandbox provides for the image's external mounts.
pub struct Sources<'a> {
    /// Bind mounts of the hardened spec: destination and (reachable) source.
    pub binds: &'a [(String, PathBuf)],
    /// The sandbox's directory in each cgroup v1 hierarchy, by controller.
    pub cgroups: &'a std::collections::BTreeMap<String, PathBuf>,
    /// The restored sandbox's new terminal (its slave's host path), if it has one.
    pub console: Option<&'a Path>,
}

/// CRIU's `--ext-mount-map KEY:PATH` pairs for a restore: each of the image's external
/// mounts resolved from the restoring sandbox's own facts. One the sandbox does not have
/// is refused (an edited image could otherwise bind a host path in).
pub fn restore_map(
    image: &[External],
    sources: &Sources<'_>,
) -> Result<Vec<(String, PathBuf)>, CriuError> {
    image
        .iter()
        .map(|e| {
            let unknown = |kind| CriuError::UnknownExternal {
                dest: e.dest().to_owned(),
                kind,
            };
            let path = match e {
                External::Bind { dest } => sources
                    .binds
                    .iter()
                    .find(|(d, _)| d == dest)
                    .map(|(_, s)| s.clone())
                    .ok_or_else(|| unknown("bind"))?,
                External::Device { name, .. } => DEVICES
                    .contains(&name.as_str())
                    .then(|| Path::new("/dev").join(name))
                    .ok_or_else(|| unknown("device"))?,
                External::Cgroup { controller, .. } => sources
                    .cgroups
                    .get(controller)
                    .cloned()
                    .ok_or_else(|| unknown("cgroup"))?,
                External::Console { dest } => sources
                    .console
                    .filter(|_| dest == CONSOLE)
                    .map(Path::to_owned)
                    .ok_or_else(|| unknown("console"))?,
            };
            if e.dest().contains([':', '\n']) {
                return Err(CriuError::MountName {
                    dest: e.dest().to_owned(),
                });
            }
            Ok((e.dest().to_owned(), path))
        })
        .collect()
}

/// Where a sandbox with a terminal has it bound (the OCI runtime spec's console).
const CONSOLE: &str = "/dev/console";

/// The name of the runtime's own file in an image directory.
pub const MANIFEST: &str = "agent-sandbox.json";

/// SHA-256 over the image's CRIU files (`*.img`, by name, each name and content), as
/// `sha256:HEX`: what the `checkpointed` and `restored` records name.
pub fn image_digest(dir: &Path) -> Result<String, CriuError> {
    let err = |source| CriuError::Image {
        path: dir.to_owned(),
        source,
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(err)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    let mut h = Sha256::new();
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).map_err(|source| CriuError::Image {
            path: dir.join(name),
            source,
        })?;
        h.update(name.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// The CRIU binary and how to run it.
pub struct Runner {
    binary: PathBuf,
}

/// CRIU found, its `criu --version` running ([`Runner::start_locating`]).
pub struct Locating {
    found: Result<(PathBuf, std::process::Child), CriuError>,
}

impl Runner {
    /// Finds CRIU (`AGENT_SANDBOX_CRIU`, then [`SEARCH`]) and checks its version.
    pub fn locate() -> Result<Self, CriuError> {
        Self::start_locating().finish()
    }

    /// [`Runner::locate`] in two halves: this one finds the binary and starts `criu
    /// --version` (7 ms p50, 29 ms p90 on the CI machine at load 22), [`Locating::finish`]
    /// reads its answer; the caller's own work runs in between. A child process rather than
    /// a thread: the caller may still unshare or enter namespaces meanwhile.
    pub fn start_locating() -> Locating {
        let candidates: Vec<PathBuf> = std::env::var_os("AGENT_SANDBOX_CRIU")
            .map(PathBuf::from)
            .into_iter()
            .chain(SEARCH.iter().map(PathBuf::from))
            .collect();
        let found = candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .ok_or_else(|| CriuError::Missing {
                looked: candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
            .and_then(|binary| {
                match std::process::Command::new(&binary)
                    .arg("--version")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                {
                    Ok(child) => Ok((binary, child)),
                    Err(source) => Err(CriuError::Spawn { binary, source }),
                }
            });
        Locating { found }
    }
}

impl Locating {
    /// The runner, once `criu --version` said CRIU is new enough.
    pub fn finish(self) -> Result<Runner, CriuError> {
        let (binary, child) = self.found?;
        let out = child
            .wait_with_output()
            .map_err(|source| CriuError::Spawn {
                binary: binary.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let found = version_of(&text).unwrap_or_else(|| "of unknown version".to_owned());
        let major = found.split('.').next().and_then(|m| m.parse::<u32>().ok());
        if major.is_none_or(|m| m < MIN_MAJOR) {
            return Err(CriuError::TooOld { binary, found });
        }
        Ok(Runner { binary })
    }
}

impl Runner {
    /// Runs `criu ACTION ARGS` with its log `log` (in `work`), as the runtime or, with
    /// `as_uid`, under that host id (see [`exec_as`]). On failure, the error names the
    /// log and the last error CRIU wrote there (escaped: it may quote the sandbox's names).
    pub fn run(
        &self,
        action: &'static str,
        args: &[String],
        work: &Path,
        log: &str,
        as_uid: Option<u32>,
        env: &[(&str, String)],
    ) -> Result<(), CriuError> {
        let mut cmd = match as_uid {
            Some(uid) => {
                let mut c = std::process::Command::new("/proc/self/exe");
                c.arg("criu-as")
                    .arg("--uid")
                    .arg(uid.to_string())
                    .arg("--")
                    .arg(&self.binary);
                c
            }
            None => std::process::Command::new(&self.binary),
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .arg(action)
            .args(args)
            .arg("--work-dir")
            .arg(work)
            .arg("--log-file")
            .arg(log)
            .arg("-v4")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let out = cmd.output().map_err(|source| CriuError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        let log = work.join(log);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let cause = first_error(&text)
            .or_else(|| stderr.lines().rfind(|l| !l.trim().is_empty()))
            .unwrap_or("no error in its log");
        Err(CriuError::Failed {
            action,
            status: out.status.to_string(),
            cause: agent_sandbox_audit::escape::escape(cause.trim()).into_owned(),
            log,
        })
    }
}

impl Runner {
    /// Runs `criu restore ARGS` in a new cgroup namespace rooted at the caller's cgroup (the
    /// sandbox's, which the caller joined; entered between fork and exec, `agent_sandbox_sys::
    /// cgroupns`), with the caller's standard descriptors (CRIU hands them to the restored init
    /// where `--inherit-fd` says) and one more environment variable (`KEY`, `VALUE`), which
    /// CRIU passes on to its action script.
    pub fn restore_in_new_cgroupns(
        &self,
        args: &[String],
        (key, value): (&str, &str),
        work: &Path,
        log: &str,
    ) -> Result<(), CriuError> {
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.env(key, value)
            .arg("restore")
            .args(args)
            .arg("--work-dir")
            .arg(work)
            .arg("--log-file")
            .arg(log)
            .arg("-v4");
        agent_sandbox_sys::cgroupns::new_cgroupns_at_exec(&mut cmd);
        let status = cmd.status().map_err(|source| CriuError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if status.success() {
            return Ok(());
        }
        let log = work.join(log);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Err(CriuError::Failed {
            action: "restore",
            status: status.to_string(),
            cause: agent_sandbox_audit::escape::escape(
                first_error(&text).unwrap_or("no error in its log").trim(),
            )
            .into_owned(),
            log,
        })
    }
}

/// CRIU's action script at a restore. CRIU runs it at each of its seven stages and waits
/// for it; only `pre-resume` needs the runtime (its check of the restored tasks). The
/// runtime's binary (17 MB, relocated at every start) takes about 5 ms to exit at the other
/// six, a shell about 1 ms (p50 on the CI machine, load 9): so the script is a shell script
/// that `exec`s the runtime's binary at `pre-resume` only (the binary, the runtime's
/// parent then still CRIU, reads the stage and its sandbox from the environment as before).
/// It lives in a sealed memfd of the runtime's (`/proc/PID/fd/N`): the sandbox's
/// directory is under `/run`, which Debian's and Ubuntu's initramfs mount `noexec`, and
/// nothing can change a sealed memfd. Where memfds cannot be executed (`vm.memfd_noexec`
/// other than 0) or the binary's path cannot be quoted, the script is the binary itself.
pub struct ActionScript {
    /// The memfd, open as long as CRIU may run the script.
    _memfd: Option<std::os::fd::OwnedFd>,
    path: PathBuf,
}

impl ActionScript {
    /// The restore's script: the binary at `pre-resume`.
    pub fn for_exe(exe: &Path) -> Self {
        Self::for_exe_at(exe, "pre-resume")
    }

    /// A script that runs the binary `exe` at CRIU's `stage` only (a checkpoint's workspace
    /// snapshot: `post-dump`, `crate::report::snapshots`).
    pub fn for_exe_at(exe: &Path, stage: &'static str) -> Self {
        match Self::shell(exe, stage) {
            Ok(Some(script)) => script,
            Ok(None) => Self::binary(exe),
            Err(e) => {
                tracing::debug!(error = %e, "CRIU's action script is the runtime's binary");
                Self::binary(exe)
            }
        }
    }

    fn binary(exe: &Path) -> Self {
        Self {
            _memfd: None,
            path: exe.to_owned(),
        }
    }

    /// The path CRIU executes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn shell(exe: &Path, stage: &'static str) -> std::io::Result<Option<Self>> {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        use nix::sys::memfd::{MemFdCreateFlag, memfd_create};
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let exec_allowed =
            std::fs::read_to_string("/proc/sys/vm/memfd_noexec").map_or(true, |v| v.trim() == "0");
        let Some(quoted) = exe.to_str().filter(|p| !p.contains(['\'', '\n'])) else {
            return Ok(None);
        };
        if !exec_allowed {
            return Ok(None);
        }
        let fd = memfd_create(
            c"agent-sandbox-criu-action",
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )?;
        let mut file = std::fs::File::from(fd);
        write!(
            file,
            "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = {stage} ] || exit 0\nexec '{quoted}'\n"
        )?;
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o500))?;
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SEAL
                    | SealFlag::F_SEAL_SHRINK
                    | SealFlag::F_SEAL_GROW
                    | SealFlag::F_SEAL_WRITE,
            ),
        )?;
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            file.as_raw_fd()
        ));
        Ok(Some(Self {
            _memfd: Some(file.into()),
            path,
        }))
    }
}

/// `4.2.1` from `criu --version`'s `Version: 4.2.1`.
fn version_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
}

/// The first line of a CRIU log that reports an error, without its timestamp: the cause
/// (the errors after it are its consequences, such as `Dump files (pid: N) failed`).
fn first_error(log: &str) -> Option<&str> {
    log.lines()
        .find(|l| {
            l.contains("Error (")
                && !l.contains("rlimit: Can't setup")
                && !l.contains("Dumping FAILED")
                && !l.contains("Restoring FAILED")
        })
        .map(|l| l.split_once("): ").map_or(l, |(_, rest)| rest))
}

/// Whether the runtime lacks CAP_SYS_RESOURCE: CRIU then cannot read the rlimits of the
/// sandbox's processes as root (`prlimit` on a process of another user needs it), and runs
/// as their host user instead ([`exec_as`]).
pub fn needs_sandbox_uid() -> bool {
    !caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_RESOURCE,
    )
    .unwrap_or(false)
}

/// The hidden `criu-as` command: with `uid`, becomes that host id (user and group, no
/// supplementary groups) keeping the runtime's capabilities as ambient ones; then executes
/// `argv`. Returns only on an error.
pub fn exec_as(uid: Option<u32>, argv: &[std::ffi::OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return std::io::Error::other("criu-as: no program");
    };
    if let Some(uid) = uid
        && let Err(e) = become_keeping_caps(uid)
    {
        return std::io::Error::other(format!("criu-as: {e}"));
    }
    std::process::Command::new(program).args(args).exec()
}

fn become_keeping_caps(uid: u32) -> Result<(), String> {
    use caps::CapSet;
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    caps::set(None, CapSet::Inheritable, &permitted).map_err(|e| format!("inheritable: {e}"))?;
    nix::sys::prctl::set_keepcaps(true).map_err(|e| format!("keepcaps: {e}"))?;
    let (u, g) = (
        nix::unistd::Uid::from_raw(uid),
        nix::unistd::Gid::from_raw(uid),
    );
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresgid(g, g, g).map_err(|e| format!("setresgid: {e}"))?;
    nix::unistd::setresuid(u, u, u).map_err(|e| format!("setresuid: {e}"))?;
    caps::set(None, CapSet::Effective, &permitted).map_err(|e| format!("effective: {e}"))?;
    for cap in &permitted {
        caps::raise(None, CapSet::Ambient, *cap).map_err(|e| format!("ambient {cap}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
104 65 0:41 / / ro,relatime - overlay overlay rw,lowerdir=/l
105 104 0:50 / /proc rw,nosuid - proc proc rw
106 104 0:51 / /dev rw,nosuid - tmpfs tmpfs rw
112 111 254:0 /run/containers/x/userdata/hosts /etc/hosts ro,nosuid - ext4 /dev/vda rw
117 116 0:29 /libpod_parent/libpod-1 /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
125 116 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
139 135 0:59 / /workspace rw,nosuid master:29 - overlay overlay rw,lowerdir=/proc/self/fd/5
129 128 254:0 /run/p/placeholder/file /home/.bash\\040rc ro master:1 - ext4 /dev/vda rw
208 106 0:6 /null /dev/null rw,relatime master:16 - devtmpfs devtmpfs rw
66 105 0:50 /bus /proc/bus ro,nosuid - proc proc rw
";

    #[test]
    fn externals_are_cgroups_and_parts_of_filesystems_not_mounted_whole() {
        let got = externals(INFO).unwrap();
        assert_eq!(
            got,
            vec![
                External::Bind {
                    dest: "/etc/hosts".into()
                },
                External::Cgroup {
                    dest: "/sys/fs/cgroup/cpu".into(),
                    controller: "cpu".into()
                },
                External::Cgroup {
                    dest: "/sys/fs/cgroup/systemd".into(),
                    controller: "systemd".into()
                },
                External::Bind {
                    dest: "/workspace".into()
                },
                External::Bind {
                    dest: "/home/.bash rc".into()
                },
                External::Device {
                    dest: "/dev/null".into(),
                    name: "null".into()
                },
            ],
            "/proc/bus is a part of the sandbox's own proc: CRIU finds it itself"
        );
    }

    #[test]
    fn the_unified_hierarchy_seen_from_the_host_is_the_sandboxs_cgroup() {
        let info = "\
104 65 0:41 / / ro,relatime - overlay overlay rw,lowerdir=/l
117 104 0:27 /machine.slice/libpod-1.scope /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw
";
        let image = externals(info).unwrap();
        assert_eq!(
            image,
            vec![External::Cgroup {
                dest: "/sys/fs/cgroup".into(),
                controller: UNIFIED.into()
            }]
        );
        let cgroups = [(
            UNIFIED.to_owned(),
            PathBuf::from("/sys/fs/cgroup/machine.slice/libpod-2.scope"),
        )]
        .into();
        let src = Sources {
            binds: &[],
            cgroups: &cgroups,
            console: None,
        };
        assert_eq!(
            restore_map(&image, &src).unwrap(),
            vec![(
                "/sys/fs/cgroup".to_owned(),
                PathBuf::from("/sys/fs/cgroup/machine.slice/libpod-2.scope")
            )]
        );
    }

    #[test]
    fn the_terminal_bound_over_dev_console_is_external_and_only_a_new_one_restores_it() {
        let info = "\
104 65 0:41 / / ro,relatime - overlay overlay rw,lowerdir=/l
110 104 0:60 / /dev/pts rw,nosuid - devpts devpts rw,newinstance,ptmxmode=0666
111 104 0:60 /0 /dev/console rw,nosuid - devpts devpts rw,newinstance,ptmxmode=0666
";
        let image = externals(info).unwrap();
        assert_eq!(
            image,
            vec![External::Console {
                dest: "/dev/console".into()
            }],
            "the devpts itself is the sandbox's own"
        );
        let (binds, cgroups) = sources();
        let mut src = Sources {
            binds: &binds,
            cgroups: &cgroups,
            console: None,
        };
        assert!(matches!(
            restore_map(&image, &src),
            Err(CriuError::UnknownExternal {
                kind: "console",
                ..
            })
        ));
        src.console = Some(Path::new("/dev/pts/7"));
        assert_eq!(
            restore_map(&image, &src).unwrap(),
            vec![("/dev/console".to_owned(), PathBuf::from("/dev/pts/7"))]
        );
        // An image that asks for the terminal elsewhere is refused.
        let moved = [External::Console {
            dest: "/etc/profile".into(),
        }];
        assert!(matches!(
            restore_map(&moved, &src),
            Err(CriuError::UnknownExternal {
                kind: "console",
                ..
            })
        ));
    }

    #[test]
    fn a_mount_point_criu_cannot_name_is_an_error() {
        let info = "1 0 254:0 /a /x:y ro - ext4 /dev/vda rw\n";
        assert!(matches!(
            externals(info),
            Err(CriuError::MountName { dest }) if dest == "/x:y"
        ));
    }

    fn sources() -> (
        Vec<(String, PathBuf)>,
        std::collections::BTreeMap<String, PathBuf>,
    ) {
        let binds = vec![("/etc/hosts".to_owned(), PathBuf::from("/run/mnt/binds/8"))];
        let cgroups = [("cpu".to_owned(), PathBuf::from("/sys/fs/cgroup/cpu/new"))].into();
        (binds, cgroups)
    }

    #[test]
    fn restore_takes_each_source_from_the_restoring_sandbox() {
        let (binds, cgroups) = sources();
        let src = Sources {
            binds: &binds,
            cgroups: &cgroups,
            console: None,
        };
        let got = restore_map(&externals(INFO).unwrap()[..2], &src).unwrap();
        assert_eq!(
            got,
            vec![
                ("/etc/hosts".to_owned(), PathBuf::from("/run/mnt/binds/8")),
                (
                    "/sys/fs/cgroup/cpu".to_owned(),
                    PathBuf::from("/sys/fs/cgroup/cpu/new")
                ),
            ]
        );
        let dev = [External::Device {
            dest: "/dev/null".into(),
            name: "null".into(),
        }];
        assert_eq!(
            restore_map(&dev, &src).unwrap()[0].1,
            Path::new("/dev/null")
        );
    }

    #[test]
    fn restore_refuses_an_external_mount_the_sandbox_does_not_have() {
        let (binds, cgroups) = sources();
        let src = Sources {
            binds: &binds,
            cgroups: &cgroups,
            console: None,
        };
        for (edited, kind) in [
            (
                External::Bind {
                    dest: "/etc/shadow".into(),
                },
                "bind",
            ),
            (
                External::Device {
                    dest: "/dev/sda".into(),
                    name: "sda".into(),
                },
                "device",
            ),
            (
                External::Device {
                    dest: "/x".into(),
                    name: "../etc/shadow".into(),
                },
                "device",
            ),
            (
                External::Cgroup {
                    dest: "/sys/fs/cgroup/memory".into(),
                    controller: "memory".into(),
                },
                "cgroup",
            ),
        ] {
            let err = restore_map(std::slice::from_ref(&edited), &src).unwrap_err();
            assert!(
                matches!(&err, CriuError::UnknownExternal { kind: k, .. } if *k == kind),
                "{edited:?}: {err}"
            );
        }
    }

    #[test]
    fn the_digest_covers_criu_files_by_name_and_content_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"a").unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"b").unwrap();
        let first = image_digest(dir.path()).unwrap();
        assert!(first.starts_with("sha256:"));
        std::fs::write(dir.path().join(MANIFEST), b"{}").unwrap();
        std::fs::write(dir.path().join("dump.log"), b"log").unwrap();
        assert_eq!(image_digest(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("pages-1.img"), b"c").unwrap();
        assert_ne!(image_digest(dir.path()).unwrap(), first);
    }

    #[test]
    fn the_action_script_runs_the_binary_at_pre_resume_only() {
        let run = |script: &ActionScript, stage: &str| {
            std::process::Command::new(script.path())
                .env("CRTOOLS_SCRIPT_ACTION", stage)
                .status()
                .unwrap()
                .success()
        };
        let fails = ActionScript::for_exe(Path::new("/bin/false"));
        assert!(
            fails.path().starts_with("/proc"),
            "not a memfd: {}",
            fails.path().display()
        );
        for stage in [
            "pre-restore",
            "post-restore",
            "network-unlock",
            "post-resume",
        ] {
            assert!(run(&fails, stage), "{stage}: the binary ran");
        }
        assert!(
            !run(&fails, "pre-resume"),
            "pre-resume: the binary did not run"
        );
        assert!(run(
            &ActionScript::for_exe(Path::new("/bin/true")),
            "pre-resume"
        ));
        // Sealed: not even its owner can change it.
        assert!(
            std::fs::OpenOptions::new()
                .append(true)
                .open(fails.path())
                .and_then(|mut f| std::io::Write::write_all(&mut f, b"id\n"))
                .is_err()
        );
        // A checkpoint's script runs the binary at post-dump only.
        let dump = ActionScript::for_exe_at(Path::new("/bin/false"), "post-dump");
        assert!(run(&dump, "pre-resume") && run(&dump, "network-lock"));
        assert!(!run(&dump, "post-dump"));
        // A path the script cannot quote: the binary itself.
        let odd = Path::new("/opt/it's/agent-sandbox");
        assert_eq!(ActionScript::for_exe(odd).path(), odd);
    }

    #[test]
    fn version_and_first_error_are_read_from_criu_text() {
        assert_eq!(
            version_of("Version: 4.2.1\nGitID: x\n").as_deref(),
            Some("4.2.1")
        );
        let log = "(00.04) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE\n\
                   (00.05) Error (criu/mount.c:2511): mnt: Can't bind-mount at /x\n\
                   (00.06) Info done\n\
                   (00.07) Error (criu/cr-dump.c:1975): Dumping FAILED.\n";
        assert_eq!(first_error(log), Some("mnt: Can't bind-mount at /x"));
        // CRIU 4.2.1 on an open TCP connection: the cause, not the failure it leads to.
        let log = "(00.07) Error (criu/sk-inet.c:200): inet: Connected TCP socket, consider \
                   using --tcp-established option.\n\
                   (00.07) Error (criu/cr-dump.c:1545): Dump files (pid: 23733) failed with -1\n\
                   (00.26) Error (criu/cr-dump.c:1975): Dumping FAILED.\n";
        assert_eq!(
            first_error(log),
            Some("inet: Connected TCP socket, consider using --tcp-established option.")
        );
    }
}
