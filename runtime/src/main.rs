#![forbid(unsafe_code)]

fn main() {
    eprintln!("agent-sandbox: not built yet");
    std::process::exit(1);
}
