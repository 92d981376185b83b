//! What a request may ask of the engine, checked before the engine sees it: the same
//! bounds whichever API it came through.

use std::ops::RangeInclusive;

use super::error::ApiError;
use sublet_engine::{Tool, ToolChoice, AGENT_PRIORITY};

/// Most stop texts a request may give, as OpenAI allows.
pub const MAX_STOPS: usize = 4;

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

impl Limits {
    /// A reply's length as asked in `field` (the default when not asked), checked.
    pub(super) fn max_tokens(
        &self,
        field: &'static str,
        asked: Option<u64>,
    ) -> Result<usize, ApiError> {
        match asked {
            None => Ok(self.default_max_tokens),
            Some(0) => Err(ApiError::invalid(
                Some(field),
                format!("{field} must be at least 1"),
            )),
            Some(n) if n > self.max_tokens as u64 => Err(ApiError::invalid(
                Some(field),
                format!(
                    "{field} {n} is more than this server allows ({})",
                    self.max_tokens
                ),
            )),
            Some(n) => Ok(n as usize),
        }
    }

    /// Stop texts as asked in `field`, checked: at most [`MAX_STOPS`], none empty, none
    /// longer than [`Limits::max_stop_bytes`].
    pub(super) fn stops(
        &self,
        field: &'static str,
        stops: Vec<String>,
    ) -> Result<Vec<String>, ApiError> {
        if stops.len() > MAX_STOPS || stops.iter().any(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                Some(field),
                format!("{field} takes at most {MAX_STOPS} texts, none of them empty"),
            ));
        }
        // The engine searches each stop text after every token, on its one thread.
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        ApiError::at_most(field, longest, self.max_stop_bytes, || {
            format!("a stop text of {longest} bytes")
        })?;
        Ok(stops)
    }

    /// The tools a request offers, checked: within [`Limits::max_tools`] and
    /// [`Limits::max_tools_bytes`], each named. `field` is the API's name for them.
    pub(super) fn tools(
        &self,
        field: &'static str,
        tools: Vec<Tool>,
    ) -> Result<Vec<Tool>, ApiError> {
        ApiError::at_most(field, tools.len(), self.max_tools, || {
            format!("{} tools", tools.len())
        })?;
        let bytes: usize = tools.iter().map(tool_bytes).sum();
        ApiError::at_most(field, bytes, self.max_tools_bytes, || {
            format!("tools of {bytes} bytes")
        })?;
        if let Some(i) = tools.iter().position(|t| t.name.is_empty()) {
            return Err(ApiError::invalid(
                Some(field),
                format!("{field}[{i}] has no name"),
            ));
        }
        Ok(tools)
    }

    /// A reply's JSON Schema, checked against [`Limits::max_schema_bytes`].
    pub(super) fn schema(
        &self,
        field: &'static str,
        schema: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let bytes = json_bytes(schema);
        ApiError::at_most(field, bytes, self.max_schema_bytes, || {
            format!("a schema of {bytes} bytes")
        })
    }

    /// The priority a request runs at: the one it asked for, within the operator's range.
    pub(super) fn priority(&self, asked: Option<i32>) -> i32 {
        asked
            .unwrap_or(AGENT_PRIORITY)
            .clamp(*self.priorities.start(), *self.priorities.end())
    }
}

/// `Err` naming the field when a temperature is outside `0..=highest` (OpenAI's 2,
/// Anthropic's 1) or `top_p` outside (0, 1].
pub(super) fn check_sampling(
    temperature: Option<f64>,
    highest: f64,
    top_p: Option<f64>,
) -> Result<(), ApiError> {
    if temperature.is_some_and(|t| !(0.0..=highest).contains(&t)) {
        return Err(ApiError::invalid(
            Some("temperature"),
            format!("temperature must be between 0 and {highest}"),
        ));
    }
    if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::invalid(Some("top_p"), "top_p must be in (0, 1]"));
    }
    Ok(())
}

/// A named tool choice checked against the tools offered (`field` is the API's name for
/// the choice): a choice needs tools, and a named one must be among them.
pub(super) fn checked_choice(
    field: &'static str,
    choice: Option<ToolChoice>,
    tools: &[Tool],
) -> Result<ToolChoice, ApiError> {
    match choice {
        None => Ok(ToolChoice::Auto),
        Some(_) if tools.is_empty() => Err(ApiError::invalid(
            Some(field),
            format!("{field} is only allowed with tools"),
        )),
        Some(ToolChoice::Function(name)) if !tools.iter().any(|t| t.name == name) => {
            Err(ApiError::invalid(
                Some(field),
                format!("{field} names {name:?}, which is not among the tools"),
            ))
        }
        Some(choice) => Ok(choice),
    }
}

/// What a tool's definition weighs: its name, description and parameters' JSON.
fn tool_bytes(tool: &Tool) -> usize {
    tool.name.len()
        + tool.description.as_ref().map_or(0, String::len)
        + tool.parameters.as_ref().map_or(0, json_bytes)
}

/// `value`'s length as compact JSON, counted without writing the text out.
pub(super) fn json_bytes(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}
