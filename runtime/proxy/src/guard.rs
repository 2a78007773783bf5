//! Address ranges the proxy refuses to dial unless the policy names them.
//!
//! A name on the allowlist can resolve to anything, so the check runs on the resolved address,
//! and the proxy dials exactly the address it checked (no second resolution: DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;

/// A class of addresses refused by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecialRange {
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// Cloud metadata endpoints: `169.254.169.254` (inside link-local), `fd00:ec2::254`,
    /// `100.100.100.200` (Alibaba), `168.63.129.16` (Azure).
    CloudMetadata,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255` and the rest of the reserved `240.0.0.0/4`.
    Broadcast,
    /// `10/8`, `172.16/12`, `192.168/16`, `fc00::/7`, deprecated site-local `fec0::/10`.
    Private,
    /// Carrier-grade NAT, `100.64.0.0/10`.
    SharedAddressSpace,
}

impl SpecialRange {
    /// A short name for logs, events and refusal messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::CloudMetadata => "cloud-metadata",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Private => "private",
            Self::SharedAddressSpace => "shared-address-space",
        }
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> (Ipv4Addr, u8) {
    (Ipv4Addr::new(a, b, c, d), len)
}

/// IPv4 ranges, most specific first so that metadata addresses are named as such.
const V4_RANGES: &[((Ipv4Addr, u8), SpecialRange)] = &[
    (v4(169, 254, 169, 254, 32), SpecialRange::CloudMetadata),
    (v4(100, 100, 100, 200, 32), SpecialRange::CloudMetadata),
    (v4(168, 63, 129, 16, 32), SpecialRange::CloudMetadata),
    (v4(0, 0, 0, 0, 8), SpecialRange::Unspecified),
    (v4(127, 0, 0, 0, 8), SpecialRange::Loopback),
    (v4(169, 254, 0, 0, 16), SpecialRange::LinkLocal),
    (v4(224, 0, 0, 0, 4), SpecialRange::Multicast),
    (v4(240, 0, 0, 0, 4), SpecialRange::Broadcast),
    (v4(10, 0, 0, 0, 8), SpecialRange::Private),
    (v4(172, 16, 0, 0, 12), SpecialRange::Private),
    (v4(192, 168, 0, 0, 16), SpecialRange::Private),
    (v4(100, 64, 0, 0, 10), SpecialRange::SharedAddressSpace),
];

const FD00_EC2_254: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

fn v6_ranges() -> [(Ipv6Net, SpecialRange); 5] {
    // Prefix lengths are constants within 0..=128, so construction cannot fail; fall back to a
    // /128 (narrower, never wider) only to satisfy the type.
    let net =
        |addr: Ipv6Addr, len: u8| Ipv6Net::new(addr, len).unwrap_or_else(|_| Ipv6Net::from(addr));
    [
        (net(FD00_EC2_254, 128), SpecialRange::CloudMetadata),
        (
            net(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
            SpecialRange::LinkLocal,
        ),
        (
            net(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
            SpecialRange::Multicast,
        ),
        (
            net(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
            SpecialRange::Private,
        ),
        (
            net(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
            SpecialRange::Private,
        ),
    ]
}

fn classify_v4(addr: Ipv4Addr) -> Option<SpecialRange> {
    V4_RANGES.iter().find_map(|&((base, len), range)| {
        Ipv4Net::new(base, len)
            .ok()
            .filter(|net| net.contains(&addr))
            .map(|_| range)
    })
}

/// Returns the refused range `addr` falls in, or `None` for an ordinary public address.
///
/// IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`) are judged by the IPv4 address they carry.
pub fn classify(addr: IpAddr) -> Option<SpecialRange> {
    match addr {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                return Some(SpecialRange::Unspecified);
            }
            if v6.is_loopback() {
                return Some(SpecialRange::Loopback);
            }
            if let Some(inner) = embedded_v4(v6) {
                return classify_v4(inner);
            }
            v6_ranges()
                .iter()
                .find(|(net, _)| net.contains(&v6))
                .map(|&(_, range)| range)
        }
    }
}

/// The IPv4 address carried by an IPv4-mapped, IPv4-compatible or NAT64 well-known-prefix
/// IPv6 address.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail = Ipv4Addr::new(
        s[6].to_be_bytes()[0],
        s[6].to_be_bytes()[1],
        s[7].to_be_bytes()[0],
        s[7].to_be_bytes()[1],
    );
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let compatible = s[..6] == [0, 0, 0, 0, 0, 0];
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || compatible || nat64).then_some(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<SpecialRange> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn refuses_every_listed_range() {
        use SpecialRange::*;
        let cases = [
            ("0.0.0.0", Unspecified),
            ("::", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("::1", Loopback),
            ("169.254.169.254", CloudMetadata),
            ("169.254.1.1", LinkLocal),
            ("fd00:ec2::254", CloudMetadata),
            ("100.100.100.200", CloudMetadata),
            ("168.63.129.16", CloudMetadata),
            ("fe80::1", LinkLocal),
            ("224.0.0.1", Multicast),
            ("ff02::1", Multicast),
            ("255.255.255.255", Broadcast),
            ("10.0.0.1", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            // IPv4 carried in IPv6.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", CloudMetadata),
            ("::ffff:10.0.0.1", Private),
            ("::127.0.0.1", Loopback),
            ("64:ff9b::a9fe:a9fe", CloudMetadata),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), Some(want), "{addr}");
        }
    }

    #[test]
    fn lets_public_addresses_through() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "168.63.129.17",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(class(addr), None, "{addr}");
        }
    }
}
