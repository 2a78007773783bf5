//! The policy as an AppArmor profile (text for `apparmor_parser`). The runtime loads it
//! where the host has AppArmor; elsewhere Landlock carries the filesystem rules.
//!
//! The profile allows reading and executing everywhere and writing only in the writable
//! paths, and denies (deny rules win in AppArmor): writes to protected names inside those
//! paths, writes to /proc/sys and /sys, mount/umount/pivot_root, ptrace, raw and packet
//! sockets, and every capability.

use std::fmt::Write as _;

use crate::policy::SandboxPolicy;

/// The AppArmor profile name for a policy called `name`.
pub fn profile_name(name: &str) -> String {
    format!("agent-sandbox-{name}")
}

/// AppArmor path globs treat these characters specially; a policy path containing them
/// is quoted and escaped so it matches only itself.
/// `glob` is appended unescaped (`**`).
fn quote(path: &str, glob: &str) -> String {
    let mut out = String::with_capacity(path.len() + glob.len() + 2);
    out.push('"');
    for c in path.chars() {
        if matches!(
            c,
            '*' | '?' | '[' | ']' | '{' | '}' | '^' | '"' | '\\' | '@'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str(glob);
    out.push('"');
    out
}

/// `rel` may start with the glob `**/`; the rest is escaped, then `tail` appended.
fn glob_escape(rel: &str, tail: &str) -> String {
    let (glob, literal) = match rel.strip_prefix("**/") {
        Some(rest) => ("**/", rest),
        None => ("", rel),
    };
    let escaped = quote(literal, "");
    // `quote` adds the surrounding quotes; strip them to splice into another pattern.
    let inner = escaped.get(1..escaped.len() - 1).unwrap_or_default();
    format!("{glob}{inner}{tail}")
}

/// The profile text for `policy`, named [`profile_name`]`(name)`.
pub fn profile(policy: &SandboxPolicy, name: &str) -> String {
    let mut p = String::new();
    let profile = profile_name(name);
    let fs = &policy.filesystem;
    // `writeln!` into a String cannot fail; the results are ignored on purpose.
    let _ = writeln!(
        p,
        "# AppArmor profile for the agent-sandbox policy `{name}`.\n\
         # Generated from profiles/{name}.toml by agent-sandbox-policy; do not edit.\n\
         abi <abi/3.0>,\n\
         \n\
         profile {profile} flags=(attach_disconnected,mediate_deleted) {{"
    );
    p.push_str(
        "  # Read, map and execute everywhere; the root filesystem is also mounted read-only.\n\
         \x20 /** mrix,\n\
         \x20 / r,\n\
         \n\
         \x20 # Terminals, /dev/null and friends (the device cgroup limits which exist).\n\
         \x20 /dev/** rw,\n\
         \x20 # A process's own /proc files (oom_score_adj, comm, attr).\n\
         \x20 owner /proc/[0-9]*/** w,\n\
         \n\
         \x20 # Writable paths.\n",
    );
    for path in fs.writable_paths() {
        let _ = writeln!(p, "  {} rwlk,", quote(&format!("{path}/"), ""));
        let _ = writeln!(p, "  {} rwlk,", quote(&format!("{path}/"), "**"));
    }
    p.push_str(
        "\n  # Protected names stay read-only inside the writable paths, at any depth\n\
         \x20 # (a nested checkout's .git/hooks too), as files or as directories.\n",
    );
    for path in fs.writable_paths() {
        let base = format!("{path}/");
        for name in fs.protected_names() {
            for depth in ["", "**/"] {
                let target = format!("{depth}{}", name.as_str());
                let _ = writeln!(p, "  deny {} wl,", quote(&base, &glob_escape(&target, "")));
                let _ = writeln!(
                    p,
                    "  deny {} wl,",
                    quote(&base, &glob_escape(&target, "/**"))
                );
            }
        }
    }
    p.push_str(
        "\n  # Kernel settings and devices.\n\
         \x20 deny /proc/sys/** wl,\n\
         \x20 deny /proc/sysrq-trigger rwl,\n\
         \x20 deny /proc/kcore rwl,\n\
         \x20 deny /sys/** wl,\n\
         \n\
         \x20 # Filesystem topology, tracing, privileges.\n\
         \x20 deny mount,\n\
         \x20 deny umount,\n\
         \x20 deny pivot_root,\n\
         \x20 deny ptrace,\n\
         \x20 deny capability,\n\
         \n\
         \x20 # Network: stream and datagram sockets only (the network namespace and the\n\
         \x20 # proxy decide where they go); no raw or packet sockets.\n\
         \x20 network inet stream,\n\
         \x20 network inet6 stream,\n\
         \x20 network inet dgram,\n\
         \x20 network inet6 dgram,\n\
         \x20 network unix,\n\
         \x20 # NETLINK_ROUTE (getaddrinfo, getifaddrs); seccomp refuses other netlink families.\n\
         \x20 network netlink raw,\n\
         \x20 network netlink dgram,\n\
         \x20 deny network inet raw,\n\
         \x20 deny network inet6 raw,\n\
         \x20 deny network packet,\n\
         \x20 unix,\n",
    );
    let _ = writeln!(
        p,
        "  signal (send, receive) peer={profile},\n\
         \x20 signal (receive) peer=unconfined,\n\
         }}"
    );
    p
}
