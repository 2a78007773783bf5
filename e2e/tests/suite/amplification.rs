//! Amplification suite: a change set that is small in the sandbox but huge as a plain copy
//! (an 8 GiB sparse file and a 50 MiB file with 60 hard links: 50 MiB of a 256 MiB
//! `workspace_size`, 11 GiB when every hole and every name is written out). A naive copy
//! (`cp -a --sparse=never`) fills a size-capped tmpfs; `diff`, `export` and `promote` read
//! only the data, once, keep holes and links, and refuse before reading anything a change set
//! past their limit. What a command read is the `rchar` of a shell that waited for it (the
//! kernel adds a reaped child's I/O counters to its parent's).
//!
//! Nothing here writes more than a few hundred MiB for real: the 8 GiB file is a hole.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, Output, TOOLS_IMAGE, User};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime};
use anyhow::{Context, ensure};

const MIB: u64 = 1 << 20;
/// Rootful podman's runtime state root (the runtime's default as root).
const PODMAN_ROOT: &str = "/run/agent-sandbox";

/// The agent's amplification: `big.img` an 8 GiB hole, `lib.so` 50 MiB of random data with
/// 60 more names.
const AMPLIFY: &str = "python3 -c '
import os
with open(\"big.img\", \"wb\") as f:
    f.truncate(8 << 30)
with open(\"lib.so\", \"wb\") as f:
    for _ in range(50):
        f.write(os.urandom(1 << 20))
for i in range(60):
    os.link(\"lib.so\", \"lib%d.so\" % i)
'";

/// A legitimate sparse file (64 MiB apparent, three data blocks) and a file with three names.
const LEGIT: &str = "python3 -c '
import os
os.makedirs(\"data\", exist_ok=True)
os.makedirs(\"vendor/a\", exist_ok=True)
with open(\"data/disk.img\", \"wb\") as f:
    f.truncate(64 << 20)
    f.seek(0); f.write(b\"MBR!\" * 128)
    f.seek(20 << 20); f.write(os.urandom(5000))
    f.seek((64 << 20) - 4); f.write(b\"tail\")
with open(\"vendor/lib.py\", \"w\") as f:
    f.write(\"x = 1\\n\" * 10000)
os.link(\"vendor/lib.py\", \"vendor/a/lib.py\")
os.link(\"vendor/lib.py\", \"vendor/lib2.py\")
'";

fn sh(script: &str) -> anyhow::Result<Output> {
    harness::run_ok(Command::new("sh").args(["-ec", script]), DEFAULT_TIMEOUT)
}

/// The agent profile with `workspace_size` set to `size`, written to `dir/file`.
fn policy(dir: &Path, file: &str, size: &str) -> anyhow::Result<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/agent.toml");
    let text =
        fs::read_to_string(&source).with_context(|| format!("cannot read {}", source.display()))?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("workspace_size"))
        .collect();
    let out = kept.join("\n").replacen(
        "workspace = \"/workspace\"",
        &format!("workspace = \"/workspace\"\nworkspace_size = \"{size}\""),
        1,
    );
    ensure!(
        out.contains("workspace_size"),
        "no workspace key in the profile"
    );
    let path = dir.join(file);
    fs::write(&path, out)?;
    Ok(path)
}

/// A sleeping sandbox over a world-writable workspace.
struct Agent {
    id: String,
    root: PathBuf,
    flags: Vec<String>,
    podman: Option<ContainerGuard>,
    ctr: Option<Container>,
}

impl Agent {
    /// Through podman, with the policy `policy` (its `workspace_size` becomes the quota).
    fn podman(workspace: &Path, policy: &Path) -> anyhow::Result<Agent> {
        harness::require_file(harness::runtime_bin())?;
        harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
        let flags = vec![
            "--runtime-flag".to_owned(),
            format!("policy={}", policy.display()),
        ];
        let f: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (guard, id) = Podman::new(User::Root, Runtime::AgentSandbox).run_detached(
            &f,
            "amplify",
            &[
                "-v",
                &format!("{}:/workspace", workspace.display()),
                TOOLS_IMAGE,
                "sleep",
                "600",
            ],
        )?;
        Ok(Agent {
            id,
            root: PathBuf::from(PODMAN_ROOT),
            flags,
            podman: Some(guard),
            ctr: None,
        })
    }

    /// Through containerd, under the default policy.
    fn ctr(workspace: &Path) -> anyhow::Result<Agent> {
        harness::require_file(harness::runtime_bin())?;
        ctr::require_containerd()?;
        let id = format!("amp-{}", ctr::unique_id("legit"));
        let c = Container::start_detached(
            Shim::AgentSandbox,
            &[
                "--mount",
                &format!(
                    "type=bind,src={},dst=/workspace,options=rbind:rw",
                    workspace.display()
                ),
            ],
            TOOLS_IMAGE,
            &id,
            &["sleep", "600"],
        )?;
        c.wait_status("RUNNING", std::time::Duration::from_secs(30))?;
        Ok(Agent {
            id,
            root: PathBuf::from(format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE)),
            flags: Vec::new(),
            podman: None,
            ctr: Some(c),
        })
    }

    /// Runs the agent's `script` in /workspace; it must succeed.
    fn exec(&self, script: &str) -> anyhow::Result<Output> {
        static N: AtomicU32 = AtomicU32::new(0);
        let script = format!("set -e; cd /workspace; {script}");
        let out = match (&self.podman, &self.ctr) {
            (Some(g), _) => {
                let mut args: Vec<&str> = self.flags.iter().map(String::as_str).collect();
                args.extend(["exec", &g.name, "sh", "-c", &script]);
                g.podman.run(&args)?
            }
            (None, Some(c)) => {
                let exec_id = format!("agent{}", N.fetch_add(1, Ordering::Relaxed));
                c.task_cmd(&["exec", "--exec-id", &exec_id], &["sh", "-c", &script])?
            }
            (None, None) => anyhow::bail!("no sandbox"),
        };
        ensure!(out.success(), "the agent's script failed\n{out}");
        Ok(out)
    }

    /// `agent-sandbox --root ROOT [--policy P] ARGS... ID` in a shell that then prints its
    /// own I/O counters, which hold the reaped command's: the output and the bytes it read.
    fn runtime(&self, policy: Option<&Path>, args: &[&str]) -> anyhow::Result<(Output, u64)> {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "\"$@\"; rc=$?; grep '^rchar:' /proc/$$/io >&2; exit $rc",
            "sh",
        ])
        .arg(harness::runtime_bin())
        .arg("--root")
        .arg(&self.root);
        if let Some(p) = policy {
            cmd.arg("--policy").arg(p);
        }
        let out = harness::run(cmd.args(args).arg(&self.id), DEFAULT_TIMEOUT)?;
        let rchar = rchar(&out)?;
        Ok((out, rchar))
    }

    /// The overlay's upper dir: what a naive promotion copies.
    fn upper(&self) -> anyhow::Result<PathBuf> {
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
}

/// The `rchar:` line a wrapped command's shell printed last on stderr.
fn rchar(out: &Output) -> anyhow::Result<u64> {
    out.stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("rchar:"))
        .with_context(|| format!("no rchar line\n{out}"))?
        .trim()
        .parse()
        .context("rchar is not a number")
}

/// A world-writable workspace (the sandbox's unprivileged root writes in it) with a file.
fn workspace(dir: &Path) -> anyhow::Result<PathBuf> {
    let ws = dir.join("ws");
    fs::create_dir(&ws)?;
    fs::write(ws.join("README.md"), "# project\n")?;
    sh(&format!(
        "chmod 0755 {0}; chmod 0777 {1}",
        dir.display(),
        ws.display()
    ))?;
    Ok(ws)
}

/// One entry of a [`listing`]: path, mode, size, blocks, inode.
type Listed = (PathBuf, u32, u64, u64, u64);

/// Every entry below `root` with its type, size, blocks and inode.
fn listing(root: &Path) -> anyhow::Result<Vec<Listed>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let p = e?.path();
            let m = fs::symlink_metadata(&p)?;
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push((
                p.strip_prefix(root)?.to_path_buf(),
                m.mode(),
                m.len(),
                m.blocks(),
                m.ino(),
            ));
        }
    }
    out.sort();
    Ok(out)
}

/// `dir` holds big.img as an 8 GiB hole and lib.so with 60 more names, same bytes as `upper`.
fn holes_and_links_kept(dir: &Path, upper: &Path) -> anyhow::Result<()> {
    let big = fs::metadata(dir.join("big.img"))?;
    ensure!(
        big.len() == 8 << 30 && big.blocks() * 512 < MIB,
        "big.img: {} bytes, {} blocks",
        big.len(),
        big.blocks()
    );
    let lib = fs::metadata(dir.join("lib.so"))?;
    ensure!(lib.nlink() == 61, "lib.so has {} links", lib.nlink());
    for i in 0..60 {
        let m = fs::metadata(dir.join(format!("lib{i}.so")))?;
        ensure!(m.ino() == lib.ino(), "lib{i}.so is a copy, not a link");
    }
    ensure!(
        fs::read(dir.join("lib.so"))? == fs::read(upper.join("lib.so"))?,
        "lib.so differs"
    );
    Ok(())
}

#[test]
fn podman_amplified_change_set_fills_a_naive_copy_but_promote_reads_only_its_data_and_refuses_past_the_limit()
-> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("amplify-").tempdir()?;
    let ws = workspace(dir.path())?;
    let quota = policy(dir.path(), "quota.toml", "256M")?;
    let tight = policy(dir.path(), "tight.toml", "32M")?;
    let agent = Agent::podman(&ws, &quota)?;
    agent.exec(AMPLIFY)?;
    let upper = agent.upper()?;

    // In the sandbox it takes 50 MiB of the 256 MiB quota.
    let du = sh(&format!("du -sk {}", upper.display()))?;
    let kib: u64 = du
        .stdout
        .split_whitespace()
        .next()
        .context("no du output")?
        .parse()?;
    ensure!(kib < 60 * 1024, "the upper dir takes {kib} KiB");

    // A naive copy that writes holes out fills a 320 MiB tmpfs (not this machine's disk).
    let naive = dir.path().join("naive");
    fs::create_dir(&naive)?;
    sh(&format!(
        "mount -t tmpfs -o size=320m naive-amplify {}",
        naive.display()
    ))?;
    let copy = harness::run(
        Command::new("sh")
            .args([
                "-c",
                "cp -a --sparse=never \"$1\"/. \"$2\"/; rc=$?; grep '^wchar:' /proc/$$/io >&2; exit $rc",
                "sh",
            ])
            .arg(&upper)
            .arg(&naive),
        DEFAULT_TIMEOUT,
    )?;
    let df = sh(&format!("df -k --output=avail {}", naive.display()))?;
    sh(&format!("umount {}", naive.display()))?;
    ensure!(
        !copy.success() && copy.stderr.contains("No space left on device"),
        "naive: the copy did not fill the tmpfs\n{copy}"
    );
    ensure!(
        df.stdout.lines().nth(1).map(str::trim) == Some("0"),
        "naive: the tmpfs is not full\n{df}"
    );

    // diff tells sparse files and links, and the size on the target.
    let (diff, _) = agent.runtime(None, &["diff"])?;
    ensure!(diff.success(), "{diff}");
    for line in [
        "A /big.img (file) sparse: 8589934592 bytes, 0 of them data",
        "A /lib7.so (file) hard link to /lib.so",
        "# size on the target: 50.0 MiB (52428800 bytes) of file data in 2 files with 62 names",
        "limit 256.0 MiB (268435456 bytes), the sandbox's workspace_size",
    ] {
        ensure!(diff.stdout.contains(line), "diff lacks {line:?}\n{diff}");
    }

    // Past a tighter ceiling (32 MiB): refused before reading, nothing written.
    let target = dir.path().join("target");
    fs::create_dir(&target)?;
    fs::write(target.join("README.md"), "# project\n")?;
    let before = listing(&target)?;
    let export_dir = dir.path().join("export-tight");
    for args in [
        vec![
            "promote",
            "--dry-run",
            "--to",
            target.to_str().context("path")?,
        ],
        vec!["promote", "--to", target.to_str().context("path")?],
        vec!["export", "--to-dir", export_dir.to_str().context("path")?],
    ] {
        let (out, read) = agent.runtime(Some(&tight), &args)?;
        ensure!(
            out.code == Some(1)
                && out.stderr.contains("would write 50.0 MiB (52428800 bytes)")
                && out.stderr.contains("more than 32.0 MiB (33554432 bytes)")
                && out.stderr.contains("nothing was read or written"),
            "{args:?} was not refused for its size\n{out}"
        );
        ensure!(read < 4 * MIB, "{args:?} read {read} bytes before refusing");
        ensure!(listing(&target)? == before, "{args:?} changed the target");
        ensure!(!export_dir.exists(), "{args:?} made the export directory");
    }

    // Within the sandbox's own 256 MiB: the data is read once per pass, never the holes or
    // the other 60 names (11 GiB).
    let (dry, read) = agent.runtime(
        None,
        &[
            "promote",
            "--dry-run",
            "--to",
            target.to_str().context("path")?,
        ],
    )?;
    ensure!(
        dry.success()
            && dry
                .stdout
                .contains("writes 50.0 MiB (52428800 bytes) of file data in 2 files with 62 names")
            && dry
                .stdout
                .contains("create  /lib59.so (hard link to /lib.so)")
            && dry
                .stdout
                .contains("create  /big.img (file 0644, 8589934592 bytes, 0 of them data)"),
        "dry run\n{dry}"
    );
    ensure!(
        (50 * MIB..60 * MIB).contains(&read),
        "the dry run read {read} bytes"
    );
    ensure!(
        listing(&target)? == before,
        "the dry run changed the target"
    );

    let (out, read) =
        agent.runtime(None, &["promote", "--to", target.to_str().context("path")?])?;
    ensure!(out.success(), "promote failed\n{out}");
    // Checked, then staged: twice the data.
    ensure!(read < 110 * MIB, "promote read {read} bytes");
    holes_and_links_kept(&target, &upper)?;
    ensure!(
        fs::read_to_string(target.join("README.md"))? == "# project\n",
        "README changed"
    );

    let exported = dir.path().join("export");
    let (out, read) = agent.runtime(
        None,
        &["export", "--to-dir", exported.to_str().context("path")?],
    )?;
    ensure!(out.success(), "export failed\n{out}");
    ensure!(read < 60 * MIB, "export read {read} bytes");
    holes_and_links_kept(&exported, &upper)?;
    // The ended sandbox's change set (50 MiB) is not kept for review.
    let name = agent
        .podman
        .as_ref()
        .map(|g| g.name.clone())
        .context("no podman")?;
    drop(agent);
    harness::runtime_ok(&["changes", "discard", &name])?;
    Ok(())
}

#[test]
fn ctr_legitimate_sparse_file_and_hard_links_promote_and_export_with_holes_and_links_kept()
-> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("amplify-").tempdir()?;
    let ws = workspace(dir.path())?;
    let agent = Agent::ctr(&ws)?;
    agent.exec(LEGIT)?;
    let upper = agent.upper()?;

    let target = dir.path().join("target");
    fs::create_dir(&target)?;
    let (out, _) = agent.runtime(None, &["promote", "--to", target.to_str().context("path")?])?;
    ensure!(
        out.success()
            && out
                .stdout
                .contains("create  /vendor/lib2.py (hard link to /vendor/a/lib.py)")
            && out.stdout.contains("of file data in 2 files with 4 names"),
        "promote failed\n{out}"
    );
    let tar_path = dir.path().join("changes.tar");
    let (out, _) = agent.runtime(
        None,
        &["export", "--to-tar", tar_path.to_str().context("path")?],
    )?;
    ensure!(out.success(), "export failed\n{out}");
    let untarred = dir.path().join("untarred");
    fs::create_dir(&untarred)?;
    sh(&format!(
        "tar -xf {} -C {}",
        tar_path.display(),
        untarred.display()
    ))?;
    ensure!(
        fs::metadata(&tar_path)?.len() < MIB,
        "the tar holds the holes"
    );

    for root in [&target, &untarred] {
        let img = fs::metadata(root.join("data/disk.img"))?;
        ensure!(
            img.len() == 64 * MIB && img.blocks() * 512 <= 64 * 1024,
            "{}: disk.img {} bytes in {} blocks",
            root.display(),
            img.len(),
            img.blocks()
        );
        ensure!(
            fs::read(root.join("data/disk.img"))? == fs::read(upper.join("data/disk.img"))?,
            "{}: disk.img differs",
            root.display()
        );
        let lib = fs::metadata(root.join("vendor/lib.py"))?;
        for other in ["vendor/a/lib.py", "vendor/lib2.py"] {
            ensure!(
                fs::metadata(root.join(other))?.ino() == lib.ino(),
                "{}: {other} is not a link",
                root.display()
            );
        }
        ensure!(
            lib.nlink() == 3,
            "{}: {} links",
            root.display(),
            lib.nlink()
        );
        ensure!(
            fs::read(root.join("vendor/lib.py"))? == fs::read(upper.join("vendor/lib.py"))?,
            "lib.py differs"
        );
    }
    Ok(())
}
