//! Making what a sandbox produced safe to print on a terminal.
//!
//! File names, process names, paths and arguments come from the agent. Printed as they are,
//! a name holding `ESC [ 1 A ESC [ 2 K` moves the cursor up and erases the line before it,
//! so a reviewer never sees that line. Every human view (`diff`, `audit`, `export`, `layers`,
//! `promote`) passes such text through [`escape`]; JSON output stays exact (see
//! [`json_for_terminal`]).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// Whether `c` must not reach a terminal as it is: C0 controls, DEL, C1 controls (U+0080 to
/// U+009F, which some terminals read as ESC sequences) and the invisible format characters
/// that reorder or hide text (bidirectional overrides and isolates, zero-width characters,
/// line and paragraph separators, the byte order mark).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

fn push_escaped(out: &mut String, c: char) {
    let n = u32::from(c);
    if n < 0x80 {
        let _ = write!(out, "\\x{n:02x}");
    } else {
        let _ = write!(out, "\\u{{{n:04x}}}");
    }
}

/// `s` with every [`is_unsafe_char`] written as `\xNN` (below U+0080) or `\u{NNNN}`, and a
/// backslash written as `\\`, so the printed text is unambiguous: a name that holds the
/// four characters `\x1b` prints as `\\x1b`, one that holds ESC prints as `\x1b`. Text with
/// nothing to escape is returned as it is.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || is_unsafe_char(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if is_unsafe_char(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Like [`escape`] for bytes that need not be UTF-8 (a Linux file name): each byte that is
/// not part of valid UTF-8 is written as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escape(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// [`escape_bytes`] of a path's bytes.
pub fn escape_path(path: &Path) -> String {
    escape_bytes(path.as_os_str().as_bytes())
}

/// JSON text (as `serde_json` writes it) made safe for a terminal without changing what it
/// says: `serde_json` already writes C0 controls as `\u00NN`, but leaves DEL, C1 controls and
/// format characters raw. Those can only occur inside strings, where `\uNNNN` denotes the
/// same character, so the parsed value is exactly the same.
pub fn json_for_terminal(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe_char_in_json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_unsafe_char_in_json(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Unsafe characters other than the whitespace JSON itself uses between tokens.
fn is_unsafe_char_in_json(c: char) -> bool {
    is_unsafe_char(c) && !matches!(c, '\n' | '\r' | '\t')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_movement_and_line_erase_are_escaped() {
        let name = "notes.txt\x1b[1A\x1b[2K\rREADME.md";
        assert_eq!(escape(name), "notes.txt\\x1b[1A\\x1b[2K\\x0dREADME.md");
        assert_eq!(escape("a\nb\tc\x7f"), "a\\x0ab\\x09c\\x7f");
    }

    #[test]
    fn c1_controls_and_bidi_overrides_are_escaped() {
        assert_eq!(escape("x\u{9b}2Ky"), "x\\u{009b}2Ky");
        assert_eq!(escape("evil\u{202e}txt.sh"), "evil\\u{202e}txt.sh");
        assert_eq!(escape("a\u{200b}b\u{feff}"), "a\\u{200b}b\\u{feff}");
    }

    #[test]
    fn printable_text_is_borrowed_and_unchanged() {
        for s in ["src/main.rs", "naïve café — ü", "日本語.txt", "a b"] {
            assert!(matches!(escape(s), Cow::Borrowed(t) if t == s), "{s}");
        }
    }

    #[test]
    fn backslashes_keep_the_output_unambiguous() {
        assert_eq!(escape("a\\x1b"), "a\\\\x1b");
        assert_ne!(escape("a\\x1b"), escape("a\x1b"));
    }

    #[test]
    fn invalid_utf8_bytes_are_escaped_one_by_one() {
        assert_eq!(escape_bytes(b"ok\xff\xfe\x1b."), "ok\\xff\\xfe\\x1b.");
        assert_eq!(
            escape_path(Path::new(std::ffi::OsStr::from_bytes(b"d/\x80x"))),
            "d/\\x80x"
        );
    }

    #[test]
    fn json_stays_exact_after_terminal_escaping() -> Result<(), serde_json::Error> {
        let value = serde_json::json!({
            "Name": "x\u{9b}[2K\u{7f}\u{202e}\u{1b}y\u{1F600}",
            "list": ["\u{2028}", "plain"],
        });
        let pretty = serde_json::to_string_pretty(&value)?;
        let safe = json_for_terminal(&pretty);
        assert!(!safe.chars().any(is_unsafe_char_in_json), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe)?;
        assert_eq!(back, value);
        let plain = serde_json::to_string(&serde_json::json!({"a": "b"}))?;
        assert!(matches!(json_for_terminal(&plain), Cow::Borrowed(_)));
        Ok(())
    }
}
