//! The turn's transcript taken the moment the caller stops speaking, while the end of the
//! turn is still being decided: its last words are the end-of-turn rules' second signal
//! (a question ends the turn at once, a trailing "and" keeps it open), and when the caller
//! says nothing more it is the turn's transcript, so none is left to take after the end.

use anyhow::Result;
use sublet_stt::Transcriber;
use sublet_turn_detect::{transcript_cue, TurnDetector};

/// A call's early transcripts, taken with the caller loop's Whisper context (the
/// responder's works on another thread).
#[derive(Default)]
pub(crate) struct EarlyTranscript {
    latest: Option<Early>,
}

/// The transcript of the turn as it stood at one stop.
struct Early {
    speech_end_s: f64,
    text: String,
}

impl EarlyTranscript {
    /// At a stop: transcribes the turn so far and gives the detector the words' cue.
    /// Returns the text (empty when the turn held no words).
    pub(crate) fn at_stop(
        &mut self,
        stt: &mut Transcriber,
        detector: &mut TurnDetector,
        speech_end_s: f64,
    ) -> Result<Option<&str>> {
        let Some(audio) = detector.turn_audio(speech_end_s) else {
            return Ok(None);
        };
        let text = stt.transcribe(&audio)?;
        detector.set_transcript_cue(speech_end_s, transcript_cue(&text));
        let early = self.latest.insert(Early { speech_end_s, text });
        Ok(Some(&early.text))
    }

    /// At the end of a turn whose speech ended at `speech_end_s`: the transcript taken at
    /// that stop (the turn's audio is the same).
    pub(crate) fn for_turn(&mut self, speech_end_s: f64) -> Option<String> {
        let early = self.latest.take()?;
        ((early.speech_end_s - speech_end_s).abs() < 1e-9).then_some(early.text)
    }
}
