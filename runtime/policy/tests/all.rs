//! The policy crate's integration tests (one binary; modules under `suite/`).
#![allow(clippy::too_many_lines)]
// a test may be a long scenario
// A test binary: a failed set-up step must stop the test loudly, in helpers too.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod suite;
