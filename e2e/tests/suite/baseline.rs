//! baseline suite.
