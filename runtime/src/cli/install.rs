//! `install containerd` and `install docker` (`crate::install`).

use super::{CliError, InstallTarget};

/// Prints the engine's entry, or merges it into its configuration with `--write`.
pub(super) fn install(target: InstallTarget) -> Result<(), CliError> {
    match target {
        InstallTarget::Containerd { write, config } => {
            use crate::install::containerd as ctd;
            let fresh = ctd::default_for(ctd::Containerd::installed().as_ref());
            if !write {
                let choice = ctd::version_of(&config, &fresh)?;
                print!("# {choice}\n{}", ctd::stanza(choice.version));
            } else {
                let (changed, choice) = ctd::write(&config, &fresh)?;
                if changed {
                    println!(
                        "merged the agent-sandbox runtime into {} ({choice}); restart containerd",
                        config.display()
                    );
                } else {
                    println!(
                        "{} already has the agent-sandbox runtime ({choice})",
                        config.display()
                    );
                }
            }
        }
        InstallTarget::Docker(args) => crate::install::docker::run(&args)?,
    }
    Ok(())
}
