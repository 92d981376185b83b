//! A Messages answer: whole, a `message` of content blocks; streamed, Anthropic's events
//! (`message_start`, then per block `content_block_start` / `_delta` / `_stop`, then
//! `message_delta` with the stop reason and usage, and `message_stop`).

use axum::response::sse::Event;
use serde_json::{json, Value};

use super::error_body;
use crate::api::{named, Admitted};
use crate::error::ApiError;
use sublet_engine::{Finish, FinishReason, StreamEvent, ToolCall};

pub struct Answer {
    /// The request's stop sequences, to name the one that ended the reply.
    stops: Vec<String>,
    /// `message_start` sent.
    started: bool,
    /// The index of the content block open now, if one is.
    open: Option<usize>,
    /// Blocks begun so far.
    blocks: usize,
}

impl Answer {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            started: false,
            open: None,
            blocks: 0,
        }
    }

    /// `stop_reason` and `stop_sequence` for how the reply ended.
    fn stop(&self, reason: &FinishReason) -> (&'static str, Value) {
        match reason {
            FinishReason::StopText(i) => ("stop_sequence", json!(self.stops.get(*i))),
            FinishReason::Length => ("max_tokens", Value::Null),
            FinishReason::ToolCalls => ("tool_use", Value::Null),
            _ => ("end_turn", Value::Null),
        }
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some(index) = self.open.take() {
            out.push(named("content_block_stop", json!({"index": index})));
        }
    }

    fn begin(&mut self, block: Value, out: &mut Vec<Event>) -> usize {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some(index);
        out.push(named(
            "content_block_start",
            json!({"index": index, "content_block": block}),
        ));
        index
    }
}

fn message_id(admitted: &Admitted) -> String {
    format!("msg_{:024}", admitted.number)
}

/// A tool call's `input`: its arguments as a JSON object (a model's arguments that are
/// not one come as `{"arguments": …}`, so that the client sees what was said).
fn input(call: &ToolCall) -> Value {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(object @ Value::Object(_)) => object,
        Ok(other) => json!({"arguments": other}),
        Err(_) => json!({"arguments": call.arguments}),
    }
}

fn usage(input_tokens: usize, output_tokens: usize) -> Value {
    json!({
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

impl crate::api::Answer for Answer {
    fn whole(
        &mut self,
        admitted: &Admitted,
        text: String,
        calls: Vec<ToolCall>,
        finish: &Finish,
    ) -> Value {
        let mut content = Vec::new();
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in &calls {
            content.push(
                json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input(call)}),
            );
        }
        let (stop_reason, stop_sequence) = self.stop(&finish.reason);
        json!({
            "id": message_id(admitted),
            "type": "message",
            "role": "assistant",
            "model": admitted.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage(finish.prompt_tokens, finish.completion_tokens),
        })
    }

    fn events(&mut self, admitted: &Admitted, event: StreamEvent, out: &mut Vec<Event>) {
        if !self.started {
            self.started = true;
            // The prompt's tokens are known at the end; `message_delta` gives them.
            out.push(named(
                "message_start",
                json!({"message": {
                    "id": message_id(admitted), "type": "message", "role": "assistant",
                    "model": admitted.model, "content": [], "stop_reason": null,
                    "stop_sequence": null, "usage": usage(0, 0),
                }}),
            ));
        }
        match event {
            StreamEvent::Text(text) => {
                let index = match self.open {
                    Some(index) => index,
                    None => self.begin(json!({"type": "text", "text": ""}), out),
                };
                out.push(named(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "text_delta", "text": text}}),
                ));
            }
            StreamEvent::ToolCalls(calls) => {
                for call in calls {
                    let block =
                        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
                    let index = self.begin(block, out);
                    let partial_json = input(&call).to_string();
                    out.push(named(
                        "content_block_delta",
                        json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": partial_json}}),
                    ));
                    self.close(out);
                }
            }
            StreamEvent::Done(finish) => {
                self.close(out);
                let (stop_reason, stop_sequence) = self.stop(&finish.reason);
                out.push(named(
                    "message_delta",
                    json!({
                        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        "usage": usage(finish.prompt_tokens, finish.completion_tokens),
                    }),
                ));
                out.push(named("message_stop", json!({})));
            }
        }
    }

    fn failed(&mut self, _: &Admitted, error: &ApiError) -> Event {
        Event::default()
            .event("error")
            .data(error_body(error).to_string())
    }
}
