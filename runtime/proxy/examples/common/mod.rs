//! What the proxy benchmarks (`bench`, `bench_tls`) share: their arguments, the rules that
//! allow their own server names, the load average and the median. A folder, not
//! `examples/common.rs`, so that Cargo does not take it for an example of its own.

use std::net::IpAddr;

use agent_sandbox_proxy::{EgressRules, Host, Verdict};
use anyhow::{Context, Result, ensure};

/// The address the bench servers listen on; nothing leaves loopback.
pub const SERVER_IP: &str = "127.0.0.2";

/// `MEGABYTES REQUESTS ROUNDS` from the command line, each positive; missing ones default to
/// 100 MB, `requests` and 5 rounds.
pub fn args(requests: u64) -> Result<(u64, usize, u64)> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .context("arguments are numbers: MEGABYTES REQUESTS ROUNDS")
        })
        .collect::<Result<_>>()?;
    let megabytes = args.first().copied().unwrap_or(100);
    let requests = usize::try_from(args.get(1).copied().unwrap_or(requests))?;
    let rounds = args.get(2).copied().unwrap_or(5);
    ensure!(
        megabytes > 0 && requests > 0 && rounds > 0,
        "arguments must be positive"
    );
    Ok((megabytes, requests, rounds))
}

/// Allows `names` under `rule` (and `SERVER_IP`, a loopback address), denies the rest.
pub struct BenchRules {
    pub names: &'static [&'static str],
    pub rule: &'static str,
}

impl EgressRules for BenchRules {
    fn decide(&self, host: &Host, _port: u16) -> Verdict {
        match host {
            Host::Domain(d) if self.names.contains(&d.as_str()) => Verdict::allow(self.rule),
            _ => Verdict::deny("default deny"),
        }
    }

    fn allows_special_address(&self, _host: &Host, _port: u16, addr: IpAddr) -> Option<String> {
        (addr.to_string() == SERVER_IP).then(|| "bench server".to_owned())
    }
}

/// The 1-minute load average, from /proc/loadavg.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
