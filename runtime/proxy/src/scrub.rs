//! Keeping an injected credential out of what the sandbox receives: the secret, and the forms a
//! server commonly echoes it in, are searched for in responses from a credential-bound host and
//! replaced with the placeholder text before the bytes reach the sandbox.
//!
//! The forms searched for ([`Scrubber::new`]): the secret as it is; percent-encoded (only the
//! bytes URL encoders escape, and every byte), upper- and lower-case hex digits; JSON string
//! escapes (`\/`, `\"`, `\\`, `\uXXXX` for non-ASCII or Go's `<`, `>`, `&`, and every
//! character as `\uXXXX`); HTML entities; hex; base64 (standard and URL-safe alphabets, with and
//! without padding), and the part of base64 that only depends on the secret when it was encoded
//! inside a longer text, at each of the three positions a 3-byte group can start, also
//! percent-encoded; and for a `Basic` rule, the decoded
//! `user:password` and the password alone. Each is replaced with the same form of the
//! placeholder, so a tool that decodes what it got sees the placeholder. An encoded form
//! shorter than [`MIN_NEEDLE`] bytes is not searched for (it would match ordinary text); the
//! secret itself always is.
//!
//! What this cannot see: a secret the server transformed otherwise (hashed, reversed, split
//! over several responses, compressed, encrypted). `docs/egress.md` says so.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// Shortest encoded form searched for.
pub(crate) const MIN_NEEDLE: usize = 6;

/// What a secret is replaced with when its credential has no placeholder.
const REDACTED: &str = "agent-sandbox-redacted";

/// Finds one credential's secret (in its encodings) and replaces it.
pub(crate) struct Scrubber {
    finder: AhoCorasick,
    /// Per needle, in the finder's pattern order: what replaces it.
    with: Vec<Vec<u8>>,
    /// The longest needle: how much of a stream must be held back between reads.
    longest: usize,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the needles: they are the secret.
        f.debug_struct("Scrubber")
            .field("needles", &self.with.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    /// A scrubber for `secret` (sent after `prefix`), replacing it with `placeholder` (or a
    /// fixed marker). `None` only if the search automaton cannot be built.
    pub(crate) fn new(secret: &str, prefix: &str, placeholder: Option<&str>) -> Option<Self> {
        let secret = secret.as_bytes();
        let replacement = [placeholder.unwrap_or(REDACTED), REDACTED, "[redacted]", "#"]
            .into_iter()
            .map(str::as_bytes)
            .find(|r| !contains(r, secret))
            .unwrap_or(b"#");
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        forms(secret, replacement, &mut pairs);
        if prefix.trim().eq_ignore_ascii_case("basic")
            && let Some(decoded) = base64_decode(secret)
        {
            let user = decoded.iter().position(|&b| b == b':');
            if let Some(colon) = user {
                let mut with = decoded.get(..=colon).unwrap_or_default().to_vec();
                with.extend_from_slice(replacement);
                pairs.push((decoded.clone(), with));
                if let Some(password) = decoded.get(colon + 1..) {
                    forms(password, replacement, &mut pairs);
                }
            }
        }
        let mut needles: Vec<Vec<u8>> = Vec::new();
        let mut with = Vec::new();
        for (needle, replace) in pairs {
            let wanted = needle.as_slice() == secret || needle.len() >= MIN_NEEDLE;
            if wanted && !needle.is_empty() && !needles.contains(&needle) {
                needles.push(needle);
                with.push(replace);
            }
        }
        let longest = needles.iter().map(Vec::len).max().unwrap_or(1);
        let finder = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&needles)
            .ok()?;
        Some(Self {
            finder,
            with,
            longest,
        })
    }

    /// Bytes a stream holds back so that a needle split across two reads is still found.
    pub(crate) fn hold_back(&self) -> usize {
        self.longest.saturating_sub(1)
    }

    /// `data` with every needle replaced.
    pub(crate) fn scrub(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let end = self.replace_before(data, data.len(), &mut out);
        out.extend_from_slice(data.get(end..).unwrap_or_default());
        out
    }

    /// Copies `data` into `out` with the needles that start before `safe` replaced; returns
    /// where it stopped (at least `safe`, or the end of the last replaced needle past it).
    fn replace_before(&self, data: &[u8], safe: usize, out: &mut Vec<u8>) -> usize {
        let mut at = 0;
        for m in self.finder.find_iter(data) {
            if m.start() >= safe {
                break;
            }
            out.extend_from_slice(data.get(at..m.start()).unwrap_or_default());
            out.extend_from_slice(
                self.with
                    .get(m.pattern().as_usize())
                    .map_or(&b""[..], Vec::as_slice),
            );
            at = m.end();
        }
        let stop = at.max(safe);
        out.extend_from_slice(data.get(at..stop).unwrap_or_default());
        stop
    }
}

/// A stream being scrubbed: what was held back from the last piece.
#[derive(Debug, Default)]
pub(crate) struct ScrubStream {
    tail: Vec<u8>,
}

impl ScrubStream {
    /// Scrubs the next piece of the stream into `out`, holding back its last bytes (which
    /// could begin a needle that the next piece completes).
    pub(crate) fn push(&mut self, s: &Scrubber, data: &[u8], out: &mut Vec<u8>) {
        self.tail.extend_from_slice(data);
        let safe = self.tail.len().saturating_sub(s.hold_back());
        let stop = s.replace_before(&self.tail, safe, out);
        self.tail.drain(..stop.min(self.tail.len()));
    }

    /// Scrubs what was held back: the stream has ended.
    pub(crate) fn finish(&mut self, s: &Scrubber, out: &mut Vec<u8>) {
        let rest = std::mem::take(&mut self.tail);
        out.extend_from_slice(&s.scrub(&rest));
    }
}

/// A stream searched for one needle (the placeholder in a request body), forwarded with the
/// bytes that could begin it held back.
#[derive(Debug)]
pub(crate) struct Watch {
    needle: AhoCorasick,
    len: usize,
    tail: Vec<u8>,
}

impl Watch {
    pub(crate) fn new(needle: &str) -> Option<Self> {
        Some(Self {
            needle: AhoCorasick::new([needle]).ok()?,
            len: needle.len(),
            tail: Vec::new(),
        })
    }

    /// Whether `data` holds the needle.
    pub(crate) fn found_in(&self, data: &[u8]) -> bool {
        self.needle.is_match(data)
    }

    /// Adds a piece: the bytes now safe to forward, or `None` once the needle was seen.
    pub(crate) fn push(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        self.tail.extend_from_slice(data);
        if self.needle.is_match(&self.tail) {
            return None;
        }
        let safe = self.tail.len().saturating_sub(self.len.saturating_sub(1));
        Some(self.tail.drain(..safe).collect())
    }

    /// The bytes held back at the end of the stream (they cannot hold the needle).
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.tail)
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Every form of `secret` searched for, each with the same form of `with`: for one `secret`
/// the pairs come in the same order whatever `with` is (`crate::placeholder` relies on it).
pub(crate) fn pairs_of_forms(secret: &[u8], with: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    forms(secret, with, &mut out);
    out
}

/// See [`pairs_of_forms`].
fn forms(secret: &[u8], with: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    out.push((secret.to_vec(), with.to_vec()));
    for upper in [true, false] {
        out.push((percent(secret, upper, false), percent(with, upper, false)));
        out.push((percent(secret, upper, true), percent(with, upper, true)));
        out.push((hex(secret, upper), hex(with, upper)));
        out.push((json_all(secret, upper), json_all(with, upper)));
    }
    if secret.contains(&b' ') {
        // application/x-www-form-urlencoded: a space is `+`, the rest percent-encoded.
        let form: Vec<u8> = secret
            .split(|&b| b == b' ')
            .map(|part| percent(part, true, false))
            .collect::<Vec<_>>()
            .join(&b'+');
        out.push((form, with.to_vec()));
    }
    for slash in [false, true] {
        for ascii in [false, true] {
            for html in [false, true] {
                out.push((
                    json(secret, slash, ascii, html),
                    json(with, slash, ascii, html),
                ));
            }
        }
    }
    for numeric in [false, true] {
        out.push((html_escape(secret, numeric), html_escape(with, numeric)));
    }
    for alphabet in [STANDARD, URL_SAFE] {
        let padded = base64(secret, alphabet, true);
        out.push((padded.clone(), base64(with, alphabet, true)));
        out.push((
            base64(secret, alphabet, false),
            base64(with, alphabet, false),
        ));
        for align in 0..3 {
            out.push((
                base64_core(secret, alphabet, align),
                base64_core(with, alphabet, align),
            ));
        }
    }
    // Base64 carried in a URL or form: its `+`, `/` and `=` percent-encoded.
    let encoded: Vec<(Vec<u8>, Vec<u8>)> = out
        .iter()
        .filter(|(needle, _)| needle.iter().any(|b| b"+/=".contains(b)))
        .map(|(needle, with)| (percent(needle, true, false), percent(with, true, false)))
        .collect();
    out.extend(encoded);
}

/// Percent-encoding: the bytes outside RFC 3986's unreserved set, or (`all`) every byte.
fn percent(data: &[u8], upper: bool, all: bool) -> Vec<u8> {
    let digits: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut out = Vec::with_capacity(data.len() * 3);
    for &b in data {
        if !all && (b.is_ascii_alphanumeric() || b"-._~".contains(&b)) {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(digits[usize::from(b >> 4)]);
            out.push(digits[usize::from(b & 15)]);
        }
    }
    out
}

fn hex(data: &[u8], upper: bool) -> Vec<u8> {
    percent(data, upper, true)
        .into_iter()
        .filter(|&b| b != b'%')
        .collect()
}

/// A JSON string's content: `"` and `\` escaped, `/` as `\/` (`slash`), non-ASCII as
/// `\uXXXX` UTF-16 units (`ascii`, as Python's `json.dumps` does by default), `<`, `>`, `&`
/// as `\u003c`, `\u003e`, `\u0026` (`html`, as Go's `encoding/json` does by default).
fn json(data: &[u8], slash: bool, ascii: bool, html: bool) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(data) else {
        return data.to_vec();
    };
    let mut out = String::with_capacity(data.len() + 8);
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            '<' | '>' | '&' if html => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c if ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// HTML text: `&`, `<`, `>`, `"`, `'` as entities (`&#39;` or, `numeric`, every one as `&#N;`).
fn html_escape(data: &[u8], numeric: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 8);
    for &b in data {
        let entity: Option<&[u8]> = match b {
            b'&' => Some(b"&amp;"),
            b'<' => Some(b"&lt;"),
            b'>' => Some(b"&gt;"),
            b'"' => Some(b"&quot;"),
            b'\'' => Some(b"&#39;"),
            _ => None,
        };
        match entity {
            Some(_) if numeric => out.extend_from_slice(format!("&#{b};").as_bytes()),
            Some(e) => out.extend_from_slice(e),
            None => out.push(b),
        }
    }
    out
}

/// Every character as a `\uXXXX` escape.
fn json_all(data: &[u8], upper: bool) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(data) else {
        return data.to_vec();
    };
    let mut out = String::with_capacity(data.len() * 6);
    for c in text.chars() {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            if upper {
                out.push_str(&format!("\\u{u:04X}"));
            } else {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out.into_bytes()
}

pub(crate) const STANDARD: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
pub(crate) const URL_SAFE: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

pub(crate) fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for group in data.chunks(3) {
        let b = [
            group.first().copied().unwrap_or(0),
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = group.len() + 1;
        for i in 0..4 {
            if i < chars {
                let index = (n >> (18 - 6 * i)) & 63;
                out.push(alphabet[usize::try_from(index).unwrap_or(0)]);
            } else if pad {
                out.push(b'=');
            }
        }
    }
    out
}

/// The base64 characters that depend only on `data` when it sits `align` bytes into a
/// 3-byte group of a longer text: the same wherever that text starts or what follows.
fn base64_core(data: &[u8], alphabet: &[u8; 64], align: usize) -> Vec<u8> {
    let mut padded = vec![0u8; align];
    padded.extend_from_slice(data);
    let encoded = base64(&padded, alphabet, false);
    // Character i carries bits 6i..6i+6; the secret's are bits 8*align..8*(align+len).
    let first = (8 * align).div_ceil(6);
    let end = (8 * (align + data.len())) / 6;
    encoded.get(first..end).unwrap_or_default().to_vec()
}

/// Standard or URL-safe base64, padded or not; `None` if `text` is not base64.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for &c in text.iter().take_while(|&&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(u8::try_from((bits >> count) & 0xff).unwrap_or(0));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "tok_9f/Zq+3Kx:Lm7é";
    const PH: &str = "agent-sandbox-placeholder-API_TOKEN-0f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn scrubber() -> Scrubber {
        Scrubber::new(SECRET, "Bearer ", Some(PH)).unwrap()
    }

    fn has(hay: &[u8], needle: &[u8]) -> bool {
        contains(hay, needle)
    }

    #[test]
    fn base64_matches_the_usual_encoders() {
        assert_eq!(
            base64(b"any carnal pleas", STANDARD, true),
            b"YW55IGNhcm5hbCBwbGVhcw=="
        );
        assert_eq!(
            base64(b"any carnal pleas", STANDARD, false),
            b"YW55IGNhcm5hbCBwbGVhcw"
        );
        assert_eq!(base64(b"\xfb\xff", URL_SAFE, true), b"-_8=");
        assert_eq!(base64_decode(b"dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert!(base64_decode(b"not base64!").is_none());
    }

    /// The secret inside a longer text that was base64-encoded as a whole, at every offset
    /// (so at each of the three alignments), in both alphabets, padded or not, is found:
    /// decoding what is left never gives the secret back.
    #[test]
    fn base64_of_a_longer_text_is_caught_at_every_alignment() {
        let s = scrubber();
        for lead in 0..7 {
            for trail in 0..4 {
                let text = format!("{}{SECRET}{}", "L".repeat(lead), "T".repeat(trail));
                for alphabet in [STANDARD, URL_SAFE] {
                    for pad in [true, false] {
                        let encoded = base64(text.as_bytes(), alphabet, pad);
                        let json =
                            format!("{{\"auth\":\"{}\"}}", String::from_utf8_lossy(&encoded));
                        let out = s.scrub(json.as_bytes());
                        assert_ne!(out, json.as_bytes(), "{lead}/{trail}: not found");
                        let inner = out
                            .split(|&b| b == b'"')
                            .nth(3)
                            .unwrap_or_default()
                            .to_vec();
                        let back = base64_decode(&inner).unwrap_or_default();
                        assert!(!has(&back, SECRET.as_bytes()), "{lead}/{trail}");
                    }
                }
            }
        }
        // Alone, it decodes to the placeholder.
        let out = s.scrub(&base64(SECRET.as_bytes(), STANDARD, true));
        assert_eq!(base64_decode(&out).unwrap(), PH.as_bytes());
    }

    #[test]
    fn url_json_and_hex_forms_become_the_placeholder() {
        let s = scrubber();
        for (form, expect) in [
            ("tok_9f%2FZq%2B3Kx%3ALm7%C3%A9".to_owned(), PH.to_owned()),
            ("tok_9f%2fZq%2b3Kx%3aLm7%c3%a9".to_owned(), PH.to_owned()),
            (
                String::from_utf8(percent(SECRET.as_bytes(), true, true)).unwrap(),
                String::from_utf8(percent(PH.as_bytes(), true, true)).unwrap(),
            ),
            ("tok_9f\\/Zq+3Kx:Lm7\\u00e9".to_owned(), PH.to_owned()),
            ("tok_9f/Zq+3Kx:Lm7\\u00e9".to_owned(), PH.to_owned()),
            ("tok_9f\\/Zq+3Kx:Lm7é".to_owned(), PH.to_owned()),
            (
                String::from_utf8(json_all(SECRET.as_bytes(), false)).unwrap(),
                String::from_utf8(json_all(PH.as_bytes(), false)).unwrap(),
            ),
            (
                String::from_utf8(hex(SECRET.as_bytes(), false)).unwrap(),
                String::from_utf8(hex(PH.as_bytes(), false)).unwrap(),
            ),
        ] {
            let out = String::from_utf8(s.scrub(format!("x={form}&y").as_bytes())).unwrap();
            assert_eq!(out, format!("x={expect}&y"), "{form}");
        }
        let spaced = Scrubber::new("a b c d e", "", None).unwrap();
        assert_eq!(
            spaced.scrub(b"q=a+b+c+d+e"),
            format!("q={REDACTED}").as_bytes()
        );
    }

    #[test]
    fn html_go_json_and_url_carried_base64_forms_are_caught() {
        let secret = "k&y<1>\"q'Zx+/9w";
        let s = Scrubber::new(secret, "", Some(PH)).unwrap();
        for form in [
            "k&amp;y&lt;1&gt;&quot;q&#39;Zx+/9w".to_owned(),
            "k&#38;y&#60;1&#62;&#34;q&#39;Zx+/9w".to_owned(),
            "k\\u0026y\\u003c1\\u003e\\\"q'Zx+/9w".to_owned(),
            String::from_utf8(percent(
                &base64(secret.as_bytes(), STANDARD, true),
                true,
                false,
            ))
            .unwrap(),
            String::from_utf8(percent(
                &base64_core(secret.as_bytes(), STANDARD, 2),
                false,
                false,
            ))
            .unwrap(),
        ] {
            let out = s.scrub(format!("<p>{form}</p>").as_bytes());
            assert_ne!(out, format!("<p>{form}</p>").as_bytes(), "{form}");
        }
    }

    #[test]
    fn a_basic_credential_is_caught_decoded_too() {
        let encoded = String::from_utf8(base64(b"ci-bot:hunter2-long", STANDARD, true)).unwrap();
        let s = Scrubber::new(&encoded, "Basic ", Some(PH)).unwrap();
        let out = s.scrub(b"{\"user\":\"ci-bot:hunter2-long\",\"pw\":\"hunter2-long\"}");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{{\"user\":\"ci-bot:{PH}\",\"pw\":\"{PH}\"}}")
        );
    }

    #[test]
    fn short_secrets_are_still_replaced_but_their_short_encodings_are_not_searched() {
        let s = Scrubber::new("abc", "", Some(PH)).unwrap();
        assert_eq!(s.scrub(b"xabcx YWJj"), format!("x{PH}x YWJj").as_bytes());
        // A placeholder that holds the secret is never its replacement.
        let s = Scrubber::new("sandbox", "", Some(PH)).unwrap();
        assert!(!has(&s.scrub(b"my sandbox"), b"sandbox"));
    }

    fn stream(s: &Scrubber, data: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut st = ScrubStream::default();
        let mut at = 0;
        for &c in cuts {
            let c = c.min(data.len()).max(at);
            st.push(s, &data[at..c], &mut out);
            at = c;
        }
        st.push(s, &data[at..], &mut out);
        st.finish(s, &mut out);
        out
    }

    #[test]
    fn a_needle_split_across_reads_is_found() {
        let s = scrubber();
        let data = format!(
            "aaaa{SECRET}bbbb{}cc",
            String::from_utf8(base64(SECRET.as_bytes(), URL_SAFE, false)).unwrap()
        );
        for cut in 0..data.len() {
            assert_eq!(
                stream(&s, data.as_bytes(), &[cut]),
                s.scrub(data.as_bytes()),
                "cut at {cut}"
            );
        }
        assert_eq!(
            stream(&s, data.as_bytes(), &(0..data.len()).collect::<Vec<_>>()),
            s.scrub(data.as_bytes())
        );
    }

    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(SECRET.as_bytes().to_vec()),
            Just(base64(SECRET.as_bytes(), STANDARD, true)),
            Just(percent(SECRET.as_bytes(), false, false)),
            Just(json(SECRET.as_bytes(), true, true, false)),
            Just(PH.as_bytes().to_vec()),
            Just(SECRET.as_bytes()[..5].to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
            "[A-Za-z0-9+/=]{0,30}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        /// Whatever surrounds them and however a stream is cut, the secret and its whole
        /// encodings never come out, and streaming agrees with scrubbing the whole.
        #[test]
        fn nothing_of_the_secret_comes_out(
            pieces in proptest::collection::vec(piece(), 0..12),
            cuts in proptest::collection::vec(0usize..600, 0..6),
        ) {
            let s = scrubber();
            let data: Vec<u8> = pieces.concat();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let whole = s.scrub(&data);
            prop_assert_eq!(&stream(&s, &data, &cuts), &whole);
            for needle in [
                SECRET.as_bytes().to_vec(),
                base64(SECRET.as_bytes(), STANDARD, false),
                percent(SECRET.as_bytes(), false, false),
                json(SECRET.as_bytes(), true, true, false),
            ] {
                prop_assert!(!has(&whole, &needle));
            }
        }

        /// Random secrets: the raw secret and its base64 at any alignment never survive.
        #[test]
        fn random_secrets_do_not_survive(
            secret in "[A-Za-z0-9_./+-]{8,40}",
            lead in "[ -~]{0,5}",
            trail in "[ -~]{0,5}",
        ) {
            let s = Scrubber::new(&secret, "Bearer ", Some(PH)).unwrap();
            let text = format!("{lead}{secret}{trail}");
            let out = s.scrub(text.as_bytes());
            prop_assert!(!has(&out, secret.as_bytes()));
            let encoded = base64(text.as_bytes(), STANDARD, true);
            let back = base64_decode(&s.scrub(&encoded)).unwrap_or_default();
            prop_assert!(!has(&back, secret.as_bytes()));
        }
    }
}
