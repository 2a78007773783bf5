//! The original destination of a connection that netfilter redirected to the proxy.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use nix::sys::socket::{getsockopt, sockopt};
use tokio::net::TcpStream;

/// Where the client meant to connect before the sandbox's `REDIRECT` rule sent it to the
/// proxy (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`).
pub(crate) fn original_destination(stream: &TcpStream) -> nix::Result<SocketAddr> {
    let local = stream
        .local_addr()
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    if local.is_ipv4() {
        let sa = getsockopt(stream, sockopt::OriginalDst)?;
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
    } else {
        let sa = getsockopt(stream, sockopt::Ip6tOriginalDst)?;
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        Ok(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sa.sin6_port)))
    }
}
