//! The voice agent: the pipeline that turns a caller's audio into spoken replies.
//!
//! ```text
//! audio ─► turn-detect ─► (end of turn) ─► stt ─► engine ─► sentence splitter ─► tts ─► audio
//! ```
//!
//! - [`sentence`]: the streaming sentence splitter (pure);
//! - [`record`]: each turn's stage times and the table of them;
//! - [`responder`]: one finished turn answered, stage by stage;
//! - `history.rs`: a call's conversation so far, as the caller heard it;
//! - `turn_failure.rs`: a turn's failure kept to the turn (its outcome, the deadline,
//!   injected faults);
//! - [`call`]: one call: what it tells its observer (`observer.rs`), the caller's side of
//!   every call (`caller.rs`: detector, early transcript, and the [`dispatch`] rules, pure,
//!   that turn events into the responder's work and turn hints), a live caller answered
//!   while their audio keeps coming (`live.rs`), a recorded call played in real time as a
//!   live one or fast, turn by turn (`recorded.rs`);
//! - `early_transcript.rs`: the turn transcribed as the caller stops, for the end-of-turn
//!   rules and the reply;
//! - [`barge_in`]: when the caller talking over the agent stops it (pure rules);
//! - [`playout`]: the agent's speech queued for real-time playing, pausable and cut short;
//! - [`persona`]: who the agent is (instructions, greeting, fallback phrase, voice), from a
//!   TOML file;

pub mod allocator;
pub mod barge_in;
pub mod call;
pub mod call_log;
pub mod dispatch;
mod early_transcript;
mod history;
pub mod models;
pub mod persona;
pub mod playout;
mod pool;
pub mod record;
pub mod responder;
pub mod sentence;
mod turn_failure;
pub mod unspoken;

use std::sync::{Arc, OnceLock};

use anyhow::Result;
use sublet_engine::memory::heap_taken_by;
use sublet_engine::{Engine, EngineConfig, Repetition};
use sublet_models::ModelCache;
use sublet_stt::{SpeechModel, Transcriber};
use sublet_tts::Voice;
use sublet_turn_detect::{EndpointConfig, TurnDetector};

use pool::Pool;

pub use barge_in::InterruptionConfig;
pub use call::{
    CallObserver, CallOutcome, Echo, Interruption, InterruptionOutcome, Pacing, Quiet, ReplyTrack,
    WordCheck,
};
pub use early_transcript::EARLY_TRANSCRIPT_AFTER_S;
pub use persona::{Persona, VoiceSettings};
pub use playout::Playout;
pub use pool::{Pooled, KEPT_IDLE};
pub use record::{clip, stage_medians, turn_table, TurnOutcome, TurnRecord, STAGE_NAMES};
pub use responder::{
    AudioOut, FinishedTurn, ReplyCutter, Responder, SpokenSentence, TurnHint, TurnWork,
};
pub use turn_failure::TurnFaults;

/// How the agent behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub system_prompt: String,
    pub max_reply_tokens: usize,
    /// Most sentences a reply speaks; a reply also ends at its first repeated sentence
    /// ([`sentence::ReplyLimit`]). Its generation is then cancelled, and only what was said
    /// goes into the history.
    pub max_reply_sentences: usize,
    /// Speak a long first sentence from its first clause (a comma after this many words),
    /// so its synthesis starts before the sentence is complete. `None`: whole sentences.
    pub first_clause_words: Option<usize>,
    /// What keeps a reply from looping or saying the caller's words back: DRY at 0.8 by
    /// default (a small model greedy-decoding otherwise repeats "fine, fine, fine, …" to
    /// the token cap).
    pub repetition: Repetition,
    /// Past messages (both sides) sent with each turn.
    pub history_messages: usize,
    pub endpoint: EndpointConfig,
    /// Send the engine a one-token turn hint when the caller stops speaking, and again
    /// when an unsure stop's end of turn is decided (it can wait 3 s); with preemptive
    /// generation the early reply is the hint, and the engine hears only that the caller
    /// went quiet, when the early transcript starts (small steps, no request). Off by
    /// default until the engine's scheduler acts on it: alone, on 2 cores, the hint's
    /// prefill competes with the transcription (about +150 ms voice to voice measured).
    pub turn_hints: bool,
    /// How the caller can talk over the agent (live calls).
    pub interruptions: InterruptionConfig,
    /// Start the reply as soon as the caller stops speaking, before the end of their turn is
    /// certain; keep it if the turn ends there, cancel it in the engine if they go on (live
    /// calls). On by default, as in LiveKit Agents: a stop the turn detector is unsure of
    /// waits 1.3 s, and the reply is ready when it ends (`cargo xtask latency`).
    pub preemptive_generation: bool,
    /// Transcribe the turn the moment the caller stops speaking, before its end is decided:
    /// the words' cue joins the end-of-turn rules (`sublet_turn_detect::transcript_cue`),
    /// and the transcript serves the turn when the caller says nothing more. It runs on a
    /// Whisper context and thread of its own.
    pub early_transcript: bool,
    /// Seconds of quiet after the caller's last speech at which the early transcript starts
    /// (the rest of the turn's padding as silence; called off if the caller goes on). 0.1 s
    /// by default: four of the VAD's 32 ms frames (it was 0.25 s: the whole padding).
    pub early_transcript_after_s: f64,
    /// Transcribe the caller's words while they speak, every this many seconds of speech,
    /// for a live view ([`CallObserver::partial_transcript`]); each costs a transcription.
    pub partial_transcripts_s: Option<f64>,
    /// A reply whose first sentence is not ready this long after the end of the turn is
    /// given up (its request cancelled) and the fallback phrase said: a caller who hears
    /// nothing for longer hangs up. 8 s by default: ten times a loaded turn's usual wait.
    /// `None`: wait as long as the reply takes.
    pub reply_deadline_s: Option<f64>,
    /// What the agent says when a turn fails before any of its reply was said (a
    /// transcript, engine or synthesis failure, a late reply); the call goes on. Empty:
    /// say nothing.
    pub fallback_phrase: String,
    /// What the agent says as a live call begins, once the caller's audio arrives (a
    /// persona's greeting). Empty by default: the agent waits for the caller.
    pub greeting: String,
    /// How the agent's voice sounds (a persona's); the voice's own by default.
    pub voice: VoiceSettings,
    /// Faults injected into chosen turns (tests, the soak). None by default.
    pub faults: TurnFaults,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            system_prompt:
                "You are a helpful voice assistant on a phone call. Answer in one or two short, \
                            plain spoken sentences. Do not use lists, markdown or emoji."
                    .into(),
            max_reply_tokens: 48,
            max_reply_sentences: 2,
            first_clause_words: Some(4),
            repetition: Repetition {
                dry_multiplier: Some(0.8),
                ..Repetition::default()
            },
            history_messages: 6,
            endpoint: EndpointConfig::default(),
            turn_hints: false,
            interruptions: InterruptionConfig::default(),
            preemptive_generation: true,
            early_transcript: true,
            early_transcript_after_s: EARLY_TRANSCRIPT_AFTER_S,
            partial_transcripts_s: None,
            reply_deadline_s: Some(8.0),
            fallback_phrase: "Sorry, could you say that again?".into(),
            greeting: String::new(),
            voice: VoiceSettings::default(),
            faults: TurnFaults::default(),
        }
    }
}

/// The shared parts (the engine, the model cache, the speech model once loaded) from which
/// calls are made.
pub struct VoiceAgent {
    pub cache: ModelCache,
    pub engine: Arc<Engine>,
    pub config: AgentConfig,
    /// Whisper, loaded by the first call that needs it and shared by every call after: a
    /// call loads none of its own (each made two or three copies, a soak's resident
    /// memory growing with every call).
    speech: Arc<OnceLock<SpeechModel>>,
    memory: Arc<std::sync::Mutex<SpeechMemory>>,
    /// Each call's own models, kept loaded between calls ([`pool`]).
    voices: Pool<Voice>,
    detectors: Pool<TurnDetector>,
    transcribers: Pool<Transcriber>,
}

/// Each call's models loaded and idle ([`VoiceAgent::idle_models`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdleModels {
    pub voices: usize,
    pub detectors: usize,
    pub transcribers: usize,
}

/// The heap each speech model took at its latest load (`None` before it, or off glibc):
/// measured around the load, so a call starting meanwhile beside others reads high.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpeechMemory {
    /// Whisper (whisper.cpp), loaded once and shared by every call.
    pub whisper_bytes: Option<u64>,
    /// Silero VAD and Smart Turn (ONNX Runtime), loaded for a call that finds none idle.
    pub turn_detector_bytes: Option<u64>,
    /// Piper (ONNX Runtime) and its phonemizer, loaded for a call that finds none idle.
    pub voice_bytes: Option<u64>,
}

impl VoiceAgent {
    /// Loads the bundled engine model from the cache.
    pub fn load(cache: ModelCache, config: AgentConfig) -> Result<Self> {
        let engine = Arc::new(Engine::load(&EngineConfig::from_cache(&cache)?)?);
        Ok(Self::with_engine(cache, engine, config))
    }

    pub fn with_engine(cache: ModelCache, engine: Arc<Engine>, config: AgentConfig) -> Self {
        Self {
            cache,
            engine,
            config,
            speech: Arc::default(),
            memory: Arc::default(),
            voices: Pool::default(),
            detectors: Pool::default(),
            transcribers: Pool::default(),
        }
    }

    /// The same agent with another configuration, sharing its engine and models.
    pub fn with_config(&self, config: AgentConfig) -> Self {
        Self {
            cache: self.cache.clone(),
            engine: self.engine.clone(),
            config,
            speech: self.speech.clone(),
            memory: self.memory.clone(),
            voices: self.voices.clone(),
            detectors: self.detectors.clone(),
            transcribers: self.transcribers.clone(),
        }
    }

    /// A transcriber of the call's own over the shared speech model.
    pub(crate) fn transcriber(&self) -> Result<Pooled<Transcriber>> {
        self.transcribers.take(|| {
            let model = match self.speech.get() {
                Some(model) => model,
                None => {
                    let (loaded, bytes) = heap_taken_by(|| SpeechModel::load(&self.cache));
                    self.note_memory(|m| m.whisper_bytes = bytes);
                    let loaded = loaded?;
                    self.speech.get_or_init(|| loaded)
                }
            };
            model.transcriber()
        })
    }

    /// A turn detector for a new caller, one an earlier call left if any.
    pub fn new_detector(&self) -> Result<Pooled<TurnDetector>> {
        let mut detector = self.detectors.take(|| {
            let (detector, bytes) =
                heap_taken_by(|| TurnDetector::load(&self.cache, self.config.endpoint.clone()));
            self.note_memory(|m| m.turn_detector_bytes = bytes);
            detector
        })?;
        // A kept one heard another call, perhaps under another copy's endpoint settings.
        detector.reset(self.config.endpoint.clone());
        Ok(detector)
    }

    /// How many of each call's models are loaded and idle, waiting for a call.
    pub fn idle_models(&self) -> IdleModels {
        IdleModels {
            voices: self.voices.idle(),
            detectors: self.detectors.idle(),
            transcribers: self.transcribers.idle(),
        }
    }

    /// What the speech models took at their latest loads.
    pub fn speech_memory(&self) -> SpeechMemory {
        *self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note_memory(&self, note: impl FnOnce(&mut SpeechMemory)) {
        note(&mut self.memory.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A replier for a new call (its own transcriber, voice and chat history).
    pub fn new_responder(&self) -> Result<Responder> {
        let mut voice = self.voices.take(|| {
            let (voice, bytes) = heap_taken_by(|| Voice::load(&self.cache));
            self.note_memory(|m| m.voice_bytes = bytes);
            voice
        })?;
        let own = voice.default_prosody();
        let settings = self.config.voice;
        voice.set_prosody(sublet_tts::Prosody {
            length_scale: settings.length_scale.unwrap_or(own.length_scale),
            noise_scale: settings.noise_scale.unwrap_or(own.noise_scale),
        });
        Ok(Responder::new(
            self.transcriber()?,
            voice,
            self.engine.clone(),
            self.config.clone(),
        ))
    }
}
