//! End-to-end suites, one module per entry point.
mod audit;
mod baseline;
mod contracts;
mod cri;
mod ctr;
mod docker;
mod egress;
mod faults;
mod find;
mod hostile;
mod limits;
mod podman;
mod pods;
mod promote;
mod shim_contracts;
mod tls_inject;
mod workspace;
