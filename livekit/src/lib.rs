//! The agent's LiveKit side, spoken on crates that build from the registries
//! (`livekit-signaling`, `livekit-protocol`, `livekit-api`, webrtc-rs and libopus): the
//! official `livekit` crate needs a prebuilt libwebrtc it would download at build time.
//!
//! - `token.rs`: the server's URL and API key from LiveKit's environment variables, and the
//!   agent's own access tokens;
//! - `connection.rs`: joining a room and hearing each participant's microphone at 16 kHz;
//! - `participants.rs`: who joined, left or muted, from the server's updates;
//! - `hearing.rs`: which tracks are decoded (each participant's Opus microphone, a few at
//!   a time), no faster than real time;
//! - `publish.rs`: the agent's voice, as Opus packets on its microphone track;
//! - `call.rs`: one call in a room, through the voice pipeline;
//! - `worker.rs`: the agent as a LiveKit agent worker, taking calls as the server assigns them;
//! - `ended.rs`: why a call or a worker stopped;
//! - `peer.rs`: one WebRTC peer connection, as both the agent and the test server use it.
//!
//! The pipeline (`sublet-agent`) knows nothing of LiveKit: a room call reaches it only
//! through the live call's audio frames, a [`Playout`] for the agent's voice and a
//! [`CallObserver`], and [`LiveKitAgent`] gives its `VoiceAgent` the room's methods.

mod call;
mod connection;
mod ended;
mod hearing;
mod participants;
pub mod peer;
mod publish;
mod token;
mod worker;

pub use call::{CallOptions, RoomCall, AGENT_STATE, TRANSCRIPTION_TOPIC, TURN_TOPIC};
pub use connection::{RoomConnection, RoomEvent};
pub use ended::{CallEnd, WorkerEnd};
pub use hearing::{TrackIgnored, MOST_HEARD};
pub use publish::AudioPublisher;
pub use token::{agent_grants, LiveKitCredentials};
pub use worker::{JobReport, WorkerOptions, WorkerReport};

use anyhow::Result;
#[cfg(doc)]
use sublet_agent::Playout;
use sublet_agent::{CallObserver, VoiceAgent};
use tokio::sync::watch;

/// The voice agent in LiveKit rooms.
pub trait LiveKitAgent {
    /// Joins the room `token` grants at `url` and answers one caller there.
    fn answer_room(
        &self,
        runtime: &tokio::runtime::Handle,
        url: &str,
        token: &str,
        options: &CallOptions,
        observer: &mut dyn CallObserver,
    ) -> Result<RoomCall> {
        let (_never, hang_up) = watch::channel(false);
        self.answer_room_until(runtime, url, token, options, observer, hang_up)
    }

    /// As [`LiveKitAgent::answer_room`], and once `hang_up` turns true the agent finishes
    /// the turn in progress (the caller's words, its reply) and leaves.
    fn answer_room_until(
        &self,
        runtime: &tokio::runtime::Handle,
        url: &str,
        token: &str,
        options: &CallOptions,
        observer: &mut dyn CallObserver,
        hang_up: watch::Receiver<bool>,
    ) -> Result<RoomCall>;

    /// Registers as a LiveKit agent worker and answers the calls it is given until `drain`
    /// turns true (or the server closes the connection); returns once every call has
    /// ended. `observer` makes each call's observer, given the room's name.
    fn work(
        &self,
        runtime: &tokio::runtime::Handle,
        credentials: &LiveKitCredentials,
        options: &WorkerOptions,
        drain: watch::Receiver<bool>,
        observer: &(dyn Fn(&str) -> Box<dyn CallObserver> + Sync),
    ) -> Result<WorkerReport>;
}

impl LiveKitAgent for VoiceAgent {
    fn answer_room_until(
        &self,
        runtime: &tokio::runtime::Handle,
        url: &str,
        token: &str,
        options: &CallOptions,
        observer: &mut dyn CallObserver,
        hang_up: watch::Receiver<bool>,
    ) -> Result<RoomCall> {
        call::answer_room_until(self, runtime, url, token, options, observer, hang_up)
    }

    fn work(
        &self,
        runtime: &tokio::runtime::Handle,
        credentials: &LiveKitCredentials,
        options: &WorkerOptions,
        drain: watch::Receiver<bool>,
        observer: &(dyn Fn(&str) -> Box<dyn CallObserver> + Sync),
    ) -> Result<WorkerReport> {
        worker::work(self, runtime, credentials, options, drain, observer)
    }
}
