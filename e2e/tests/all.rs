//! One integration-test binary for the end-to-end suites.
mod suite;
