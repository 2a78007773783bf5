//! podman helpers.
