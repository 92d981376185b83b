//! The agents' door, driven by the official `openai` Python client against the real engine.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sublet_livekit_testserver::TestServer;
use sublet_tests::official_clients::api_client;
use sublet_tests::served::{free_port, Server};

#[test]
fn the_official_openai_client_is_served() {
    let (_server, port) = Server::serve(
        env!("CARGO_BIN_EXE_serve"),
        "test-key",
        &["--api-max-in-flight", "2"],
    );
    // Two clients that send their headers, then stall mid-body: each holds a connection,
    // never one of the two places in flight (else every request below would get 429).
    let stalled: Vec<TcpStream> = (0..2).map(|_| stall_mid_body(port)).collect();
    let metrics = check_served(port);
    drop(stalled);
    assert!(
        !metrics.contains("sublet_make_room_switch"),
        "serve alone schedules as stock: {metrics}"
    );
}

/// A chat request whose body stops a few bytes in, its connection left open.
fn stall_mid_body(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Authorization: Bearer test-key\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"mess",
        )
        .unwrap();
    // Past the headers: the server has the request and waits for its body.
    std::thread::sleep(Duration::from_millis(200));
    stream
}

/// One process, as the product is deployed: the worker answering calls serves the agents'
/// API on the same engine, with make-room's switches and the turn hint on.
#[test]
fn the_worker_serves_agents_on_the_calls_engine() {
    const KEY: &str = "devkey";
    const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
    let livekit = TestServer::start(KEY, SECRET).unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_worker"))
        .args([
            "--agent-name",
            "sublet",
            "--api",
            &format!("127.0.0.1:{port}"),
            "--api-max-in-flight",
            "2",
        ])
        .env("LIVEKIT_URL", &livekit.url)
        .env("LIVEKIT_API_KEY", KEY)
        .env("LIVEKIT_API_SECRET", SECRET)
        .env(
            "SUBLET_RECORDS",
            std::env::temp_dir().join("sublet-openai-worker-records"),
        )
        .env("SUBLET_API_KEY", "test-key")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worker = Server::watched("worker", child);
    worker.wait_healthy(port);
    let started = Instant::now();
    while livekit.worker_statuses().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the worker serving the API never registered for calls"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let metrics = check_served(port);
    for switch in ["priority", "kv_preemption", "decode_hold", "turn_hint"] {
        let line = format!("sublet_make_room_switch{{switch=\"{switch}\"}} 1");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}

/// Runs the official client's checks against the API on `port` (key `test-key`) and
/// returns the metrics it read at the end.
fn check_served(port: u16) -> String {
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let seen = api_client("openai_chat.py", &base_url, "test-key");

    assert_eq!(seen["models"][0], "SmolLM2-135M-Instruct.Q4_1");
    let whole = &seen["whole"];
    assert!(
        whole["content"].as_str().unwrap().contains("Paris"),
        "{whole}"
    );
    assert!(whole["completion_tokens"].as_u64().unwrap() <= 16);
    assert!(whole["prompt_tokens"].as_u64().unwrap() > 5);
    // The same greedy reply, ended where its stop text would begin.
    let stopped = &seen["stopped"];
    let cut = stopped["content"].as_str().unwrap();
    assert!(!cut.contains("Paris"), "{stopped}");
    assert!(
        whole["content"].as_str().unwrap().starts_with(cut),
        "{stopped}"
    );
    assert_eq!(stopped["finish_reason"], "stop", "{stopped}");
    // Held to the schema: a whole reply parses and has its one required key (the same
    // question unconstrained is answered in prose). JSON mode: an object, perhaps cut short.
    let shaped = &seen["json_schema"];
    let reply: Value = serde_json::from_str(shaped["content"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {shaped}"));
    assert!(reply["capital"].is_string(), "{shaped}");
    assert_eq!(reply.as_object().map(|o| o.len()), Some(1), "{shaped}");
    // It ends where its grammar does, not at its token limit.
    assert_eq!(shaped["finish_reason"], "stop", "{shaped}");
    let object = &seen["json_object"];
    assert!(
        object["content"].as_str().unwrap().starts_with('{'),
        "{object}"
    );
    assert_eq!(seen["unknown_format"]["status"], 400);
    let stream = &seen["stream"];
    assert!(
        stream["pieces"].as_u64().unwrap() > 1,
        "streamed in pieces: {stream}"
    );
    assert_eq!(
        stream["content"], whole["content"],
        "greedy replies agree streamed or whole"
    );
    assert_eq!(stream["completion_tokens"], whole["completion_tokens"]);
    assert!(stream["finish_reason"].is_string());

    assert_eq!(seen["wrong_key"]["status"], 401);
    assert_eq!(seen["wrong_key"]["type"], "authentication_error");
    assert_eq!(seen["bad_role"]["status"], 400);
    assert_eq!(seen["bad_role"]["param"], "messages");
    assert_eq!(seen["too_many_tokens"]["param"], "max_tokens");
    assert_eq!(seen["uncompilable_schema"]["status"], 400);
    assert_eq!(seen["uncompilable_schema"]["param"], "response_format");
    assert!(
        seen["uncompilable_schema"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the schema cannot be compiled")),
        "{}",
        seen["uncompilable_schema"]
    );
    // Both refused by the server's own count, before the engine's thread (whose refusal
    // carries no code): the first tokenized on a worker, the second from its bytes alone.
    for (case, counted) in [("oversized_prompt", "take 2"), ("huge_prompt", "at least")] {
        let refusal = &seen[case];
        assert_eq!(refusal["status"], 400, "{refusal}");
        assert_eq!(refusal["code"], "context_length_exceeded", "{refusal}");
        let message = refusal["message"].as_str().unwrap_or_default();
        assert!(message.contains(counted), "{case}: {refusal}");
    }
    // The tool loop: the model's call comes back as OpenAI's, whole and streamed, with
    // the reply ending for it; the tool's result goes back as a tool message and is
    // answered in text.
    let first = &seen["tool_first"];
    assert_eq!(first["finish_reason"], "tool_calls", "{first}");
    assert!(first["content"].is_null(), "{first}");
    let streamed = &seen["tool_streamed"];
    assert_eq!(streamed["finish_reason"], "tool_calls", "{streamed}");
    for calls in [&first["calls"], &streamed["calls"]] {
        let [call] = calls.as_array().unwrap().as_slice() else {
            panic!("one call: {calls}")
        };
        assert_eq!(call["name"], "get_weather", "{call}");
        assert!(
            call["id"].as_str().is_some_and(|id| !id.is_empty()),
            "{call}"
        );
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("arguments are JSON text: {e}: {call}"));
        assert!(arguments["city"].is_string(), "{call}");
    }
    assert_eq!(first["calls"][0]["type"], "function");
    let answered = &seen["tool_answered"];
    assert!(
        answered["content"]
            .as_str()
            .is_some_and(|c| !c.trim().is_empty()),
        "{answered}"
    );
    assert_ne!(answered["finish_reason"], "tool_calls", "{answered}");
    assert!(
        answered["prompt_tokens"].as_u64().unwrap()
            > seen["whole"]["prompt_tokens"].as_u64().unwrap() + 20,
        "the call and its result are in the prompt: {answered}"
    );
    assert_eq!(
        seen["tool_required"]["status"], 400,
        "{}",
        seen["tool_required"]
    );
    assert_eq!(seen["tool_required"]["param"], "tool_choice");
    assert_eq!(seen["tool_result_without_id"]["status"], 400);
    assert_eq!(seen["tool_result_without_id"]["param"], "messages");

    // The legacy completions API: the same continuation whole and streamed, counted.
    let text = &seen["text_whole"];
    assert_eq!(text["object"], "text_completion", "{text}");
    assert!(
        text["text"].as_str().is_some_and(|t| !t.trim().is_empty()),
        "{text}"
    );
    assert!(text["prompt_tokens"].as_u64().unwrap() >= 4, "{text}");
    assert!(text["completion_tokens"].as_u64().unwrap() <= 8, "{text}");
    let text_stream = &seen["text_stream"];
    assert_eq!(text_stream["text"], text["text"], "{text_stream}");
    assert!(text_stream["pieces"].as_u64().unwrap() > 1, "{text_stream}");
    assert_eq!(text_stream["completion_tokens"], text["completion_tokens"]);
    assert_eq!(text_stream["finish_reason"], text["finish_reason"]);
    assert_eq!(seen["text_echo"]["param"], "echo", "{}", seen["text_echo"]);
    assert_eq!(
        seen["text_oversized"]["code"], "context_length_exceeded",
        "{}",
        seen["text_oversized"]
    );
    assert_eq!(seen["text_oversized"]["param"], "prompt");
    // Sampled at temperature 1: the seed decides the reply.
    let seeded = &seen["seeded"];
    assert_eq!(seeded["first"], seeded["again"], "{seeded}");
    assert!(
        seeded["others"]
            .as_array()
            .unwrap()
            .iter()
            .any(|other| other != &seeded["first"]),
        "other seeds, other replies: {seeded}"
    );

    assert_eq!(seen["malformed_json"]["status"], 400);
    assert_eq!(
        seen["malformed_json"]["body"]["error"]["type"],
        "invalid_request_error"
    );
    assert_eq!(seen["form_post"]["status"], 415, "{}", seen["form_post"]);
    assert!(
        seen["after_errors"].as_str().unwrap().contains("Paris"),
        "still serving after refusals"
    );
    assert_eq!(seen["busy"]["status"], 429, "{}", seen["busy"]);
    assert_eq!(
        seen["metrics_without_key"], 401,
        "/metrics is behind the key"
    );
    assert_eq!(seen["busy"]["retry_after"], "1", "{}", seen["busy"]);
    assert!(
        seen["after_busy"]["content"]
            .as_str()
            .is_some_and(|c| !c.trim().is_empty()),
        "served again once the streams in flight closed: {}",
        seen["after_busy"]
    );

    // The stream that asked for priority -1 ran at agent priority, beside the others.
    let metrics = seen["metrics"].as_str().unwrap();
    // Counted by API: 14 chat completions and 2 text completions finished.
    for (name, api, count) in [
        ("finished", "chat_completions", 14),
        ("finished", "completions", 2),
        ("cancelled", "chat_completions", 2),
        ("in_flight", "chat_completions", 0),
    ] {
        let family = match name {
            "in_flight" => "sublet_requests_in_flight".to_string(),
            name => format!("sublet_requests_{name}_total"),
        };
        let line = format!("{family}{{api=\"{api}\",priority=\"1\"}} {count}");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    for line in [
        "sublet_requests_refused_total{status=\"401\"} 1",
        "sublet_requests_refused_total{status=\"415\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(
        metrics.contains("sublet_requests_refused_total{status=\"429\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("priority=\"-1\"")
            && !metrics.contains("sublet_requests_started_total{priority=\"0\"}"),
        "{metrics}"
    );
    metrics.to_string()
}
