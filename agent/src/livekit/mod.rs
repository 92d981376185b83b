//! The agent's LiveKit side, spoken on crates that build from the registries
//! (`livekit-signaling`, `livekit-protocol`, `livekit-api`, webrtc-rs and libopus): the
//! official `livekit` crate needs a prebuilt libwebrtc it would download at build time.
//!
//! - `token.rs`: the server's URL and API key from LiveKit's environment variables, and the
//!   agent's own access tokens;
//! - `connection.rs`: joining a room and hearing each participant's microphone at 16 kHz;
//! - `publish.rs`: the agent's voice, as Opus packets on its microphone track;
//! - `call.rs`: one call in a room, through the voice pipeline;
//! - `worker.rs`: the agent as a LiveKit agent worker, taking calls as the server assigns them;
//! - `ended.rs`: why a call or a worker stopped;
//! - `peer.rs`: one WebRTC peer connection, as both the agent and the test server use it.

mod call;
mod connection;
mod ended;
pub mod peer;
mod publish;
mod token;
mod worker;

pub use call::RoomCall;
pub use connection::{RoomConnection, RoomEvent};
pub use ended::{CallEnd, WorkerEnd};
pub use publish::AudioPublisher;
pub use token::{agent_grants, LiveKitCredentials};
pub use worker::{JobReport, WorkerOptions, WorkerReport};
