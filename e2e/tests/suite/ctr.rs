//! ctr suite.
