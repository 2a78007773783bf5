//! The policy crate's integration tests (one binary; modules under `suite/`).
// A test binary: a failed set-up step must stop the test loudly, in helpers too.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod suite;
