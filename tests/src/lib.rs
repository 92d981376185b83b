//! End-to-end tests across the crates, on the real bundled models; see `tests/tests/`.
//!
//! The library holds what those tests share: the LiveKit-protocol test server.

pub mod livekit_server;
