//! One call in a LiveKit room: the agent joins, publishes its voice, answers the first
//! participant it hears until they leave, then leaves.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use sublet_audio::{Audio, SPEECH_RATE};
use tokio::sync::mpsc;

use super::{RoomConnection, RoomEvent};
use crate::call::CallObserver;
use crate::record::TurnRecord;
use crate::responder::AudioOut;
use crate::VoiceAgent;

/// The rate the agent's voice is published at (Opus's own).
const VOICE_RATE: u32 = 48_000;
/// A caller's client may stop sending while they are silent (Opus DTX); after this long
/// without audio the agent hears silence, so that turns still end.
const SILENCE_AFTER: Duration = Duration::from_millis(100);
const TICK: Duration = Duration::from_millis(20);
/// How long the agent waits in a room for someone to speak before it leaves.
const NOBODY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a room call produced.
#[derive(Debug)]
pub struct RoomCall {
    /// The identity of the participant the agent answered.
    pub caller: Option<String>,
    pub turns: Vec<TurnRecord>,
    /// Why the call ended.
    pub ended: String,
}

/// The agent's speech, queued for the track.
struct RoomVoice(mpsc::UnboundedSender<Audio>);

impl AudioOut for RoomVoice {
    fn play(&mut self, _at_s: f64, audio: &Audio) {
        let _ = self.0.send(audio.clone());
    }
}

impl VoiceAgent {
    /// Joins the room `token` grants at `url` and answers one caller there.
    pub fn answer_room(
        &self,
        runtime: &tokio::runtime::Handle,
        url: &str,
        token: &str,
        observer: &mut dyn CallObserver,
    ) -> Result<RoomCall> {
        let (room, mut events) = runtime.block_on(RoomConnection::join(url, token))?;
        let mut voice = runtime.block_on(room.publish_audio(VOICE_RATE))?;
        let (speech_tx, mut speech) = mpsc::unbounded_channel::<Audio>();
        // The agent's track carries audio all the time, silence between replies, as a
        // microphone's would: the caller's jitter buffer then never restarts mid-call.
        let speaker = runtime.spawn(async move {
            let silence = vec![0.0; (VOICE_RATE as f64 * TICK.as_secs_f64()) as usize];
            loop {
                match tokio::time::timeout(TICK, speech.recv()).await {
                    Ok(Some(audio)) => voice.send(&audio.resampled(VOICE_RATE).samples).await?,
                    Ok(None) => break,
                    Err(_) => voice.send(&silence).await?,
                }
            }
            voice.finish().await
        });
        let (audio_tx, audio_in) = std::sync::mpsc::channel::<Vec<f32>>();
        let listener = runtime.spawn(async move {
            let mut caller: Option<String> = None;
            let joined = Instant::now();
            let mut last_audio = Instant::now();
            let mut tick = tokio::time::interval(TICK);
            let ended = loop {
                tokio::select! {
                    event = events.recv() => match event {
                        Some(RoomEvent::Audio { identity, samples }) => {
                            if *caller.get_or_insert_with(|| identity.clone()) == identity {
                                last_audio = Instant::now();
                                if audio_tx.send(samples).is_err() {
                                    break "the agent stopped listening".to_owned();
                                }
                            }
                        }
                        Some(RoomEvent::ParticipantLeft { identity }) if caller.as_ref() == Some(&identity) => {
                            break format!("{identity} left the room");
                        }
                        Some(RoomEvent::Disconnected { reason }) => break reason,
                        Some(_) => {}
                        None => break "the room connection ended".to_owned(),
                    },
                    _ = tick.tick() => {
                        if caller.is_none() && joined.elapsed() >= NOBODY_TIMEOUT {
                            break format!("nobody spoke in the room for {} s", NOBODY_TIMEOUT.as_secs());
                        }
                        if caller.is_some() && last_audio.elapsed() >= SILENCE_AFTER {
                            let silence = vec![0.0; (SPEECH_RATE as f64 * TICK.as_secs_f64()) as usize];
                            let _ = audio_tx.send(silence);
                        }
                    }
                }
            };
            (caller, ended)
        });
        let turns = self.answer_live(audio_in, Box::new(RoomVoice(speech_tx)), observer);
        let (caller, ended) = runtime
            .block_on(listener)
            .map_err(|e| anyhow!("the room listener failed: {e}"))?;
        // Let the last reply finish playing before leaving.
        let _ = runtime.block_on(speaker);
        runtime.block_on(room.leave());
        Ok(RoomCall {
            caller,
            turns: turns?,
            ended,
        })
    }
}
