//! Unit tests of the allowlist data, both compilers and the policy type.
//!
//! The BPF programs are checked by running them in a small classic-BPF interpreter (below)
//! on synthetic `seccomp_data`, for x86_64 *and* aarch64; the integration test
//! `tests/seccomp_child.rs` loads the host's program into a real kernel.

use std::collections::{BTreeMap, BTreeSet};

use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator};
use seccompiler::{BpfProgram, sock_filter};

use super::allowlist::{
    AF_INET, AF_INET6, AF_NETLINK, AF_UNIX, ALLOWLIST, Args, CLONE_NEWCGROUP, CLONE_NEWIPC,
    CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWTIME, CLONE_NEWUSER, CLONE_NEWUTS,
    ERRNO_OVERRIDES, NETLINK_ROUTE, PER_LINUX32, PERSONALITY_QUERY, REVIEWED_THROUGH, TIOCLINUX,
    TIOCSTI, Test, UNAME26,
};
use super::oci::complement_patterns;
use super::*;

/// What issue #2 requires the filter to block, whatever the arguments.
const MUST_DENY: &[&str] = &[
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "open_tree",
    "unshare",
    "setns",
    "clone3",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
];

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const fn ret_errno(errno: u32) -> u32 {
    0x0005_0000 | errno
}
const EPERM: u32 = 1;
const EACCES: u32 = 13;
const AF_KEY: u64 = 15;
const AF_PACKET: u64 = 17;
const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;
const NETLINK_AUDIT: u64 = 9;
const ADDR_NO_RANDOMIZE: u64 = 0x0004_0000;
const READ_IMPLIES_EXEC: u64 = 0x0040_0000;
const FIONREAD: u64 = 0x541B;
const TCGETS: u64 = 0x5401;
/// `_IOR('T', 0x30, unsigned int)`: has bit 31 set, so musl's `int` request sign-extends it.
const TIOCGPTN: u64 = 0x8004_5430;
const SIGCHLD: u64 = 17;
const CLONE_VM: u64 = 0x100;
const CLONE_THREAD: u64 = 0x10000;
const CLONE_SIGHAND: u64 = 0x800;

fn audit_arch(arch: Arch) -> u32 {
    match arch {
        Arch::X86_64 => 0xc000_003e,
        Arch::Aarch64 => 0xc000_00b7,
    }
}

fn nr(arch: Arch, name: &str) -> u32 {
    let n = arch
        .syscall_number(name)
        .unwrap_or_else(|| panic!("{name} is not a syscall on {arch}"));
    u32::try_from(n).unwrap()
}

/// A classic BPF interpreter for the instructions seccompiler and our prologue emit.
fn run(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = Vec::with_capacity(64);
    data.extend_from_slice(&nr.to_ne_bytes());
    data.extend_from_slice(&arch.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes()); // instruction pointer
    for a in args {
        data.extend_from_slice(&a.to_ne_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    loop {
        let ins = &program[pc];
        let k = ins.k;
        pc += 1;
        match ins.code {
            0x20 => {
                let off = usize::try_from(k).unwrap();
                acc = u32::from_ne_bytes(data[off..off + 4].try_into().unwrap());
            }
            0x54 => acc &= k,
            0x05 => pc += usize::try_from(k).unwrap(),
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match ins.code {
                    0x15 => acc == k,
                    0x25 => acc > k,
                    0x35 => acc >= k,
                    _ => acc & k != 0,
                };
                pc += usize::from(if taken { ins.jt } else { ins.jf });
            }
            0x06 => return k,
            other => panic!("unexpected BPF opcode {other:#x} at {}", pc - 1),
        }
    }
}

fn eval(program: &BpfProgram, arch: Arch, name: &str, args: [u64; 6]) -> u32 {
    run(program, audit_arch(arch), nr(arch, name), args)
}

/// libseccomp/runc semantics of an OCI seccomp object: the entries naming the syscall whose
/// comparisons all hold give their action, otherwise the default action.
fn oci_eval(seccomp: &LinuxSeccomp, name: &str, args: [u64; 6]) -> u32 {
    let mut verdicts = BTreeSet::new();
    for entry in seccomp.syscalls().as_deref().unwrap_or_default() {
        if !entry.names().iter().any(|n| n == name) {
            continue;
        }
        let holds = entry.args().as_deref().unwrap_or_default().iter().all(|a| {
            let v = args[a.index()];
            match a.op() {
                LinuxSeccompOperator::ScmpCmpEq => v == a.value(),
                LinuxSeccompOperator::ScmpCmpNe => v != a.value(),
                LinuxSeccompOperator::ScmpCmpMaskedEq => {
                    v & a.value() == a.value_two().unwrap_or(0)
                }
                other => panic!("unexpected operator {other:?}"),
            }
        });
        if holds {
            verdicts.insert(entry.action().as_u32(entry.errno_ret()));
        }
    }
    assert!(verdicts.len() <= 1, "{name}: conflicting OCI verdicts");
    verdicts
        .into_iter()
        .next()
        .unwrap_or_else(|| seccomp.default_action().as_u32(seccomp.default_errno_ret()))
}

fn default_program(arch: Arch) -> BpfProgram {
    compile_bpf(&SyscallPolicy::default(), arch).unwrap()
}

fn policy(json: &str) -> Result<SyscallPolicy, serde_json::Error> {
    serde_json::from_str(json)
}

// --- the table ---

#[test]
fn allowlist_names_are_unique_and_reasoned() {
    let mut seen = BTreeSet::new();
    for entry in ALLOWLIST {
        assert!(seen.insert(entry.name), "{} is listed twice", entry.name);
        assert!(
            entry.reason.trim().len() > 3,
            "{} has no reason",
            entry.name
        );
        if let Args::AnyOf(alternatives) = entry.args {
            assert!(!alternatives.is_empty(), "{}: no alternative", entry.name);
            for checks in alternatives {
                assert!(!checks.is_empty(), "{}: empty alternative", entry.name);
                let indices: BTreeSet<u8> = checks.iter().map(|c| c.index).collect();
                assert_eq!(
                    indices.len(),
                    checks.len(),
                    "{}: two checks on one argument in an alternative",
                    entry.name
                );
                for check in *checks {
                    assert!(
                        check.reason.trim().len() > 3,
                        "{}: argument check without reason",
                        entry.name
                    );
                    assert!(check.index < 6, "{}: argument index", entry.name);
                }
            }
        }
    }
    for answer in ERRNO_OVERRIDES {
        assert!(!answer.reason.is_empty());
        assert!(
            !seen.contains(answer.name),
            "{} is both allowed and overridden",
            answer.name
        );
    }
}

#[test]
fn allowlist_names_exist_on_their_architectures() {
    for entry in ALLOWLIST {
        for arch in Arch::ALL {
            let expected = entry.only_on.is_none_or(|only| only == arch);
            assert_eq!(
                arch.syscall_number(entry.name).is_some(),
                expected,
                "{} on {arch}: only_on is wrong",
                entry.name
            );
        }
    }
}

#[test]
fn required_denials_are_absent_from_the_allowlist() {
    for name in MUST_DENY {
        for arch in Arch::ALL {
            assert!(
                arch.syscall_number(name).is_some(),
                "{name} is not a syscall on {arch}"
            );
        }
        assert!(
            ALLOWLIST.iter().all(|e| e.name != *name),
            "{name} must not be allowed"
        );
    }
}

#[test]
fn allowlist_size_is_in_dockers_range() {
    // Docker's default profile allows about 360 names (both architectures, many of them
    // conditional on capabilities). Ours is tighter; this catches an accidental mass edit.
    for arch in Arch::ALL {
        let n = allowed_names(&SyscallPolicy::default(), arch).len();
        assert!((230..=330).contains(&n), "{arch}: {n} syscalls allowed");
    }
}

#[test]
fn constants_match_the_host_libc() {
    assert_eq!(CLONE_NEWTIME, libc::CLONE_NEWTIME as u64);
    assert_eq!(CLONE_NEWNS, libc::CLONE_NEWNS as u64);
    assert_eq!(CLONE_NEWCGROUP, libc::CLONE_NEWCGROUP as u64);
    assert_eq!(CLONE_NEWUTS, libc::CLONE_NEWUTS as u64);
    assert_eq!(CLONE_NEWIPC, libc::CLONE_NEWIPC as u64);
    assert_eq!(CLONE_NEWUSER, libc::CLONE_NEWUSER as u64);
    assert_eq!(CLONE_NEWPID, libc::CLONE_NEWPID as u64);
    assert_eq!(CLONE_NEWNET, libc::CLONE_NEWNET as u64);
    assert_eq!(AF_UNIX, libc::AF_UNIX as u64);
    assert_eq!(AF_INET, libc::AF_INET as u64);
    assert_eq!(AF_INET6, libc::AF_INET6 as u64);
    assert_eq!(AF_NETLINK, libc::AF_NETLINK as u64);
    assert_eq!(AF_KEY, libc::AF_KEY as u64);
    assert_eq!(AF_PACKET, libc::AF_PACKET as u64);
    assert_eq!(AF_ALG, libc::AF_ALG as u64);
    assert_eq!(AF_VSOCK, libc::AF_VSOCK as u64);
    assert_eq!(NETLINK_ROUTE, libc::NETLINK_ROUTE as u64);
    assert_eq!(TIOCSTI, libc::TIOCSTI);
    assert_eq!(TIOCLINUX, libc::TIOCLINUX);
    assert_eq!(FIONREAD, libc::FIONREAD);
    assert_eq!(UNAME26, libc::UNAME26 as u64);
    assert_eq!(ADDR_NO_RANDOMIZE, libc::ADDR_NO_RANDOMIZE as u64);
    assert_eq!(READ_IMPLIES_EXEC, libc::READ_IMPLIES_EXEC as u64);
    assert_eq!(DenyErrno::Eperm.number(), libc::EPERM as u32);
    assert_eq!(DenyErrno::Eacces.number(), libc::EACCES as u32);
    assert_eq!(DenyErrno::Enosys.number(), libc::ENOSYS as u32);
}

#[test]
fn syscall_numbers_match_the_host_libc() {
    let host = Arch::host().unwrap();
    let pairs: &[(&str, libc::c_long)] = &[
        ("read", libc::SYS_read),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("ioctl", libc::SYS_ioctl),
        ("socket", libc::SYS_socket),
        ("personality", libc::SYS_personality),
        ("ptrace", libc::SYS_ptrace),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("newfstatat", libc::SYS_newfstatat),
        ("execve", libc::SYS_execve),
    ];
    for (name, number) in pairs {
        assert_eq!(host.syscall_number(name), Some(*number), "{name}");
    }
    assert_eq!(Arch::Aarch64.syscall_number("newfstatat"), Some(79));
    assert_eq!(Arch::Aarch64.syscall_number("fstatat"), None);
    assert_eq!(Arch::Aarch64.syscall_number("clone3"), Some(435));
}

// --- the BPF program, on both architectures ---

#[test]
fn bpf_allows_ordinary_calls_and_denies_the_required_list() {
    for arch in Arch::ALL {
        let program = default_program(arch);
        for entry in ALLOWLIST.iter().filter(|e| e.args == Args::Any) {
            if entry.only_on.is_some_and(|only| only != arch) {
                continue;
            }
            assert_eq!(
                eval(&program, arch, entry.name, [0; 6]),
                RET_ALLOW,
                "{arch} {}",
                entry.name
            );
        }
        for name in MUST_DENY {
            let expected = if *name == "clone3" {
                ret_errno(ENOSYS)
            } else {
                ret_errno(EPERM)
            };
            for args in [[0; 6], [u64::MAX; 6]] {
                assert_eq!(eval(&program, arch, name, args), expected, "{arch} {name}");
            }
        }
    }
}

#[test]
fn bpf_errno_follows_the_policy() {
    let policy = policy(r#"{"errno": "EACCES"}"#).unwrap();
    for arch in Arch::ALL {
        let program = compile_bpf(&policy, arch).unwrap();
        assert_eq!(eval(&program, arch, "ptrace", [0; 6]), ret_errno(EACCES));
        assert_eq!(eval(&program, arch, "clone3", [0; 6]), ret_errno(ENOSYS));
        assert_eq!(eval(&program, arch, "read", [0; 6]), RET_ALLOW);
    }
}

#[test]
fn bpf_kills_foreign_architectures_and_answers_enosys_past_the_review() {
    for arch in Arch::ALL {
        let program = default_program(arch);
        // i386 (int 0x80) and arm32 compat calls use another audit arch.
        assert_eq!(run(&program, 0x4000_0003, 0, [0; 6]), RET_KILL_PROCESS);
        assert_eq!(run(&program, 0x4000_0028, 0, [0; 6]), RET_KILL_PROCESS);
        let last = nr(arch, REVIEWED_THROUGH);
        assert_ne!(
            run(&program, audit_arch(arch), last, [0; 6]),
            ret_errno(ENOSYS)
        );
        assert_eq!(
            run(&program, audit_arch(arch), last + 1, [0; 6]),
            ret_errno(ENOSYS)
        );
        // x32 numbers carry bit 30 and are past the review too.
        assert_eq!(
            run(&program, audit_arch(arch), 0x4000_0000 | 39, [0; 6]),
            ret_errno(ENOSYS)
        );
    }
}

#[test]
fn bpf_clone_rejects_every_namespace_flag() {
    for arch in Arch::ALL {
        let program = default_program(arch);
        let thread = CLONE_VM | CLONE_SIGHAND | CLONE_THREAD;
        assert_eq!(
            eval(&program, arch, "clone", [SIGCHLD, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            eval(&program, arch, "clone", [thread, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        for flag in [
            CLONE_NEWTIME,
            CLONE_NEWNS,
            CLONE_NEWCGROUP,
            CLONE_NEWUTS,
            CLONE_NEWIPC,
            CLONE_NEWUSER,
            CLONE_NEWPID,
            CLONE_NEWNET,
        ] {
            assert_eq!(
                eval(&program, arch, "clone", [SIGCHLD | flag, 0, 0, 0, 0, 0]),
                ret_errno(EPERM),
                "{arch} {flag:#x}"
            );
        }
    }
}

#[test]
fn bpf_socket_families() {
    for arch in Arch::ALL {
        let p = default_program(arch);
        let socket =
            |domain: u64, protocol: u64| eval(&p, arch, "socket", [domain, 1, protocol, 0, 0, 0]);
        assert_eq!(socket(AF_UNIX, 0), RET_ALLOW);
        assert_eq!(socket(AF_INET, 6), RET_ALLOW);
        assert_eq!(socket(AF_INET6, 17), RET_ALLOW);
        assert_eq!(socket(AF_NETLINK, NETLINK_ROUTE), RET_ALLOW);
        assert_eq!(socket(AF_NETLINK, NETLINK_AUDIT), ret_errno(EPERM));
        for family in [AF_VSOCK, AF_ALG, AF_PACKET, AF_KEY] {
            assert_eq!(
                socket(family, 0),
                ret_errno(EPERM),
                "{arch} family {family}"
            );
        }
        // The kernel reads `int family`: upper bits neither bypass nor break the check.
        assert_eq!(socket(AF_VSOCK | 1 << 32, 0), ret_errno(EPERM));
        assert_eq!(socket(AF_INET | 0xffff_ffff_0000_0000, 0), RET_ALLOW);
        let pair = |domain: u64| eval(&p, arch, "socketpair", [domain, 1, 0, 0, 0, 0]);
        assert_eq!(pair(AF_UNIX), RET_ALLOW);
        assert_eq!(pair(AF_INET), ret_errno(EPERM));
        assert_eq!(pair(AF_VSOCK), ret_errno(EPERM));
    }
}

#[test]
fn bpf_ioctl_denies_terminal_injection_at_kernel_width() {
    for arch in Arch::ALL {
        let p = default_program(arch);
        let ioctl = |request: u64| eval(&p, arch, "ioctl", [0, request, 0, 0, 0, 0]);
        assert_eq!(ioctl(TIOCSTI), ret_errno(EPERM));
        assert_eq!(ioctl(TIOCLINUX), ret_errno(EPERM));
        assert_eq!(ioctl(TIOCSTI | 1 << 32), ret_errno(EPERM));
        assert_eq!(ioctl(TIOCLINUX | 0xffff_ffff_0000_0000), ret_errno(EPERM));
        assert_eq!(ioctl(TCGETS), RET_ALLOW);
        assert_eq!(ioctl(FIONREAD), RET_ALLOW);
        assert_eq!(ioctl(TIOCGPTN), RET_ALLOW);
        assert_eq!(ioctl(TIOCGPTN | 0xffff_ffff_0000_0000), RET_ALLOW);
    }
}

#[test]
fn bpf_personality_allows_only_safe_values() {
    for arch in Arch::ALL {
        let p = default_program(arch);
        let personality = |persona: u64| eval(&p, arch, "personality", [persona, 0, 0, 0, 0, 0]);
        for ok in [
            0,
            PER_LINUX32,
            UNAME26,
            PER_LINUX32 | UNAME26,
            PERSONALITY_QUERY,
        ] {
            assert_eq!(personality(ok), RET_ALLOW, "{ok:#x}");
        }
        for bad in [
            ADDR_NO_RANDOMIZE,
            READ_IMPLIES_EXEC,
            PER_LINUX32 | ADDR_NO_RANDOMIZE,
            1,
        ] {
            assert_eq!(personality(bad), ret_errno(EPERM), "{bad:#x}");
        }
    }
}

#[test]
fn deny_list_narrows_both_outputs() {
    let narrowed = policy(r#"{"deny": ["memfd_create", "ptrace", "open"]}"#).unwrap();
    for arch in Arch::ALL {
        let p = compile_bpf(&narrowed, arch).unwrap();
        assert_eq!(eval(&p, arch, "memfd_create", [0; 6]), ret_errno(EPERM));
        assert_eq!(eval(&p, arch, "read", [0; 6]), RET_ALLOW);
        let before = allowed_names(&SyscallPolicy::default(), arch).len();
        let after = allowed_names(&narrowed, arch).len();
        let removed = if arch == Arch::X86_64 { 2 } else { 1 };
        assert_eq!(before - after, removed, "{arch}");
    }
    let oci = oci_seccomp(&narrowed).unwrap();
    assert_eq!(oci_eval(&oci, "memfd_create", [0; 6]), ret_errno(EPERM));
    assert_eq!(oci_eval(&oci, "read", [0; 6]), RET_ALLOW);
}

// --- the OCI form agrees with the BPF ---

/// Argument values worth trying for a syscall: every value a check names, its neighbours,
/// and the same with the upper 32 bits set.
fn interesting_args(entry: &allowlist::Allowed) -> Vec<[u64; 6]> {
    let mut values: BTreeMap<u8, BTreeSet<u64>> = BTreeMap::new();
    if let Args::AnyOf(alternatives) = entry.args {
        for checks in alternatives {
            for check in *checks {
                let set = values.entry(check.index).or_default();
                let named: Vec<u64> = match check.test {
                    Test::Eq(v) => vec![v],
                    Test::NoneOf(vs) => vs.to_vec(),
                    Test::NoBitsOf(mask) => (0..64)
                        .map(|b| 1u64 << b)
                        .filter(|bit| mask & bit != 0)
                        .chain([SIGCHLD, SIGCHLD | CLONE_VM])
                        .collect(),
                };
                for v in named {
                    for candidate in [v, v.wrapping_add(1), v.wrapping_sub(1)] {
                        set.insert(candidate);
                        set.insert(candidate | 1 << 32);
                        set.insert(candidate | 0xffff_ffff_0000_0000);
                    }
                }
                set.extend([0, 1, u64::MAX, 0xffff_ffff]);
            }
        }
    }
    let mut out = vec![[0u64; 6]];
    for (index, set) in values {
        let mut next = Vec::new();
        for args in &out {
            for v in &set {
                let mut a = *args;
                a[usize::from(index)] = *v;
                next.push(a);
            }
        }
        out = next;
    }
    out
}

#[test]
fn oci_form_decides_like_the_bpf_program() {
    for errno in [r#"{}"#, r#"{"errno": "ENOSYS"}"#] {
        let policy = policy(errno).unwrap();
        let oci = oci_seccomp(&policy).unwrap();
        for arch in Arch::ALL {
            let program = compile_bpf(&policy, arch).unwrap();
            for entry in ALLOWLIST {
                if entry.only_on.is_some_and(|only| only != arch) {
                    continue;
                }
                for args in interesting_args(entry) {
                    assert_eq!(
                        oci_eval(&oci, entry.name, args),
                        eval(&program, arch, entry.name, args),
                        "{arch} {}({args:x?})",
                        entry.name
                    );
                }
            }
            for name in MUST_DENY {
                assert_eq!(
                    oci_eval(&oci, name, [0; 6]),
                    eval(&program, arch, name, [0; 6]),
                    "{arch} {name}"
                );
            }
        }
    }
}

#[test]
fn oci_json_round_trips_and_carries_reasons() {
    let policy = SyscallPolicy::default();
    let json = oci_seccomp_json(&policy).unwrap();
    let parsed: LinuxSeccomp = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed, oci_seccomp(&policy).unwrap());
    assert_eq!(parsed.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert_eq!(parsed.default_errno_ret(), Some(EPERM));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let entries = value["syscalls"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .all(|e| e["comment"].as_str().is_some_and(|c| c.len() > 3))
    );
    let ioctl = entries.iter().filter(|e| e["names"][0] == "ioctl").count();
    assert_eq!(ioctl, 34, "ioctl's complement of two 32-bit values");
    let clone3 = entries.iter().find(|e| e["names"][0] == "clone3").unwrap();
    assert_eq!(clone3["action"], "SCMP_ACT_ERRNO");
    assert_eq!(clone3["errnoRet"], 38);
    // Same input, same bytes: the golden files depend on it.
    assert_eq!(json, oci_seccomp_json(&policy).unwrap());
}

#[test]
fn complement_patterns_partition_the_rest() {
    let width = 0xffff;
    for excluded in [
        vec![],
        vec![0x5412],
        vec![0x5412, 0x541c],
        vec![0, 0xffff, 0x8000],
    ] {
        let patterns = complement_patterns(width, &excluded);
        for v in 0..=width {
            let matches = patterns.iter().filter(|(m, x)| v & m == *x).count();
            let expected = usize::from(!excluded.contains(&v));
            assert_eq!(matches, expected, "{v:#x} with {excluded:x?}");
        }
    }
    assert_eq!(
        complement_patterns(0xffff_ffff, &[TIOCSTI, TIOCLINUX]).len(),
        34
    );
}

// --- the policy type ---

#[test]
fn policy_defaults_to_eperm_and_nothing_extra() {
    let p = policy("{}").unwrap();
    assert_eq!(p, SyscallPolicy::default());
    assert_eq!(p.errno, DenyErrno::Eperm);
    assert!(p.deny.is_empty());
}

#[test]
fn policy_rejects_unknown_keys_names_and_errnos() {
    let err = policy(r#"{"allow": ["ptrace"]}"#).unwrap_err().to_string();
    assert!(err.contains("unknown field `allow`"), "{err}");
    let err = policy(r#"{"deny": ["ptrace", "no_such_call"]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown syscall `no_such_call`"), "{err}");
    let err = policy(r#"{"errno": "EINTR"}"#).unwrap_err().to_string();
    assert!(err.contains("EINTR"), "{err}");
    let dup = policy(r#"{"deny": ["ptrace", "ptrace"]}"#).unwrap();
    let err = compile_bpf(&dup, Arch::X86_64).unwrap_err();
    assert!(matches!(err, SeccompError::DuplicateDeny { ref name } if name == "ptrace"));
    assert!(oci_seccomp(&dup).is_err());
    // Names of one architecture only are still syscalls.
    assert!(SyscallName::try_from("arch_prctl").is_ok());
    assert!(SyscallName::try_from("fstatat").is_err());
}

#[test]
fn policy_serializes_back_to_the_same_table() {
    let p = policy(r#"{"errno": "ENOSYS", "deny": ["memfd_create"]}"#).unwrap();
    let text = serde_json::to_string(&p).unwrap();
    assert_eq!(
        text,
        r#"{"errno":"ENOSYS","level":"standard","deny":["memfd_create"]}"#
    );
    assert_eq!(policy(&text).unwrap(), p);
}

#[test]
fn prologue_layout() {
    for arch in Arch::ALL {
        let program = default_program(arch);
        assert_eq!(program[0].code, 0x20);
        assert_eq!(program[0].k, 4, "loads seccomp_data.arch first");
        assert_eq!(program[1].k, audit_arch(arch));
        let skip = usize::from(program[1].jf);
        // The jump lands on seccompiler's own arch check.
        assert_eq!(program[2 + skip].code, 0x20);
        assert_eq!(program[2 + skip].k, 4);
        assert!(program.len() < 4096);
    }
}

// --- the strict level ---

#[test]
fn strict_drops_are_allowed_entries_with_reasons() {
    let mut seen = BTreeSet::new();
    for drop in allowlist::STRICT_DROPS {
        assert!(seen.insert(drop.name), "{} dropped twice", drop.name);
        assert!(drop.reason.trim().len() > 3, "{} has no reason", drop.name);
        assert!(
            ALLOWLIST.iter().any(|e| e.name == drop.name),
            "{} is not in the allowlist",
            drop.name
        );
    }
}

#[test]
fn strict_level_removes_its_drops_from_both_outputs() {
    let strict = policy(r#"{"level": "strict"}"#).unwrap();
    assert_eq!(strict.level, Level::Strict);
    let oci = oci_seccomp(&strict).unwrap();
    for arch in Arch::ALL {
        let p = compile_bpf(&strict, arch).unwrap();
        for drop in allowlist::STRICT_DROPS {
            assert_eq!(
                eval(&p, arch, drop.name, [0; 6]),
                ret_errno(EPERM),
                "{arch} {}",
                drop.name
            );
            assert_eq!(
                oci_eval(&oci, drop.name, [0; 6]),
                ret_errno(EPERM),
                "{}",
                drop.name
            );
        }
        assert_eq!(eval(&p, arch, "read", [0; 6]), RET_ALLOW);
        let standard = allowed_names(&SyscallPolicy::default(), arch).len();
        let kept = allowed_names(&strict, arch).len();
        assert_eq!(standard - kept, allowlist::STRICT_DROPS.len(), "{arch}");
    }
    let err = policy(r#"{"level": "paranoid"}"#).unwrap_err().to_string();
    assert!(err.contains("paranoid"), "{err}");
}

/// What the kernel returns for a stack of filters: the strictest action (the lowest
/// `SECCOMP_RET_ACTION_FULL` as a signed number), the newest filter first on a tie.
fn stacked(programs: &[&BpfProgram], arch: Arch, name: &str, args: [u64; 6]) -> u32 {
    let action = |r: u32| i32::from_ne_bytes((r & 0xffff_0000).to_ne_bytes());
    programs
        .iter()
        .rev()
        .map(|p| eval(p, arch, name, args))
        .fold(None, |best: Option<u32>, r| match best {
            Some(b) if action(b) <= action(r) => Some(b),
            _ => Some(r),
        })
        .unwrap()
}

fn request(json: &str) -> LinuxSeccomp {
    serde_json::from_str(json).unwrap()
}

#[test]
fn a_requested_profile_narrows_and_the_policys_own_denials_stay_its_own() {
    let req = request(
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[
            {"names":["getcwd"],"action":"SCMP_ACT_ERRNO","errnoRet":1},
            {"names":["chmod","fchmodat"],"action":"SCMP_ACT_ERRNO","errnoRet":13},
            {"names":["add_key"],"action":"SCMP_ACT_ERRNO","errnoRet":38},
            {"names":["no_such_syscall"],"action":"SCMP_ACT_KILL"}]}"#,
    );
    let pol = SyscallPolicy::default();
    for arch in Arch::ALL {
        let base = default_program(arch);
        let extra = compile_request(&req, &pol, arch).unwrap();
        let all: Vec<&BpfProgram> = std::iter::once(&base).chain(extra.iter()).collect();
        assert_eq!(
            stacked(&all, arch, "getcwd", [0; 6]),
            ret_errno(EPERM),
            "{arch}"
        );
        assert_eq!(
            stacked(&all, arch, "fchmodat", [0; 6]),
            ret_errno(EACCES),
            "{arch}"
        );
        assert_eq!(stacked(&all, arch, "read", [0; 6]), RET_ALLOW, "{arch}");
        // The policy denies add_key itself: its answer, not the request's ENOSYS.
        assert_eq!(
            stacked(&all, arch, "add_key", [0; 6]),
            eval(&base, arch, "add_key", [0; 6]),
            "{arch}"
        );
    }
}

#[test]
fn a_requested_allowlist_with_argument_rules_denies_what_it_leaves_out() {
    let req = request(
        r#"{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":38,"syscalls":[
            {"names":["read","write","exit_group"],"action":"SCMP_ACT_ALLOW"},
            {"names":["personality"],"action":"SCMP_ACT_ALLOW",
             "args":[{"index":0,"value":0,"op":"SCMP_CMP_EQ"},
                     {"index":0,"value":8,"op":"SCMP_CMP_EQ"}]},
            {"names":["socket"],"action":"SCMP_ACT_ERRNO","errnoRet":1,
             "args":[{"index":0,"value":40,"op":"SCMP_CMP_EQ"}]}]}"#,
    );
    let pol = SyscallPolicy::default();
    let arch = Arch::X86_64;
    let base = default_program(arch);
    let extra = compile_request(&req, &pol, arch).unwrap();
    let all: Vec<&BpfProgram> = std::iter::once(&base).chain(extra.iter()).collect();
    assert_eq!(stacked(&all, arch, "read", [0; 6]), RET_ALLOW);
    assert_eq!(stacked(&all, arch, "getcwd", [0; 6]), ret_errno(38));
    // Two conditions on one argument are alternatives (runc's reading).
    assert_eq!(stacked(&all, arch, "personality", [0; 6]), RET_ALLOW);
    assert_eq!(
        stacked(&all, arch, "personality", [8, 0, 0, 0, 0, 0]),
        RET_ALLOW
    );
    assert_eq!(
        stacked(&all, arch, "personality", [UNAME26, 0, 0, 0, 0, 0]),
        ret_errno(38)
    );
    // socket is matched by a rule only for AF_VSOCK; otherwise the default applies.
    assert_eq!(
        stacked(&all, arch, "socket", [AF_VSOCK, 0, 0, 0, 0, 0]) & 0xffff_0000,
        ret_errno(0)
    );
}

#[test]
fn podmans_default_profile_compiles_beside_the_policy() {
    let config: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/podman-4.3-rootful.json")).unwrap();
    let req: LinuxSeccomp = serde_json::from_value(config["linux"]["seccomp"].clone()).unwrap();
    let pol = SyscallPolicy::default();
    for arch in Arch::ALL {
        let extra = compile_request(&req, &pol, arch).unwrap();
        assert!(!extra.is_empty());
        for p in &extra {
            assert!(p.len() < 4096, "{arch}: {} instructions", p.len());
        }
        let base = default_program(arch);
        let all: Vec<&BpfProgram> = std::iter::once(&base).chain(extra.iter()).collect();
        assert_eq!(stacked(&all, arch, "read", [0; 6]), RET_ALLOW, "{arch}");
        assert_eq!(
            stacked(&all, arch, "add_key", [0; 6]),
            eval(&base, arch, "add_key", [0; 6]),
            "{arch}"
        );
        // A number above the reviewed table stays the policy's (ENOSYS, recorded).
        let beyond = nr(arch, REVIEWED_THROUGH) + 1;
        for p in &extra {
            assert_eq!(
                run(p, audit_arch(arch), beyond, [0; 6]),
                RET_ALLOW,
                "{arch}"
            );
        }
    }
}

#[test]
fn what_a_request_cannot_get_is_refused_naming_the_key() {
    let pol = SyscallPolicy::default();
    let cases = [
        (
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["getcwd"],"action":"SCMP_ACT_NOTIFY"}]}"#,
            "syscalls[0].action",
        ),
        (r#"{"defaultAction":"SCMP_ACT_NOTIFY"}"#, "defaultAction"),
        (
            r#"{"defaultAction":"SCMP_ACT_ALLOW","listenerPath":"/run/agent.sock"}"#,
            "listenerPath",
        ),
        (
            r#"{"defaultAction":"SCMP_ACT_ALLOW","flags":["SECCOMP_FILTER_FLAG_SPEC_ALLOW"]}"#,
            "flags",
        ),
        (
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO","args":[{"index":6,"value":0,"op":"SCMP_CMP_EQ"}]}]}"#,
            "syscalls[0].args[0]",
        ),
    ];
    for (json, key) in cases {
        let err = compile_request(&request(json), &pol, Arch::X86_64).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
}
