//! End-to-end suites, one module per entry point.
mod audit;
mod baseline;
mod cri;
mod ctr;
mod egress;
mod podman;
mod pods;
