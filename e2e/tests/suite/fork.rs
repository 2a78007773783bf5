//! Fork suite (docs/checkpoint.md#fork): one checkpoint image restored into several new
//! sandboxes at once through rootful podman (`container restore --import IMAGE --name NEW`,
//! repeated), while the sandbox it was taken of runs again.
//!
//! What it shows: each fork is a sandbox of its own, in a host id block of its own (the
//! forks' and the parent's `uid_map` ranges do not overlap), with its own copy of the
//! parent's unpromoted edit, re-owned into its block (its root owns it, and may write it),
//! and its own workspace writes, which no other fork nor the parent sees; each fork's audit
//! log verifies and its first record names the parent, the image's digest and the parent's
//! chain head at the checkpoint. The control: runc's forks of one image share one host id
//! range (each maps the host's ids as they are), so what one fork's root owns, every other
//! fork's root owns too.

use std::path::Path;

use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag, unique_name};
use anyhow::{Context, ensure};

use super::checkpoint::{COUNTER, count_reaches, fixture, names_its_parent};

/// The host ids a running container's root maps: `(start, count)` of the first extent of
/// its init's `uid_map`.
fn host_range(p: Podman, name: &str) -> anyhow::Result<(u64, u64)> {
    let pid = p.run_ok(&["inspect", "--format", "{{.State.Pid}}", name])?;
    let map = std::fs::read_to_string(format!("/proc/{}/uid_map", pid.stdout.trim()))?;
    let f: Vec<u64> = map
        .split_whitespace()
        .take(3)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("uid_map of {name}: {map}"))?;
    ensure!(f.len() == 3 && f[0] == 0, "uid_map of {name}: {map}");
    Ok((f[1], f[2]))
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// `podman container restore --import archive --name NAME` under `flags`, NAME new.
pub(super) fn import(p: Podman, flags: &[&str], archive: &Path) -> anyhow::Result<ContainerGuard> {
    let fork = ContainerGuard::new(p, &unique_name("fork"));
    restore_import(&|a| p.run_ok(a), flags, archive, &fork.name)?;
    Ok(fork)
}

/// `container restore --import ARCHIVE --name NAME` under `flags`, run by `podman` (the
/// suite's podman, or one on a storage of its own).
pub(super) fn restore_import(
    podman: &dyn Fn(&[&str]) -> anyhow::Result<harness::Output>,
    flags: &[&str],
    archive: &Path,
    name: &str,
) -> anyhow::Result<harness::Output> {
    let archive = archive.display().to_string();
    let mut args = flags.to_vec();
    args.extend(["container", "restore", "--import", &archive, "--name", name]);
    podman(&args)
}

/// The workspace's entries as the sandbox `name` lists them.
fn workspace(p: Podman, name: &str) -> anyhow::Result<Vec<String>> {
    let out = p.run_ok(&["exec", name, "ls", "/workspace"])?;
    Ok(out.stdout.split_whitespace().map(str::to_owned).collect())
}

#[test]
fn three_forks_of_one_image_get_their_own_id_blocks_files_and_lineage() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, policy) = fixture("optional")?;
    std::fs::write(ws.join("notes.txt"), "host\n")?;
    let flag = policy_flag(&policy);
    let flags = ["--runtime-flag", flag.as_str()];
    let volume = format!("{}:/workspace", ws.display());
    let (parent, parent_id) = p.run_detached(
        &flags,
        "fork-parent",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", COUNTER],
    )?;
    let edit = "echo edited > /workspace/notes.txt";
    p.run_ok(&["exec", &parent.name, "sh", "-c", edit])?;
    count_reaches(p, &parent.name, 5)?;
    let archive = dir.path().join("golden.tar");
    let archive_arg = archive.display().to_string();
    let mut args = flags.to_vec();
    args.extend([
        "container",
        "checkpoint",
        "--export",
        &archive_arg,
        &parent.name,
    ]);
    p.run_ok(&args)?;
    let forks = (0..3)
        .map(|_| import(p, &flags, &archive))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The parent again, in its own block (held for it since the checkpoint), beside them.
    let mut args = flags.to_vec();
    args.extend(["container", "restore", &parent.name]);
    p.run_ok(&args)?;
    for (i, fork) in forks.iter().enumerate() {
        let write = format!("echo {i} > /workspace/fork-{i}.txt");
        p.run_ok(&["exec", &fork.name, "sh", "-c", &write])?;
    }
    p.run_ok(&[
        "exec",
        &parent.name,
        "sh",
        "-c",
        "echo p > /workspace/late.txt",
    ])?;
    let mut ranges = vec![host_range(p, &parent.name)?];
    for (i, fork) in forks.iter().enumerate() {
        let own = format!("fork-{i}.txt");
        let seen = workspace(p, &fork.name)?;
        ensure!(
            seen == [own.clone(), "notes.txt".to_owned()],
            "fork {i} sees {seen:?}, not only its own file and the parent's edit"
        );
        let notes = p.run_ok(&["exec", &fork.name, "cat", "/workspace/notes.txt"])?;
        ensure!(
            notes.stdout == "edited\n",
            "fork {i} lost the edit\n{notes}"
        );
        // Its copy of the edit is its own root's (re-owned into its block), so it may
        // write it; the parent's ids would show as nobody (65534) here.
        let owner = p.run_ok(&[
            "exec",
            &fork.name,
            "stat",
            "-c",
            "%u:%g",
            "/workspace/notes.txt",
        ])?;
        ensure!(
            owner.stdout.trim() == "0:0",
            "fork {i}'s copy is not its own\n{owner}"
        );
        p.run_ok(&[
            "exec",
            &fork.name,
            "sh",
            "-c",
            "echo more >> /workspace/notes.txt",
        ])?;
        let id = p.run_ok(&["inspect", "--format", "{{.Id}}", &fork.name])?;
        names_its_parent(id.stdout.trim(), &parent_id)?;
        let diff = harness::runtime_ok(&["diff", id.stdout.trim()])?;
        ensure!(
            diff.stdout.contains(&own) && !diff.stdout.contains("late.txt"),
            "fork {i}'s diff is not its own\n{diff}"
        );
        ranges.push(host_range(p, &fork.name)?);
    }
    let seen = workspace(p, &parent.name)?;
    ensure!(
        !seen.iter().any(|f| f.starts_with("fork-")),
        "the parent sees a fork's file: {seen:?}"
    );
    for (a, ra) in ranges.iter().enumerate() {
        for (b, rb) in ranges.iter().enumerate().skip(a + 1) {
            ensure!(
                !overlap(*ra, *rb),
                "sandboxes {a} and {b} share host ids: {ranges:?} (0 is the parent)"
            );
        }
    }
    ensure!(
        std::fs::read_to_string(ws.join("notes.txt"))? == "host\n",
        "an edit reached the host checkout unpromoted"
    );
    Ok(())
}

#[test]
fn runcs_forks_of_one_image_share_one_host_id_range() -> anyhow::Result<()> {
    // The control: podman + runc + CRIU restore the same image twice, and the forks map
    // the same host ids, so one fork's root is the other's.
    let p = Podman::new(User::Root, Runtime::Runc);
    let dir = tempfile::tempdir()?;
    let (parent, _) = p.run_detached(&[], "fork-runc", &[TOOLS_IMAGE, "sh", "-c", COUNTER])?;
    count_reaches(p, &parent.name, 3)?;
    let archive = dir.path().join("golden.tar");
    let archive_arg = archive.display().to_string();
    p.run_ok(&[
        "container",
        "checkpoint",
        "--export",
        &archive_arg,
        &parent.name,
    ])?;
    let a = import(p, &[], &archive)?;
    let b = import(p, &[], &archive)?;
    let (ra, rb) = (host_range(p, &a.name)?, host_range(p, &b.name)?);
    ensure!(
        ra == rb && overlap(ra, rb),
        "runc's forks did not share their host ids: {ra:?} {rb:?}"
    );
    for fork in [&a, &b] {
        p.run_ok(&["exec", &fork.name, "sh", "-c", "echo x > /tmp/mine"])?;
    }
    let pid = |name: &str| -> anyhow::Result<String> {
        Ok(p.run_ok(&["inspect", "--format", "{{.State.Pid}}", name])?
            .stdout
            .trim()
            .to_owned())
    };
    let owner = |name: &str| -> anyhow::Result<u32> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(format!("/proc/{}/root/tmp/mine", pid(name)?))?.uid())
    };
    ensure!(
        owner(&a.name)? == owner(&b.name)?,
        "runc's forks' files have different host owners"
    );
    Ok(())
}
