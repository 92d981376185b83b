//! The legacy completions request: a text the model continues as it stands, with no chat
//! template, on top of the settings every completion takes. Tools that still speak it
//! (code completion in editors, some evaluation harnesses) send one prompt and read one
//! continuation; what needs more than that (token-array prompts, `echo`, `suffix`,
//! `best_of`, `logprobs`) is refused by name rather than ignored.

use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, Checked, Limits, Settings};
use sublet_engine::Prompt;

/// A completion request as clients send it. Unknown fields are ignored.
#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    /// One text, or a list holding one text (OpenAI also takes several, and token ids).
    pub prompt: Value,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
    pub logprobs: Option<Value>,
    #[serde(flatten)]
    pub settings: Settings,
}

impl CompletionBody {
    /// Checks the request and turns it into the engine's.
    pub fn into_request(self, limits: &Limits) -> Result<Checked, ApiError> {
        let text = match self.prompt {
            Value::String(text) => text,
            Value::Array(mut list) if list.len() == 1 && list[0].is_string() => match list.pop() {
                Some(Value::String(text)) => text,
                _ => unreachable!("checked to hold one string"),
            },
            Value::Array(list) if list.iter().all(Value::is_string) => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    format!(
                        "{} prompts in one request; this server takes one",
                        list.len()
                    ),
                ))
            }
            _ => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "prompt must be a text (token ids are not taken)",
                ))
            }
        };
        if text.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), "prompt is empty"));
        }
        // Each refused by name: a client that asked for it would otherwise read an answer
        // that silently lacks it.
        if self.echo == Some(true) {
            return Err(ApiError::invalid(Some("echo"), "echo is not served"));
        }
        if self.suffix.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(Some("suffix"), "suffix is not served"));
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(
                Some("best_of"),
                "only best_of = 1 is served",
            ));
        }
        if self.logprobs.is_some_and(|l| !l.is_null() && l != 0) {
            return Err(ApiError::invalid(
                Some("logprobs"),
                "logprobs is not served",
            ));
        }
        self.settings.into_request(Prompt::Text(text), limits)
    }
}
