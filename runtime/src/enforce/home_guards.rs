//! The HOME guards placed by the runtime instead of libcontainer: the mounts
//! `agent_sandbox_policy::harden::split_home_guards` splits off the hardened spec, turned
//! into the few raw system calls of `agent_sandbox_sys::guard_mounts` and placed in the
//! created container, by a child that runs while `create` ties the sidecars to the init,
//! before `create` returns. The spec's option words are read strictly:
//! one this code does not know fails the create rather than being dropped.

use agent_sandbox_sys::guard_mounts::{self, Guard, GuardKind, GuardMount};
use libcontainer::oci_spec::runtime::Mount;

use super::mounts::MountError;

/// The attribute an option word sets, for the words a guard may carry.
fn attr(word: &str) -> Option<u64> {
    Some(match word {
        "ro" => guard_mounts::ATTR_RDONLY,
        "nosuid" => guard_mounts::ATTR_NOSUID,
        "nodev" => guard_mounts::ATTR_NODEV,
        "noexec" => guard_mounts::ATTR_NOEXEC,
        _ => return None,
    })
}

/// One spec mount as a guard: a tmpfs (flags and `key=value` options) or a bind.
pub fn guard(m: &Mount) -> Result<Guard, MountError> {
    let dest = m.destination().clone();
    let unknown = |option: &str| MountError::GuardOption {
        dest: dest.clone(),
        option: option.to_owned(),
    };
    let mut attrs = 0;
    let mut data = Vec::new();
    let bind = m.typ().as_deref() == Some("bind");
    for word in m.options().iter().flatten() {
        if let Some(a) = attr(word) {
            attrs |= a;
        } else if bind && word == "bind" {
        } else if let (false, Some((k, v))) = (bind, word.split_once('=')) {
            data.push((k.to_owned(), v.to_owned()));
        } else {
            return Err(unknown(word));
        }
    }
    let kind = match (m.typ().as_deref(), m.source()) {
        (Some("bind"), Some(source)) => GuardKind::Bind {
            source: source.clone(),
        },
        (Some("tmpfs"), source) => GuardKind::Tmpfs {
            source: source
                .as_ref()
                .map_or_else(|| "tmpfs".to_owned(), |s| s.display().to_string()),
            options: data,
        },
        (typ, _) => return Err(unknown(&format!("type {}", typ.unwrap_or("none")))),
    };
    Ok(Guard {
        mount: GuardMount { dest, kind },
        attrs,
    })
}

/// Starts placing `mounts` (in order) in the created container whose init is `pid`; the
/// returned child's [`Placing::wait`](guard_mounts::Placing::wait) says when they all are.
pub fn start(pid: i32, mounts: &[Mount]) -> Result<guard_mounts::Placing, MountError> {
    let guards = mounts.iter().map(guard).collect::<Result<Vec<_>, _>>()?;
    guard_mounts::start(pid, &guards).map_err(MountError::HomeGuards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn mount(json: &str) -> Mount {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_spec_words_become_attributes_and_options() {
        let t = guard(&mount(
            r#"{"destination":"/home/.config","type":"tmpfs","source":"tmpfs",
                "options":["nosuid","nodev","mode=0755","uid=0","gid=0","size=1024"]}"#,
        ))
        .unwrap();
        assert_eq!(
            t.attrs,
            guard_mounts::ATTR_NOSUID | guard_mounts::ATTR_NODEV
        );
        assert_eq!(
            t.mount.kind,
            GuardKind::Tmpfs {
                source: "tmpfs".to_owned(),
                options: [
                    ("mode", "0755"),
                    ("uid", "0"),
                    ("gid", "0"),
                    ("size", "1024")
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
            }
        );
        let b = guard(&mount(
            r#"{"destination":"/home/.bashrc","type":"bind","source":"/run/p/file",
                "options":["bind","ro","nosuid","nodev","noexec"]}"#,
        ))
        .unwrap();
        assert_eq!(b.attrs, 0xf);
        assert_eq!(
            b.mount.kind,
            GuardKind::Bind {
                source: PathBuf::from("/run/p/file")
            }
        );
    }

    /// A word the guards never carry is an error naming it, never dropped.
    #[test]
    fn an_unknown_word_or_type_is_refused() {
        for (json, word) in [
            (
                r#"{"destination":"/h/.x","type":"bind","source":"/p","options":["rbind"]}"#,
                "rbind",
            ),
            (
                r#"{"destination":"/h/.x","type":"bind","source":"/p","options":["size=1"]}"#,
                "size=1",
            ),
            (
                r#"{"destination":"/h","type":"tmpfs","source":"t","options":["exec"]}"#,
                "exec",
            ),
            (
                r#"{"destination":"/h","type":"proc","source":"p"}"#,
                "type proc",
            ),
        ] {
            match guard(&mount(json)) {
                Err(MountError::GuardOption { option, .. }) => assert_eq!(option, word),
                other => panic!("{json}: {other:?}"),
            }
        }
    }
}
