//! What a sandbox did, for the person who runs it: the audit trail (`audit`), the protections
//! in force (`layers`), the kept workspace changes (`changes`) and their review (`review`) and
//! promotion (`promote`), and finding a sandbox by id, prefix or name whatever entry point
//! created it (`find`).

pub mod audit;
pub mod changes;
pub mod find;
pub mod layers;
pub mod promote;
pub mod review;
pub mod snapshots;
