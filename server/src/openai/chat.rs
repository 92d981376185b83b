//! The chat-completions request: messages (with tool calls and tool results), tools,
//! and the reply's format, on top of the settings every completion takes.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, Checked, Limits, Settings};
use crate::limits::checked_choice;
use sublet_engine::{Message, Prompt, ReplyFormat, Role, Tool, ToolCall, ToolChoice};

/// A chat completion request as clients send it. Unknown fields are ignored, as OpenAI's
/// own server does for the ones it does not use.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionBody {
    pub messages: Vec<WireMessage>,
    /// The reply's shape: `text`, `json_object` (JSON mode) or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call.
    pub tools: Option<Vec<WireTool>>,
    /// `"auto"`, `"none"`, or `{"type": "function", "function": {"name": …}}`.
    pub tool_choice: Option<WireToolChoice>,
    #[serde(flatten)]
    pub settings: Settings,
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

impl ChatCompletionBody {
    /// Checks the request and turns it into the engine's.
    pub fn into_request(self, limits: &Limits) -> Result<Checked, ApiError> {
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
        let mut parsed = self.settings.into_request(Prompt::Chat(messages), limits)?;
        let any_object = || json!({"type": "object"});
        parsed.request.format = match self.response_format {
            None | Some(ResponseFormat::Text) => ReplyFormat::Text,
            Some(ResponseFormat::JsonObject) => ReplyFormat::JsonSchema(any_object()),
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                ReplyFormat::JsonSchema(json_schema.schema.unwrap_or_else(any_object))
            }
        };
        if let ReplyFormat::JsonSchema(schema) = &parsed.request.format {
            limits.schema("response_format", schema)?;
        }
        (parsed.request.tools, parsed.request.tool_choice) =
            tools(self.tools, self.tool_choice, limits)?;
        Ok(parsed)
    }
}

/// Checks `tools` and `tool_choice` as OpenAI does: functions only, a choice only with
/// tools, a named choice among them. `"required"` is refused: mistral.rs cannot hold the
/// model to calling some tool without naming one.
fn tools(
    tools: Option<Vec<WireTool>>,
    choice: Option<WireToolChoice>,
    limits: &Limits,
) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let mut offered = Vec::new();
    for (i, tool) in tools.unwrap_or_default().into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                Some("tools"),
                format!(
                    "tools[{i}].type {:?}: only function tools are served",
                    tool.kind
                ),
            ));
        }
        offered.push(Tool {
            name: tool.function.name,
            description: tool.function.description,
            parameters: tool.function.parameters,
        });
    }
    let offered = limits.tools("tools", offered)?;
    let choice = match choice {
        None => None,
        Some(WireToolChoice::Mode(mode)) => Some(mode_choice(&mode)?),
        Some(WireToolChoice::Function { function }) => Some(ToolChoice::Function(function.name)),
    };
    let choice = checked_choice("tool_choice", choice, &offered)?;
    Ok((offered, choice))
}

/// `tool_choice` given as a mode, as both of OpenAI's APIs take it.
pub(super) fn mode_choice(mode: &str) -> Result<ToolChoice, ApiError> {
    match mode {
        "auto" => Ok(ToolChoice::Auto),
        "none" => Ok(ToolChoice::None),
        other => Err(ApiError::invalid(
            Some("tool_choice"),
            format!("tool_choice {other:?} is not served: use auto, none, or name a function"),
        )),
    }
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
