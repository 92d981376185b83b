//! A Responses answer: whole, a `response` object whose `output` holds a message item
//! and a `function_call` item per call; streamed, OpenAI's `response.*` events, each
//! with its `sequence_number`: `response.created`, `response.in_progress`, per item
//! `response.output_item.added` … `response.output_item.done` (a message's text as
//! `response.output_text.delta`, a call's arguments as
//! `response.function_call_arguments.delta`), and `response.completed` (or
//! `response.incomplete` when the reply reached its token limit).

use axum::response::sse::Event;
use serde_json::{json, Value};

use super::Kept;
use crate::api::{named, Admitted};
use crate::error::ApiError;
use sublet_engine::{Finish, FinishReason, Message, Role, StreamEvent, ToolCall};

/// The request's settings a response object repeats.
#[derive(Debug)]
pub struct Echo {
    pub previous_response_id: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub store: bool,
}

pub struct Answer {
    /// `resp_` and a random id: a kept response is continued only by who was told its id.
    id: String,
    echo: Echo,
    /// Where to keep the conversation, and the conversation so far (this response's
    /// output is added at its end).
    keep: Option<(Kept, Vec<Message>)>,
    /// The next event's `sequence_number`; 0 until `response.created` is sent.
    sequence: u64,
    /// The message item being streamed: its output index and text so far.
    message: Option<(usize, String)>,
    /// Items finished so far, as `response.completed` lists them.
    done: Vec<Value>,
    /// The reply's text and calls, kept for the conversation.
    text: String,
    calls: Vec<ToolCall>,
}

impl Answer {
    pub fn new(echo: Echo, keep: Option<(Kept, Vec<Message>)>) -> Self {
        Self {
            id: format!("resp_{}", uuid::Uuid::new_v4().simple()),
            echo,
            keep,
            sequence: 0,
            message: None,
            done: Vec::new(),
            text: String::new(),
            calls: Vec::new(),
        }
    }

    fn message_id(&self) -> String {
        format!("msg_{}", &self.id[5..])
    }

    /// The response object, as `status` leaves it.
    fn object(&self, admitted: &Admitted, output: Vec<Value>, finish: Option<&Finish>) -> Value {
        let (status, incomplete) = match finish.map(|f| &f.reason) {
            None => ("in_progress", Value::Null),
            Some(FinishReason::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
            Some(_) => ("completed", Value::Null),
        };
        let usage = finish.map_or(Value::Null, |f| {
            json!({
                "input_tokens": f.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": f.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": f.prompt_tokens + f.completion_tokens,
            })
        });
        json!({
            "id": self.id,
            "object": "response",
            "created_at": admitted.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": admitted.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": self.echo.previous_response_id,
            "max_output_tokens": self.echo.max_output_tokens,
            "store": self.echo.store,
            "temperature": self.echo.temperature,
            "top_p": self.echo.top_p,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "metadata": {},
            "usage": usage,
        })
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        let content = match status {
            "in_progress" => json!([]),
            _ => json!([{"type": "output_text", "text": text, "annotations": []}]),
        };
        json!({"id": self.message_id(), "type": "message", "status": status,
               "role": "assistant", "content": content})
    }

    fn call_item(&self, index: usize, call: &ToolCall, arguments: &str, status: &str) -> Value {
        json!({"id": format!("fc_{}_{index}", &self.id[5..]), "type": "function_call",
               "status": status, "call_id": call.id, "name": call.name, "arguments": arguments})
    }

    fn push(&mut self, out: &mut Vec<Event>, name: &'static str, mut data: Value) {
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push(named(name, data));
    }

    /// Ends the message item being streamed, if one is.
    fn close_message(&mut self, out: &mut Vec<Event>) {
        let Some((index, text)) = self.message.take() else {
            return;
        };
        let id = self.message_id();
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.push(out, "response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
        self.push(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        let item = self.message_item(&text, "completed");
        self.push(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.done.push(item);
    }

    /// Keeps the conversation with this response's output, if the request asked.
    fn keep(&mut self) {
        if let Some((kept, mut conversation)) = self.keep.take() {
            conversation.push(Message {
                tool_calls: std::mem::take(&mut self.calls),
                ..Message::new(Role::Assistant, std::mem::take(&mut self.text))
            });
            kept.keep(self.id.clone(), conversation);
        }
    }
}

impl crate::api::Answer for Answer {
    fn whole(
        &mut self,
        admitted: &Admitted,
        text: String,
        calls: Vec<ToolCall>,
        finish: &Finish,
    ) -> Value {
        let mut output = Vec::new();
        if !text.is_empty() || calls.is_empty() {
            output.push(self.message_item(&text, "completed"));
        }
        for (i, call) in calls.iter().enumerate() {
            output.push(self.call_item(i, call, &call.arguments, "completed"));
        }
        let whole = self.object(admitted, output, Some(finish));
        (self.text, self.calls) = (text, calls);
        self.keep();
        whole
    }

    fn events(&mut self, admitted: &Admitted, event: StreamEvent, out: &mut Vec<Event>) {
        if self.sequence == 0 {
            let response = self.object(admitted, Vec::new(), None);
            self.push(out, "response.created", json!({"response": response}));
            self.push(out, "response.in_progress", json!({"response": response}));
        }
        match event {
            StreamEvent::Text(delta) => {
                self.text.push_str(&delta);
                let id = self.message_id();
                let index = match &mut self.message {
                    Some((index, text)) => {
                        text.push_str(&delta);
                        *index
                    }
                    None => {
                        let index = self.done.len();
                        self.message = Some((index, delta.clone()));
                        let item = self.message_item("", "in_progress");
                        self.push(
                            out,
                            "response.output_item.added",
                            json!({"output_index": index, "item": item}),
                        );
                        let part = json!({"type": "output_text", "text": "", "annotations": []});
                        self.push(out, "response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
                        index
                    }
                };
                self.push(out, "response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}));
            }
            StreamEvent::ToolCalls(calls) => {
                self.close_message(out);
                for call in calls {
                    let index = self.done.len();
                    let nth = self.calls.len();
                    let added = self.call_item(nth, &call, "", "in_progress");
                    let id = added["id"].clone();
                    self.push(
                        out,
                        "response.output_item.added",
                        json!({"output_index": index, "item": added}),
                    );
                    self.push(
                        out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": call.arguments}),
                    );
                    self.push(out, "response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}));
                    let item = self.call_item(nth, &call, &call.arguments, "completed");
                    self.push(
                        out,
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    );
                    self.done.push(item);
                    self.calls.push(call);
                }
            }
            StreamEvent::Done(finish) => {
                self.close_message(out);
                let response = self.object(admitted, self.done.clone(), Some(&finish));
                let name = match finish.reason {
                    FinishReason::Length => "response.incomplete",
                    _ => "response.completed",
                };
                self.push(out, name, json!({"response": response}));
                self.keep();
            }
        }
    }

    fn failed(&mut self, admitted: &Admitted, error: &ApiError) -> Event {
        let mut response = self.object(admitted, self.done.clone(), None);
        response["status"] = json!("failed");
        response["error"] = json!({"code": error.kind, "message": error.message});
        let mut out = Vec::new();
        self.push(&mut out, "response.failed", json!({"response": response}));
        out.pop().expect("one event")
    }
}
