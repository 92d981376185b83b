//! A live caller: audio that arrives as it is spoken (a LiveKit room, a microphone), turns
//! answered on a second thread while the caller's audio keeps coming, and the caller able
//! to talk over the agent (`barge_in.rs` decides; this file carries it out).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Result;
use sublet_audio::SPEECH_RATE;
use sublet_stt::Transcriber;
use sublet_turn_detect::TurnEvent;

use super::caller::{CallClock, Caller};
use super::observer::{CallObserver, Interruption, InterruptionOutcome, WordCheck};
use crate::barge_in::{BargeIn, BargeInAction, CallerSpeech};
use crate::playout::Playout;
use crate::record::TurnRecord;
use crate::responder::{ReplyCutter, TurnWork};
use crate::VoiceAgent;

/// Audio frames fed to the detector: 20 ms.
const FRAME: usize = SPEECH_RATE as usize / 50;
/// The caller's latest audio kept for checking an interruption's words.
const RECENT_S: f64 = 30.0;

impl VoiceAgent {
    /// Answers a live caller until `audio_in` closes. It delivers the caller's audio at
    /// 16 kHz, in pieces of any size, as it is spoken; the agent's speech is queued on
    /// `playout` as each sentence is ready, for whatever plays it to pull. Returns each
    /// answered turn.
    pub fn answer_live(
        &self,
        audio_in: mpsc::Receiver<Vec<f32>>,
        playout: &Playout,
        observer: &mut dyn CallObserver,
    ) -> Result<Vec<TurnRecord>> {
        let mut responder = self.new_responder()?;
        let checks_words =
            self.config.interruptions.enabled || self.config.partial_transcripts_s.is_some();
        let mut caller = Caller::new(self, &responder, CallClock::Audio, checks_words)?;
        let mut interruptions = Interruptions {
            rules: BargeIn::new(self.config.interruptions.clone()),
            cutter: responder.cutter(),
            caller_speech_s: None,
            speech_s: 0.0,
            stopped_s: 0.0,
            recent: VecDeque::new(),
            recent_start: 0,
            words_checked: None,
        };
        let mut consumed = 0usize;
        let (turns_tx, turns_rx) = mpsc::channel::<TurnWork>();
        // When the next partial transcript is due, while the caller speaks.
        let mut next_partial_s: Option<f64> = None;
        let (records_tx, records_rx) = mpsc::channel::<Result<Option<TurnRecord>>>();
        std::thread::scope(|scope| {
            let mut out = playout.writer();
            scope.spawn(move || {
                for work in turns_rx {
                    let _ = records_tx.send(responder.handle(work, &mut out));
                }
            });
            let mut records = Vec::new();
            let mut answered = |result: Result<Option<TurnRecord>>,
                                observer: &mut dyn CallObserver|
             -> Result<()> {
                if let Some(mut record) = result? {
                    // Its last sentence is queued: any silence inside it was heard by now.
                    record.reply_gap_s = playout.longest_gap_s(record.index);
                    observer.turn_answered(&record);
                    records.push(record);
                }
                Ok(())
            };
            let mut send = |work: TurnWork| -> Result<()> { Ok(turns_tx.send(work)?) };
            let mut pending = Vec::new();
            for mut piece in audio_in.iter() {
                if let CallClock::Audio = caller.clock {
                    // Call time starts with the caller's first audio, as the detector's
                    // clock does. Audio may have queued up while the models loaded: the
                    // call began that long ago, on the caller's clock.
                    while let Ok(more) = audio_in.try_recv() {
                        piece.extend(more);
                    }
                    let queued = Duration::from_secs_f64(piece.len() as f64 / SPEECH_RATE as f64);
                    caller.clock = CallClock::Wall(
                        Instant::now()
                            .checked_sub(queued)
                            .unwrap_or_else(Instant::now),
                    );
                    // Someone is there: the agent greets them, if it has a greeting.
                    if !self.config.greeting.trim().is_empty() {
                        send(TurnWork::Greet)?;
                    }
                }
                pending.extend_from_slice(&piece);
                while pending.len() >= FRAME {
                    let frame: Vec<f32> = pending.drain(..FRAME).collect();
                    consumed += FRAME;
                    interruptions.remember(&frame);
                    caller.push(
                        &frame,
                        observer,
                        &mut |event| interruptions.turn_event(event),
                        &mut send,
                    )?;
                    let now_s = consumed as f64 / SPEECH_RATE as f64;
                    interruptions.step(now_s, &mut caller, playout, observer)?;
                    if let (Some(every_s), Some(since_s)) = (
                        self.config.partial_transcripts_s,
                        interruptions.caller_speech_s,
                    ) {
                        let due = *next_partial_s.get_or_insert(since_s + every_s);
                        if now_s >= due {
                            // A partial transcript only shows the caller's words early: one
                            // that fails is skipped, the call goes on.
                            match interruptions.transcribe_since(caller.stt.as_deref_mut(), since_s)
                            {
                                Ok(text) => observer.partial_transcript(&text),
                                Err(e) => tracing::warn!("a partial transcript failed: {e:#}"),
                            }
                            next_partial_s = Some(now_s + every_s);
                        }
                    } else {
                        next_partial_s = None;
                    }
                }
                while let Ok(result) = records_rx.try_recv() {
                    answered(result, observer)?;
                }
            }
            drop(turns_tx);
            for result in records_rx {
                answered(result, observer)?;
            }
            Ok(records)
        })
    }
}

/// Carries out the barge-in rules on a live call.
struct Interruptions {
    rules: BargeIn,
    cutter: ReplyCutter,
    /// When the caller's current speech began.
    caller_speech_s: Option<f64>,
    /// The interruption in progress: when its speech began and the agent's audio stopped.
    speech_s: f64,
    stopped_s: f64,
    /// The caller's latest audio, from sample `recent_start` of the call.
    recent: VecDeque<f32>,
    recent_start: usize,
    /// How the interruption in progress had its words checked.
    words_checked: Option<WordCheck>,
}

impl Interruptions {
    fn remember(&mut self, frame: &[f32]) {
        self.recent.extend(frame);
        let limit = (RECENT_S * SPEECH_RATE as f64) as usize;
        while self.recent.len() > limit {
            self.recent.pop_front();
            self.recent_start += 1;
        }
    }

    fn turn_event(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::SpeechStarted { at_s } => {
                self.caller_speech_s.get_or_insert(*at_s);
            }
            TurnEvent::SpeechStopped { .. } | TurnEvent::EndOfTurn { .. } => {
                self.caller_speech_s = None
            }
        }
    }

    /// What the caller said since `since_s`, from the audio kept.
    fn transcribe_since(&self, stt: Option<&mut Transcriber>, since_s: f64) -> Result<String> {
        let from = ((since_s * SPEECH_RATE as f64) as usize)
            .saturating_sub(self.recent_start)
            .min(self.recent.len());
        let audio: Vec<f32> = self.recent.range(from..).copied().collect();
        match stt {
            Some(stt) => stt.transcribe(&audio),
            None => Ok(String::new()),
        }
    }

    fn step(
        &mut self,
        now_s: f64,
        caller: &mut Caller,
        playout: &Playout,
        observer: &mut dyn CallObserver,
    ) -> Result<()> {
        let voiced_until_s = caller.detector.voiced_until_s();
        let speech = self.caller_speech_s.map(|started_s| CallerSpeech {
            started_s,
            voiced_until_s: voiced_until_s.unwrap_or(started_s).max(started_s),
        });
        let mut action = self.rules.on_frame(now_s, speech, playout.speaking());
        while let Some(next) = action.take() {
            match next {
                BargeInAction::Pause => {
                    self.words_checked = None;
                    playout.pause();
                    self.stopped_s = now_s;
                    self.speech_s = self.caller_speech_s.unwrap_or(now_s);
                }
                BargeInAction::CheckWords { since_s } => {
                    let words = match (caller.early_words(since_s)?, caller.stt.as_mut()) {
                        (Some(words), _) => {
                            self.words_checked = Some(WordCheck::EarlyTranscript);
                            words
                        }
                        (None, Some(stt)) => {
                            self.words_checked = Some(WordCheck::OwnTranscript);
                            !self.transcribe_since(Some(stt), since_s)?.trim().is_empty()
                        }
                        (None, None) => true,
                    };
                    action = self.rules.on_words(words);
                }
                BargeInAction::Resume => {
                    playout.resume();
                    observer.interruption(&Interruption {
                        speech_s: self.speech_s,
                        stopped_s: self.stopped_s,
                        outcome: InterruptionOutcome::Resumed,
                        words_checked: self.words_checked.take(),
                    });
                }
                BargeInAction::Cut => {
                    if !playout.pending() || playout.speaking() {
                        // Cut without a pause first: the audio stops now.
                        self.stopped_s = now_s;
                        self.speech_s = self.caller_speech_s.unwrap_or(now_s);
                    }
                    for (turn, heard) in playout.cut() {
                        self.cutter.cut(turn, &heard);
                        observer.interruption(&Interruption {
                            speech_s: self.speech_s,
                            stopped_s: self.stopped_s,
                            outcome: InterruptionOutcome::Cut { turn, heard },
                            words_checked: self.words_checked,
                        });
                    }
                    self.words_checked = None;
                }
            }
        }
        Ok(())
    }
}
