//! Shell scripts in named sections, so that one container run can try several things and a
//! test can assert on each part's output, and a collector of failed checks, so that one run
//! reports every check that failed rather than the first.

use std::collections::HashMap;

use anyhow::ensure;

use crate::harness::Output;

/// One shell script running each `(name, command)` in turn, each after a `=== NAME ===`
/// line and followed by `[exit STATUS]`; read the parts back with [`sections`].
pub fn sectioned(cases: &[(&str, String)]) -> String {
    cases
        .iter()
        // A newline after the command, not `;`: a command may end in a here-document.
        .map(|(name, cmd)| format!("echo '=== {name} ==='\n{cmd}\necho \"[exit $?]\""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The output of each section of a [`sectioned`] script, by name.
pub fn sections(out: &Output) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut current: Option<String> = None;
    for line in out.stdout.lines() {
        if let Some(name) = line
            .strip_prefix("=== ")
            .and_then(|l| l.strip_suffix(" ==="))
        {
            current = Some(name.to_owned());
            map.insert(name.to_owned(), String::new());
        } else if let Some(name) = &current
            && let Some(text) = map.get_mut(name)
        {
            text.push_str(line);
            text.push('\n');
        }
    }
    map
}

/// Collects failed checks so that one run reports all of them.
#[derive(Debug, Default)]
pub struct Checks(Vec<String>);

impl Checks {
    /// Records `what()` as a failure unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    /// Fails, listing every recorded failure and then `out`, if any check failed.
    pub fn finish(self, context: &str, out: &Output) -> anyhow::Result<()> {
        ensure!(
            self.0.is_empty(),
            "{context}: {} check(s) failed:\n- {}\n{out}",
            self.0.len(),
            self.0.join("\n- ")
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::harness::{DEFAULT_TIMEOUT, run_ok};

    fn sh(script: &str) -> Output {
        run_ok(Command::new("sh").args(["-c", script]), DEFAULT_TIMEOUT).unwrap()
    }

    #[test]
    fn a_sectioned_script_reads_back_by_section() {
        let parts = sections(&sh(&sectioned(&[
            ("a", "echo one".into()),
            ("b", "echo two; false".into()),
        ])));
        assert_eq!(parts["a"], "one\n[exit 0]\n");
        assert_eq!(parts["b"], "two\n[exit 1]\n");
    }

    #[test]
    fn checks_report_every_failure() {
        let out = sh("echo x");
        let mut checks = Checks::default();
        checks.check(true, || "fine".into());
        checks.check(false, || "first".into());
        checks.check(false, || "second".into());
        let err = checks.finish("ctx", &out).unwrap_err().to_string();
        assert!(
            err.starts_with("ctx: 2 check(s) failed:\n- first\n- second\n"),
            "{err}"
        );
        Checks::default().finish("ctx", &out).unwrap();
    }
}
