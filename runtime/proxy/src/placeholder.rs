//! Credential placeholders (docs/egress.md#placeholders). A sandbox's own are the fixed
//! prefix, the variable's name and a random suffix made at its create ([`suffix`]): the same
//! across a restore in place, new for a fork. On a credential-bound connection the proxy
//! refuses a request that carries the prefix followed by anything but one of the sandbox's
//! own placeholders ([`Guard`]): its parent's after a fork, a sibling's, the fixed text older
//! runtimes gave every sandbox, a guess. It looks for the prefix in every form the response
//! scrubber knows (`crate::scrub`: percent-encoded, JSON and HTML escapes, hex, base64 at
//! each alignment), and compares what follows with the same form of each own placeholder.

use agent_sandbox_policy::network::{PLACEHOLDER_PREFIX, PLACEHOLDER_SUFFIX_HEX};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// Why a placeholder could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlaceholderError {
    #[error("cannot read random bytes for the sandbox's credential placeholders")]
    Random,
}

/// A new random placeholder suffix: [`PLACEHOLDER_SUFFIX_HEX`] lower-case hex digits (128
/// bits from the kernel's random source, through the TLS library's provider).
pub fn suffix() -> Result<String, PlaceholderError> {
    let mut bytes = [0u8; PLACEHOLDER_SUFFIX_HEX / 2];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| PlaceholderError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The most bytes of a refused token that its audit record names.
const NAMED_BYTES: usize = 200;

/// The search for placeholder-shaped tokens that are not the sandbox's own.
pub(crate) struct Guard {
    /// Every form of the prefix.
    finder: AhoCorasick,
    /// Per pattern of `finder`: the same form of each of the sandbox's own placeholders.
    own: Vec<Vec<Vec<u8>>>,
    /// How many bytes from a match's start decide it (the longest pattern or own form).
    decide: usize,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("forms", &self.own.len())
            .finish_non_exhaustive()
    }
}

/// A placeholder-shaped token that is not the sandbox's own, as found (escaped: printable
/// ASCII only, at most [`NAMED_BYTES`] of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Foreign(pub(crate) String);

impl Guard {
    /// A guard accepting exactly `own` (the sandbox's placeholders); `None` only if the
    /// search automaton cannot be built.
    pub(crate) fn new(own: &[&str]) -> Option<Self> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut accepted: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut add = |needle: Vec<u8>, form: Option<Vec<u8>>| {
            let at = match patterns.iter().position(|p| *p == needle) {
                Some(at) => at,
                None => {
                    patterns.push(needle);
                    accepted.push(Vec::new());
                    accepted.len() - 1
                }
            };
            if let (Some(list), Some(form)) = (accepted.get_mut(at), form)
                && !list.contains(&form)
            {
                list.push(form);
            }
        };
        let prefix = PLACEHOLDER_PREFIX.as_bytes();
        if own.is_empty() {
            for (needle, _) in crate::scrub::pairs_of_forms(prefix, prefix) {
                add(needle, None);
            }
        }
        for placeholder in own {
            // The pairs come in the same order for every text: each form of the prefix
            // beside the same form of the placeholder, which begins with it.
            for (needle, form) in crate::scrub::pairs_of_forms(prefix, placeholder.as_bytes()) {
                add(needle, Some(form));
            }
        }
        let decide = patterns
            .iter()
            .chain(accepted.iter().flatten())
            .map(Vec::len)
            .max()
            .unwrap_or(1);
        let finder = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .ok()?;
        Some(Self {
            finder,
            own: accepted,
            decide,
        })
    }

    /// Bytes a stream holds back so that each token is decided whole.
    pub(crate) fn hold_back(&self) -> usize {
        self.decide.saturating_sub(1)
    }

    /// The first token in `data` that starts before `upto` and is not the sandbox's own;
    /// a token cut off by the end of `data` is not.
    fn first_foreign(&self, data: &[u8], upto: usize) -> Option<Foreign> {
        for m in self.finder.find_overlapping_iter(data) {
            if m.start() >= upto {
                continue;
            }
            let rest = data.get(m.start()..).unwrap_or_default();
            let own = self
                .own
                .get(m.pattern().as_usize())
                .is_some_and(|forms| forms.iter().any(|f| rest.starts_with(f)));
            if !own {
                return Some(Foreign(named(rest)));
            }
        }
        None
    }

    /// The first token in the whole of `data` that is not the sandbox's own.
    pub(crate) fn check(&self, data: &[u8]) -> Result<(), Foreign> {
        match self.first_foreign(data, data.len()) {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// The token at the start of `rest`, for the audit record: the run of bytes any form of a
/// placeholder is made of, escaped, at most [`NAMED_BYTES`] of them.
fn named(rest: &[u8]) -> String {
    let token = |b: &u8| b.is_ascii_alphanumeric() || b"-_%\\+/=&#;".contains(b);
    let end = rest
        .iter()
        .take(NAMED_BYTES)
        .position(|b| !token(b))
        .unwrap_or(rest.len().min(NAMED_BYTES));
    rest.get(..end)
        .unwrap_or_default()
        .escape_ascii()
        .to_string()
}

/// A request body searched as it streams: the bytes that could begin an undecided token are
/// held back until it is decided.
#[derive(Debug, Default)]
pub(crate) struct GuardStream {
    tail: Vec<u8>,
}

impl GuardStream {
    /// Adds a piece: the bytes now safe to forward, or the first foreign token.
    pub(crate) fn push(&mut self, guard: &Guard, data: &[u8]) -> Result<Vec<u8>, Foreign> {
        self.tail.extend_from_slice(data);
        let safe = self.tail.len().saturating_sub(guard.hold_back());
        if let Some(f) = guard.first_foreign(&self.tail, safe) {
            return Err(f);
        }
        Ok(self.tail.drain(..safe).collect())
    }

    /// The end of the stream: what was held back, or the foreign token in it.
    pub(crate) fn finish(&mut self, guard: &Guard) -> Result<Vec<u8>, Foreign> {
        let rest = std::mem::take(&mut self.tail);
        guard.check(&rest)?;
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_policy::network::{legacy_placeholder_value, placeholder_value};

    const MINE: &str = "0123456789abcdef0123456789abcdef";
    const PARENT: &str = "fedcba9876543210fedcba9876543210";

    fn own() -> String {
        placeholder_value("API_TOKEN", MINE)
    }

    fn guard() -> Guard {
        Guard::new(&[own().as_str()]).unwrap()
    }

    /// One encoding of a whole text.
    type Encode = fn(&str) -> Vec<u8>;

    /// Each encoding a tool or an API may put a token in, applied to a whole text.
    fn encodings() -> Vec<(&'static str, Encode)> {
        fn all_percent(s: &str) -> Vec<u8> {
            s.bytes()
                .flat_map(|b| format!("%{b:02X}").into_bytes())
                .collect()
        }
        fn lower_percent(s: &str) -> Vec<u8> {
            s.bytes()
                .flat_map(|b| format!("%{b:02x}").into_bytes())
                .collect()
        }
        fn hex(s: &str) -> Vec<u8> {
            s.bytes()
                .flat_map(|b| format!("{b:02x}").into_bytes())
                .collect()
        }
        fn json_all(s: &str) -> Vec<u8> {
            s.chars()
                .flat_map(|c| format!("\\u{:04x}", u32::from(c)).into_bytes())
                .collect()
        }
        /// Base64 of the text `lead`, `s` and `tail` (so `s` starts at each alignment).
        fn b64_in(lead: &str, s: &str, tail: &str, url: bool) -> Vec<u8> {
            let alphabet = if url {
                crate::scrub::URL_SAFE
            } else {
                crate::scrub::STANDARD
            };
            crate::scrub::base64(format!("{lead}{s}{tail}").as_bytes(), alphabet, !url)
        }
        fn b64(s: &str) -> Vec<u8> {
            b64_in("", s, "", false)
        }
        fn b64_url_led(s: &str) -> Vec<u8> {
            b64_in("x", s, "", true)
        }
        fn b64_led2(s: &str) -> Vec<u8> {
            b64_in("ab", s, "\"}", false)
        }
        vec![
            ("plain", |s| s.as_bytes().to_vec()),
            ("percent", all_percent),
            ("percent lower", lower_percent),
            ("hex", hex),
            ("json", json_all),
            ("base64", b64),
            ("base64 url, 1 byte in", b64_url_led),
            ("base64, 2 bytes in", b64_led2),
        ]
    }

    #[test]
    fn the_own_placeholder_passes_in_every_form() {
        let g = guard();
        for (name, encode) in encodings() {
            let mut body = b"{\"token\":\"".to_vec();
            body.extend(encode(&own()));
            body.extend(b"\"}");
            assert_eq!(g.check(&body), Ok(()), "{name}");
        }
    }

    #[test]
    fn a_parents_a_siblings_a_legacy_and_a_guessed_one_are_refused_in_every_form() {
        let g = guard();
        for other in [
            placeholder_value("API_TOKEN", PARENT),
            legacy_placeholder_value("API_TOKEN"),
            placeholder_value("OTHER", MINE),
            format!("{}{}", &own()[..own().len() - 1], "0"),
            "agent-sandbox-placeholder-".to_owned(),
        ] {
            for (name, encode) in encodings() {
                let mut body = b"q=".to_vec();
                body.extend(encode(&other));
                body.extend(b"&x=1");
                let found = g.check(&body);
                assert!(found.is_err(), "{name}: {other} passed");
                // The same text with the sandbox's own beside it is still refused.
                let mut both = encode(&own());
                both.extend(b" ");
                both.extend(&body);
                assert!(
                    g.check(&both).is_err(),
                    "{name}: {other} passed beside the own"
                );
            }
        }
    }

    #[test]
    fn the_record_names_the_token_escaped() {
        let g = guard();
        let parent = placeholder_value("API_TOKEN", PARENT);
        let Err(Foreign(named)) = g.check(format!("a {parent}\u{1b}[2J").as_bytes()) else {
            panic!("not refused");
        };
        assert_eq!(named, parent);
        let Err(Foreign(named)) = g.check(b"agent-sandbox-placeholder-\\\x1b[1A") else {
            panic!("not refused");
        };
        assert_eq!(named, "agent-sandbox-placeholder-\\\\");
    }

    #[test]
    fn a_sandbox_without_placeholders_refuses_every_token() {
        let g = Guard::new(&[]).unwrap();
        assert!(g.check(own().as_bytes()).is_err());
        assert_eq!(g.check(b"no token here"), Ok(()));
    }

    #[test]
    fn a_stream_decides_each_token_whole_wherever_it_is_cut() {
        let g = guard();
        let parent = placeholder_value("API_TOKEN", PARENT);
        let filler = "f".repeat(1000);
        for text in [
            format!("{filler}x={} y", own()),
            format!("{filler}x={parent} y"),
        ] {
            let refused = text.contains(PARENT);
            for cut in (1..text.len()).step_by(7) {
                let mut s = GuardStream::default();
                let (a, b) = text.as_bytes().split_at(cut);
                let mut out = Vec::new();
                let result = s
                    .push(&g, a)
                    .and_then(|x| {
                        out.extend(x);
                        s.push(&g, b)
                    })
                    .and_then(|x| {
                        out.extend(x);
                        s.finish(&g)
                    });
                match result {
                    Ok(rest) => {
                        out.extend(rest);
                        assert!(!refused, "cut {cut}: passed");
                        assert_eq!(out, text.as_bytes());
                    }
                    Err(_) => {
                        assert!(refused, "cut {cut}: own refused");
                        assert!(
                            !String::from_utf8_lossy(&out).contains("placeholder"),
                            "cut {cut}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_cut_off_at_the_end_is_not_the_own() {
        let g = guard();
        let mut s = GuardStream::default();
        let text = own();
        let sent = s.push(&g, &text.as_bytes()[..text.len() - 3]).unwrap();
        assert!(sent.is_empty());
        assert!(s.finish(&g).is_err());
    }

    #[test]
    fn suffixes_are_new_each_time_and_well_formed() {
        let a = suffix().unwrap();
        let b = suffix().unwrap();
        assert_ne!(a, b);
        assert!(agent_sandbox_policy::network::placeholder_for(
            "T",
            &placeholder_value("T", &a)
        ));
    }
}
