//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), as Claude
//! Code and Anthropic's SDKs speak it: a system prompt (text or blocks), messages of text,
//! `tool_use` and `tool_result` blocks, client tools with an `input_schema`, and
//! `tool_choice`. Content this engine cannot take (images, documents, thinking, a server
//! tool) is refused by name, never dropped. The answer's shape is in `answer.rs`.

mod answer;

use serde::Deserialize;
use serde_json::{json, Value};

use super::api::Parsed;
use super::error::ApiError;
use super::limits::{check_sampling, checked_choice, Limits};
use super::openai::malformed;
use sublet_engine::{ChatRequest, Message, Prompt, ReplyFormat, Role, Tool, ToolCall, ToolChoice};

/// A Messages request as clients send it. Unknown fields are ignored (Claude Code sends
/// `context_management`, `output_config`, ...), as Anthropic's server does for betas a
/// client has not asked for.
#[derive(Debug, Deserialize)]
struct MessagesBody {
    messages: Vec<WireMessage>,
    system: Option<Content>,
    /// Required by Anthropic for a reply (not for `count_tokens`).
    max_tokens: Option<u64>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<WireToolChoice>,
    thinking: Option<Thinking>,
    /// `format`: a JSON Schema the reply is held to (structured outputs); `effort` is
    /// taken and changes nothing.
    output_config: Option<OutputConfig>,
    /// Scheduling priority, as the OpenAI routes take it (an extension).
    priority: Option<i32>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    role: String,
    content: Content,
}

/// A message's content (or the system prompt): a text, or blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block, of any type: which fields it has depends on its type.
#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// A `tool_use` block's.
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
    /// A `tool_result` block's.
    tool_use_id: Option<String>,
    content: Option<Box<Content>>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Deserialize)]
struct WireTool {
    /// Absent or `custom` for a client tool; a server tool (`web_search_…`, `bash_…`)
    /// names its own type.
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    description: Option<String>,
    input_schema: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
struct WireToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OutputConfig {
    format: Option<OutputFormat>,
}

#[derive(Debug, Deserialize)]
struct OutputFormat {
    #[serde(rename = "type")]
    kind: String,
    schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
}

/// Parses and checks a Messages request.
pub fn parse(body: &[u8], limits: &Limits) -> Result<Parsed, ApiError> {
    let body: MessagesBody = serde_json::from_slice(body).map_err(malformed)?;
    let Some(max_tokens) = body.max_tokens else {
        return Err(ApiError::invalid(
            Some("max_tokens"),
            "max_tokens: field required",
        ));
    };
    let stream = body.stream;
    let request = into_request(body, Some(max_tokens), limits)?;
    let answer = answer::Answer::new(request.stop.clone());
    Ok(Parsed {
        request,
        stream,
        answer: Box::new(answer),
    })
}

/// The request whose prompt `count_tokens` counts (no `max_tokens` needed).
pub fn counted_request(body: &[u8], limits: &Limits) -> Result<ChatRequest, ApiError> {
    let body: MessagesBody = serde_json::from_slice(body).map_err(malformed)?;
    into_request(body, None, limits)
}

fn into_request(
    body: MessagesBody,
    max_tokens: Option<u64>,
    limits: &Limits,
) -> Result<ChatRequest, ApiError> {
    if let Some(thinking) = &body.thinking {
        // Adaptive thinking lets the model answer without a thinking block, as this
        // engine always does; thinking required is refused.
        if !matches!(thinking.kind.as_str(), "adaptive" | "disabled") {
            return Err(ApiError::invalid(
                Some("thinking"),
                format!(
                    "thinking {:?} is not served: this engine's model does not think aloud \
                     (send adaptive or disabled, or leave it out)",
                    thinking.kind
                ),
            ));
        }
    }
    check_sampling(body.temperature, 1.0, body.top_p)?;
    if body.top_k == Some(0) {
        return Err(ApiError::invalid(Some("top_k"), "top_k must be at least 1"));
    }
    if body.messages.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages: at least one message is required",
        ));
    }
    ApiError::at_most("messages", body.messages.len(), limits.max_messages, || {
        format!("{} messages", body.messages.len())
    })?;
    let mut messages = Vec::with_capacity(body.messages.len() + 1);
    if let Some(system) = body.system {
        messages.push(Message::new(Role::System, texts(system, "system")?));
    }
    for (i, message) in body.messages.into_iter().enumerate() {
        append(&mut messages, i, message)?;
    }
    let tools = tools(body.tools.unwrap_or_default(), limits)?;
    let choice = match body.tool_choice {
        None => None,
        Some(choice) => Some(tool_choice(choice)?),
    };
    let tool_choice = checked_choice("tool_choice", choice, &tools)?;
    let format = match body.output_config.and_then(|c| c.format) {
        None => ReplyFormat::Text,
        Some(OutputFormat { kind, schema }) => match (kind.as_str(), schema) {
            ("json_schema", Some(schema)) => {
                limits.schema("output_config.format", &schema)?;
                ReplyFormat::JsonSchema(schema)
            }
            _ => {
                return Err(ApiError::invalid(
                    Some("output_config.format"),
                    format!("output_config.format of type {kind:?} is not served: send json_schema with its schema"),
                ))
            }
        },
    };
    Ok(ChatRequest {
        max_tokens: match max_tokens {
            Some(asked) => limits.max_tokens("max_tokens", Some(asked))?,
            None => limits.default_max_tokens,
        },
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k.map(|k| k as usize),
        priority: limits.priority(body.priority),
        stop: limits.stops("stop_sequences", body.stop_sequences.unwrap_or_default())?,
        tools,
        tool_choice,
        format,
        ..ChatRequest::of(Prompt::Chat(messages), 0)
    })
}

/// The text of a system prompt or a tool's result: a text, or text blocks only.
fn texts(content: Content, field: &'static str) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text),
        Content::Blocks(blocks) => {
            let mut text = String::new();
            for block in blocks {
                match (block.kind.as_str(), block.text) {
                    ("text", Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&t);
                    }
                    (kind, _) => return Err(unserved(field, kind)),
                }
            }
            Ok(text)
        }
    }
}

fn unserved(field: &'static str, kind: &str) -> ApiError {
    ApiError::invalid(
        Some(field),
        format!("{field} holds a {kind:?} block; this engine takes text, tool_use and tool_result blocks only"),
    )
}

/// Appends the `i`th message: a user message's tool results become tool messages (ahead
/// of its text), an assistant's `tool_use` blocks its tool calls.
fn append(messages: &mut Vec<Message>, i: usize, message: WireMessage) -> Result<(), ApiError> {
    let role = match message.role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        // Claude Code sends its environment as a system message between turns.
        "system" => Role::System,
        other => {
            return Err(ApiError::invalid(
                Some("messages"),
                format!("messages[{i}].role {other:?} is not one of user, assistant, system"),
            ))
        }
    };
    let blocks = match message.content {
        Content::Text(text) => {
            messages.push(Message::new(role, text));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut said = Message::new(role, String::new());
    for block in blocks {
        match (block.kind.as_str(), role) {
            ("text", _) => {
                if !said.content.is_empty() {
                    said.content.push('\n');
                }
                said.content.push_str(block.text.as_deref().unwrap_or(""));
            }
            ("tool_use", Role::Assistant) => {
                let (Some(id), Some(name)) = (block.id, block.name) else {
                    return Err(ApiError::invalid(
                        Some("messages"),
                        format!("messages[{i}] has a tool_use block without its id or name"),
                    ));
                };
                let input = block.input.unwrap_or_else(|| json!({}));
                said.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                });
            }
            ("tool_result", Role::User) => {
                let Some(id) = block.tool_use_id else {
                    return Err(ApiError::invalid(
                        Some("messages"),
                        format!("messages[{i}] has a tool_result block without its tool_use_id"),
                    ));
                };
                let mut text = match block.content {
                    Some(content) => texts(*content, "messages")?,
                    None => String::new(),
                };
                if block.is_error {
                    text.insert_str(0, "Error: ");
                }
                messages.push(Message {
                    tool_call_id: Some(id),
                    ..Message::new(Role::Tool, text)
                });
            }
            (kind @ ("tool_use" | "tool_result"), _) => {
                return Err(ApiError::invalid(
                    Some("messages"),
                    format!(
                        "messages[{i}]: a {kind} block belongs in {} message",
                        if kind == "tool_use" {
                            "an assistant"
                        } else {
                            "a user"
                        }
                    ),
                ))
            }
            (kind, _) => return Err(unserved("messages", kind)),
        }
    }
    if !said.content.is_empty() || !said.tool_calls.is_empty() {
        messages.push(said);
    }
    Ok(())
}

/// Client tools, checked: a server tool (one with a type of its own) is refused by name.
fn tools(wire: Vec<WireTool>, limits: &Limits) -> Result<Vec<Tool>, ApiError> {
    let mut tools = Vec::with_capacity(wire.len());
    for (i, tool) in wire.into_iter().enumerate() {
        if let Some(kind) = tool.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools[{i}] is the server tool {kind:?}; this engine serves client tools (with an input_schema) only"),
            ));
        }
        tools.push(Tool {
            name: tool.name,
            description: tool.description,
            parameters: tool.input_schema,
        });
    }
    limits.tools("tools", tools)
}

/// `tool_choice` as Anthropic takes it. `any` is refused: mistral.rs cannot hold the
/// model to calling some tool without naming one.
fn tool_choice(choice: WireToolChoice) -> Result<ToolChoice, ApiError> {
    match (choice.kind.as_str(), choice.name) {
        ("auto", _) => Ok(ToolChoice::Auto),
        ("none", _) => Ok(ToolChoice::None),
        ("tool", Some(name)) => Ok(ToolChoice::Function(name)),
        ("tool", None) => Err(ApiError::invalid(
            Some("tool_choice"),
            "tool_choice of type tool names its tool",
        )),
        (other, _) => Err(ApiError::invalid(
            Some("tool_choice"),
            format!("tool_choice {other:?} is not served: use auto, none, or name a tool"),
        )),
    }
}

/// A refusal as Anthropic shapes it: `{"type": "error", "error": {"type", "message"}}`,
/// its types Anthropic's names for the case.
pub fn error_body(error: &ApiError) -> Value {
    let kind = match (error.status, error.kind) {
        (413, _) => "request_too_large",
        (_, "server_error") => "api_error",
        (503, _) => "overloaded_error",
        (_, kind) => kind,
    };
    // Claude Code reads "prompt is too long" as the context's end (and offers to compact).
    let message = match error.code {
        Some("context_length_exceeded") => format!("prompt is too long: {}", error.message),
        _ => error.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests;
