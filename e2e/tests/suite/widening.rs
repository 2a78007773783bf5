//! Widening requests (docs/policy.md#widening-requests): through podman, ctr and Docker, a
//! default run starts (its defaults are clamped and recorded), a flag that only an explicit
//! request sends is refused with an error naming the config.json key, and a clamped flag runs
//! with a `clamped` record naming the key. Each refused or clamped flag is shown to widen
//! under runc, so the test can fail.

use std::process::Command;

use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::docker::{self, Docker, Runtime as DockerRuntime};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, DEFAULT_TIMEOUT, Output, User};
use agent_sandbox_e2e::net;
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime};
use anyhow::{Context, ensure};
use serde_json::Value;

/// The section every refusal points at.
const DOCS: &str = "docs/policy.md#widening-requests";
/// CapEff bits (linux/capability.h).
const CAP_NET_ADMIN: u64 = 1 << 12;
const CAP_NET_RAW: u64 = 1 << 13;
/// The built-in `agent` profile's memory limit (the ceiling without a policy flag).
const AGENT_MEMORY: &str = "2147483648";
const EIGHT_GIB: &str = "8589934592";

/// Prints the capabilities, the seccomp mode, the namespaces that host flags share, and the
/// memory limit: one `key value` per line.
const REPORT: &str = "grep -E '^(CapEff|Seccomp):' /proc/self/status; \
    for n in net pid ipc uts; do echo \"ns_$n $(readlink /proc/self/ns/$n)\"; done; \
    echo \"memory $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)\"";

/// The value of `key` in a [`REPORT`].
fn field<'a>(out: &'a Output, key: &str) -> Option<&'a str> {
    out.stdout.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|v| v.strip_prefix([':', ' ']))
            .map(str::trim)
    })
}

fn cap_eff(out: &Output) -> u64 {
    field(out, "CapEff")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .unwrap_or(0)
}

/// The host's namespace of `kind` (this test's: it runs on the host).
fn host_ns(kind: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// A refusal: the run failed before the workload ran, naming `key` and the docs, in words
/// podman does not turn into "command not found" or "permission denied".
fn refused(out: &Output, key: &str, what: &str) -> anyhow::Result<()> {
    ensure!(
        !out.success() && !out.stdout.contains("CapEff"),
        "{what}: not refused\n{out}"
    );
    ensure!(
        out.stderr.contains(key) && out.stderr.contains(DOCS),
        "{what}: the error does not name {key} and {DOCS}\n{out}"
    );
    let lower = out.stderr.to_lowercase();
    ensure!(
        !lower.contains("command that was not found")
            && !lower.contains("permission denied")
            && !lower.contains("not permitted"),
        "{what}: the refusal reads as another error\n{out}"
    );
    Ok(())
}

/// The audit records of a sandbox, found by name or id as a user would (no `--root`).
fn records(key: &str) -> anyhow::Result<Vec<Value>> {
    let out = harness::run(
        Command::new(harness::runtime_bin()).args(["audit", "--json", key]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(
        out.success(),
        "agent-sandbox audit --json {key} failed\n{out}"
    );
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad audit line {l:?}")))
        .collect()
}

/// The `clamped` record for `key`: (requested, granted).
fn clamp_of(records: &[Value], key: &str) -> Option<(String, String)> {
    records
        .iter()
        .find(|r| r["kind"] == "clamped" && r["data"]["key"] == key)
        .map(|r| {
            (
                r["data"]["requested"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                r["data"]["granted"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

fn expect_clamp(
    records: &[Value],
    key: &str,
    requested: &dyn Fn(&str) -> bool,
    granted: &str,
    what: &str,
) -> anyhow::Result<()> {
    let got = clamp_of(records, key);
    ensure!(
        got.as_ref()
            .is_some_and(|(r, g)| requested(r) && g == granted),
        "{what}: expected a clamped record for {key} granting {granted:?}, got {got:?} in {records:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------- podman

/// A container-name word for `user`.
fn tag(user: User) -> &'static str {
    match user {
        User::Root => "root",
        User::Rootless => "rootless",
    }
}

/// `podman run --name NAME FLAGS... busybox sh -c REPORT` as `user` under `runtime` (any
/// exit code), with the guard that removes the container.
fn podman_run(
    user: User,
    runtime: Runtime,
    name: &str,
    flags: &[&str],
) -> anyhow::Result<(ContainerGuard, Output)> {
    let podman = Podman::new(user, runtime);
    let guard = ContainerGuard::new(podman, name);
    let mut args = vec!["run", "--name", name];
    args.extend_from_slice(flags);
    args.extend([BUSYBOX_IMAGE, "sh", "-c", REPORT]);
    Ok((guard, podman.run(&args)?))
}

/// A plain `podman run` starts under the sandbox (rootful and rootless); rootful, its
/// defaults (podman's 11 capabilities, its bridge netns path, its pids limit of 2048, the
/// host's cgroup namespace) are each recorded as clamped.
#[test]
fn podman_default_run_starts_and_records_its_clamped_defaults() -> anyhow::Result<()> {
    for user in [User::Root, User::Rootless] {
        harness::require_podman_image(user, BUSYBOX_IMAGE)?;
        let name = format!("hwid-default-{}-{}", tag(user), std::process::id());
        let (_guard, out) = podman_run(user, Runtime::AgentSandbox, &name, &[])?;
        ensure!(out.success(), "{user}: a default podman run failed\n{out}");
        ensure!(
            cap_eff(&out) == 0,
            "{user}: capabilities were granted\n{out}"
        );
        if user == User::Root {
            let recs = records(&name)?;
            for set in ["bounding", "effective", "permitted"] {
                expect_clamp(
                    &recs,
                    &format!("process.capabilities.{set}"),
                    &|r| r.contains("CAP_CHOWN") && r.split(',').count() == 11,
                    "none",
                    "podman's default capabilities",
                )?;
            }
            expect_clamp(
                &recs,
                "linux.resources.pids.limit",
                &|r| r == "2048",
                "1024",
                "podman's default pids limit",
            )?;
            ensure!(
                !recs
                    .iter()
                    .any(|r| r["kind"] == "clamped" && r["data"]["key"] == "linux.seccomp"),
                "podman sends its seccomp profile, yet linux.seccomp was clamped: {recs:?}"
            );
        }
    }
    Ok(())
}

/// `--cap-add NET_ADMIN`, `--network host`, `--pid host`, `--ipc host`, `--uts host`: refused
/// under the sandbox naming the key (rootful and rootless; rootless podman fails `--ipc host`
/// itself); under runc each gives what it asks (the capability, the host's namespace).
#[test]
fn podman_widening_flags_are_refused_naming_the_key_and_runc_grants_them() -> anyhow::Result<()> {
    let cases: &[(&[&str], &str)] = &[
        (&["--cap-add", "NET_ADMIN"], "process.capabilities.bounding"),
        (&["--network", "host"], "linux.namespaces[network]"),
        (&["--pid", "host"], "linux.namespaces[pid]"),
        (&["--ipc", "host"], "linux.namespaces[ipc]"),
        (&["--uts", "host"], "linux.namespaces[uts]"),
    ];
    for user in [User::Root, User::Rootless] {
        harness::require_podman_image(user, BUSYBOX_IMAGE)?;
        for (i, (flags, key)) in cases.iter().enumerate() {
            // Rootless podman itself fails `--ipc host` (statfs /dev/mqueue) before any runtime.
            if user == User::Rootless && *key == "linux.namespaces[ipc]" {
                continue;
            }
            let what = format!("{user} podman {flags:?}");
            let name = format!("hwid-wide-{}-{i}-{}", tag(user), std::process::id());
            let (_guard, ours) = podman_run(user, Runtime::AgentSandbox, &name, flags)?;
            refused(&ours, key, &what)?;
            // podman's own exit code for an OCI runtime error, not 127 ("not found").
            ensure!(
                ours.code == Some(126),
                "{what}: exit {:?}\n{ours}",
                ours.code
            );
        }
    }
    // The baseline: rootful runc grants each.
    let user = User::Root;
    for (i, (flags, key)) in cases.iter().enumerate() {
        let name = format!("hwid-wide-runc-{i}-{}", std::process::id());
        let (_guard, base) = podman_run(user, Runtime::Runc, &name, flags)?;
        ensure!(base.success(), "runc {flags:?} failed\n{base}");
        let widened = match *key {
            "process.capabilities.bounding" => cap_eff(&base) & CAP_NET_ADMIN != 0,
            k => {
                let kind = match k
                    .trim_start_matches("linux.namespaces[")
                    .trim_end_matches(']')
                {
                    "network" => "net",
                    other => other,
                };
                field(&base, &format!("ns_{kind}")) == Some(host_ns(kind).as_str())
            }
        };
        ensure!(
            widened,
            "runc did not grant {flags:?} (host: {:?})\n{base}",
            ["net", "pid", "ipc", "uts"].map(host_ns)
        );
    }
    Ok(())
}

/// `seccomp=unconfined`, `--memory 8g` and `--cap-add NET_RAW` (a capability Docker and
/// containerd send by default) run under the sandbox with the narrower value and a `clamped`
/// record naming the key; runc grants each.
#[test]
fn podman_clamped_flags_run_narrowed_with_a_record_and_runc_grants_them() -> anyhow::Result<()> {
    let user = User::Root;
    harness::require_podman_image(user, BUSYBOX_IMAGE)?;
    let flags: &[&str] = &[
        "--security-opt",
        "seccomp=unconfined",
        "--memory",
        "8g",
        "--cap-add",
        "NET_RAW",
    ];
    let name = format!("hwid-clamp-{}", std::process::id());
    let (_guard, ours) = podman_run(user, Runtime::AgentSandbox, &name, flags)?;
    ensure!(ours.success(), "the clamped run failed\n{ours}");
    ensure!(
        field(&ours, "Seccomp") == Some("2"),
        "no seccomp filter\n{ours}"
    );
    ensure!(
        field(&ours, "memory") == Some(AGENT_MEMORY),
        "memory not clamped\n{ours}"
    );
    ensure!(cap_eff(&ours) == 0, "capabilities granted\n{ours}");
    let recs = records(&name)?;
    expect_clamp(
        &recs,
        "linux.seccomp",
        &|r| r.contains("unconfined"),
        "the policy's filter",
        "seccomp=unconfined",
    )?;
    expect_clamp(
        &recs,
        "linux.resources.memory.limit",
        &|r| r == EIGHT_GIB,
        AGENT_MEMORY,
        "--memory 8g",
    )?;
    expect_clamp(
        &recs,
        "process.capabilities.bounding",
        &|r| r.contains("CAP_NET_RAW"),
        "none",
        "--cap-add NET_RAW",
    )?;

    let base_name = format!("hwid-clamp-runc-{}", std::process::id());
    let (_base_guard, base) = podman_run(user, Runtime::Runc, &base_name, flags)?;
    ensure!(
        base.success()
            && field(&base, "Seccomp") == Some("0")
            && field(&base, "memory") == Some(EIGHT_GIB)
            && cap_eff(&base) & CAP_NET_RAW != 0,
        "runc did not grant the flags\n{base}"
    );
    Ok(())
}

/// podman 5 asks nofile and nproc 1048576 (soft and hard) on every run (issue 32); podman 4
/// asks the same with `--ulimit`. Above the hard limit the runtime starts with, a rootful run
/// starts with what the runtime could raise as root and a `clamped` record naming the key
/// (docs/contracts.md#resource-limits-processrlimits); runc raises the limit as root, and
/// fails where root may not (no CAP_SYS_RESOURCE, as on this project's machines).
#[test]
fn podman_ulimit_above_the_hard_limit_starts_with_what_root_can_raise() -> anyhow::Result<()> {
    const ASKED: u64 = 1_048_576;
    const CAP_SYS_RESOURCE: u64 = 1 << 24;
    let user = User::Root;
    harness::require_podman_image(user, BUSYBOX_IMAGE)?;
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    ensure!(
        hard < ASKED,
        "this test needs a hard RLIMIT_NOFILE ({hard}) below {ASKED} to ask for more"
    );
    let status = std::fs::read_to_string("/proc/self/status")?;
    let can_raise = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & CAP_SYS_RESOURCE != 0);
    let want = if can_raise { ASKED } else { hard };
    let ulimit = format!("nofile={ASKED}:{ASKED}");
    let script = "grep '^Max open files' /proc/self/limits";
    let nofile = |out: &Output| -> Option<(u64, u64)> {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("Max open files"))?;
        let mut words = line["Max open files".len()..].split_whitespace();
        Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
    };
    for runtime in [Runtime::Runc, Runtime::AgentSandbox] {
        let name = format!("hwid-ulimit-{runtime:?}-{}", std::process::id()).to_lowercase();
        let podman = Podman::new(user, runtime);
        let _guard = ContainerGuard::new(podman, &name);
        let out = podman.run(&[
            "run",
            "--name",
            &name,
            "--ulimit",
            &ulimit,
            BUSYBOX_IMAGE,
            "sh",
            "-c",
            script,
        ])?;
        if runtime == Runtime::Runc && !can_raise {
            ensure!(
                !out.success() && out.stderr.contains("rlimit"),
                "runc: expected a failed create (root may not raise the hard limit here)\n{out}"
            );
            continue;
        }
        ensure!(
            out.success(),
            "{runtime:?}: --ulimit {ulimit} failed\n{out}"
        );
        ensure!(
            nofile(&out) == Some((want, want)),
            "{runtime:?}: nofile inside is {:?}, want {want}:{want}\n{out}",
            nofile(&out)
        );
        if runtime == Runtime::AgentSandbox {
            let recs = records(&name)?;
            let got = clamp_of(&recs, "process.rlimits.RLIMIT_NOFILE");
            let expected =
                (!can_raise).then(|| (format!("{ASKED}:{ASKED}"), format!("{hard}:{hard}")));
            ensure!(
                got == expected,
                "clamped record for process.rlimits.RLIMIT_NOFILE: got {got:?}, want {expected:?}"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- ctr

fn ctr_run(shim: Shim, flags: &[&str], id: &str) -> anyhow::Result<Output> {
    ctr::run_rm(shim, flags, BUSYBOX_IMAGE, id, &["sh", "-c", REPORT])
}

/// ctr: a default run starts (its capabilities and missing seccomp profile recorded as
/// clamped); `--cap-add CAP_NET_ADMIN` and `--net-host` are refused naming the key, runc
/// grants them; `--memory-limit` above the policy runs clamped with a record (ctr mounts no
/// cgroup filesystem to read the limit from inside, under runc either: the podman test shows
/// the granted limit against runc's).
#[test]
fn ctr_default_runs_widening_flags_are_refused_and_memory_is_clamped() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let id = ctr::unique_id("hwid-default");
    let out = ctr_run(Shim::AgentSandbox, &[], &id)?;
    ensure!(out.success(), "a default ctr run failed\n{out}");
    let recs = records(&id)?;
    expect_clamp(
        &recs,
        "process.capabilities.bounding",
        &|r| r.contains("CAP_NET_RAW") && r.split(',').count() == 14,
        "none",
        "ctr's default capabilities",
    )?;
    expect_clamp(
        &recs,
        "linux.seccomp",
        &|r| r.contains("unconfined"),
        "the policy's filter",
        "ctr without --seccomp",
    )?;

    let cases: &[(&[&str], &str)] = &[
        (
            &["--cap-add", "CAP_NET_ADMIN"],
            "process.capabilities.bounding",
        ),
        (&["--net-host"], "linux.namespaces[network]"),
    ];
    for (flags, key) in cases {
        let ours = ctr_run(Shim::AgentSandbox, flags, &ctr::unique_id("hwid-wide"))?;
        refused(&ours, key, &format!("ctr {flags:?}"))?;
        let base = ctr_run(Shim::RuncV2, flags, &ctr::unique_id("hwid-wide-runc"))?;
        let widened = match *key {
            "process.capabilities.bounding" => cap_eff(&base) & CAP_NET_ADMIN != 0,
            _ => field(&base, "ns_net") == Some(host_ns("net").as_str()),
        };
        ensure!(
            base.success() && widened,
            "runc did not grant {flags:?}\n{base}"
        );
    }

    let flags = ["--memory-limit", EIGHT_GIB];
    let id = ctr::unique_id("hwid-mem");
    // (ctr's sandbox has no /sys/fs/cgroup/memory to read: the record says what it got; the
    // podman test reads the granted limit inside.)
    let ours = ctr_run(Shim::AgentSandbox, &flags, &id)?;
    ensure!(ours.success(), "ctr --memory-limit failed\n{ours}");
    expect_clamp(
        &records(&id)?,
        "linux.resources.memory.limit",
        &|r| r == EIGHT_GIB,
        AGENT_MEMORY,
        "ctr --memory-limit",
    )?;
    Ok(())
}

// ---------------------------------------------------------------- Docker

fn docker_run(runtime: DockerRuntime, name: &str, flags: &[&str]) -> anyhow::Result<Output> {
    docker::require_ready(BUSYBOX_IMAGE)?;
    let mut args = vec!["--name", name];
    args.extend_from_slice(flags);
    args.extend([BUSYBOX_IMAGE, "sh", "-c", REPORT]);
    Docker::new(runtime).run(&args)
}

/// Docker: a default run starts (Docker's 14 capabilities and its ping_group_range recorded as
/// clamped); `--cap-add NET_ADMIN` and `--network host` are refused naming the key, runc
/// grants them; `--memory 8g` runs clamped with a record.
#[test]
fn docker_default_runs_widening_flags_are_refused_and_memory_is_clamped() -> anyhow::Result<()> {
    let name = docker::unique_name("hwid-default");
    let _guard = docker::ContainerGuard { name: name.clone() };
    let out = docker_run(DockerRuntime::AgentSandbox, &name, &["--memory", "8g"])?;
    ensure!(
        out.success() && field(&out, "memory") == Some(AGENT_MEMORY),
        "a docker run with --memory 8g failed or was not clamped\n{out}"
    );
    // dockerd's non-default --exec-root is not among the roots `audit` searches by itself.
    let log = docker::sandbox_root()
        .join("audit")
        .join(format!("{}.jsonl", docker::full_id(&name)?));
    let recs = net::read_audit(&log)?;
    expect_clamp(
        &recs,
        "process.capabilities.bounding",
        &|r| r.contains("CAP_NET_RAW") && r.split(',').count() == 14,
        "none",
        "Docker's default capabilities",
    )?;
    expect_clamp(
        &recs,
        "linux.resources.memory.limit",
        &|r| r == EIGHT_GIB,
        AGENT_MEMORY,
        "docker --memory 8g",
    )?;

    let cases: &[(&[&str], &str)] = &[
        (&["--cap-add", "NET_ADMIN"], "process.capabilities.bounding"),
        (&["--network", "host"], "linux.namespaces[network]"),
    ];
    for (i, (flags, key)) in cases.iter().enumerate() {
        let name = docker::unique_name(&format!("hwid-wide-{i}"));
        let _guard = docker::ContainerGuard { name: name.clone() };
        let ours = docker_run(DockerRuntime::AgentSandbox, &name, flags)?;
        refused(&ours, key, &format!("docker {flags:?}"))?;
        let base_name = docker::unique_name(&format!("hwid-wide-runc-{i}"));
        let _base_guard = docker::ContainerGuard {
            name: base_name.clone(),
        };
        let base = docker_run(DockerRuntime::Runc, &base_name, flags)?;
        let widened = match *key {
            "process.capabilities.bounding" => cap_eff(&base) & CAP_NET_ADMIN != 0,
            _ => field(&base, "ns_net") == Some(host_ns("net").as_str()),
        };
        ensure!(
            base.success() && widened,
            "runc did not grant {flags:?}\n{base}"
        );
    }
    Ok(())
}
