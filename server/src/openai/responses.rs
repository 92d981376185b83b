//! OpenAI's Responses API (`/v1/responses`), as Codex and the `openai` SDK speak it:
//! `input` as a text or items (messages, `function_call`, `function_call_output`),
//! `instructions`, function tools, `tool_choice`, `max_output_tokens`, `text.format`
//! (a JSON Schema held by the grammar constraint), and `previous_response_id` over the
//! responses kept in memory ([`Kept`]). Input it cannot take (images, files, reasoning
//! items, hosted tools) is refused by name. The answer's shape is in `answer.rs`.

mod answer;
mod kept;

use serde::Deserialize;
use serde_json::{json, Value};

pub use kept::Kept;

use super::chat::mode_choice;
use super::{malformed, ApiError, Limits};
use crate::api::Parsed;
use crate::limits::{check_sampling, checked_choice};
use sublet_engine::{ChatRequest, Message, Prompt, ReplyFormat, Role, Tool, ToolCall, ToolChoice};

/// A Responses request as clients send it. Unknown fields are ignored (Codex sends
/// `include`, `prompt_cache_key`, `reasoning`, `client_metadata`, ...).
#[derive(Debug, Deserialize)]
struct ResponsesBody {
    input: Input,
    instructions: Option<String>,
    tools: Option<Vec<WireTool>>,
    tool_choice: Option<WireToolChoice>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    text: Option<TextConfig>,
    #[serde(default)]
    stream: bool,
    /// Kept for `previous_response_id` unless `false` (OpenAI's default is to keep).
    store: Option<bool>,
    previous_response_id: Option<String>,
    /// Scheduling priority, as the chat route takes it (an extension).
    priority: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Item>),
}

/// An input item, of any type: which fields it has depends on its type.
#[derive(Debug, Deserialize)]
struct Item {
    /// `message` when absent (an "easy" input message: a role and content).
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<ItemContent>,
    /// A `function_call`'s or `function_call_output`'s.
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    output: Option<ItemContent>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ItemContent {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    parameters: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireToolChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct TextConfig {
    format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
struct TextFormat {
    #[serde(rename = "type")]
    kind: String,
    schema: Option<Value>,
}

/// Parses and checks a Responses request; `kept` holds the responses it may continue.
pub fn parse(body: &[u8], limits: &Limits, kept: &Kept) -> Result<Parsed, ApiError> {
    let body: ResponsesBody = serde_json::from_slice(body).map_err(malformed)?;
    check_sampling(body.temperature, 2.0, body.top_p)?;
    let max_tokens = limits.max_tokens("max_output_tokens", body.max_output_tokens)?;
    // The conversation so far: the kept one continued, then this request's input.
    let mut conversation = match &body.previous_response_id {
        None => Vec::new(),
        Some(id) => kept.get(id).ok_or_else(|| ApiError {
            code: Some("previous_response_not_found"),
            ..ApiError::invalid(
                Some("previous_response_id"),
                format!("previous response with id {id:?} not found (this server keeps the last {} responses, in memory)", kept::KEPT_MOST),
            )
        })?.to_vec(),
    };
    let input = match body.input {
        Input::Text(text) => vec![Message::new(Role::User, text)],
        Input::Items(items) => items_to_messages(items)?,
    };
    if input.is_empty() && conversation.is_empty() {
        return Err(ApiError::invalid(Some("input"), "input holds no item"));
    }
    conversation.extend(input);
    ApiError::at_most("input", conversation.len(), limits.max_messages, || {
        format!(
            "{} input items (with the previous response's)",
            conversation.len()
        )
    })?;
    // Instructions are this request's own: a continued response's are not carried over.
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = body.instructions.filter(|i| !i.is_empty()) {
        messages.push(Message::new(Role::System, instructions));
    }
    messages.extend(conversation.iter().cloned());
    let tools = tools(body.tools.unwrap_or_default(), limits)?;
    let choice = match body.tool_choice {
        None => None,
        Some(WireToolChoice::Mode(mode)) => Some(mode_choice(&mode)?),
        Some(WireToolChoice::Function { kind, name }) => match (kind.as_str(), name) {
            ("function", Some(name)) => Some(ToolChoice::Function(name)),
            _ => {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!("tool_choice of type {kind:?} is not served: use auto, none, or name a function"),
                ))
            }
        },
    };
    let tool_choice = checked_choice("tool_choice", choice, &tools)?;
    let format = match body.text.and_then(|t| t.format) {
        None => ReplyFormat::Text,
        Some(format) => match format.kind.as_str() {
            "text" => ReplyFormat::Text,
            "json_object" => ReplyFormat::JsonSchema(json!({"type": "object"})),
            "json_schema" => {
                ReplyFormat::JsonSchema(format.schema.unwrap_or_else(|| json!({"type": "object"})))
            }
            other => {
                return Err(ApiError::invalid(
                    Some("text.format"),
                    format!("text.format {other:?} is not one of text, json_object, json_schema"),
                ))
            }
        },
    };
    if let ReplyFormat::JsonSchema(schema) = &format {
        limits.schema("text.format", schema)?;
    }
    let request = ChatRequest {
        max_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        priority: limits.priority(body.priority),
        format,
        tools,
        tool_choice,
        ..ChatRequest::of(Prompt::Chat(messages), 0)
    };
    let keep = (body.store != Some(false)).then(|| (kept.clone(), conversation));
    let echo = answer::Echo {
        previous_response_id: body.previous_response_id,
        max_output_tokens: body.max_output_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        store: keep.is_some(),
    };
    Ok(Parsed {
        request,
        stream: body.stream,
        answer: Box::new(answer::Answer::new(echo, keep)),
    })
}

/// The input items as chat messages: function calls join the assistant message before
/// them (one turn's text and calls are one message to a chat template).
fn items_to_messages(items: Vec<Item>) -> Result<Vec<Message>, ApiError> {
    let mut messages: Vec<Message> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let invalid = |message: String| ApiError::invalid(Some("input"), message);
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    other => {
                        return Err(invalid(format!(
                            "input[{i}].role {other:?} is not one of user, assistant, system, developer"
                        )))
                    }
                };
                let content = match item.content {
                    Some(content) => text_of(content, i)?,
                    None => String::new(),
                };
                messages.push(Message::new(role, content));
            }
            "function_call" => {
                let (Some(id), Some(name)) = (item.call_id, item.name) else {
                    return Err(invalid(format!(
                        "input[{i}] is a function_call without its call_id or name"
                    )));
                };
                let call = ToolCall {
                    id,
                    name,
                    arguments: item.arguments.unwrap_or_default(),
                };
                match messages.last_mut() {
                    Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
                    _ => messages.push(Message {
                        tool_calls: vec![call],
                        ..Message::new(Role::Assistant, String::new())
                    }),
                }
            }
            "function_call_output" => {
                let Some(id) = item.call_id else {
                    return Err(invalid(format!(
                        "input[{i}] is a function_call_output without its call_id"
                    )));
                };
                let output = match item.output {
                    Some(output) => text_of(output, i)?,
                    None => String::new(),
                };
                messages.push(Message {
                    tool_call_id: Some(id),
                    ..Message::new(Role::Tool, output)
                });
            }
            other => {
                return Err(invalid(format!(
                    "input[{i}] is a {other:?} item; this engine takes message, function_call and function_call_output items only"
                )))
            }
        }
    }
    Ok(messages)
}

/// The text of a message's content or a call's output: text parts only.
fn text_of(content: ItemContent, i: usize) -> Result<String, ApiError> {
    match content {
        ItemContent::Text(text) => Ok(text),
        ItemContent::Parts(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&t);
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            Some("input"),
                            format!("input[{i}] has a {kind:?} part; this engine takes text only"),
                        ))
                    }
                }
            }
            Ok(text)
        }
    }
}

/// Function tools, checked: a hosted tool (web search, file search, ...) is refused by
/// name.
fn tools(wire: Vec<WireTool>, limits: &Limits) -> Result<Vec<Tool>, ApiError> {
    let mut tools = Vec::with_capacity(wire.len());
    for (i, tool) in wire.into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                Some("tools"),
                format!(
                    "tools[{i}].type {:?}: only function tools are served",
                    tool.kind
                ),
            ));
        }
        tools.push(Tool {
            name: tool.name.unwrap_or_default(),
            description: tool.description,
            parameters: tool.parameters,
        });
    }
    limits.tools("tools", tools)
}

#[cfg(test)]
mod tests;
