//! The reply to one finished turn: transcript → engine → sentences → speech, each stage
//! timed. Sentences are spoken as soon as they are complete, while the engine goes on.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use sublet_audio::Audio;
use sublet_engine::{ChatRequest, Engine, Message, Role, StreamEvent, VOICE_PRIORITY};
use sublet_stt::Transcriber;
use sublet_tts::Voice;

use crate::record::TurnRecord;
use crate::sentence::SentenceSplitter;
use crate::AgentConfig;

/// A caller turn the detector judged over.
#[derive(Debug, Clone)]
pub struct FinishedTurn {
    pub caller_stop_s: f64,
    /// Call time at which the turn was judged over.
    pub end_of_turn_s: f64,
    /// The same moment on this machine's clock: later stages are timed from it.
    pub judged_at: Instant,
    pub end_of_turn_score: Option<f32>,
    /// The caller's audio for the turn, 16 kHz.
    pub audio: Vec<f32>,
}

/// Where the agent's speech goes: a file, a speaker, a WebRTC track.
pub trait AudioOut {
    /// Plays `audio` starting at call time `at_s` (never earlier than the previous audio ends).
    fn play(&mut self, at_s: f64, audio: &Audio);
}

/// One call's replier: its models and its chat history.
pub struct Responder {
    stt: Transcriber,
    voice: Voice,
    engine: Arc<Engine>,
    config: AgentConfig,
    /// Both sides of the call so far; shared with the call's [`TurnHint`].
    history: Arc<Mutex<Vec<Message>>>,
    turns: usize,
    /// Call time at which the agent's audio queued so far ends.
    speaking_until_s: f64,
    /// This call's session id in the engine.
    call_id: u64,
}

/// Numbers the calls of this process, for the engine's sessions.
static NEXT_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Responder {
    pub fn new(stt: Transcriber, voice: Voice, engine: Arc<Engine>, config: AgentConfig) -> Self {
        Self {
            stt,
            voice,
            engine,
            config,
            history: Arc::new(Mutex::new(Vec::new())),
            turns: 0,
            speaking_until_s: 0.0,
            call_id: NEXT_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A handle that sends this call's turn hint from another thread.
    pub fn turn_hint(&self) -> TurnHint {
        TurnHint {
            engine: self.engine.clone(),
            call_id: self.call_id,
            system_prompt: self.config.system_prompt.clone(),
            history_messages: self.config.history_messages,
            history: self.history.clone(),
        }
    }

    /// Replies to a turn. `None` when the turn held no words (a noise, a cough).
    pub fn respond(
        &mut self,
        turn: FinishedTurn,
        out: &mut dyn AudioOut,
    ) -> Result<Option<TurnRecord>> {
        let call_time =
            |at: Instant| turn.end_of_turn_s + at.duration_since(turn.judged_at).as_secs_f64();
        let transcript = self.stt.transcribe(&turn.audio)?;
        let transcript_s = call_time(Instant::now());
        if transcript.is_empty() {
            return Ok(None);
        }
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Message::new(Role::User, transcript.clone()));
        let messages = self.turn_hint().conversation();
        let mut stream = self.engine.chat(ChatRequest {
            priority: VOICE_PRIORITY,
            session: Some(self.call_id),
            ..ChatRequest::new(messages, self.config.max_reply_tokens)
        })?;

        let mut splitter = SentenceSplitter::new();
        let mut reply = String::new();
        let (mut first_token_s, mut first_sentence_s, mut first_audio_s) = (None, None, None);
        while let Some(event) = stream.next_blocking() {
            match event.context("engine reply")? {
                StreamEvent::Text(text) => {
                    first_token_s.get_or_insert_with(|| call_time(Instant::now()));
                    reply.push_str(&text);
                    for sentence in splitter.push(&text) {
                        first_sentence_s.get_or_insert_with(|| call_time(Instant::now()));
                        let at = self.speak(&sentence, out, &call_time)?;
                        first_audio_s = first_audio_s.or(at);
                    }
                }
                StreamEvent::Done(_) => break,
            }
        }
        if let Some(rest) = splitter.finish() {
            first_sentence_s.get_or_insert_with(|| call_time(Instant::now()));
            let at = self.speak(&rest, out, &call_time)?;
            first_audio_s = first_audio_s.or(at);
        }
        let reply = reply.trim().to_string();
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Message::new(Role::Assistant, reply.clone()));
        self.turns += 1;
        let now = call_time(Instant::now());
        Ok(Some(TurnRecord {
            index: self.turns,
            transcript,
            reply,
            caller_stop_s: turn.caller_stop_s,
            end_of_turn_s: turn.end_of_turn_s,
            transcript_s,
            first_token_s: first_token_s.unwrap_or(now),
            first_sentence_s: first_sentence_s.unwrap_or(now),
            first_audio_s: first_audio_s.unwrap_or(now),
            end_of_turn_score: turn.end_of_turn_score,
        }))
    }

    /// Synthesizes a sentence and queues it; returns the call time it was handed out.
    fn speak(
        &mut self,
        sentence: &str,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Result<Option<f64>> {
        let text = speakable(sentence);
        let audio = self.voice.synthesize(&text)?;
        if audio.samples.is_empty() {
            return Ok(None);
        }
        let ready_s = call_time(Instant::now());
        let start_s = ready_s.max(self.speaking_until_s);
        out.play(start_s, &audio);
        self.speaking_until_s = start_s + audio.duration_s();
        Ok(Some(ready_s))
    }
}

/// Sends a call's turn hint: the moment the caller stops speaking, before the end of their
/// turn is certain, the engine hears that a turn is coming.
#[derive(Clone)]
pub struct TurnHint {
    engine: Arc<Engine>,
    call_id: u64,
    system_prompt: String,
    history_messages: usize,
    history: Arc<Mutex<Vec<Message>>>,
}

impl TurnHint {
    /// The system prompt and the call's latest messages.
    fn conversation(&self) -> Vec<Message> {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let keep = history.len().saturating_sub(self.history_messages);
        let mut messages = vec![Message::new(Role::System, self.system_prompt.clone())];
        messages.extend_from_slice(&history[keep..]);
        messages
    }

    pub fn send(&self) -> Result<()> {
        self.engine.turn_hint(self.call_id, self.conversation())
    }
}

/// Drops what a voice cannot say: markdown marks and emoji.
fn speakable(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, '*' | '#' | '`' | '_' | '~' | '|' | '<' | '>'))
        .filter(|c| (*c as u32) < 0x1F000)
        .collect()
}
