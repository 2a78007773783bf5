//! ctr helpers.
