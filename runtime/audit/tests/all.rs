//! Integration tests of agent-sandbox-audit: real files, real child processes, real tmpfs and
//! overlay mounts (these need root and fail loudly without it).

mod suite;
