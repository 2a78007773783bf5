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

/// Whether `c` must not reach a terminal as it is, or would read as something it is not:
/// every character of the Unicode general categories Cc (C0 and C1 controls, DEL: some
/// terminals read C1 as ESC sequences), Cf (format: bidirectional overrides and isolates,
/// zero-width characters, the soft hyphen, the byte order mark, tag characters
/// U+E0000-E007F that spell hidden text), Co (private use), Cs (surrogates), Cn (unassigned:
/// a later Unicode may make them anything), Zl and Zp (line and paragraph separators); every
/// space other than U+0020 (Zs: it reads as a plain space); every Default_Ignorable_Code_Point
/// (the Hangul fillers U+115F, U+1160, U+3164, U+FFA0, variation selectors, the combining
/// grapheme joiner: drawn as nothing); and the Braille blank U+2800, drawn as a space.
/// From the Unicode data of `icu_properties`, not a hand-kept list.
pub fn is_unsafe_char(c: char) -> bool {
    use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory as Gc};
    use icu_properties::{CodePointMapData, CodePointSetData};
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    let unsafe_category = matches!(
        CodePointMapData::<Gc>::new().get(c),
        Gc::Control
            | Gc::Format
            | Gc::PrivateUse
            | Gc::Surrogate
            | Gc::Unassigned
            | Gc::LineSeparator
            | Gc::ParagraphSeparator
            | Gc::SpaceSeparator
    );
    unsafe_category
        || CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
        || c == '\u{2800}'
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

/// [`escape_bytes`] of one line of a file's text for a patch, keeping TAB as it is: a tab
/// only moves the cursor to the next tab stop on a fresh line (it erases and hides
/// nothing), and indentation stays readable. Everything else [`is_unsafe_char`] names, a
/// backslash and bytes that are not UTF-8 are escaped as [`escape_bytes`] does.
pub fn escape_line(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for (i, part) in bytes.split(|&b| b == b'\t').enumerate() {
        if i > 0 {
            out.push('\t');
        }
        out.push_str(&escape_bytes(part));
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

    /// One character of each class that must be escaped, and where it comes from.
    const UNSAFE: &[(char, &str)] = &[
        ('\u{1b}', "Cc: ESC"),
        ('\u{7f}', "Cc: DEL"),
        ('\u{85}', "Cc: next line (C1)"),
        ('\u{ad}', "Cf: soft hyphen"),
        ('\u{61c}', "Cf: Arabic letter mark"),
        ('\u{200b}', "Cf: zero-width space"),
        ('\u{200d}', "Cf: zero-width joiner"),
        ('\u{202e}', "Cf: right-to-left override"),
        ('\u{2066}', "Cf: left-to-right isolate"),
        ('\u{2069}', "Cf: pop directional isolate"),
        ('\u{feff}', "Cf: byte order mark"),
        ('\u{e0001}', "Cf: language tag"),
        ('\u{e0041}', "Cf: tag latin capital A"),
        ('\u{e007f}', "Cf: cancel tag"),
        ('\u{e000}', "Co: private use"),
        ('\u{f0000}', "Co: supplementary private use A"),
        ('\u{10ffff}', "Cn: noncharacter"),
        ('\u{fdd0}', "Cn: noncharacter"),
        ('\u{e0080}', "Cn: unassigned after the tags"),
        ('\u{2028}', "Zl: line separator"),
        ('\u{2029}', "Zp: paragraph separator"),
        ('\u{a0}', "Zs: no-break space"),
        ('\u{2007}', "Zs: figure space"),
        ('\u{3000}', "Zs: ideographic space"),
        ('\u{115f}', "filler: Hangul choseong filler"),
        ('\u{1160}', "filler: Hangul jungseong filler"),
        ('\u{3164}', "filler: Hangul filler"),
        ('\u{ffa0}', "filler: halfwidth Hangul filler"),
        ('\u{2800}', "blank: Braille pattern blank"),
        ('\u{fe0f}', "default ignorable: variation selector 16"),
        ('\u{e0100}', "default ignorable: variation selector 17"),
        ('\u{34f}', "default ignorable: combining grapheme joiner"),
        ('\u{180e}', "Cf: Mongolian vowel separator"),
    ];

    #[test]
    fn every_invisible_class_is_escaped() {
        for (c, what) in UNSAFE {
            assert!(is_unsafe_char(*c), "{what} U+{:04X}", u32::from(*c));
            let name = format!("calc{c}.py");
            let shown = escape(&name);
            assert_ne!(shown, name, "{what}");
            assert!(
                shown.contains("\\u{") || shown.contains("\\x"),
                "{what}: {shown}"
            );
            assert!(!shown.contains(*c), "{what}");
        }
    }

    #[test]
    fn hidden_tag_text_is_spelled_out() {
        // "calc.py" followed by tag characters spelling "IGNORE": drawn as calc.py.
        let hidden: String = "IGNORE"
            .chars()
            .map(|c| char::from_u32(0xe0000 + u32::from(c)).unwrap_or('?'))
            .collect();
        let name = format!("calc{hidden}.py");
        assert_eq!(
            escape(&name),
            "calc\\u{e0049}\\u{e0047}\\u{e004e}\\u{e004f}\\u{e0052}\\u{e0045}.py"
        );
    }

    #[test]
    fn the_category_data_agrees_with_char_properties() {
        // Every control char std knows is unsafe; every char of the ranges std and Unicode
        // call whitespace, other than the plain space and the ASCII controls, is unsafe too.
        for n in 0..=0x10ffff_u32 {
            let Some(c) = char::from_u32(n) else { continue };
            if c.is_control() {
                assert!(is_unsafe_char(c), "U+{n:04X}");
            }
            if c.is_whitespace() && c != ' ' {
                assert!(is_unsafe_char(c), "U+{n:04X}");
            }
        }
    }

    #[test]
    fn visible_letters_marks_symbols_and_emoji_stay() {
        for c in [
            'a',
            'Z',
            '\u{e9}',
            '\u{301}',
            '\u{65e5}',
            '\u{1f600}',
            '\u{2014}',
            ' ',
            '~',
        ] {
            assert!(!is_unsafe_char(c), "U+{:04X}", u32::from(c));
        }
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
