//! The Landlock ruleset data, applied with the real `landlock` crate on this kernel
//! (ABI 7), does what it says: writes only in writable paths, TCP connect only to the
//! proxy port. The same probes run once without the ruleset to show they can succeed.
//!
//! The test re-executes its own binary as a child (selected by `POLICY_LANDLOCK_CHILD`);
//! the child applies the ruleset (or not) and prints one `PROBE name outcome` line per
//! attempt. Landlock cannot be lifted once applied, hence the child process.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::landlock::{CoverFacts, at_abi, ruleset};
use landlock::{
    CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
};

const CHILD_ENV: &str = "POLICY_LANDLOCK_CHILD";
const TEST_NAME: &str = "suite::landlock::landlock_ruleset_enforces_writes_and_tcp";

fn policy(writable: &Path, proxy_port: u16) -> SandboxPolicy {
    let text = format!(
        "[filesystem]\nscratch = [{{ path = \"{}\", size = \"1M\" }}]\n\
         [network]\nmode = \"proxy\"\nproxy_port = {proxy_port}\nallow = [\"example.com\"]\n",
        writable.display()
    );
    SandboxPolicy::parse(&text, "landlock-test.toml").unwrap()
}

fn outcome<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("err:{}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn child(apply: bool, writable: &str, other: &str, proxy: u16, other_port: u16) -> ! {
    if apply {
        // The rights of ABI 7 (the crate has no UDP rights; this kernel has no ABI 9).
        let full = ruleset(&policy(Path::new(writable), proxy));
        let rs = at_abi(&full, 7, &CoverFacts::default()).ruleset;
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(rs.handled_fs_flags())
            .unwrap()
            .handle_access(rs.handled_net_flags())
            .unwrap()
            .create()
            .unwrap();
        for rule in &rs.paths {
            created = created
                .add_rule(PathBeneath::new(
                    PathFd::new(&rule.path).unwrap(),
                    rule.flags(),
                ))
                .unwrap();
        }
        for rule in &rs.net {
            created = created
                .add_rule(NetPort::new(rule.port, rule.flags()))
                .unwrap();
        }
        created.restrict_self().unwrap();
    }
    // Distinct names per run, so the control run's files do not collide.
    let (f, d) = if apply { ("f-ll", "d-ll") } else { ("f", "d") };
    let shm = format!("/dev/shm/policy-landlock-{f}-{}", std::process::id());
    let probes = [
        (
            "write_writable",
            outcome(std::fs::write(Path::new(writable).join(f), b"x")),
        ),
        (
            "write_other",
            outcome(std::fs::write(Path::new(other).join(f), b"x")),
        ),
        (
            "mkdir_other",
            outcome(std::fs::create_dir(Path::new(other).join(d))),
        ),
        ("read_etc", outcome(std::fs::read("/etc/passwd"))),
        ("create_dev_shm", outcome(std::fs::write(&shm, b"x"))),
        (
            "truncate_proc_comm",
            outcome(
                std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open("/proc/thread-self/comm")
                    .and_then(|mut c| c.write_all(b"probe")),
            ),
        ),
        ("write_dev_null", outcome(std::fs::write("/dev/null", b"x"))),
        (
            "connect_proxy",
            outcome(TcpStream::connect(("127.0.0.1", proxy))),
        ),
        (
            "connect_other",
            outcome(TcpStream::connect(("127.0.0.1", other_port))),
        ),
    ];
    // Landlock allows removing it again (RemoveFile in /dev/shm).
    let _ = std::fs::remove_file(&shm);
    let mut out = std::io::stdout().lock();
    for (name, result) in probes {
        writeln!(out, "PROBE {name} {result}").unwrap();
    }
    out.flush().unwrap();
    std::process::exit(0);
}

fn run(
    apply: bool,
    writable: &Path,
    other: &Path,
    proxy: u16,
    other_port: u16,
) -> Vec<(String, String)> {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!(
                "{}|{}|{}|{proxy}|{other_port}",
                if apply { "apply" } else { "none" },
                writable.display(),
                other.display()
            ),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        // The harness prints `test NAME ... ` without a newline before the first probe.
        .filter_map(|l| l.find("PROBE ").map(|i| &l[i + 6..]))
        .filter_map(|l| l.split_once(' '))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
}

#[test]
fn landlock_ruleset_enforces_writes_and_tcp() {
    if let Ok(args) = std::env::var(CHILD_ENV) {
        let parts: Vec<&str> = args.split('|').collect();
        child(
            parts[0] == "apply",
            parts[1],
            parts[2],
            parts[3].parse().unwrap(),
            parts[4].parse().unwrap(),
        );
    }
    let writable = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let (pp, op) = (
        proxy.local_addr().unwrap().port(),
        other_listener.local_addr().unwrap().port(),
    );

    let without = run(false, writable.path(), other.path(), pp, op);
    let with = run(true, writable.path(), other.path(), pp, op);
    let get = |v: &[(String, String)], k: &str| {
        v.iter()
            .find(|(n, _)| n == k)
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("probe {k} missing: {v:?}"))
    };
    // Control: without Landlock every probe gets through.
    for probe in [
        "write_writable",
        "write_other",
        "mkdir_other",
        "read_etc",
        "create_dev_shm",
        "truncate_proc_comm",
        "write_dev_null",
        "connect_proxy",
        "connect_other",
    ] {
        assert_eq!(get(&without, probe), "ok", "control {probe}");
    }
    // With the ruleset: EACCES (13) outside writable paths and on other ports.
    assert_eq!(get(&with, "write_writable"), "ok");
    assert_eq!(get(&with, "write_other"), "err:13");
    assert_eq!(get(&with, "mkdir_other"), "err:13");
    assert_eq!(get(&with, "read_etc"), "ok");
    assert_eq!(get(&with, "create_dev_shm"), "ok");
    assert_eq!(get(&with, "truncate_proc_comm"), "ok");
    assert_eq!(get(&with, "write_dev_null"), "ok");
    assert_eq!(get(&with, "connect_proxy"), "ok");
    assert_eq!(get(&with, "connect_other"), "err:13");
}
