//! Coding agents replayed against the engine's OpenAI-compatible API: each session a
//! thread that resends its growing context, streams the answer, keeps it, and pauses as
//! an agent running a tool would.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::stats::AgentCallRecord;
use crate::trace::{sessions, AgentCall};

/// Words the filler context is made of: code-like text, about one token each.
const WORDS: &[&str] = &[
    "fn", "let", "mut", "value", "match", "Some", "None", "return", "self", "impl", "struct",
    "error", "result", "config", "index", "buffer", "parse", "token", "stream", "request",
    "update", "state", "file", "path", "test", "assert", "len", "push", "iter", "map",
];

/// `tokens` words of code-like text, different for each session and call.
fn filler(seed: usize, tokens: usize) -> String {
    (0..tokens)
        .map(|i| WORDS[(seed * 31 + i * 7 + i / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Replays `trace` against the API at `base_url` (`http://host:port`) until every session
/// is done or `stop` is set; times are measured from `round_start`.
pub fn replay(
    base_url: &str,
    trace: &[AgentCall],
    stop: &AtomicBool,
    round_start: Instant,
) -> Vec<AgentCallRecord> {
    let sessions = sessions(trace);
    std::thread::scope(|scope| {
        let threads: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(n, calls)| scope.spawn(move || session(base_url, n, calls, stop, round_start)))
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_default())
            .collect()
    })
}

fn session(
    base_url: &str,
    number: usize,
    calls: &[AgentCall],
    stop: &AtomicBool,
    round_start: Instant,
) -> Vec<AgentCallRecord> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(600))
        .build();
    let url = format!("{base_url}/v1/chat/completions");
    let mut messages = vec![json!({
        "role": "system",
        "content": "You are a coding agent. Continue the code you are given.",
    })];
    let mut records = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let until = Instant::now() + Duration::from_secs_f64(call.pause_s);
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return records;
            }
            std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
        if stop.load(Ordering::Relaxed) {
            return records;
        }
        messages.push(json!({
            "role": "user",
            "content": filler(number * 1000 + i, call.context_tokens),
        }));
        let started = Instant::now();
        let started_s = started.duration_since(round_start).as_secs_f64();
        let body = json!({
            "model": "sublet",
            "messages": messages,
            "max_tokens": call.output_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let (answer, first_token, tokens, error) = match agent.post(&url).send_json(body) {
            Ok(response) => read_stream(response, started),
            Err(e) => (String::new(), None, 0, Some(e.to_string())),
        };
        records.push(AgentCallRecord {
            session: call.session.clone(),
            started_s,
            first_token_s: first_token,
            ended_s: round_start.elapsed().as_secs_f64(),
            output_tokens: tokens,
            error,
        });
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    records
}

/// Reads a streamed completion: its text, when its first text came (seconds after
/// `started`), its completion tokens (from the usage record), and an error if it broke.
fn read_stream(
    response: ureq::Response,
    started: Instant,
) -> (String, Option<f64>, usize, Option<String>) {
    let mut text = String::new();
    let mut first_token = None;
    let mut tokens = 0;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return (text, first_token, tokens, Some(e.to_string())),
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(piece) = event["choices"][0]["delta"]["content"].as_str() {
            if !piece.is_empty() {
                first_token.get_or_insert_with(|| started.elapsed().as_secs_f64());
                text.push_str(piece);
            }
        }
        if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
            tokens = n as usize;
        }
        if let Some(message) = event["error"]["message"].as_str() {
            return (text, first_token, tokens, Some(message.to_owned()));
        }
    }
    (text, first_token, tokens, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_has_the_asked_length_and_differs_by_seed() {
        assert_eq!(filler(3, 120).split_whitespace().count(), 120);
        assert_ne!(filler(3, 50), filler(4, 50));
        assert_eq!(filler(3, 50), filler(3, 50));
    }
}
