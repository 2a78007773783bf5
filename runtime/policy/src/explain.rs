//! A person-readable summary of what a sandbox allows and denies
//! (`agent-sandbox policy explain PROFILE`).

use std::fmt::Write as _;

use crate::layers::{AppArmorRequirement, Requirement};
use crate::policy::{NetworkMode, SandboxPolicy};

fn requirement(r: Requirement) -> &'static str {
    match r {
        Requirement::Required => "required (the sandbox refuses to start without it)",
        Requirement::Optional => "optional (reported inactive if the host lacks it)",
    }
}

/// Explain `policy` in plain sentences, grouped as "allowed" and "denied".
pub fn explain(policy: &SandboxPolicy) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; results are ignored on purpose.
    if !policy.description.is_empty() {
        let _ = writeln!(out, "{}\n", policy.description);
    }
    allowed_files(&mut out, policy);
    allowed_network(&mut out, policy);
    allowed_privileges(&mut out, policy);
    allowed_resources(&mut out, policy);
    denied(&mut out, policy);
    enforced_by(&mut out, policy);
    out
}

fn allowed_files(out: &mut String, policy: &SandboxPolicy) {
    let fs = &policy.filesystem;
    out.push_str("ALLOWED\n");
    out.push_str("  Files\n");
    out.push_str("    - read and run anything in the image (the image itself is read-only)\n");
    for s in &fs.scratch {
        let _ = writeln!(
            out,
            "    - write in {} (empty scratch space, at most {}, gone when the sandbox ends)",
            s.path, s.size
        );
    }
    if let Some(w) = &fs.workspace {
        let _ = writeln!(
            out,
            "    - write in {w}: the host directory mounted there is read-only underneath; \
             changes go to a private overlay and never reach the host"
        );
    }
}

fn allowed_network(out: &mut String, policy: &SandboxPolicy) {
    let net = &policy.network;
    out.push_str("  Network\n");
    match net.mode {
        NetworkMode::None => {
            out.push_str("    - loopback (127.0.0.1) only; nothing leaves the sandbox\n")
        }
        NetworkMode::Proxy => {
            let _ = writeln!(
                out,
                "    - outbound connections only through the proxy at 127.0.0.1:{}, to:",
                net.proxy_port
            );
            for rule in &net.allow {
                let _ = writeln!(out, "        {rule}");
            }
            out.push_str("      (`*.x.com` means subdomains of x.com, not x.com itself)\n");
            if let Some(a) = &net.approvals {
                let asked = match &a.decider {
                    Some(d) => format!("asked of the decider at {d} (timeout {}), or", a.timeout),
                    None => "no decider; only".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "    - while it runs, more hosts within this ceiling, {asked} by `agent-sandbox allow`:"
                );
                for rule in &a.ceiling {
                    let _ = writeln!(out, "        {rule}");
                }
            }
            let _ = writeln!(
                out,
                "    - its connections, approvals and denials fill at most {} of the audit log; {}",
                net.audit_max_bytes,
                match net.audit_at_cap {
                    crate::policy::AuditAtCap::Stop => {
                        "then the sandbox is stopped (audit_at_cap = stop)"
                    }
                    crate::policy::AuditAtCap::Aggregate => {
                        "then they are only counted (audit_at_cap = aggregate)"
                    }
                }
            );
            if net.sni_mismatch == crate::policy::SniMismatch::Record {
                out.push_str(
                    "    - a TLS tunnel naming another server (SNI) than its host is let through \
                     and recorded (sni_mismatch = record)\n",
                );
            }
        }
    }
    if !net.local_ports.is_empty() {
        let ports: Vec<String> = net.local_ports.iter().map(u16::to_string).collect();
        let _ = writeln!(
            out,
            "    - TCP to its own loopback (a pod's containers share one) on ports {}",
            ports.join(", ")
        );
    }
}

fn allowed_privileges(out: &mut String, policy: &SandboxPolicy) {
    out.push_str("  Privileges\n");
    if policy.privileges.capabilities.is_empty() {
        out.push_str("    - none: every capability is dropped\n");
    } else {
        let caps: Vec<&str> = policy
            .privileges
            .capabilities
            .iter()
            .map(|c| c.as_str())
            .collect();
        let _ = writeln!(
            out,
            "    - only if the container asks for them: {}",
            caps.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "    - root inside the sandbox is an unprivileged host user ({} ids mapped{})",
        policy.identity.id_range,
        policy
            .identity
            .host_start
            .map(|s| format!(" from host id {s}"))
            .unwrap_or_default()
    );
}

fn allowed_resources(out: &mut String, policy: &SandboxPolicy) {
    let res = &policy.resources;
    out.push_str("  Resources (the most a container may use; it may ask for less)\n");
    let _ = writeln!(out, "    - memory {} (no swap beyond it)", res.memory);
    let _ = writeln!(out, "    - {} processes/threads", res.pids);
    let _ = writeln!(
        out,
        "    - CPU {}us per {}us (about {:.2} CPUs), {} shares",
        res.cpu_quota_us,
        res.cpu_period_us,
        res.cpu_quota_us as f64 / res.cpu_period_us as f64,
        res.cpu_shares
    );
    let _ = writeln!(out, "    - runs for at most {}", res.wall_clock);
    let u = &policy.ucounts;
    let _ = writeln!(
        out,
        "    - per user inside the sandbox: {} inotify instances, {} inotify watches, {} fanotify \
         groups, {} fanotify marks; namespaces: {} user, {} mount, {} PID, {} network, {} IPC, \
         {} UTS, {} cgroup, {} time (charged to the sandbox's own host id, never to host root)",
        u.inotify_instances,
        u.inotify_watches,
        u.fanotify_groups,
        u.fanotify_marks,
        u.user_namespaces,
        u.mnt_namespaces,
        u.pid_namespaces,
        u.net_namespaces,
        u.ipc_namespaces,
        u.uts_namespaces,
        u.cgroup_namespaces,
        u.time_namespaces
    );
    let _ = writeln!(
        out,
        "    - PID 1: {}",
        match res.init {
            crate::policy::InitMode::Auto => {
                "agent-sandbox's reaping init, unless the program is an init itself"
            }
            crate::policy::InitMode::Always => "agent-sandbox's reaping init",
            crate::policy::InitMode::Never => "the program itself (it must reap its orphans)",
        }
    );
}

fn denied(out: &mut String, policy: &SandboxPolicy) {
    let fs = &policy.filesystem;
    let net = &policy.network;
    out.push_str("\nDENIED\n");
    out.push_str("  - writing anywhere else, including the image's own files\n");
    let names: Vec<String> = fs.protected_names().iter().map(|n| n.to_string()).collect();
    let _ = writeln!(
        out,
        "  - changing these protected names (docs/policy.md#protected-names): in HOME, where \
         each is kept unwritable whether or not the image has it; in the workspace, where \
         those that exist are read-only and new ones are refused by promote at any depth and \
         in any case; at any depth of every writable place where AppArmor is active: {}",
        names.join(" ")
    );
    let masked: Vec<String> = fs
        .all_masked_paths()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let _ = writeln!(out, "  - seeing {}", masked.join(" "));
    let readonly: Vec<String> = fs
        .all_readonly_paths()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let _ = writeln!(
        out,
        "  - changing {} and anything under /sys",
        readonly.join(" ")
    );
    match net.mode {
        NetworkMode::None => out.push_str("  - any network access beyond loopback\n"),
        NetworkMode::Proxy => {
            out.push_str("  - every host not allowed above (default deny)\n");
            for rule in &net.deny {
                let _ = writeln!(out, "  - {rule} (deny wins over allow)");
            }
            out.push_str("  - connecting anywhere directly, bypassing the proxy\n");
        }
    }
    out.push_str(
        "  - gaining privileges (no_new_privs: setuid binaries do not elevate)\n\
         \x20 - mounting, tracing other processes (ptrace, process_vm_*), loading kernel \
         modules or BPF, io_uring, kernel keyrings, new namespaces, raw/packet/vsock sockets \
         (seccomp)\n\
         \x20 - host devices other than null, zero, full, random, urandom and terminals\n",
    );
    let errno = serde_json::to_value(policy.syscalls.errno)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", policy.syscalls.errno));
    let _ = writeln!(out, "  - denied system calls fail with {errno}");
    if !policy.syscalls.deny.is_empty() {
        let names: Vec<&str> = policy.syscalls.deny.iter().map(|n| n.as_str()).collect();
        let _ = writeln!(out, "  - also denied by this profile: {}", names.join(", "));
    }
}

fn enforced_by(out: &mut String, policy: &SandboxPolicy) {
    out.push_str("\nENFORCED BY\n");
    out.push_str("  - user, mount, pid, network, ipc, uts and cgroup namespaces (always)\n");
    let l = &policy.layers;
    let _ = writeln!(out, "  - seccomp: {}", requirement(l.seccomp));
    let _ = writeln!(out, "  - landlock: {}", requirement(l.landlock));
    let _ = writeln!(
        out,
        "  - apparmor: {}",
        match l.apparmor {
            AppArmorRequirement::Required => requirement(Requirement::Required),
            AppArmorRequirement::Optional => requirement(Requirement::Optional),
            AppArmorRequirement::LandlockFallback =>
                "required where the host has AppArmor; elsewhere Landlock stands in",
        }
    );
    let _ = writeln!(out, "  - cgroups: {}", requirement(l.cgroups));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_agent_profile() {
        let text = explain(&SandboxPolicy::builtin("agent").unwrap());
        assert!(text.contains("write in /workspace"));
        assert!(text.contains("pypi.org:443"));
        assert!(text.contains("*.crates.io:443"));
        assert!(text.contains("fail with EPERM"));
        assert!(text.contains(".git/hooks/"));
        assert!(text.contains("memory 2G"));
        assert!(text.contains("every capability is dropped"));
        assert!(text.contains("per user inside the sandbox: 32 inotify instances"));
        assert!(text.contains("never to host root"));
    }

    #[test]
    fn explains_strict_profile() {
        let text = explain(&SandboxPolicy::builtin("strict").unwrap());
        assert!(text.contains("loopback (127.0.0.1) only"));
        assert!(text.contains("runs for at most 15m"));
        assert!(text.contains("PID 1: agent-sandbox's reaping init, unless"));
        assert!(!text.contains("proxy at"));
        let mut policy = SandboxPolicy::builtin("agent").unwrap();
        policy.network.deny = vec![crate::network::DomainRule::parse("static.crates.io").unwrap()];
        let text = explain(&policy);
        assert!(text.contains("static.crates.io (deny wins over allow)"));
    }
}
