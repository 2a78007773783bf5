//! The agent-sandbox runtime library: lifecycle, state and enforcement on top of
//! youki's libcontainer. The `agent-sandbox` binary only parses arguments.
#![forbid(unsafe_code)]
