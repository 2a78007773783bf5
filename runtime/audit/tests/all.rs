//! Integration tests of agent-sandbox-audit: real files, real child processes, real tmpfs and
//! overlay mounts (these need root and fail loudly without it).
#![allow(clippy::too_many_lines)] // a test may be a long scenario

mod suite;
