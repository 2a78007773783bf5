//! The ceiling rule as a function: does one policy allow nothing that another forbids?
//!
//! Used to accept a profile chosen by annotation (`io.agent.sandbox.profile`) and every
//! annotation-narrowed policy: the candidate must be within the runtime's configured
//! ceiling in every dimension, or the request is refused.

use crate::layers::{AppArmorRequirement, Requirement};
use crate::policy::{NetworkMode, SandboxPolicy};

/// The first dimension in which a candidate policy is wider than its ceiling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NarrowError {
    #[error("scratch path {path} is not writable under the ceiling")]
    Scratch { path: String },
    #[error("scratch {path} is larger than the ceiling's {ceiling}")]
    ScratchSize { path: String, ceiling: String },
    #[error("workspace {path} differs from the ceiling's")]
    Workspace { path: String },
    #[error("protected path {name} of the ceiling is missing")]
    Protected { name: String },
    #[error("masked or read-only path {path} of the ceiling is missing")]
    ProcSys { path: String },
    #[error("id range differs from the ceiling's")]
    Identity,
    #[error("capability {capability} is not allowed by the ceiling")]
    Capability { capability: String },
    #[error("syscall table is wider than the ceiling's")]
    Syscalls,
    #[error("network mode proxy is wider than the ceiling's none")]
    NetworkMode,
    #[error("proxy port differs from the ceiling's")]
    ProxyPort,
    #[error("network.audit_max_bytes is larger than the ceiling's")]
    AuditMaxBytes,
    #[error("network.audit_at_cap aggregate is wider than the ceiling's stop")]
    AuditAtCap,
    #[error("network.sni_mismatch record is wider than the ceiling's deny")]
    SniMismatch,
    #[error("network.transparent is on but off in the ceiling")]
    Transparent,
    #[error("local port {port} is not among the ceiling's local ports")]
    LocalPort { port: u16 },
    #[error("allow rule {rule} is not covered by the ceiling's allow list")]
    Allow { rule: String },
    #[error("deny rule {rule} of the ceiling is missing")]
    Deny { rule: String },
    #[error(
        "network.approvals is wider than the ceiling's (another decider, a wider ceiling or default)"
    )]
    Approvals,
    #[error("credential for {domain} is not one of the ceiling's credentials")]
    Credential { domain: String },
    #[error("{resource} is larger than the ceiling's")]
    Resource { resource: &'static str },
    #[error("ucounts.{key} is larger than the ceiling's")]
    Ucounts { key: &'static str },
    #[error("layer {layer} is less required than under the ceiling")]
    Layer { layer: &'static str },
}

fn requirement_rank(r: Requirement) -> u8 {
    match r {
        Requirement::Optional => 0,
        Requirement::Required => 2,
    }
}

fn apparmor_rank(r: AppArmorRequirement) -> u8 {
    match r {
        AppArmorRequirement::Optional => 0,
        AppArmorRequirement::LandlockFallback => 1,
        AppArmorRequirement::Required => 2,
    }
}

/// `Ok` if `candidate` allows nothing that `ceiling` forbids.
pub fn within(candidate: &SandboxPolicy, ceiling: &SandboxPolicy) -> Result<(), NarrowError> {
    filesystem_within(candidate, ceiling)?;
    privileges_within(candidate, ceiling)?;
    network_within(candidate, ceiling)?;
    resources_within(candidate, ceiling)?;
    layers_within(candidate, ceiling)
}

/// Scratch areas, the workspace, protected names, masked and read-only paths.
fn filesystem_within(
    candidate: &SandboxPolicy,
    ceiling: &SandboxPolicy,
) -> Result<(), NarrowError> {
    let (cf, pf) = (&candidate.filesystem, &ceiling.filesystem);
    for scratch in &cf.scratch {
        let Some(limit) = pf.scratch.iter().find(|s| s.path == scratch.path) else {
            return Err(NarrowError::Scratch {
                path: scratch.path.to_string(),
            });
        };
        if scratch.size > limit.size {
            return Err(NarrowError::ScratchSize {
                path: scratch.path.to_string(),
                ceiling: limit.size.to_string(),
            });
        }
    }
    if let Some(workspace) = &cf.workspace
        && pf.workspace.as_ref() != Some(workspace)
    {
        return Err(NarrowError::Workspace {
            path: workspace.to_string(),
        });
    }
    let protected = cf.protected_names();
    if let Some(missing) = pf
        .protected_names()
        .into_iter()
        .find(|p| !protected.contains(p))
    {
        return Err(NarrowError::Protected {
            name: missing.to_string(),
        });
    }
    let (masked, readonly) = (cf.all_masked_paths(), cf.all_readonly_paths());
    let missing = pf
        .all_masked_paths()
        .into_iter()
        .find(|p| !masked.contains(p))
        .or_else(|| {
            pf.all_readonly_paths()
                .into_iter()
                .find(|p| !readonly.contains(p))
        });
    if let Some(path) = missing {
        return Err(NarrowError::ProcSys {
            path: path.to_string(),
        });
    }
    Ok(())
}

/// The id range, capabilities and the seccomp filter's denials.
fn privileges_within(
    candidate: &SandboxPolicy,
    ceiling: &SandboxPolicy,
) -> Result<(), NarrowError> {
    let (ci, pi) = (&candidate.identity, &ceiling.identity);
    if ci.id_range > pi.id_range || (pi.host_start.is_some() && ci.host_start != pi.host_start) {
        return Err(NarrowError::Identity);
    }

    if let Some(cap) = candidate
        .privileges
        .capabilities
        .iter()
        .find(|c| !ceiling.privileges.capabilities.contains(c))
    {
        return Err(NarrowError::Capability {
            capability: cap.to_string(),
        });
    }

    let (cs, ps) = (&candidate.syscalls, &ceiling.syscalls);
    if cs.errno != ps.errno || ps.deny.iter().any(|d| !cs.deny.contains(d)) {
        return Err(NarrowError::Syscalls);
    }
    Ok(())
}

/// The network mode and the proxy's rules, caps and credentials.
fn network_within(candidate: &SandboxPolicy, ceiling: &SandboxPolicy) -> Result<(), NarrowError> {
    let (cn, pn) = (&candidate.network, &ceiling.network);
    if let Some(&port) = cn.local_ports.iter().find(|p| !pn.local_ports.contains(p)) {
        return Err(NarrowError::LocalPort { port });
    }
    if cn.mode == NetworkMode::Proxy {
        if pn.mode != NetworkMode::Proxy {
            return Err(NarrowError::NetworkMode);
        }
        if cn.proxy_port != pn.proxy_port {
            return Err(NarrowError::ProxyPort);
        }
        // A larger cap lets a sandbox use more of the host's disk.
        if cn.audit_max_bytes > pn.audit_max_bytes {
            return Err(NarrowError::AuditMaxBytes);
        }
        // `aggregate` keeps running a sandbox that `stop` ends.
        if cn.audit_at_cap > pn.audit_at_cap {
            return Err(NarrowError::AuditAtCap);
        }
        // `record` lets through a tunnel that `deny` refuses.
        if cn.sni_mismatch > pn.sni_mismatch {
            return Err(NarrowError::SniMismatch);
        }
        // Transparent mode lifts Landlock's TCP port rule (the netns filter takes it over)
        // and answers DNS inside: a ceiling without it stays without it.
        if cn.transparent && !pn.transparent {
            return Err(NarrowError::Transparent);
        }
        if let Some(rule) = cn
            .allow
            .iter()
            .find(|a| !pn.allow.iter().any(|p| p.covers(a)))
        {
            return Err(NarrowError::Allow {
                rule: rule.to_string(),
            });
        }
        if let Some(rule) = pn
            .deny
            .iter()
            .find(|d| !cn.deny.iter().any(|c| c.covers(d)))
        {
            return Err(NarrowError::Deny {
                rule: rule.to_string(),
            });
        }
        if !approvals_within(cn.approvals.as_ref(), pn.approvals.as_ref()) {
            return Err(NarrowError::Approvals);
        }
    }
    // A credential binding (a secret source, a TLS interception) is never added by narrowing:
    // each of the candidate's must be one of the ceiling's, unchanged.
    if let Some(c) = cn.credentials.iter().find(|c| !pn.credentials.contains(c)) {
        return Err(NarrowError::Credential {
            domain: c.domain.to_string(),
        });
    }
    Ok(())
}

/// Cgroup limits, the wall clock and the per-user kernel counts.
fn resources_within(candidate: &SandboxPolicy, ceiling: &SandboxPolicy) -> Result<(), NarrowError> {
    let (cr, pr) = (&candidate.resources, &ceiling.resources);
    // Compare quota/period ratios exactly: a * d <= c * b.
    let cpu_wider = u128::from(cr.cpu_quota_us) * u128::from(pr.cpu_period_us)
        > u128::from(pr.cpu_quota_us) * u128::from(cr.cpu_period_us);
    let resource = if cr.memory > pr.memory {
        Some("memory")
    } else if cr.pids > pr.pids {
        Some("pids")
    } else if cr.cpu_shares > pr.cpu_shares {
        Some("cpu_shares")
    } else if cpu_wider {
        Some("cpu quota")
    } else if cr.wall_clock > pr.wall_clock {
        Some("wall_clock")
    } else {
        None
    };
    if let Some(resource) = resource {
        return Err(NarrowError::Resource { resource });
    }

    if let Some((key, _)) = candidate
        .ucounts
        .caps()
        .iter()
        .zip(ceiling.ucounts.caps())
        .find(|((_, c), (_, p))| c > p)
        .map(|(c, _)| *c)
    {
        return Err(NarrowError::Ucounts { key });
    }
    Ok(())
}

/// Every layer at least as required as the ceiling's.
fn layers_within(candidate: &SandboxPolicy, ceiling: &SandboxPolicy) -> Result<(), NarrowError> {
    let (cl, pl) = (&candidate.layers, &ceiling.layers);
    let layer = if requirement_rank(cl.seccomp) < requirement_rank(pl.seccomp) {
        Some("seccomp")
    } else if requirement_rank(cl.landlock) < requirement_rank(pl.landlock) {
        Some("landlock")
    } else if requirement_rank(cl.cgroups) < requirement_rank(pl.cgroups) {
        Some("cgroups")
    } else if apparmor_rank(cl.apparmor) < apparmor_rank(pl.apparmor) {
        Some("apparmor")
    } else {
        None
    };
    if let Some(layer) = layer {
        return Err(NarrowError::Layer { layer });
    }
    Ok(())
}

/// A candidate's approvals are within the ceiling's when it has none, or the same decider,
/// a default no more open, and a ceiling every rule of which the ceiling's covers.
fn approvals_within(
    candidate: Option<&crate::approvals::Approvals>,
    ceiling: Option<&crate::approvals::Approvals>,
) -> bool {
    use crate::approvals::DefaultAnswer;
    match (candidate, ceiling) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(p)) => {
            c.decider == p.decider
                && !(c.default == DefaultAnswer::AllowOnce && p.default == DefaultAnswer::Deny)
                && c.ceiling.iter().all(|r| p.ceiling_covers_rule(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_is_within_agent_and_not_the_reverse() {
        let agent = SandboxPolicy::builtin("agent").unwrap();
        let strict = SandboxPolicy::builtin("strict").unwrap();
        assert_eq!(within(&strict, &agent), Ok(()));
        assert_eq!(within(&agent, &agent), Ok(()));
        assert!(within(&agent, &strict).is_err());
    }

    #[test]
    fn local_ports_narrow_to_a_subset() {
        let mut ceiling = SandboxPolicy::builtin("agent").unwrap();
        ceiling.network.local_ports = vec![8080, 9090];
        let mut candidate = ceiling.clone();
        candidate.network.local_ports = vec![9090];
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        candidate.network.local_ports = vec![9090, 22];
        assert_eq!(
            within(&candidate, &ceiling),
            Err(NarrowError::LocalPort { port: 22 })
        );
    }

    #[test]
    fn approvals_narrow_to_a_covered_ceiling() {
        use crate::approvals::{Approvals, DefaultAnswer};
        use crate::network::DomainRule;
        let rule = |r: &str| DomainRule::parse(r).unwrap();
        let mut ceiling = SandboxPolicy::builtin("agent").unwrap();
        ceiling.network.approvals = Some(Approvals {
            decider: Some("/run/d.sock".parse().unwrap()),
            timeout: crate::approvals::DEFAULT_TIMEOUT,
            default: DefaultAnswer::Deny,
            ceiling: vec![rule("*.example.com")],
        });
        let mut candidate = ceiling.clone();
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        if let Some(a) = candidate.network.approvals.as_mut() {
            a.ceiling = vec![rule("api.example.com:443")];
        }
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        if let Some(a) = candidate.network.approvals.as_mut() {
            a.ceiling.push(rule("other.org"));
        }
        assert_eq!(within(&candidate, &ceiling), Err(NarrowError::Approvals));
        candidate.network.approvals = None;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        ceiling.network.approvals = None;
        candidate.network.approvals = Some(Approvals {
            decider: None,
            timeout: crate::approvals::DEFAULT_TIMEOUT,
            default: DefaultAnswer::Deny,
            ceiling: vec![rule("api.example.com")],
        });
        assert_eq!(within(&candidate, &ceiling), Err(NarrowError::Approvals));
    }

    #[test]
    fn audit_at_cap_may_tighten_to_stop_only() {
        use crate::policy::AuditAtCap;
        let mut ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut candidate = ceiling.clone();
        candidate.network.audit_at_cap = AuditAtCap::Aggregate;
        assert_eq!(within(&candidate, &ceiling), Err(NarrowError::AuditAtCap));
        ceiling.network.audit_at_cap = AuditAtCap::Aggregate;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        candidate.network.audit_at_cap = AuditAtCap::Stop;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
    }

    #[test]
    fn sni_mismatch_may_tighten_to_deny_only() {
        use crate::policy::SniMismatch;
        let mut ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut candidate = ceiling.clone();
        candidate.network.sni_mismatch = SniMismatch::Record;
        assert_eq!(within(&candidate, &ceiling), Err(NarrowError::SniMismatch));
        ceiling.network.sni_mismatch = SniMismatch::Record;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        candidate.network.sni_mismatch = SniMismatch::Deny;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
    }

    #[test]
    fn transparent_mode_needs_the_ceiling_to_have_it() {
        let mut ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut candidate = ceiling.clone();
        candidate.network.transparent = true;
        assert_eq!(within(&candidate, &ceiling), Err(NarrowError::Transparent));
        ceiling.network.transparent = true;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        candidate.network.transparent = false;
        assert_eq!(within(&candidate, &ceiling), Ok(()));
    }

    #[test]
    fn a_narrowed_policy_cannot_add_or_change_a_credential() {
        let text = |extra: &str| {
            format!(
                "[network]\nmode = \"proxy\"\nallow = [\"api.example.com:443\", \"other.example.com:443\"]\n\
                 [[network.credentials]]\ndomain = \"api.example.com:443\"\nheader = \"Authorization\"\n\
                 env = \"TOKEN\"\nhttps = true\n{extra}"
            )
        };
        let ceiling = SandboxPolicy::parse(&text(""), "ceiling.toml").unwrap();
        assert_eq!(within(&ceiling, &ceiling), Ok(()));
        let mut none = ceiling.clone();
        none.network.credentials.clear();
        assert_eq!(within(&none, &ceiling), Ok(()));
        let added = SandboxPolicy::parse(
            &text(
                "[[network.credentials]]\ndomain = \"other.example.com:443\"\nheader = \"X-Key\"\nfile = \"/k\"\nhttps = true\n",
            ),
            "candidate.toml",
        )
        .unwrap();
        assert!(matches!(
            within(&added, &ceiling),
            Err(NarrowError::Credential { domain }) if domain == "other.example.com:443"
        ));
        let mut changed = ceiling.clone();
        changed.network.credentials[0].env = Some("OTHER".into());
        assert!(within(&changed, &ceiling).is_err());
    }

    #[test]
    fn ucounts_caps_narrow_down_only() {
        let ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut lower = ceiling.clone();
        lower.ucounts.inotify_instances = 4;
        assert_eq!(within(&lower, &ceiling), Ok(()));
        assert_eq!(
            within(&ceiling, &lower),
            Err(NarrowError::Ucounts {
                key: "inotify_instances"
            })
        );
    }

    #[test]
    fn the_audit_cap_narrows_down_only() {
        let ceiling = SandboxPolicy::builtin("agent").unwrap();
        let mut candidate = ceiling.clone();
        candidate.network.audit_max_bytes = crate::value::ByteSize::from_trusted(1 << 20);
        assert_eq!(within(&candidate, &ceiling), Ok(()));
        candidate.network.audit_max_bytes = crate::value::ByteSize::from_trusted(1 << 30);
        assert_eq!(
            within(&candidate, &ceiling),
            Err(NarrowError::AuditMaxBytes)
        );
    }
}
