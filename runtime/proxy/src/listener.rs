//! Creating the proxy's listening socket inside a sandbox's network namespace.
//!
//! A dedicated thread enters the namespace (`setns`, which moves only the calling thread),
//! binds `127.0.0.1:PORT` there and ends. The socket keeps belonging to the namespace it was
//! created in, so the proxy serves it from the host side while only the sandbox can connect.
//! No process runs inside the sandbox for this.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

/// Why the listener could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The namespace file could not be opened.
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        /// The namespace path (e.g. `/proc/PID/ns/net` or `/run/netns/NAME`).
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `setns` into the namespace failed.
    #[error("cannot enter network namespace {path}")]
    EnterNetns {
        /// The namespace path.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// Binding `127.0.0.1:port` inside the namespace failed.
    #[error("cannot bind 127.0.0.1:{port} in network namespace {path}")]
    Bind {
        /// The namespace path.
        path: PathBuf,
        /// The port asked for (0: any).
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The new listener cannot be reached from inside the namespace (typically: `lo` is down
    /// there; the binding succeeds but no connection gets through).
    #[error("127.0.0.1:{port} is not reachable inside network namespace {path} (is lo up?)")]
    Unreachable {
        /// The namespace path.
        path: PathBuf,
        /// The port that was bound.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The helper thread could not be started or died.
    #[error("the namespace helper thread failed")]
    Thread(#[source] std::io::Error),
}

/// Binds `127.0.0.1:port` inside the network namespace at `netns`, checks that a connection
/// from inside the namespace reaches it, and returns the listener, ready for
/// [`crate::Proxy::serve_std`]. Port 0 picks a free port (read it from `local_addr`).
pub fn bind_in_netns(netns: &Path, port: u16) -> Result<TcpListener, ListenerError> {
    let path = netns.to_path_buf();
    let worker = std::thread::Builder::new()
        .name("proxy-netns-bind".into())
        .spawn(move || {
            let ns = File::open(&path).map_err(|source| ListenerError::OpenNetns {
                path: path.clone(),
                source,
            })?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| ListenerError::EnterNetns {
                path: path.clone(),
                source,
            })?;
            // This thread now lives in the sandbox's namespace; it ends right after binding.
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|source| {
                ListenerError::Bind {
                    path: path.clone(),
                    port,
                    source,
                }
            })?;
            // A bind on a down `lo` succeeds, yet nothing inside could connect: prove the
            // sandbox's side of the door opens before handing the listener over.
            let addr = listener
                .local_addr()
                .map_err(|source| ListenerError::Bind {
                    path: path.clone(),
                    port,
                    source,
                })?;
            let unreachable = |source| ListenerError::Unreachable {
                path: path.clone(),
                port: addr.port(),
                source,
            };
            let probe =
                TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(unreachable)?;
            // The probe is in the backlog: take it out so the proxy never sees it.
            let (accepted, _) = listener.accept().map_err(unreachable)?;
            drop((probe, accepted));
            Ok(listener)
        })
        .map_err(ListenerError::Thread)?;
    worker.join().map_err(|_| {
        ListenerError::Thread(std::io::Error::other("namespace helper thread panicked"))
    })?
}

/// The sockets of transparent egress, bound inside the sandbox's network namespace.
#[derive(Debug)]
pub struct TransparentSockets {
    /// Where redirected TCP arrives (IPv4: `127.0.0.1`, IPv6: `[::1]`).
    pub tcp: Vec<TcpListener>,
    /// The DNS stub's sockets (every UDP query to port 53 is redirected to them).
    pub dns: Vec<std::net::UdpSocket>,
}

/// Why transparent egress could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TransparentError {
    /// Entering the namespace or binding failed.
    #[error("cannot prepare transparent egress in the sandbox's network namespace")]
    Listener(#[source] ListenerError),
    /// A host tool (`ip`, `iptables-restore`, `ip6tables-restore`) is missing or failed.
    #[error("`{command}` failed in the sandbox's network namespace: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its error output or why it could not run.
        detail: String,
    },
}

/// Sets up transparent egress inside the network namespace at `netns` (docs/egress.md):
/// binds the redirect listeners and the DNS stub's sockets on loopback (ports picked by the
/// kernel), routes every destination to `lo`, and loads netfilter rules that send every UDP
/// query to port 53 to the stub, every TCP connection to a non-loopback address to the
/// redirect listener, and refuse new TCP connections on loopback except to `loopback_ports`
/// (the proxy's port and the policy's `local_ports`) and the redirect listener. Runs the
/// host's `ip`, `iptables-restore` and `ip6tables-restore` from a thread inside the
/// namespace; nothing runs inside the sandbox. IPv6 is set up the same way unless the kernel
/// has it disabled (then the sandbox has no IPv6 at all).
pub fn transparent_in_netns(
    netns: &Path,
    loopback_ports: &[u16],
) -> Result<TransparentSockets, TransparentError> {
    let path = netns.to_path_buf();
    let ports = loopback_ports.to_vec();
    let worker = std::thread::Builder::new()
        .name("proxy-netns-transparent".into())
        .spawn(move || {
            let listener_error = TransparentError::Listener;
            let ns = File::open(&path).map_err(|source| {
                listener_error(ListenerError::OpenNetns {
                    path: path.clone(),
                    source,
                })
            })?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|source| {
                listener_error(ListenerError::EnterNetns {
                    path: path.clone(),
                    source,
                })
            })?;
            let bind_error = |source| {
                listener_error(ListenerError::Bind {
                    path: path.clone(),
                    port: 0,
                    source,
                })
            };
            // /proc/sys/net shows the namespace of the reading thread.
            let ipv6 = Path::new("/proc/sys/net/ipv6").exists();
            let mut families: Vec<std::net::IpAddr> = vec![Ipv4Addr::LOCALHOST.into()];
            if ipv6 {
                families.push(std::net::Ipv6Addr::LOCALHOST.into());
            }
            let mut sockets = TransparentSockets {
                tcp: Vec::new(),
                dns: Vec::new(),
            };
            for ip in families {
                let tcp = TcpListener::bind((ip, 0)).map_err(bind_error)?;
                let dns = std::net::UdpSocket::bind((ip, 0)).map_err(bind_error)?;
                let tcp_port = tcp.local_addr().map_err(bind_error)?.port();
                let dns_port = dns.local_addr().map_err(bind_error)?.port();
                let (family, restore, loopback) = if ip.is_ipv4() {
                    ("-4", "iptables-restore", "127.0.0.0/8")
                } else {
                    ("-6", "ip6tables-restore", "::1/128")
                };
                // The source is loopback's own address, so answers (DNS replies above all)
                // come back on loopback.
                let src = ip.to_string();
                run(
                    "ip",
                    &[
                        family, "route", "replace", "default", "dev", "lo", "src", &src,
                    ],
                    None,
                )?;
                let rules = netfilter_rules(loopback, tcp_port, dns_port, &ports);
                run(restore, &["-w", "5"], Some(&rules))?;
                sockets.tcp.push(tcp);
                sockets.dns.push(dns);
            }
            Ok(sockets)
        })
        .map_err(|e| TransparentError::Listener(ListenerError::Thread(e)))?;
    worker.join().map_err(|_| {
        TransparentError::Listener(ListenerError::Thread(std::io::Error::other(
            "namespace helper thread panicked",
        )))
    })?
}

/// The `iptables-restore` input of one address family.
fn netfilter_rules(loopback: &str, tcp_port: u16, dns_port: u16, ports: &[u16]) -> String {
    let mut r = String::new();
    r.push_str("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    // Every DNS query, whatever server resolv.conf names (loopback ones too), to the stub.
    r.push_str(&format!(
        "-A OUTPUT -p udp --dport 53 -j REDIRECT --to-ports {dns_port}\n"
    ));
    r.push_str(&format!("-A OUTPUT -d {loopback} -j RETURN\n"));
    // Every TCP connection that would leave loopback, on any port, to the proxy.
    r.push_str(&format!(
        "-A OUTPUT -p tcp -j REDIRECT --to-ports {tcp_port}\n"
    ));
    r.push_str("COMMIT\n");
    r.push_str("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    // Loopback TCP (after the redirect) only to the proxy's ports and the local ports, as
    // Landlock's port rule does without transparent egress.
    let mut allowed: Vec<u16> = ports.to_vec();
    allowed.push(tcp_port);
    allowed.sort_unstable();
    allowed.dedup();
    for port in allowed {
        r.push_str(&format!(
            "-A OUTPUT -o lo -p tcp --syn --dport {port} -j ACCEPT\n"
        ));
    }
    r.push_str("-A OUTPUT -p tcp --syn -j REJECT --reject-with tcp-reset\n");
    // Nothing but DNS to the stub leaves over UDP (it could only loop back anyway).
    r.push_str(&format!("-A OUTPUT -o lo -p udp -d {loopback} -j ACCEPT\n"));
    r.push_str("-A OUTPUT -p udp -j DROP\n");
    r.push_str("COMMIT\n");
    r
}

/// The host tool `name` from `PATH` or the system directories (`/usr/sbin`, `/sbin`, which
/// the environment of podman's or containerd's children may lack); the bare name otherwise.
fn find_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs a host tool (from the calling thread's namespace) and fails with its stderr.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), TransparentError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let command = format!("{program} {}", args.join(" "));
    let failed = |detail: String| TransparentError::Command {
        command: command.clone(),
        detail,
    };
    let mut child = Command::new(find_tool(program))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot run it: {e}")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| failed(format!("cannot write its input: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(format!("cannot wait for it: {e}")))?;
    if !out.status.success() {
        return Err(failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
