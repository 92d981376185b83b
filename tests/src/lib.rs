//! End-to-end tests across the crates, on the real bundled models; see `tests/tests/`.
