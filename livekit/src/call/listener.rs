//! The room's side of a call: the caller's audio passed to the pipeline as it comes, and
//! every reason the call may end (the caller left, hung up, muted or silent too long, the
//! signal lost), checked on each event and every 20 ms.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sublet_audio::SPEECH_RATE;
use tokio::sync::{mpsc, watch};

use super::{Activity, CallOptions, PIECE, SILENCE_AFTER, TICK};
use crate::{CallEnd, RoomEvent, TrackIgnored};

/// What the listener heard by the call's end.
pub(super) struct Heard {
    pub(super) caller: Option<String>,
    pub(super) resumes: Vec<Duration>,
    pub(super) ignored: Vec<(String, TrackIgnored)>,
    pub(super) ended: CallEnd,
}

/// The listener's state through the call.
pub(super) struct Listener {
    options: CallOptions,
    audio_tx: SyncSender<Vec<f32>>,
    /// The caller's identity, shared with the announcer (transcripts are sent as theirs).
    shared_caller: Arc<Mutex<Option<String>>>,
    activity: Arc<Activity>,
    caller: Option<String>,
    hanging_up: Option<Instant>,
    resumes: Vec<Duration>,
    ignored: Vec<(String, TrackIgnored)>,
    joined: Instant,
    first_audio: Option<Instant>,
    last_audio: Instant,
    /// Since when the caller's microphone has been muted, if it is.
    muted_since: Option<Instant>,
    dropped: usize,
}

impl Listener {
    pub(super) fn new(
        options: CallOptions,
        audio_tx: SyncSender<Vec<f32>>,
        shared_caller: Arc<Mutex<Option<String>>>,
        activity: Arc<Activity>,
    ) -> Self {
        Self {
            options,
            audio_tx,
            shared_caller,
            activity,
            caller: None,
            hanging_up: None,
            resumes: Vec::new(),
            ignored: Vec::new(),
            joined: Instant::now(),
            first_audio: None,
            last_audio: Instant::now(),
            muted_since: None,
            dropped: 0,
        }
    }

    /// Listens until the call ends, for whatever reason.
    pub(super) async fn listen(
        mut self,
        mut events: mpsc::UnboundedReceiver<RoomEvent>,
        mut hang_up: watch::Receiver<bool>,
    ) -> Heard {
        let mut tick = tokio::time::interval(TICK);
        let ended = loop {
            let end = tokio::select! {
                event = events.recv() => self.on_event(event),
                Ok(()) = hang_up.changed(), if self.hanging_up.is_none() => {
                    if *hang_up.borrow() {
                        self.hanging_up = Some(Instant::now());
                    }
                    None
                }
                _ = tick.tick() => self.on_tick(),
            };
            if let Some(end) = end {
                break end;
            }
        };
        Heard {
            caller: self.caller,
            resumes: self.resumes,
            ignored: self.ignored,
            ended,
        }
    }

    /// A room event; `None` once the signal connection is gone.
    fn on_event(&mut self, event: Option<RoomEvent>) -> Option<CallEnd> {
        let is_caller = |identity: &String| self.caller.as_ref() == Some(identity);
        match event? {
            RoomEvent::Audio { identity, samples } => return self.on_audio(identity, &samples),
            RoomEvent::ParticipantLeft { identity } if is_caller(&identity) => {
                return Some(CallEnd::CallerLeft { identity });
            }
            RoomEvent::Resumed {
                dropped,
                attempts,
                after,
            } => {
                tracing::warn!(
                    "room: the signal connection dropped ({dropped}); resumed in {:.2} s ({attempts} attempts)",
                    after.as_secs_f64()
                );
                self.resumes.push(after);
            }
            // A change of the caller's mute; unmuted, their audio is timed afresh.
            RoomEvent::MicrophoneMuted { identity, muted }
                if is_caller(&identity) && muted != self.muted_since.is_some() =>
            {
                self.muted_since = muted.then(Instant::now);
                self.last_audio = Instant::now();
            }
            RoomEvent::TrackIgnored { identity, reason } => {
                tracing::info!("room: {identity}'s track is not heard: {reason}");
                self.ignored.push((identity, reason));
            }
            RoomEvent::Disconnected { reason } => {
                return Some(CallEnd::SignalLost {
                    reason: Some(reason),
                })
            }
            _ => {}
        }
        None
    }

    /// A participant's audio: the first one heard is the caller, and only theirs goes on.
    fn on_audio(&mut self, identity: String, samples: &[f32]) -> Option<CallEnd> {
        if self.caller.is_none() {
            *self.shared_caller.lock().unwrap_or_else(|e| e.into_inner()) = Some(identity.clone());
        }
        if *self.caller.get_or_insert_with(|| identity.clone()) != identity {
            return None;
        }
        self.last_audio = Instant::now();
        self.first_audio.get_or_insert(self.last_audio);
        for piece in samples.chunks(PIECE) {
            match self.audio_tx.try_send(piece.to_vec()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    self.dropped += 1;
                    if self.dropped == 1 {
                        tracing::warn!(
                            "room: the pipeline is 30 s behind the caller; their newest audio is dropped"
                        );
                    }
                }
                Err(TrySendError::Disconnected(_)) => return Some(CallEnd::AgentStopped),
            }
        }
        None
    }

    /// Every 20 ms: the call's limits, and silence for a caller whose client stopped sending.
    fn on_tick(&mut self) -> Option<CallEnd> {
        let options = &self.options;
        if let Some(since) = self.hanging_up {
            let grace = options.hang_up_grace;
            if self.activity.idle() {
                return Some(CallEnd::HungUp {
                    turn_in_progress: false,
                    grace,
                });
            }
            if since.elapsed() >= grace {
                return Some(CallEnd::HungUp {
                    turn_in_progress: true,
                    grace,
                });
            }
        }
        if self.caller.is_none() && self.joined.elapsed() >= options.nobody_timeout {
            return Some(CallEnd::NobodySpoke(options.nobody_timeout));
        }
        if let (Some(_), Some(limit), None) =
            (&self.caller, options.media_timeout, self.muted_since)
        {
            if self.last_audio.elapsed() >= limit {
                return Some(CallEnd::MediaStopped(limit));
            }
        }
        if let (Some(since), Some(limit)) = (self.muted_since, options.muted_timeout) {
            if since.elapsed() >= limit {
                return Some(CallEnd::MutedTooLong(limit));
            }
        }
        if let (Some(first), Some(limit)) = (self.first_audio, options.max_length) {
            if first.elapsed() >= limit {
                return Some(CallEnd::TooLong(limit));
            }
        }
        if self.caller.is_some() && self.last_audio.elapsed() >= SILENCE_AFTER {
            let silence = vec![0.0; (SPEECH_RATE as f64 * TICK.as_secs_f64()) as usize];
            let _ = self.audio_tx.try_send(silence);
        }
        None
    }
}
