//! `allow` and `deny`: change a running sandbox's egress allowlist for its life
//! (`crate::sidecars::allow`).

use std::path::Path;

use agent_sandbox_proxy::approval::ChangeAction;

use crate::lifecycle::Runtime;

use super::{Cli, CliError};

/// `allow ID RULE`.
pub(super) fn allow(cli: &Cli, id: &str, rule: &str) -> Result<(), CliError> {
    let (root, audit) = (cli.root.as_deref(), cli.audit_dir.as_deref());
    change_live(root, audit, id, ChangeAction::Allow, rule)
}

/// `deny ID RULE`.
pub(super) fn deny(cli: &Cli, id: &str, rule: &str) -> Result<(), CliError> {
    let (root, audit) = (cli.root.as_deref(), cli.audit_dir.as_deref());
    change_live(root, audit, id, ChangeAction::Deny, rule)
}

/// Finds the sandbox as `audit` does and asks its proxy.
fn change_live(
    root: Option<&Path>,
    audit_dir: Option<&Path>,
    id: &str,
    action: ChangeAction,
    rule: &str,
) -> Result<(), CliError> {
    let found = crate::report::find::find(root, audit_dir, id)?;
    let dir = Runtime::new(Some(&found.root))?.dirs.sandbox(&found.id);
    println!(
        "{}",
        crate::sidecars::allow::change(&dir, found.id.as_str(), action, rule)?
    );
    Ok(())
}
