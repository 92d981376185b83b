//! A call's history: both sides of the conversation so far, shared by its responder, its
//! turn hint and its reply cutter, keeping only what the caller heard.

use std::sync::{Arc, Mutex};

use sublet_engine::{CallLine, EngineError, Message, Role};

/// Both sides of a call so far, shared by the responder, the turn hint and the cutter.
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) messages: Vec<Message>,
    /// Where each turn's reply sits in `messages`.
    reply_at: std::collections::HashMap<usize, usize>,
    /// Turns the caller cut short, with what they heard of the reply.
    pub(crate) cut: std::collections::HashMap<usize, String>,
}

pub(crate) type SharedMemory = Arc<Mutex<Memory>>;

pub(crate) fn lock(memory: &SharedMemory) -> std::sync::MutexGuard<'_, Memory> {
    memory.lock().unwrap_or_else(|e| e.into_inner())
}

/// Adds the caller's words to the history; where they sit in it.
pub(crate) fn ask(memory: &SharedMemory, transcript: &str) -> usize {
    let mut memory = lock(memory);
    memory
        .messages
        .push(Message::new(Role::User, transcript.to_owned()));
    memory.messages.len() - 1
}

/// Takes a failed turn's question back out of the history: the call goes on as if it had
/// not been asked.
pub(crate) fn forget_from(memory: &SharedMemory, at: usize) {
    lock(memory).messages.truncate(at);
}

/// Adds turn `turn`'s reply to the history: what the caller heard of it if they cut it short.
pub(crate) fn remember_reply(memory: &SharedMemory, turn: usize, reply: &str) {
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
    pub(crate) memory: SharedMemory,
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

/// Sends a call's turn hint: the moment the caller stops speaking, before the end of their
/// turn is certain, the engine hears that a turn is coming.
#[derive(Clone)]
pub struct TurnHint {
    /// The call's line to make-room.
    pub(crate) line: CallLine,
    pub(crate) system_prompt: String,
    pub(crate) history_messages: usize,
    pub(crate) memory: SharedMemory,
}

impl TurnHint {
    /// The system prompt and the call's latest messages.
    pub(crate) fn conversation(&self) -> Vec<Message> {
        let memory = lock(&self.memory);
        let history = &memory.messages;
        let keep = history.len().saturating_sub(self.history_messages);
        let mut messages = vec![Message::new(Role::System, self.system_prompt.clone())];
        messages.extend_from_slice(&history[keep..]);
        messages
    }

    pub fn send(&self) -> Result<(), EngineError> {
        self.line.turn_hint(self.conversation())
    }

    /// The hint without its one-token request: the caller went quiet, and the engine
    /// makes room for a turn that may follow, computing nothing for it.
    pub fn coming(&self) {
        self.line.turn_coming();
    }

    /// The caller speaks again: the turn told of by [`TurnHint::coming`] is not coming.
    pub fn not_coming(&self) {
        self.line.turn_not_coming();
    }
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
