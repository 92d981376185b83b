//! What a call tells whoever watches it (progress output, a live view, a room's data
//! messages): its turns' events, each answered turn, each interruption. The bottom of the
//! call module: it depends on none of its other files.

use sublet_turn_detect::TurnEvent;

use crate::record::TurnRecord;

/// Something that wants to hear about a call as it goes (progress output, a live view).
pub trait CallObserver: Send {
    fn turn_event(&mut self, _event: &TurnEvent) {}
    fn turn_answered(&mut self, _turn: &TurnRecord) {}
    /// The caller talked over the agent (a live call).
    fn interruption(&mut self, _interruption: &Interruption) {}
    /// What the caller has said so far of the turn in progress (a live call, when
    /// `AgentConfig::partial_transcripts_s` is set).
    fn partial_transcript(&mut self, _text: &str) {}
    /// The call is over, and why (said by whatever ran it: a room call, a recording).
    fn call_ended(&mut self, _reason: &str) {}
}

/// Observes nothing.
pub struct Quiet;
impl CallObserver for Quiet {}

/// The caller talked over the agent. Times are seconds of the caller's audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Interruption {
    /// When the caller's speech began.
    pub speech_s: f64,
    /// When the agent's audio was stopped (paused, or cut at once).
    pub stopped_s: f64,
    pub outcome: InterruptionOutcome,
    /// How its words were checked; `None` when it was too short to check.
    pub words_checked: Option<WordCheck>,
}

/// Where an interruption's word check took its words from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordCheck {
    /// The early transcript of the interrupting speech, the one its stop uses too.
    EarlyTranscript,
    /// A transcription of its own (no early transcript covers that speech).
    OwnTranscript,
}

#[derive(Debug, Clone, PartialEq)]
pub enum InterruptionOutcome {
    /// Too short, or no words in it: the reply played on from where it paused.
    Resumed,
    /// The reply of `turn` was cut; the caller had heard `heard` of it.
    Cut { turn: usize, heard: String },
}
