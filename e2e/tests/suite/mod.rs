//! End-to-end suites, one module per entry point.
mod audit;
mod baseline;
mod ctr;
mod egress;
mod faults;
mod hostile;
mod podman;
