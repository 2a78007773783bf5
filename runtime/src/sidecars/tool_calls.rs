//! Which tool call a connection to the egress proxy belongs to, found from the host side.
//!
//! The harness names a tool call when it starts a process in the sandbox (the
//! `io.agent-sandbox.tool-call-id` annotation, or `AGENT_SANDBOX_TOOL_CALL_ID` in the exec's
//! environment): the runtime then tags the process's host pid in the sandbox's state
//! directory ([`tag`], `audit-exec/PID`, with the process's start time so a reused pid does
//! not inherit the tag). When a connection reaches the proxy, [`ExecTags`] finds the process
//! that holds the sandbox's end of it and walks up its parents to the nearest tagged one:
//!
//! 1. the socket: the entry of `/proc/INIT/net/tcp` (or `tcp6`) of the sandbox's network
//!    namespace whose local address is the client address the proxy saw gives its inode;
//! 2. its holders: the processes of the sandbox's cgroup (`cgroup.procs`) with a descriptor
//!    `socket:[INODE]`;
//! 3. each holder's exec: its parent chain (`/proc/PID/stat`) up to a tagged pid whose start
//!    time matches. Every holder must lead to the same tag, or the connection gets none.
//!
//! Nothing here reads what the sandbox wrote (headers, its environment, its files): the
//! sandbox can only choose which of its processes connects. Limits (docs/egress.md, "Naming
//! the tool call"): a process orphaned by its exec's tree (a double fork) is reparented to
//! the sandbox's init and gets the init's tool call, if any; processes that pass a socket
//! between two execs' trees make it ambiguous (no tool call); a connection whose process
//! closed its socket before the proxy looked has none. A pod's proxy searches its app
//! containers' processes and tags too (they share its network namespace), so their execs'
//! connections carry their tool calls, and it names the member container whose cgroup
//! lists the socket's holders (`container` in the `net` record; none for the pod
//! sandbox's own processes, or when holders in two containers share the socket).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use agent_sandbox_proxy::Origin;

use crate::state::{ContainerId, SandboxDir, StateDirs};

/// Most parents walked from a holder.
const MAX_DEPTH: usize = 4096;

/// The tool call of process `pid`, remembered for [`ExecTags`] and the `exit` record:
/// `audit-exec/PID` holds the id, then the process's start time.
pub fn tag(sandbox: &SandboxDir, pid: i32, tool_call: &str) -> std::io::Result<()> {
    let start = stat(pid).map(|s| s.start).unwrap_or_default();
    std::fs::create_dir_all(sandbox.audit_exec_tags())?;
    std::fs::write(
        sandbox.audit_exec_tag(pid),
        format!("{tool_call}\n{start}\n"),
    )
}

/// The tool call a tag file names (its first line).
pub fn tag_id(text: &str) -> Option<String> {
    text.lines()
        .next()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// `ppid` and start time (clock ticks since boot) of a process, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ppid: i32,
    start: u64,
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The command name may hold spaces and parentheses: the fields after its last `)` count.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... starttime(22).
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The inode of the socket whose local address is `addr` in a `/proc/net/tcp{,6}` table.
fn socket_inode(table: &str, addr: SocketAddr) -> Option<u64> {
    let want = (canonical(addr.ip()), addr.port());
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local = parse_hex_addr(f.get(1)?)?;
        (local == want).then(|| f.get(9)?.parse().ok()).flatten()
    })
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word as the
/// kernel prints it, the bytes of the address in the host's order.
fn parse_hex_addr(text: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            canonical(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => return None,
    };
    Some((ip, port))
}

/// The runtime's [`agent_sandbox_proxy::ToolCalls`] for one sandbox, and, for a pod's
/// sandbox, for the pod's app containers too: they share its network namespace and its
/// proxy, so their processes and tags are searched beside its own.
#[derive(Debug)]
pub struct ExecTags {
    init: i32,
    tags: PathBuf,
    /// The state root and the sandbox's id, to find a pod's app containers.
    pod: Option<(StateDirs, ContainerId)>,
}

/// One sandbox whose processes may hold a connection: its init and its tag directory, and
/// for a pod's app container its id (none: the sandbox the proxy serves itself).
struct Holder {
    init: i32,
    tags: PathBuf,
    member: Option<ContainerId>,
}

impl ExecTags {
    /// For the sandbox `id` whose init (holding its network namespace) is `init`.
    pub fn new(sandbox: &SandboxDir, id: &str, init: i32) -> Self {
        let pod = sandbox
            .state_root()
            .zip(ContainerId::try_from(id).ok())
            .map(|(root, id)| (StateDirs::new(root.to_owned()), id));
        Self {
            init,
            tags: sandbox.audit_exec_tags(),
            pod,
        }
    }

    /// This sandbox, then the app containers of its pod (each with its init's pid from its
    /// state; looked up per connection, as containers join and leave the pod).
    fn holders(&self) -> Vec<Holder> {
        let mut out = vec![Holder {
            init: self.init,
            tags: self.tags.clone(),
            member: None,
        }];
        let Some((dirs, id)) = &self.pod else {
            return out;
        };
        for member in crate::pod::members_of(dirs, id) {
            let state = dirs.container(&member).join("state.json");
            let Some(init) = std::fs::read(&state)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["pid"].as_i64())
                .and_then(|p| i32::try_from(p).ok())
            else {
                continue;
            };
            out.push(Holder {
                init,
                tags: dirs.sandbox(&member).audit_exec_tags(),
                member: Some(member),
            });
        }
        out
    }

    /// The tagged processes: pid -> (tool call, start time).
    fn tagged(holders: &[Holder]) -> BTreeMap<i32, (String, u64)> {
        holders
            .iter()
            .filter_map(|h| std::fs::read_dir(&h.tags).ok())
            .flat_map(|dir| dir.flatten())
            .filter_map(|e| {
                let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                let text = std::fs::read_to_string(e.path()).ok()?;
                let id = tag_id(&text)?;
                let start = text.lines().nth(1)?.trim().parse().ok()?;
                Some((pid, (id, start)))
            })
            .collect()
    }

    /// The sandboxes' processes: each init's cgroup's `cgroup.procs` (execs join it), with
    /// the index of the holder whose cgroup lists them.
    fn procs(holders: &[Holder]) -> BTreeMap<i32, usize> {
        let mut procs = BTreeMap::new();
        for (i, h) in holders.iter().enumerate() {
            let dirs = crate::host::cgroups::dirs_of(&crate::host::cgroups::RealHost, h.init);
            let from_cgroup = ["pids", "memory", "unified"]
                .iter()
                .filter_map(|k| dirs.get(*k))
                .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok());
            procs.extend(
                from_cgroup
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .map(|pid| (pid, i)),
            );
            procs.insert(h.init, i);
        }
        procs
    }

    fn holding(procs: &BTreeMap<i32, usize>, inode: u64) -> Vec<i32> {
        let want = format!("socket:[{inode}]");
        procs
            .keys()
            .copied()
            .filter(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                    fds.flatten().any(|fd| {
                        std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())
                    })
                })
            })
            .collect()
    }

    fn lookup(&self, client: SocketAddr) -> Origin {
        let holders = self.holders();
        let tagged = Self::tagged(&holders);
        // Outside a pod, with no tagged process, there is nothing to name.
        if tagged.is_empty() && holders.len() == 1 {
            return Origin::default();
        }
        let net = Path::new("/proc").join(self.init.to_string()).join("net");
        let Some(inode) = ["tcp", "tcp6"]
            .iter()
            .find_map(|t| socket_inode(&std::fs::read_to_string(net.join(t)).ok()?, client))
        else {
            return Origin::default();
        };
        let procs = Self::procs(&holders);
        let holding = Self::holding(&procs, inode);
        let calls: BTreeSet<Option<String>> = holding
            .iter()
            .map(|&pid| exec_of(pid, &procs, &tagged, stat))
            .collect();
        let members: BTreeSet<Option<&str>> = holding
            .iter()
            .map(|pid| {
                procs
                    .get(pid)
                    .and_then(|&i| holders.get(i)?.member.as_ref())
                    .map(ContainerId::as_str)
            })
            .collect();
        Origin {
            tool_call_id: only(calls).flatten(),
            container: only(members).flatten().map(str::to_owned),
        }
    }
}

/// The one value every holder of a socket leads to; none when they disagree (a socket
/// passed between two execs' or two containers' processes) or nothing holds it.
fn only<T>(found: BTreeSet<T>) -> Option<T> {
    if found.len() == 1 {
        found.into_iter().next()
    } else {
        None
    }
}

/// The tool call of the nearest tagged ancestor of `pid` (itself included) within `procs`.
fn exec_of(
    mut pid: i32,
    procs: &BTreeMap<i32, usize>,
    tagged: &BTreeMap<i32, (String, u64)>,
    stat: impl Fn(i32) -> Option<Stat>,
) -> Option<String> {
    for _ in 0..MAX_DEPTH {
        if !procs.contains_key(&pid) {
            return None;
        }
        let s = stat(pid)?;
        if let Some((id, start)) = tagged.get(&pid)
            && *start == s.start
        {
            return Some(id.clone());
        }
        pid = s.ppid;
    }
    None
}

impl agent_sandbox_proxy::ToolCalls for ExecTags {
    fn of(&self, client: SocketAddr) -> Origin {
        self.lookup(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_after_the_name() {
        let text = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                ppid: 7,
                start: 123456
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn socket_tables_name_the_client_socket() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n   1: 0100007F:9C40 0100007F:0C38 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n";
        assert_eq!(
            socket_inode(v4, "127.0.0.1:40000".parse().unwrap()),
            Some(222)
        );
        assert_eq!(
            socket_inode(v4, "127.0.0.1:3128".parse().unwrap()),
            Some(111)
        );
        assert_eq!(socket_inode(v4, "127.0.0.1:1".parse().unwrap()), None);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:0C38 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1\n";
        assert_eq!(socket_inode(v6, "[::1]:40001".parse().unwrap()), Some(333));
    }

    #[test]
    fn a_socket_is_named_only_by_what_all_its_holders_agree_on() {
        assert_eq!(only(BTreeSet::from([Some("a")])), Some(Some("a")));
        assert_eq!(only(BTreeSet::from([Some("a"), Some("b")])), None);
        assert_eq!(only(BTreeSet::from([Some("a"), None])), None);
        assert_eq!(only(BTreeSet::<Option<&str>>::new()), None);
    }

    /// The attack: a process of exec B (tagged `toolu_B`) sends a header naming
    /// `toolu_A_USER_APPROVED_THIS`; the runtime's attribution follows its parents to B.
    #[test]
    fn a_process_is_attributed_to_its_nearest_tagged_ancestor() {
        // init 10 -> exec A 20 -> 21; exec B 30 -> 31 -> 32; 40 reused the dead exec's pid 50.
        let parents: BTreeMap<i32, (i32, u64)> = [
            (10, (1, 5)),
            (20, (2, 6)),
            (21, (20, 7)),
            (30, (2, 8)),
            (31, (30, 9)),
            (32, (31, 10)),
            (50, (10, 99)),
        ]
        .into();
        let procs: BTreeMap<i32, usize> = parents.keys().map(|&p| (p, 0)).collect();
        let tagged: BTreeMap<i32, (String, u64)> = [
            (20, ("toolu_A".to_owned(), 6)),
            (30, ("toolu_B".to_owned(), 8)),
            (50, ("toolu_dead".to_owned(), 11)),
        ]
        .into();
        let stat = |pid: i32| parents.get(&pid).map(|&(ppid, start)| Stat { ppid, start });
        let of = |pid| exec_of(pid, &procs, &tagged, stat);
        assert_eq!(of(32).as_deref(), Some("toolu_B"));
        assert_eq!(of(21).as_deref(), Some("toolu_A"));
        assert_eq!(of(10), None);
        // A pid reused after its exec ended does not inherit the tag.
        assert_eq!(of(50), None);
        // Outside the sandbox's processes: nothing.
        assert_eq!(of(2), None);
    }
}
