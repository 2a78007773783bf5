//! Print a built-in profile's generated artifact: `cargo run -p agent-sandbox-policy
//! --example dump -- agent apparmor`.
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("agent", String::as_str);
    let kind = args.get(2).map_or("apparmor", String::as_str);
    let policy = agent_sandbox_policy::SandboxPolicy::builtin(name)?;
    if kind == "explain" {
        print!("{}", agent_sandbox_policy::explain::explain(&policy));
    } else {
        print!(
            "{}",
            agent_sandbox_policy::generated::artifact(&policy, name, kind)?
        );
    }
    Ok(())
}
