//! End-to-end tests across the crates, on the real bundled models; see `tests/tests/`.
//!
//! The library holds what those tests share: the LiveKit-protocol test server and the
//! official clients that drive it.

pub mod livekit_server;
pub mod official_clients;
