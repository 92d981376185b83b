//! OpenAI's wire formats: completions of chats (`chat`) and of text (`completions`), and
//! responses (`responses`): what a request may hold, how it is checked, and the objects
//! the server answers with.

mod chat;
mod completions;
pub mod responses;

use serde::Deserialize;
use serde_json::{json, Value};

pub use chat::ChatCompletionBody;
pub use completions::CompletionBody;

use axum::response::sse::Event;

use super::api::{Admitted, Api, Parsed};
pub use super::error::ApiError;
use super::limits::check_sampling;
pub use super::limits::Limits;
use sublet_engine::{ChatRequest, Finish, Prompt, Repetition, StreamEvent, ToolCall};

/// Parses and checks a chat or text completion's body.
pub fn parse(api: Api, body: &[u8], limits: &Limits) -> Result<Parsed, ApiError> {
    let checked = match api {
        Api::Text => serde_json::from_slice::<CompletionBody>(body)
            .map_err(malformed)?
            .into_request(limits),
        _ => serde_json::from_slice::<ChatCompletionBody>(body)
            .map_err(malformed)?
            .into_request(limits),
    }?;
    Ok(Parsed {
        request: checked.request,
        stream: checked.stream,
        answer: Box::new(Answer {
            api,
            include_usage: checked.include_usage,
            role_sent: false,
        }),
    })
}

/// A body that is not the JSON its API takes.
pub(super) fn malformed(e: serde_json::Error) -> ApiError {
    ApiError::invalid(None, format!("malformed JSON body: {e}"))
}

/// A checked chat or text completion request.
#[derive(Debug)]
pub struct Checked {
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
    fn into_request(self, prompt: Prompt, limits: &Limits) -> Result<Checked, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(Some("n"), "only n = 1 is supported"));
        }
        let max_tokens =
            limits.max_tokens("max_tokens", self.max_completion_tokens.or(self.max_tokens))?;
        check_sampling(self.temperature, 2.0, self.top_p)?;
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
        Ok(Checked {
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
                priority: limits.priority(self.priority),
                stop: limits.stops("stop", stop)?,
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

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// One answer as OpenAI's chat and text completions shape it, whole or chunk by chunk.
pub struct Answer {
    api: Api,
    /// The stream's last chunk carries the token counts.
    include_usage: bool,
    /// A streamed chat names the speaker in its first delta only.
    role_sent: bool,
}

impl super::api::Answer for Answer {
    fn whole(
        &mut self,
        admitted: &Admitted,
        text: String,
        calls: Vec<ToolCall>,
        finish: &Finish,
    ) -> Value {
        let reason = finish.reason.as_str();
        let choice = match self.api {
            Api::Text => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
            }
            _ => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    message["tool_calls"] = chat::tool_calls(&calls, false);
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": message, "finish_reason": reason})
            }
        };
        let mut whole = self.envelope(admitted, choice);
        whole["object"] = json!(match self.api {
            Api::Text => "text_completion",
            _ => "chat.completion",
        });
        whole["usage"] = usage(finish);
        whole
    }

    fn events(&mut self, admitted: &Admitted, event: StreamEvent, out: &mut Vec<Event>) {
        if let Some(chunk) = self.chunk(admitted, event) {
            out.push(Event::default().data(chunk.to_string()));
        }
    }

    fn end(&mut self, out: &mut Vec<Event>) {
        out.push(Event::default().data("[DONE]"));
    }

    fn failed(&mut self, _: &Admitted, error: &ApiError) -> Event {
        Event::default().data(error.body().to_string())
    }
}

impl Answer {
    /// A streamed answer's chunk for `event` (`None` for what this API cannot carry).
    fn chunk(&mut self, admitted: &Admitted, event: StreamEvent) -> Option<Value> {
        let text_api = self.api == Api::Text;
        let choice = match event {
            StreamEvent::Text(text) if text_api => {
                return Some(self.envelope(
                    admitted,
                    json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null}),
                ));
            }
            StreamEvent::ToolCalls(_) if text_api => return None,
            StreamEvent::Text(text) => json!({"content": text}),
            StreamEvent::ToolCalls(calls) => {
                json!({"tool_calls": chat::tool_calls(&calls, true)})
            }
            StreamEvent::Done(finish) => {
                let reason = finish.reason.as_str();
                let choice = match text_api {
                    false => json!({"index": 0, "delta": {}, "finish_reason": reason}),
                    true => {
                        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
                    }
                };
                let mut last = self.envelope(admitted, choice);
                if self.include_usage {
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
        Some(self.envelope(
            admitted,
            json!({"index": 0, "delta": delta, "finish_reason": null}),
        ))
    }

    /// A chunk (or, its object renamed, the whole answer) around one choice.
    fn envelope(&self, admitted: &Admitted, choice: Value) -> Value {
        let (prefix, object) = match self.api {
            Api::Text => ("cmpl", "text_completion"),
            _ => ("chatcmpl", "chat.completion.chunk"),
        };
        json!({
            "id": format!("{prefix}-{}", admitted.number),
            "object": object,
            "created": admitted.created,
            "model": admitted.model,
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
