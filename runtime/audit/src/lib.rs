//! The per-sandbox audit trail: one append-only, hash-chained JSON-lines log, and the
//! review of what a sandbox changed in its writable overlay.
#![forbid(unsafe_code)]
