//! OpenAI's wire format for completions, of chats (`chat`) and of text (`completions`):
//! what a request may hold, how it is checked, and the objects the server answers with.

mod chat;
mod completions;

use std::ops::RangeInclusive;

use serde::Deserialize;
use serde_json::{json, Value};

pub use chat::ChatCompletionBody;
pub use completions::CompletionBody;

use crate::{ChatRequest, Finish, Prompt, Repetition, StreamEvent, ToolCall, AGENT_PRIORITY};

/// Which of OpenAI's completion APIs a request came through; it decides the answer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`: text continued, no chat template.
    Text,
}

impl Api {
    /// The request's field that holds its prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Api::Chat => "messages",
            Api::Text => "prompt",
        }
    }

    /// Parses and checks a request's body.
    pub fn parse(self, body: &[u8], limits: &Limits) -> Result<Parsed, ApiError> {
        let malformed =
            |e: serde_json::Error| ApiError::invalid(None, format!("malformed JSON body: {e}"));
        match self {
            Api::Chat => serde_json::from_slice::<ChatCompletionBody>(body)
                .map_err(malformed)?
                .into_request(limits),
            Api::Text => serde_json::from_slice::<CompletionBody>(body)
                .map_err(malformed)?
                .into_request(limits),
        }
    }
}

/// A checked request.
#[derive(Debug)]
pub struct Parsed {
    pub request: ChatRequest,
    /// Answered as server-sent events.
    pub stream: bool,
    /// The stream's last chunk carries the token counts.
    pub include_usage: bool,
}

/// The settings every completion takes, chat or text, as clients send them.
#[derive(Debug, Deserialize)]
pub struct Settings {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub n: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Scheduling priority, lower is more urgent (vLLM's extension), within
    /// [`Limits::priorities`].
    pub priority: Option<i32>,
    /// Up to four texts that end the reply (one string or a list).
    pub stop: Option<Stop>,
    /// Sampling seeded with this gives the same reply to the same request (OpenAI's is any
    /// 64-bit integer).
    pub seed: Option<i64>,
}

impl Settings {
    /// Checks the settings and makes the engine's request for `prompt`.
    fn into_request(self, prompt: Prompt, limits: &Limits) -> Result<Parsed, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(Some("n"), "only n = 1 is supported"));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => limits.default_max_tokens,
            Some(0) => {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    "max_tokens must be at least 1",
                ))
            }
            Some(n) if n > limits.max_tokens as u64 => {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    format!(
                        "max_tokens {n} is more than this server allows ({})",
                        limits.max_tokens
                    ),
                ))
            }
            Some(n) => n as usize,
        };
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::invalid(
                    Some("temperature"),
                    "temperature must be between 0 and 2",
                ));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid(Some("top_p"), "top_p must be in (0, 1]"));
            }
        }
        for (name, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
                return Err(ApiError::invalid(
                    Some(name),
                    format!("{name} must be between -2 and 2"),
                ));
            }
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(text)) => vec![text],
            Some(Stop::Many(texts)) => texts,
        };
        if stop.len() > MAX_STOPS || stop.iter().any(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("stop takes at most {MAX_STOPS} texts, none of them empty"),
            ));
        }
        // The engine searches each stop text after every token, on its one thread.
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        ApiError::at_most("stop", longest, limits.max_stop_bytes, || {
            format!("a stop text of {longest} bytes")
        })?;
        Ok(Parsed {
            request: ChatRequest {
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                // The bits as they are: a negative seed is as good a seed as any.
                seed: self.seed.map(|seed| seed as u64),
                repetition: Repetition {
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    dry_multiplier: None,
                },
                priority: self
                    .priority
                    .unwrap_or(AGENT_PRIORITY)
                    .clamp(*limits.priorities.start(), *limits.priorities.end()),
                stop,
                ..ChatRequest::of(prompt, 0)
            },
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
        })
    }
}

/// `stop` as OpenAI takes it: one text, or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Most stop texts a request may give, as OpenAI allows.
const MAX_STOPS: usize = 4;

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A client error: HTTP status, OpenAI error type, the offending parameter, a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
    /// OpenAI's code for the case, where it names one (`context_length_exceeded`).
    pub code: Option<&'static str>,
    /// Seconds after which the client may try again (sent as `Retry-After`).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            param: None,
            message: message.into(),
            code: None,
            retry_after_s: None,
        }
    }

    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            param,
            ..Self::new(400, "invalid_request_error", message)
        }
    }

    /// `Err` naming `field` when `found` is over `most`: "`what`; this server takes at most
    /// `most`" (every bound on a field that costs the engine work says it so).
    pub fn at_most(
        field: &'static str,
        found: usize,
        most: usize,
        what: impl FnOnce() -> String,
    ) -> Result<(), Self> {
        if found <= most {
            return Ok(());
        }
        let message = format!("{}; this server takes at most {most}", what());
        Err(Self::invalid(Some(field), message))
    }

    /// A failure on the server's side (500).
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    /// The server is at its bound on requests in flight (429, try again shortly).
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            retry_after_s: Some(1),
            ..Self::new(429, "rate_limit_error", message)
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Limits the server enforces before a request reaches the engine.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most tokens a reply may ask for (default 2048).
    pub max_tokens: usize,
    /// Reply length when the request names none (default 256).
    pub default_max_tokens: usize,
    /// Messages a request may hold (default 4096): each costs the chat template work on
    /// the engine's thread before any length check.
    pub max_messages: usize,
    /// The priorities a request may take (default [`AGENT_PRIORITY`] to 9 below it): one
    /// asking for more urgency gets the range's most urgent, one asking for less its least.
    /// Voice turns come in process at a more urgent priority, so no client outranks a
    /// caller unless the operator widens this; the bound also bounds `/metrics`' rows.
    pub priorities: RangeInclusive<i32>,
    /// Longest stop text, in bytes (default 256): mistral.rs tokenizes each at admission
    /// and searches the reply for it after every token, on the engine's thread.
    pub max_stop_bytes: usize,
    /// Tools a request may offer (default 128, OpenAI's bound).
    pub max_tools: usize,
    /// Their definitions together, as JSON (default 64 KiB): the chat template renders
    /// them into the prompt and the grammar constraint compiles their parameters.
    pub max_tools_bytes: usize,
    /// A `response_format` schema, as JSON (default 64 KiB), compiled into a grammar on
    /// the engine's thread.
    pub max_schema_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tokens: 2048,
            default_max_tokens: 256,
            max_messages: 4096,
            priorities: AGENT_PRIORITY..=AGENT_PRIORITY + 9,
            max_stop_bytes: 256,
            max_tools: 128,
            max_tools_bytes: 64 << 10,
            max_schema_bytes: 64 << 10,
        }
    }
}

/// One answer as OpenAI shapes it, whole or piece by piece.
pub struct Answer {
    api: Api,
    id: String,
    created: u64,
    model: String,
    /// A streamed chat names the speaker in its first delta only.
    role_sent: bool,
}

impl Answer {
    /// An answer to the `number`th request.
    pub fn new(api: Api, number: u64, created: u64, model: String) -> Self {
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Text => "cmpl",
        };
        Self {
            api,
            id: format!("{prefix}-{number}"),
            created,
            model,
            role_sent: false,
        }
    }

    /// The whole answer, for a request not streamed.
    pub fn whole(&self, text: String, calls: &[ToolCall], finish: &Finish) -> Value {
        let reason = finish.reason.as_str();
        let choice = match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    message["tool_calls"] = chat::tool_calls(calls, false);
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": message, "finish_reason": reason})
            }
            Api::Text => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
            }
        };
        let mut whole = self.envelope(choice);
        whole["object"] = json!(match self.api {
            Api::Chat => "chat.completion",
            Api::Text => "text_completion",
        });
        whole["usage"] = usage(finish);
        whole
    }

    /// A streamed answer's chunk for `event` (`None` for what this API cannot carry).
    pub fn piece(&mut self, event: StreamEvent, include_usage: bool) -> Option<Value> {
        let choice = match (self.api, event) {
            (Api::Chat, StreamEvent::Text(text)) => json!({"content": text}),
            (Api::Chat, StreamEvent::ToolCalls(calls)) => {
                json!({"tool_calls": chat::tool_calls(&calls, true)})
            }
            (Api::Text, StreamEvent::Text(text)) => {
                return Some(self.envelope(
                    json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null}),
                ));
            }
            (Api::Text, StreamEvent::ToolCalls(_)) => return None,
            (api, StreamEvent::Done(finish)) => {
                let reason = finish.reason.as_str();
                let choice = match api {
                    Api::Chat => json!({"index": 0, "delta": {}, "finish_reason": reason}),
                    Api::Text => {
                        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
                    }
                };
                let mut last = self.envelope(choice);
                if include_usage {
                    last["usage"] = usage(&finish);
                }
                return Some(last);
            }
        };
        let mut delta = choice;
        if !self.role_sent {
            self.role_sent = true;
            delta["role"] = json!("assistant");
        }
        Some(self.envelope(json!({"index": 0, "delta": delta, "finish_reason": null})))
    }

    /// A chunk (or, its object renamed, the whole answer) around one choice.
    fn envelope(&self, choice: Value) -> Value {
        json!({
            "id": self.id,
            "object": match self.api {
                Api::Chat => "chat.completion.chunk",
                Api::Text => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }
}

fn usage(finish: &Finish) -> Value {
    let (prompt, completion) = (finish.prompt_tokens, finish.completion_tokens);
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[cfg(test)]
mod tests;
