//! harness helpers.
