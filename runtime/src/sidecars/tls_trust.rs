//! The sandbox side of HTTPS credential injection (docs/egress.md, "HTTPS credential
//! injection"): a sandbox whose policy has an `https = true` credential gets a CA of its own
//! at create. Its certificate, and a bundle of the image's system CAs plus it, are mounted
//! read-only at [`TRUST_DIR`] and over the image's system bundle, and the trust variables the
//! common tools read point at them. The key is written 0600 into the sandbox's state
//! directory, which is never mounted; the sandbox's proxy reads it at start and removes it.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use agent_sandbox_policy::network::{DomainRule, placeholder_for, placeholder_value};
use agent_sandbox_policy::{SandboxPlan, SandboxPolicy};
use libcontainer::oci_spec::runtime::{Mount, Process, Spec};

use crate::files::FileError;
use crate::state::SandboxDir;

/// Where the CA certificate and the bundle appear inside the sandbox.
pub const TRUST_DIR: &str = "/etc/agent-sandbox/tls";
/// The CA certificate alone, in [`TRUST_DIR`].
pub const CA_NAME: &str = "ca.pem";
/// The image's system CAs followed by the sandbox's CA, in [`TRUST_DIR`].
pub const BUNDLE_NAME: &str = "ca-bundle.pem";
/// The directory (under the sandbox's mount directory) mounted at [`TRUST_DIR`].
const HOST_DIR: &str = "tls";

/// The system CA bundles of common images (Debian/Ubuntu/Alpine, Fedora/RHEL, openSUSE); the
/// first one that is a regular file is the base of the sandbox's bundle, and the sandbox's
/// bundle is mounted over each that is a regular file (not over symlinks: their targets are
/// in the list).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The largest system bundle read from an image (Debian's is about 200 KB).
const MAX_BUNDLE: u64 = 8 << 20;

/// Why the sandbox's CA could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot make the sandbox's CA")]
    Ca(#[source] agent_sandbox_proxy::ca::CaError),
    #[error("cannot make the sandbox's credential placeholders")]
    Placeholder(#[source] agent_sandbox_proxy::placeholder::PlaceholderError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("the pod's CA directory {path} is missing (the pod's policy has no https credential)", path = path.display())]
    NoPodCa { path: PathBuf },
}

/// The domains the sandbox's CA may vouch for: those of its `https` credentials.
pub fn bound_domains(policy: &SandboxPolicy) -> Vec<DomainRule> {
    policy
        .network
        .credentials
        .iter()
        .filter(|c| c.https)
        .map(|c| c.domain.clone())
        .collect()
}

/// Sets up the sandbox's trust for a policy that terminates TLS (else does nothing): makes
/// the CA (unless `pod_mount_dir` names the pod whose CA a member shares), writes the key and
/// the files to mount, and adds the read-only mounts to `spec`.
pub fn prepare(
    spec: &mut Spec,
    policy: &SandboxPolicy,
    id: &str,
    sandbox_dir: &SandboxDir,
    mount_dir: &Path,
    rootfs: &Path,
    pod_mount_dir: Option<&Path>,
) -> Result<(), TrustError> {
    if !policy.network.terminates_tls() {
        return Ok(());
    }
    let host_dir = match pod_mount_dir {
        Some(pod) => {
            let dir = pod.join(HOST_DIR);
            if !dir.join(BUNDLE_NAME).is_file() {
                return Err(TrustError::NoPodCa { path: dir });
            }
            dir
        }
        None => {
            let ca = agent_sandbox_proxy::ca::generate(id, &bound_domains(policy))
                .map_err(TrustError::Ca)?;
            write_file(&sandbox_dir.tls_key(), ca.key_pem.as_bytes(), 0o600)?;
            write_file(&sandbox_dir.tls_cert(), ca.cert_pem.as_bytes(), 0o644)?;
            let dir = mount_dir.join(HOST_DIR);
            std::fs::create_dir_all(&dir).map_err(|e| FileError::write(&dir, e))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| FileError::write(&dir, e))?;
            write_file(&dir.join(CA_NAME), ca.cert_pem.as_bytes(), 0o644)?;
            let mut bundle = system_bundle(rootfs).unwrap_or_default();
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(ca.cert_pem.as_bytes());
            write_file(&dir.join(BUNDLE_NAME), &bundle, 0o644)?;
            dir
        }
    };
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(readonly_bind(&host_dir, Path::new(TRUST_DIR)));
    for path in SYSTEM_BUNDLES {
        if open_regular(rootfs, path).is_some() {
            mounts.push(readonly_bind(&host_dir.join(BUNDLE_NAME), Path::new(path)));
        }
    }
    spec.set_mounts(Some(mounts));
    tracing::info!(
        id,
        dir = TRUST_DIR,
        "sandbox CA mounted for https credential injection"
    );
    Ok(())
}

/// The sandbox's credential placeholders, one per `placeholder_env` of `policy`: the one `keep`
/// holds for that name if it is well formed (a restore in place keeps its own, a pod's member
/// takes its pod's), else a new one with a random suffix (a create, a fork; docs/egress.md#placeholders).
pub fn placeholders(
    policy: &SandboxPolicy,
    keep: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, TrustError> {
    let mut out = BTreeMap::new();
    for name in policy
        .network
        .credentials
        .iter()
        .filter_map(|c| c.placeholder_env.as_ref())
    {
        let value = match keep.get(name) {
            Some(v) if placeholder_for(name, v) => v.clone(),
            _ => placeholder_value(
                name,
                &agent_sandbox_proxy::placeholder::suffix().map_err(TrustError::Placeholder)?,
            ),
        };
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// The variables that make common tools trust the sandbox's CA, and the sandbox's own
/// credential placeholders, added to a process of the sandbox (init or exec); any the caller
/// set are replaced.
pub fn inject_env(process: &mut Process, plan: &SandboxPlan) {
    let vars = env_vars(plan);
    if vars.is_empty() {
        return;
    }
    let mut env = process.env().clone().unwrap_or_default();
    env.retain(|kv| {
        let key = kv.split('=').next().unwrap_or_default();
        !vars.iter().any(|(k, _)| k == key)
    });
    env.extend(vars.into_iter().map(|(k, v)| format!("{k}={v}")));
    process.set_env(Some(env));
}

/// See [`inject_env`].
pub fn env_vars(plan: &SandboxPlan) -> Vec<(String, String)> {
    let policy = &plan.policy;
    if !policy.network.terminates_tls() {
        return Vec::new();
    }
    let bundle = format!("{TRUST_DIR}/{BUNDLE_NAME}");
    let mut vars: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "PIP_CERT",
        "CARGO_HTTP_CAINFO",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), bundle.clone()))
    .collect();
    // Node adds these to its built-in CAs (it does not read the system bundle).
    vars.push((
        "NODE_EXTRA_CA_CERTS".to_owned(),
        format!("{TRUST_DIR}/{CA_NAME}"),
    ));
    for c in &policy.network.credentials {
        if let Some(name) = &c.placeholder_env {
            vars.push((name.clone(), plan.credential_placeholder(name)));
        }
    }
    vars
}

fn readonly_bind(source: &Path, destination: &Path) -> Mount {
    let mut m = Mount::default();
    m.set_destination(destination.to_path_buf());
    m.set_typ(Some("bind".to_owned()));
    m.set_source(Some(source.to_path_buf()));
    m.set_options(Some(
        ["rbind", "ro", "nosuid", "nodev", "noexec"]
            .iter()
            .map(|o| (*o).to_owned())
            .collect(),
    ));
    m
}

/// `path` in the image, opened if it is a regular file (symlinks resolved inside the image's
/// root only; the last component must not be one).
fn open_regular(rootfs: &Path, path: &str) -> Option<std::fs::File> {
    let root = pathrs::Root::open(rootfs).ok()?;
    let file = root
        .open_subpath(
            path,
            pathrs::flags::OpenFlags::O_RDONLY | pathrs::flags::OpenFlags::O_NOFOLLOW,
        )
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// The image's system CA bundle, if it has one.
fn system_bundle(rootfs: &Path) -> Option<Vec<u8>> {
    SYSTEM_BUNDLES.iter().find_map(|p| {
        let file = open_regular(rootfs, p)?;
        let mut text = Vec::new();
        file.take(MAX_BUNDLE).read_to_end(&mut text).ok()?;
        Some(text)
    })
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), FileError> {
    let err = |e| FileError::write(path, e);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bare(policy: &SandboxPolicy) -> SandboxPlan {
        SandboxPlan::bare(
            policy.clone(),
            agent_sandbox_policy::layers::LayerPlan::default(),
        )
    }

    fn policy(extra: &str) -> SandboxPolicy {
        let text = format!(
            "[network]\nmode = \"proxy\"\nallow = [\"api.example.com\"]\n\
             [[network.credentials]]\ndomain = \"api.example.com\"\nheader = \"Authorization\"\n\
             env = \"T\"\n{extra}"
        );
        SandboxPolicy::parse(&text, "test.toml").unwrap()
    }

    /// Each sandbox gets placeholders of its own; what `keep` holds for a name (a restore in
    /// place: the sandbox's own; a pod's member: its pod's) stays, unless it is not a
    /// placeholder for that name; a fork keeps nothing and gets new ones.
    #[test]
    fn placeholders_are_new_per_sandbox_kept_in_place_and_new_for_a_fork() {
        let p = policy("https = true\nplaceholder_env = \"API_TOKEN\"\n");
        let none = BTreeMap::new();
        let parent = placeholders(&p, &none).unwrap();
        let sibling = placeholders(&p, &none).unwrap();
        assert_ne!(parent["API_TOKEN"], sibling["API_TOKEN"]);
        // A restore in place hands the image's back: the same.
        assert_eq!(placeholders(&p, &parent).unwrap(), parent);
        // A fork hands nothing: a new one, the parent's and the sibling's both refused.
        let fork = placeholders(&p, &none).unwrap();
        assert!(
            fork["API_TOKEN"] != parent["API_TOKEN"] && fork["API_TOKEN"] != sibling["API_TOKEN"]
        );
        // What is not a placeholder of the name is never kept (an edited image).
        for bad in [
            agent_sandbox_policy::network::legacy_placeholder_value("API_TOKEN"),
            placeholder_value("OTHER", &"0".repeat(32)),
            "x".to_owned(),
        ] {
            let keep = BTreeMap::from([("API_TOKEN".to_owned(), bad.clone())]);
            let got = placeholders(&p, &keep).unwrap();
            assert!(got["API_TOKEN"] != bad && placeholder_for("API_TOKEN", &got["API_TOKEN"]));
        }
        // Only the policy's names, whatever `keep` holds.
        let extra = BTreeMap::from([(
            "OTHER".to_owned(),
            placeholder_value("OTHER", &"0".repeat(32)),
        )]);
        assert_eq!(
            placeholders(&p, &extra).unwrap().keys().collect::<Vec<_>>(),
            ["API_TOKEN"]
        );
        assert!(placeholders(&policy(""), &parent).unwrap().is_empty());
    }

    fn sandbox_dir(root: &Path) -> SandboxDir {
        crate::state::StateDirs::new(root.to_owned())
            .sandbox(&crate::state::ContainerId::try_from("abc").unwrap())
    }

    #[test]
    fn the_key_stays_in_the_state_dir_and_the_bundle_holds_the_image_cas_and_ours() {
        let p = policy("https = true\nplaceholder_env = \"API_TOKEN\"\n");
        let dir = tempfile::tempdir().unwrap();
        let (state, mnt, rootfs) = (
            sandbox_dir(&dir.path().join("s")),
            dir.path().join("m"),
            dir.path().join("r"),
        );
        for d in [state.path(), &mnt, &rootfs.join("etc/ssl/certs")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            rootfs.join("etc/ssl/certs/ca-certificates.crt"),
            "IMAGE-CAS",
        )
        .unwrap();
        std::os::unix::fs::symlink("certs/ca-certificates.crt", rootfs.join("etc/ssl/cert.pem"))
            .unwrap();
        let mut spec = Spec::default();
        spec.set_mounts(Some(Vec::new()));
        prepare(&mut spec, &p, "abc", &state, &mnt, &rootfs, None).unwrap();
        let key = std::fs::metadata(state.tls_key()).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
        let bundle = std::fs::read_to_string(mnt.join("tls").join(BUNDLE_NAME)).unwrap();
        assert!(
            bundle.starts_with("IMAGE-CAS\n-----BEGIN CERTIFICATE"),
            "{bundle}"
        );
        for f in [CA_NAME, BUNDLE_NAME] {
            let text = std::fs::read_to_string(mnt.join("tls").join(f)).unwrap();
            assert!(!text.contains("PRIVATE KEY"));
        }
        let dests: Vec<_> = spec
            .mounts()
            .iter()
            .flatten()
            .map(|m| m.destination().display().to_string())
            .collect();
        // The symlinked /etc/ssl/cert.pem is not mounted over (its target is).
        assert_eq!(dests, [TRUST_DIR, "/etc/ssl/certs/ca-certificates.crt"]);
        assert!(
            spec.mounts()
                .iter()
                .flatten()
                .all(|m| m.options().iter().flatten().any(|o| o == "ro"))
        );

        let mut process = Process::default();
        process.set_env(Some(vec!["SSL_CERT_FILE=/mine".into(), "A=1".into()]));
        let mut plan = bare(&p);
        plan.credential_placeholders = placeholders(&p, &BTreeMap::new()).unwrap();
        let own = plan.credential_placeholders["API_TOKEN"].clone();
        assert!(placeholder_for("API_TOKEN", &own), "{own}");
        inject_env(&mut process, &plan);
        let env = process.env().clone().unwrap();
        assert!(env.contains(&"A=1".to_owned()));
        assert!(env.contains(&format!("SSL_CERT_FILE={TRUST_DIR}/{BUNDLE_NAME}")));
        assert!(env.contains(&format!("NODE_EXTRA_CA_CERTS={TRUST_DIR}/{CA_NAME}")));
        assert!(env.contains(&format!("API_TOKEN={own}")));
        assert!(!env.contains(&"SSL_CERT_FILE=/mine".to_owned()));
    }

    #[test]
    fn nothing_without_an_https_credential() {
        let p = policy("");
        let mut spec = Spec::default();
        let before = spec.mounts().clone();
        let dir = tempfile::tempdir().unwrap();
        let state = sandbox_dir(dir.path());
        prepare(&mut spec, &p, "abc", &state, dir.path(), dir.path(), None).unwrap();
        assert_eq!(spec.mounts(), &before);
        assert!(env_vars(&bare(&p)).is_empty());
        assert!(!state.tls_key().exists());
    }
}
