#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_sandbox_fuzz_targets::proxy_request(data));
