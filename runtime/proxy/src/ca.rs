//! The sandbox's own certificate authority, for HTTPS credential injection.
//!
//! A sandbox whose policy has an `https = true` credential gets a CA of its own, generated at
//! create (ECDSA P-256 with `rcgen` on `ring`; no hand-written crypto). Its certificate is
//! mounted read-only into the sandbox and added to the trust bundle its tools read; its key
//! stays on the host: written 0600 into the sandbox's state directory (never mounted), read by
//! the sandbox's proxy at start and then removed, so afterwards it exists only in the proxy's
//! memory. The CA can only vouch for the policy's bound domains: its certificate carries name
//! constraints that permit exactly those names (and no IP address unless a rule names one).

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use agent_sandbox_policy::network::{DomainRule, HostPattern};
use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long a sandbox CA (and every leaf it signs) is valid; a sandbox that lives longer needs
/// a new create. One hour back-dated for clocks that differ a little.
const VALIDITY: Duration = Duration::from_secs(400 * 86_400);
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why a CA or a leaf certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Key generation, certificate encoding or signing failed.
    #[error("cannot make the sandbox CA's certificate")]
    Generate(#[source] rcgen::Error),
    /// The stored key is not a PKCS#8 key this CA made.
    #[error("the sandbox CA's key is unusable")]
    Key(#[source] rcgen::Error),
    /// A bound domain cannot be a certificate name.
    #[error("`{name}` cannot be named in a certificate")]
    Name {
        name: String,
        #[source]
        source: rcgen::Error,
    },
}

/// A freshly generated sandbox CA: the certificate for the sandbox, the key for the host.
pub struct GeneratedCa {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// The CA key, PKCS#8 PEM. Host side only.
    pub key_pem: String,
}

impl std::fmt::Debug for GeneratedCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCa").finish_non_exhaustive()
    }
}

/// The subject and constraints of sandbox `label`'s CA. The proxy rebuilds the same
/// parameters to sign with the stored key, so they depend on `label` and `domains` only.
fn ca_params(label: &str, domains: &[DomainRule]) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "agent-sandbox");
    // The CN names the sandbox (its short id), so a person who inspects a chain sees whose
    // CA it is; 64 characters at most (RFC 5280 ub-common-name).
    let short: String = label.chars().take(12).collect();
    dn.push(DnType::CommonName, format!("agent-sandbox CA {short}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut permitted = Vec::new();
    let mut ip_rules = false;
    for d in domains {
        match d.host() {
            HostPattern::Exact(name) | HostPattern::Subdomains(name) => {
                permitted.push(GeneralSubtree::DnsName(name.clone()));
            }
            HostPattern::Ip(ip) => {
                ip_rules = true;
                let prefix = if ip.is_ipv4() { 32 } else { 128 };
                permitted.push(GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                    *ip, prefix,
                )));
            }
        }
    }
    // A permitted DNS subtree says nothing about IP names: exclude all of them unless a rule
    // binds an address.
    let excluded = if ip_rules {
        Vec::new()
    } else {
        vec![
            GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(IpAddr::from([0u8; 4]), 0)),
            GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(IpAddr::from([0u16; 8]), 0)),
        ]
    };
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: excluded,
    });
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + VALIDITY).into();
    Ok(params)
}

/// Generates sandbox `label`'s CA for the bound `domains`.
pub fn generate(label: &str, domains: &[DomainRule]) -> Result<GeneratedCa, CaError> {
    let key = KeyPair::generate().map_err(CaError::Generate)?;
    let params = ca_params(label, domains)?;
    let cert = params.self_signed(&key).map_err(CaError::Generate)?;
    Ok(GeneratedCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The signing side of a sandbox CA, in the proxy: issues a leaf certificate per host.
pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    /// One key for every leaf of this proxy (leaves differ in their names only).
    leaf_key: KeyPair,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

/// A leaf certificate and its key, ready for a TLS server.
pub struct Leaf {
    /// The leaf, then the CA.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
}

impl SandboxCa {
    /// The CA of sandbox `label` from its stored key and certificate (see [`generate`]).
    pub fn load(
        label: &str,
        domains: &[DomainRule],
        key_pem: &str,
        cert_pem: &str,
    ) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(CaError::Key)?;
        let params = ca_params(label, domains)?;
        let ca_der = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|_| CaError::Key(rcgen::Error::CouldNotParseCertificate))?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            ca_der,
            leaf_key: KeyPair::generate().map_err(CaError::Generate)?,
        })
    }

    /// A fresh CA that is not stored anywhere (tests, benchmarks).
    pub fn ephemeral(label: &str, domains: &[DomainRule]) -> Result<(Self, String), CaError> {
        let generated = generate(label, domains)?;
        let ca = Self::load(label, domains, &generated.key_pem, &generated.cert_pem)?;
        Ok((ca, generated.cert_pem))
    }

    /// A certificate for `host` (a DNS name or an IP address), signed by this CA.
    pub fn leaf(&self, host: &str) -> Result<Leaf, CaError> {
        let mut params = CertificateParams::default();
        let san = match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                SanType::DnsName(host.to_owned().try_into().map_err(|source| CaError::Name {
                    name: host.to_owned(),
                    source,
                })?)
            }
        };
        params.subject_alt_names = vec![san];
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            host.chars().take(64).collect::<String>(),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + VALIDITY).into();
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(CaError::Generate)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.ca_der.clone()],
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_pem_holds_no_key_and_the_key_signs_leaves_after_a_reload() {
        let domains = vec![DomainRule::parse("api.example.com:443").unwrap()];
        let generated = generate("0123456789abcdef", &domains).unwrap();
        assert!(generated.cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(!generated.cert_pem.contains("PRIVATE KEY"));
        assert!(generated.key_pem.contains("BEGIN PRIVATE KEY"));
        assert!(!format!("{generated:?}").contains("PRIVATE"));
        let ca = SandboxCa::load(
            "0123456789abcdef",
            &domains,
            &generated.key_pem,
            &generated.cert_pem,
        )
        .unwrap();
        let leaf = ca.leaf("api.example.com").unwrap();
        assert_eq!(leaf.chain.len(), 2);
        assert!(ca.leaf("10.0.0.1").is_ok());
    }
}
