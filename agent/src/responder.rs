//! The reply to one finished turn: transcript → engine → sentences → speech, each stage
//! timed. Sentences are spoken as soon as they are complete, while the engine goes on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use sublet_audio::Audio;
use sublet_engine::{
    CallLine, ChatRequest, DeadlinePassed, Engine, EngineError, Message, ReplyStream, Role,
    StreamEvent, VOICE_PRIORITY,
};
use sublet_stt::Transcriber;
use sublet_tts::Voice;

use crate::dispatch::held_reply_stands;
use crate::history::{ask, forget_from, lock, remember_reply, SharedMemory};
pub use crate::history::{ReplyCutter, TurnHint};
use crate::pool::Pooled;
use crate::record::{TurnOutcome, TurnRecord};
use crate::sentence::{speakable, ReplyLimit, SentenceSplitter};
use crate::turn_failure::{AtStage, TurnFailure};
use crate::AgentConfig;

mod speaking;

/// A caller turn the detector judged over.
#[derive(Debug, Clone)]
pub struct FinishedTurn {
    pub caller_stop_s: f64,
    /// Call time at which the turn was judged over.
    pub end_of_turn_s: f64,
    /// The same moment on this machine's clock: later stages are timed from it.
    pub judged_at: Instant,
    pub end_of_turn_score: Option<f32>,
    /// The turn cap ended it while the caller still spoke.
    pub capped: bool,
    /// The caller's audio for the turn, 16 kHz.
    pub audio: Vec<f32>,
    /// The turn's transcript, when it was taken before the end of the turn.
    pub transcript: Option<String>,
    /// That transcript was started before the caller's stop was certain.
    pub transcript_ahead: bool,
    /// Transcripts started at shorter quiets in the turn, called off as the caller went on.
    pub transcripts_called_off: usize,
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

/// One call's replier: its models and its chat history.
pub struct Responder {
    stt: Pooled<Transcriber>,
    voice: Pooled<Voice>,
    engine: Arc<Engine>,
    config: AgentConfig,
    /// Both sides of the call so far; shared with the call's [`TurnHint`] and
    /// [`ReplyCutter`].
    memory: SharedMemory,
    turns: usize,
    /// Call time at which the agent's audio queued so far ends.
    speaking_until_s: f64,
    /// This call's line to make-room; its session is the call's id in the engine.
    line: CallLine,
    /// A reply started as the caller stopped speaking, held until their turn ends.
    held: Option<HeldReply>,
    /// Held replies of the turn in progress cancelled because the caller went on.
    discarded: usize,
    /// The fallback phrase's audio, made at the call's first failed turn.
    fallback_audio: Option<Audio>,
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

/// A turn's reply as far as it got, for its record whether it ends well or fails.
struct Progress {
    transcript: Option<String>,
    transcript_s: Option<f64>,
    /// Where the caller's words were added to the history.
    asked_at: Option<usize>,
    first_token_s: Option<f64>,
    opening_ahead: bool,
    said: Said,
}

impl Progress {
    fn new(limit: ReplyLimit) -> Self {
        Self {
            transcript: None,
            transcript_s: None,
            asked_at: None,
            first_token_s: None,
            opening_ahead: false,
            said: Said {
                limit,
                spoken: Vec::new(),
                first_sentence_s: None,
                first_audio_s: None,
                ended: false,
            },
        }
    }
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
    /// The call has begun: say the greeting (`AgentConfig::greeting`), if there is one.
    Greet,
}

/// Numbers the calls of this process, for the engine's sessions.
static NEXT_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Responder {
    pub fn new(
        stt: Pooled<Transcriber>,
        voice: Pooled<Voice>,
        engine: Arc<Engine>,
        config: AgentConfig,
    ) -> Self {
        Self {
            stt,
            voice,
            line: engine.call_line(NEXT_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
            engine,
            config,
            memory: SharedMemory::default(),
            turns: 0,
            speaking_until_s: 0.0,
            held: None,
            discarded: 0,
            fallback_audio: None,
        }
    }

    /// Does one piece of work; a record when a turn was answered.
    pub fn handle(&mut self, work: TurnWork, out: &mut dyn AudioOut) -> Result<Option<TurnRecord>> {
        match work {
            TurnWork::Preempt { audio, transcript } => {
                self.preempt(&audio, transcript);
                Ok(None)
            }
            TurnWork::Discard => {
                // Dropping the held stream cancels its request in the engine.
                self.discarded += usize::from(self.held.take().is_some());
                Ok(None)
            }
            TurnWork::Answer(turn) => self.respond(turn, out),
            TurnWork::Greet => {
                self.greet(out);
                Ok(None)
            }
        }
    }

    /// Starts the reply to what the caller said so far, and holds it. Its failure only
    /// means nothing is held: the answer starts its own reply when the turn ends.
    fn preempt(&mut self, audio: &[f32], transcript: Option<String>) {
        self.held = None;
        if let Err(failure) = self.try_preempt(audio, transcript) {
            tracing::warn!(error = %failure.error, "no reply started at the stop");
        }
    }

    fn try_preempt(
        &mut self,
        audio: &[f32],
        transcript: Option<String>,
    ) -> Result<(), TurnFailure> {
        let turn = self.turns + 1;
        let transcript = match transcript {
            Some(text) => text,
            None => self.transcribe(turn, audio)?,
        };
        if transcript.is_empty() {
            return Ok(());
        }
        let mut messages = self.turn_hint().conversation();
        messages.push(Message::new(Role::User, transcript.clone()));
        let transcript_at = Instant::now();
        let mut stream = self.chat(turn, messages)?;
        let opening = self.read_opening(turn, &mut stream, self.deadline(transcript_at))?;
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
    /// time the answer itself would first spend on the same. At `deadline` it stops reading
    /// with what it has; the answer goes on from there.
    fn read_opening(
        &mut self,
        turn: usize,
        stream: &mut ReplyStream,
        deadline: Option<Instant>,
    ) -> Result<Opening, TurnFailure> {
        let mut splitter = self.splitter();
        let (mut sentences, mut first_token_at, mut stream_ended) = (Vec::new(), None, false);
        while sentences.is_empty() && !stream_ended {
            let Ok(event) = next_event(stream, deadline) else {
                break;
            };
            match event.transpose().at(TurnOutcome::EngineFailed)? {
                Some(StreamEvent::Text(text)) => {
                    first_token_at.get_or_insert_with(Instant::now);
                    sentences = splitter.push(&text);
                }
                Some(StreamEvent::Done(_)) | None => stream_ended = true,
                // A voice turn offers no tools.
                Some(StreamEvent::ToolCalls(_)) => {}
            }
        }
        let first_sentence_at = Instant::now();
        let audio = match sentences.first() {
            Some(first) => {
                self.line.first_sentence_out();
                Some(self.synthesize(turn, first)?)
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

    /// When a reply started at `from` must have its first sentence.
    fn deadline(&self, from: Instant) -> Option<Instant> {
        self.config
            .reply_deadline_s
            .map(|s| from + Duration::from_secs_f64(s))
    }

    fn transcribe(&mut self, turn: usize, audio: &[f32]) -> Result<String, TurnFailure> {
        self.config
            .faults
            .check(turn, TurnOutcome::TranscriptFailed)?;
        self.stt.transcribe(audio).at(TurnOutcome::TranscriptFailed)
    }

    fn chat(&self, turn: usize, messages: Vec<Message>) -> Result<ReplyStream, TurnFailure> {
        self.config.faults.check(turn, TurnOutcome::EngineFailed)?;
        self.engine
            .chat(ChatRequest {
                priority: VOICE_PRIORITY,
                session: Some(self.line.session()),
                repetition: self.config.repetition,
                // A caller waits for the answer, not for the model's reasoning.
                thinking: Some(false),
                ..ChatRequest::new(messages, self.config.max_reply_tokens)
            })
            .at(TurnOutcome::EngineFailed)
    }

    fn synthesize(&mut self, turn: usize, sentence: &str) -> Result<Audio, TurnFailure> {
        self.config.faults.check(turn, TurnOutcome::SpeechFailed)?;
        self.voice
            .synthesize(&speakable(sentence))
            .at(TurnOutcome::SpeechFailed)
    }

    /// A handle that sends this call's turn hint from another thread.
    pub fn turn_hint(&self) -> TurnHint {
        TurnHint {
            line: self.line.clone(),
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

    /// Replies to a turn. `None` when the turn held no words (a noise, a cough). A failure
    /// on the way is the turn's: it is recorded, the fallback phrase is said when nothing
    /// of the reply was, and the call goes on.
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
        let mut progress = Progress::new(ReplyLimit::new(self.config.max_reply_sentences));
        let failure = match self.reply(&turn, turn_index, &mut progress, out, &call_time) {
            Ok(false) => return Ok(None),
            Ok(true) => None,
            Err(failure) => Some(failure),
        };
        let Progress {
            transcript,
            transcript_s,
            asked_at,
            first_token_s,
            opening_ahead,
            mut said,
        } = progress;
        let mut reply = said.spoken.join(" ").trim().to_string();
        // Stages a failure skipped end here, before any fallback goes out.
        let now = call_time(Instant::now());
        match &failure {
            Some(failure) if said.spoken.is_empty() => {
                tracing::warn!(turn = turn_index, error = %failure.error, "turn failed");
                // The history goes on as if the turn had not been asked.
                if let Some(at) = asked_at {
                    forget_from(&self.memory, at);
                }
                if let Some(at) = self.say_fallback(turn_index, out, &call_time) {
                    reply = self.config.fallback_phrase.clone();
                    said.first_audio_s = Some(at);
                }
            }
            _ => remember_reply(&self.memory, turn_index, &reply),
        }
        self.turns = turn_index;
        Ok(Some(TurnRecord {
            index: self.turns,
            transcript: transcript.unwrap_or_default(),
            reply,
            caller_stop_s: turn.caller_stop_s,
            end_of_turn_s: turn.end_of_turn_s,
            transcript_s: transcript_s.unwrap_or(now),
            first_token_s: first_token_s.unwrap_or(now),
            first_sentence_s: said.first_sentence_s.unwrap_or(now),
            first_audio_s: said
                .first_audio_s
                .unwrap_or_else(|| call_time(Instant::now())),
            // Measured by whatever plays the reply (`Playout`), after its last sentence.
            reply_gap_s: 0.0,
            end_of_turn_score: turn.end_of_turn_score,
            preemptive,
            preemptive_discarded,
            opening_ahead,
            transcript_ahead: turn.transcript_ahead,
            transcripts_called_off: turn.transcripts_called_off,
            capped: turn.capped,
            outcome: failure
                .as_ref()
                .map_or(TurnOutcome::Answered, |f| f.outcome),
            error: failure.map(|f| f.error),
        }))
    }

    /// The reply itself, noting its progress as it goes; `false` when the turn held no
    /// words.
    fn reply(
        &mut self,
        turn: &FinishedTurn,
        turn_index: usize,
        p: &mut Progress,
        out: &mut dyn AudioOut,
        call_time: &dyn Fn(Instant) -> f64,
    ) -> Result<bool, TurnFailure> {
        let (mut stream, opening) = match self.held.take() {
            Some(held) => {
                p.transcript_s = Some(call_time(held.transcript_at));
                p.asked_at = Some(ask(&self.memory, &held.transcript));
                p.transcript = Some(held.transcript);
                (held.stream, Some(held.opening))
            }
            None => {
                let transcript = match &turn.transcript {
                    Some(text) => text.clone(),
                    None => self.transcribe(turn_index, &turn.audio)?,
                };
                p.transcript_s = Some(call_time(Instant::now()));
                if transcript.is_empty() {
                    return Ok(false);
                }
                p.asked_at = Some(ask(&self.memory, &transcript));
                p.transcript = Some(transcript);
                let stream = self.chat(turn_index, self.turn_hint().conversation())?;
                (stream, None)
            }
        };
        let (mut splitter, mut stream_ended) = (self.splitter(), false);
        if let Some(opening) = opening {
            p.opening_ahead = opening.audio.is_some() && opening.ready_at <= turn.judged_at;
            splitter = opening.splitter;
            p.first_token_s = opening.first_token_at.map(call_time);
            stream_ended = opening.stream_ended;
            let mut audio = opening.audio;
            for sentence in opening.sentences {
                let made_at = opening.first_sentence_at;
                let said = &mut p.said;
                if !self.say(
                    turn_index,
                    sentence,
                    audio.take(),
                    made_at,
                    said,
                    out,
                    call_time,
                )? {
                    break;
                }
            }
        }
        // Until its first sentence is out, the reply races the deadline.
        let deadline = self.deadline(turn.judged_at);
        let cut = |memory: &SharedMemory| lock(memory).cut.contains_key(&turn_index);
        'reply: while !p.said.ended && !stream_ended {
            let deadline = deadline.filter(|_| p.said.first_sentence_s.is_none());
            let event = match next_event(&mut stream, deadline) {
                Ok(Some(event)) => event,
                Ok(None) => break,
                // Dropping the stream cancels the request in the engine.
                Err(DeadlinePassed) => {
                    let deadline_s = self.config.reply_deadline_s.unwrap_or_default();
                    return Err(TurnFailure::late(deadline_s));
                }
            };
            if cut(&self.memory) {
                break; // dropping the stream cancels the request in the engine
            }
            match event.at(TurnOutcome::EngineFailed)? {
                StreamEvent::Text(text) => {
                    p.first_token_s
                        .get_or_insert_with(|| call_time(Instant::now()));
                    for sentence in splitter.push(&text) {
                        let (now, said) = (Instant::now(), &mut p.said);
                        if !self.say(turn_index, sentence, None, now, said, out, call_time)? {
                            break 'reply;
                        }
                    }
                }
                StreamEvent::Done(_) => break,
                StreamEvent::ToolCalls(_) => {}
            }
        }
        drop(stream);
        if let Some(rest) = splitter
            .finish()
            .filter(|_| !p.said.ended && !cut(&self.memory))
        {
            let (now, said) = (Instant::now(), &mut p.said);
            self.say(turn_index, rest, None, now, said, out, call_time)?;
        }
        Ok(true)
    }
}

/// The stream's next event, unless `deadline` passes first.
fn next_event(
    stream: &mut ReplyStream,
    deadline: Option<Instant>,
) -> Result<Option<Result<StreamEvent, EngineError>>, DeadlinePassed> {
    match deadline {
        Some(deadline) => stream.next_before(deadline),
        None => Ok(stream.next_blocking()),
    }
}
