//! The allowlist emitted as the OCI `linux.seccomp` object (runc, crun, podman).
//!
//! The OCI format is evaluated by libseccomp, which differs from our BPF in two ways that
//! this translation handles:
//! - runc ORs (not ANDs) several comparisons of the *same* argument inside one entry, so
//!   "request is neither TIOCSTI nor TIOCLINUX" cannot be written as two `SCMP_CMP_NE`. It
//!   is written instead as the complement of those values: a set of `SCMP_CMP_MASKED_EQ`
//!   prefix patterns, one entry each (34 for `ioctl`), which are ORed as intended.
//! - libseccomp compares all 64 bits. For 32-bit kernel arguments every comparison is a
//!   `SCMP_CMP_MASKED_EQ` whose mask covers only the low 32 bits, so setting the upper bits
//!   neither bypasses a check nor breaks callers (musl sign-extends `int` ioctl requests).
//!
//! What OCI cannot say: the BPF prologue's "syscalls newer than the review return ENOSYS".
//! runc and crun add that rule themselves to every filter they load.

use oci_spec::runtime::{
    Arch as OciArch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};
use serde_json::Value;

use super::allowlist::{ArgCheck, Args, ERRNO_OVERRIDES, Test};
use super::{SeccompError, SyscallPolicy};

/// One OCI syscall entry and the reason shown next to it in the JSON form.
struct Entry {
    syscall: LinuxSyscall,
    comment: String,
}

/// The policy as an OCI `linux.seccomp` object, for both supported architectures.
pub fn oci_seccomp(policy: &SyscallPolicy) -> Result<LinuxSeccomp, SeccompError> {
    let entries = entries(policy)?;
    build(policy, entries.into_iter().map(|e| e.syscall).collect())
}

/// The policy as OCI seccomp JSON (pretty-printed, stable order), with a `comment` on every
/// entry giving its reason. runc ignores the comments; podman's
/// `--security-opt seccomp=FILE` format has a `comment` field and accepts them.
pub fn oci_seccomp_json(policy: &SyscallPolicy) -> Result<String, SeccompError> {
    let entries = entries(policy)?;
    let mut syscalls = Vec::with_capacity(entries.len());
    for entry in &entries {
        let mut value = to_value(&entry.syscall)?;
        if let Value::Object(map) = &mut value {
            map.insert("comment".to_owned(), Value::String(entry.comment.clone()));
        }
        syscalls.push(value);
    }
    let mut top = to_value(&build(policy, Vec::new())?)?;
    if let Value::Object(map) = &mut top {
        map.insert("syscalls".to_owned(), Value::Array(syscalls));
    }
    let mut text =
        serde_json::to_string_pretty(&top).map_err(|source| SeccompError::Json { source })?;
    text.push('\n');
    Ok(text)
}

fn to_value<T: serde::Serialize>(value: &T) -> Result<Value, SeccompError> {
    serde_json::to_value(value).map_err(|source| SeccompError::Json { source })
}

fn oci_error(source: oci_spec::OciSpecError) -> SeccompError {
    SeccompError::Oci { source }
}

fn build(
    policy: &SyscallPolicy,
    syscalls: Vec<LinuxSyscall>,
) -> Result<LinuxSeccomp, SeccompError> {
    let builder = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(policy.errno.number())
        .architectures(vec![OciArch::ScmpArchX86_64, OciArch::ScmpArchAarch64]);
    let builder = if syscalls.is_empty() {
        builder
    } else {
        builder.syscalls(syscalls)
    };
    builder.build().map_err(oci_error)
}

fn entries(policy: &SyscallPolicy) -> Result<Vec<Entry>, SeccompError> {
    policy.validate()?;
    let mut out = Vec::new();
    for answer in ERRNO_OVERRIDES {
        out.push(Entry {
            syscall: LinuxSyscallBuilder::default()
                .names(vec![answer.name.to_owned()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(answer.errno)
                .build()
                .map_err(oci_error)?,
            comment: answer.reason.to_owned(),
        });
    }
    for entry in policy.allowed() {
        let allow = || {
            LinuxSyscallBuilder::default()
                .names(vec![entry.name.to_owned()])
                .action(LinuxSeccompAction::ScmpActAllow)
        };
        match entry.args {
            Args::Any => out.push(Entry {
                syscall: allow().build().map_err(oci_error)?,
                comment: entry.reason.to_owned(),
            }),
            Args::AnyOf(alternatives) => {
                for checks in alternatives {
                    let reasons: Vec<&str> = checks.iter().map(|c| c.reason).collect();
                    let comment = format!("{}: {}", entry.reason, reasons.join("; "));
                    for args in conjunctions(checks)? {
                        out.push(Entry {
                            syscall: allow().args(args).build().map_err(oci_error)?,
                            comment: comment.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The OCI entries (each a list of ANDed comparisons on distinct arguments) whose union is
/// the conjunction of `checks`.
fn conjunctions(checks: &[ArgCheck]) -> Result<Vec<Vec<LinuxSeccompArg>>, SeccompError> {
    let mut product: Vec<Vec<LinuxSeccompArg>> = vec![Vec::new()];
    for check in checks {
        let choices = single_comparisons(check)?;
        let mut next = Vec::with_capacity(product.len() * choices.len());
        for prefix in &product {
            for choice in &choices {
                let mut args = prefix.clone();
                args.push(*choice);
                next.push(args);
            }
        }
        product = next;
    }
    Ok(product)
}

/// Single comparisons whose union is exactly `check` (at the argument's kernel width).
fn single_comparisons(check: &ArgCheck) -> Result<Vec<LinuxSeccompArg>, SeccompError> {
    let width = check.width.mask();
    let masked_eq = |mask: u64, value: u64| {
        LinuxSeccompArgBuilder::default()
            .index(usize::from(check.index))
            .value(mask & width)
            .value_two(value & mask & width)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()
            .map_err(oci_error)
    };
    match check.test {
        Test::Eq(value) => Ok(vec![masked_eq(u64::MAX, value)?]),
        Test::NoBitsOf(mask) => Ok(vec![masked_eq(mask, 0)?]),
        Test::NoneOf(excluded) => complement_patterns(width, excluded)
            .into_iter()
            .map(|(mask, value)| masked_eq(mask, value))
            .collect(),
    }
}

/// `(mask, value)` patterns, `arg & mask == value`, that together match every value of the
/// bits in `width` except those in `excluded`, and nothing else. Walks the binary trie of the
/// excluded values from the top bit: every subtree that holds no excluded value becomes one
/// pattern fixing the bits above it.
pub(crate) fn complement_patterns(width: u64, excluded: &[u64]) -> Vec<(u64, u64)> {
    let bits = 64 - width.leading_zeros();
    let excluded: Vec<u64> = excluded.iter().map(|v| v & width).collect();
    let mut out = Vec::new();
    walk(bits, 0, &excluded, width, &mut out);
    out
}

/// `remaining` low bits are still free; the bits above them are fixed to `prefix`.
fn walk(remaining: u32, prefix: u64, excluded: &[u64], width: u64, out: &mut Vec<(u64, u64)>) {
    let fixed = if remaining >= 64 {
        0
    } else {
        width & !((1u64 << remaining) - 1)
    };
    if excluded.is_empty() {
        out.push((fixed, prefix));
        return;
    }
    let Some(bit) = remaining.checked_sub(1) else {
        // Every bit is fixed and the value is excluded: nothing to allow here.
        return;
    };
    let (ones, zeros): (Vec<u64>, Vec<u64>) = excluded.iter().partition(|v| (*v >> bit) & 1 == 1);
    walk(bit, prefix, &zeros, width, out);
    walk(bit, prefix | (1u64 << bit), &ones, width, out);
}
