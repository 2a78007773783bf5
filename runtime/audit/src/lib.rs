#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::too_many_lines))] // a unit test may be a long scenario

pub mod escape;
pub mod history;
pub mod ignore;
pub mod kernel;
pub mod layout;
pub mod limit;
pub mod log;
pub mod names;
pub mod patch;
pub mod promote;
pub mod record;
pub mod scratch;
pub mod timeline;

pub use layout::{Footprint, SizeLimit, TooLarge};
pub use limit::{Budget, Gate, Passed, RateLimit, Stream, Tally};
pub use log::{
    Anchor, Appended, AuditError, AuditLog, Broken, Capped, TornTail, VerifyReport, genesis,
    log_path, read_records, repair_torn_tail, verify, verify_with_anchor,
};
pub use record::{
    ApprovalCount, CredentialUse, Event, ExitCause, ExitStatus, KindCount, NetCount, Record,
    SummaryCause, TOOL_CALL_ANNOTATION, TOOL_CALL_ENV, ToolCallError, Verdict, check_tool_call_env,
    split_tool_call_argv, tool_call_id, valid_tool_call_id,
};
pub use scratch::{
    Change, ChangeKind, ExportSummary, ExportTarget, FileKind, ScratchError, diff, export,
    files_changed,
};
pub use timeline::render_timeline;
