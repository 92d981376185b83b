//! What the wire format takes and refuses.

use super::*;

fn parse(body: Value) -> Result<(ChatRequest, bool), ApiError> {
    let limits = Limits {
        max_tokens: 512,
        default_max_tokens: 128,
        ..Limits::default()
    };
    serde_json::from_value::<ChatCompletionBody>(body)
        .unwrap()
        .into_request(&limits)
}

#[test]
fn accepts_what_openai_clients_send() {
    let (req, usage) = parse(json!({
        "model": "x", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "user": "someone", "priority": 5
    }))
    .unwrap();
    assert!(usage);
    assert_eq!(req.priority, 5);
    assert_eq!(req.max_tokens, 128);
    assert_eq!(req.messages[1], Message::new(Role::User, "hi"));
    let stop = |s: Value| {
        parse(json!({"messages": [{"role": "user", "content": "x"}], "stop": s}))
            .map(|(r, _)| r.stop)
    };
    assert_eq!(stop(json!("\n")).unwrap(), ["\n"]);
    assert_eq!(stop(json!(["a", "b"])).unwrap(), ["a", "b"]);
    assert_eq!(
        stop(json!(["a", "b", "c", "d", "e"])).unwrap_err().param,
        Some("stop")
    );
    assert_eq!(stop(json!([""])).unwrap_err().param, Some("stop"));
    assert_eq!(
        parse(json!({"messages": [{"role": "user", "content": "x"}]}))
            .unwrap()
            .0
            .priority,
        AGENT_PRIORITY
    );
}

#[test]
fn takes_a_tool_loop_as_coding_agents_send_it() {
    let tool = json!({"type": "function", "function": {"name": "read_file",
        "description": "Read a file", "parameters": {"type": "object",
        "properties": {"path": {"type": "string"}}}, "strict": true}});
    let called = json!([
        {"role": "user", "content": "Fix main.rs"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\": \"main.rs\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "fn main() {}"}
    ]);
    let (req, _) = parse(json!({"messages": called, "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
        "parallel_tool_calls": false}))
    .unwrap();
    assert_eq!(req.tools.len(), 1);
    assert_eq!(req.tools[0].name, "read_file");
    assert!(req.tools[0]
        .parameters
        .as_ref()
        .unwrap()
        .contains_key("properties"));
    assert_eq!(req.tool_choice, ToolChoice::Function("read_file".into()));
    assert_eq!(
        req.messages[1].tool_calls,
        [ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: "{\"path\": \"main.rs\"}".into()
        }]
    );
    assert_eq!(
        (
            req.messages[2].role,
            req.messages[2].tool_call_id.as_deref()
        ),
        (Role::Tool, Some("call_1"))
    );

    let err = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}], "tools": [tool]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse(body).unwrap_err()
    };
    assert_eq!(
        err(json!({"tool_choice": "required"})).param,
        Some("tool_choice")
    );
    assert_eq!(
        err(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})).param,
        Some("tool_choice")
    );
    assert_eq!(
        err(json!({"tools": [{"type": "retrieval", "function": {"name": "x"}}]})).param,
        Some("tools")
    );
    assert_eq!(
        err(json!({"messages": [{"role": "tool", "content": "no id"}]})).param,
        Some("messages")
    );
    assert_eq!(
        err(json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})).param,
        Some("messages")
    );
    let no_tools =
        parse(json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}));
    assert_eq!(no_tools.unwrap_err().param, Some("tool_choice"));
}

#[test]
fn no_client_outranks_a_voice_turn() {
    let priority = |p: i32| {
        parse(json!({"messages": [{"role": "user", "content": "x"}], "priority": p}))
            .unwrap()
            .0
            .priority
    };
    assert_eq!(priority(-1), AGENT_PRIORITY);
    assert_eq!(priority(i32::MIN), AGENT_PRIORITY);
    assert!(priority(crate::VOICE_PRIORITY) > crate::VOICE_PRIORITY);
    assert_eq!(priority(AGENT_PRIORITY + 3), AGENT_PRIORITY + 3);
    assert_eq!(priority(i32::MAX), AGENT_PRIORITY + 9);
}

#[test]
fn refuses_what_it_cannot_serve() {
    let many = vec![json!({"role": "user", "content": "x"}); 4097];
    assert_eq!(
        parse(json!({ "messages": many })).unwrap_err().param,
        Some("messages")
    );
    let err = |b: Value| parse(b).unwrap_err();
    assert_eq!(err(json!({"messages": []})).param, Some("messages"));
    assert_eq!(
        err(json!({"messages": [{"role": "robot", "content": "x"}]})).status,
        400
    );
    assert_eq!(
        err(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000})).param,
        Some("max_tokens")
    );
    assert_eq!(
        err(json!({"messages": [{"role": "user", "content": "x"}], "temperature": 7})).param,
        Some("temperature")
    );
    assert_eq!(
        err(json!({"messages": [{"role": "user", "content": "x"}], "n": 3})).param,
        Some("n")
    );
}
