#![no_main]

// The same function `cargo test -p agent-sandbox-fuzz-targets` replays on stable.
#[allow(dead_code)]
#[path = "../targets/src/lib.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::client_hello(data));
