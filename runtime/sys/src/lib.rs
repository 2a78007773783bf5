//! The single `unsafe` boundary of agent-sandbox. Every `unsafe` block names the
//! invariant it relies on in a `// SAFETY:` comment.
#![allow(unsafe_code)]
