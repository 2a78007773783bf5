//! The per-sandbox egress proxy: the sandbox's only door to the network.
#![forbid(unsafe_code)]
