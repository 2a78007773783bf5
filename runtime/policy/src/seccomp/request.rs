//! A caller's own seccomp profile (`linux.seccomp` in config.json, which is also where a
//! CRI `localhost/` or `RuntimeDefault` profile and podman's default profile arrive),
//! honoured beside the policy's filter.
//!
//! The policy is a ceiling, so a request can only narrow it. Both are installed: the
//! policy's filter first, then the filters compiled here, and for every syscall the kernel
//! takes the strictest answer of all of them (`seccomp(2)`, "Filter return values"). Where the
//! policy itself denies a syscall outright (not in its allowlist on this architecture, or a
//! number above the table it reviewed), the request's filters allow it, so the policy's
//! answer stands: its errno, and the `syscall_denied` audit record its supervisor writes (the
//! request's own errno would otherwise win over the policy's user notification and the
//! denial would go unrecorded).
//!
//! OCI profiles give each rule its own action; seccompiler gives every rule of one filter the
//! same action. So the request becomes one filter per distinct action `A` (its rules with
//! action `A` match and return `A`, everything else is allowed), plus, unless the default
//! action is to allow, one filter whose rules are all of the request's rules and whose
//! mismatch action is the default. A syscall that matches rules with different actions gets
//! the strictest of them (libseccomp would pick one); never a wider answer.
//!
//! What cannot be honoured is refused, naming the key: a user-notification action
//! (`SCMP_ACT_NOTIFY`, `listenerPath`: the sandbox's notifications go to its own supervisor),
//! and filter `flags` (`SECCOMP_FILTER_FLAG_SPEC_ALLOW` would turn off a Spectre
//! mitigation; the others have no effect without the features refused above or are not
//! supported by the filter loader). As with runc and libseccomp, a syscall name this
//! architecture does not have is skipped, and only the native architecture is compiled:
//! the policy's filter kills every process that uses a foreign syscall ABI.

use std::collections::{BTreeMap, BTreeSet};

use oci_spec::runtime::{
    LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompFilterFlag, LinuxSeccompOperator,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use super::{Arch, SyscallPolicy};

/// The errno of `SCMP_ACT_ERRNO` and `SCMP_ACT_TRACE` without `errnoRet` (runc's EPERM).
const EPERM: u32 = 1;

/// Why a requested profile cannot be honoured. Nothing is installed when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("linux.seccomp.{key}: {reason}")]
    Unsupported { key: String, reason: &'static str },
    #[error("linux.seccomp.{key}: argument index {index} is not one of 0-5")]
    ArgIndex { key: String, index: usize },
    #[error("linux.seccomp: cannot compile the filter for {arch:?}")]
    Compile {
        arch: Arch,
        #[source]
        source: seccompiler::BackendError,
    },
}

/// Compiles `request` into filters to install after the policy's (see the module docs).
/// Returns no filter for a request that allows everything the policy does not deny.
pub fn compile_request(
    request: &LinuxSeccomp,
    policy: &SyscallPolicy,
    arch: Arch,
) -> Result<Vec<BpfProgram>, RequestError> {
    check_supported(request)?;
    let allowed_by_policy: BTreeSet<i64> = policy
        .allowed()
        .filter(|e| e.only_on.is_none_or(|only| only == arch))
        .filter_map(|e| arch.syscall_number(e.name))
        .collect();
    // Every rule, grouped by action, in the order the request lists them.
    let mut groups: Vec<(SeccompAction, BTreeMap<i64, Vec<SeccompRule>>)> = Vec::new();
    let mut all: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (i, call) in request.syscalls().iter().flatten().enumerate() {
        let key = format!("syscalls[{i}]");
        let action = action(call.action(), call.errno_ret(), &format!("{key}.action"))?;
        let rules = rules(call.args().as_deref().unwrap_or_default(), &key, arch)?;
        for name in call.names() {
            let Some(nr) = arch.syscall_number(name) else {
                continue; // not a syscall of this architecture (runc skips it too)
            };
            if !allowed_by_policy.contains(&nr) {
                continue; // the policy denies it itself, and records it
            }
            let at = match groups.iter().position(|(a, _)| *a == action) {
                Some(at) => at,
                None => {
                    groups.push((action.clone(), BTreeMap::new()));
                    groups.len() - 1
                }
            };
            merge(&mut groups[at].1, nr, &rules);
            merge(&mut all, nr, &rules);
        }
    }
    let compile = |source| RequestError::Compile { arch, source };
    let mut programs = Vec::new();
    for (action, map) in groups {
        if action == SeccompAction::Allow || map.is_empty() {
            continue;
        }
        let filter = SeccompFilter::new(map, SeccompAction::Allow, action, arch.target())
            .map_err(compile)?;
        programs.push(with_prologue(arch, filter)?);
    }
    let default = action(
        request.default_action(),
        request.default_errno_ret(),
        "defaultAction",
    )?;
    if default != SeccompAction::Allow {
        // The policy's own denials are its to answer: the default lets them through to it.
        for nr in every_syscall(arch).filter(|nr| !allowed_by_policy.contains(nr)) {
            all.insert(nr, Vec::new());
        }
        let filter = SeccompFilter::new(all, default, SeccompAction::Allow, arch.target())
            .map_err(compile)?;
        programs.push(with_prologue(arch, filter)?);
    }
    Ok(programs)
}

/// `filter` behind a prologue that allows every syscall number above the policy's reviewed
/// table: the policy answers those itself (ENOSYS, and a `syscall_denied` record).
///
/// ```text
///   ld  [arch]
///   jeq AUDIT_ARCH, 0, 3       ; foreign ABI: the filter's own arch check kills
///   ld  [nr]
///   jge <first unreviewed nr>, 0, 1
///   ret ALLOW
/// ```
fn with_prologue(arch: Arch, filter: SeccompFilter) -> Result<BpfProgram, RequestError> {
    use super::bpf::{
        AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS,
        BPF_RET_K, SECCOMP_DATA_ARCH, SECCOMP_DATA_NR, jump, stmt,
    };
    let compile = |source| RequestError::Compile { arch, source };
    let first_unreviewed = arch
        .syscall_number(super::allowlist::REVIEWED_THROUGH)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    let audit_arch = match arch {
        Arch::X86_64 => AUDIT_ARCH_X86_64,
        Arch::Aarch64 => AUDIT_ARCH_AARCH64,
    };
    let mut program = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, audit_arch, 0, 3),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
        jump(BPF_JMP_JGE_K, first_unreviewed, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
    ];
    program.extend(BpfProgram::try_from(filter).map_err(compile)?);
    Ok(program)
}

/// SECCOMP_RET_ALLOW (linux/seccomp.h).
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

fn check_supported(request: &LinuxSeccomp) -> Result<(), RequestError> {
    if request.listener_path().is_some() {
        return Err(RequestError::Unsupported {
            key: "listenerPath".to_owned(),
            reason: "a seccomp agent cannot get the sandbox's notifications (its own supervisor answers them)",
        });
    }
    if let Some(flag) = request.flags().iter().flatten().next() {
        return Err(RequestError::Unsupported {
            key: "flags".to_owned(),
            reason: match flag {
                LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => {
                    "SECCOMP_FILTER_FLAG_SPEC_ALLOW would turn off the speculative store bypass mitigation"
                }
                _ => "filter flags are not supported",
            },
        });
    }
    Ok(())
}

/// The seccompiler action of an OCI action (`errno` is `errnoRet`).
fn action(
    action: LinuxSeccompAction,
    errno: Option<u32>,
    key: &str,
) -> Result<SeccompAction, RequestError> {
    Ok(match action {
        LinuxSeccompAction::ScmpActAllow => SeccompAction::Allow,
        LinuxSeccompAction::ScmpActErrno => SeccompAction::Errno(errno.unwrap_or(EPERM)),
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
            SeccompAction::KillThread
        }
        LinuxSeccompAction::ScmpActKillProcess => SeccompAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => SeccompAction::Trap,
        LinuxSeccompAction::ScmpActTrace => SeccompAction::Trace(errno.unwrap_or(EPERM)),
        LinuxSeccompAction::ScmpActLog => SeccompAction::Log,
        LinuxSeccompAction::ScmpActNotify => {
            return Err(RequestError::Unsupported {
                key: key.to_owned(),
                reason: "SCMP_ACT_NOTIFY: the sandbox's notifications go to its own supervisor",
            });
        }
    })
}

/// The rules of one OCI syscall entry: its conditions all hold (one rule), except that
/// several conditions on the same argument are alternatives (one rule each), as runc
/// compiles them. No conditions: the syscall always matches (no rule).
fn rules(
    args: &[LinuxSeccompArg],
    key: &str,
    arch: Arch,
) -> Result<Vec<SeccompRule>, RequestError> {
    let compile = |source| RequestError::Compile { arch, source };
    let mut conditions = Vec::new();
    for (j, a) in args.iter().enumerate() {
        let index = u8::try_from(a.index())
            .ok()
            .filter(|i| *i < 6)
            .ok_or_else(|| RequestError::ArgIndex {
                key: format!("{key}.args[{j}]"),
                index: a.index(),
            })?;
        let (op, value) = match a.op() {
            LinuxSeccompOperator::ScmpCmpNe => (SeccompCmpOp::Ne, a.value()),
            LinuxSeccompOperator::ScmpCmpLt => (SeccompCmpOp::Lt, a.value()),
            LinuxSeccompOperator::ScmpCmpLe => (SeccompCmpOp::Le, a.value()),
            LinuxSeccompOperator::ScmpCmpEq => (SeccompCmpOp::Eq, a.value()),
            LinuxSeccompOperator::ScmpCmpGe => (SeccompCmpOp::Ge, a.value()),
            LinuxSeccompOperator::ScmpCmpGt => (SeccompCmpOp::Gt, a.value()),
            LinuxSeccompOperator::ScmpCmpMaskedEq => (
                SeccompCmpOp::MaskedEq(a.value()),
                a.value_two().unwrap_or_default(),
            ),
        };
        conditions.push(
            SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value).map_err(compile)?,
        );
    }
    if conditions.is_empty() {
        return Ok(Vec::new());
    }
    let mut indexes: Vec<usize> = args.iter().map(|a| a.index()).collect();
    indexes.sort_unstable();
    let repeated = indexes.windows(2).any(|w| w[0] == w[1]);
    if repeated {
        conditions
            .into_iter()
            .map(|c| SeccompRule::new(vec![c]).map_err(compile))
            .collect()
    } else {
        Ok(vec![SeccompRule::new(conditions).map_err(compile)?])
    }
}

/// Adds `rules` for `nr` to `map`: no rules (always matches) absorbs any others.
fn merge(map: &mut BTreeMap<i64, Vec<SeccompRule>>, nr: i64, rules: &[SeccompRule]) {
    match map.get_mut(&nr) {
        None => {
            map.insert(nr, rules.to_vec());
        }
        Some(existing) if existing.is_empty() => {}
        Some(existing) if rules.is_empty() => existing.clear(),
        Some(existing) => existing.extend(rules.iter().cloned()),
    }
}

/// Every syscall number of `arch` up to the policy's reviewed table.
fn every_syscall(arch: Arch) -> impl Iterator<Item = i64> {
    let last = arch
        .syscall_number(super::allowlist::REVIEWED_THROUGH)
        .unwrap_or_default();
    (0..=last).filter(move |nr| arch.has_number(*nr))
}
