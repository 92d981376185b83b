//! A call's line to the engine: what only a voice call tells make-room, each signal named
//! for one call (its session), so that the generic [`Engine`] surface carries none of it.

use std::sync::Arc;

use crate::{ChatRequest, Engine, EngineError, Message, VOICE_PRIORITY};

/// The voice-only signals of one call (`Engine::call_line`). Under mistral.rs's own
/// scheduler the quiet-time signals do nothing; the turn hint is still a request.
#[derive(Clone)]
pub struct CallLine {
    engine: Arc<Engine>,
    session: u64,
}

impl CallLine {
    pub(crate) fn new(engine: Arc<Engine>, session: u64) -> Self {
        Self { engine, session }
    }

    /// The call's session, as its requests carry it.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The turn hint: the caller just stopped speaking, so a turn is coming. Sends the
    /// engine a one-token request for the call (at voice priority, with the call's
    /// conversation so far) and lets it run to its end in the background.
    pub fn turn_hint(&self, messages: Vec<Message>) -> Result<(), EngineError> {
        let mut stream = self.engine.chat(ChatRequest {
            priority: VOICE_PRIORITY,
            session: Some(self.session),
            thinking: Some(false),
            ..ChatRequest::new(messages, 1)
        })?;
        self.engine
            .runtime
            .spawn(async move { while stream.next().await.is_some() {} });
        Ok(())
    }

    /// The caller has gone quiet, and their turn may be coming: make-room keeps its next
    /// steps small for a while (computing nothing for the turn, holding no one back), so
    /// the pass in flight when the turn arrives is short. The turn's request ends it, as
    /// does [`CallLine::turn_not_coming`].
    pub fn turn_coming(&self) {
        if let Some(handle) = &self.engine.make_room {
            handle.turn_coming(self.session);
        }
    }

    /// The caller speaks again: the turn they went quiet for is not coming.
    pub fn turn_not_coming(&self) {
        if let Some(handle) = &self.engine.make_room {
            handle.turn_not_coming(self.session);
        }
    }

    /// The reply has its first complete sentence (on its way to speech): make-room stops
    /// holding agents back for this turn, before its token window ends.
    pub fn first_sentence_out(&self) {
        if let Some(handle) = &self.engine.make_room {
            handle.first_sentence_out(self.session);
        }
    }
}
