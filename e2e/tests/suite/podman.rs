//! podman suite.
