//! The top-level modules of `runtime/src` (its folders and single-file modules) should import
//! one way: a base that knows nothing of what is built on it. Today some import each other;
//! [`KNOWN`] lists every import that closes a cycle, so that a new one fails here and the list
//! can only shrink (remove an entry when its cycle is gone: the test asks for it). The map of
//! the code (ARCHITECTURE.md) and of the docs (README.md) must name every module and page.
#![allow(clippy::too_many_lines)] // a test may be a long scenario
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failure is a panic

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(from, to)`: `from` uses `crate::to`, and `to` reaches `from` back.
const KNOWN: &[(&str, &str)] = &[
    ("create", "enforce"),
    ("create", "harden"),
    ("create", "host"),
    ("create", "lifecycle"),
    ("create", "pod"),
    ("create", "report"),
    ("create", "sidecars"),
    ("create", "state"),
    ("enforce", "harden"),
    ("enforce", "host"),
    ("enforce", "report"),
    ("enforce", "sidecars"),
    ("enforce", "state"),
    ("harden", "enforce"),
    ("harden", "host"),
    ("harden", "state"),
    ("host", "enforce"),
    ("host", "harden"),
    ("host", "report"),
    ("host", "state"),
    ("lifecycle", "create"),
    ("lifecycle", "enforce"),
    ("lifecycle", "harden"),
    ("lifecycle", "host"),
    ("lifecycle", "pod"),
    ("lifecycle", "report"),
    ("lifecycle", "sidecars"),
    ("lifecycle", "state"),
    ("pod", "enforce"),
    ("pod", "harden"),
    ("pod", "host"),
    ("pod", "state"),
    ("report", "enforce"),
    ("report", "harden"),
    ("report", "host"),
    ("report", "lifecycle"),
    ("report", "pod"),
    ("report", "sidecars"),
    ("report", "state"),
    ("sidecars", "host"),
    ("sidecars", "pod"),
    ("sidecars", "state"),
    ("state", "harden"),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The modules `text` names as `crate::NAME`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter(|(at, _)| {
            // Not the tail of a longer identifier such as `other_crate::`.
            !text[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, m)| {
            text[at + m.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name != "lib" && name != "main" {
            modules.insert(name, path);
        }
    }
    let mut graph = BTreeMap::new();
    for (name, path) in &modules {
        let mut files = Vec::new();
        rust_files(path, &mut files);
        let mut uses = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            uses.extend(
                crate_paths(&text)
                    .into_iter()
                    .filter(|m| m != name && modules.contains_key(m)),
            );
        }
        graph.insert(name.clone(), uses);
    }
    graph
}

fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::from([from.to_owned()]);
    let mut todo = vec![from.to_owned()];
    while let Some(at) = todo.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn no_new_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    assert!(
        graph.len() > 5,
        "found the modules of runtime/src: {graph:?}"
    );
    let on_cycles: BTreeSet<(String, String)> = graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from.clone(), to.clone())))
        .filter(|(from, to)| reaches(&graph, to, from))
        .collect();
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    let new: Vec<_> = on_cycles.difference(&known).collect();
    assert!(
        new.is_empty(),
        "these imports close a cycle between modules of runtime/src: {new:?}; import the other \
         way (move the shared part into the lower module) instead"
    );
    let gone: Vec<_> = known.difference(&on_cycles).collect();
    assert!(
        gone.is_empty(),
        "these cycles are gone: remove them from KNOWN in runtime/tests/layering.rs: {gone:?}"
    );
}

#[test]
fn crate_paths_reads_only_whole_crate_prefixes() {
    let text = "use crate::state::x; let y = other_crate::z; crate::report::audit(); crate::";
    assert_eq!(
        crate_paths(text),
        BTreeSet::from(["report".to_owned(), "state".to_owned()])
    );
}

/// A newcomer finds every module of `runtime/src` in ARCHITECTURE.md's code map.
#[test]
fn the_code_map_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let missing: Vec<String> = module_graph()
        .into_keys()
        .filter(|name| {
            !map.contains(&format!("`runtime/src/{name}`"))
                && !map.contains(&format!("`runtime/src/{name}.rs`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map has no row for runtime/src/{missing:?}"
    );
}

/// Every page under docs/ is linked from the README's index.
#[test]
fn the_readme_links_every_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && !readme.contains(&format!("(docs/{name})")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's index does not link docs/{missing:?}"
    );
}
