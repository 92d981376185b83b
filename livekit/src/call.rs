//! One call in a LiveKit room: the agent joins, publishes its voice, answers the first
//! participant it hears until they leave, then leaves.

mod announce;
mod listener;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use sublet_agent::{CallObserver, Playout, TurnRecord, VoiceAgent};
use sublet_audio::SPEECH_RATE;
use tokio::sync::{mpsc, watch};

use crate::{AudioPublisher, CallEnd, RoomConnection, TrackIgnored};
use announce::{announce_to_room, Announce, RoomObserver};
pub use announce::{AGENT_STATE, TRANSCRIPTION_TOPIC, TURN_TOPIC};
use listener::Listener;

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

/// [`crate::LiveKitAgent::answer_room_until`].
pub(crate) fn answer_room_until(
    agent: &VoiceAgent,
    runtime: &tokio::runtime::Handle,
    url: &str,
    token: &str,
    options: &CallOptions,
    observer: &mut dyn CallObserver,
    hang_up: watch::Receiver<bool>,
) -> Result<RoomCall> {
    let (room, events) = runtime.block_on(RoomConnection::join(url, token))?;
    let room = Arc::new(room);
    let playout = Playout::new(VOICE_RATE);
    let activity = Arc::new(Activity {
        caller_speaking: AtomicBool::new(false),
        turns_ended: AtomicUsize::new(0),
        turns_answered: AtomicUsize::new(0),
        playout: playout.clone(),
    });
    let voice = runtime.block_on(room.publish_audio(VOICE_RATE))?;
    let (announce, announcements) = mpsc::unbounded_channel::<Announce>();
    let caller_identity = Arc::new(Mutex::new(None::<String>));
    let announcer = runtime.spawn(announce_to_room(
        room.clone(),
        announcements,
        caller_identity.clone(),
    ));
    let _ = announce.send(Announce::State("listening"));
    let (answered_tx, answered) = watch::channel(false);
    let speaker = runtime.spawn(speak(voice, playout.clone(), announce.clone(), answered));
    let (audio_tx, audio_in) = std::sync::mpsc::sync_channel::<Vec<f32>>(AUDIO_QUEUE);
    let listener = Listener::new(options.clone(), audio_tx, caller_identity, activity.clone());
    let listener = runtime.spawn(listener.listen(events, hang_up));
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
    let heard = runtime
        .block_on(listener)
        .map_err(|e| anyhow!("the room listener failed: {e}"))?;
    observer.call_ended(&match &turns {
        Ok(_) => heard.ended.to_string(),
        Err(e) => format!("{}; the call failed: {e:#}", heard.ended),
    });
    // Let the last reply finish playing before leaving.
    let _ = runtime.block_on(speaker);
    let _ = runtime.block_on(announcer);
    runtime.block_on(room.leave());
    Ok(RoomCall {
        caller: heard.caller,
        turns: turns?,
        signal_resumes: heard.resumes,
        ignored_tracks: heard.ignored,
        ended: heard.ended,
    })
}

/// The agent's voice in the room until the call is answered and its speech played out.
/// The track carries audio all the time, silence between replies, as a microphone's would:
/// the caller's jitter buffer then never restarts mid-call. Each 20 ms frame is pulled
/// from the playout as it falls due, so a pause or a cut is heard within a frame.
async fn speak(
    mut voice: AudioPublisher,
    playout: Playout,
    states: mpsc::UnboundedSender<Announce>,
    answered: watch::Receiver<bool>,
) -> Result<()> {
    let mut frame = vec![0.0; (VOICE_RATE as f64 * TICK.as_secs_f64()) as usize];
    let mut speaking = false;
    loop {
        let spoke = playout.pull(&mut frame);
        if spoke != speaking {
            speaking = spoke;
            let state = if spoke { "speaking" } else { "listening" };
            let _ = states.send(Announce::State(state));
        }
        voice.send(&frame).await?;
        if *answered.borrow() && played_out(&playout) {
            break;
        }
    }
    voice.finish().await
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
