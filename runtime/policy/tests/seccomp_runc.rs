//! Hands the generated OCI seccomp JSON to real runc and shows it is enforced.
//!
//! A busybox bundle runs the same script three times: without `linux.seccomp`, and with the
//! JSON from `oci_seccomp_json` for `errno = "EPERM"` and `errno = "EACCES"`. The script
//! tries `unshare -U` and `unshare -U -n` (must fail with the configured errno under the filter,
//! and succeed without it) and runs a normal workload: ls, cat, and wget against busybox
//! httpd on the container's own loopback.
#![allow(clippy::too_many_lines)]
// a test may be a long scenario
// A test binary: a failed set-up step must stop the test loudly, in helpers too.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use agent_sandbox_policy::seccomp::{DenyErrno, SyscallPolicy, oci_seccomp_json};
use serde_json::Value;

const BUSYBOX: &str = "/bin/busybox";
const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "grep", "unshare", "httpd", "wget", "sleep", "echo", "kill",
];
const SCRIPT: &str = r#"
grep -E '^Seccomp:' /proc/self/status
unshare -U true 2>/tmp/err && echo USERNS-ALLOWED || { echo USERNS-BLOCKED; cat /tmp/err; }
unshare -U -n true 2>/tmp/err && echo NETNS-ALLOWED || { echo NETNS-BLOCKED; cat /tmp/err; }
ls -l / >/dev/null && echo LS-OK
cat /www/index.html
httpd -p 127.0.0.1:8080 -h /www
sleep 0.2
wget -q -O - http://127.0.0.1:8080/index.html
"#;
const PAGE: &str = "served by busybox httpd under the OCI filter\n";

fn runc() -> &'static str {
    for candidate in ["/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc"] {
        if Path::new(candidate).is_file() {
            return candidate;
        }
    }
    panic!("runc is missing: install the Debian package runc (hack/install-deps.sh)");
}

fn bundle(dir: &Path, seccomp: Option<Value>) -> PathBuf {
    let bundle = dir.join(match &seccomp {
        Some(v) => format!("filtered-{}", v["defaultErrnoRet"]),
        None => "unfiltered".to_owned(),
    });
    let rootfs = bundle.join("rootfs");
    for sub in ["bin", "proc", "dev", "tmp", "www", "sys"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("www/index.html"), PAGE).unwrap();
    let spec = Command::new(runc())
        .args(["spec", "--bundle"])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(spec.status.success(), "runc spec: {spec:?}");
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = Value::Bool(false);
    config["process"]["args"] = serde_json::json!(["sh", "-c", SCRIPT]);
    config["root"]["readonly"] = Value::Bool(true);
    config["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}));
    if let Some(seccomp) = seccomp {
        config["linux"]["seccomp"] = seccomp;
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    bundle
}

fn run(dir: &Path, bundle: &Path, id: &str) -> String {
    let out = Command::new(runc())
        .arg("--root")
        .arg(dir.join("state"))
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "runc run {id}: {}\n{text}",
        out.status
    );
    text
}

fn json_for(errno: DenyErrno) -> Value {
    let policy = SyscallPolicy {
        errno,
        ..SyscallPolicy::default()
    };
    serde_json::from_str(&oci_seccomp_json(&policy).unwrap()).unwrap()
}

#[test]
fn oci_json_is_enforced_by_runc() {
    assert!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing: install the Debian package busybox-static (hack/install-deps.sh)"
    );
    // Rootful runc needs host root.
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .map(|r| r.split_whitespace().next().map(str::to_owned))
        })
        .flatten()
        .unwrap();
    assert_eq!(
        uid, "0",
        "this test drives rootful runc and must run as root"
    );

    let dir = std::env::temp_dir().join(format!("seccomp-runc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let id = |tag: &str| format!("seccomp-oci-{}-{tag}", std::process::id());

    let open = run(&dir, &bundle(&dir, None), &id("open"));
    let eperm = run(
        &dir,
        &bundle(&dir, Some(json_for(DenyErrno::Eperm))),
        &id("eperm"),
    );
    let eacces = run(
        &dir,
        &bundle(&dir, Some(json_for(DenyErrno::Eacces))),
        &id("eacces"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!("unfiltered:\n{open}\nEPERM:\n{eperm}\nEACCES:\n{eacces}");

    // Without the filter the namespace attacks work: the probe can tell the difference.
    assert!(open.contains("Seccomp:\t0"), "{open}");
    assert!(open.contains("USERNS-ALLOWED"), "{open}");
    assert!(open.contains("NETNS-ALLOWED"), "{open}");

    for (out, message) in [
        (&eperm, "Operation not permitted"),
        (&eacces, "Permission denied"),
    ] {
        assert!(out.contains("Seccomp:\t2"), "{out}");
        assert!(out.contains("USERNS-BLOCKED"), "{out}");
        assert!(out.contains("NETNS-BLOCKED"), "{out}");
        assert!(
            out.contains(message),
            "denials must carry the configured errno: {out}"
        );
    }
    for out in [&open, &eperm, &eacces] {
        assert!(out.contains("LS-OK"), "{out}");
        assert_eq!(
            out.matches(PAGE.trim_end()).count(),
            2,
            "cat and wget: {out}"
        );
    }
}
