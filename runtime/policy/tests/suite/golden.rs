//! Golden files: `profiles/generated/*` must equal what the compilers produce now. A hand
//! edit or a compiler change without a refresh fails with a diff and the refresh command.

use std::path::PathBuf;

use agent_sandbox_policy::generated;

const REFRESH: &str = "UPDATE_GOLDEN=1 cargo test -p agent-sandbox-policy --test all golden";

fn generated_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../profiles/generated")
}

#[test]
fn golden_profiles_match_the_compilers() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let dir = generated_dir();
    let mut failures = Vec::new();
    let mut expected_files = Vec::new();
    for name in agent_sandbox_policy::builtin_names() {
        for (file, text) in generated::builtin_artifacts(name).unwrap() {
            let path = dir.join(&file);
            expected_files.push(file.clone());
            if update {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                let diff = similar::TextDiff::from_lines(&committed, &text)
                    .unified_diff()
                    .context_radius(2)
                    .header(
                        &format!("profiles/generated/{file} (committed)"),
                        "generated now",
                    )
                    .to_string();
                failures.push(diff);
            }
        }
    }
    // No stale files either.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !expected_files.contains(&file) {
            if update {
                std::fs::remove_file(dir.join(&file)).unwrap();
            } else {
                failures.push(format!("stale file profiles/generated/{file}\n"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "generated profiles differ from the committed ones:\n{}\nrefresh with: {REFRESH}",
        failures.join("\n")
    );
}
