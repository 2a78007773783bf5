//! `process.rlimits`: raised by the runtime itself, as the user it runs as, before any user
//! namespace (docs/contracts.md#resource-limits-processrlimits).
//!
//! libcontainer applies a process's rlimits in its intermediate process after that process
//! has entered the sandbox's user namespace, where the kernel refuses to raise a hard limit:
//! CAP_SYS_RESOURCE counts only in the initial user namespace. runc and crun raise them as
//! real root. So before libcontainer forks, the runtime raises its own hard limit to what the
//! spec asks; the intermediate inherits it, and its own `setrlimit` then only keeps or
//! lowers it. A limit even the runtime may not raise (root without CAP_SYS_RESOURCE, a
//! rootless runtime, `RLIMIT_NOFILE` above `fs.nr_open`) is granted at the runtime's own hard
//! limit instead, with a [`Clamp`] naming `process.rlimits.TYPE`: an engine's default (podman
//! 5 asks nofile and nproc 1048576) never fails a create.
//!
//! Raising the runtime's own limits widens nothing in the sandbox: the spec's value is what
//! the sandbox gets, and the runtime's later children (its sidecars) run on the host side.

use agent_sandbox_policy::harden::Clamp;
use libcontainer::oci_spec::runtime::{PosixRlimit, PosixRlimitBuilder, PosixRlimitType, Process};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The one error of [`raise`]: a limit the spec asks for that no runtime could apply.
#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    #[error(
        "config.json process.rlimits {typ}: the soft limit {soft} is above the hard limit {hard} \
         (docs/contracts.md#resource-limits-processrlimits)"
    )]
    SoftAboveHard {
        typ: PosixRlimitType,
        soft: u64,
        hard: u64,
    },
    #[error("cannot build the granted {typ} limit")]
    Build {
        typ: PosixRlimitType,
        #[source]
        source: libcontainer::oci_spec::OciSpecError,
    },
    #[error("cannot read the runtime's own {typ} limit")]
    Read {
        typ: PosixRlimitType,
        #[source]
        source: nix::Error,
    },
}

/// The limits of the runtime's own process: read, and raised (the host seam; tests use a fake).
pub trait OwnLimits {
    /// (soft, hard).
    fn get(&self, resource: Resource) -> nix::Result<(u64, u64)>;
    fn set(&self, resource: Resource, soft: u64, hard: u64) -> nix::Result<()>;
}

/// The real process's limits.
pub struct ThisProcess;

impl OwnLimits for ThisProcess {
    fn get(&self, resource: Resource) -> nix::Result<(u64, u64)> {
        getrlimit(resource)
    }

    fn set(&self, resource: Resource, soft: u64, hard: u64) -> nix::Result<()> {
        setrlimit(resource, soft, hard)
    }
}

/// Raises the runtime's own hard limits to what `process` asks, where it may, and narrows
/// each limit of `process` it may not to the runtime's hard limit. Returns a [`Clamp`] per
/// narrowed limit. Call it before libcontainer forks (create and exec).
pub fn raise(own: &dyn OwnLimits, process: &mut Process) -> Result<Vec<Clamp>, RlimitError> {
    let Some(mut rlimits) = process.rlimits().clone() else {
        return Ok(Vec::new());
    };
    let mut clamps = Vec::new();
    for limit in &mut rlimits {
        if let Some(clamp) = raise_one(own, limit)? {
            clamps.push(clamp);
        }
    }
    process.set_rlimits(Some(rlimits));
    Ok(clamps)
}

fn raise_one(own: &dyn OwnLimits, limit: &mut PosixRlimit) -> Result<Option<Clamp>, RlimitError> {
    let (typ, soft, hard) = (limit.typ(), limit.soft(), limit.hard());
    if soft > hard {
        return Err(RlimitError::SoftAboveHard { typ, soft, hard });
    }
    let resource = resource_of(typ);
    let (own_soft, own_hard) = own
        .get(resource)
        .map_err(|source| RlimitError::Read { typ, source })?;
    let granted_hard = if hard <= own_hard {
        hard
    } else {
        match own.set(resource, own_soft.min(hard), hard) {
            Ok(()) => {
                tracing::debug!(%typ, hard, "raised the runtime's own hard limit");
                hard
            }
            Err(errno) => {
                tracing::info!(%typ, hard, own_hard, %errno, "cannot raise the hard limit");
                own_hard
            }
        }
    };
    let granted_soft = soft.min(granted_hard);
    if (granted_soft, granted_hard) == (soft, hard) {
        return Ok(None);
    }
    *limit = PosixRlimitBuilder::default()
        .typ(typ)
        .soft(granted_soft)
        .hard(granted_hard)
        .build()
        .map_err(|source| RlimitError::Build { typ, source })?;
    Ok(Some(Clamp {
        key: format!("process.rlimits.{typ}"),
        requested: pair(soft, hard),
        granted: pair(granted_soft, granted_hard),
    }))
}

/// `soft:hard`, as `podman run --ulimit` writes a limit.
fn pair(soft: u64, hard: u64) -> String {
    let one = |v: u64| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_owned()
        } else {
            v.to_string()
        }
    };
    format!("{}:{}", one(soft), one(hard))
}

fn resource_of(typ: PosixRlimitType) -> Resource {
    match typ {
        PosixRlimitType::RlimitCpu => Resource::RLIMIT_CPU,
        PosixRlimitType::RlimitFsize => Resource::RLIMIT_FSIZE,
        PosixRlimitType::RlimitData => Resource::RLIMIT_DATA,
        PosixRlimitType::RlimitStack => Resource::RLIMIT_STACK,
        PosixRlimitType::RlimitCore => Resource::RLIMIT_CORE,
        PosixRlimitType::RlimitRss => Resource::RLIMIT_RSS,
        PosixRlimitType::RlimitNproc => Resource::RLIMIT_NPROC,
        PosixRlimitType::RlimitNofile => Resource::RLIMIT_NOFILE,
        PosixRlimitType::RlimitMemlock => Resource::RLIMIT_MEMLOCK,
        PosixRlimitType::RlimitAs => Resource::RLIMIT_AS,
        PosixRlimitType::RlimitLocks => Resource::RLIMIT_LOCKS,
        PosixRlimitType::RlimitSigpending => Resource::RLIMIT_SIGPENDING,
        PosixRlimitType::RlimitMsgqueue => Resource::RLIMIT_MSGQUEUE,
        PosixRlimitType::RlimitNice => Resource::RLIMIT_NICE,
        PosixRlimitType::RlimitRtprio => Resource::RLIMIT_RTPRIO,
        PosixRlimitType::RlimitRttime => Resource::RLIMIT_RTTIME,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;

    /// The runtime's limits, and whether it may raise a hard limit (CAP_SYS_RESOURCE).
    struct Fake {
        limits: RefCell<HashMap<Resource, (u64, u64)>>,
        may_raise: bool,
        sets: RefCell<Vec<(Resource, u64, u64)>>,
    }

    impl Fake {
        fn new(may_raise: bool) -> Self {
            let limits = HashMap::from([
                (Resource::RLIMIT_NOFILE, (1024, 20000)),
                (Resource::RLIMIT_NPROC, (96365, 96365)),
                (Resource::RLIMIT_CORE, (0, libc::RLIM_INFINITY)),
            ]);
            Fake {
                limits: RefCell::new(limits),
                may_raise,
                sets: RefCell::new(Vec::new()),
            }
        }
    }

    impl OwnLimits for Fake {
        fn get(&self, resource: Resource) -> nix::Result<(u64, u64)> {
            self.limits
                .borrow()
                .get(&resource)
                .copied()
                .ok_or(nix::Error::EINVAL)
        }

        fn set(&self, resource: Resource, soft: u64, hard: u64) -> nix::Result<()> {
            self.sets.borrow_mut().push((resource, soft, hard));
            let (_, old_hard) = self.get(resource)?;
            if hard > old_hard && !self.may_raise {
                return Err(nix::Error::EPERM);
            }
            self.limits.borrow_mut().insert(resource, (soft, hard));
            Ok(())
        }
    }

    fn process(limits: &[(PosixRlimitType, u64, u64)]) -> Process {
        let mut p = Process::default();
        p.set_rlimits(Some(
            limits
                .iter()
                .map(|&(typ, soft, hard)| {
                    PosixRlimitBuilder::default()
                        .typ(typ)
                        .soft(soft)
                        .hard(hard)
                        .build()
                        .unwrap()
                })
                .collect(),
        ));
        p
    }

    fn granted(p: &Process) -> Vec<(PosixRlimitType, u64, u64)> {
        p.rlimits()
            .iter()
            .flatten()
            .map(|l| (l.typ(), l.soft(), l.hard()))
            .collect()
    }

    /// podman 5's default: nofile and nproc 1048576, soft and hard.
    fn podman5() -> Process {
        process(&[
            (PosixRlimitType::RlimitNofile, 1_048_576, 1_048_576),
            (PosixRlimitType::RlimitNproc, 1_048_576, 1_048_576),
        ])
    }

    #[test]
    fn root_raises_its_own_hard_limits_and_the_spec_keeps_them() {
        let own = Fake::new(true);
        let mut p = podman5();
        let clamps = raise(&own, &mut p).unwrap();
        assert!(clamps.is_empty(), "{clamps:?}");
        assert_eq!(granted(&p), granted(&podman5()));
        assert_eq!(
            own.limits.borrow()[&Resource::RLIMIT_NOFILE].1,
            1_048_576,
            "the runtime's own hard limit is raised before libcontainer forks"
        );
        // The soft limit the runtime runs with is not raised for it.
        assert_eq!(own.limits.borrow()[&Resource::RLIMIT_NOFILE].0, 1024);
    }

    #[test]
    fn a_limit_the_runtime_cannot_raise_is_clamped_to_its_hard_limit_with_a_record() {
        let own = Fake::new(false);
        let mut p = podman5();
        let clamps = raise(&own, &mut p).unwrap();
        assert_eq!(
            granted(&p),
            vec![
                (PosixRlimitType::RlimitNofile, 20000, 20000),
                (PosixRlimitType::RlimitNproc, 96365, 96365),
            ]
        );
        assert_eq!(
            clamps,
            vec![
                Clamp {
                    key: "process.rlimits.RLIMIT_NOFILE".to_owned(),
                    requested: "1048576:1048576".to_owned(),
                    granted: "20000:20000".to_owned(),
                },
                Clamp {
                    key: "process.rlimits.RLIMIT_NPROC".to_owned(),
                    requested: "1048576:1048576".to_owned(),
                    granted: "96365:96365".to_owned(),
                },
            ]
        );
    }

    #[test]
    fn limits_within_the_runtimes_are_left_alone_and_nothing_is_raised() {
        let own = Fake::new(false);
        let asked = [
            (PosixRlimitType::RlimitNofile, 1024, 4096),
            (PosixRlimitType::RlimitCore, 0, libc::RLIM_INFINITY),
        ];
        let mut p = process(&asked);
        assert!(raise(&own, &mut p).unwrap().is_empty());
        assert_eq!(granted(&p), asked.to_vec());
        assert!(own.sets.borrow().is_empty());
        let mut none = Process::default();
        none.set_rlimits(None);
        assert!(raise(&own, &mut none).unwrap().is_empty());
        assert!(none.rlimits().is_none());
    }

    #[test]
    fn a_soft_limit_above_the_granted_hard_one_comes_down_with_it() {
        let own = Fake::new(false);
        let mut p = process(&[(PosixRlimitType::RlimitNofile, 30000, 40000)]);
        let clamps = raise(&own, &mut p).unwrap();
        assert_eq!(
            granted(&p),
            vec![(PosixRlimitType::RlimitNofile, 20000, 20000)]
        );
        assert_eq!(clamps[0].requested, "30000:40000");
        assert_eq!(clamps[0].granted, "20000:20000");
        let mut p = process(&[(PosixRlimitType::RlimitNofile, 1024, 40000)]);
        let clamps = raise(&own, &mut p).unwrap();
        assert_eq!(clamps[0].granted, "1024:20000");
    }

    #[test]
    fn a_soft_limit_above_its_hard_limit_is_an_error_naming_the_key() {
        let own = Fake::new(true);
        let mut p = process(&[(PosixRlimitType::RlimitNofile, 4096, 1024)]);
        let err = raise(&own, &mut p).unwrap_err().to_string();
        assert!(
            err.contains("process.rlimits RLIMIT_NOFILE")
                && err.contains("4096")
                && err.contains("docs/contracts.md"),
            "{err}"
        );
        assert!(own.sets.borrow().is_empty());
    }
}
