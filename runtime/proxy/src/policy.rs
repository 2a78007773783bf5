//! The policy crate's [`Allowlist`] as the proxy's [`EgressRules`]: the proxy enforces
//! exactly the domain rules the policy validated, with no rule language of its own.

use std::net::IpAddr;

use agent_sandbox_policy::network::Allowlist;

use crate::rules::{EgressRules, Host, Verdict};

impl EgressRules for Allowlist {
    fn decide(&self, host: &Host, port: u16) -> Verdict {
        let decision = Allowlist::decide(self, &host.to_string(), port);
        Verdict {
            allowed: decision.allowed,
            rule: decision.rule,
        }
    }

    /// Some allow rule matches the name on its port (any port for rules without one: 443 is
    /// asked) and no deny rule wins there.
    fn may_allow(&self, host: &Host) -> bool {
        let name = host.to_string();
        self.allow()
            .iter()
            .any(|rule| Allowlist::decide(self, &name, rule.port().unwrap_or(443)).allowed)
    }

    /// A loopback, private or metadata address is reachable only when the policy lists
    /// that exact address as an allow rule (domain rules never open such ranges).
    fn allows_special_address(&self, _host: &Host, port: u16, addr: IpAddr) -> Option<String> {
        let decision = Allowlist::decide(self, &addr.to_canonical().to_string(), port);
        decision.allowed.then_some(decision.rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_policy::network::DomainRule;

    fn allowlist(allow: &[&str], deny: &[&str]) -> Allowlist {
        let parse = |rules: &[&str]| {
            rules
                .iter()
                .map(|r| DomainRule::parse(r).expect("valid rule"))
                .collect::<Vec<_>>()
        };
        Allowlist::new(parse(allow), parse(deny))
    }

    fn host(name: &str) -> Host {
        Host::parse(name).expect("valid host")
    }

    #[test]
    fn policy_rules_decide_as_the_policy_does() {
        let rules = allowlist(&["*.example.com:443", "pypi.org"], &["bad.example.com"]);
        assert!(EgressRules::decide(&rules, &host("api.example.com"), 443).allowed);
        assert!(!EgressRules::decide(&rules, &host("example.com"), 443).allowed);
        assert!(!EgressRules::decide(&rules, &host("api.example.com"), 80).allowed);
        let denied = EgressRules::decide(&rules, &host("bad.example.com"), 443);
        assert!(!denied.allowed);
        assert!(denied.rule.contains("bad.example.com"), "{}", denied.rule);
        assert!(EgressRules::decide(&rules, &host("PyPI.org."), 80).allowed);
    }

    #[test]
    fn names_on_some_allowed_port_may_be_allowed() {
        let rules = allowlist(&["*.example.com:8443", "pypi.org"], &["bad.example.com"]);
        assert!(rules.may_allow(&host("api.example.com")));
        assert!(rules.may_allow(&host("PyPI.org.")));
        assert!(!rules.may_allow(&host("example.com")));
        assert!(!rules.may_allow(&host("bad.example.com")));
        assert!(!rules.may_allow(&host("evil.test")));
    }

    #[test]
    fn special_addresses_need_an_exact_ip_rule() {
        let loopback: IpAddr = "127.0.0.2".parse().expect("ip");
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().expect("ip");
        let none = allowlist(&["example.com"], &[]);
        assert_eq!(
            none.allows_special_address(&host("example.com"), 80, loopback),
            None
        );
        let listed = allowlist(&["example.com", "127.0.0.2:80"], &[]);
        assert!(
            listed
                .allows_special_address(&host("example.com"), 80, loopback)
                .is_some()
        );
        assert!(
            listed
                .allows_special_address(&host("example.com"), 80, mapped)
                .is_some()
        );
        assert_eq!(
            listed.allows_special_address(&host("example.com"), 81, loopback),
            None
        );
    }
}
