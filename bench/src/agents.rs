//! Coding agents replayed against the engine's OpenAI-compatible API: each session a
//! thread that resends its growing context, streams the answer, keeps it, and pauses as
//! an agent running a tool would. A session that ends before the round's window closes
//! starts over as a new task (a fresh context), so the agents' load lasts the window.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use sublet_engine::Engine;
use sublet_server::{router, serve, ConnectionLimits, Metrics, ServerConfig};

use crate::stats::AgentCallRecord;
use crate::trace::{sessions, AgentCall};

/// Words the filler context is made of: code-like text, about one token each.
const WORDS: &[&str] = &[
    "fn", "let", "mut", "value", "match", "Some", "None", "return", "self", "impl", "struct",
    "error", "result", "config", "index", "buffer", "parse", "token", "stream", "request",
    "update", "state", "file", "path", "test", "assert", "len", "push", "iter", "map",
];

/// Where the seeds of shared contexts start: apart from every session's and call's own.
const SHARED_SEED: usize = 1 << 24;

/// The seed of `trace`'s shared context, from the trace itself: both rounds of a pair
/// replay one trace, so they read the same text and their agents write alike; the
/// rounds' own system prompts keep one round's prompts out of the other's cache.
fn shared_seed(trace: &[AgentCall]) -> usize {
    let digest = trace.iter().fold(0usize, |h, c| {
        h.wrapping_mul(31)
            .wrapping_add(c.context_tokens * 7 + c.output_tokens)
    });
    SHARED_SEED + digest % (1 << 20)
}

/// `tokens` words of code-like text, different for each session and call; a shorter text
/// of a seed is the start of a longer one.
fn filler(seed: usize, tokens: usize) -> String {
    (0..tokens)
        .map(|i| WORDS[(seed * 31 + i * 7 + i / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Serves the engine's OpenAI-compatible API on a free local port on `runtime`, as the
/// agents reach it; returns its base URL (`http://127.0.0.1:PORT`).
pub fn serve_api(
    engine: &Arc<Engine>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<String> {
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base_url = format!("http://{}", listener.local_addr()?);
    let app = router(
        engine.clone(),
        ServerConfig::default(),
        Arc::new(Metrics::default()),
    );
    runtime.spawn(serve(
        listener,
        app,
        ConnectionLimits::default(),
        std::future::pending(),
    ));
    Ok(base_url)
}

/// Replays `trace` against the API at `base_url` (`http://host:port`) until `stop` is set
/// (each session starting over as a new task when its calls are done); times are measured
/// from `round_start`. `round` (a different number for each round) keeps rounds from
/// sharing prompts in the engine's cache; both rounds of a pair, replaying one trace,
/// read the same shared context.
pub fn replay(
    base_url: &str,
    trace: &[AgentCall],
    stop: &AtomicBool,
    round_start: Instant,
    round: usize,
) -> Vec<AgentCallRecord> {
    let sessions = sessions(trace);
    let shared_seed = shared_seed(trace);
    std::thread::scope(|scope| {
        let threads: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(n, calls)| {
                let opening = Opening { round, shared_seed };
                scope.spawn(move || session(base_url, n, calls, stop, round_start, opening))
            })
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
    opening: Opening,
) -> Vec<AgentCallRecord> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(600))
        .build();
    let url = format!("{base_url}/v1/chat/completions");
    let to = Endpoint {
        agent: &agent,
        url: &url,
        stop,
        round_start,
        shared_seed: opening.shared_seed,
    };
    let mut records = Vec::new();
    for task in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // The round's own opening: no round finds another's prompts in the engine's prefix
        // cache (each pair's rounds start from the same, cold cache). Within a round the
        // sessions share only the shared context; each task's own words differ.
        let mut messages = vec![system_prompt(opening.round)];
        to.task(number * 100 + task, calls, &mut messages, &mut records);
    }
    records
}

/// How a round's sessions open: its number, and the seed of its shared context.
#[derive(Clone, Copy)]
struct Opening {
    round: usize,
    shared_seed: usize,
}

/// The system message every session of `round` opens with.
fn system_prompt(round: usize) -> Value {
    json!({
        "role": "system",
        "content": format!("Round {round}. You are a coding agent. Continue the code you are given."),
    })
}

/// Puts the round's shared context (the longest any call of `trace` opens with) in the
/// engine's prefix cache before the sessions start, as a server's cache holds the prompt
/// its agents all share: the engine caches finished sequences only, so sessions starting
/// together would otherwise each compute it. Does nothing without a shared context.
pub fn warm_shared_context(
    base_url: &str,
    trace: &[AgentCall],
    round: usize,
) -> anyhow::Result<()> {
    let Some(shared) = trace
        .iter()
        .map(|c| c.shared_tokens)
        .max()
        .filter(|n| *n > 0)
    else {
        return Ok(());
    };
    let body = json!({
        "model": "sublet",
        "messages": [
            system_prompt(round),
            {"role": "user", "content": filler(shared_seed(trace), shared)},
        ],
        "max_tokens": 1,
    });
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(600))
        .build()
        .post(&format!("{base_url}/v1/chat/completions"))
        .send_json(body)?;
    Ok(())
}

/// Where a session's calls go, and when they stop.
struct Endpoint<'a> {
    agent: &'a ureq::Agent,
    url: &'a str,
    stop: &'a AtomicBool,
    round_start: Instant,
    /// The seed of the round's shared context.
    shared_seed: usize,
}

impl Endpoint<'_> {
    /// One pass through a session's calls, as one task: returns early when `stop` is set.
    fn task(
        &self,
        number: usize,
        calls: &[AgentCall],
        messages: &mut Vec<Value>,
        records: &mut Vec<AgentCallRecord>,
    ) {
        let Self {
            agent,
            url,
            stop,
            round_start,
            shared_seed,
        } = *self;
        for (i, call) in calls.iter().enumerate() {
            let until = Instant::now() + Duration::from_secs_f64(call.pause_s);
            while Instant::now() < until {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let shared = call.shared_prefix();
            let own = filler(number * 1000 + i, call.context_tokens - shared);
            let content = match shared {
                0 => own,
                _ => format!("{}\n\n{own}", filler(shared_seed, shared)),
            };
            messages.push(json!({"role": "user", "content": content}));
            let started = Instant::now();
            let started_s = started.duration_since(round_start).as_secs_f64();
            let body = json!({
                "model": "sublet",
                "messages": messages,
                "max_tokens": call.output_tokens,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            let streamed = match agent.post(url).send_json(body) {
                Ok(response) => read_stream(response, started, round_start),
                Err(e) => Streamed {
                    error: Some(e.to_string()),
                    ..Streamed::default()
                },
            };
            records.push(AgentCallRecord {
                session: call.session.clone(),
                started_s,
                first_token_s: streamed.first_token_s,
                ended_s: round_start.elapsed().as_secs_f64(),
                output_tokens: streamed.tokens,
                token_times_s: streamed.token_times_s,
                error: streamed.error,
            });
            messages.push(json!({"role": "assistant", "content": streamed.text}));
        }
    }
}

/// What a streamed completion brought.
#[derive(Default)]
struct Streamed {
    text: String,
    /// When its first text came, seconds after the request was sent.
    first_token_s: Option<f64>,
    /// When each piece of text came, seconds after the round started.
    token_times_s: Vec<f64>,
    /// Its completion tokens, from the usage record.
    tokens: usize,
    error: Option<String>,
}

/// Reads a streamed completion sent at `started`, until its end or an error.
fn read_stream(response: ureq::Response, started: Instant, round_start: Instant) -> Streamed {
    let mut streamed = Streamed::default();
    for line in BufReader::new(response.into_reader()).lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                streamed.error = Some(e.to_string());
                break;
            }
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
                let now = Instant::now();
                streamed
                    .first_token_s
                    .get_or_insert_with(|| now.duration_since(started).as_secs_f64());
                // Milliseconds: enough for a throughput window, and compact in the report.
                let at_s = now.duration_since(round_start).as_secs_f64();
                streamed
                    .token_times_s
                    .push((at_s * 1000.0).round() / 1000.0);
                streamed.text.push_str(piece);
            }
        }
        if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
            streamed.tokens = n as usize;
        }
        if let Some(message) = event["error"]["message"].as_str() {
            streamed.error = Some(message.to_owned());
            break;
        }
    }
    streamed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_has_the_asked_length_and_differs_by_seed() {
        assert_eq!(filler(3, 120).split_whitespace().count(), 120);
        assert_ne!(filler(3, 50), filler(4, 50));
        assert_eq!(filler(3, 50), filler(3, 50));
        assert!(filler(SHARED_SEED + 2, 120).starts_with(&filler(SHARED_SEED + 2, 60)));
        let trace = crate::trace::generate(3, &crate::trace::GeneratorConfig::default());
        assert_eq!(shared_seed(&trace), shared_seed(&trace.clone()));
        let other = crate::trace::generate(4, &crate::trace::GeneratorConfig::default());
        assert_ne!(shared_seed(&trace), shared_seed(&other));
    }
}
