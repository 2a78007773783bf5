//! The generated AppArmor profiles compile with the real `apparmor_parser` (Debian package
//! `apparmor`). This kernel has no AppArmor, so `-Q` (no load) and `-K` (no cache): the
//! parser still checks syntax and compiles the rules. A missing parser fails the test.

use std::path::Path;
use std::process::Command;

use agent_sandbox_policy::SandboxPolicy;
use agent_sandbox_policy::apparmor;

/// `apparmor_parser` lives in /usr/sbin, which a non-login PATH may lack.
fn parser() -> String {
    ["/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"]
        .iter()
        .find(|p| Path::new(p).exists())
        .map_or_else(|| "apparmor_parser".to_owned(), |p| (*p).to_owned())
}

fn parse(profile_text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("profile");
    std::fs::write(&file, profile_text).unwrap();
    let parser = parser();
    let out = Command::new(&parser)
        .args(["-Q", "-K"])
        .arg(Path::new(&file))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {parser} ({e}): install the Debian package `apparmor` (hack/install-deps.sh)")
        });
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn builtin_profiles_compile_with_apparmor_parser() {
    for name in agent_sandbox_policy::builtin_names() {
        let policy = SandboxPolicy::builtin(name).unwrap();
        let text = apparmor::profile(&policy, name);
        let (ok, stderr) = parse(&text);
        assert!(
            ok,
            "{name}: apparmor_parser rejected the profile:\n{stderr}"
        );
        assert!(text.contains(&format!("profile agent-sandbox-{name} ")));
    }
}

#[test]
fn the_parser_really_rejects_a_broken_profile() {
    // Proves the check above can fail: the same profile with one broken rule.
    let policy = SandboxPolicy::builtin("agent").unwrap();
    let text = apparmor::profile(&policy, "agent").replace("deny ptrace,", "deny ptrace, bogus");
    let (ok, stderr) = parse(&text);
    assert!(!ok, "a broken profile was accepted");
    assert!(stderr.contains("syntax error"), "{stderr}");
}

#[test]
fn profile_has_the_required_denials() {
    let policy = SandboxPolicy::builtin("agent").unwrap();
    let text = apparmor::profile(&policy, "agent");
    for rule in [
        "deny mount,",
        "deny umount,",
        "deny pivot_root,",
        "deny ptrace,",
        "deny network inet raw,",
        "deny network inet6 raw,",
        "deny network packet,",
        "deny /proc/sys/** wl,",
        "deny /sys/** wl,",
        "deny capability,",
        "deny \"/workspace/.git/hooks/**\" wl,",
        "deny \"/workspace/**/.bashrc\" wl,",
        "deny \"/home/**/.ssh/**\" wl,",
        "\"/workspace/**\" rwlk,",
    ] {
        assert!(text.contains(rule), "missing `{rule}`");
    }
    // Writes are granted only under writable paths.
    for line in text.lines().map(str::trim) {
        if line.ends_with("rwlk,") {
            let path = line.trim_end_matches(" rwlk,").trim_matches('"');
            assert!(
                policy
                    .filesystem
                    .writable_paths()
                    .iter()
                    .any(|w| path.starts_with(&format!("{w}/"))),
                "write granted outside writable paths: {line}"
            );
        }
    }
}

#[test]
fn odd_characters_in_paths_are_escaped() {
    let policy =
        SandboxPolicy::parse("[filesystem]\nworkspace = \"/work{a,b}*\"\n", "test.toml").unwrap();
    let text = apparmor::profile(&policy, "/etc/agent sandbox/odd.toml");
    assert!(text.contains("profile agent-sandbox-_etc_agent_sandbox_odd.toml "));
    assert!(text.contains(r#""/work\{a,b\}\*/**" rwlk,"#), "{text}");
    let (ok, stderr) = parse(&text);
    assert!(ok, "{stderr}");
}

#[test]
fn loaded_profiles_compile_with_apparmor_parser() {
    // The text the runtime hands to `apparmor_parser -r` on a host with AppArmor.
    for name in agent_sandbox_policy::builtin_names() {
        let loaded = apparmor::loaded_profile(&SandboxPolicy::builtin(name).unwrap());
        let (ok, stderr) = parse(&loaded.text);
        assert!(ok, "{name} ({}): {stderr}", loaded.name);
    }
}
