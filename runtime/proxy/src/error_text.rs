//! Errors as one line of text, for messages sent back to a client and for records.

/// An error with its sources, one line: `error: source: source's source`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
