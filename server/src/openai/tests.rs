//! What the wire format takes and refuses.

use super::super::api::Answer as _;
use super::*;
use sublet_engine::{FinishReason, Message, Role, ToolChoice, AGENT_PRIORITY};

fn limits() -> Limits {
    Limits {
        max_tokens: 512,
        default_max_tokens: 128,
        ..Limits::default()
    }
}

fn parse(body: Value) -> Result<(ChatRequest, bool), ApiError> {
    serde_json::from_value::<ChatCompletionBody>(body)
        .map_err(malformed)?
        .into_request(&limits())
        .map(|c| (c.request, c.include_usage))
}

fn parse_text(body: Value) -> Result<ChatRequest, ApiError> {
    super::parse(Api::Text, body.to_string().as_bytes(), &limits()).map(|p| p.request)
}

fn answer(api: Api, include_usage: bool) -> Answer {
    Answer {
        api,
        include_usage,
        role_sent: false,
    }
}

/// The data of each event `event` makes.
fn chunks(answer: &mut Answer, event: StreamEvent) -> Option<Value> {
    answer.chunk(&ADMITTED, event)
}

const ADMITTED: Admitted = Admitted {
    number: 9,
    created: 100,
    model: String::new(),
};

fn messages(request: &ChatRequest) -> &[Message] {
    match &request.prompt {
        Prompt::Chat(messages) => messages,
        Prompt::Text(text) => panic!("a text prompt, {text:?}"),
    }
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
    assert_eq!(messages(&req)[1], Message::new(Role::User, "hi"));
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
        messages(&req)[1].tool_calls,
        [ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: "{\"path\": \"main.rs\"}".into()
        }]
    );
    assert_eq!(
        (
            messages(&req)[2].role,
            messages(&req)[2].tool_call_id.as_deref()
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
    assert!(priority(sublet_engine::VOICE_PRIORITY) > sublet_engine::VOICE_PRIORITY);
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

#[test]
fn fields_that_cost_the_engine_work_are_bounded_by_their_name() {
    let user = json!([{"role": "user", "content": "x"}]);
    let with = |field: &str, value: Value| {
        let mut body = json!({"messages": user});
        body[field] = value;
        parse(body).map(|(r, _)| r)
    };
    let limit = limits().max_stop_bytes;
    assert!(with("stop", json!(["a".repeat(limit)])).is_ok());
    let refused = with("stop", json!(["ok", "a".repeat(limit + 1)])).unwrap_err();
    assert_eq!((refused.status, refused.param), (400, Some("stop")));

    let tool = |name: String, description: String| {
        json!({"type": "function", "function": {"name": name, "description": description,
               "parameters": {"type": "object"}}})
    };
    let count = limits().max_tools;
    let tools = |n: usize| {
        Value::from(
            (0..n)
                .map(|i| tool(format!("f{i}"), String::new()))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(with("tools", tools(count)).unwrap().tools.len(), count);
    assert_eq!(
        with("tools", tools(count + 1)).unwrap_err().param,
        Some("tools")
    );
    let heavy = tool("f".into(), "d".repeat(limits().max_tools_bytes));
    assert_eq!(
        with("tools", json!([heavy])).unwrap_err().param,
        Some("tools")
    );

    let schema = |bytes: usize| {
        json!({"type": "json_schema", "json_schema": {"name": "s", "schema":
               {"type": "object", "description": "d".repeat(bytes)}}})
    };
    assert!(with("response_format", schema(1000)).is_ok());
    let refused = with("response_format", schema(limits().max_schema_bytes)).unwrap_err();
    assert_eq!(refused.param, Some("response_format"));
    assert!(refused.message.contains("bytes"), "{}", refused.message);
}

#[test]
fn wrong_types_and_bad_json_are_refused_with_400() {
    for body in [
        r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}"#,
        r#"{"messages": [{"role": "user", "content": "x"}], "seed": 1.5}"#,
        r#"{"messages": "hello"}"#,
        r#"{"messages": [{"role": "user", "content": "x"}"#,
    ] {
        let err = super::parse(Api::Chat, body.as_bytes(), &limits()).unwrap_err();
        assert_eq!(err.status, 400, "{body}: {err:?}");
    }
    let err = super::parse(
        Api::Text,
        br#"{"prompt": "x", "temperature": "hot"}"#,
        &limits(),
    )
    .unwrap_err();
    assert_eq!(err.status, 400);
}

#[test]
fn a_seed_reaches_the_engine_bit_for_bit() {
    let seed = |s: i64| {
        parse(json!({"messages": [{"role": "user", "content": "x"}], "seed": s}))
            .unwrap()
            .0
            .seed
    };
    assert_eq!(seed(42), Some(42));
    assert_eq!(seed(-1), Some(u64::MAX));
    let unseeded = parse(json!({"messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(unseeded.unwrap().0.seed, None);
}

#[test]
fn a_text_completion_takes_one_prompt_as_it_stands() {
    let req = parse_text(
        json!({"model": "x", "prompt": "def add(a, b):", "max_tokens": 16,
        "stop": ["\n\n"], "seed": 7, "echo": false, "logprobs": null}),
    )
    .unwrap();
    assert_eq!(req.prompt, Prompt::Text("def add(a, b):".into()));
    assert_eq!((req.max_tokens, req.seed), (16, Some(7)));
    assert_eq!(req.stop, ["\n\n"]);
    assert_eq!(req.priority, AGENT_PRIORITY);
    let one = parse_text(json!({"prompt": ["only one"]})).unwrap();
    assert_eq!(one.prompt, Prompt::Text("only one".into()));

    let err = |body: Value| parse_text(body).unwrap_err().param;
    assert_eq!(err(json!({"prompt": ["a", "b"]})), Some("prompt"));
    assert_eq!(err(json!({"prompt": [1, 2, 3]})), Some("prompt"));
    assert_eq!(err(json!({"prompt": ""})), Some("prompt"));
    assert_eq!(err(json!({"prompt": "x", "echo": true})), Some("echo"));
    assert_eq!(err(json!({"prompt": "x", "suffix": "}"})), Some("suffix"));
    assert_eq!(err(json!({"prompt": "x", "best_of": 3})), Some("best_of"));
    assert_eq!(err(json!({"prompt": "x", "logprobs": 2})), Some("logprobs"));
    assert_eq!(
        err(json!({"prompt": "x", "max_tokens": 0})),
        Some("max_tokens")
    );
    assert_eq!(
        parse_text(json!({"prompt": "x", "priority": -1}))
            .unwrap()
            .priority,
        AGENT_PRIORITY
    );
}

#[test]
fn answers_take_each_api_s_shape() {
    let finish = Finish {
        reason: FinishReason::Length,
        prompt_tokens: 3,
        completion_tokens: 2,
    };
    let mut text = answer(Api::Text, false);
    let whole = text.whole(&ADMITTED, "ab".into(), vec![], &finish);
    assert_eq!(whole["id"], "cmpl-9");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["choices"][0]["text"], "ab");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["total_tokens"], 5);

    let mut chat = answer(Api::Chat, true);
    let first = chunks(&mut chat, StreamEvent::Text("a".into())).unwrap();
    let second = chunks(&mut chat, StreamEvent::Text("b".into())).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(second["choices"][0]["delta"], json!({"content": "b"}));
    let last = chunks(&mut chat, StreamEvent::Done(finish.clone())).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["completion_tokens"], 2);
    let whole = chat.whole(
        &ADMITTED,
        String::new(),
        vec![ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: "{}".into(),
        }],
        &finish,
    );
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(
        whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "f"
    );

    let mut text = answer(Api::Text, false);
    let piece = chunks(&mut text, StreamEvent::Text("a".into())).unwrap();
    assert_eq!(piece["choices"][0]["text"], "a");
    let last = chunks(&mut text, StreamEvent::Done(finish)).unwrap();
    assert!(last.get("usage").is_none());
}
