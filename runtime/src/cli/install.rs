//! `install containerd` and `install docker` (`crate::install`).

use super::{CliError, InstallTarget};

/// Prints the engine's entry, or merges it into its configuration with `--write`.
pub(super) fn install(target: InstallTarget) -> Result<(), CliError> {
    match target {
        InstallTarget::Containerd { write, config } => {
            if !write {
                print!(
                    "{}",
                    crate::install::containerd::stanza(crate::install::containerd::version_of(
                        &config
                    )?)
                );
            } else if crate::install::containerd::write(&config)? {
                println!(
                    "merged the agent-sandbox runtime into {}; restart containerd",
                    config.display()
                );
            } else {
                println!("{} already has the agent-sandbox runtime", config.display());
            }
        }
        InstallTarget::Docker(args) => crate::install::docker::run(&args)?,
    }
    Ok(())
}
