//! Integration tests of the egress proxy: real sockets on loopback, real clients (curl, nc,
//! git over ssh), a test-controlled resolver standing in for DNS.
#![allow(clippy::too_many_lines)]
// a test may be a long scenario
// Test helpers outside `#[test]` functions are not covered by clippy.toml's in-tests allowances;
// a failed unwrap here is a test failure, which is what it should be.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;
