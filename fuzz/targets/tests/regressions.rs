//! Replays every saved fuzz input (`fuzz/regressions/<target>/*`, crashes found by
//! `hack/fuzz.sh` and seeds worth keeping) through the function its fuzz target calls.
//! Runs on the stable toolchain, in CI.

use std::path::Path;

use agent_sandbox_fuzz_targets::TARGETS;

#[test]
fn every_saved_input_replays_without_a_failure() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../regressions");
    let mut replayed = 0;
    for (name, target) in TARGETS {
        let dir = root.join(name);
        anyhow::ensure!(
            dir.is_dir(),
            "{} is missing: every target keeps its regression inputs there",
            dir.display()
        );
        let mut files: Vec<_> = std::fs::read_dir(&dir)?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file)?;
            eprintln!("replaying {}", file.display());
            target(&data);
            replayed += 1;
        }
    }
    anyhow::ensure!(
        replayed > 0,
        "no regression input found under {}",
        root.display()
    );
    Ok(())
}
