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
//!
//! An image's manifest is the holder's word: an export edited to name another ended
//! sandbox's change set of the same workspace, or to carry another digest, is refused at
//! import, and nothing of the other sandbox's edits is copied (docs/checkpoint.md#refused).
//!
//! And each fork is re-keyed: a credential placeholder of its own (its parent's and its
//! siblings' are refused by its proxy, and audited), a CA of its own (a restored tool that
//! cached the parent's CA fails TLS, a new exec trusts the fork's). The controls: before the
//! checkpoint the same cached CA and the parent's placeholder work, and the parent restored in
//! place keeps its placeholder; the proxy's unit tests show a fixed placeholder shared by all
//! sandboxes (as before) taking a parent's as the fork's own.
//!
//! And each fork runs under the policy given at fork time
//! (docs/checkpoint.md#the-policy-of-a-fork): a narrower allowlist refuses the fork a domain its parent, restored in place, still reaches;
//! a credential naming another secret file and header makes the fork's proxy send the fork's
//! secret, never the parent's, while the parent's still sends its own; a claimed profile wider
//! than the ceiling refuses the fork naming the key before anything is copied (the control:
//! the same claim under a ceiling that allows it reaches the domain, the golden claim is
//! refused it); and a policy that changes what the image carries (a masked path, the syscall
//! table) is refused naming the key, as is an image whose manifest names no policy. The
//! control there: under its parent's policy the fork's restored mount tree reads
//! `/proc/cpuinfo`, which a sandbox created under the narrower policy cannot.
//!
//! And an image holds the workspace of its checkpoint (docs/checkpoint.md#workspace-snapshots):
//! a golden sandbox checkpointed with `--leave-running` writes on, and its forks, made then or
//! after its restore in place, see none of those writes; its own restore in place (podman's
//! stop and restore, the engine's reset: docs/checkpoint.md#reset) brings back the
//! checkpoint's workspace, `/tmp`, `HOME` and count. The control: main's runtime refuses those
//! forks and keeps what was planted in `/workspace` across the reset.

use std::path::{Path, PathBuf};

use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{self, COLLECTOR_HOST, COLLECTOR_IP, REGISTRY_HOST, REGISTRY_IP};
use agent_sandbox_e2e::podman::{ContainerGuard, Podman, Runtime, policy_flag, unique_name};
use anyhow::{Context, bail, ensure};

use super::checkpoint::{COUNTER, count, count_reaches, fixture, names_its_parent};

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
    let (fork, out) = try_import(p, flags, archive)?;
    ensure!(out.success(), "the import failed\n{out}");
    Ok(fork)
}

/// [`import`], whatever podman answers.
fn try_import(
    p: Podman,
    flags: &[&str],
    archive: &Path,
) -> anyhow::Result<(ContainerGuard, harness::Output)> {
    let fork = ContainerGuard::new(p, &unique_name("fork"));
    let out = restore_import(&|a| p.run(a), flags, archive, &fork.name)?;
    Ok((fork, out))
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

/// `podman container checkpoint --export ARCHIVE NAME` under `flags`: `name` ends, its image
/// in `archive`.
fn export(p: Podman, flags: &[&str], name: &str, archive: &Path) -> anyhow::Result<()> {
    let archive = archive.display().to_string();
    let mut args = flags.to_vec();
    args.extend(["container", "checkpoint", "--export", &archive, name]);
    p.run_ok(&args)?;
    Ok(())
}

/// Checkpoints `parent` into an archive in `dir`, imports `n` forks of it under new names,
/// then restores the parent in place (in its own block, held for it since the checkpoint)
/// beside them.
fn fork_and_restore(
    p: Podman,
    flags: &[&str],
    parent: &str,
    dir: &Path,
    n: usize,
) -> anyhow::Result<Vec<ContainerGuard>> {
    let archive = export_golden(p, flags, parent, dir)?;
    let forks = (0..n)
        .map(|_| import(p, flags, &archive))
        .collect::<anyhow::Result<Vec<_>>>()?;
    restore_in_place(p, flags, parent)?;
    Ok(forks)
}

/// Checkpoints `parent` (run under `flags`) into the archive `dir/golden.tar`.
fn export_golden(p: Podman, flags: &[&str], parent: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let archive = dir.join("golden.tar");
    export(p, flags, parent, &archive)?;
    Ok(archive)
}

/// Restores the checkpointed `parent` in place under `flags` (in its own block, held for it
/// since the checkpoint).
fn restore_in_place(p: Podman, flags: &[&str], parent: &str) -> anyhow::Result<()> {
    let mut args = flags.to_vec();
    args.extend(["container", "restore", "--ignore-static-ip", parent]);
    p.run_ok(&args)?;
    Ok(())
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
    let forks = fork_and_restore(p, &flags, &parent.name, dir.path(), 3)?;
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
    export(p, &[], &parent.name, &archive)?;
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

/// The kept change sets of workspace `ws`, as `agent-sandbox changes list --json` gives
/// them: (change id, container id).
fn kept_changes(ws: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let list = harness::runtime_ok(&["changes", "list", "--json"])?;
    Ok(list
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["workspace"] == ws.display().to_string().as_str())
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("change"), field("container"))
        })
        .collect())
}

/// A copy at `to` of the exported archive `from` whose `checkpoint/agent-sandbox.json` was
/// changed by `edit` (an uncompressed tar, which podman's import reads as well).
fn edited_archive(
    from: &Path,
    to: &Path,
    edit: impl Fn(&mut serde_json::Value),
) -> anyhow::Result<()> {
    let unpacked = tempfile::tempdir()?;
    let tar = |args: &[&std::ffi::OsStr]| -> anyhow::Result<()> {
        let out = std::process::Command::new("tar").args(args).output()?;
        ensure!(
            out.status.success(),
            "tar {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    tar(&[
        "-xf".as_ref(),
        from.as_os_str(),
        "-C".as_ref(),
        unpacked.path().as_os_str(),
    ])?;
    let manifest = unpacked.path().join("checkpoint/agent-sandbox.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest)?)?;
    edit(&mut json);
    std::fs::write(&manifest, serde_json::to_vec_pretty(&json)?)?;
    let mut args: Vec<std::ffi::OsString> =
        vec!["-cf".into(), to.into(), "-C".into(), unpacked.path().into()];
    for entry in std::fs::read_dir(unpacked.path())? {
        args.push(entry?.file_name());
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    tar(&args)
}

/// The import of `archive` under a new name is refused with an error holding each of `want`
/// (among them the section of the docs that names the refusal), and no change set is kept
/// after it that was not kept before: nothing was copied.
fn import_refused(
    p: Podman,
    flags: &[&str],
    (archive, ws): (&Path, &Path),
    want: &[&str],
) -> anyhow::Result<()> {
    let before = kept_changes(ws)?;
    let (fork, out) = try_import(p, flags, archive)?;
    if out.success() {
        let ls = p.run(&["exec", &fork.name, "ls", "/workspace"])?;
        anyhow::bail!(
            "the import was not refused; its workspace holds: {}\n{out}",
            ls.stdout.trim()
        );
    }
    ensure!(
        want.iter().all(|w| out.stderr.contains(w)),
        "unclear refusal (wanted {want:?})\n{out}"
    );
    let after = kept_changes(ws)?;
    let new: Vec<_> = after.iter().filter(|c| !before.contains(c)).collect();
    ensure!(
        new.is_empty(),
        "the refused import kept change sets: {new:?}"
    );
    Ok(())
}

#[test]
fn import_refuses_an_image_edited_to_name_another_sandboxs_changes_or_digest() -> anyhow::Result<()>
{
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, policy) = fixture("optional")?;
    let flag = policy_flag(&policy);
    let flags = ["--runtime-flag", flag.as_str()];
    let volume = format!("{}:/workspace", ws.display());
    // B, of the same workspace directory, ends with an edit kept for its own review.
    let (b, b_id) = p.run_detached(
        &flags,
        "trust-b",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sleep", "600"],
    )?;
    p.run_ok(&[
        "exec",
        &b.name,
        "sh",
        "-c",
        "echo B > /workspace/b-only.txt",
    ])?;
    drop(b);
    let b_change = kept_changes(&ws)?
        .into_iter()
        .find(|(_, c)| *c == b_id)
        .map(|(change, _)| change)
        .context("B's change set was not kept")?;
    // A, checkpointed and exported.
    let (a, _a_id) = p.run_detached(
        &flags,
        "trust-a",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", COUNTER],
    )?;
    p.run_ok(&[
        "exec",
        &a.name,
        "sh",
        "-c",
        "echo A > /workspace/a-only.txt",
    ])?;
    count_reaches(p, &a.name, 3)?;
    let archive = dir.path().join("a.tar");
    export(p, &flags, &a.name, &archive)?;
    // The manifest names B and B's change set: the runtime never bound that change set to
    // this image, so nothing of B's is copied.
    let named_b = dir.path().join("named-b.tar");
    edited_archive(&archive, &named_b, |m| {
        m["id"] = b_id.as_str().into();
        m["change"] = b_change.as_str().into();
    })?;
    import_refused(
        p,
        &flags,
        (&named_b, &ws),
        &[
            "was not kept by a checkpoint of image",
            "docs/checkpoint.md#refused",
        ],
    )?;
    // The manifest carries another digest than its files have.
    let other_digest = dir.path().join("other-digest.tar");
    edited_archive(&archive, &other_digest, |m| {
        m["image_digest"] = format!("sha256:{}", "0".repeat(64)).into();
    })?;
    import_refused(
        p,
        &flags,
        (&other_digest, &ws),
        &["its files have sha256:", "docs/checkpoint.md#refused"],
    )?;
    // The same image unedited (through podman's export and import) is a fork with A's edit
    // and none of B's.
    let fork = import(p, &flags, &archive)?;
    let seen = workspace(p, &fork.name)?;
    ensure!(
        seen.iter().any(|f| f == "a-only.txt") && !seen.iter().any(|f| f == "b-only.txt"),
        "the fork's workspace: {seen:?}"
    );
    Ok(())
}

/// The variable the golden policy's placeholder lives in.
const TOKEN_ENV: &str = "API_TOKEN";
/// The proxy's rule for a placeholder that is not the sandbox's own.
const FOREIGN: &str = "stale or foreign placeholder";

/// A bearer-token API on loopback with its own CA (the test's internet), its token in a file
/// only root reads, and the golden policy: the agent profile allowing the API, Landlock
/// optional (CRIU cannot carry it), and an `https` credential with a placeholder.
struct Api {
    server: net::PyServer,
    token: String,
    policy: std::path::PathBuf,
    _ca: net::TestCa,
}

impl Api {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        net::ensure_test_hosts()?;
        let ca = net::TestCa::generate(&[REGISTRY_HOST])?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let token = format!("forkTok{}q{nanos}", std::process::id());
        let server = net::PyServer::https_requiring(
            REGISTRY_IP,
            &ca,
            "api-private-data",
            &format!("Bearer {token}"),
        )?;
        let file = secret_file(dir, "api-token", &token)?;
        let domain = format!("{REGISTRY_HOST}:{}", server.port());
        let credential = https_credential(&domain, ("Authorization", "Bearer "), &file, &ca)
            + &format!("placeholder_env = \"{TOKEN_ENV}\"\n");
        let path = golden_policy(dir, "golden", &api_rules(server.port()), |t| {
            t + &credential
        })?;
        Ok(Self {
            server,
            token,
            policy: path,
            _ca: ca,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("https://{REGISTRY_HOST}:{}{path}", self.server.port())
    }

    /// The golden sandbox's program: it caches the sandbox's CA certificate in its own memory
    /// at start (as tools keep a trust store), counts, and on each `/tmp/go` calls the API
    /// twice from that restored memory: trusting only the cached CA, then with the
    /// placeholder its environment holds (trusting the bundle file, read again); it writes
    /// both outcomes and that placeholder to `/tmp/out`.
    fn golden_program(&self) -> String {
        format!(
            "CA=$(cat /etc/agent-sandbox/tls/ca.pem); i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; \
             if [ -e /tmp/go ]; then rm -f /tmp/go /tmp/out; printf '%s\\n' \"$CA\" > /tmp/cached.pem; \
             curl -sS -m 20 --cacert /tmp/cached.pem -o /dev/null -w 'cached=%{{http_code}}\\n' {} > /tmp/part 2>&1; \
             curl -sS -m 20 -o /dev/null -D - -w 'env-call=%{{http_code}}\\n' -H \"Authorization: Bearer ${TOKEN_ENV}\" {} >> /tmp/part 2>&1; \
             echo \"env={TOKEN_ENV}=${TOKEN_ENV}\" >> /tmp/part; mv /tmp/part /tmp/out; fi; sleep 0.2; done",
            self.url("/v1/cached-ca"),
            self.url("/v1/restored-env"),
        )
    }
}

/// What the golden program's restored memory got (see [`Api::golden_program`]).
fn restored_calls(p: Podman, name: &str) -> anyhow::Result<String> {
    p.run_ok(&["exec", name, "sh", "-c", "rm -f /tmp/out; touch /tmp/go"])?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = p.run(&["exec", name, "cat", "/tmp/out"])?;
        if out.code == Some(0) && out.stdout.contains("env=") {
            return Ok(out.stdout);
        }
        if std::time::Instant::now() >= deadline {
            bail!("{name}: the restored program never answered\n{out}");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// The sandbox's own placeholder as a new exec sees it (checked well formed).
fn own_placeholder(p: Podman, name: &str) -> anyhow::Result<String> {
    let out = p.run_ok(&["exec", name, "sh", "-c", &format!("echo \"${TOKEN_ENV}\"")])?;
    let own = out.stdout.trim().to_owned();
    let start = format!("agent-sandbox-placeholder-{TOKEN_ENV}-");
    ensure!(
        own.strip_prefix(&start)
            .is_some_and(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())),
        "{name}'s placeholder is not the prefix, the name and a suffix of its own: {own:?}"
    );
    Ok(own)
}

/// A new exec's call of the API sending `placeholder` (trusting the sandbox's CA through the
/// variables the runtime sets): the response head and `status=CODE`.
fn call_with(p: Podman, name: &str, api: &Api, placeholder: &str) -> anyhow::Result<String> {
    let out = p.run(&[
        "exec",
        name,
        "curl",
        "-sS",
        "-m",
        "20",
        "-D",
        "-",
        "-w",
        "\nstatus=%{http_code}\n",
        "-H",
        &format!("Authorization: Bearer {placeholder}"),
        &api.url("/v1/exec"),
    ])?;
    Ok(format!("{}{}", out.stdout, out.stderr))
}

fn refused_as_foreign(text: &str) -> bool {
    text.contains("status=403") && text.contains(&format!("X-Agent-Sandbox-Denied: {FOREIGN}"))
}

/// The `net` records of `id`'s audit log that refused a foreign placeholder naming `token`.
fn audited_foreign(id: &str, token: &str) -> anyhow::Result<usize> {
    let json = harness::runtime_ok(&["audit", "--json", id])?.stdout;
    Ok(json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| {
            r["kind"] == "net"
                && r["data"]["verdict"] == "deny"
                && r["data"]["rule"].as_str() == Some(&format!("{FOREIGN}: {token}"))
        })
        .count())
}

#[test]
fn forks_are_rekeyed_a_placeholder_and_a_ca_of_their_own() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, _) = fixture("optional")?;
    let api = Api::start(dir.path())?;
    let flag = policy_flag(&api.policy);
    let flags = ["--runtime-flag", flag.as_str()];
    let volume = format!("{}:/workspace", ws.display());
    let program = api.golden_program();
    let (parent, parent_id) = p.run_detached(
        &flags,
        "rekey-parent",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", &program],
    )?;
    count_reaches(p, &parent.name, 3)?;
    // The controls, before the checkpoint: the cached CA is the one the proxy signs with,
    // and the parent's placeholder is the one its proxy takes.
    let parent_ph = own_placeholder(p, &parent.name)?;
    let before = restored_calls(p, &parent.name)?;
    ensure!(
        before.contains("cached=200")
            && before.contains("env-call=200")
            && before.contains(&format!("env={TOKEN_ENV}={parent_ph}")),
        "before the checkpoint the cached CA or the placeholder did not work\n{before}"
    );
    let parent_ca = p.run_ok(&["exec", &parent.name, "cat", "/etc/agent-sandbox/tls/ca.pem"])?;
    let forks = fork_and_restore(p, &flags, &parent.name, dir.path(), 2)?;

    let own: Vec<String> = forks
        .iter()
        .map(|f| own_placeholder(p, &f.name))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        own[0] != own[1] && !own.contains(&parent_ph),
        "the forks' placeholders are not their own: parent {parent_ph}, forks {own:?}"
    );
    for (i, fork) in forks.iter().enumerate() {
        let sibling = &own[1 - i];
        let id = p.run_ok(&["inspect", "--format", "{{.Id}}", &fork.name])?;
        let id = id.stdout.trim();
        // The restored program: the parent's CA fails TLS through the fork's proxy, and the
        // parent's placeholder its environment holds is refused.
        let restored = restored_calls(p, &fork.name)?;
        ensure!(
            !restored.contains("cached=200")
                && restored.contains("cached=000")
                && restored.contains(&format!("env={TOKEN_ENV}={parent_ph}"))
                && refused_as_foreign(&restored.replace("env-call=", "status=")),
            "fork {i}: a restored tool acted with the parent's CA or placeholder\n{restored}"
        );
        // A new exec: its own placeholder works, over the fork's own CA.
        let fork_ca = p.run_ok(&["exec", &fork.name, "cat", "/etc/agent-sandbox/tls/ca.pem"])?;
        ensure!(
            fork_ca.stdout.contains("BEGIN CERTIFICATE") && fork_ca.stdout != parent_ca.stdout,
            "fork {i} kept the parent's CA"
        );
        let mine = call_with(p, &fork.name, &api, &own[i])?;
        ensure!(
            mine.contains("status=200") && mine.contains("api-private-data"),
            "fork {i}: its own placeholder did not get the secret injected\n{mine}"
        );
        for (whose, other) in [("the parent's", &parent_ph), ("a sibling's", sibling)] {
            let text = call_with(p, &fork.name, &api, other)?;
            ensure!(
                refused_as_foreign(&text) && !text.contains("api-private-data"),
                "fork {i}: {whose} placeholder was not refused\n{text}"
            );
        }
        ensure!(
            audited_foreign(id, &parent_ph)? >= 2 && audited_foreign(id, sibling)? >= 1,
            "fork {i}'s audit does not name the refused placeholders\n{}",
            harness::runtime_ok(&["audit", "--json", id])?.stdout
        );
        names_its_parent(id, &parent_id)?;
    }
    // The parent restored in place keeps its placeholder: its restored program's works, and
    // a fork's is refused there too. Its CA is new as well (docs/checkpoint.md#fork).
    ensure!(
        own_placeholder(p, &parent.name)? == parent_ph,
        "the parent's placeholder changed at a restore in place"
    );
    let again = restored_calls(p, &parent.name)?;
    ensure!(
        again.contains("env-call=200") && again.contains("cached=000"),
        "the parent restored in place: its restored placeholder was refused, or its old CA still \
         signs\n{again}"
    );
    let text = call_with(p, &parent.name, &api, &own[0])?;
    ensure!(
        refused_as_foreign(&text),
        "the parent took a fork's placeholder\n{text}"
    );
    // Nothing placeholder-shaped reached the API: the refused requests never left, and the
    // accepted ones carried the secret instead.
    let seen = api.server.output();
    ensure!(
        !seen.iter().any(|l| l.contains("agent-sandbox-placeholder")),
        "a placeholder reached the API: {seen:?}"
    );
    ensure!(
        seen.iter()
            .filter(|l| **l == format!("HDR Authorization: Bearer {}", api.token))
            .count()
            >= 5,
        "the API did not get the secret on each accepted call: {seen:?}"
    );
    Ok(())
}

/// What profiles/agent.toml says of Landlock, and what the golden policies say instead
/// (CRIU cannot carry Landlock: docs/checkpoint.md#layers).
const LANDLOCK_REQUIRED: &str = "\nlandlock = \"required\"\n";

/// A policy file `dir/NAME.toml`: the agent profile allowing `allow`, its Landlock layer
/// optional, its text then changed by `edit`.
fn golden_policy(
    dir: &Path,
    name: &str,
    allow: &[String],
    edit: impl FnOnce(String) -> String,
) -> anyhow::Result<PathBuf> {
    let own = dir.join(format!("{name}.d"));
    std::fs::create_dir_all(&own)?;
    let text = std::fs::read_to_string(net::write_policy(&own, allow, &[])?)?;
    ensure!(
        text.contains(LANDLOCK_REQUIRED),
        "profiles/agent.toml no longer says landlock = \"required\""
    );
    let text = edit(text.replace(LANDLOCK_REQUIRED, "\nlandlock = \"optional\"\n"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The allow rules of a test server on `REGISTRY_IP:port`, by name and by address.
fn api_rules(port: u16) -> Vec<String> {
    vec![
        format!("{REGISTRY_HOST}:{port}"),
        format!("{REGISTRY_IP}:{port}"),
    ]
}

/// A secret file `dir/name` holding `secret`, only root reads it.
fn secret_file(dir: &Path, name: &str, secret: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let file = dir.join(name);
    std::fs::write(&file, format!("{secret}\n"))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// A `[[network.credentials]]` table: for `domain` over HTTPS (its server verified by `ca`),
/// the header `(name, prefix)` set to the prefix and the secret in `file`.
fn https_credential(
    domain: &str,
    (header, prefix): (&str, &str),
    file: &Path,
    ca: &net::TestCa,
) -> String {
    format!(
        "\n[[network.credentials]]\ndomain = \"{domain}\"\nheader = \"{header}\"\n\
         prefix = {prefix:?}\nfile = {:?}\nhttps = true\nupstream_ca = {:?}\n",
        file.display().to_string(),
        ca.path("ca.pem").display().to_string(),
    )
}

/// `--runtime-flag policy=FILE` and, if given, `--runtime-flag profiles-dir=DIR`.
fn runtime_flags(policy: &Path, profiles: Option<&Path>) -> Vec<String> {
    let mut flags = vec!["--runtime-flag".to_owned(), policy_flag(policy)];
    if let Some(dir) = profiles {
        flags.push("--runtime-flag".to_owned());
        flags.push(format!("profiles-dir={}", dir.display()));
    }
    flags
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A golden sandbox counting under `flags` (`extra` before the image: annotations, a
/// workspace), run until its count shows, then checkpointed into `dir/golden.tar`.
fn golden_archive(
    p: Podman,
    flags: &[&str],
    extra: &[&str],
    dir: &Path,
) -> anyhow::Result<(ContainerGuard, PathBuf)> {
    let mut args = vec!["--init"];
    args.extend_from_slice(extra);
    args.extend([TOOLS_IMAGE, "sh", "-c", COUNTER]);
    let (parent, _) = p.run_detached(flags, "policy-parent", &args)?;
    count_reaches(p, &parent.name, 3)?;
    let archive = export_golden(p, flags, &parent.name, dir)?;
    Ok((parent, archive))
}

/// A new exec's `curl -i` of `url` in the sandbox `name` (through its proxy): the response
/// head and body, then curl's errors.
fn fetch(p: Podman, name: &str, url: &str) -> anyhow::Result<String> {
    let out = p.run(&["exec", name, "curl", "-sS", "-m", "20", "-i", url])?;
    Ok(format!("{}{}", out.stdout, out.stderr))
}

fn denied_by_default(text: &str) -> bool {
    text.contains(" 403") && text.contains(&format!("{}: default deny", net::DENIED_HEADER))
}

#[test]
fn a_fork_under_a_narrower_allowlist_is_refused_a_domain_its_parent_still_reaches()
-> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let kept = net::HttpServer::start(REGISTRY_IP, "kept-domain-body")?;
    let dropped = net::HttpServer::start(COLLECTOR_IP, "dropped-domain-body")?;
    let mut both = api_rules(kept.port());
    both.extend([
        format!("{COLLECTOR_HOST}:{}", dropped.port()),
        format!("{COLLECTOR_IP}:{}", dropped.port()),
    ]);
    let parent_policy = golden_policy(dir.path(), "parent", &both, |t| t)?;
    let claim = golden_policy(dir.path(), "claim", &api_rules(kept.port()), |t| t)?;
    let parent_flags = runtime_flags(&parent_policy, None);
    let (parent, archive) = golden_archive(p, &strs(&parent_flags), &[], dir.path())?;
    let fork = import(p, &strs(&runtime_flags(&claim, None)), &archive)?;
    restore_in_place(p, &strs(&parent_flags), &parent.name)?;
    let kept_url = format!("http://{REGISTRY_HOST}:{}/", kept.port());
    let dropped_url = format!("http://{COLLECTOR_HOST}:{}/", dropped.port());
    let refused = fetch(p, &fork.name, &dropped_url)?;
    ensure!(
        denied_by_default(&refused) && dropped.received().is_empty(),
        "the fork reached a domain its own policy does not allow\n{refused}"
    );
    let allowed = fetch(p, &fork.name, &kept_url)?;
    ensure!(
        allowed.contains("kept-domain-body"),
        "the fork did not reach the domain its policy allows\n{allowed}"
    );
    // The control: the parent, restored in place under its own policy, reaches the domain
    // the fork is refused.
    let control = fetch(p, &parent.name, &dropped_url)?;
    ensure!(
        control.contains("dropped-domain-body") && dropped.received().len() == 1,
        "the parent restored in place did not reach the domain its policy allows\n{control}"
    );
    Ok(())
}

#[test]
fn a_fork_bound_to_another_secret_and_header_sends_its_own_never_its_parents() -> anyhow::Result<()>
{
    net::ensure_test_hosts()?;
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let dir = tempfile::tempdir()?;
    let ca = net::TestCa::generate(&[REGISTRY_HOST])?;
    let server = net::PyServer::https(REGISTRY_IP, &ca, "api-data")?;
    let domain = format!("{REGISTRY_HOST}:{}", server.port());
    let stamp = format!("{}x{}", std::process::id(), unique_name("s"));
    let (parent_secret, fork_secret) =
        (format!("parentSecret{stamp}"), format!("forkSecret{stamp}"));
    let parent_file = secret_file(dir.path(), "parent-secret", &parent_secret)?;
    let fork_file = secret_file(dir.path(), "fork-secret", &fork_secret)?;
    let rules = api_rules(server.port());
    let parent_cred = https_credential(&domain, ("Authorization", "Bearer "), &parent_file, &ca);
    let fork_cred = https_credential(&domain, ("X-Api-Key", ""), &fork_file, &ca);
    let parent_policy = golden_policy(dir.path(), "parent", &rules, |t| t + &parent_cred)?;
    let claim = golden_policy(dir.path(), "claim", &rules, |t| t + &fork_cred)?;
    let parent_flags = runtime_flags(&parent_policy, None);
    let (parent, archive) = golden_archive(p, &strs(&parent_flags), &[], dir.path())?;
    let fork = import(p, &strs(&runtime_flags(&claim, None)), &archive)?;
    restore_in_place(p, &strs(&parent_flags), &parent.name)?;
    let url = format!("https://{domain}/v1/data");
    let forks_call = fetch(p, &fork.name, &url)?;
    let seen = server.output();
    ensure!(
        forks_call.contains("api-data")
            && seen.contains(&format!("HDR X-Api-Key: {fork_secret}"))
            && !seen.iter().any(|l| l.contains(&parent_secret)),
        "the fork's call did not carry the fork's own secret alone\n{forks_call}\n{seen:?}"
    );
    // The control: the parent restored in place still sends its own.
    let parents_call = fetch(p, &parent.name, &url)?;
    let seen = server.output();
    ensure!(
        parents_call.contains("api-data")
            && seen.contains(&format!("HDR Authorization: Bearer {parent_secret}")),
        "the parent's call did not carry its secret\n{parents_call}\n{seen:?}"
    );
    ensure!(
        seen.iter().filter(|l| l.starts_with("REQ ")).count() == 2,
        "the API got other requests: {seen:?}"
    );
    Ok(())
}

#[test]
fn a_fork_that_changes_what_the_image_carries_is_refused_naming_the_key() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, _) = fixture("optional")?;
    let rules = api_rules(443);
    let parent_policy = golden_policy(dir.path(), "parent", &rules, |t| t)?;
    let masked_text = "masked_paths = [\"/proc/cpuinfo\"]";
    let masked = golden_policy(dir.path(), "masked", &rules, |t| {
        t.replace("masked_paths = []", masked_text)
    })?;
    ensure!(
        std::fs::read_to_string(&masked)?.contains(masked_text),
        "profiles/agent.toml no longer says masked_paths = []"
    );
    let syscalls = golden_policy(dir.path(), "syscalls", &rules, |t| {
        t + "\n[syscalls]\ndeny = [\"personality\"]\n"
    })?;
    let parent_flags = runtime_flags(&parent_policy, None);
    let volume = format!("{}:/workspace", ws.display());
    let (_parent, archive) = golden_archive(p, &strs(&parent_flags), &["-v", &volume], dir.path())?;
    let masked_flags = runtime_flags(&masked, None);
    let anchor = "docs/checkpoint.md#the-policy-of-a-fork";
    import_refused(
        p,
        &strs(&masked_flags),
        (&archive, &ws),
        &[
            "changes filesystem.masked_paths",
            "the restored mount tree",
            anchor,
        ],
    )?;
    import_refused(
        p,
        &strs(&runtime_flags(&syscalls, None)),
        (&archive, &ws),
        &["changes syscalls", "seccomp filters", anchor],
    )?;
    // An image whose manifest names no policy cannot be compared: refused too.
    let stripped = dir.path().join("no-policy.tar");
    edited_archive(&archive, &stripped, |m| {
        if let Some(m) = m.as_object_mut() {
            m.remove("policy");
        }
    })?;
    import_refused(
        p,
        &strs(&parent_flags),
        (&stripped, &ws),
        &["names no policy", anchor],
    )?;
    // The controls: the fork under its parent's policy is made, and its restored mount tree
    // is the image's, where /proc/cpuinfo reads; a sandbox created under the narrower policy
    // reads nothing there. A fork accepted under that policy would claim a mask its
    // restored tasks do not have.
    let fork = import(p, &strs(&parent_flags), &archive)?;
    let size = |out: harness::Output| out.stdout.trim().parse::<u64>().unwrap_or(0);
    let restored = p.run_ok(&["exec", &fork.name, "sh", "-c", "wc -c < /proc/cpuinfo"])?;
    ensure!(
        size(restored) > 0,
        "the restored mount tree masks /proc/cpuinfo"
    );
    let mut args = strs(&masked_flags);
    args.extend([
        "run",
        "--rm",
        TOOLS_IMAGE,
        "sh",
        "-c",
        "wc -c < /proc/cpuinfo",
    ]);
    let fresh = p.run_ok(&args)?;
    ensure!(
        fresh.stdout.trim() == "0",
        "a sandbox created under the narrower policy reads /proc/cpuinfo\n{fresh}"
    );
    Ok(())
}

#[test]
fn a_fork_whose_claimed_profile_is_wider_than_the_ceiling_is_refused_naming_the_key()
-> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, _) = fixture("optional")?;
    let registry = net::HttpServer::start(REGISTRY_IP, "registry-body")?;
    let collector = net::HttpServer::start(COLLECTOR_IP, "collector-body")?;
    let allowed = api_rules(registry.port());
    let collector_rule = format!("{COLLECTOR_HOST}:{}", collector.port());
    let mut wider = allowed.clone();
    wider.extend([
        collector_rule.clone(),
        format!("{COLLECTOR_IP}:{}", collector.port()),
    ]);
    let ceiling = golden_policy(dir.path(), "ceiling", &allowed, |t| t)?;
    let wide_ceiling = golden_policy(dir.path(), "wide-ceiling", &wider, |t| t)?;
    // Profiles directories (root's, not writable by others), each with its `claim.toml`.
    let profiles = |name: &str, allow: &[String]| -> anyhow::Result<PathBuf> {
        let d = dir.path().join(name);
        std::fs::create_dir(&d)?;
        golden_policy(&d, "claim", allow, |t| t)?;
        Ok(d)
    };
    let golden = profiles("golden-profiles", &allowed)?;
    let wide = profiles("wide-profiles", &wider)?;
    let volume = format!("{}:/workspace", ws.display());
    let extra = [
        "--annotation",
        "io.agent.sandbox.profile=claim",
        "-v",
        &volume,
    ];
    let golden_flags = runtime_flags(&ceiling, Some(&golden));
    let (_parent, archive) = golden_archive(p, &strs(&golden_flags), &extra, dir.path())?;
    let rule = format!("allow rule {collector_rule} is not covered by the ceiling's allow list");
    import_refused(
        p,
        &strs(&runtime_flags(&ceiling, Some(&wide))),
        (&archive, &ws),
        &[
            "annotation io.agent.sandbox.profile would widen the policy",
            &rule,
            "docs/policy.md#keys-that-may-only-tighten",
        ],
    )?;
    ensure!(collector.received().is_empty(), "the collector was reached");
    // The controls: the same claim under a ceiling that allows it is a fork that reaches the
    // collector, and the golden claim under the first ceiling one that is refused it.
    let collector_url = format!("http://{collector_rule}/");
    let claimed = import(
        p,
        &strs(&runtime_flags(&wide_ceiling, Some(&wide))),
        &archive,
    )?;
    let reached = fetch(p, &claimed.name, &collector_url)?;
    ensure!(
        reached.contains("collector-body"),
        "the fork under a ceiling that allows its claim did not reach the collector\n{reached}"
    );
    let plain = import(p, &strs(&golden_flags), &archive)?;
    let refused = fetch(p, &plain.name, &collector_url)?;
    ensure!(
        denied_by_default(&refused) && collector.received().len() == 1,
        "the golden claim's fork reached the collector\n{refused}"
    );
    Ok(())
}

/// The workspace entries of `name` and its `notes.txt`.
fn workspace_and_notes(p: Podman, name: &str) -> anyhow::Result<(Vec<String>, String)> {
    let notes = p.run_ok(&["exec", name, "cat", "/workspace/notes.txt"])?;
    Ok((workspace(p, name)?, notes.stdout))
}

/// What the golden sandbox made of its workspace layer before the checkpoint, beside its
/// edit: a directory of the checkout removed and made again (an opaque directory, its
/// `user.overlay.opaque` xattr hiding the checkout's files), a hard link and a symlink
/// out of the sandbox.
const HOSTILE_LAYER: &str = "rm -r /workspace/d && mkdir /workspace/d && \
    echo n > /workspace/d/new.txt && ln /workspace/d/new.txt /workspace/hard && \
    ln -s /etc/shadow /workspace/link";

/// The layer [`HOSTILE_LAYER`] made, as `name` sees it: the opaque directory hides the
/// checkout's file, the hard link is one file, the symlink a link (never followed).
fn hostile_layer_kept(p: Podman, name: &str) -> anyhow::Result<()> {
    let look = "ls /workspace/d; stat -c %h /workspace/hard; readlink /workspace/link";
    let seen = p.run_ok(&["exec", name, "sh", "-c", look])?;
    ensure!(
        seen.stdout == "new.txt\n2\n/etc/shadow\n",
        "{name}'s copy of the layer is not the golden sandbox's\n{seen}"
    );
    Ok(())
}

/// A golden image taken with `--leave-running` (the warm pool's way: the golden sandbox runs
/// on) holds the workspace as it was at its checkpoint (docs/checkpoint.md#what-is-carried):
/// a fork sees the edit and the deletion made before the checkpoint and none of the writes
/// the parent made after it, whether the fork is made while the parent runs on or after the
/// parent was restored in place and wrote more; and the parent's own restore in place from
/// that checkpoint (`podman stop`, then `container restore`) returns its workspace to the
/// checkpoint's too, as its memory is. The control: the runtime before workspace snapshots
/// (`AGENT_SANDBOX_BIN_DIR` naming it) refuses the first fork (its copy was of the live
/// change set).
#[test]
fn a_leave_running_golden_image_holds_the_workspace_of_its_checkpoint() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (dir, ws, policy) = fixture("optional")?;
    std::fs::write(ws.join("notes.txt"), "host\n")?;
    std::fs::write(ws.join("gone.txt"), "host\n")?;
    std::fs::create_dir(ws.join("d"))?;
    std::fs::write(ws.join("d/old.txt"), "host\n")?;
    let shadow = std::fs::read("/etc/shadow")?;
    let flag = policy_flag(&policy);
    let flags = ["--runtime-flag", flag.as_str()];
    let volume = format!("{}:/workspace", ws.display());
    let (parent, _) = p.run_detached(
        &flags,
        "golden",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", COUNTER],
    )?;
    let edit = "echo edited > /workspace/notes.txt && rm /workspace/gone.txt";
    p.run_ok(&["exec", &parent.name, "sh", "-c", edit])?;
    p.run_ok(&["exec", &parent.name, "sh", "-c", HOSTILE_LAYER])?;
    count_reaches(p, &parent.name, 3)?;
    let archive = dir.path().join("golden.tar");
    let archive_arg = archive.display().to_string();
    let mut args = flags.to_vec();
    args.extend(["container", "checkpoint", "--leave-running", "--export"]);
    args.extend([archive_arg.as_str(), parent.name.as_str()]);
    p.run_ok(&args)?;
    let later = "echo later > /workspace/later.txt && echo again > /workspace/notes.txt";
    p.run_ok(&["exec", &parent.name, "sh", "-c", later])?;
    let listing = |extra: &[&str]| {
        let mut l: Vec<String> = ["d", "hard", "link", "notes.txt"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect();
        l.sort();
        l
    };
    let golden = (listing(&[]), "edited\n".to_owned());
    let fork = import(p, &flags, &archive)?;
    ensure!(
        workspace_and_notes(p, &fork.name)? == golden,
        "the fork of the running golden sandbox does not see the checkpoint's workspace: {:?}",
        workspace_and_notes(p, &fork.name)?
    );
    hostile_layer_kept(p, &fork.name)?;
    count_reaches(p, &fork.name, 1)?;
    let running = workspace_and_notes(p, &parent.name)?;
    ensure!(
        running.0 == listing(&["later.txt"]) && running.1 == "again\n",
        "the golden sandbox lost its own later writes: {running:?}"
    );
    // The parent's restore in place from the checkpoint: its workspace is the checkpoint's.
    p.run_ok(&["stop", "-t", "2", &parent.name])?;
    restore_in_place(p, &flags, &parent.name)?;
    count_reaches(p, &parent.name, 1)?;
    ensure!(
        workspace_and_notes(p, &parent.name)? == golden,
        "the parent restored in place does not have the checkpoint's workspace: {:?}",
        workspace_and_notes(p, &parent.name)?
    );
    // A fork after the restored parent wrote more starts from the checkpoint too.
    p.run_ok(&["exec", &parent.name, "sh", "-c", later])?;
    let second = import(p, &flags, &archive)?;
    ensure!(
        workspace_and_notes(p, &second.name)? == golden,
        "a fork made after the parent's restore in place sees its later writes: {:?}",
        workspace_and_notes(p, &second.name)?
    );
    hostile_layer_kept(p, &parent.name)?;
    hostile_layer_kept(p, &second.name)?;
    ensure!(
        std::fs::read("/etc/shadow")? == shadow && ws.join("d/old.txt").exists(),
        "a copy followed the link or reached the checkout"
    );
    ensure!(
        std::fs::read_to_string(ws.join("notes.txt"))? == "host\n" && ws.join("gone.txt").exists(),
        "an edit reached the host checkout unpromoted"
    );
    Ok(())
}

/// The records of `kind` in the audit log of sandbox `id`.
fn records(id: &str, kind: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let json = harness::runtime_ok(&["audit", "--json", id])?.stdout;
    Ok(json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == kind)
        .collect())
}

/// Recycling through podman (docs/checkpoint.md#reset): a golden sandbox checkpointed with
/// `--leave-running`, used (files planted in /workspace, /tmp and HOME, the count run on),
/// then `podman stop` and `container restore --keep` in place, is the golden sandbox again,
/// twice over: the planted files are gone, the count resumes from the checkpoint's value,
/// each `restored` record names the `checkpointed` record's digest, and the log verifies.
/// The control: the installed runtime of main keeps the file planted in /workspace (its
/// restore mounts the change set as the sandbox left it).
#[test]
fn a_golden_sandbox_is_recycled_by_stop_and_restore_in_place() -> anyhow::Result<()> {
    let p = Podman::new(User::Root, Runtime::AgentSandbox);
    let (_dir, ws, policy) = fixture("optional")?;
    let flag = policy_flag(&policy);
    let flags = ["--runtime-flag", flag.as_str()];
    let volume = format!("{}:/workspace", ws.display());
    let (golden, id) = p.run_detached(
        &flags,
        "recycle",
        &["--init", "-v", &volume, TOOLS_IMAGE, "sh", "-c", COUNTER],
    )?;
    p.run_ok(&[
        "exec",
        &golden.name,
        "sh",
        "-c",
        "echo golden > /workspace/notes.txt",
    ])?;
    count_reaches(p, &golden.name, 3)?;
    let mut args = flags.to_vec();
    args.extend(["container", "checkpoint", "--leave-running", &golden.name]);
    p.run_ok(&args)?;
    let at_checkpoint = count(p, &golden.name)?;
    let checkpointed = records(&id, "checkpointed")?;
    let digest =
        checkpointed.last().context("no checkpointed record")?["data"]["image_digest"].clone();
    let plant =
        "echo x > /workspace/planted && echo x > /tmp/planted && echo x > \"$HOME/planted\"";
    let look = "ls /workspace /tmp \"$HOME\"";
    for round in 1..=2 {
        p.run_ok(&["exec", &golden.name, "sh", "-c", plant])?;
        let used = count_reaches(p, &golden.name, at_checkpoint + 40)?;
        p.run_ok(&["stop", "-t", "2", &golden.name])?;
        let mut args = flags.to_vec();
        args.extend([
            "container",
            "restore",
            "--keep",
            "--ignore-static-ip",
            &golden.name,
        ]);
        p.run_ok(&args)?;
        let seen = p.run_ok(&["exec", &golden.name, "sh", "-c", look])?;
        ensure!(
            !seen.stdout.contains("planted") && seen.stdout.contains("notes.txt"),
            "round {round}: the recycled sandbox is not the golden one\n{seen}"
        );
        let resumed = count(p, &golden.name)?;
        ensure!(
            resumed + 15 < used && resumed + 10 > at_checkpoint,
            "round {round}: the count did not resume from the checkpoint's {at_checkpoint} \
             (it was {used} before the reset, {resumed} after)"
        );
        count_reaches(p, &golden.name, resumed + 1)?;
        let restored = records(&id, "restored")?;
        ensure!(
            restored.len() == round && restored[round - 1]["data"]["image_digest"] == digest,
            "round {round}: the restored record does not name the checkpoint's digest {digest}\n{restored:?}"
        );
        harness::runtime_ok(&["audit", "verify", &id])?;
    }
    Ok(())
}
