//! `agent-sandbox layers ID`: which protections are in force for one sandbox,
//! from what the runtime applied (saved at create) and what the kernel reports
//! for the sandbox's init now (`/proc/PID/status`, its id maps, its cgroup
//! files), not from the policy alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::files::FileError;
use crate::state::ContainerId;
use crate::state::{SandboxDir, StateDirs};

/// Errors of the layers report.
#[derive(Debug, thiserror::Error)]
pub enum LayersError {
    #[error("sandbox {id} has no layers record at {path} (created by an older runtime?)")]
    Missing {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] FileError),
}

/// What the runtime applied at create, saved for later reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    /// Container id 0 maps to this host id, for `size` ids (uid and gid alike). Rootless,
    /// an id of podman's user namespace, whose 0 is the invoking user.
    pub userns_host_start: u32,
    pub userns_size: u32,
    /// Rootless only: the invoking user's uid in the initial namespace, which the sandbox's
    /// root is (docs/workspace.md, "Rootless"). `None`: the runtime was real root.
    #[serde(default)]
    pub rootless_user: Option<u32>,
    /// `root.readonly` of the spec libcontainer got.
    pub readonly_rootfs: bool,
    /// `process.noNewPrivileges` of the init's spec.
    pub no_new_privs: bool,
    /// Every capability named in any set of the init's spec (none in a sandbox).
    pub capabilities: Vec<String>,
    /// Instructions of the seccomp BPF handed to the executor; `None`: no filter.
    pub seccomp_bpf_instructions: Option<usize>,
    /// The kernel's Landlock ABI (`agent_sandbox_sys::landlock_abi`, the runtime's one probe)
    /// when the Landlock layer was applied; `None`: not applied.
    pub landlock_kernel_abi: Option<u32>,
    /// The ABI the Landlock ruleset was built for: the kernel's, at most the newest the
    /// policy compiler knows. Not a probe; stored as `landlock_abi`.
    #[serde(default, rename = "landlock_abi")]
    pub landlock_ruleset_abi: Option<u8>,
    /// The Landlock rights this kernel lacks (or the sandbox does not use) and what covers
    /// each.
    #[serde(default)]
    pub landlock_gaps: Vec<agent_sandbox_policy::landlock::LandlockGap>,
    /// The AppArmor profile applied to the init and every exec; `None`: not applied.
    #[serde(default)]
    pub apparmor_profile: Option<String>,
    /// Optional layers that were not applied, with the reason.
    pub inactive: BTreeMap<String, String>,
    /// `none` or `proxy`.
    pub network_mode: String,
    /// The proxy's pid and its port inside the sandbox, for proxy mode.
    pub proxy_pid: Option<u32>,
    pub proxy_port: Option<u16>,
    /// The init's cgroup directories by controller (host paths).
    pub cgroups: BTreeMap<String, PathBuf>,
    /// Whether agent-sandbox's reaping init is the sandbox's PID 1 (`resources.init`).
    #[serde(default)]
    pub init_reaper: bool,
    /// The sandbox's own user namespace: its owner and the per-user caps in it
    /// (`crate::host::userns`); a pod member's are its pod's. `None`: a runtime before the
    /// rootless one made its own.
    #[serde(default)]
    pub ucounts: Option<crate::host::userns::OwnedUserns>,
    /// For a pod's member: the pod sandbox whose user namespace (and caps) it shares.
    #[serde(default)]
    pub ucounts_pod: Option<String>,
    /// The credential stores found in the workspace and masked, as container paths
    /// ([`masked_secrets`]).
    #[serde(default)]
    pub masked_secrets: Vec<PathBuf>,
}

/// The workspace paths a placeholder is bound over in `spec` (the credential stores the
/// runtime masked, docs/workspace.md#secret-names), in mount order.
pub fn masked_secrets(
    spec: &libcontainer::oci_spec::runtime::Spec,
    policy: &agent_sandbox_policy::SandboxPolicy,
    placeholders: &agent_sandbox_policy::harden::Placeholders,
) -> Vec<PathBuf> {
    let Some(workspace) = policy.filesystem.workspace.as_ref() else {
        return Vec::new();
    };
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| {
            m.destination().starts_with(workspace.as_path())
                && m.source()
                    .as_ref()
                    .is_some_and(|s| *s == placeholders.file || *s == placeholders.dir)
        })
        .map(|m| m.destination().clone())
        .collect()
}

/// The sandbox's own user namespace as recorded at its create (a pod member reads its pod's).
pub fn ucounts_of(sandbox_dir: &SandboxDir) -> Option<crate::host::userns::OwnedUserns> {
    let applied: Applied = sandbox_dir.layers().read().ok()?;
    applied.ucounts
}

impl Applied {
    /// Saves the record in the sandbox dir.
    pub fn save(&self, sandbox_dir: &SandboxDir) -> Result<(), LayersError> {
        Ok(sandbox_dir.layers().write(self)?)
    }

    fn load(sandbox_dir: &SandboxDir, id: &ContainerId) -> Result<Self, LayersError> {
        sandbox_dir
            .layers()
            .read()
            .map_err(|e| match e.into_read() {
                Ok((path, source)) => LayersError::Missing {
                    id: id.to_string(),
                    path,
                    source,
                },
                Err(e) => e.into(),
            })
    }
}

/// With agent-sandbox's reaper as the sandbox's PID 1: a `cgroup.procs` file that lists the
/// sandbox's processes (the program is one of them, beside the reaper); `None` without it.
pub fn reaper_procs(sandbox_dir: &SandboxDir) -> Option<PathBuf> {
    let applied: Applied = sandbox_dir.layers().read().ok()?;
    if !applied.init_reaper {
        return None;
    }
    ["pids", "memory", "unified"]
        .iter()
        .find_map(|k| applied.cgroups.get(*k))
        .or_else(|| applied.cgroups.values().next())
        .map(|d| d.join("cgroup.procs"))
}

/// At create, once the init exists (and the proxy runs): saves what was applied.
#[allow(clippy::too_many_arguments)]
pub fn record_create(
    sandbox_dir: &SandboxDir,
    ids: &crate::host::idmap::IdRange,
    spec: &libcontainer::oci_spec::runtime::Spec,
    seccomp_bpf_instructions: Option<usize>,
    policy: &agent_sandbox_policy::SandboxPolicy,
    plan: &agent_sandbox_policy::layers::LayerPlan,
    proxy_pid: Option<u32>,
    init_pid: i32,
    ucounts: Option<crate::host::userns::OwnedUserns>,
    ucounts_pod: Option<String>,
    masked_secrets: Vec<PathBuf>,
) -> Result<(), LayersError> {
    let process = spec.process().as_ref();
    let capabilities = process
        .and_then(|p| p.capabilities().as_ref())
        .map(|c| {
            let mut all: Vec<String> = [
                c.bounding(),
                c.effective(),
                c.permitted(),
                c.inheritable(),
                c.ambient(),
            ]
            .iter()
            .filter_map(|s| s.as_ref())
            .flatten()
            .map(|cap| cap.to_string())
            .collect();
            all.sort();
            all.dedup();
            all
        })
        .unwrap_or_default();
    let landlock = plan
        .landlock
        .as_ref()
        .filter(|_| plan.apply.contains(&agent_sandbox_policy::Layer::Landlock));
    let apparmor_profile = plan
        .apply
        .contains(&agent_sandbox_policy::Layer::Apparmor)
        .then(|| agent_sandbox_policy::apparmor::loaded_profile(policy).name);
    let network_mode = serde_json::to_value(policy.network.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", policy.network.mode));
    let proxy = crate::sidecars::egress::wanted(policy);
    let rootless_user = crate::state::paths::rootless()
        .unwrap_or(true)
        .then(|| crate::host::idmap::own_map(crate::host::idmap::IdKind::Uid).ok())
        .flatten()
        .and_then(|own| crate::host::idmap::to_host(ids.host_start, &own));
    Applied {
        userns_host_start: ids.host_start,
        userns_size: ids.size,
        rootless_user,
        readonly_rootfs: spec.root().as_ref().and_then(|r| r.readonly()) == Some(true),
        no_new_privs: process.and_then(|p| p.no_new_privileges()) == Some(true),
        capabilities,
        seccomp_bpf_instructions,
        landlock_kernel_abi: landlock.map(|at| at.kernel_abi),
        landlock_ruleset_abi: landlock.map(|at| at.abi),
        landlock_gaps: landlock.map(|at| at.gaps.clone()).unwrap_or_default(),
        apparmor_profile,
        inactive: plan
            .inactive
            .iter()
            .map(|(l, r)| (l.to_string(), r.to_string()))
            .collect(),
        network_mode,
        proxy_pid: proxy.then_some(proxy_pid).flatten(),
        proxy_port: proxy.then_some(policy.network.proxy_port),
        cgroups: cgroups_of(init_pid),
        init_reaper: crate::enforce::reaper::wanted(policy, spec),
        ucounts,
        ucounts_pod,
        masked_secrets,
    }
    .save(sandbox_dir)
}

/// The cgroup directories of `pid` by controller (`crate::host::cgroups`).
pub fn cgroups_of(pid: i32) -> BTreeMap<String, PathBuf> {
    crate::host::cgroups::dirs_of(&crate::host::cgroups::RealHost, pid)
}

/// Limits read back from the cgroup files (v1 names, and the v2 ones where present).
fn cgroup_limits(dirs: &BTreeMap<String, PathBuf>) -> BTreeMap<String, String> {
    let files = [
        ("memory", "memory.limit_in_bytes"),
        ("memory", "memory.memsw.limit_in_bytes"),
        ("pids", "pids.max"),
        ("cpu", "cpu.cfs_quota_us"),
        ("cpu", "cpu.cfs_period_us"),
        ("cpu", "cpu.shares"),
        ("unified", "memory.max"),
        ("unified", "pids.max"),
        ("unified", "cpu.max"),
        ("unified", "cpu.weight"),
    ];
    files
        .iter()
        .filter_map(|(ctrl, file)| {
            let v = std::fs::read_to_string(dirs.get(*ctrl)?.join(file)).ok()?;
            Some((format!("{ctrl}/{file}"), v.trim().to_owned()))
        })
        .collect()
}

/// The security lines of `/proc/PID/status`.
fn status_fields(pid: i32) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(status_fields_in(&text))
}

fn status_fields_in(text: &str) -> BTreeMap<String, String> {
    const KEEP: [&str; 8] = [
        "NoNewPrivs",
        "Seccomp",
        "Seccomp_filters",
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
    ];
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| KEEP.contains(k))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// The report: saved facts, and the live view of `init_pid` when it runs.
pub fn report(
    dirs: &StateDirs,
    id: &ContainerId,
    status: &str,
    init_pid: Option<i32>,
) -> Result<Value, LayersError> {
    let applied = Applied::load(&dirs.sandbox(id), id)?;
    let live = init_pid
        .filter(|p| *p > 0 && status != "stopped")
        .and_then(|pid| Some((pid, status_fields(pid)?)));
    let proc_text = |pid: i32, f: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{f}"))
            .ok()
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    let live_json = live.as_ref().map(|(pid, st)| {
        let zero = |k: &str| st.get(k).is_some_and(|v| v.chars().all(|c| c == '0'));
        let caps_empty = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
            .iter()
            .all(|k| zero(k));
        json!({
            "pid": pid,
            "uid_map": proc_text(*pid, "uid_map"),
            "gid_map": proc_text(*pid, "gid_map"),
            "no_new_privs": st.get("NoNewPrivs").map(|v| v == "1"),
            "seccomp_mode": st.get("Seccomp"),
            "seccomp_filters": st.get("Seccomp_filters"),
            "capabilities_empty": caps_empty,
            "status": st,
        })
    });
    let supervisor = std::fs::read_to_string(dirs.sandbox(id).supervisor_pid())
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let fs_denied = fs_denied_report(
        applied.landlock_kernel_abi.is_some(),
        crate::sidecars::fs_audit::FsAuditStatus::load(&dirs.sandbox(id)),
    );
    let proxy_alive = applied
        .proxy_pid
        .map(|p| Path::new(&format!("/proc/{p}")).exists());
    Ok(json!({
        "id": id.as_str(),
        "status": status,
        "userns": userns_report(&applied),
        "workspace_secrets": {
            "masked": applied.masked_secrets,
            "how": "an empty read-only directory or file bound over each credential store (.ssh/, .gnupg/, .aws/, .netrc, ...) found in the workspace, rootful and rootless (docs/workspace.md#secret-names)",
        },
        "readonly_rootfs": applied.readonly_rootfs,
        "no_new_privs": applied.no_new_privs,
        "capabilities": applied.capabilities,
        "seccomp": applied.seccomp_bpf_instructions.map(|n| json!({
            "bpf_instructions": n,
            "denials": "user notification, answered and recorded by the supervisor",
            "supervisor_pid": supervisor,
            "supervisor_alive": supervisor.map(|p| Path::new(&format!("/proc/{p}")).exists()),
        })),
        "landlock": applied.landlock_kernel_abi.map(|abi| landlock_report(abi, &applied)),
        "fs_denied": fs_denied,
        "apparmor": apparmor_report(&applied, live.as_ref().map(|(pid, _)| *pid)),
        "inactive": applied.inactive,
        "network": {
            "namespace": "new (only lo)",
            "mode": applied.network_mode,
            "proxy_pid": applied.proxy_pid,
            "proxy_port": applied.proxy_port,
            "proxy_alive": proxy_alive,
        },
        "cgroups": {
            "dirs": applied.cgroups,
            "limits": cgroup_limits(&applied.cgroups),
        },
        "init": if applied.init_reaper { "agent-sandbox reaper" } else { "the program" },
        "ucounts": ucounts_report(&applied, live.as_ref().map(|(pid, _)| *pid)),
        "live": live_json,
    }))
}

/// The sandbox's id mapping and who its root is on the host; rootless, what differs from a
/// rootful sandbox (docs/workspace.md, "Rootless").
fn userns_report(applied: &Applied) -> Value {
    let mapping = format!("0 {} {}", applied.userns_host_start, applied.userns_size);
    let Some(user) = applied.rootless_user else {
        return json!({
            "mapping": mapping,
            "host_root_mapped": applied.userns_host_start == 0,
            "root_is": format!("host id {}, an id of the sandbox's own", applied.userns_host_start),
        });
    };
    json!({
        "mapping": format!("{mapping} (ids of rootless podman's user namespace)"),
        "host_root_mapped": user == 0,
        "root_is": format!("the invoking user (host uid {user})"),
        "rootless": [
            "the sandbox's root is the invoking user, the owner of the checkout: no idmapped mount, no id of its own",
            "what only the user's uid can open is reachable only through the sandbox's own mounts (read-only rootfs, read-only binds, the workspace overlay) and its own pid, ipc and network namespaces",
            "the user's credential stores in the workspace (a home's .ssh/, .gnupg/, .aws/, .netrc, ...), which ownership no longer keeps out, are masked: see workspace_secrets",
            "the overlay's upper files the sandbox's root writes belong to the user: review needs no podman unshare",
            "per-user kernel counts (processes, inotify, namespaces) are charged to the user, beside the user's own session, within the policy's caps in the sandbox's namespace",
            "no workspace quota (loop devices need real root); no AppArmor profile of its own",
        ],
    })
}

/// The Landlock layer: the ABI its ruleset was built for and, for each right that ABI
/// lacks (or the sandbox does not use), what covers it.
fn landlock_report(kernel_abi: u32, applied: &Applied) -> Value {
    let gap = |g: &agent_sandbox_policy::landlock::LandlockGap| {
        json!({
            "right": g.right,
            "since_abi": g.since_abi,
            "why": if g.unused { "not used by the sandbox" } else { "the kernel lacks it" },
            "covered_by": if g.covered_by.is_empty() {
                json!("nothing (uncovered; the policy marks landlock optional)")
            } else {
                json!(g.covered_by.iter().map(|c| c.describe()).collect::<Vec<_>>())
            },
        })
    };
    let abi = applied.landlock_ruleset_abi.map_or(kernel_abi, u32::from);
    json!({
        "kernel_abi": kernel_abi,
        "abi": abi,
        "enforcement": format!("fully enforced at ABI {abi} (required at apply)"),
        "missing": applied.landlock_gaps.iter().filter(|g| !g.unused).map(gap).collect::<Vec<_>>(),
        "unused": applied.landlock_gaps.iter().filter(|g| g.unused).map(gap).collect::<Vec<_>>(),
    })
}

/// The per-user kernel counts: whom the sandbox's user namespace charges at the host's level
/// (saved, and the owner the kernel reports for the init's namespace now) and the caps in it.
fn ucounts_report(applied: &Applied, live_pid: Option<i32>) -> Value {
    let Some(u) = &applied.ucounts else {
        return json!({
            "active": false,
            "reason": "the runtime is rootless: the sandbox's counts are charged to the invoking user, as every namespace that user makes (docs/limits.md)",
        });
    };
    let live_owner = live_pid.and_then(|pid| {
        agent_sandbox_sys::owned_userns::owner_uid(Path::new(&format!("/proc/{pid}/ns/user"))).ok()
    });
    json!({
        "active": true,
        // Rootless, the owner is podman's namespace root: the invoking user.
        "charged_to_host_uid": applied.rootless_user.unwrap_or(u.owner),
        "owner_uid_now": live_owner,
        "pod": applied.ucounts_pod,
        "caps_per_user": u.caps,
        "absent_in_kernel": u.absent,
    })
}

/// The AppArmor layer: the profile and the init's label now, or why it is inactive.
fn apparmor_report(applied: &Applied, live_pid: Option<i32>) -> Value {
    match (&applied.apparmor_profile, applied.inactive.get("apparmor")) {
        (Some(profile), _) => json!({
            "active": true,
            "profile": profile,
            "init_label": live_pid.and_then(crate::host::apparmor::label_of),
        }),
        (None, Some(reason)) => json!({"active": false, "reason": reason}),
        (None, None) => json!({"active": false, "reason": "not applied"}),
    }
}

/// Whether Landlock's denials reach the audit log as `fs_denied` records, and why not.
fn fs_denied_report(
    landlock: bool,
    status: Option<crate::sidecars::fs_audit::FsAuditStatus>,
) -> Value {
    match (landlock, status) {
        (false, _) => json!({"active": false, "reason": "the Landlock layer is not applied"}),
        (true, None) => json!({
            "active": false,
            "reason": "the sandbox has no seccomp supervisor verdict (the seccomp layer is not applied, or an older runtime created it)",
        }),
        (true, Some(s)) if s.active => json!({
            "active": true,
            "source": "kernel audit: Landlock records read by the supervisor from AUDIT_NLGRP_READLOG",
        }),
        (true, Some(s)) => json!({"active": false, "reason": s.reason}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_denied_is_reported_inactive_with_its_reason() {
        use crate::sidecars::fs_audit::FsAuditStatus;
        let off = FsAuditStatus {
            active: false,
            reason: Some("kernel audit is disabled".into()),
        };
        let on = FsAuditStatus {
            active: true,
            reason: None,
        };
        assert_eq!(fs_denied_report(true, Some(on.clone()))["active"], true);
        let r = fs_denied_report(true, Some(off));
        assert_eq!(r["active"], false);
        assert_eq!(r["reason"], "kernel audit is disabled");
        assert_eq!(fs_denied_report(false, Some(on))["active"], false);
        assert_eq!(fs_denied_report(true, None)["active"], false);
    }

    #[test]
    fn status_keeps_only_security_lines() {
        let text = "Name:\tsleep\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\nCapEff:\t0000000000000000\nVmRSS:\t1 kB\n";
        let m = status_fields_in(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m["Seccomp"], "2");
        assert_eq!(m["CapEff"], "0000000000000000");
    }

    #[test]
    fn the_kernel_and_ruleset_abis_keep_their_stored_names() {
        let applied = Applied {
            landlock_kernel_abi: Some(7),
            landlock_ruleset_abi: Some(6),
            ..Applied::default()
        };
        let v = serde_json::to_value(&applied).unwrap();
        assert_eq!(v["landlock_kernel_abi"], 7);
        assert_eq!(v["landlock_abi"], 6);
        let back: Applied = serde_json::from_value(v).unwrap();
        assert_eq!(back.landlock_ruleset_abi, Some(6));
        // The report shows the ruleset's ABI, falling back to the kernel's for old records.
        assert_eq!(landlock_report(7, &back)["abi"], 6);
        let old = Applied {
            landlock_ruleset_abi: None,
            ..back
        };
        assert_eq!(landlock_report(7, &old)["abi"], 7);
    }

    #[test]
    fn landlock_abi_agrees_with_the_landlock_crate() {
        use landlock::{ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr};
        let abi = agent_sandbox_sys::landlock_abi().unwrap();
        assert_eq!(crate::harden::host_support().landlock_abi, abi);
        // The crate creates a ruleset needing this ABI's rights, and refuses the next one's.
        let creates = |v: ABI| {
            Ruleset::default()
                .set_compatibility(CompatLevel::HardRequirement)
                .handle_access(AccessFs::from_all(v))
                .and_then(|r| r.create())
                .is_ok()
        };
        let this = ABI::from(i32::try_from(abi).unwrap());
        assert!(creates(this), "abi {abi}");
        if abi < 5 {
            assert!(
                !creates(ABI::from(i32::try_from(abi + 1).unwrap())),
                "abi {abi}"
            );
        }
    }

    #[test]
    fn layers_names_each_missing_landlock_right_and_its_cover() {
        use agent_sandbox_policy::landlock::{CoverFacts, at_abi, ruleset};
        let policy = agent_sandbox_policy::SandboxPolicy::builtin("agent").unwrap();
        let facts = CoverFacts {
            readonly_mounts: true,
            network_namespace: true,
            safe_devices: true,
            namespaces: true,
            apparmor: false,
            mount_namespace: true,
        };
        // Debian 12's kernel: ABI 2.
        let at = at_abi(&ruleset(&policy), 2, &facts);
        let applied = Applied {
            landlock_kernel_abi: Some(2),
            landlock_ruleset_abi: Some(at.abi),
            landlock_gaps: at.gaps,
            ..Applied::default()
        };
        let r = landlock_report(2, &applied);
        assert_eq!(r["abi"], 2);
        let missing: Vec<&str> = r["missing"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["right"].as_str().unwrap())
            .collect();
        assert_eq!(
            missing,
            [
                "truncate",
                "tcp_connect",
                "ioctl_dev",
                "scope",
                "resolve_unix",
                "udp_send"
            ]
        );
        assert!(
            r["missing"][0]["covered_by"][0]
                .as_str()
                .unwrap()
                .starts_with("read-only mounts")
        );
        assert!(r["unused"].as_array().unwrap().is_empty());
        // This machine's kernel: the same report from a real plan.
        let host = agent_sandbox_sys::landlock_abi().unwrap();
        let at = at_abi(&ruleset(&policy), host, &facts);
        assert_eq!(u32::from(at.abi), host.min(10));
    }

    #[test]
    fn apparmor_is_reported_with_its_profile_or_its_reason() {
        let on = Applied {
            apparmor_profile: Some("agent-sandbox-0123456789abcdef".into()),
            ..Applied::default()
        };
        let r = apparmor_report(&on, None);
        assert_eq!(r["active"], true);
        assert_eq!(r["profile"], "agent-sandbox-0123456789abcdef");
        let mut off = Applied::default();
        off.inactive.insert(
            "apparmor".into(),
            "not available on this host; Landlock enforces the filesystem rules".into(),
        );
        let r = apparmor_report(&off, None);
        assert_eq!(r["active"], false);
        assert!(r["reason"].as_str().unwrap().contains("Landlock"));
    }

    #[test]
    fn report_reads_the_live_process_and_names_a_missing_record() {
        let root = tempfile::tempdir().unwrap();
        let dirs = StateDirs::new(root.path().to_owned());
        let id = ContainerId::try_from("lay1").unwrap();
        let layers = dirs.sandbox(&id).layers().path().to_owned();
        let e = report(&dirs, &id, "running", None).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "sandbox lay1 has no layers record at {} (created by an older runtime?)",
                layers.display()
            )
        );
        std::fs::create_dir_all(dirs.sandbox(&id).path()).unwrap();
        // A record that is there but unreadable as JSON is not "missing": the error says so.
        std::fs::write(&layers, "{").unwrap();
        let e = report(&dirs, &id, "running", None).unwrap_err().to_string();
        assert_eq!(e, format!("cannot parse {}", layers.display()));
        let me = i32::try_from(std::process::id()).unwrap();
        Applied {
            userns_host_start: 1_000_000,
            userns_size: 65536,
            cgroups: cgroups_of(me),
            ..Applied::default()
        }
        .save(&dirs.sandbox(&id))
        .unwrap();
        let r = report(&dirs, &id, "running", Some(me)).unwrap();
        assert_eq!(r["userns"]["mapping"], "0 1000000 65536");
        assert_eq!(r["live"]["pid"], me);
        // This test process is not a sandbox: the live view must say so.
        assert_eq!(r["live"]["capabilities_empty"], false);
        let stopped = report(&dirs, &id, "stopped", Some(me)).unwrap();
        assert!(stopped["live"].is_null());
    }
}
