//! A reply's stream of text, handed from the engine's async world to any thread.

use mistralrs_core::Response;

use crate::{EngineError, ToolCall};
use tokio::sync::mpsc;

/// How a reply ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// Why a reply ended, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended it (its end-of-turn token).
    Stop,
    /// The request's stop text of this index appeared (left out of the reply).
    StopText(usize),
    /// It reached its `max_tokens` or the model's length.
    Length,
    /// Its reader left, or the engine cancelled it.
    Canceled,
    /// The model called tools (the reply's [`StreamEvent::ToolCalls`]).
    ToolCalls,
    /// A reason this engine does not name (kept as the engine gave it).
    Other(String),
}

impl FinishReason {
    fn from_engine(reason: &str) -> Self {
        match reason {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "canceled" => Self::Canceled,
            "tool_calls" => Self::ToolCalls,
            other => Self::Other(other.to_string()),
        }
    }

    /// The OpenAI API's name for it (`finish_reason`).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop | Self::StopText(_) => "stop",
            Self::Length => "length",
            Self::Canceled => "canceled",
            Self::ToolCalls => "tool_calls",
            Self::Other(reason) => reason,
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The next piece of the reply's text (usually one token).
    Text(String),
    /// Tools the model called (with the request's `tools` only), read out of its reply by
    /// mistral.rs; the reply then ends with [`FinishReason::ToolCalls`].
    ToolCalls(Vec<ToolCall>),
    /// The reply is complete.
    Done(Finish),
}

/// The streamed reply of one request. Dropping it cancels the request: the engine stops
/// the sequence when its next token finds no one listening.
pub struct ReplyStream {
    rx: mpsc::UnboundedReceiver<Result<StreamEvent, EngineError>>,
    finished: bool,
}

/// Wakes the thread waiting in [`ReplyStream::next_before`].
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// [`ReplyStream::next_before`] reached its deadline with no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlinePassed;

impl ReplyStream {
    /// Forwards the engine's bounded channel into an unbounded one, so a slow reader never
    /// holds up the engine's step loop.
    pub(crate) fn spawn(
        runtime: &tokio::runtime::Handle,
        mut engine_rx: mpsc::Receiver<Response>,
        mut stop: StopCut,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            loop {
                let response = tokio::select! {
                    response = engine_rx.recv() => response,
                    // The reader is gone: dropping engine_rx now cancels the request even
                    // while it waits to be scheduled, when the engine sends nothing.
                    () = tx.closed() => return,
                };
                let Some(response) = response else { break };
                let (events, last) = translate(response);
                for event in stop.cut(events) {
                    if tx.send(event).is_err() {
                        return; // reader gone: dropping engine_rx cancels the request
                    }
                }
                if last {
                    return;
                }
            }
            let dropped = EngineError::Internal("the engine dropped the request".into());
            let _ = tx.send(Err(dropped));
        });
        Self {
            rx,
            finished: false,
        }
    }

    /// Waits for the next event; `None` after [`StreamEvent::Done`] or an error.
    pub fn next_blocking(&mut self) -> Option<Result<StreamEvent, EngineError>> {
        if self.finished {
            return None;
        }
        let item = self.rx.blocking_recv();
        self.note(&item);
        item
    }

    /// Waits for the next event until `deadline` (blocking); the stream stays usable after
    /// the deadline passes. The thread parks between events as `next_blocking`'s does, with
    /// no timer of the engine's runtime per event.
    pub fn next_before(
        &mut self,
        deadline: std::time::Instant,
    ) -> Result<Option<Result<StreamEvent, EngineError>>, DeadlinePassed> {
        if self.finished {
            return Ok(None);
        }
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        loop {
            if let std::task::Poll::Ready(item) = self.rx.poll_recv(&mut cx) {
                self.note(&item);
                return Ok(item);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(DeadlinePassed);
            }
            std::thread::park_timeout(left);
        }
    }

    /// Waits for the next event, asynchronously.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, EngineError>> {
        if self.finished {
            return None;
        }
        let item = self.rx.recv().await;
        self.note(&item);
        item
    }

    /// Polls for the next event (for hand-written futures and streams).
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<StreamEvent, EngineError>>> {
        if self.finished {
            return std::task::Poll::Ready(None);
        }
        let item = std::task::ready!(self.rx.poll_recv(cx));
        self.note(&item);
        std::task::Poll::Ready(item)
    }

    fn note(&mut self, item: &Option<Result<StreamEvent, EngineError>>) {
        if !matches!(
            item,
            Some(Ok(StreamEvent::Text(_) | StreamEvent::ToolCalls(_)))
        ) {
            self.finished = true;
        }
    }

    /// Reads the whole reply (blocking); returns its text and how it ended.
    pub fn collect_blocking(mut self) -> Result<(String, Finish), EngineError> {
        let mut text = String::new();
        while let Some(event) = self.next_blocking() {
            match event? {
                StreamEvent::Text(t) => text.push_str(&t),
                StreamEvent::ToolCalls(_) => {}
                StreamEvent::Done(finish) => return Ok((text, finish)),
            }
        }
        Err(EngineError::Internal(
            "stream ended without a result".into(),
        ))
    }
}

/// The request's stop texts kept out of its reply. mistral.rs ends a sequence at a stop
/// text, but a stream has already carried the token that completed it; so text that may
/// begin a stop text is held back until the next piece shows whether it does, and the
/// reply is cut where one begins.
#[derive(Debug, Default)]
pub(crate) struct StopCut {
    stops: Vec<String>,
    held: String,
    /// The index, among the request's stop texts, of the one the reply was cut at.
    cut_at: Option<usize>,
}

impl StopCut {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// The events to pass on for `events`: text up to any stop text, the rest held back
    /// while it may still begin one, released before the reply's end.
    fn cut(
        &mut self,
        events: Vec<Result<StreamEvent, EngineError>>,
    ) -> Vec<Result<StreamEvent, EngineError>> {
        if self.stops.is_empty() {
            return events;
        }
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            match event {
                Ok(StreamEvent::Text(text)) => {
                    out.extend(self.text(&text).map(|t| Ok(StreamEvent::Text(t))))
                }
                other => {
                    let rest = std::mem::take(&mut self.held);
                    if !rest.is_empty() && self.cut_at.is_none() {
                        out.push(Ok(StreamEvent::Text(rest)));
                    }
                    out.push(match (other, self.cut_at) {
                        // mistral.rs says "stop" for its end token and a stop text alike.
                        (Ok(StreamEvent::Done(finish)), Some(index))
                            if finish.reason == FinishReason::Stop =>
                        {
                            Ok(StreamEvent::Done(Finish {
                                reason: FinishReason::StopText(index),
                                ..finish
                            }))
                        }
                        (other, _) => other,
                    });
                }
            }
        }
        out
    }

    /// What of `text` may go out now.
    fn text(&mut self, text: &str) -> Option<String> {
        if self.cut_at.is_some() {
            return None;
        }
        self.held.push_str(text);
        let held = &self.held;
        if let Some((at, index)) = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(index, s)| Some((held.find(s.as_str())?, index)))
            .min()
        {
            self.cut_at = Some(index);
            let before = held[..at].to_string();
            self.held.clear();
            return Some(before).filter(|t| !t.is_empty());
        }
        // Keep the longest ending that some stop text starts with.
        let keep = held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&held[i..])))
            .unwrap_or(held.len());
        let ready = held[..keep].to_string();
        self.held.drain(..keep);
        Some(ready).filter(|t| !t.is_empty())
    }
}

fn tool_calls(calls: Vec<mistralrs_core::ToolCallResponse>) -> Vec<ToolCall> {
    calls
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments,
        })
        .collect()
}

/// The finish a streamed reply's last chunk tells.
fn last_chunk_finish(reason: &str, usage: Option<&mistralrs_core::Usage>) -> StreamEvent {
    StreamEvent::Done(Finish {
        reason: FinishReason::from_engine(reason),
        prompt_tokens: usage.map_or(0, |u| u.prompt_tokens),
        completion_tokens: usage.map_or(0, |u| u.completion_tokens),
    })
}

/// The events one engine response carries, and whether it is the last.
fn translate(response: Response) -> (Vec<Result<StreamEvent, EngineError>>, bool) {
    match response {
        Response::Chunk(chunk) => {
            let mut events = Vec::new();
            let mut finish = None;
            for choice in chunk.choices {
                if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                    events.push(Ok(StreamEvent::Text(text)));
                }
                if let Some(calls) = choice.delta.tool_calls.filter(|c| !c.is_empty()) {
                    events.push(Ok(StreamEvent::ToolCalls(tool_calls(calls))));
                }
                if let Some(reason) = choice.finish_reason {
                    finish = Some(reason);
                }
            }
            let last = finish.is_some();
            if let Some(reason) = finish {
                events.push(Ok(last_chunk_finish(&reason, chunk.usage.as_ref())));
            }
            (events, last)
        }
        Response::Done(done) => {
            let reason = done.choices.first().map_or(FinishReason::Stop, |c| {
                FinishReason::from_engine(&c.finish_reason)
            });
            let finish = Finish {
                reason,
                prompt_tokens: done.usage.prompt_tokens,
                completion_tokens: done.usage.completion_tokens,
            };
            let calls = done
                .choices
                .into_iter()
                .next()
                .and_then(|c| c.message.tool_calls)
                .filter(|c| !c.is_empty());
            let mut events = Vec::new();
            if let Some(calls) = calls {
                events.push(Ok(StreamEvent::ToolCalls(tool_calls(calls))));
            }
            events.push(Ok(StreamEvent::Done(finish)));
            (events, true)
        }
        Response::CompletionChunk(chunk) => {
            let mut events = Vec::new();
            let mut finish = None;
            for choice in chunk.choices {
                if !choice.text.is_empty() {
                    events.push(Ok(StreamEvent::Text(choice.text)));
                }
                finish = choice.finish_reason.or(finish);
            }
            let last = finish.is_some();
            if let Some(reason) = finish {
                events.push(Ok(last_chunk_finish(&reason, chunk.usage.as_ref())));
            }
            (events, last)
        }
        Response::CompletionDone(done) => {
            let choice = done.choices.into_iter().next();
            let mut events = Vec::new();
            if let Some(text) = choice.as_ref().map(|c| &c.text).filter(|t| !t.is_empty()) {
                events.push(Ok(StreamEvent::Text(text.clone())));
            }
            events.push(Ok(StreamEvent::Done(Finish {
                reason: choice.map_or(FinishReason::Stop, |c| {
                    FinishReason::from_engine(&c.finish_reason)
                }),
                prompt_tokens: done.usage.prompt_tokens,
                completion_tokens: done.usage.completion_tokens,
            })));
            (events, true)
        }
        Response::ModelError(message, _) | Response::CompletionModelError(message, _) => {
            (vec![Err(EngineError::Model(message))], true)
        }
        Response::InternalError(e) => (vec![Err(EngineError::Internal(e.to_string()))], true),
        Response::ValidationError(e) => {
            (vec![Err(EngineError::InvalidRequest(e.to_string()))], true)
        }
        _ => {
            let unexpected =
                EngineError::Internal("unexpected response kind from the engine".into());
            (vec![Err(unexpected)], true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(cut: &mut StopCut, pieces: &[&str]) -> String {
        let mut out = String::new();
        for piece in pieces {
            let events = cut.cut(vec![Ok(StreamEvent::Text(piece.to_string()))]);
            for event in events {
                if let Ok(StreamEvent::Text(t)) = event {
                    out.push_str(&t);
                }
            }
        }
        out
    }

    #[test]
    fn a_reply_ends_where_a_stop_text_begins() {
        let mut cut = StopCut::new(vec!["Paris".into(), "\n\n".into()]);
        assert_eq!(
            texts(&mut cut, &["The capital is", " Pa", "ris.", " More"]),
            "The capital is "
        );
        // The end says which stop text it was.
        let done = |reason| {
            vec![Ok(StreamEvent::Done(Finish {
                reason,
                prompt_tokens: 1,
                completion_tokens: 1,
            }))]
        };
        let ended = cut.cut(done(FinishReason::Stop));
        assert!(
            matches!(&ended[..], [Ok(StreamEvent::Done(f))] if f.reason == FinishReason::StopText(0)),
            "{ended:?}"
        );
        let mut cut = StopCut::new(vec!["END".into()]);
        // Held while it may begin the stop text, released when it does not.
        assert_eq!(texts(&mut cut, &["a E", "N"]), "a ");
        assert_eq!(texts(&mut cut, &["d é"]), "ENd é");
        let ended = cut.cut(done(FinishReason::Stop));
        assert!(
            matches!(&ended[..], [Ok(StreamEvent::Done(f))] if f.reason == FinishReason::Stop),
            "nothing was held, and no stop text ended it: {ended:?}"
        );
        let mut cut = StopCut::new(vec!["zz".into()]);
        assert_eq!(texts(&mut cut, &["a", "z"]), "a");
        let events = cut.cut(vec![Ok(StreamEvent::Done(Finish {
            reason: FinishReason::Length,
            prompt_tokens: 1,
            completion_tokens: 2,
        }))]);
        assert!(
            matches!(&events[0], Ok(StreamEvent::Text(t)) if t == "z"),
            "{events:?}"
        );
    }
}
