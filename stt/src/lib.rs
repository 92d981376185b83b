//! Speech to text: whisper.cpp (through whisper-rs) on the audio of one finished turn.
//!
//! The model is Whisper tiny.en, converted by `cargo xtask setup` from the CTranslate2
//! weights that ship in a registry package into whisper.cpp's ggml file.

mod model_file;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use sublet_models::ModelCache;
use whisper_rs::{
    FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters, WhisperState,
};

pub use model_file::{check_ggml, prepare_model};

/// Encoder frames (20 ms each) kept beyond the audio's own length. With 64 the decoder
/// looped on one of the demo call's turns; 128 (2.56 s) did not.
const AUDIO_CTX_MARGIN: i32 = 128;
/// Past this much audio the margin also grows by [`LONG_MARGIN_PCT`] of the audio's own
/// frames. A dictated phone number (7.1 s) looped at 128 (then 1.7 s to decode again with
/// the whole window) and came out whole at 192 and with this rule (0.37 s); the other 27
/// stops of the latency calls came out word for word the same. Shorter audio keeps 128:
/// at 192 "I need to call my sister and" (2 s) lost its "and", a cue that the caller goes on.
const LONG_AUDIO_S: f64 = 4.0;
const LONG_MARGIN_PCT: i32 = 30;
/// The margin a transcript that looped anyway is decoded again with, before the whole
/// window: for 7 s of audio on one thread, 0.4 s against the whole window's 1.7 s.
const RETRY_AUDIO_CTX_MARGIN: i32 = 256;
/// Whisper's whole 30 s window.
const FULL_AUDIO_CTX: i32 = 1500;
/// Tokens a second of speech can need, generously (six words a second, some split).
const MAX_TOKENS_PER_S: f64 = 10.0;
/// Audio this long or longer is decoded with timestamps, segment by segment. Without them
/// audio that fills Whisper's window (a turn at the 30 s cap, with its padding) came out as
/// its last sentence alone, with both the f16 and the Q8_0 weights; at 8-29 s it came out
/// whole either way. With timestamps it came out whole, in about twice the time.
const LONG_FORM_S: f64 = 28.0;

/// A loaded Whisper model, shared: every [`Transcriber`] made from it decodes with a state
/// of its own over the same weights, so calls do not each load the model.
#[derive(Clone)]
pub struct SpeechModel(Arc<WhisperContext>);

impl SpeechModel {
    pub fn load(cache: &ModelCache) -> Result<Self> {
        Self::from_file(&cache.whisper_ggml()?)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::Whisper);
        // whisper.cpp logs every load step to stderr; route it to nothing.
        whisper_rs::install_logging_hooks();
        let path_str = path.to_str().context("model path is not UTF-8")?;
        let context =
            WhisperContext::new_with_params(path_str, WhisperContextParameters::default())
                .with_context(|| format!("loading Whisper model {}", path.display()))?;
        Ok(Self(Arc::new(context)))
    }

    /// A transcriber of its own (one transcription at a time) over this model.
    pub fn transcriber(&self) -> Result<Transcriber> {
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::Whisper);
        let state = self.0.create_state().context("creating Whisper state")?;
        // One thread unless `SUBLET_STT_THREADS` says otherwise: whisper.cpp's threads wait
        // for each other by spinning, and beside an engine that keeps every core busy a
        // 2-thread transcription took 30–45 s instead of 0.3 s (measured by `bench`).
        let threads = std::env::var("SUBLET_STT_THREADS")
            .ok()
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|n| *n >= 1)
            .unwrap_or(1);
        Ok(Transcriber { state, threads })
    }
}

/// A Whisper decoding state over a loaded model (one transcription at a time).
pub struct Transcriber {
    // The state borrows the model's weights through a shared handle inside whisper-rs.
    state: WhisperState,
    threads: i32,
}

impl Transcriber {
    /// Loads the model for this transcriber alone (see [`SpeechModel`] to share it).
    pub fn load(cache: &ModelCache) -> Result<Self> {
        SpeechModel::load(cache)?.transcriber()
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        SpeechModel::from_file(path)?.transcriber()
    }

    /// The text spoken in 16 kHz mono audio, trimmed; empty for silence.
    pub fn transcribe(&mut self, audio: &[f32]) -> Result<String> {
        let text = self.transcribe_until(audio, None)?;
        Ok(text.expect("a transcription with no stop flag runs to its end"))
    }

    /// As [`Transcriber::transcribe`], but gives up as soon as `stop` is set (whisper.cpp
    /// looks between the model's operations, so within milliseconds): `None` when it did.
    /// For work started on a guess, such as a turn's transcript before its end is certain.
    pub fn transcribe_until(
        &mut self,
        audio: &[f32],
        stop: Option<&Arc<AtomicBool>>,
    ) -> Result<Option<String>> {
        // Whisper needs at least one second; pad short turns with silence.
        let mut padded;
        let audio = if audio.len() < 16_000 {
            padded = audio.to_vec();
            padded.resize(16_000 + 1_600, 0.0);
            &padded[..]
        } else {
            audio
        };
        // Whisper encodes 30 s windows (1500 frames, 50 a second) whatever the audio's
        // length; a voice turn lasts a few seconds, so encode only what it needs plus a
        // margin: most of the transcription time on CPU. A shortened window now and then
        // sends the decoder into a loop; that transcript is redone with the full window.
        let seconds = audio.len() as f64 / 16_000.0;
        let frames = |margin: i32| {
            let speech = (seconds * 50.0).ceil() as i32;
            let growth = if seconds > LONG_AUDIO_S {
                speech * LONG_MARGIN_PCT / 100
            } else {
                0
            };
            (speech + margin + growth).min(FULL_AUDIO_CTX)
        };
        let Some(mut text) = self.run(audio, frames(AUDIO_CTX_MARGIN), seconds, stop)? else {
            return Ok(None);
        };
        if !looks_like_a_loop(&text, seconds) {
            return Ok(Some(text));
        }
        // A loop that only repeats its opening words is those words said once; anything
        // else is decoded again with a wider window, then with the whole window (seconds
        // on one thread).
        if let Some(once) = said_once(&text) {
            return Ok(Some(once));
        }
        let mut tried = frames(AUDIO_CTX_MARGIN);
        for audio_ctx in [frames(RETRY_AUDIO_CTX_MARGIN), FULL_AUDIO_CTX] {
            if audio_ctx <= tried {
                continue;
            }
            let Some(again) = self.run(audio, audio_ctx, seconds, stop)? else {
                return Ok(None);
            };
            text = again;
            if !looks_like_a_loop(&text, seconds) {
                break;
            }
            tried = audio_ctx;
        }
        Ok(Some(text))
    }

    /// One decoding; `None` when `stop` was set before it ended.
    fn run(
        &mut self,
        audio: &[f32],
        audio_ctx: i32,
        seconds: f64,
        stop: Option<&Arc<AtomicBool>>,
    ) -> Result<Option<String>> {
        let stopped = || stop.is_some_and(|flag| flag.load(Ordering::Relaxed));
        if stopped() {
            return Ok(None);
        }
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::Whisper);
        let mut params = FullParams::new(SamplingStrategy::Greedy { best_of: 1 });
        params.set_n_threads(self.threads);
        params.set_language(Some("en"));
        params.set_translate(false);
        params.set_no_context(true);
        let long_form = seconds >= LONG_FORM_S;
        params.set_single_segment(!long_form);
        params.set_print_progress(false);
        params.set_print_realtime(false);
        params.set_print_special(false);
        params.set_print_timestamps(false);
        params.set_suppress_blank(true);
        params.set_no_timestamps(!long_form);
        params.set_audio_ctx(audio_ctx);
        // No one says more than about six words a second: a decoder loop stops there
        // instead of running to the window's 224 tokens, and no temperature fallback
        // decodes it again and again (a loop is handled above, once). Long-form segments
        // are bounded by their timestamps.
        if !long_form {
            params.set_max_tokens((seconds * MAX_TOKENS_PER_S).ceil() as i32 + 16);
        }
        params.set_temperature_inc(0.0);
        if let Some(flag) = stop {
            // Not whisper-rs's `set_abort_callback_safe`: in 0.16 its trampoline reads the
            // boxed closure as the closure itself (and leaks the box).
            // SAFETY: the callback only reads an AtomicBool through the pointer, and `flag`
            // (borrowed for the whole of this call) outlives `full` below.
            unsafe {
                params.set_abort_callback(Some(stop_requested));
                params.set_abort_callback_user_data(Arc::as_ptr(flag).cast_mut().cast());
            }
        }
        let outcome = self.state.full(params, audio);
        // An abort surfaces as a failed encode or decode; the flag tells it apart.
        if stopped() {
            return Ok(None);
        }
        outcome.context("Whisper transcription failed")?;
        let mut text = String::new();
        for segment in self.state.as_iter() {
            text.push_str(&segment.to_str_lossy()?);
            text.push(' ');
        }
        Ok(Some(clean(&text)))
    }
}

/// whisper.cpp's abort callback: whether the [`AtomicBool`] behind `flag` is set.
unsafe extern "C" fn stop_requested(flag: *mut std::ffi::c_void) -> bool {
    // SAFETY: `Transcriber::run` passes a live AtomicBool's address and keeps it alive
    // until whisper.cpp returns.
    unsafe { (*flag.cast::<AtomicBool>()).load(Ordering::Relaxed) }
}

/// A decoder loop: more words than anyone says in the time, or a run of five words said
/// twice over.
fn looks_like_a_loop(text: &str, seconds: f64) -> bool {
    let words = plain_words(text);
    if words.len() as f64 > 6.0 * seconds + 8.0 {
        return true;
    }
    let runs: Vec<&[String]> = words.windows(5).collect();
    runs.iter()
        .enumerate()
        .any(|(i, run)| runs[i + 1..].contains(run))
}

/// `text` as its opening words said once, when the rest only repeats them (the last
/// repeat may be cut short): "What is 2 plus 2? What is 2 plus 2? What is" → "What is 2
/// plus 2?". At least three words, repeated at least once in full.
fn said_once(text: &str) -> Option<String> {
    let original: Vec<&str> = text.split_whitespace().collect();
    let words = plain_words(text);
    (3..=words.len() / 2)
        .find(|&k| words.iter().enumerate().all(|(i, w)| *w == words[i % k]))
        .map(|k| original[..k].join(" "))
}

/// The words of `text`, lower-cased, without the punctuation around them.
fn plain_words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect()
}

/// Whisper marks non-speech as `[BLANK_AUDIO]`, `(music)` and the like; those are not words.
fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0i32;
    for ch in text.chars() {
        match ch {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = (depth - 1).max(0),
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Word error rate of `hypothesis` against `reference`, after lower-casing and dropping
/// punctuation: (substitutions + deletions + insertions) / reference words.
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let words = |s: &str| -> Vec<String> {
        s.split_whitespace()
            .map(|w| {
                w.chars()
                    .filter(|c| c.is_alphanumeric() || *c == '\'')
                    .collect::<String>()
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    let (r, h) = (words(reference), words(hypothesis));
    if r.is_empty() {
        return if h.is_empty() { 0.0 } else { 1.0 };
    }
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut cur = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[h.len()] as f64 / r.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_error_rate_counts_edits() {
        assert_eq!(word_error_rate("The cat sat.", "the cat sat"), 0.0);
        assert!((word_error_rate("a b c d", "a x c") - 0.5).abs() < 1e-9);
        assert!((word_error_rate("a b", "a b c d") - 1.0).abs() < 1e-9);
    }

    #[test]
    fn decoder_loops_are_recognised() {
        let said = "The weather today is sunny with a light breeze from the west.";
        assert!(!looks_like_a_loop(said, 3.5));
        assert!(looks_like_a_loop(&format!("{said} {said}"), 3.5));
        assert!(looks_like_a_loop(&"go ".repeat(40), 3.0));
        assert!(!looks_like_a_loop("no, no, no, no, I said no", 2.0));
    }

    #[test]
    fn a_loop_of_the_opening_words_is_those_words_once() {
        let looped = "What is 2 plus 2? What is 2 plus 2? What is 2 plus";
        assert_eq!(said_once(looped).as_deref(), Some("What is 2 plus 2?"));
        assert_eq!(said_once("What is 2 plus 2? What is 3 plus 3?"), None);
        assert_eq!(said_once("What is 2 plus 2?"), None);
    }

    #[test]
    fn non_speech_marks_are_dropped() {
        assert_eq!(clean(" [BLANK_AUDIO] "), "");
        assert_eq!(clean(" Hello (laughs) there."), "Hello there.");
    }
}
