//! One integration-test binary for the end-to-end suites.
#![allow(clippy::too_many_lines)] // a test may be a long scenario
mod suite;
