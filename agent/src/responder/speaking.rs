//! What the agent says, put on the call's audio out in order: a reply's sentences (as the
//! reply's limit admits them), the fallback phrase of a failed turn, and the persona's
//! greeting as a live call begins (kept in the history as the agent's, so the model knows
//! it was said).

use std::time::Instant;

use sublet_audio::Audio;

use super::{remember_reply, AudioOut, Responder, Said, SpokenSentence};
use crate::turn_failure::TurnFailure;

/// The greeting's place among a call's turns: before the first (turns count from 1), so
/// a caller who talks over it cuts it as they would a reply.
const GREETING_TURN: usize = 0;

impl Responder {
    /// Says `AgentConfig::greeting`, if there is one. A greeting that cannot be synthesized
    /// is left out (the call goes on; the caller speaks first).
    pub(super) fn greet(&mut self, out: &mut dyn AudioOut) {
        let greeting = self.config.greeting.trim().to_owned();
        if greeting.is_empty() {
            return;
        }
        match self.speak(GREETING_TURN, &greeting, None, out, &|_| 0.0) {
            Ok(Some(_)) => remember_reply(&self.memory, GREETING_TURN, &greeting),
            Ok(None) => {}
            Err(failure) => {
                tracing::warn!(error = %failure.error, "the greeting could not be said")
            }
        }
    }

    /// Says the fallback phrase (synthesized once per call); the call time it went out.
    pub(super) fn say_fallback(
        &mut self,
        turn: usize,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Option<f64> {
        let phrase = self.config.fallback_phrase.clone();
        if phrase.is_empty() {
            return None;
        }
        if self.fallback_audio.is_none() {
            match self.voice.synthesize(&phrase) {
                Ok(audio) => self.fallback_audio = Some(audio),
                Err(e) => {
                    tracing::warn!(error = %e, "the fallback phrase could not be synthesized");
                    return None;
                }
            }
        }
        let audio = self.fallback_audio.clone();
        self.speak(turn, &phrase, audio, out, call_time)
            .ok()
            .flatten()
    }

    /// Says one sentence of a reply, made at `made_at`, unless the reply's limit ends it
    /// there; whether the reply may go on.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn say(
        &mut self,
        turn: usize,
        sentence: String,
        audio: Option<Audio>,
        made_at: Instant,
        said: &mut Said,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Result<bool, TurnFailure> {
        if !said.limit.admit(&sentence) {
            said.ended = true;
            return Ok(false);
        }
        if said.first_sentence_s.is_none() {
            said.first_sentence_s = Some(call_time(made_at));
            self.line.first_sentence_out();
        }
        let at = self.speak(turn, &sentence, audio, out, call_time)?;
        said.first_audio_s = said.first_audio_s.or(at);
        said.spoken.push(sentence);
        said.ended = said.limit.full();
        Ok(!said.ended)
    }

    /// Queues a sentence, synthesized unless its `audio` is given; returns the call time it
    /// was handed out.
    fn speak(
        &mut self,
        turn: usize,
        sentence: &str,
        audio: Option<Audio>,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Result<Option<f64>, TurnFailure> {
        let audio = match audio {
            Some(audio) => audio,
            None => self.synthesize(turn, sentence)?,
        };
        if audio.samples.is_empty() {
            return Ok(None);
        }
        let ready_s = call_time(Instant::now());
        let start_s = ready_s.max(self.speaking_until_s);
        out.play(
            start_s,
            &SpokenSentence {
                turn,
                text: sentence.trim(),
                audio: &audio,
            },
        );
        self.speaking_until_s = start_s + audio.duration_s();
        Ok(Some(ready_s))
    }
}
