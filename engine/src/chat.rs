//! What a chat completion is made of: messages (with tool calls and tool results), the
//! request's settings, and how both are handed to mistral.rs.

use either::Either;
use indexmap::IndexMap;
use serde_json::Value;

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering one of the assistant's tool calls.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The tools an assistant message called.
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A call of a tool, as the model made it: its arguments are JSON text, as OpenAI sends
/// them (the model's, so not always valid JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A function the model may call (OpenAI's `tools` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Its parameters as a JSON Schema object.
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Whether the model may call a tool (OpenAI's `tool_choice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// It decides (the default).
    #[default]
    Auto,
    /// It answers in text.
    None,
    /// It calls this tool.
    Function(String),
}

/// What the model continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered through the model's chat template.
    Chat(Vec<Message>),
    /// Text continued as it stands, no template (OpenAI's legacy completions).
    Text(String),
}

impl Prompt {
    /// The prompt's texts: each message's content, or the one text.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        let (messages, text) = match self {
            Prompt::Chat(messages) => (messages.as_slice(), None),
            Prompt::Text(text) => (&[][..], Some(text.as_str())),
        };
        messages.iter().map(|m| m.content.as_str()).chain(text)
    }
}

/// One completion to run: of a chat (the common case, hence the name) or of a text.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub prompt: Prompt,
    pub max_tokens: usize,
    /// `None` or 0 samples greedily.
    pub temperature: Option<f64>,
    /// Nucleus sampling, with a temperature.
    pub top_p: Option<f64>,
    /// Sampling from the `k` likeliest tokens only, with a temperature.
    pub top_k: Option<usize>,
    /// Samples from a generator of the request's own seeded with this, so the same request
    /// samples the same reply (as far as the model's numbers are the same in every batch).
    pub seed: Option<u64>,
    /// What keeps the reply from repeating itself (none by default).
    pub repetition: Repetition,
    /// Scheduling priority, lower is more urgent (vLLM's convention): [`VOICE_PRIORITY`]
    /// for a caller's turn, [`AGENT_PRIORITY`] by default for API requests.
    pub priority: i32,
    /// The call (or agent session) the request belongs to.
    pub session: Option<u64>,
    /// Texts that end the reply where they appear, themselves left out (OpenAI's `stop`).
    pub stop: Vec<String>,
    /// The shape the reply must take (any text by default).
    pub format: ReplyFormat,
    /// Tools the model may call (none by default): mistral.rs renders them through the
    /// model's chat template and reads calls out of its reply.
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// Whether a model that thinks aloud first (Qwen3's `<think>`) does: `Some(false)`
    /// switches it off where the chat template takes the switch (`enable_thinking`);
    /// `None` leaves the template's default.
    pub thinking: Option<bool>,
}

/// The shape a reply must take (OpenAI's `response_format`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ReplyFormat {
    /// Any text.
    #[default]
    Text,
    /// JSON matching this JSON Schema (`{"type": "object"}` for OpenAI's JSON mode),
    /// enforced token by token by mistral.rs's grammar constraint (llguidance): the model
    /// cannot sample a token that leaves the schema. A reply cut by its token limit is
    /// still only a prefix.
    JsonSchema(serde_json::Value),
    /// The same, its grammar compiled already off the engine's thread
    /// ([`crate::GrammarCheck::compile`]): the engine's thread only copies its parser.
    Compiled(crate::CompiledSchema),
}

/// Penalties on tokens the sequence (prompt and reply) already holds, applied before the
/// next token is chosen, greedy or sampled. `None` leaves each off.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Repetition {
    /// OpenAI's: subtracted from a token's logit once per time it occurs.
    pub frequency_penalty: Option<f32>,
    /// OpenAI's: subtracted once from the logit of any token that occurs.
    pub presence_penalty: Option<f32>,
    /// DRY ("don't repeat yourself") at this multiplier: a token that would extend a run
    /// of tokens already in the sequence is penalised more the longer the run (base 1.75,
    /// runs of two allowed). It stops loops and echoes without touching single words.
    pub dry_multiplier: Option<f32>,
}

/// The priority of a voice turn.
pub const VOICE_PRIORITY: i32 = 0;
/// The priority an API request gets when it names none.
pub const AGENT_PRIORITY: i32 = 1;

impl ChatRequest {
    /// A greedy chat request at agent priority.
    pub fn new(messages: Vec<Message>, max_tokens: usize) -> Self {
        Self::of(Prompt::Chat(messages), max_tokens)
    }

    /// A greedy request at agent priority.
    pub fn of(prompt: Prompt, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            temperature: None,
            top_p: None,
            top_k: None,
            seed: None,
            repetition: Repetition::default(),
            thinking: None,
            priority: AGENT_PRIORITY,
            session: None,
            stop: Vec::new(),
            format: ReplyFormat::Text,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
        }
    }
}

/// Chat messages as mistral.rs takes them (and its chat templates read them): a tool call
/// as `{"id", "type": "function", "function": {"name", "arguments"}}`.
/// The messages for a chat template with no system role (Gemma's refuses one): each system
/// message's text goes ahead of the next user message's, so the persona still reaches the
/// model.
pub(crate) fn fold_system_messages(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut pending = String::new();
    for message in messages {
        match message.role {
            Role::System => {
                if !pending.is_empty() {
                    pending.push_str("\n\n");
                }
                pending.push_str(&message.content);
            }
            Role::User if !pending.is_empty() => {
                let mut folded = message.clone();
                folded.content = format!("{}\n\n{}", std::mem::take(&mut pending), message.content);
                out.push(folded);
            }
            _ => out.push(message.clone()),
        }
    }
    if !pending.is_empty() {
        out.push(Message::new(Role::User, pending));
    }
    out
}

pub(crate) fn chat_messages(
    messages: &[Message],
) -> Vec<IndexMap<String, mistralrs_core::MessageContent>> {
    messages
        .iter()
        .map(|m| {
            let mut entry = IndexMap::new();
            entry.insert("role".into(), Either::Left(m.role.as_str().into()));
            entry.insert("content".into(), Either::Left(m.content.clone()));
            if let Some(id) = &m.tool_call_id {
                entry.insert("tool_call_id".into(), Either::Left(id.clone()));
            }
            if !m.tool_calls.is_empty() {
                let calls = m
                    .tool_calls
                    .iter()
                    .map(|call| {
                        IndexMap::from([
                            ("id".to_string(), Value::String(call.id.clone())),
                            ("type".to_string(), Value::String("function".into())),
                            (
                                "function".to_string(),
                                serde_json::json!({"name": call.name, "arguments": call.arguments}),
                            ),
                        ])
                    })
                    .collect();
                entry.insert("tool_calls".into(), Either::Right(calls));
            }
            entry
        })
        .collect()
}

/// The request's tools and choice as mistral.rs takes them (`None`: no tools).
pub(crate) fn engine_tools(
    tools: &[Tool],
    choice: &ToolChoice,
) -> (
    Option<Vec<mistralrs_core::Tool>>,
    Option<mistralrs_core::ToolChoice>,
) {
    let engine_tool = |tool: &Tool| mistralrs_core::Tool {
        tp: mistralrs_core::ToolType::Function,
        function: mistralrs_core::Function {
            description: tool.description.clone(),
            name: tool.name.clone(),
            parameters: tool
                .parameters
                .as_ref()
                .map(|p| p.clone().into_iter().collect()),
        },
    };
    if tools.is_empty() {
        return (None, None);
    }
    let choice = match choice {
        ToolChoice::Auto => mistralrs_core::ToolChoice::Auto,
        ToolChoice::None => mistralrs_core::ToolChoice::None,
        ToolChoice::Function(name) => match tools.iter().find(|t| &t.name == name) {
            Some(tool) => mistralrs_core::ToolChoice::Tool(engine_tool(tool)),
            None => mistralrs_core::ToolChoice::Auto,
        },
    };
    (Some(tools.iter().map(engine_tool).collect()), Some(choice))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_without_a_system_role_gets_the_persona_in_the_first_user_turn() {
        let messages = [
            Message::new(Role::System, "You are Ada, a hotel's receptionist."),
            Message::new(Role::User, "Hi."),
            Message::new(Role::Assistant, "Hello!"),
            Message::new(Role::User, "A room, please."),
        ];
        let folded = fold_system_messages(&messages);
        assert_eq!(folded.len(), 3);
        assert_eq!(folded[0].role, Role::User);
        assert_eq!(
            folded[0].content,
            "You are Ada, a hotel's receptionist.\n\nHi."
        );
        assert_eq!(folded[1..], messages[2..]);
        // A turn hint's conversation may end at the system prompt.
        let alone = fold_system_messages(&messages[..1]);
        assert_eq!(
            alone,
            [Message::new(Role::User, messages[0].content.clone())]
        );
    }
}
