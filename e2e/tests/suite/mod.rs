//! End-to-end suites, one module per entry point.
mod baseline;
mod ctr;
mod podman;
