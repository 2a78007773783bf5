//! Kubernetes manifests for the CRI suite: the `SandboxTemplate` that docs/kubernetes.md shows
//! (kept in `e2e/k8s/` and included in the doc verbatim, checked by a test) and a reader for
//! the block-style YAML those manifests are written in.
//!
//! The reader knows the subset manifests use: block mappings and sequences by indentation,
//! `#` comments, plain and double-quoted scalars and JSON-style flow sequences
//! (`["sleep", "3600"]`). Every scalar is a string. Anything else is an error naming the line,
//! so a manifest edited past the subset fails the test instead of being misread.

use std::path::PathBuf;

use anyhow::{Context, bail, ensure};
use serde_json::{Map, Value};

use crate::net::repo_root;

/// The SandboxTemplate docs/kubernetes.md shows, relative to the repository root.
pub const SANDBOX_TEMPLATE: &str = "e2e/k8s/sandbox-template.yaml";

/// The path of [`SANDBOX_TEMPLATE`].
pub fn sandbox_template_path() -> PathBuf {
    repo_root().join(SANDBOX_TEMPLATE)
}

/// What the CRI suite takes from a `SandboxTemplate`'s `spec.podTemplate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTemplate {
    pub annotations: Vec<(String, String)>,
    pub runtime_class_name: String,
    /// `(name, image, command)` of each container.
    pub containers: Vec<(String, String, Vec<String>)>,
}

/// Reads `spec.podTemplate` of a `SandboxTemplate` manifest.
pub fn pod_template(text: &str) -> anyhow::Result<PodTemplate> {
    let doc = parse(text)?;
    ensure!(
        doc["kind"] == "SandboxTemplate",
        "not a SandboxTemplate: kind {}",
        doc["kind"]
    );
    let template = &doc["spec"]["podTemplate"];
    let annotations = template["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let spec = &template["spec"];
    let runtime_class_name = spec["runtimeClassName"]
        .as_str()
        .context("spec.podTemplate.spec.runtimeClassName")?
        .to_owned();
    let containers = spec["containers"]
        .as_array()
        .context("spec.podTemplate.spec.containers")?
        .iter()
        .map(|c| {
            let field = |k: &str| {
                c[k].as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("container {k}"))
            };
            let command = c["command"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            Ok((field("name")?, field("image")?, command))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(PodTemplate {
        annotations,
        runtime_class_name,
        containers,
    })
}

/// Parses the YAML subset of the module docs into JSON values (scalars as strings).
pub fn parse(text: &str) -> anyhow::Result<Value> {
    let mut lines = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        if line.trim().is_empty() {
            continue;
        }
        ensure!(!line.contains('\t'), "line {}: a tab", n + 1);
        let indent = line.len() - line.trim_start().len();
        lines.push(Line {
            n: n + 1,
            indent,
            text: line.trim().to_owned(),
        });
    }
    let mut i = 0;
    let value = match lines.first() {
        Some(first) => {
            let indent = first.indent;
            block(&mut lines, &mut i, indent)?
        }
        None => Value::Null,
    };
    if let Some(extra) = lines.get(i) {
        bail!("line {}: unexpected indentation", extra.n);
    }
    Ok(value)
}

struct Line {
    n: usize,
    indent: usize,
    text: String,
}

/// `raw` without a `#` comment that is outside double quotes and starts the line or follows
/// a space.
fn strip_comment(raw: &str) -> &str {
    let mut quoted = false;
    let mut prev = ' ';
    for (at, c) in raw.char_indices() {
        match c {
            '"' if prev != '\\' => quoted = !quoted,
            '#' if !quoted && prev.is_whitespace() => return &raw[..at],
            _ => {}
        }
        prev = c;
    }
    raw
}

fn block(lines: &mut [Line], i: &mut usize, indent: usize) -> anyhow::Result<Value> {
    if lines[*i].text == "-" || lines[*i].text.starts_with("- ") {
        sequence(lines, i, indent)
    } else {
        mapping(lines, i, indent)
    }
}

fn mapping(lines: &mut [Line], i: &mut usize, indent: usize) -> anyhow::Result<Value> {
    let mut map = Map::new();
    while let Some(line) = lines.get(*i) {
        if line.indent < indent {
            break;
        }
        ensure!(
            line.indent == indent && !line.text.starts_with('-'),
            "line {}: unexpected indentation",
            line.n
        );
        let (key, rest) = match line.text.split_once(": ") {
            Some((k, v)) => (k, v.trim()),
            None => (
                line.text
                    .strip_suffix(':')
                    .with_context(|| format!("line {}: not `key: value`", line.n))?,
                "",
            ),
        };
        let key = scalar(key, line.n)?
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("line {}: a key must be a string", line.n))?;
        let value = if rest.is_empty() {
            *i += 1;
            match lines.get(*i) {
                Some(next) if next.indent > indent => {
                    let inner = next.indent;
                    block(lines, i, inner)?
                }
                _ => Value::Null,
            }
        } else {
            let v = scalar(rest, line.n)?;
            *i += 1;
            v
        };
        ensure!(
            map.insert(key.clone(), value).is_none(),
            "duplicate key {key}"
        );
    }
    Ok(Value::Object(map))
}

fn sequence(lines: &mut [Line], i: &mut usize, indent: usize) -> anyhow::Result<Value> {
    let mut items = Vec::new();
    while let Some(line) = lines.get_mut(*i) {
        if line.indent < indent {
            break;
        }
        ensure!(
            line.indent == indent && (line.text == "-" || line.text.starts_with("- ")),
            "line {}: unexpected indentation",
            line.n
        );
        let rest = line.text[1..].trim_start().to_owned();
        if rest.is_empty() {
            *i += 1;
            match lines.get(*i) {
                Some(next) if next.indent > indent => {
                    let inner = next.indent;
                    items.push(block(lines, i, inner)?);
                }
                _ => items.push(Value::Null),
            }
            continue;
        }
        // `- key: value` opens a mapping whose other keys line up with `key`.
        let offset = line.text.len() - rest.len();
        let looks_like_map = rest.ends_with(':') || rest.contains(": ");
        if looks_like_map && !rest.starts_with('"') && !rest.starts_with('[') {
            line.indent += offset;
            line.text = rest;
            let inner = line.indent;
            items.push(mapping(lines, i, inner)?);
        } else {
            items.push(scalar(&rest, line.n)?);
            *i += 1;
        }
    }
    Ok(Value::Array(items))
}

fn scalar(text: &str, n: usize) -> anyhow::Result<Value> {
    if text.starts_with('"') || text.starts_with('[') {
        let v: Value = serde_json::from_str(text)
            .with_context(|| format!("line {n}: not a JSON-style scalar or flow sequence"))?;
        ensure!(
            v.as_array()
                .is_none_or(|items| items.iter().all(Value::is_string)),
            "line {n}: a flow sequence holds only quoted strings"
        );
        return Ok(v);
    }
    ensure!(
        !text.starts_with(['{', '\'', '&', '*', '!', '|', '>']),
        "line {n}: `{text}` is outside the YAML subset this reader knows"
    );
    Ok(Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_block_mappings_sequences_and_flow_lists() {
        let doc = parse(
            "a: 1 # one\nb:\n  c: \"x # not a comment\"\n  d:\n    - name: e\n      args: [\"-c\", \"f\"]\n    - g\n",
        )
        .unwrap();
        assert_eq!(doc["a"], "1");
        assert_eq!(doc["b"]["c"], "x # not a comment");
        assert_eq!(doc["b"]["d"][0]["name"], "e");
        assert_eq!(doc["b"]["d"][0]["args"][1], "f");
        assert_eq!(doc["b"]["d"][1], "g");
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert!(parse("a: {b: c}\n").is_err());
        assert!(parse("a: 'x'\n").is_err());
        assert!(parse("a:\n  b: 1\n c: 2\n").is_err());
        assert!(parse("a: 1\na: 2\n").is_err());
        assert!(parse("a: [1, 2]\n").is_err());
    }

    #[test]
    fn docs_kubernetes_md_shows_the_sandbox_template_verbatim() {
        let file = std::fs::read_to_string(sandbox_template_path()).unwrap();
        let doc = std::fs::read_to_string(repo_root().join("docs/kubernetes.md")).unwrap();
        let marker = format!("<!-- {SANDBOX_TEMPLATE} ");
        let after = &doc[doc.find(&marker).expect("the marker in docs/kubernetes.md")..];
        let start = after.find("```yaml\n").unwrap() + "```yaml\n".len();
        let len = after[start..].find("```").unwrap();
        assert_eq!(
            &after[start..start + len],
            file,
            "docs/kubernetes.md and {SANDBOX_TEMPLATE} differ: copy the file into the doc"
        );
    }

    #[test]
    fn the_sandbox_template_names_the_runtime_class_and_the_profile() {
        let text = std::fs::read_to_string(sandbox_template_path()).unwrap();
        let t = pod_template(&text).unwrap();
        assert_eq!(t.runtime_class_name, "agent-sandbox");
        assert!(
            t.annotations
                .iter()
                .any(|(k, v)| k == "io.agent.sandbox.profile" && !v.is_empty()),
            "{t:?}"
        );
        assert_eq!(t.containers.len(), 1);
    }
}
