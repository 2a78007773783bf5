//! The allowlist compiled to a classic BPF program with seccompiler's backend.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, sock_filter,
};

use super::allowlist::{ArgCheck, Args, ERRNO_OVERRIDES, REVIEWED_THROUGH, Test, Width};
use super::{Arch, ENOSYS, SeccompError, SyscallPolicy};

// Classic BPF opcodes (linux/bpf_common.h) and audit architectures (linux/audit.h) for the
// prologue below. seccompiler keeps its own copies private.
pub(super) const BPF_LD_W_ABS: u16 = 0x20;
pub(super) const BPF_JMP_JEQ_K: u16 = 0x15;
pub(super) const BPF_JMP_JGE_K: u16 = 0x35;
pub(super) const BPF_RET_K: u16 = 0x06;
/// `struct seccomp_data` offsets: `nr` then `arch`.
pub(super) const SECCOMP_DATA_NR: u32 = 0;
pub(super) const SECCOMP_DATA_ARCH: u32 = 4;
/// SECCOMP_RET_ERRNO (linux/seccomp.h); the low 16 bits carry the errno.
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub(super) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
pub(super) const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;

/// Compiles `policy` to a BPF program for `arch`, for `seccompiler::apply_filter` (after
/// `PR_SET_NO_NEW_PRIVS`, which `apply_filter` sets itself).
///
/// The program is one filter: a short prologue that answers the ENOSYS cases (see the
/// module docs), then seccompiler's allowlist filter, whose default is the policy's errno.
/// seccompiler gives every matching rule the same action, so the per-syscall ENOSYS answers
/// cannot be expressed in its filter; the prologue is written by hand instead, five to seven
/// instructions whose layout the unit tests pin down.
pub fn compile_bpf(policy: &SyscallPolicy, arch: Arch) -> Result<BpfProgram, SeccompError> {
    policy.validate()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for entry in policy.allowed() {
        if entry.only_on.is_some_and(|only| only != arch) {
            continue;
        }
        let nr = arch
            .syscall_number(entry.name)
            .ok_or(SeccompError::NotOnArch {
                name: entry.name,
                arch,
            })?;
        let chain = match entry.args {
            Args::Any => Vec::new(),
            Args::AnyOf(alternatives) => alternatives
                .iter()
                .map(|checks| rule(checks, arch))
                .collect::<Result<_, _>>()?,
        };
        rules.insert(nr, chain);
    }
    let compile = |source| SeccompError::Compile { arch, source };
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(policy.errno.number()),
        SeccompAction::Allow,
        arch.target(),
    )
    .map_err(compile)?;
    let allowlist: BpfProgram = filter.try_into().map_err(compile)?;
    let mut program = prologue(arch)?;
    program.extend(allowlist);
    Ok(program)
}

/// The names allowed on `arch` under `policy`, in table order (for counts and `explain`).
pub fn allowed_names(policy: &SyscallPolicy, arch: Arch) -> Vec<&'static str> {
    policy
        .allowed()
        .filter(|entry| entry.only_on.is_none_or(|only| only == arch))
        .map(|entry| entry.name)
        .collect()
}

fn rule(checks: &[ArgCheck], arch: Arch) -> Result<SeccompRule, SeccompError> {
    let compile = |source| SeccompError::Compile { arch, source };
    let mut conditions = Vec::new();
    for check in checks {
        let len = match check.width {
            Width::U32 => SeccompCmpArgLen::Dword,
            Width::U64 => SeccompCmpArgLen::Qword,
        };
        let mut push = |op, value| {
            SeccompCondition::new(check.index, len.clone(), op, value)
                .map(|c| conditions.push(c))
                .map_err(compile)
        };
        match check.test {
            Test::Eq(value) => push(SeccompCmpOp::Eq, value)?,
            Test::NoBitsOf(mask) => push(SeccompCmpOp::MaskedEq(mask), 0)?,
            Test::NoneOf(values) => {
                for &value in values {
                    push(SeccompCmpOp::Ne, value)?;
                }
            }
        }
    }
    SeccompRule::new(conditions).map_err(compile)
}

/// Instructions run before the allowlist:
///
/// ```text
///   ld  [arch]
///   jeq AUDIT_ARCH, 0, <to allowlist>   ; foreign ABI: the allowlist's own check kills
///   ld  [nr]
///   jeq <override nr>, 0, 1             ; once per ERRNO_OVERRIDES entry
///   ret ERRNO | <override errno>
///   jge <first unreviewed nr>, 0, 1
///   ret ERRNO | ENOSYS
/// ```
fn prologue(arch: Arch) -> Result<BpfProgram, SeccompError> {
    let number = |name: &'static str| {
        arch.syscall_number(name)
            .and_then(|nr| u32::try_from(nr).ok())
            .ok_or(SeccompError::NotOnArch { name, arch })
    };
    let audit_arch = match arch {
        Arch::X86_64 => AUDIT_ARCH_X86_64,
        Arch::Aarch64 => AUDIT_ARCH_AARCH64,
    };
    let mut body = vec![stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR)];
    for answer in ERRNO_OVERRIDES {
        body.push(jump(BPF_JMP_JEQ_K, number(answer.name)?, 0, 1));
        body.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | answer.errno));
    }
    let first_unreviewed = number(REVIEWED_THROUGH)?.saturating_add(1);
    body.push(jump(BPF_JMP_JGE_K, first_unreviewed, 0, 1));
    body.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | ENOSYS));

    let skip = u8::try_from(body.len()).map_err(|_| SeccompError::PrologueTooLong)?;
    let mut program = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, audit_arch, 0, skip),
    ];
    program.extend(body);
    Ok(program)
}

pub(super) const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

pub(super) const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}
