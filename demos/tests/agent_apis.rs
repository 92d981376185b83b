//! The coding agents' other doors, driven by the official SDKs against the real engine:
//! Anthropic's Messages API with the `anthropic` client (as Claude Code speaks it), and
//! OpenAI's Responses API with the `openai` client's `responses` (as Codex speaks it).

use serde_json::Value;
use sublet_tests::official_clients::api_client;
use sublet_tests::served::Server;

/// `serve` with the key `test-key`, on a port of its own.
fn serve() -> (Server, u16) {
    Server::serve(env!("CARGO_BIN_EXE_serve"), "test-key", &[])
}

/// The `/metrics` text, with the key.
fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nx-api-key: test-key\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn text(seen: &Value) -> &str {
    seen["text"].as_str().unwrap_or_default()
}

/// A JSON text's one string field `key`, or a panic naming what was seen.
fn json_field(seen: &Value, key: &str) -> String {
    let reply: Value = serde_json::from_str(text(seen)).unwrap_or_else(|e| panic!("{e}: {seen}"));
    let object = reply
        .as_object()
        .unwrap_or_else(|| panic!("an object: {seen}"));
    assert_eq!(object.len(), 1, "{seen}");
    object[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key}: {seen}"))
        .to_string()
}

#[test]
fn the_official_anthropic_client_is_served() {
    let (_server, port) = serve();
    let seen = api_client(
        "anthropic_messages.py",
        &format!("http://127.0.0.1:{port}"),
        "test-key",
    );

    let whole = &seen["whole"];
    assert!(text(whole).contains("Paris"), "{whole}");
    assert_eq!(
        (&whole["type"], &whole["role"]),
        (&"message".into(), &"assistant".into())
    );
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert!(whole["input_tokens"].as_u64().unwrap() > 5, "{whole}");
    assert!(whole["output_tokens"].as_u64().unwrap() <= 16, "{whole}");
    let stream = &seen["stream"];
    assert!(
        stream["pieces"].as_u64().unwrap() > 1,
        "streamed in pieces: {stream}"
    );
    assert_eq!(
        stream["text"], whole["text"],
        "greedy replies agree streamed or whole"
    );
    assert_eq!(stream["final"]["text"], whole["text"]);
    assert_eq!(stream["final"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(stream["final"]["output_tokens"], whole["output_tokens"]);
    assert_eq!(stream["final"]["input_tokens"], whole["input_tokens"]);
    // Each stop reason by its name.
    let stopped = &seen["stopped"];
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], "Paris", "{stopped}");
    assert!(text(whole).starts_with(text(stopped)), "{stopped}");
    assert_eq!(
        seen["short"]["stop_reason"], "max_tokens",
        "{}",
        seen["short"]
    );
    assert_eq!(seen["short"]["output_tokens"], 2);
    // The system blocks are in the prompt: longer than the template's default system
    // prompt, which a request with none gets.
    let system = &seen["system"];
    assert!(
        system["input_tokens"].as_u64() > whole["input_tokens"].as_u64(),
        "{system}"
    );
    let counted = seen["count_tokens"].as_u64().unwrap();
    let prompt = system["input_tokens"].as_u64().unwrap();
    assert!(
        counted.abs_diff(prompt) <= 4,
        "count_tokens {counted} against the same prompt's {prompt}"
    );
    let prompt = whole["input_tokens"].as_u64().unwrap();
    assert!(!json_field(&seen["json_schema"], "capital").is_empty());

    // The tool loop: a tool_use block, whole and streamed, ending the reply for it; the
    // result goes back as a tool_result block and is answered in text.
    for case in ["tool_first", "tool_streamed"] {
        let first = &seen[case];
        assert_eq!(first["stop_reason"], "tool_use", "{case}: {first}");
        let [call] = first["uses"].as_array().unwrap().as_slice() else {
            panic!("one call: {first}")
        };
        assert_eq!(call["name"], "get_weather", "{call}");
        assert!(call["input"]["city"].is_string(), "{call}");
        assert!(!call["id"].as_str().unwrap().is_empty(), "{call}");
    }
    let answered = &seen["tool_answered"];
    assert!(!text(answered).trim().is_empty(), "{answered}");
    assert_eq!(answered["stop_reason"], "end_turn", "{answered}");
    assert!(
        answered["input_tokens"].as_u64().unwrap() > prompt + 20,
        "the call and its result are in the prompt: {answered}"
    );

    // Refusals in Anthropic's shape, each naming what it refused.
    for (case, status, kind, says) in [
        ("wrong_key", 401, "authentication_error", "API key"),
        ("image", 400, "invalid_request_error", "\"image\""),
        ("thinking", 400, "invalid_request_error", "thinking"),
        (
            "server_tool",
            400,
            "invalid_request_error",
            "web_search_20250305",
        ),
        (
            "too_many_tokens",
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            "oversized_prompt",
            400,
            "invalid_request_error",
            "prompt is too long",
        ),
    ] {
        let refusal = &seen[case];
        assert_eq!(refusal["status"], status, "{case}: {refusal}");
        assert_eq!(refusal["shape"], "error", "{case}: {refusal}");
        assert_eq!(refusal["type"], kind, "{case}: {refusal}");
        let message = refusal["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{case}: {refusal}");
    }
    let missing = &seen["no_max_tokens"];
    assert_eq!(missing["status"], 400, "{missing}");
    assert_eq!(missing["body"]["type"], "error", "{missing}");
    assert!(seen["after_errors"].as_str().unwrap().contains("Paris"));

    let metrics = metrics(port);
    let line = "sublet_requests_finished_total{api=\"messages\",priority=\"1\"} 10";
    assert!(metrics.contains(line), "{line} in {metrics}");
}

#[test]
fn the_official_openai_client_s_responses_are_served() {
    let (_server, port) = serve();
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let seen = api_client("openai_responses.py", &base_url, "test-key");

    let whole = &seen["whole"];
    assert!(text(whole).contains("Paris"), "{whole}");
    assert_eq!(
        (&whole["object"], &whole["status"]),
        (&"response".into(), &"completed".into())
    );
    assert!(
        whole["id"].as_str().unwrap().starts_with("resp_"),
        "{whole}"
    );
    let stream = &seen["stream"];
    assert!(
        stream["pieces"].as_u64().unwrap() > 1,
        "streamed in pieces: {stream}"
    );
    assert_eq!(
        stream["text"], whole["text"],
        "greedy replies agree streamed or whole"
    );
    assert_eq!(stream["final"]["text"], whole["text"]);
    assert_eq!(stream["final"]["output_tokens"], whole["output_tokens"]);
    let events = stream["events"].as_array().unwrap();
    assert_eq!(events.first().unwrap(), "response.created", "{stream}");
    assert_eq!(events.last().unwrap(), "response.completed", "{stream}");
    let short = &seen["short"];
    assert_eq!(
        (&short["status"], &short["incomplete"]),
        (&"incomplete".into(), &"max_output_tokens".into()),
        "{short}"
    );
    assert!(
        seen["instructed"]["input_tokens"].as_u64() > whole["input_tokens"].as_u64(),
        "the instructions are in the prompt: {}",
        seen["instructed"]
    );
    // Continued by id: the kept turns (the first's words and its reply) are in the second
    // prompt, beyond the same question asked alone.
    let continued = &seen["continued"];
    let tokens = |case: &str, which: &str| continued[case][which].as_u64().unwrap();
    assert!(
        tokens("second", "input_tokens")
            > tokens("alone", "input_tokens") + tokens("first", "output_tokens") + 4,
        "{continued}"
    );
    assert!(!json_field(&seen["json_schema"], "capital").is_empty());

    let first = &seen["tool_first"];
    let [call] = first["calls"].as_array().unwrap().as_slice() else {
        panic!("one call: {first}")
    };
    assert_eq!(call["name"], "get_weather", "{call}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{call}");
    let streamed = &seen["tool_streamed"];
    assert_eq!(streamed["calls"][0]["name"], "get_weather", "{streamed}");
    let arguments: Value = serde_json::from_str(streamed["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {streamed}"));
    assert!(arguments["city"].is_string(), "{streamed}");
    let answered = &seen["tool_answered"];
    assert!(!text(answered).trim().is_empty(), "{answered}");
    assert_eq!(
        answered["types"],
        serde_json::json!(["message"]),
        "{answered}"
    );
    assert!(
        answered["input_tokens"].as_u64().unwrap() > whole["input_tokens"].as_u64().unwrap() + 20,
        "the call and its output are in the prompt: {answered}"
    );

    for (case, status, param, says) in [
        ("wrong_key", 401, Value::Null, "API key"),
        ("image", 400, "input".into(), "input_image"),
        ("hosted_tool", 400, "tools".into(), "web_search"),
        (
            "unknown_previous",
            400,
            "previous_response_id".into(),
            "not found",
        ),
        ("not_kept", 400, "previous_response_id".into(), "not found"),
        (
            "too_many_tokens",
            400,
            "max_output_tokens".into(),
            "max_output_tokens",
        ),
        ("oversized_prompt", 400, "input".into(), "tokens"),
    ] {
        let refusal = &seen[case];
        assert_eq!(refusal["status"], status, "{case}: {refusal}");
        assert_eq!(refusal["param"], param, "{case}: {refusal}");
        let message = refusal["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{case}: {refusal}");
    }
    assert_eq!(seen["oversized_prompt"]["code"], "context_length_exceeded");
    assert!(seen["after_errors"].as_str().unwrap().contains("Paris"));

    let metrics = metrics(port);
    let line = "sublet_requests_finished_total{api=\"responses\",priority=\"1\"} 12";
    assert!(metrics.contains(line), "{line} in {metrics}");
}
