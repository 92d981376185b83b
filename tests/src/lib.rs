//! End-to-end tests across the crates, on the real bundled models; see `tests/tests/`.
//!
//! The library holds what those tests share: the LiveKit-protocol test server and the
//! official clients that drive it, a private PulseAudio server for the microphone demo,
//! and a server process a test owns (`served`).

pub mod official_clients;
pub mod pulse;
pub mod served;
