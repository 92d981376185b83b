//! The latency benchmark's calls through a LiveKit room (`latency --livekit`): the LiveKit
//! test server, LiveKit's official Node client as the caller, playing the call's WAV in
//! real time and reporting when it heard reply audio begin, and the agent answering the
//! room as it does in production.

use std::time::Duration;

use anyhow::{bail, Result};
use sublet_agent::{CallObserver, TurnRecord, VoiceAgent};
use sublet_livekit::{CallOptions, LiveKitAgent};
use sublet_livekit_testserver::TestServer;
use sublet_tests::official_clients::{livekit_caller, room_token};

use crate::test_callers::TestCall;

/// The test server's credentials.
pub const API_KEY: &str = "devkey";
pub const API_SECRET: &str = "a-secret-long-enough-for-hs256-signing";

/// The caller joins this long after the agent, as a dispatched agent is there first.
const CALLER_JOINS_AFTER: Duration = Duration::from_secs(2);

/// One call in a room.
pub struct RoomCallPlayed {
    /// The agent's turns, on its own clock (from the first audio it received).
    pub turns: Vec<TurnRecord>,
    /// When the caller heard reply audio begin, on the call's clock.
    pub onsets_s: Vec<f64>,
}

/// Plays `call` into room `room` of `server` and answers it with `agent`.
pub fn play_in_room(
    agent: &VoiceAgent,
    server: &TestServer,
    runtime: &tokio::runtime::Handle,
    room: &str,
    call: &TestCall,
    observer: &mut dyn CallObserver,
) -> Result<RoomCallPlayed> {
    let seconds = sublet_audio::read_wav(&call.wav)?.duration_s();
    let Some(wav) = call.wav.to_str().map(str::to_owned) else {
        bail!("{} is not a UTF-8 path", call.wav.display());
    };
    let url = server.url.clone();
    let room_name = room.to_owned();
    let caller = std::thread::spawn(move || {
        std::thread::sleep(CALLER_JOINS_AFTER);
        let ttl = Duration::from_secs(600);
        let token = room_token(API_KEY, API_SECRET, "caller", &room_name, ttl);
        let listen = format!("{:.0}", seconds.ceil() + 1.0);
        livekit_caller(&url, &token, &["--publish-wav", &wav, "--listen", &listen])
    });
    let credentials = server.credentials();
    let token = credentials.agent_token(room, "sublet-agent")?;
    let options = CallOptions::default();
    let answered = agent.answer_room(runtime, &credentials.url, &token, &options, observer);
    let (ok, events) = match caller.join() {
        Ok(result) => result,
        Err(_) => bail!("the caller's thread panicked"),
    };
    let call_record = answered?;
    if !ok {
        bail!("the official caller failed: {events:?}");
    }
    let onsets_s = events
        .iter()
        .filter(|e| e["event"] == "onset")
        .filter_map(|e| e["at_s"].as_f64())
        .collect();
    Ok(RoomCallPlayed {
        turns: call_record.turns,
        onsets_s,
    })
}
