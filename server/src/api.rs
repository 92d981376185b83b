//! The APIs the server speaks, and what each must say for itself.
//!
//! Every API's request becomes the engine's one [`ChatRequest`]; admission, the bound on
//! requests in flight, the prompt's length, the schema's compilation, cancellation and
//! the counts are the server's, the same for all (`serve_request` in `mod.rs`). What
//! differs is the wire: how a body reads ([`Api::parse`]), how a refusal is shaped
//! ([`Api::error_body`]), and how an answer goes out, whole or as events ([`Answer`]).
//! Each wire lives in its own module: OpenAI's in `openai/` (chat completions,
//! completions, responses), Anthropic's in `anthropic/`.

use axum::response::sse::Event;
use serde_json::Value;

use super::anthropic;
use super::openai::{self, responses, ApiError, Limits};
use sublet_engine::{ChatRequest, Finish, StreamEvent, ToolCall};

/// Which API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Api {
    /// OpenAI's `/v1/chat/completions`.
    Chat,
    /// OpenAI's `/v1/completions`: text continued, no chat template.
    Text,
    /// OpenAI's `/v1/responses`.
    Responses,
    /// Anthropic's `/v1/messages`.
    Messages,
}

impl Api {
    /// The request's field that holds its prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Api::Chat | Api::Messages => "messages",
            Api::Text => "prompt",
            Api::Responses => "input",
        }
    }

    /// The request's field that holds the reply's schema.
    pub fn format_field(self) -> &'static str {
        match self {
            Api::Chat | Api::Text => "response_format",
            Api::Responses => "text.format",
            Api::Messages => "output_config.format",
        }
    }

    /// Its name in `/metrics`' `api` label.
    pub fn label(self) -> &'static str {
        match self {
            Api::Chat => "chat_completions",
            Api::Text => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    /// Parses and checks a request's body. `kept` holds the responses a `/v1/responses`
    /// request may continue.
    pub fn parse(
        self,
        body: &[u8],
        limits: &Limits,
        kept: &responses::Kept,
    ) -> Result<Parsed, ApiError> {
        match self {
            Api::Chat | Api::Text => openai::parse(self, body, limits),
            Api::Responses => responses::parse(body, limits, kept),
            Api::Messages => anthropic::parse(body, limits),
        }
    }

    /// A refusal's JSON body, in this API's shape.
    pub fn error_body(self, error: &ApiError) -> Value {
        match self {
            Api::Messages => anthropic::error_body(error),
            _ => error.body(),
        }
    }
}

/// A checked request, and how its answer will be shaped.
pub struct Parsed {
    pub request: ChatRequest,
    /// Answered as server-sent events.
    pub stream: bool,
    pub answer: Box<dyn Answer>,
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parsed")
            .field("request", &self.request)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// What names an admitted request's answer.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The request's number among the server's (its answer's id is made from it).
    pub number: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The model's name, as `/v1/models` gives it.
    pub model: String,
}

/// One answer in its API's shape.
pub trait Answer: Send {
    /// The whole answer, for a request not streamed.
    fn whole(
        &mut self,
        admitted: &Admitted,
        text: String,
        calls: Vec<ToolCall>,
        finish: &Finish,
    ) -> Value;

    /// The stream's events for one of the engine's, appended to `out` (none for what the
    /// API cannot carry).
    fn events(&mut self, admitted: &Admitted, event: StreamEvent, out: &mut Vec<Event>);

    /// What follows the stream's last event (OpenAI's chat says `[DONE]`).
    fn end(&mut self, _out: &mut Vec<Event>) {}

    /// The event that tells a streamed reply failed after it began.
    fn failed(&mut self, admitted: &Admitted, error: &ApiError) -> Event;
}

/// An event of a stream whose events are named (Anthropic's, OpenAI's responses): the
/// name on its `event:` line and, as both APIs do, in the data's `type`.
pub fn named(name: &'static str, mut data: Value) -> Event {
    data["type"] = Value::from(name);
    Event::default().event(name).data(data.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The `event:` names and data of a stream's events.
    pub(crate) fn written(events: Vec<Event>) -> Vec<(String, Value)> {
        use axum::response::IntoResponse;
        let stream =
            futures::stream::iter(events.into_iter().map(Ok::<_, std::convert::Infallible>));
        let body = axum::response::sse::Sse::new(stream)
            .into_response()
            .into_body();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(axum::body::to_bytes(body, 1 << 20))
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let field = |name: &str| {
                    e.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .unwrap_or_default()
                        .to_string()
                };
                (
                    field("event: "),
                    serde_json::from_str(&field("data: ")).unwrap(),
                )
            })
            .collect()
    }
}
