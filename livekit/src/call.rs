//! One call in a LiveKit room: the agent joins, publishes its voice, answers the first
//! participant it hears until they leave, then leaves.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use sublet_audio::SPEECH_RATE;
use sublet_turn_detect::TurnEvent;
use tokio::sync::{mpsc, watch};

use super::{CallEnd, RoomConnection, RoomEvent, TrackIgnored};
use sublet_agent::CallObserver;
use sublet_agent::Playout;
use sublet_agent::TurnRecord;
use sublet_agent::VoiceAgent;
use sublet_agent::STAGE_NAMES;

/// The rate the agent's voice is published at (Opus's own).
const VOICE_RATE: u32 = 48_000;
/// A caller's client may stop sending while they are silent (Opus DTX); after this long
/// without audio the agent hears silence, so that turns still end.
const SILENCE_AFTER: Duration = Duration::from_millis(100);
const TICK: Duration = Duration::from_millis(20);
/// The caller's audio queued for the pipeline, at most this many pieces of at most
/// [`PIECE`] samples (20 ms each: 30 s). A pipeline that falls that far behind drops the
/// newest audio instead of queueing it without bound.
const AUDIO_QUEUE: usize = 1500;
/// The longest piece queued: 20 ms at 16 kHz (a 120 ms Opus packet goes as six).
const PIECE: usize = SPEECH_RATE as usize / 50;

/// How a room call treats a room with nobody in it, a caller whose audio stops, and a
/// hang-up. The defaults are what `room` and `worker` use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOptions {
    /// How long the agent waits in a room for someone to speak before it leaves (60 s).
    pub nobody_timeout: Duration,
    /// The caller's audio stopped arriving while their connection stayed up (a frozen
    /// client, a media path that broke under a live signal connection): hang up after this
    /// long (30 s; `None`: never). LiveKit's clients send audio all the time, silence
    /// included, from an unmuted microphone; a muted caller is not timed.
    pub media_timeout: Option<Duration>,
    /// Asked to hang up, the agent first finishes the turn in progress, but waits no longer
    /// than this (30 s; a turn whose transcript came out empty is never answered).
    pub hang_up_grace: Duration,
    /// The longest a call lasts from the caller's first audio (an hour; `None`: no limit).
    pub max_length: Option<Duration>,
    /// Hang up on a caller whose microphone stays muted this long (5 minutes; `None`:
    /// never): muted callers would otherwise hold a worker's places for ever.
    pub muted_timeout: Option<Duration>,
}

impl Default for CallOptions {
    fn default() -> Self {
        Self {
            nobody_timeout: Duration::from_secs(60),
            media_timeout: Some(Duration::from_secs(30)),
            hang_up_grace: Duration::from_secs(30),
            max_length: Some(Duration::from_secs(3600)),
            muted_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// What a room call produced.
#[derive(Debug)]
pub struct RoomCall {
    /// The identity of the participant the agent answered.
    pub caller: Option<String>,
    pub turns: Vec<TurnRecord>,
    /// How long each resume of a dropped signal connection took.
    pub signal_resumes: Vec<Duration>,
    /// The tracks participants published that the agent did not decode, and why.
    pub ignored_tracks: Vec<(String, TrackIgnored)>,
    /// Why the call ended.
    pub ended: CallEnd,
}

/// The agent's state as LiveKit's clients show it (participant attribute `lk.agent.state`).
pub const AGENT_STATE: &str = "lk.agent.state";

/// Whether a turn is in progress: the caller speaking, a turn ended and not yet answered,
/// or the agent's speech queued. A call asked to hang up ends once none is.
struct Activity {
    caller_speaking: AtomicBool,
    turns_ended: AtomicUsize,
    turns_answered: AtomicUsize,
    playout: Playout,
}

impl Activity {
    fn idle(&self) -> bool {
        !self.caller_speaking.load(Ordering::Relaxed)
            && !self.playout.pending()
            && self.turns_ended.load(Ordering::Relaxed)
                <= self.turns_answered.load(Ordering::Relaxed)
    }
}

/// The topic LiveKit's clients read transcriptions from.
pub const TRANSCRIPTION_TOPIC: &str = "lk.transcription";

/// The topic each turn's record goes out on as it ends (its transcript, reply, outcome and
/// stage times, the JSON of a `TurnRecord`), for any client that shows a call's latency.
pub const TURN_TOPIC: &str = "sublet.turn";

/// What the room is told, in order.
enum Announce {
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
struct RoomObserver<'a> {
    inner: &'a mut dyn CallObserver,
    announce: mpsc::UnboundedSender<Announce>,
    activity: Arc<Activity>,
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

/// [`crate::LiveKitAgent::answer_room_until`].
pub(crate) fn answer_room_until(
    agent: &VoiceAgent,
    runtime: &tokio::runtime::Handle,
    url: &str,
    token: &str,
    options: &CallOptions,
    observer: &mut dyn CallObserver,
    mut hang_up: watch::Receiver<bool>,
) -> Result<RoomCall> {
    let options = options.clone();
    let (room, mut events) = runtime.block_on(RoomConnection::join(url, token))?;
    let room = Arc::new(room);
    let playout = Playout::new(VOICE_RATE);
    let activity = Arc::new(Activity {
        caller_speaking: AtomicBool::new(false),
        turns_ended: AtomicUsize::new(0),
        turns_answered: AtomicUsize::new(0),
        playout: playout.clone(),
    });
    let mut voice = runtime.block_on(room.publish_audio(VOICE_RATE))?;
    // What the room is told, in order: the agent's state and the transcripts.
    let (announce, mut announcements) = mpsc::unbounded_channel::<Announce>();
    let caller_identity = Arc::new(std::sync::Mutex::new(None::<String>));
    let announcer = {
        let room = room.clone();
        let caller_identity = caller_identity.clone();
        runtime.spawn(async move {
            while let Some(announcement) = announcements.recv().await {
                match announcement {
                    Announce::State(state) => room.set_attributes(&[(AGENT_STATE, state)]).await,
                    Announce::Transcript {
                        from_caller,
                        is_final,
                        text,
                        segment,
                    } => {
                        let caller = caller_identity
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
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
        })
    };
    let _ = announce.send(Announce::State("listening"));
    let (answered_tx, answered) = watch::channel(false);
    let speaker_playout = playout.clone();
    let speaker_states = announce.clone();
    // The agent's track carries audio all the time, silence between replies, as a
    // microphone's would: the caller's jitter buffer then never restarts mid-call.
    // Each 20 ms frame is pulled from the playout as it falls due, so a pause or a cut
    // is heard within a frame.
    let speaker = runtime.spawn(async move {
        let mut frame = vec![0.0; (VOICE_RATE as f64 * TICK.as_secs_f64()) as usize];
        let mut speaking = false;
        loop {
            let spoke = speaker_playout.pull(&mut frame);
            if spoke != speaking {
                speaking = spoke;
                let state = if spoke { "speaking" } else { "listening" };
                let _ = speaker_states.send(Announce::State(state));
            }
            voice.send(&frame).await?;
            if *answered.borrow() && played_out(&speaker_playout) {
                break;
            }
        }
        voice.finish().await
    });
    let (audio_tx, audio_in) = std::sync::mpsc::sync_channel::<Vec<f32>>(AUDIO_QUEUE);
    let listener_caller = caller_identity.clone();
    let listener_activity = activity.clone();
    let listener = runtime.spawn(async move {
        let mut hanging_up: Option<Instant> = None;
        let mut caller: Option<String> = None;
        let mut resumes = Vec::new();
        let mut ignored = Vec::new();
        let joined = Instant::now();
        let mut first_audio: Option<Instant> = None;
        let mut last_audio = Instant::now();
        // Since when the caller's microphone has been muted, if it is.
        let mut muted_since: Option<Instant> = None;
        let mut dropped = 0usize;
        let mut tick = tokio::time::interval(TICK);
        let ended = loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(RoomEvent::Audio { identity, samples }) => {
                        if caller.is_none() {
                            *listener_caller.lock().unwrap_or_else(|e| e.into_inner()) = Some(identity.clone());
                        }
                        if *caller.get_or_insert_with(|| identity.clone()) == identity {
                            last_audio = Instant::now();
                            first_audio.get_or_insert(last_audio);
                            let mut stopped = false;
                            for piece in samples.chunks(PIECE) {
                                match audio_tx.try_send(piece.to_vec()) {
                                    Ok(()) => {}
                                    Err(TrySendError::Full(_)) => {
                                        dropped += 1;
                                        if dropped == 1 {
                                            tracing::warn!("room: the pipeline is 30 s behind the caller; their newest audio is dropped");
                                        }
                                    }
                                    Err(TrySendError::Disconnected(_)) => stopped = true,
                                }
                            }
                            if stopped {
                                break CallEnd::AgentStopped;
                            }
                        }
                    }
                    Some(RoomEvent::ParticipantLeft { identity }) if caller.as_ref() == Some(&identity) => {
                        break CallEnd::CallerLeft { identity };
                    }
                    Some(RoomEvent::Resumed { dropped, attempts, after }) => {
                        tracing::warn!(
                            "room: the signal connection dropped ({dropped}); resumed in {:.2} s ({attempts} attempts)",
                            after.as_secs_f64()
                        );
                        resumes.push(after);
                    }
                    Some(RoomEvent::MicrophoneMuted { identity, muted }) if caller.as_ref() == Some(&identity) => {
                        // Unmuted, the caller's audio is timed afresh.
                        if muted != muted_since.is_some() {
                            muted_since = muted.then(Instant::now);
                            last_audio = Instant::now();
                        }
                    }
                    Some(RoomEvent::TrackIgnored { identity, reason }) => {
                        tracing::info!("room: {identity}'s track is not heard: {reason}");
                        ignored.push((identity, reason));
                    }
                    Some(RoomEvent::Disconnected { reason }) => break CallEnd::SignalLost { reason: Some(reason) },
                    Some(_) => {}
                    None => break CallEnd::SignalLost { reason: None },
                },
                Ok(()) = hang_up.changed(), if hanging_up.is_none() => {
                    if *hang_up.borrow() {
                        hanging_up = Some(Instant::now());
                    }
                }
                _ = tick.tick() => {
                    if let Some(since) = hanging_up {
                        let grace = options.hang_up_grace;
                        if listener_activity.idle() {
                            break CallEnd::HungUp { turn_in_progress: false, grace };
                        }
                        if since.elapsed() >= grace {
                            break CallEnd::HungUp { turn_in_progress: true, grace };
                        }
                    }
                    if caller.is_none() && joined.elapsed() >= options.nobody_timeout {
                        break CallEnd::NobodySpoke(options.nobody_timeout);
                    }
                    if let (Some(_), Some(limit), None) = (&caller, options.media_timeout, muted_since) {
                        if last_audio.elapsed() >= limit {
                            break CallEnd::MediaStopped(limit);
                        }
                    }
                    if let (Some(since), Some(limit)) = (muted_since, options.muted_timeout) {
                        if since.elapsed() >= limit {
                            break CallEnd::MutedTooLong(limit);
                        }
                    }
                    if let (Some(first), Some(limit)) = (first_audio, options.max_length) {
                        if first.elapsed() >= limit {
                            break CallEnd::TooLong(limit);
                        }
                    }
                    if caller.is_some() && last_audio.elapsed() >= SILENCE_AFTER {
                        let silence = vec![0.0; (SPEECH_RATE as f64 * TICK.as_secs_f64()) as usize];
                        let _ = audio_tx.try_send(silence);
                    }
                }
            }
        };
        (caller, resumes, ignored, ended)
    });
    let mut room_observer = RoomObserver {
        inner: &mut *observer,
        announce: announce.clone(),
        activity,
    };
    // A panic in the pipeline ends this call as a failure, after the same teardown as any
    // end: the agent leaves the room rather than staying in it, silent.
    let turns = std::panic::catch_unwind(AssertUnwindSafe(|| {
        agent.answer_live(audio_in, &playout, &mut room_observer)
    }))
    .unwrap_or_else(|panic| Err(anyhow!("the call panicked: {}", panic_message(&*panic))));
    let _ = answered_tx.send(true);
    drop(room_observer);
    drop(announce);
    let (caller, signal_resumes, ignored_tracks, ended) = runtime
        .block_on(listener)
        .map_err(|e| anyhow!("the room listener failed: {e}"))?;
    observer.call_ended(&match &turns {
        Ok(_) => ended.to_string(),
        Err(e) => format!("{ended}; the call failed: {e:#}"),
    });
    // Let the last reply finish playing before leaving.
    let _ = runtime.block_on(speaker);
    let _ = runtime.block_on(announcer);
    runtime.block_on(room.leave());
    Ok(RoomCall {
        caller,
        turns: turns?,
        signal_resumes,
        ignored_tracks,
        ended,
    })
}

/// Whether the agent's voice has nothing more to play once the pipeline is done: what is
/// queued plays out, unless it is paused, since nothing is left to resume it (a call that
/// panicked while the caller spoke over the agent kept its speaker, and so the call and a
/// worker's drain, waiting forever).
fn played_out(playout: &Playout) -> bool {
    !playout.speaking()
}

/// What a panic carried, as text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "(no message)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_reply_does_not_keep_a_finished_call() {
        let playout = Playout::new(VOICE_RATE);
        let speech = sublet_audio::Audio::new(vec![0.1; VOICE_RATE as usize], VOICE_RATE);
        playout.push(1, "Hello there.", &speech);
        assert!(!played_out(&playout), "queued speech plays out first");
        playout.pause();
        assert!(
            played_out(&playout),
            "paused speech has no one left to resume it"
        );
        playout.resume();
        let mut frame = vec![0.0; VOICE_RATE as usize];
        playout.pull(&mut frame);
        assert!(played_out(&playout));
    }
}
