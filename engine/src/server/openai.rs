//! The OpenAI chat-completions wire format: what a request may hold, how it is checked,
//! and the objects the server answers with.

use std::ops::RangeInclusive;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    ChatRequest, Message, Repetition, ReplyFormat, Role, Tool, ToolCall, ToolChoice, AGENT_PRIORITY,
};

/// A chat completion request as clients send it. Unknown fields are ignored, as OpenAI's
/// own server does for the ones it does not use.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionBody {
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
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
    /// The reply's shape: `text`, `json_object` (JSON mode) or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call.
    pub tools: Option<Vec<WireTool>>,
    /// `"auto"`, `"none"`, or `{"type": "function", "function": {"name": …}}`.
    pub tool_choice: Option<WireToolChoice>,
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunction,
}

#[derive(Debug, Deserialize)]
pub struct WireFunction {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum WireToolChoice {
    Mode(String),
    Function { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// An assistant message's call of a tool, as clients send it back.
#[derive(Debug, Deserialize)]
pub struct WireToolCall {
    pub id: String,
    pub function: WireCalledFunction,
}

#[derive(Debug, Deserialize)]
pub struct WireCalledFunction {
    pub name: String,
    pub arguments: String,
}

/// `response_format` as OpenAI takes it.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema (always held to it: `strict` is accepted and changes nothing).
    JsonSchema {
        json_schema: JsonSchemaFormat,
    },
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    /// Required by OpenAI; unused here.
    pub name: String,
    pub schema: Option<Value>,
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

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant message's tool calls.
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tokens: 2048,
            default_max_tokens: 256,
            max_messages: 4096,
            priorities: AGENT_PRIORITY..=AGENT_PRIORITY + 9,
        }
    }
}

impl ChatCompletionBody {
    /// Checks the request and turns it into the engine's.
    pub fn into_request(self, limits: &Limits) -> Result<(ChatRequest, bool), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                Some("messages"),
                "messages must hold at least one message",
            ));
        }
        if self.messages.len() > limits.max_messages {
            return Err(ApiError::invalid(
                Some("messages"),
                format!(
                    "{} messages is more than this server takes ({})",
                    self.messages.len(),
                    limits.max_messages
                ),
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.into_iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => {
                    return Err(ApiError::invalid(
                        Some("messages"),
                        format!("messages[{i}].role {other:?} is not one of system, developer, user, assistant, tool"),
                    ))
                }
            };
            if role == Role::Tool && m.tool_call_id.is_none() {
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!("messages[{i}] is a tool message without its tool_call_id"),
                ));
            }
            if role != Role::Assistant && m.tool_calls.is_some() {
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!("messages[{i}]: only an assistant message holds tool_calls"),
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    Some("messages"),
                                    format!(
                                        "messages[{i}] has a {kind:?} part; only text is served"
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            messages.push(Message {
                tool_calls: m
                    .tool_calls
                    .unwrap_or_default()
                    .into_iter()
                    .map(|call| ToolCall {
                        id: call.id,
                        name: call.function.name,
                        arguments: call.function.arguments,
                    })
                    .collect(),
                tool_call_id: m.tool_call_id,
                ..Message::new(role, content)
            });
        }
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
        let any_object = || json!({"type": "object"});
        let format = match self.response_format {
            None | Some(ResponseFormat::Text) => ReplyFormat::Text,
            Some(ResponseFormat::JsonObject) => ReplyFormat::JsonSchema(any_object()),
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                ReplyFormat::JsonSchema(json_schema.schema.unwrap_or_else(any_object))
            }
        };
        let (tools, tool_choice) = tools(self.tools, self.tool_choice)?;
        let include_usage = self.stream_options.is_some_and(|o| o.include_usage);
        Ok((
            ChatRequest {
                messages,
                max_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                repetition: Repetition {
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    dry_multiplier: None,
                },
                priority: self
                    .priority
                    .unwrap_or(AGENT_PRIORITY)
                    .clamp(*limits.priorities.start(), *limits.priorities.end()),
                session: None,
                stop,
                format,
                tools,
                tool_choice,
            },
            include_usage,
        ))
    }
}

/// Checks `tools` and `tool_choice` as OpenAI does: functions only, a choice only with
/// tools, a named choice among them. `"required"` is refused: mistral.rs cannot hold the
/// model to calling some tool without naming one.
fn tools(
    tools: Option<Vec<WireTool>>,
    choice: Option<WireToolChoice>,
) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let mut checked = Vec::new();
    for (i, tool) in tools.into_iter().flatten().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                Some("tools"),
                format!(
                    "tools[{i}].type {:?}: only function tools are served",
                    tool.kind
                ),
            ));
        }
        if tool.function.name.is_empty() {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools[{i}] has no name"),
            ));
        }
        checked.push(Tool {
            name: tool.function.name,
            description: tool.function.description,
            parameters: tool.function.parameters,
        });
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(_) if checked.is_empty() => {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                "tool_choice is only allowed with tools",
            ))
        }
        Some(WireToolChoice::Mode(mode)) => match mode.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            other => {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!(
                        "tool_choice {other:?} is not served: use auto, none, or name a function"
                    ),
                ))
            }
        },
        Some(WireToolChoice::Function { function }) => {
            if !checked.iter().any(|t| t.name == function.name) {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!(
                        "tool_choice names {:?}, which is not among the tools",
                        function.name
                    ),
                ));
            }
            ToolChoice::Function(function.name)
        }
    };
    Ok((checked, choice))
}

/// Tool calls as OpenAI's messages carry them, and its stream's deltas (`indexed`: each
/// with its place in the list).
pub fn tool_calls(calls: &[ToolCall], indexed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let mut call = json!({"id": call.id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}});
            if indexed {
                call["index"] = json!(index);
            }
            call
        })
        .collect()
}

pub fn chunk(id: &str, created: u64, model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[cfg(test)]
mod tests;
