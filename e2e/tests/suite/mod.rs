//! End-to-end suites, one module per entry point.
mod audit;
mod baseline;
mod contracts;
mod cri;
mod ctr;
mod docker;
mod egress;
mod egress_sni;
mod faults;
mod find;
mod hostile;
mod limits;
mod podman;
mod pods;
mod promote;
mod shim_contracts;
mod workspace;
