//! End-to-end suites, one module per entry point.
mod audit;
mod baseline;
mod cri;
mod ctr;
mod egress;
mod faults;
mod hostile;
mod podman;
mod pods;
mod workspace;
