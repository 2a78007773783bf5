//! The hash-chained log: chain, tampering, concurrency, SIGKILL, ENOSPC, torn tails.

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_sandbox_audit::{
    AuditError, AuditLog, Broken, Capped, Event, ExitStatus, Record, Verdict, genesis,
    read_records, render_timeline, repair_torn_tail, verify, verify_with_anchor,
};
use anyhow::{Result, bail};
use sha2::{Digest as _, Sha256};

use super::mounts::Mounted;

const CLI: &str = env!("CARGO_BIN_EXE_agent-sandbox-audit");

fn sample(i: u64) -> Event {
    match i % 6 {
        0 => Event::Create {
            policy_digest: format!("sha256:{i:064x}"),
            layers_active: vec!["userns".into(), "seccomp".into()],
            layers_inactive: vec!["apparmor".into()],
        },
        1 => Event::exec(
            vec!["sh".into(), "-c".into(), format!("echo {i}")],
            &["PATH=/bin".into(), "API_KEY=hunter2".into()],
            "/work",
            0,
            Some(format!("toolu_{i}")),
            Some(format!("exec-{i}")),
        ),
        2 => Event::Net {
            verdict: if i.is_multiple_of(4) {
                Verdict::Allow
            } else {
                Verdict::Deny
            },
            rule: "allow pypi.org".into(),
            host: "pypi.org".into(),
            port: 443,
            bytes_up: i,
            bytes_down: 2 * i,
            duration_ms: 7,
            method: None,
            path: None,
            sni: None,
            suppressed: 0,
            credential: None,
            tool_call_id: None,
            tool_call_claimed: None,
            container: None,
        },
        3 => Event::SyscallDenied {
            syscall: "ptrace".into(),
            nr: 101,
            pid: 4242,
            comm: "probe".into(),
            exe: Some("/usr/local/bin/probe".into()),
            errno: Some(1),
            suppressed: 0,
        },
        4 => Event::Exit {
            status: ExitStatus::Signal(9),
            oom: true,
            tool_call_id: None,
            process: Some("init".into()),
            pid: Some(4242),
            reaped_by: None,
            cause: None,
        },
        _ => Event::FsDenied {
            path: "/work/.bashrc".into(),
            access: "write_file".into(),
            pid: Some(7),
            comm: None,
            exe: None,
            syscall: Some("openat".into()),
            domain: Some("1a6fdc66f".into()),
            suppressed: 0,
        },
    }
}

fn write_log(path: &Path, sandbox: &str, n: u64) -> Result<Vec<Record>> {
    let log = AuditLog::open(path, sandbox)?;
    (0..n).map(|i| Ok(log.append(&sample(i))?.record)).collect()
}

fn lines(path: &Path) -> Result<Vec<String>> {
    Ok(fs::read_to_string(path)?
        .lines()
        .map(str::to_owned)
        .collect())
}

fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut s = lines.join("\n");
    s.push('\n');
    fs::write(path, s)?;
    Ok(())
}

fn broken(path: &Path) -> Result<(u64, u64, Broken)> {
    match verify(path) {
        Err(AuditError::Broken {
            line,
            verified,
            problem,
            ..
        }) => Ok((line, verified, problem)),
        other => bail!("expected a broken chain, got {other:?}"),
    }
}

fn sha_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[test]
fn chain_of_records_verifies_and_links_each_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("audit.jsonl");
    let written = write_log(&path, "sb-chain", 60)?;
    let report = verify(&path)?;
    assert_eq!(report.records, 60);
    let ls = lines(&path)?;
    assert_eq!(ls.len(), 60);
    assert_eq!(written[0].prev, genesis("sb-chain"));
    for i in 1..ls.len() {
        assert_eq!(
            written[i].prev,
            sha_hex(ls[i - 1].as_bytes()),
            "line {}",
            i + 1
        );
        assert_eq!(written[i].seq, i as u64 + 1);
    }
    assert_eq!(report.head, sha_hex(ls[59].as_bytes()));
    // Read back equals what append returned.
    assert_eq!(read_records(&path)?, written);
    // Env values never reach the log.
    let text = fs::read_to_string(&path)?;
    assert!(text.contains("\"env_keys\":[\"PATH\",\"API_KEY\"]"));
    assert!(!text.contains("hunter2") && !text.contains("/bin\""));
    Ok(())
}

#[test]
fn edited_byte_is_reported_on_its_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 12)?;
    let mut ls = lines(&path)?;
    // Line 8 is an exec (i = 7): change "echo 7" to "echo 8", one byte.
    assert!(ls[7].contains("echo 7"));
    ls[7] = ls[7].replace("echo 7", "echo 8");
    write_lines(&path, &ls)?;
    let (line, verified, problem) = broken(&path)?;
    assert_eq!((line, verified), (8, 7));
    assert!(
        matches!(problem, Broken::HashMismatch { .. }),
        "{problem:?}"
    );
    Ok(())
}

#[test]
fn edited_hash_and_content_together_break_the_next_line() -> Result<()> {
    // An editor who also recomputes the edited line's own hash is caught by the next prev.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 6)?;
    let mut ls = lines(&path)?;
    let edited = ls[2].replace("\"port\":443", "\"port\":444");
    let body_end = edited.rfind(",\"hash\":\"").unwrap_or(0);
    let new_hash = sha_hex(format!("{}}}", &edited[..body_end]).as_bytes());
    ls[2] = format!("{},\"hash\":\"{new_hash}\"}}", &edited[..body_end]);
    write_lines(&path, &ls)?;
    let (line, verified, problem) = broken(&path)?;
    assert_eq!((line, verified), (4, 3));
    assert!(
        matches!(problem, Broken::PrevMismatch { .. }),
        "{problem:?}"
    );
    Ok(())
}

#[test]
fn dropped_line_is_reported() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 10)?;
    let mut ls = lines(&path)?;
    ls.remove(4);
    write_lines(&path, &ls)?;
    let (line, verified, problem) = broken(&path)?;
    assert_eq!((line, verified), (5, 4));
    assert_eq!(
        problem,
        Broken::SeqMismatch {
            expected: 5,
            found: 6
        }
    );
    Ok(())
}

#[test]
fn dropped_first_line_is_reported() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 3)?;
    let ls = lines(&path)?;
    write_lines(&path, &ls[1..])?;
    let (line, _, problem) = broken(&path)?;
    assert_eq!(line, 1);
    assert_eq!(
        problem,
        Broken::SeqMismatch {
            expected: 1,
            found: 2
        }
    );
    Ok(())
}

#[test]
fn swapped_lines_are_reported() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 10)?;
    let mut ls = lines(&path)?;
    ls.swap(3, 4);
    write_lines(&path, &ls)?;
    let (line, verified, problem) = broken(&path)?;
    assert_eq!((line, verified), (4, 3));
    assert_eq!(
        problem,
        Broken::SeqMismatch {
            expected: 4,
            found: 5
        }
    );
    Ok(())
}

#[test]
fn inserted_line_is_reported() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 6)?;
    let mut ls = lines(&path)?;
    let copy = ls[1].clone();
    ls.insert(3, copy);
    write_lines(&path, &ls)?;
    let (line, _, problem) = broken(&path)?;
    assert_eq!(line, 4);
    assert_eq!(
        problem,
        Broken::SeqMismatch {
            expected: 4,
            found: 2
        }
    );
    Ok(())
}

/// Builds a line the way a forger who knows the format would.
fn forge(seq: u64, sandbox: &str, prev: &str, kind_data: &str) -> String {
    let body = format!(
        "{{\"v\":1,\"seq\":{seq},\"time\":\"2026-11-22T00:00:00.000000000Z\",\"sandbox\":\"{sandbox}\",{kind_data},\"prev\":\"{prev}\"}}"
    );
    let hash = sha_hex(body.as_bytes());
    format!("{},\"hash\":\"{hash}\"}}", &body[..body.len() - 1])
}

#[test]
fn appended_forged_lines_are_reported() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 5)?;
    let genuine = lines(&path)?;
    let exit = "\"kind\":\"exit\",\"data\":{\"status\":{\"code\":0},\"oom\":false}";

    // A replayed genuine line.
    let mut ls = genuine.clone();
    ls.push(genuine[2].clone());
    write_lines(&path, &ls)?;
    assert_eq!(broken(&path)?.0, 6);

    // A hand-written line without a valid hash.
    let mut ls = genuine.clone();
    ls.push(
        forge(6, "sb", &sha_hex(genuine[4].as_bytes()), exit).replace("\"code\":0", "\"code\":1"),
    );
    write_lines(&path, &ls)?;
    let (line, _, problem) = broken(&path)?;
    assert_eq!(line, 6);
    assert!(
        matches!(problem, Broken::HashMismatch { .. }),
        "{problem:?}"
    );

    // A self-consistent line that chains to the wrong predecessor.
    let mut ls = genuine.clone();
    ls.push(forge(6, "sb", &sha_hex(genuine[3].as_bytes()), exit));
    write_lines(&path, &ls)?;
    let (line, _, problem) = broken(&path)?;
    assert_eq!(line, 6);
    assert!(
        matches!(problem, Broken::PrevMismatch { .. }),
        "{problem:?}"
    );

    // A line for another sandbox.
    let mut ls = genuine.clone();
    ls.push(forge(6, "other", &sha_hex(genuine[4].as_bytes()), exit));
    write_lines(&path, &ls)?;
    let (line, _, problem) = broken(&path)?;
    assert_eq!(line, 6);
    assert!(
        matches!(problem, Broken::SandboxMismatch { .. }),
        "{problem:?}"
    );

    // A perfect forgery (keyless chain) verifies on its own, but not against the head the
    // runtime kept from the genuine log: that is what VerifyReport::head is for.
    write_lines(&path, &genuine)?;
    let anchored = verify(&path)?.head;
    let mut ls = genuine.clone();
    ls.push(forge(6, "sb", &sha_hex(genuine[4].as_bytes()), exit));
    write_lines(&path, &ls)?;
    let forged = verify(&path)?;
    assert_eq!(forged.records, 6);
    assert_ne!(forged.head, anchored);
    Ok(())
}

#[test]
fn torn_tail_is_reported_refused_and_repaired_explicitly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 3)?;
    let clean_len = fs::metadata(&path)?.len();
    let fragment = b"{\"v\":1,\"seq\":4,\"time\":\"2026";
    fs::OpenOptions::new()
        .append(true)
        .open(&path)?
        .write_all(fragment)?;

    let (line, verified, problem) = broken(&path)?;
    assert_eq!((line, verified), (4, 3));
    assert_eq!(
        problem,
        Broken::TornLine {
            bytes: fragment.len() as u64
        }
    );

    let log = AuditLog::open(&path, "sb")?;
    match log.append(&Event::Delete {}) {
        Err(AuditError::TornTail {
            line,
            offset,
            bytes,
            ..
        }) => assert_eq!((line, offset, bytes), (4, clean_len, fragment.len() as u64)),
        other => bail!("expected TornTail, got {other:?}"),
    }
    assert_eq!(
        fs::metadata(&path)?.len(),
        clean_len + fragment.len() as u64
    );

    let cut = repair_torn_tail(&path)?;
    let cut = cut.ok_or_else(|| anyhow::anyhow!("nothing cut"))?;
    assert_eq!(
        (cut.line, cut.offset, cut.fragment.as_slice()),
        (4, clean_len, &fragment[..])
    );
    assert_eq!(repair_torn_tail(&path)?, None);
    log.append(&Event::Delete {})?;
    assert_eq!(verify(&path)?.records, 4);
    Ok(())
}

#[test]
fn writer_refuses_wrong_sandbox_values_and_symlinks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb-a", 2)?;
    let other = AuditLog::open(&path, "sb-b")?;
    assert!(matches!(
        other.append(&Event::Delete {}),
        Err(AuditError::SandboxMismatch { .. })
    ));
    let log = AuditLog::open(&path, "sb-a")?;
    let leaky = Event::Exec {
        argv: vec!["env".into()],
        env_keys: vec!["TOKEN=abc".into()],
        cwd: "/".into(),
        uid: 0,
        tool_call_id: None,
        process: None,
    };
    let err = log
        .append(&leaky)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("TOKEN") && !err.contains("abc"), "{err}");
    assert!(matches!(
        AuditLog::open(&path, ""),
        Err(AuditError::InvalidSandboxId { .. })
    ));
    // A symlink planted at the log path is not followed.
    let victim = dir.path().join("victim");
    fs::write(&victim, "keep")?;
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link)?;
    assert!(matches!(
        AuditLog::open(&link, "sb-a"),
        Err(AuditError::Open { .. })
    ));
    assert_eq!(fs::read_to_string(&victim)?, "keep");
    assert_eq!(verify(&path)?.records, 2);
    Ok(())
}

fn event_json(tag: &str) -> String {
    format!(
        "{{\"kind\":\"exec\",\"data\":{{\"argv\":[\"w\"],\"env_keys\":[],\"cwd\":\"/\",\"uid\":0,\"tool_call_id\":\"{tag}\"}}}}"
    )
}

#[test]
fn concurrent_appends_from_processes_stay_linear() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    let per = 60u64;
    let children: Vec<_> = (0..5)
        .map(|i| {
            Command::new(CLI)
                .args(["append", &path.to_string_lossy(), "--sandbox", "sb-conc"])
                .args([
                    "--event",
                    &event_json(&format!("w{i}")),
                    "--count",
                    &per.to_string(),
                ])
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for c in children {
        let out = c.wait_with_output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report = verify(&path)?;
    assert_eq!(report.records, 5 * per);
    let records = read_records(&path)?;
    for i in 0..5 {
        let n = records
            .iter()
            .filter(|r| matches!(&r.event, Event::Exec { tool_call_id: Some(t), .. } if *t == format!("w{i}")))
            .count();
        assert_eq!(n as u64, per, "writer w{i}");
    }
    // The writers really interleaved (otherwise the lock was never contended).
    let switches = records
        .windows(2)
        .filter(|w| w[0].event != w[1].event)
        .count();
    assert!(
        switches > 4,
        "writers did not interleave ({switches} switches)"
    );
    Ok(())
}

#[test]
fn sigkilled_writer_leaves_a_log_that_verifies() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    for round in 0..3 {
        let mut child = Command::new(CLI)
            .args(["append", &path.to_string_lossy(), "--sandbox", "sb-kill"])
            .args(["--event", &event_json("loop"), "--count", "1000000"])
            .spawn()?;
        let before = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::metadata(&path).map(|m| m.len()).unwrap_or(0) < before + 20_000 {
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("writer made no progress");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id())?),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        let status = child.wait()?;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        let report = verify(&path)?;
        assert!(report.records > 20, "round {round}: {report:?}");
        // And the next writer chains on.
        AuditLog::open(&path, "sb-kill")?.append(&Event::Delete {})?;
        assert_eq!(verify(&path)?.records, report.records + 1);
    }
    Ok(())
}

#[test]
fn full_disk_is_a_clear_error_and_the_log_still_verifies() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mnt = dir.path().join("tiny");
    fs::create_dir(&mnt)?;
    let mut m = Mounted::tmpfs(&mnt, "64k")?;
    let path = mnt.join("a.jsonl");
    let log = AuditLog::open(&path, "sb-full")?;
    for i in 0..5 {
        log.append(&sample(i))?;
    }
    // Fill the filesystem.
    let mut filler = fs::File::create(mnt.join("filler"))?;
    let chunk = vec![0x5a_u8; 4096];
    loop {
        match filler.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(e.into()),
        }
    }
    drop(filler);
    // Appends may still fit in the log's last page; keep going until the disk refuses.
    let mut ok = 5u64;
    let err = loop {
        let len_before = fs::metadata(&path)?.len();
        match log.append(&sample(ok)) {
            Ok(_) => ok += 1,
            Err(e) => break (e, len_before),
        }
        if ok > 500 {
            bail!("a 64k tmpfs never filled up");
        }
    };
    let (e, len_before) = err;
    let msg = format!("{e}");
    match &e {
        AuditError::Write {
            source, path: p, ..
        } => {
            assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "{e:?}");
            assert_eq!(p, &path);
        }
        other => bail!("expected a write error, got {other:?}"),
    }
    assert!(msg.contains("a.jsonl"), "{msg}");
    // Nothing half-written: the log is exactly as before and verifies. (strace shows the
    // last write here is usually short, e.g. 61 of 408 bytes, then ENOSPC: the rollback path.)
    assert_eq!(fs::metadata(&path)?.len(), len_before);
    assert_eq!(verify(&path)?.records, ok);
    // A batch fails as a whole.
    let batch: Vec<Event> = (0..20).map(sample).collect();
    assert!(matches!(
        log.append_all(&batch),
        Err(AuditError::Write { .. })
    ));
    assert_eq!(fs::metadata(&path)?.len(), len_before);
    assert_eq!(verify(&path)?.records, ok);
    // Space back: appends resume on the same chain.
    fs::remove_file(mnt.join("filler"))?;
    log.append(&Event::Delete {})?;
    assert_eq!(verify(&path)?.records, ok + 1);
    drop(log);
    m.unmount()?;
    Ok(())
}

#[test]
fn timeline_has_one_readable_line_per_record() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    write_log(&path, "sb", 6)?;
    let text = render_timeline(&read_records(&path)?);
    let ls: Vec<&str> = text.lines().collect();
    assert_eq!(ls.len(), 6);
    assert!(
        ls[0].contains("#1") && ls[0].contains("create") && ls[0].contains("INACTIVE: apparmor")
    );
    assert!(
        ls[1].contains("exec")
            && ls[1].contains("$ sh -c \"echo 1\"")
            && ls[1].contains("[tool call toolu_1]")
    );
    assert!(ls[2].contains("DENY pypi.org:443"));
    assert!(ls[3].contains("ptrace (nr 101) by pid 4242 (probe)"));
    assert!(ls[4].contains("killed by signal 9 (OOM)"));
    assert!(ls[5].contains("write_file \"/work/.bashrc\""));
    // The CLI's --json passes the lines through unchanged for jq.
    let out = Command::new(CLI)
        .args(["show", "--json", &path.to_string_lossy()])
        .output()?;
    assert!(out.status.success());
    assert_eq!(out.stdout, fs::read(&path)?);
    let out = Command::new(CLI)
        .args(["verify", &path.to_string_lossy()])
        .output()?;
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: 6 records"));
    Ok(())
}

#[test]
fn anchor_catches_cut_tail_and_rewritten_chain_that_plain_verify_accepts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    let log = AuditLog::open(&path, "sb")?;
    let mut anchors = Vec::new();
    for i in 0..8 {
        anchors.push(log.append(&sample(i))?.anchor);
    }
    assert_eq!(verify(&path)?.anchor(), anchors[7]);
    // The log may grow past an anchor.
    verify_with_anchor(&path, &anchors[4])?;
    let genuine = lines(&path)?;

    // Cut the last two records: the chain alone still verifies, the anchor does not.
    write_lines(&path, &genuine[..6])?;
    assert_eq!(verify(&path)?.records, 6);
    match verify_with_anchor(&path, &anchors[7]) {
        Err(AuditError::Broken {
            line: 7,
            problem:
                Broken::Truncated {
                    anchored: 8,
                    found: 6,
                },
            ..
        }) => {}
        other => bail!("expected Truncated, got {other:?}"),
    }

    // Rewrite from line 5 with a recomputed chain: consistent, but not the anchored line 5.
    let mut ls = genuine[..4].to_vec();
    let exit = "\"kind\":\"exit\",\"data\":{\"status\":{\"code\":0},\"oom\":false}";
    ls.push(forge(5, "sb", &sha_hex(ls[3].as_bytes()), exit));
    write_lines(&path, &ls)?;
    assert_eq!(verify(&path)?.records, 5);
    match verify_with_anchor(&path, &anchors[4]) {
        Err(AuditError::Broken {
            line: 5,
            problem: Broken::AnchorMismatch { .. },
            ..
        }) => {}
        other => bail!("expected AnchorMismatch, got {other:?}"),
    }
    // The CLI takes the anchor as SEQ:HEAD.
    let out = Command::new(CLI)
        .args(["verify", &path.to_string_lossy(), "--anchor"])
        .arg(format!("{}:{}", anchors[4].seq, anchors[4].head))
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 5: chain rewritten"));
    Ok(())
}

#[test]
fn batches_chain_like_single_appends_and_fail_as_a_whole() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    let log = AuditLog::open(&path, "sb")?;
    log.append(&sample(0))?;
    let batch: Vec<Event> = (1..40).map(sample).collect();
    let appended = log.append_all(&batch)?;
    assert_eq!(appended.len(), 39);
    assert_eq!(appended[0].record.seq, 2);
    log.append(&sample(40))?;
    let report = verify(&path)?;
    assert_eq!(report.records, 41);
    verify_with_anchor(&path, &appended[38].anchor)?;
    assert!(log.append_all(&[])?.is_empty());
    // One bad event refuses the whole batch and writes nothing.
    let len = fs::metadata(&path)?.len();
    let bad = Event::Exec {
        argv: vec![],
        env_keys: vec!["K=V".into()],
        cwd: "/".into(),
        uid: 0,
        tool_call_id: None,
        process: None,
    };
    assert!(log.append_all(&[sample(1), bad]).is_err());
    assert_eq!(fs::metadata(&path)?.len(), len);
    Ok(())
}

#[test]
fn verify_while_processes_append_sees_only_whole_records() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.jsonl");
    AuditLog::open(&path, "sb-live")?.append(&Event::Delete {})?;
    let mut children: Vec<_> = (0..3)
        .map(|i| {
            Command::new(CLI)
                .args(["append", &path.to_string_lossy(), "--sandbox", "sb-live"])
                .args(["--event", &event_json(&format!("live{i}"))])
                .args(["--count", "1800", "--batch", "60"])
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut checks = 0;
    let mut last = 0;
    while children
        .iter_mut()
        .any(|c| matches!(c.try_wait(), Ok(None)))
    {
        let r = verify(&path)?;
        assert!(r.records >= last, "log shrank");
        last = r.records;
        checks += 1;
    }
    for mut c in children {
        assert!(c.wait()?.success());
    }
    assert_eq!(verify(&path)?.records, 1 + 3 * 1800);
    assert!(
        checks > 3,
        "only {checks} verifications overlapped the writers"
    );
    Ok(())
}

/// A flood of capped records stops at the cap with one `truncated` record that is part of
/// the chain; lifecycle records still follow and the log verifies. Without the cap the same
/// flood grows the log past it (so the test can fail).
#[test]
fn a_capped_log_ends_with_one_verifiable_truncated_record() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let flood = |i: u64| Event::Net {
        verdict: Verdict::Deny,
        rule: "default deny".into(),
        host: format!("h{i}.example"),
        port: 443,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        method: Some("GET".into()),
        path: Some(format!("/{i}")),
        sni: None,
        suppressed: 0,
        credential: None,
        tool_call_id: None,
        tool_call_claimed: None,
        container: None,
    };
    const CAP: u64 = 8192;

    let uncapped = dir.path().join("uncapped.jsonl");
    let log = AuditLog::open(&uncapped, "sb")?;
    for i in 0..200 {
        log.append(&flood(i))?;
    }
    assert!(fs::metadata(&uncapped)?.len() > 4 * CAP);

    let path = dir.path().join("capped.jsonl");
    let log = AuditLog::open(&path, "sb")?;
    let (mut written, mut truncated, mut dropped) = (0, 0, 0);
    for i in 0..200 {
        match log.append_capped(&flood(i), CAP)? {
            Capped::Written(_) => written += 1,
            Capped::Truncated(_) => truncated += 1,
            Capped::Dropped => dropped += 1,
        }
    }
    assert!(written > 0 && written < 200, "{written} written");
    assert_eq!(truncated, 1);
    assert_eq!(written + truncated + dropped, 200);
    let size = fs::metadata(&path)?.len();
    assert!(size <= CAP + 512, "{size} bytes");
    log.append(&Event::Delete {})?;
    let report = verify(&path)?;
    assert_eq!(report.records, written + 2);
    assert_eq!(report.truncated, Some(written + 1));
    let records = read_records(&path)?;
    let marks: Vec<_> = records
        .iter()
        .filter(|r| matches!(r.event, Event::Truncated { .. }))
        .collect();
    assert_eq!(marks.len(), 1);
    match &marks[0].event {
        Event::Truncated {
            limit_bytes,
            dropped_kind,
            ..
        } => {
            assert_eq!(*limit_bytes, CAP);
            assert_eq!(dropped_kind, "net");
        }
        other => bail!("not a truncated record: {other:?}"),
    }
    assert!(matches!(
        records.last().map(|r| &r.event),
        Some(Event::Delete {})
    ));
    Ok(())
}
