//! The sandbox's limits in the cgroup files: read back after create and update (a limit that
//! did not take is an error naming it), written by the runtime itself where libcontainer may
//! not (rootless v1), and the policy's ceiling on `update`.

use std::path::{Path, PathBuf};

use agent_sandbox_policy::SandboxPolicy;
use libcontainer::oci_spec::runtime::{LinuxResources, Spec};

use super::{CgroupsError, Driver, Hierarchy, Host};
use crate::state::ContainerId;

/// A limit the runtime checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Pids,
    CpuQuota,
    CpuShares,
    CpuWeight,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::Memory => "memory",
            Limit::Pids => "pids",
            Limit::CpuQuota => "cpu quota",
            Limit::CpuShares => "cpu shares",
            Limit::CpuWeight => "cpu weight",
        })
    }
}

/// The kernel keeps memory limits in pages: a limit reads back rounded down to the page size
/// (4 KiB here, up to 64 KiB on some arm64 kernels). Never above what was asked.
const MAX_PAGE: i64 = 64 * 1024;

/// The spec's resources, read back from the container's cgroup files. On v1 the cgroup is
/// the spec's cgroupsPath in each controller; on v2 it is the v2 directory of `init_pid`
/// (under systemd only systemd knows the scope's path until the init is in it).
pub fn verify(
    host: &dyn Host,
    hierarchy: Hierarchy,
    driver: Driver,
    spec: &Spec,
    id: &ContainerId,
    init_pid: i32,
) -> Result<(), CgroupsError> {
    let Some(linux) = spec.linux().as_ref() else {
        return Ok(());
    };
    let Some(res) = linux.resources().as_ref() else {
        return Ok(());
    };
    match hierarchy {
        Hierarchy::Legacy | Hierarchy::Hybrid => {
            let rel = libcontainer::utils::get_cgroup_path(linux.cgroups_path(), id.as_str());
            let rel = rel.to_string_lossy().trim_start_matches('/').to_owned();
            verify_v1(host.root(), &rel, res)
        }
        Hierarchy::Unified => {
            let procs = host.proc_cgroups(init_pid)?;
            let dir = procs
                .dirs(host.root(), hierarchy)
                .remove("unified")
                .ok_or_else(|| CgroupsError::NoUnified {
                    path: procs.source().to_owned(),
                })?;
            verify_v2(&dir, res, driver)
        }
    }
}

fn read(dir: &Path, file: &str) -> Result<String, CgroupsError> {
    let path = dir.join(file);
    Ok(crate::files::read_to_string(&path)?.trim().to_owned())
}

fn not_applied(
    limit: Limit,
    dir: &Path,
    file: &'static str,
    got: String,
    want: String,
) -> CgroupsError {
    CgroupsError::NotApplied {
        limit,
        dir: dir.to_owned(),
        file,
        got,
        want,
    }
}

/// A memory limit read back: at most `limit`, less only by the page rounding.
fn memory_matches(got: &str, limit: i64) -> bool {
    got.parse::<i64>()
        .is_ok_and(|g| g <= limit && limit - g < MAX_PAGE)
}

fn verify_v1(root: &Path, rel: &str, res: &LinuxResources) -> Result<(), CgroupsError> {
    let expect =
        |ctrl: &str, file: &'static str, limit: Limit, ok: &dyn Fn(&str) -> bool, want: String| {
            let dir = root.join(ctrl).join(rel);
            let got = read(&dir, file)?;
            if ok(&got) {
                Ok(())
            } else {
                Err(not_applied(limit, &dir, file, got, want))
            }
        };
    if let Some(limit) = res.memory().as_ref().and_then(|m| m.limit())
        && limit > 0
    {
        expect(
            "memory",
            "memory.limit_in_bytes",
            Limit::Memory,
            &|g| memory_matches(g, limit),
            limit.to_string(),
        )?;
    }
    // pids and cpu read back exactly what was written.
    let exact = |ctrl: &str, file: &'static str, limit: Limit, want: String| {
        expect(ctrl, file, limit, &|g| g == want, want.clone())
    };
    if let Some(pids) = res.pids().as_ref()
        && pids.limit() > 0
    {
        exact("pids", "pids.max", Limit::Pids, pids.limit().to_string())?;
    }
    if let Some(cpu) = res.cpu().as_ref() {
        if let Some(q) = cpu.quota()
            && q > 0
        {
            exact("cpu", "cpu.cfs_quota_us", Limit::CpuQuota, q.to_string())?;
        }
        if let Some(s) = cpu.shares()
            && s > 0
        {
            exact("cpu", "cpu.shares", Limit::CpuShares, s.to_string())?;
        }
    }
    Ok(())
}

/// The default CFS period when the spec gives none (the kernel's and systemd's).
const DEFAULT_PERIOD_US: u64 = 100_000;

fn verify_v2(dir: &Path, res: &LinuxResources, driver: Driver) -> Result<(), CgroupsError> {
    if let Some(limit) = res.memory().as_ref().and_then(|m| m.limit())
        && limit > 0
    {
        let got = read(dir, "memory.max")?;
        if !memory_matches(&got, limit) {
            return Err(not_applied(
                Limit::Memory,
                dir,
                "memory.max",
                got,
                limit.to_string(),
            ));
        }
    }
    if let Some(pids) = res.pids().as_ref()
        && pids.limit() > 0
    {
        let got = read(dir, "pids.max")?;
        let want = pids.limit().to_string();
        if got != want {
            return Err(not_applied(Limit::Pids, dir, "pids.max", got, want));
        }
    }
    let Some(cpu) = res.cpu().as_ref() else {
        return Ok(());
    };
    if let Some(quota) = cpu.quota()
        && let Ok(quota) = u64::try_from(quota)
        && quota > 0
    {
        let period = cpu.period().filter(|p| *p > 0).unwrap_or(DEFAULT_PERIOD_US);
        let got = read(dir, "cpu.max")?;
        if !cpu_max_matches(&got, quota, period, driver) {
            return Err(not_applied(
                Limit::CpuQuota,
                dir,
                "cpu.max",
                got,
                format!("{quota} {period}"),
            ));
        }
    }
    if let Some(shares) = cpu.shares()
        && shares > 0
    {
        let got = read(dir, "cpu.weight")?;
        let want = cpu_weight(shares).to_string();
        if got != want {
            return Err(not_applied(Limit::CpuWeight, dir, "cpu.weight", got, want));
        }
    }
    Ok(())
}

/// `cpu.max` ("QUOTA PERIOD" or "max PERIOD") against the asked quota and period. cgroupfs
/// writes them as given. systemd takes the quota as CPU time per second and computes the file
/// from it, so integer rounding may move it: accepted within 1% of one CPU.
fn cpu_max_matches(got: &str, quota: u64, period: u64, driver: Driver) -> bool {
    let mut parts = got.split_whitespace();
    let (Some(Ok(q)), Some(Ok(p))) = (
        parts.next().map(str::parse::<u64>),
        parts.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    match driver {
        Driver::Cgroupfs => q == quota && p == period,
        Driver::Systemd => {
            // |q/p - quota/period| <= 1/100, compared crosswise in integers.
            let lhs = u128::from(q) * u128::from(period);
            let rhs = u128::from(quota) * u128::from(p);
            let slack = u128::from(p) * u128::from(period) / 100;
            p > 0 && lhs.abs_diff(rhs) <= slack
        }
    }
}

/// The cgroup v2 `cpu.weight` (1..=10000, default 100) that libcgroups' v2 and systemd
/// managers write for v1 `cpu.shares` (2..=262144, default 1024): the quadratic mapping in
/// log space that runc 1.3.2 and opencontainers/cgroups adopted (10^((l² + 125 l) / 612 -
/// 7/34) with l = log2(shares), rounded up), which keeps the default and both ends in place.
pub fn cpu_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        1..=2 => 1,
        262_144.. => 10_000,
        s => {
            #[allow(clippy::cast_precision_loss)] // s < 2^18 is exact in an f64
            let l = (s as f64).log2();
            let w = 10f64.powf((l * l + 125.0 * l) / 612.0 - 7.0 / 34.0).ceil();
            // w lies in [1, 10000] for s in (2, 262144): the cast neither truncates nor wraps.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let w = w as u64;
            w.clamp(1, 10_000)
        }
    }
}

/// Writes the memory, pids and cpu limits of `res` into the container's v1 cgroups
/// (rootless v1: the runtime owns the delegated cgroup, see `rootless_v1`).
pub fn apply_v1_limits(
    host: &dyn Host,
    spec: &Spec,
    id: &ContainerId,
    res: &LinuxResources,
) -> Result<(), CgroupsError> {
    let Some(linux) = spec.linux().as_ref() else {
        return Ok(());
    };
    let rel = libcontainer::utils::get_cgroup_path(linux.cgroups_path(), id.as_str());
    let rel = rel.to_string_lossy().trim_start_matches('/').to_owned();
    let write = |ctrl: &str, file: &str, value: String| -> Result<(), CgroupsError> {
        let path: PathBuf = host.root().join(ctrl).join(&rel).join(file);
        std::fs::write(&path, &value).map_err(|source| CgroupsError::Write {
            path,
            value,
            source,
        })
    };
    if let Some(limit) = res.memory().as_ref().and_then(|m| m.limit())
        && limit > 0
    {
        write("memory", "memory.limit_in_bytes", limit.to_string())?;
    }
    if let Some(pids) = res.pids().as_ref()
        && pids.limit() > 0
    {
        write("pids", "pids.max", pids.limit().to_string())?;
    }
    if let Some(cpu) = res.cpu().as_ref() {
        if let Some(p) = cpu.period()
            && p > 0
        {
            write("cpu", "cpu.cfs_period_us", p.to_string())?;
        }
        if let Some(q) = cpu.quota()
            && q > 0
        {
            write("cpu", "cpu.cfs_quota_us", q.to_string())?;
        }
        if let Some(sh) = cpu.shares()
            && sh > 0
        {
            write("cpu", "cpu.shares", sh.to_string())?;
        }
    }
    Ok(())
}

/// Refuses an `update` that would lift a limit above the policy or remove it.
pub fn check_update_within(
    res: &LinuxResources,
    policy: &SandboxPolicy,
) -> Result<(), CgroupsError> {
    let over = |what: &'static str, got: String, max: String| CgroupsError::AboveCeiling {
        what,
        got,
        max,
    };
    let max_mem = i64::try_from(policy.resources.memory.bytes()).unwrap_or(i64::MAX);
    if let Some(mem) = res.memory().as_ref() {
        for (what, v) in [("memory.limit", mem.limit()), ("memory.swap", mem.swap())] {
            if let Some(v) = v
                && (v <= 0 || v > max_mem)
            {
                return Err(over(what, v.to_string(), max_mem.to_string()));
            }
        }
    }
    if let Some(pids) = res.pids().as_ref() {
        let max = i64::from(policy.resources.pids);
        if pids.limit() <= 0 || pids.limit() > max {
            return Err(over(
                "pids.limit",
                pids.limit().to_string(),
                max.to_string(),
            ));
        }
    }
    if let Some(cpu) = res.cpu().as_ref() {
        if let Some(sh) = cpu.shares()
            && sh > policy.resources.cpu_shares
        {
            return Err(over(
                "cpu.shares",
                sh.to_string(),
                policy.resources.cpu_shares.to_string(),
            ));
        }
        let period = cpu.period().unwrap_or(policy.resources.cpu_period_us);
        if let Some(q) = cpu.quota() {
            // quota/period must not exceed the policy's ratio (compared crosswise).
            let lhs = i128::from(q) * i128::from(policy.resources.cpu_period_us);
            let rhs = i128::from(policy.resources.cpu_quota_us) * i128::from(period);
            if q <= 0 || lhs > rhs {
                return Err(over(
                    "cpu quota/period",
                    format!("{q}/{period}"),
                    format!(
                        "{}/{}",
                        policy.resources.cpu_quota_us, policy.resources.cpu_period_us
                    ),
                ));
            }
        }
    }
    // containerd's CRI sends the container's whole resources section with every
    // UpdateContainerResources, device rules included (its default: deny all). Deny rules
    // can only narrow; the sandbox keeps its own fixed device rules (see `update_resources`).
    // An allow rule would widen and is refused.
    if res.devices().iter().flatten().any(|d| d.allow()) {
        return Err(CgroupsError::DeviceAllow);
    }
    Ok(())
}

/// The resources an `update` applies after [`check_update_within`] passed: the incoming
/// limits without device rules, so the sandbox's device rules stay as created (writing a
/// CRI deny-all would take /dev/null and the other safe devices from the workload).
pub fn update_resources(res: &LinuxResources) -> LinuxResources {
    let mut out = res.clone();
    out.set_devices(None);
    out
}

#[cfg(test)]
mod tests {
    use super::super::fake::FakeHost;
    use super::*;
    use libcontainer::oci_spec::runtime::{
        LinuxBuilder, LinuxCpuBuilder, LinuxDeviceCgroup, LinuxMemoryBuilder, LinuxPidsBuilder,
        LinuxResourcesBuilder, SpecBuilder,
    };

    fn resources() -> LinuxResources {
        LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(2_147_483_648_i64)
                    .build()
                    .unwrap(),
            )
            .pids(LinuxPidsBuilder::default().limit(1024).build().unwrap())
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(1024_u64)
                    .quota(200_000_i64)
                    .period(100_000_u64)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    fn spec(path: &str) -> Spec {
        let linux = LinuxBuilder::default()
            .cgroups_path(PathBuf::from(path))
            .resources(resources())
            .build()
            .unwrap();
        SpecBuilder::default().linux(linux).build().unwrap()
    }

    fn id() -> ContainerId {
        ContainerId::try_from("c1").unwrap()
    }

    const INIT: i32 = 77;

    fn v2_host(files: &[(&str, &str)]) -> FakeHost {
        let host = FakeHost::new(Hierarchy::Unified)
            .with_proc(INIT, "0::/machine.slice/libpod-c1.scope\n");
        host.cgroup("machine.slice/libpod-c1.scope", files);
        host
    }

    const GOOD_V2: [(&str, &str); 4] = [
        ("memory.max", "2147483648\n"),
        ("pids.max", "1024\n"),
        ("cpu.max", "200000 100000\n"),
        ("cpu.weight", "100\n"),
    ];

    #[test]
    fn v2_limits_that_took_pass() {
        let host = v2_host(&GOOD_V2);
        for driver in [Driver::Cgroupfs, Driver::Systemd] {
            verify(&host, Hierarchy::Unified, driver, &spec("/x"), &id(), INIT).unwrap();
        }
    }

    #[test]
    fn a_v2_limit_that_did_not_take_is_named() {
        for (file, value, limit) in [
            ("memory.max", "max", Limit::Memory),
            ("pids.max", "max", Limit::Pids),
            ("cpu.max", "max 100000", Limit::CpuQuota),
            ("cpu.weight", "39", Limit::CpuWeight),
        ] {
            let mut files = GOOD_V2.to_vec();
            files.retain(|(f, _)| *f != file);
            files.push((file, value));
            let host = v2_host(&files);
            let e = verify(
                &host,
                Hierarchy::Unified,
                Driver::Cgroupfs,
                &spec("/x"),
                &id(),
                INIT,
            )
            .unwrap_err();
            assert!(
                matches!(&e, CgroupsError::NotApplied { limit: l, file: f, .. } if *l == limit && *f == file),
                "{e}"
            );
            assert!(e.to_string().contains(file), "{e}");
        }
    }

    #[test]
    fn a_missing_v2_file_is_an_error_naming_it() {
        let host = v2_host(&GOOD_V2[..1]);
        let e = verify(
            &host,
            Hierarchy::Unified,
            Driver::Cgroupfs,
            &spec("/x"),
            &id(),
            INIT,
        )
        .unwrap_err();
        assert!(e.to_string().contains("pids.max"), "{e}");
    }

    #[test]
    fn v2_memory_rounds_down_to_pages_but_never_up() {
        assert!(memory_matches("2147479552", 2_147_483_647));
        assert!(memory_matches("2147483648", 2_147_483_648));
        assert!(!memory_matches("2147487744", 2_147_483_648));
        assert!(!memory_matches("max", 2_147_483_648));
        assert!(!memory_matches("1048576", 2_147_483_648));
    }

    #[test]
    fn systemd_cpu_max_may_round_a_little() {
        assert!(cpu_max_matches(
            "200000 100000",
            200_000,
            100_000,
            Driver::Cgroupfs
        ));
        assert!(!cpu_max_matches(
            "200001 100000",
            200_000,
            100_000,
            Driver::Cgroupfs
        ));
        assert!(cpu_max_matches(
            "200001 100000",
            200_000,
            100_000,
            Driver::Systemd
        ));
        assert!(cpu_max_matches(
            "20000 10000",
            200_000,
            100_000,
            Driver::Systemd
        ));
        assert!(!cpu_max_matches(
            "300000 100000",
            200_000,
            100_000,
            Driver::Systemd
        ));
        assert!(!cpu_max_matches(
            "max 100000",
            200_000,
            100_000,
            Driver::Systemd
        ));
    }

    #[test]
    fn cpu_weight_keeps_the_default_and_the_ends() {
        assert_eq!(cpu_weight(0), 0);
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 100);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert!(cpu_weight(512) < 100 && cpu_weight(2048) > 100);
    }

    #[test]
    fn v1_limits_are_read_from_the_spec_path() {
        let host = FakeHost::new(Hierarchy::Hybrid);
        host.cgroup(
            "memory/pods/c1",
            &[("memory.limit_in_bytes", "2147483648\n")],
        );
        host.cgroup("pids/pods/c1", &[("pids.max", "1024\n")]);
        host.cgroup(
            "cpu/pods/c1",
            &[("cpu.cfs_quota_us", "200000\n"), ("cpu.shares", "1024\n")],
        );
        verify(
            &host,
            Hierarchy::Hybrid,
            Driver::Cgroupfs,
            &spec("/pods/c1"),
            &id(),
            INIT,
        )
        .unwrap();
        std::fs::write(host.root().join("pids/pods/c1/pids.max"), "max\n").unwrap();
        let e = verify(
            &host,
            Hierarchy::Hybrid,
            Driver::Cgroupfs,
            &spec("/pods/c1"),
            &id(),
            INIT,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                CgroupsError::NotApplied {
                    limit: Limit::Pids,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn rootless_v1_limits_are_written_where_verify_reads_them() {
        let host = FakeHost::new(Hierarchy::Legacy);
        for c in ["memory", "pids", "cpu"] {
            host.cgroup(&format!("{c}/u/c1"), &[]);
        }
        let s = spec("/u/c1");
        apply_v1_limits(&host, &s, &id(), &resources()).unwrap();
        verify(&host, Hierarchy::Legacy, Driver::Cgroupfs, &s, &id(), INIT).unwrap();
    }

    #[test]
    fn cri_deny_all_device_rules_are_kept_out_of_an_update() {
        let policy = SandboxPolicy::builtin(crate::harden::DEFAULT_PROFILE).unwrap();
        let mut deny_all = LinuxDeviceCgroup::default();
        deny_all.set_allow(false);
        deny_all.set_access(Some("rwm".into()));
        let mut res = LinuxResources::default();
        res.set_devices(Some(vec![deny_all.clone()]));
        check_update_within(&res, &policy).unwrap();
        assert!(update_resources(&res).devices().is_none());
        let mut allow = deny_all;
        allow.set_allow(true);
        res.set_devices(Some(vec![allow]));
        let err = check_update_within(&res, &policy).unwrap_err();
        assert!(err.to_string().contains("devices"), "{err}");
    }

    #[test]
    fn an_update_above_the_policy_is_named() {
        let policy = SandboxPolicy::builtin(crate::harden::DEFAULT_PROFILE).unwrap();
        let mut res = LinuxResources::default();
        res.set_pids(Some(
            LinuxPidsBuilder::default()
                .limit(1_000_000)
                .build()
                .unwrap(),
        ));
        let e = check_update_within(&res, &policy).unwrap_err();
        assert!(
            matches!(
                e,
                CgroupsError::AboveCeiling {
                    what: "pids.limit",
                    ..
                }
            ),
            "{e}"
        );
    }
}
