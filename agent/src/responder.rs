//! The reply to one finished turn: transcript → engine → sentences → speech, each stage
//! timed. Sentences are spoken as soon as they are complete, while the engine goes on.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use sublet_audio::Audio;
use sublet_engine::{
    ChatRequest, Engine, EngineError, Message, ReplyStream, Role, StreamEvent, VOICE_PRIORITY,
};
use sublet_stt::Transcriber;
use sublet_tts::Voice;

use crate::dispatch::held_reply_stands;
use crate::record::TurnRecord;
use crate::sentence::{ReplyLimit, SentenceSplitter};
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
    /// The turn's transcript, when it was taken before the end of the turn.
    pub transcript: Option<String>,
    /// That transcript was started before the caller's stop was certain.
    pub transcript_ahead: bool,
}

/// One sentence of a reply, synthesized.
pub struct SpokenSentence<'a> {
    /// The turn whose reply it is (1, 2, …).
    pub turn: usize,
    pub text: &'a str,
    pub audio: &'a Audio,
}

/// Where the agent's speech goes: a file, a speaker, a WebRTC track.
pub trait AudioOut {
    /// Plays a sentence starting at call time `at_s` (never earlier than the previous audio
    /// ends).
    fn play(&mut self, at_s: f64, sentence: &SpokenSentence);
}

/// Both sides of a call so far, shared by the responder, the turn hint and the cutter.
#[derive(Default)]
struct Memory {
    messages: Vec<Message>,
    /// Where each turn's reply sits in `messages`.
    reply_at: std::collections::HashMap<usize, usize>,
    /// Turns the caller cut short, with what they heard of the reply.
    cut: std::collections::HashMap<usize, String>,
}

type SharedMemory = Arc<Mutex<Memory>>;

fn lock(memory: &SharedMemory) -> std::sync::MutexGuard<'_, Memory> {
    memory.lock().unwrap_or_else(|e| e.into_inner())
}

/// Adds turn `turn`'s reply to the history: what the caller heard of it if they cut it short.
fn remember_reply(memory: &SharedMemory, turn: usize, reply: &str) {
    let mut memory = lock(memory);
    let kept = memory.cut.get(&turn).cloned();
    let at = memory.messages.len();
    memory.reply_at.insert(turn, at);
    let content = kept.unwrap_or_else(|| reply.to_owned());
    memory.messages.push(Message::new(Role::Assistant, content));
}

/// Cuts a reply short from another thread (the caller interrupted it): its generation
/// stops at the next token, which cancels it in the engine and frees its KV, and the
/// history keeps only what the caller heard.
#[derive(Clone)]
pub struct ReplyCutter {
    memory: SharedMemory,
}

impl ReplyCutter {
    pub fn cut(&self, turn: usize, heard: &str) {
        let mut memory = lock(&self.memory);
        memory.cut.insert(turn, heard.to_owned());
        if let Some(at) = memory.reply_at.get(&turn).copied() {
            memory.messages[at].content = heard.to_owned();
        }
    }
}

/// One call's replier: its models and its chat history.
pub struct Responder {
    stt: Transcriber,
    voice: Voice,
    engine: Arc<Engine>,
    config: AgentConfig,
    /// Both sides of the call so far; shared with the call's [`TurnHint`] and
    /// [`ReplyCutter`].
    memory: SharedMemory,
    turns: usize,
    /// Call time at which the agent's audio queued so far ends.
    speaking_until_s: f64,
    /// This call's session id in the engine.
    call_id: u64,
    /// A reply started as the caller stopped speaking, held until their turn ends.
    held: Option<HeldReply>,
    /// Held replies of the turn in progress cancelled because the caller went on.
    discarded: usize,
}

/// A reply generated ahead of the end of the turn (preemptive generation).
struct HeldReply {
    transcript: String,
    transcript_at: Instant,
    stream: ReplyStream,
    /// Its opening, made while the end of the turn was still being decided.
    opening: Opening,
}

/// A held reply's first sentence (or clause), read from the engine and synthesized at the
/// stop: an unsure turn's answer is heard the moment its end is decided, not a synthesis
/// later.
struct Opening {
    /// The splitter, holding the text after the sentences below.
    splitter: SentenceSplitter,
    /// The sentences the engine had completed; the first with its audio.
    sentences: Vec<String>,
    audio: Option<Audio>,
    first_token_at: Option<Instant>,
    first_sentence_at: Instant,
    /// When its audio was ready.
    ready_at: Instant,
    /// The reply ended within its opening.
    stream_ended: bool,
}

/// A reply as far as it has been said.
struct Said {
    limit: ReplyLimit,
    /// The sentences handed out to be spoken: the reply, as far as the caller goes.
    spoken: Vec<String>,
    first_sentence_s: Option<f64>,
    first_audio_s: Option<f64>,
    /// The reply may say no more (its sentence limit, a loop, a repeat).
    ended: bool,
}

/// Work for a call's responder, in the order the call produces it.
pub enum TurnWork {
    /// The caller stopped speaking, and their turn may be over: transcribe what they said
    /// and start the reply now, held until the turn ends.
    Preempt {
        audio: Vec<f32>,
        /// Its transcript, when already taken.
        transcript: Option<String>,
    },
    /// The caller spoke again before their turn ended: the held reply is cancelled.
    Discard,
    /// The turn is over: answer it, with the held reply when there is one.
    Answer(FinishedTurn),
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
            memory: SharedMemory::default(),
            turns: 0,
            speaking_until_s: 0.0,
            call_id: NEXT_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            held: None,
            discarded: 0,
        }
    }

    /// Does one piece of work; a record when a turn was answered.
    pub fn handle(&mut self, work: TurnWork, out: &mut dyn AudioOut) -> Result<Option<TurnRecord>> {
        match work {
            TurnWork::Preempt { audio, transcript } => {
                self.preempt(&audio, transcript)?;
                Ok(None)
            }
            TurnWork::Discard => {
                // Dropping the held stream cancels its request in the engine.
                self.discarded += usize::from(self.held.take().is_some());
                Ok(None)
            }
            TurnWork::Answer(turn) => self.respond(turn, out),
        }
    }

    /// Starts the reply to what the caller said so far, and holds it.
    fn preempt(&mut self, audio: &[f32], transcript: Option<String>) -> Result<()> {
        self.held = None;
        let transcript = match transcript {
            Some(text) => text,
            None => self.stt.transcribe(audio)?,
        };
        if transcript.is_empty() {
            return Ok(());
        }
        let mut messages = self.turn_hint().conversation();
        messages.push(Message::new(Role::User, transcript.clone()));
        let transcript_at = Instant::now();
        let mut stream = self.chat(messages)?;
        let opening = self.read_opening(&mut stream)?;
        self.held = Some(HeldReply {
            transcript,
            transcript_at,
            stream,
            opening,
        });
        Ok(())
    }

    /// Reads a reply's stream up to its first sentence, and synthesizes that sentence. The
    /// responder's next work (a discard, the answer) waits meanwhile: a few hundred ms, the
    /// time the answer itself would first spend on the same.
    fn read_opening(&mut self, stream: &mut ReplyStream) -> Result<Opening> {
        let mut splitter = self.splitter();
        let (mut sentences, mut first_token_at, mut stream_ended) = (Vec::new(), None, false);
        while sentences.is_empty() && !stream_ended {
            match stream.next_blocking().transpose().context("engine reply")? {
                Some(StreamEvent::Text(text)) => {
                    first_token_at.get_or_insert_with(Instant::now);
                    sentences = splitter.push(&text);
                }
                Some(StreamEvent::Done(_)) | None => stream_ended = true,
            }
        }
        let first_sentence_at = Instant::now();
        let audio = match sentences.first() {
            Some(first) => {
                self.engine.first_sentence_out(self.call_id);
                Some(self.voice.synthesize(&speakable(first))?)
            }
            None => None,
        };
        Ok(Opening {
            splitter,
            sentences,
            audio,
            first_token_at,
            first_sentence_at,
            ready_at: Instant::now(),
            stream_ended,
        })
    }

    fn splitter(&self) -> SentenceSplitter {
        match self.config.first_clause_words {
            Some(words) => SentenceSplitter::new().first_clause_words(words),
            None => SentenceSplitter::new(),
        }
    }

    fn chat(&self, messages: Vec<Message>) -> Result<ReplyStream, EngineError> {
        self.engine.chat(ChatRequest {
            priority: VOICE_PRIORITY,
            session: Some(self.call_id),
            repetition: self.config.repetition,
            ..ChatRequest::new(messages, self.config.max_reply_tokens)
        })
    }

    /// A handle that sends this call's turn hint from another thread.
    pub fn turn_hint(&self) -> TurnHint {
        TurnHint {
            engine: self.engine.clone(),
            call_id: self.call_id,
            system_prompt: self.config.system_prompt.clone(),
            history_messages: self.config.history_messages,
            memory: self.memory.clone(),
        }
    }

    /// A handle that cuts this call's replies short from another thread.
    pub fn cutter(&self) -> ReplyCutter {
        ReplyCutter {
            memory: self.memory.clone(),
        }
    }

    /// Replies to a turn. `None` when the turn held no words (a noise, a cough).
    pub fn respond(
        &mut self,
        turn: FinishedTurn,
        out: &mut dyn AudioOut,
    ) -> Result<Option<TurnRecord>> {
        // Work done before the turn ended counts as done at its end.
        let call_time =
            |at: Instant| turn.end_of_turn_s + at.duration_since(turn.judged_at).as_secs_f64();
        // A reply started at the stop answers the turn only if its words are the turn's.
        if let Some(held) = &self.held {
            if !held_reply_stands(&held.transcript, turn.transcript.as_deref()) {
                self.held = None;
                self.discarded += 1;
            }
        }
        let preemptive = self.held.is_some();
        let preemptive_discarded = std::mem::take(&mut self.discarded);
        let turn_index = self.turns + 1;
        let (transcript, transcript_s, mut stream, opening) = match self.held.take() {
            Some(held) => {
                let user = Message::new(Role::User, held.transcript.clone());
                lock(&self.memory).messages.push(user);
                let at = call_time(held.transcript_at);
                (held.transcript, at, held.stream, Some(held.opening))
            }
            None => {
                let transcript = match &turn.transcript {
                    Some(text) => text.clone(),
                    None => self.stt.transcribe(&turn.audio)?,
                };
                let transcript_s = call_time(Instant::now());
                if transcript.is_empty() {
                    return Ok(None);
                }
                let user = Message::new(Role::User, transcript.clone());
                lock(&self.memory).messages.push(user);
                let stream = self.chat(self.turn_hint().conversation())?;
                (transcript, transcript_s, stream, None)
            }
        };

        let mut said = Said {
            limit: ReplyLimit::new(self.config.max_reply_sentences),
            spoken: Vec::new(),
            first_sentence_s: None,
            first_audio_s: None,
            ended: false,
        };
        let (mut splitter, mut first_token_s, mut stream_ended) = (self.splitter(), None, false);
        let opening_ahead = opening
            .as_ref()
            .is_some_and(|o| o.audio.is_some() && o.ready_at <= turn.judged_at);
        if let Some(opening) = opening {
            splitter = opening.splitter;
            first_token_s = opening.first_token_at.map(call_time);
            stream_ended = opening.stream_ended;
            let mut audio = opening.audio;
            for sentence in opening.sentences {
                let made_at = opening.first_sentence_at;
                if !self.say(
                    turn_index,
                    sentence,
                    audio.take(),
                    made_at,
                    &mut said,
                    out,
                    &call_time,
                )? {
                    break;
                }
            }
        }
        let cut = |memory: &SharedMemory| lock(memory).cut.contains_key(&turn_index);
        'reply: while !said.ended && !stream_ended {
            let Some(event) = stream.next_blocking() else {
                break;
            };
            if cut(&self.memory) {
                break; // dropping the stream cancels the request in the engine
            }
            match event.context("engine reply")? {
                StreamEvent::Text(text) => {
                    first_token_s.get_or_insert_with(|| call_time(Instant::now()));
                    for sentence in splitter.push(&text) {
                        let now = Instant::now();
                        if !self.say(turn_index, sentence, None, now, &mut said, out, &call_time)? {
                            break 'reply;
                        }
                    }
                }
                StreamEvent::Done(_) => break,
            }
        }
        drop(stream);
        if let Some(rest) = splitter
            .finish()
            .filter(|_| !said.ended && !cut(&self.memory))
        {
            self.say(
                turn_index,
                rest,
                None,
                Instant::now(),
                &mut said,
                out,
                &call_time,
            )?;
        }
        let Said {
            spoken,
            first_sentence_s,
            first_audio_s,
            ..
        } = said;
        let reply = spoken.join(" ").trim().to_string();
        remember_reply(&self.memory, turn_index, &reply);
        self.turns = turn_index;
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
            preemptive,
            preemptive_discarded,
            opening_ahead,
            transcript_ahead: turn.transcript_ahead,
        }))
    }

    /// Says one sentence of a reply, made at `made_at`, unless the reply's limit ends it
    /// there; whether the reply may go on.
    #[allow(clippy::too_many_arguments)]
    fn say(
        &mut self,
        turn: usize,
        sentence: String,
        audio: Option<Audio>,
        made_at: Instant,
        said: &mut Said,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Result<bool> {
        if !said.limit.admit(&sentence) {
            said.ended = true;
            return Ok(false);
        }
        if said.first_sentence_s.is_none() {
            said.first_sentence_s = Some(call_time(made_at));
            self.engine.first_sentence_out(self.call_id);
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
    ) -> Result<Option<f64>> {
        let audio = match audio {
            Some(audio) => audio,
            None => self.voice.synthesize(&speakable(sentence))?,
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

/// Sends a call's turn hint: the moment the caller stops speaking, before the end of their
/// turn is certain, the engine hears that a turn is coming.
#[derive(Clone)]
pub struct TurnHint {
    engine: Arc<Engine>,
    call_id: u64,
    system_prompt: String,
    history_messages: usize,
    memory: SharedMemory,
}

impl TurnHint {
    /// The system prompt and the call's latest messages.
    fn conversation(&self) -> Vec<Message> {
        let memory = lock(&self.memory);
        let history = &memory.messages;
        let keep = history.len().saturating_sub(self.history_messages);
        let mut messages = vec![Message::new(Role::System, self.system_prompt.clone())];
        messages.extend_from_slice(&history[keep..]);
        messages
    }

    pub fn send(&self) -> Result<(), EngineError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(memory: &SharedMemory) -> Vec<String> {
        lock(memory)
            .messages
            .iter()
            .map(|m| m.content.clone())
            .collect()
    }

    #[test]
    fn the_history_keeps_only_what_the_caller_heard() {
        let memory = SharedMemory::default();
        let cutter = ReplyCutter {
            memory: memory.clone(),
        };
        // Cut while its generation still runs: the reply is remembered as heard.
        cutter.cut(1, "Once upon a");
        remember_reply(&memory, 1, "Once upon a time, there was a dragon.");
        // Cut after it was remembered: the message is shortened in place.
        remember_reply(&memory, 2, "It is Rome. It has seven hills.");
        cutter.cut(2, "It is Rome.");
        remember_reply(&memory, 3, "Goodbye.");
        assert_eq!(replies(&memory), ["Once upon a", "It is Rome.", "Goodbye."]);
    }
}
