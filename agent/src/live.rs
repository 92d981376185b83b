//! A live caller: audio that arrives as it is spoken (a LiveKit room, a microphone), turns
//! answered on a second thread while the caller's audio keeps coming.

use std::sync::mpsc;
use std::time::Instant;

use anyhow::Result;
use sublet_audio::SPEECH_RATE;
use sublet_turn_detect::TurnEvent;

use crate::call::CallObserver;
use crate::record::TurnRecord;
use crate::responder::{AudioOut, FinishedTurn};
use crate::VoiceAgent;

/// Audio frames fed to the detector: 20 ms.
const FRAME: usize = SPEECH_RATE as usize / 50;

impl VoiceAgent {
    /// Answers a live caller until `audio_in` closes. It delivers the caller's audio at
    /// 16 kHz, in pieces of any size, as it is spoken; the agent's speech goes to `out` as
    /// each sentence is ready. Returns each answered turn.
    pub fn answer_live(
        &self,
        audio_in: mpsc::Receiver<Vec<f32>>,
        mut out: Box<dyn AudioOut + Send>,
        observer: &mut dyn CallObserver,
    ) -> Result<Vec<TurnRecord>> {
        let mut detector = self.new_detector()?;
        let mut responder = self.new_responder()?;
        let hint = self.config.turn_hints.then(|| responder.turn_hint());
        // Call time starts with the caller's first audio, as the detector's does.
        let mut started: Option<Instant> = None;
        let (turns_tx, turns_rx) = mpsc::channel::<FinishedTurn>();
        let (records_tx, records_rx) = mpsc::channel::<Result<Option<TurnRecord>>>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for turn in turns_rx {
                    let _ = records_tx.send(responder.respond(turn, &mut *out));
                }
            });
            let mut records = Vec::new();
            let mut answered = |result: Result<Option<TurnRecord>>,
                                observer: &mut dyn CallObserver|
             -> Result<()> {
                if let Some(record) = result? {
                    observer.turn_answered(&record);
                    records.push(record);
                }
                Ok(())
            };
            let mut pending = Vec::new();
            for piece in audio_in {
                let started = *started.get_or_insert_with(Instant::now);
                pending.extend_from_slice(&piece);
                while pending.len() >= FRAME {
                    let frame: Vec<f32> = pending.drain(..FRAME).collect();
                    for event in detector.push(&frame)? {
                        observer.turn_event(&event);
                        if let (TurnEvent::SpeechStopped { .. }, Some(hint)) = (&event, &hint) {
                            hint.send()?;
                        }
                        if let TurnEvent::EndOfTurn {
                            speech_end_s,
                            end_of_turn_score,
                            audio,
                            ..
                        } = event
                        {
                            turns_tx.send(FinishedTurn {
                                caller_stop_s: speech_end_s,
                                end_of_turn_s: started.elapsed().as_secs_f64(),
                                judged_at: Instant::now(),
                                end_of_turn_score,
                                audio,
                            })?;
                        }
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
