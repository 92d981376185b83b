//! The agents' door, driven by the official `openai` Python client against the real engine.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sublet_models::ModelCache;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.write_all(b"GET /health HTTP/1.0\r\n\r\n");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.ends_with("ok")
}

#[test]
fn the_official_openai_client_is_served() {
    let python = ModelCache::from_env()
        .python()
        .expect("run `cargo xtask setup` for the test clients");
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--api-key",
            "test-key",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _server = Server(child);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
        }
    });
    let started = Instant::now();
    while !healthy(port) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "server did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/clients/openai_chat.py"
    );
    let output = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .arg("test-key")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "client failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    println!("{}", serde_json::to_string_pretty(&seen).unwrap());

    assert_eq!(seen["models"][0], "SmolLM2-135M-Instruct.Q4_1");
    let whole = &seen["whole"];
    assert!(
        whole["content"].as_str().unwrap().contains("Paris"),
        "{whole}"
    );
    assert!(whole["completion_tokens"].as_u64().unwrap() <= 16);
    assert!(whole["prompt_tokens"].as_u64().unwrap() > 5);
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
    assert_eq!(
        seen["oversized_prompt"]["status"], 400,
        "{}",
        seen["oversized_prompt"]
    );
    assert_eq!(seen["malformed_json"]["status"], 400);
    assert_eq!(
        seen["malformed_json"]["body"]["error"]["type"],
        "invalid_request_error"
    );
    assert!(
        seen["after_errors"].as_str().unwrap().contains("Paris"),
        "still serving after refusals"
    );

    let metrics = seen["metrics"].as_str().unwrap();
    assert!(
        metrics.contains("sublet_requests_finished_total{priority=\"1\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sublet_requests_finished_total{priority=\"0\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sublet_requests_refused_total{status=\"401\"} 1"),
        "{metrics}"
    );
}
