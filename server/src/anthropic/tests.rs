//! What the Messages wire takes, refuses, and answers.

use serde_json::json;

use super::*;
use crate::api::{Admitted, Answer as _};
use sublet_engine::{Finish, FinishReason, StreamEvent};

fn parsed(body: Value) -> Result<ChatRequest, ApiError> {
    parse(body.to_string().as_bytes(), &Limits::default()).map(|p| p.request)
}

fn messages(request: &ChatRequest) -> &[Message] {
    match &request.prompt {
        Prompt::Chat(messages) => messages,
        Prompt::Text(text) => panic!("a text prompt, {text:?}"),
    }
}

#[test]
fn takes_what_claude_code_sends() {
    let request = parsed(json!({
        "model": "claude-opus-5-5", "max_tokens": 512, "stream": true,
        "system": [{"type": "text", "text": "You are brief."},
                   {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"x": "2+2"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "4"}]},
                {"type": "text", "text": "Thanks"}]},
        ],
        "tools": [{"name": "calc", "description": "adds", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"},
        "context_management": {"edits": []}, "temperature": 0.5, "top_k": 40,
        "stop_sequences": ["END"],
    }))
    .unwrap();
    let m = messages(&request);
    assert_eq!(m[0], Message::new(Role::System, "You are brief.\nBe kind."));
    assert_eq!(m[1], Message::new(Role::User, "What is 2+2?"));
    assert_eq!(m[2].role, Role::System);
    assert_eq!(m[3].content, "Let me check.");
    assert_eq!(m[3].tool_calls[0].name, "calc");
    assert_eq!(m[3].tool_calls[0].arguments, r#"{"x":"2+2"}"#);
    assert_eq!(
        (m[4].role, m[4].tool_call_id.as_deref()),
        (Role::Tool, Some("toolu_1"))
    );
    assert_eq!(m[4].content, "4");
    assert_eq!(m[5], Message::new(Role::User, "Thanks"));
    assert_eq!((request.max_tokens, request.top_k), (512, Some(40)));
    assert_eq!(request.stop, ["END"]);
    assert_eq!(request.tools[0].name, "calc");
}

#[test]
fn refuses_what_it_cannot_take_by_name() {
    let base = || json!({"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let refused = |edit: &dyn Fn(&mut Value)| {
        let mut body = base();
        edit(&mut body);
        parsed(body).unwrap_err()
    };
    let image = refused(&|b| {
        b["messages"][0]["content"] = json!([{"type": "image", "source": {}}]);
    });
    assert!(image.message.contains("\"image\""), "{image:?}");
    let document = refused(&|b| {
        b["messages"][0]["content"] = json!([{"type": "document", "source": {}}]);
    });
    assert!(document.message.contains("\"document\""), "{document:?}");
    let thinking_block = refused(&|b| {
        b["messages"] = json!([{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}]);
    });
    assert!(
        thinking_block.message.contains("\"thinking\""),
        "{thinking_block:?}"
    );
    let thinking = refused(&|b| b["thinking"] = json!({"type": "enabled", "budget_tokens": 1024}));
    assert_eq!(thinking.param, Some("thinking"));
    let server_tool = refused(&|b| {
        b["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    });
    assert!(
        server_tool.message.contains("web_search_20250305"),
        "{server_tool:?}"
    );
    let any = refused(&|b| {
        b["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        b["tool_choice"] = json!({"type": "any"});
    });
    assert_eq!(any.param, Some("tool_choice"));
    let missing = refused(&|b| {
        b.as_object_mut().unwrap().remove("max_tokens");
    });
    assert_eq!(missing.param, Some("max_tokens"));
    assert_eq!(
        refused(&|b| b["temperature"] = json!(1.5)).param,
        Some("temperature")
    );
    assert_eq!(
        refused(&|b| b["max_tokens"] = json!(128_000)).param,
        Some("max_tokens")
    );
    assert_eq!(
        refused(&|b| b["stop_sequences"] = json!(["a", "b", "c", "d", "e"])).param,
        Some("stop_sequences")
    );
    let misplaced = refused(&|b| {
        b["messages"][0]["content"] =
            json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]);
    });
    assert_eq!(misplaced.param, Some("messages"));
    // count_tokens needs no max_tokens.
    let mut counted = base();
    counted.as_object_mut().unwrap().remove("max_tokens");
    assert!(counted_request(counted.to_string().as_bytes(), &Limits::default()).is_ok());
}

#[test]
fn errors_take_anthropic_s_shape() {
    let body = error_body(&ApiError::invalid(Some("max_tokens"), "too many"));
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "too many"}})
    );
    assert_eq!(
        error_body(&ApiError::server("boom"))["error"]["type"],
        "api_error"
    );
    let long = ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::invalid(Some("messages"), "the messages take 9000 tokens")
    };
    assert!(error_body(&long)["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("prompt is too long"));
}

#[test]
fn a_stream_is_anthropic_s_events() {
    let admitted = Admitted {
        number: 3,
        created: 0,
        model: "m".into(),
    };
    let mut answer = answer::Answer::new(vec!["END".into()]);
    let mut out = Vec::new();
    answer.events(&admitted, StreamEvent::Text("Hi".into()), &mut out);
    answer.events(&admitted, StreamEvent::Text(" there".into()), &mut out);
    let call = ToolCall {
        id: "call_1".into(),
        name: "calc".into(),
        arguments: r#"{"x": 1}"#.into(),
    };
    answer.events(&admitted, StreamEvent::ToolCalls(vec![call]), &mut out);
    let finish = Finish {
        reason: FinishReason::StopText(0),
        prompt_tokens: 7,
        completion_tokens: 5,
    };
    answer.events(&admitted, StreamEvent::Done(finish), &mut out);
    let events = crate::api::tests::written(out);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{data}");
    }
    assert_eq!(events[5].1["content_block"]["type"], "tool_use");
    assert_eq!(events[5].1["index"], 1);
    assert_eq!(events[6].1["delta"]["partial_json"], r#"{"x":1}"#);
    let delta = &events[8].1;
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], "END");
    assert_eq!(delta["usage"]["output_tokens"], 5);
}
