//! What the Responses wire takes, refuses, keeps and answers.

use serde_json::json;

use super::*;
use crate::api::Admitted;
use sublet_engine::{Finish, FinishReason, StreamEvent};

fn parsed(body: Value, kept: &Kept) -> Result<Parsed, ApiError> {
    parse(body.to_string().as_bytes(), &Limits::default(), kept)
}

fn messages(request: &ChatRequest) -> &[Message] {
    match &request.prompt {
        Prompt::Chat(messages) => messages,
        Prompt::Text(text) => panic!("a text prompt, {text:?}"),
    }
}

#[test]
fn takes_what_codex_sends() {
    let kept = Kept::default();
    let request = parsed(
        json!({
            "model": "m", "instructions": "Be brief.", "stream": true, "store": false,
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": false}],
            "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "max_output_tokens": 100,
        }),
        &kept,
    )
    .unwrap()
    .request;
    let m = messages(&request);
    assert_eq!(m[0], Message::new(Role::System, "Be brief."));
    assert_eq!(m[1], Message::new(Role::System, "rules"));
    assert_eq!(m[3].role, Role::Assistant);
    assert_eq!(m[3].tool_calls[0].id, "c1");
    assert_eq!(
        (m[4].role, m[4].tool_call_id.as_deref()),
        (Role::Tool, Some("c1"))
    );
    assert_eq!(m[5], Message::new(Role::User, "thanks"));
    assert_eq!(request.max_tokens, 100);
    assert_eq!(request.tools[0].name, "exec_command");
}

#[test]
fn refuses_what_it_cannot_take_by_name() {
    let kept = Kept::default();
    let refused = |body: Value| parsed(body, &kept).unwrap_err();
    let image = refused(
        json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
    );
    assert!(image.message.contains("input_image"), "{image:?}");
    let reasoning = refused(json!({"input": [{"type": "reasoning", "summary": []}]}));
    assert!(reasoning.message.contains("reasoning"), "{reasoning:?}");
    let hosted = refused(json!({"input": "hi", "tools": [{"type": "web_search"}]}));
    assert!(hosted.message.contains("web_search"), "{hosted:?}");
    let required = refused(json!({"input": "hi", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f"}]}));
    assert_eq!(required.param, Some("tool_choice"));
    let unknown = refused(json!({"input": "hi", "previous_response_id": "resp_nope"}));
    assert_eq!(
        (unknown.param, unknown.code),
        (
            Some("previous_response_id"),
            Some("previous_response_not_found")
        )
    );
    assert_eq!(
        refused(json!({"input": "hi", "max_output_tokens": 0})).param,
        Some("max_output_tokens")
    );
    assert_eq!(
        refused(json!({"input": "hi", "text": {"format": {"type": "yaml"}}})).param,
        Some("text.format")
    );
}

const ADMITTED: Admitted = Admitted {
    number: 1,
    created: 0,
    model: String::new(),
};

#[test]
fn a_kept_response_is_continued_without_its_instructions() {
    let kept = Kept::default();
    let mut first = parsed(
        json!({"input": "My name is Ada.", "instructions": "Be brief."}),
        &kept,
    )
    .unwrap();
    let finish = Finish {
        reason: FinishReason::Stop,
        prompt_tokens: 5,
        completion_tokens: 2,
    };
    let whole = first
        .answer
        .whole(&ADMITTED, "Hello Ada.".into(), vec![], &finish);
    assert_eq!(whole["status"], "completed");
    assert_eq!(whole["output"][0]["content"][0]["text"], "Hello Ada.");
    let id = whole["id"].as_str().unwrap();
    let next = parsed(
        json!({"input": "What is my name?", "previous_response_id": id}),
        &kept,
    )
    .unwrap();
    assert_eq!(
        messages(&next.request),
        [
            Message::new(Role::User, "My name is Ada."),
            Message::new(Role::Assistant, "Hello Ada."),
            Message::new(Role::User, "What is my name?"),
        ]
    );
    // Not kept when asked not to be.
    let mut unkept = parsed(json!({"input": "x", "store": false}), &kept).unwrap();
    let whole = unkept.answer.whole(&ADMITTED, "y".into(), vec![], &finish);
    let id = whole["id"].as_str().unwrap();
    assert!(parsed(json!({"input": "z", "previous_response_id": id}), &kept).is_err());
}

#[test]
fn a_stream_is_openai_s_response_events() {
    let kept = Kept::default();
    let mut answer = parsed(json!({"input": "hi", "stream": true}), &kept)
        .unwrap()
        .answer;
    let mut out = Vec::new();
    answer.events(&ADMITTED, StreamEvent::Text("Hel".into()), &mut out);
    answer.events(&ADMITTED, StreamEvent::Text("lo".into()), &mut out);
    let call = ToolCall {
        id: "c".into(),
        name: "f".into(),
        arguments: "{}".into(),
    };
    answer.events(&ADMITTED, StreamEvent::ToolCalls(vec![call]), &mut out);
    let finish = Finish {
        reason: FinishReason::ToolCalls,
        prompt_tokens: 3,
        completion_tokens: 4,
    };
    answer.events(&ADMITTED, StreamEvent::Done(finish), &mut out);
    let events = crate::api::tests::written(out);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i as u64);
    }
    assert_eq!(events[6].1["text"], "Hello");
    let completed = &events[13].1["response"];
    assert_eq!(completed["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(completed["output"][1]["type"], "function_call");
    assert_eq!(completed["usage"]["output_tokens"], 4);
    let id = completed["id"].as_str().unwrap();
    let next = parsed(json!({"input": "ok", "previous_response_id": id}), &kept).unwrap();
    assert_eq!(messages(&next.request)[1].tool_calls[0].name, "f");
}
