mod log;
mod mounts;
mod scratch;
