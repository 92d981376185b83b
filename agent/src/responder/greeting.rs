//! The agent's first words on a live call: the persona's greeting, said as the caller's
//! audio arrives and kept in the history as the agent's, so the model knows it was said.

use super::{remember_reply, AudioOut, Responder};

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
}
