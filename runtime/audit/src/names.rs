//! File names as a promotion target's filesystem may read them.
//!
//! A Linux directory compares names byte for byte, but the directory a change set is promoted
//! into may not: WSL's `/mnt/c` (NTFS), vfat, ext4 with `casefold`, APFS and HFS+ fold case,
//! HFS+ and APFS also normalise Unicode and HFS+ skips some invisible code points, NTFS drops
//! trailing dots and spaces and reads `name:stream` as a stream of `name`, and vfat and NTFS
//! answer to an 8.3 short name (`GIT~1`) as well as to the long one. On such a target
//! `.GIT/config` *is* `.git/config`. So promotion compares names through [`key`], which
//! collapses every such spelling to one, and refuses short names and `.git` look-alikes
//! outright, as git itself does for the paths it checks out (its `core.protectHFS` and
//! `core.protectNTFS` rules).

use icu_casemap::CaseMapper;
use icu_normalizer::ComposingNormalizer;

/// Code points HFS+ ignores when it compares names (git's protectHFS list): zero-width
/// joiners and non-joiners, directional marks and embeddings, the deprecated format
/// characters, and the byte order mark. `.git\u{200c}` is `.git` there.
pub fn is_hfs_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}'
    )
}

/// `s` as a case-insensitive, normalising filesystem compares it: HFS+-ignorable code points
/// dropped, then NFKC, full Unicode case folding (`ß` is `ss`, `ſ` is `s`, the Kelvin sign
/// is `k`) and NFKC again, so the result is stable under both.
pub fn fold(s: &str) -> String {
    let visible: String = s.chars().filter(|c| !is_hfs_ignorable(*c)).collect();
    let nfkc = ComposingNormalizer::new_nfkc();
    let once = nfkc.normalize(&visible);
    let folded = CaseMapper::new().fold_string(&once);
    nfkc.normalize(&folded).into_owned()
}

/// The one spelling of a path component that every target compares equal: [`fold`], cut at
/// the first `:` (an NTFS stream of the name before it: `.git::$INDEX_ALLOCATION` is the
/// directory `.git`), with trailing dots and spaces dropped (NTFS drops them: `.bashrc. ` is
/// `.bashrc`).
pub fn key(component: &str) -> String {
    let folded = fold(component);
    let named = folded.split(':').next().unwrap_or_default();
    named.trim_end_matches(['.', ' ']).to_owned()
}

/// Whether `component` names git's own directory on some target: `.git` in any case, with
/// HFS-ignorable code points inside, NTFS trailing dots or spaces, or an NTFS stream suffix.
pub fn is_git_dir(component: &str) -> bool {
    key(component) == ".git"
}

/// Whether `component` has the shape of an 8.3 short name (`GIT~1`, `GITMOD~2`,
/// `PRE-CO~1.YAM`): at most six characters, `~`, digits, and an extension of at most three.
/// vfat and NTFS give such a name to every long name that does not fit 8.3, in creation
/// order, so which file it reaches on a target cannot be known beforehand (`git~1` is `.git`
/// on many; git refuses it for that reason).
pub fn is_short_name(component: &str) -> bool {
    let (base, ext) = match component.rsplit_once('.') {
        Some((b, e)) if !b.is_empty() => (b, Some(e)),
        _ => (component, None),
    };
    let Some((stem, digits)) = base.split_once('~') else {
        return false;
    };
    let stem_len = stem.chars().count();
    (1..=6).contains(&stem_len)
        && !stem.contains(['.', '~'])
        && !digits.is_empty()
        && digits.len() <= 7
        && digits.bytes().all(|b| b.is_ascii_digit())
        && ext.is_none_or(|e| e.chars().count() <= 3 && !e.contains('~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_unicode_forms_fold_to_one_key() {
        for (a, b) in [
            (".GIT", ".git"),
            (".Git", ".git"),
            (".ENVRC", ".envrc"),
            ("\u{ff0e}\u{ff47}\u{ff49}\u{ff54}", ".git"), // fullwidth .git
            (".\u{17f}sh", ".ssh"),                       // long s
            (".\u{df}h", ".ssh"),                         // sharp s folds to "ss"
            (".\u{1e9e}h", ".ssh"),                       // capital sharp s
            ("\u{212a}iro", "kiro"),                      // Kelvin sign
            (".claude", ".CLAUDE"),
            ("caf\u{e9}", "cafe\u{301}"),  // precomposed and combining
            (".vs\u{1d9c}ode", ".vscode"), // modifier letter small c (NFKC)
        ] {
            assert_eq!(key(a), key(b), "{a:?} {b:?}");
        }
        assert_ne!(key(".gît"), key(".git"));
        assert_ne!(
            key("\u{131}"),
            key("i"),
            "dotless i stays distinct, as in case folding"
        );
    }

    #[test]
    fn ntfs_streams_and_trailing_dots_and_spaces_are_dropped() {
        for name in [
            ".git.",
            ".git ",
            ".git. . ",
            ".git::$INDEX_ALLOCATION",
            ".GIT:$DATA",
            ".git\u{200c}",
            ".g\u{200d}it",
            "\u{feff}.git",
            ".gi\u{206a}t",
        ] {
            assert!(is_git_dir(name), "{name:?}");
        }
        for name in [".gitx", "git", ".git-foo", "x.git", ".gitmodules", "..git"] {
            assert!(!is_git_dir(name), "{name:?}");
        }
        assert_eq!(key(".bashrc. "), ".bashrc");
        assert_eq!(key(".bashrc:evil"), ".bashrc");
    }

    #[test]
    fn short_names_are_recognised_in_any_case() {
        for name in [
            "git~1",
            "GIT~1",
            "gitmod~1",
            "GI7EBA~1",
            "BASHRC~2",
            "PRE-CO~1.YAM",
            "a~12",
            "vscode~1",
        ] {
            assert!(is_short_name(name), "{name}");
        }
        for name in [
            "main.rs",
            "file~",
            "~1",
            "backup~1~",
            "toolong7~1",
            "a~b",
            "x~1.long",
            "notes.txt~",
            ".git",
        ] {
            assert!(!is_short_name(name), "{name}");
        }
    }
}
