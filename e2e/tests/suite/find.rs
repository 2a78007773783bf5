//! Finding a sandbox: `audit`, `audit verify` and `layers` take a podman name, a podman short
//! id or a ctr container id without `--root`, live and after the container is gone, and a
//! miss names every state root searched (docs/audit.md#finding-a-sandbox).

use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{self, BUSYBOX_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, unique_name};
use anyhow::ensure;

/// The checks every found sandbox passes: its timeline shows its create, its chain verifies,
/// and (while live) `layers` reports it.
fn found(key: &str, id: &str, live: bool) -> anyhow::Result<()> {
    let timeline = harness::runtime_ok(&["audit", key])?;
    ensure!(
        timeline.stdout.contains("create"),
        "audit {key} shows no create record\n{timeline}"
    );
    let verify = harness::runtime_ok(&["audit", "verify", key])?;
    ensure!(
        verify.stdout.contains(&format!("{id}.jsonl")) && verify.stdout.contains("chain intact"),
        "audit verify {key} did not verify {id}'s log\n{verify}"
    );
    if live {
        let layers = harness::runtime_ok(&["layers", key])?;
        ensure!(
            layers.stdout.contains("\"status\"") && layers.stdout.contains("\"running\""),
            "layers {key} did not report the running sandbox\n{layers}"
        );
    }
    Ok(())
}

#[test]
fn podman_name_and_short_id_find_the_sandbox_without_root_live_and_after_rm() -> anyhow::Result<()>
{
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let podman = Podman::new(User::Root, Runtime::AgentSandbox);
    let (guard, id) = podman.run_detached(&[], "fd-podman", &[BUSYBOX_IMAGE, "sleep", "300"])?;
    let name = guard.name.clone();
    let short = &id[..12];
    found(&name, &id, true)?;
    found(short, &id, true)?;
    podman.run_ok(&["rm", "-f", "-t", "0", &name])?;
    drop(guard);
    // Ended: the log and the kept name outlive the container.
    found(&name, &id, false)?;
    found(short, &id, false)?;
    let layers = harness::runtime(&["layers", &name])?;
    ensure!(
        !layers.success(),
        "layers of a removed sandbox succeeded\n{layers}"
    );
    let _ = harness::runtime(&["audit", "prune", &id]);
    Ok(())
}

#[test]
fn ctr_id_finds_the_sandbox_without_root_and_a_miss_names_the_roots_searched() -> anyhow::Result<()>
{
    ctr::require_containerd()?;
    let id = ctr::unique_id("fd-ctr");
    let (container, _pid) = Container::sleeping(Shim::AgentSandbox, &[], &id)?;
    found(&id, &id, true)?;
    drop(container);
    found(&id, &id, false)?;
    let ns_root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    // prune still takes the root (it removes files; finding is for reading).
    let pruned = harness::runtime(&["--root", &ns_root, "audit", "prune", &id])?;
    ensure!(
        pruned.stdout.contains("1 removed"),
        "the ended log was not pruned
{pruned}"
    );

    let missing = unique_name("fd-missing");
    let miss = harness::runtime(&["audit", &missing])?;
    ensure!(
        !miss.success()
            && miss.stderr.contains(&missing)
            && miss.stderr.contains(&ns_root)
            && miss.stderr.contains("/run/agent-sandbox")
            && miss.stderr.contains("docs/audit.md"),
        "a miss does not name the roots searched\n{miss}"
    );
    Ok(())
}

/// `podman run --privileged` is refused with a sentence about privilege (not the first host
/// device it lists); under runc the same run gets every capability, so the refusal is ours.
#[test]
fn podman_privileged_is_refused_as_privileged_and_runc_grants_it() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let args = |name: &str| -> Vec<String> {
        [
            "run",
            "--rm",
            "--name",
            name,
            "--privileged",
            BUSYBOX_IMAGE,
            "grep",
            "CapEff",
            "/proc/self/status",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let name = unique_name("fd-priv");
    let _guard = ContainerGuard::new(Podman::new(User::Root, Runtime::AgentSandbox), &name);
    let a = args(&name);
    let ours = Podman::new(User::Root, Runtime::AgentSandbox)
        .run(&a.iter().map(String::as_str).collect::<Vec<_>>())?;
    ensure!(
        !ours.success()
            && ours.stderr.contains("privileged containers are refused")
            && ours.stderr.contains("docs/threat-model.md")
            && !ours.stdout.contains("CapEff"),
        "--privileged was not refused as privileged\n{ours}"
    );
    let base_name = unique_name("fd-priv-runc");
    let _base_guard = ContainerGuard::new(Podman::new(User::Root, Runtime::Runc), &base_name);
    let b = args(&base_name);
    let runc = Podman::new(User::Root, Runtime::Runc)
        .run(&b.iter().map(String::as_str).collect::<Vec<_>>())?;
    let cap_eff = runc
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    ensure!(
        runc.success() && cap_eff & CAP_SYS_ADMIN != 0,
        "runc did not grant --privileged its capabilities\n{runc}"
    );
    Ok(())
}

/// A missing `--runtime-flag policy=FILE` fails the run naming the file, not as podman's
/// "command not found" (exit 127).
#[test]
fn podman_missing_policy_file_is_named_and_not_command_not_found() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, BUSYBOX_IMAGE)?;
    let podman = Podman::new(User::Root, Runtime::AgentSandbox);
    let name = unique_name("fd-nopolicy");
    let _guard = ContainerGuard::new(Podman::new(User::Root, Runtime::AgentSandbox), &name);
    let missing = format!("/nonexistent/{}.toml", unique_name("fd-policy"));
    let out = podman.run(&[
        "--runtime-flag",
        &format!("policy={missing}"),
        "run",
        "--rm",
        "--name",
        &name,
        BUSYBOX_IMAGE,
        "true",
    ])?;
    ensure!(
        !out.success()
            && out.code != Some(127)
            && out.stderr.contains(&missing)
            && out.stderr.contains("does not exist")
            && out.stderr.contains("docs/policy.md")
            && !out.stderr.contains("command that was not found"),
        "podman did not report the missing policy file\n{out}"
    );
    Ok(())
}
