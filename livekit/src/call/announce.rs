//! What the room is told of a call, in order: the agent's state, the transcripts (the
//! caller's so far and whole, the agent's replies) and each turn's record.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use sublet_agent::{CallObserver, TurnRecord, STAGE_NAMES};
use sublet_turn_detect::TurnEvent;
use tokio::sync::mpsc;

use super::Activity;
use crate::RoomConnection;

/// The agent's state as LiveKit's clients show it (participant attribute `lk.agent.state`).
pub const AGENT_STATE: &str = "lk.agent.state";

/// The topic LiveKit's clients read transcriptions from.
pub const TRANSCRIPTION_TOPIC: &str = "lk.transcription";

/// The topic each turn's record goes out on as it ends (its transcript, reply, outcome and
/// stage times, the JSON of a `TurnRecord`), for any client that shows a call's latency.
pub const TURN_TOPIC: &str = "sublet.turn";

/// What the room is told, in order.
pub(super) enum Announce {
    State(&'static str),
    /// A transcript: the caller's turn so far (partial) or whole (final), sent on their
    /// behalf, or the agent's reply (final).
    Transcript {
        from_caller: bool,
        is_final: bool,
        text: String,
        segment: String,
    },
    /// A turn's record as JSON, on [`TURN_TOPIC`].
    Turn(String),
}

/// Passes the call's events on; says `thinking` when a turn ends, sends what the caller
/// has said so far as partial transcripts, and the turn's transcripts and record when it
/// is answered.
pub(super) struct RoomObserver<'a> {
    pub(super) inner: &'a mut dyn CallObserver,
    pub(super) announce: mpsc::UnboundedSender<Announce>,
    pub(super) activity: Arc<Activity>,
}

impl CallObserver for RoomObserver<'_> {
    fn turn_event(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::SpeechStarted { .. } => {
                self.activity.caller_speaking.store(true, Ordering::Relaxed)
            }
            TurnEvent::SpeechStopped { .. } => self
                .activity
                .caller_speaking
                .store(false, Ordering::Relaxed),
            TurnEvent::EndOfTurn { .. } => {
                self.activity.turns_ended.fetch_add(1, Ordering::Relaxed);
                let _ = self.announce.send(Announce::State("thinking"));
            }
        }
        self.inner.turn_event(event);
    }

    fn interruption(&mut self, interruption: &sublet_agent::Interruption) {
        self.inner.interruption(interruption);
    }

    fn partial_transcript(&mut self, text: &str) {
        // The turn in progress is the one after the last answered.
        let turn = self.activity.turns_answered.load(Ordering::Relaxed) + 1;
        let _ = self.announce.send(Announce::Transcript {
            from_caller: true,
            is_final: false,
            text: text.to_owned(),
            segment: format!("SG_{turn}_user"),
        });
        self.inner.partial_transcript(text);
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        self.activity.turns_answered.fetch_add(1, Ordering::Relaxed);
        for (from_caller, text, side) in [
            (true, &turn.transcript, "user"),
            (false, &turn.reply, "agent"),
        ] {
            let _ = self.announce.send(Announce::Transcript {
                from_caller,
                is_final: true,
                text: text.clone(),
                segment: format!("SG_{}_{side}", turn.index),
            });
        }
        let _ = self
            .announce
            .send(Announce::Turn(turn_message(turn).to_string()));
        self.inner.turn_answered(turn);
    }
}

/// What goes out on [`TURN_TOPIC`]: the turn's record, and each stage's own latency and
/// voice to voice as the agent computes them, so that every client shows the same figures.
fn turn_message(turn: &TurnRecord) -> serde_json::Value {
    let stages: Vec<serde_json::Value> = STAGE_NAMES
        .iter()
        .zip(turn.stage_latencies())
        .map(|(stage, s)| serde_json::json!({ "stage": stage, "s": s }))
        .collect();
    serde_json::json!({
        "record": turn,
        "stages": stages,
        "voice_to_voice_s": turn.voice_to_voice_s(),
    })
}

/// Tells the room each announcement in turn until the call drops its senders. A caller's
/// transcript is sent on behalf of the caller heard (`caller`, once known).
pub(super) async fn announce_to_room(
    room: Arc<RoomConnection>,
    mut announcements: mpsc::UnboundedReceiver<Announce>,
    caller: Arc<Mutex<Option<String>>>,
) {
    while let Some(announcement) = announcements.recv().await {
        match announcement {
            Announce::State(state) => room.set_attributes(&[(AGENT_STATE, state)]).await,
            Announce::Transcript {
                from_caller,
                is_final,
                text,
                segment,
            } => {
                let caller = caller.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let sender = if from_caller { caller.as_deref() } else { None };
                let attributes = [
                    (
                        "lk.transcription_final",
                        if is_final { "true" } else { "false" },
                    ),
                    ("lk.segment_id", segment.as_str()),
                ];
                if let Err(e) = room
                    .send_text(TRANSCRIPTION_TOPIC, &text, &attributes, sender)
                    .await
                {
                    tracing::warn!("room: a transcript was not sent: {e:#}");
                }
            }
            Announce::Turn(json) => {
                if let Err(e) = room.send_text(TURN_TOPIC, &json, &[], None).await {
                    tracing::warn!("room: a turn's record was not sent: {e:#}");
                }
            }
        }
    }
}
