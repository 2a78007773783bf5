//! The host mechanisms the runtime drives, one module each, so that a second kind of host
//! changes one place.

pub mod apparmor;
pub mod cgroups;
pub mod console;
pub mod criu;
pub mod criu_image;
pub mod idmap;
pub mod reown;
pub mod rlimits;
pub mod userns;
