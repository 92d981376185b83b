//! The agents' door under load: clients of every kind a public endpoint meets, each a
//! plain TCP connection speaking HTTP/1.1 by hand (so a client can do what no library
//! would: stop mid-header, vanish mid-queue, send a megabyte of header), and the figures
//! their outcomes make.
//!
//! Every request a client sends ends in one [`Outcome`]; a run is sound when none ends
//! [`Outcome::NoAnswer`] or [`Outcome::Held`] (see [`LoadFigures::sound`]).

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientKind {
    /// A streamed chat request, read to its end; on 429 or 503 it waits `Retry-After`.
    Streamed,
    /// The same, asking for `priority: -1` (to outrank the callers).
    Urgent,
    /// A whole (not streamed) legacy completion.
    Whole,
    /// A streamed Anthropic Messages request as Claude Code sends one (`claude -p` with
    /// `--system-prompt` and `--tools ""`): system blocks, the environment as a system
    /// message, adaptive thinking, metadata.
    ClaudeCode,
    /// A streamed Responses request as Codex sends one: a developer message, the user's,
    /// function tools, `store: false`.
    Codex,
    /// Sends a streamed request and hangs up within a moment, often while it is queued.
    Vanishing,
    /// Sends one header line and then nothing.
    SlowHeader,
    /// A body over the server's 4 MiB bound.
    Oversized,
    /// A body that is not JSON.
    Malformed,
    /// A header line of 1 MiB.
    HugeHeader,
    /// Four stop texts of 256 KiB each (the server takes 256 bytes).
    LongStops,
    /// 200 tools (the server takes 128).
    ManyTools,
    /// A `Host` that names another site, as a page rebinding its name would send.
    ForeignHost,
    /// A JSON schema under the server's size bound built to be costly to compile (a
    /// pattern whose automaton doubles with each repeat, a 2,000-value enum): served, or
    /// refused with a 400, never a stall of everyone else.
    CostlySchema,
    /// `GET /metrics`, again and again.
    MetricsPoll,
    /// Asks once on a kept-alive connection and then holds it, idle, until the server
    /// closes it.
    IdleKeepAlive,
}

impl ClientKind {
    /// Whether the server should refuse every request of this kind.
    pub fn is_bad(self) -> bool {
        matches!(
            self,
            ClientKind::SlowHeader
                | ClientKind::Oversized
                | ClientKind::Malformed
                | ClientKind::HugeHeader
                | ClientKind::LongStops
                | ClientKind::ManyTools
                | ClientKind::ForeignHost
        )
    }

    /// Whether a refusal other than 429/503 is an answer the server may give (every
    /// refusal of a plain request is a fault).
    pub fn may_be_refused(self) -> bool {
        self.is_bad() || self == ClientKind::CostlySchema
    }
}

/// How one request ended, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// 200, and a stream that reached `[DONE]` (or a whole answer).
    Served,
    /// 429 or 503 (come back later).
    Busy { status: u16 },
    /// Another status, with an error body.
    Refused { status: u16 },
    /// The client hung up on purpose.
    HungUp,
    /// The server closed a connection whose request never finished arriving.
    Dropped { after_s: f64 },
    /// The connection ended without a status line, or a 200 stream ended before `[DONE]`.
    NoAnswer,
    /// Nothing came back within the client's patience.
    Held,
}

/// What the clients send.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: std::net::SocketAddr,
    /// How long a client waits for an answer before it counts as [`Outcome::Held`].
    pub patience: Duration,
}

fn chat_body(words: &str, priority: Option<i32>) -> String {
    let mut body = serde_json::json!({
        "model": "any",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 24,
        "stream": true,
    });
    if let Some(priority) = priority {
        body["priority"] = priority.into();
    }
    body.to_string()
}

fn post(path: &str, content_type: &str, body: &str) -> Vec<u8> {
    post_to("127.0.0.1", path, content_type, body)
}

fn post_to(host: &str, path: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A streamed chat request for `question` with `extra` fields.
fn chat_with(question: &str, extra: serde_json::Value) -> String {
    let mut body: serde_json::Value =
        serde_json::from_str(&chat_body(question, None)).expect("the chat body is JSON");
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body.to_string()
}

/// A schema under 64 KiB that is costly to compile: a pattern whose automaton doubles
/// with each of 20 repeats, and an enum of 2,000 values.
fn costly_schema() -> serde_json::Value {
    let values: Vec<String> = (0..2000).map(|i| format!("v{i:04}x")).collect();
    serde_json::json!({
        "type": "json_schema",
        "json_schema": {"name": "costly", "schema": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^(a|b)*a(a|b){20}$"},
                "pick": {"enum": values},
            },
            "required": ["code", "pick"],
        }},
    })
}

/// The `n`th request of a client of `kind`.
fn request(kind: ClientKind, n: usize) -> Vec<u8> {
    let question = format!("In one sentence, what is the number {n} known for?");
    match kind {
        ClientKind::Streamed | ClientKind::Vanishing => post(
            "/v1/chat/completions",
            "application/json",
            &chat_body(&question, None),
        ),
        ClientKind::Urgent => post(
            "/v1/chat/completions",
            "application/json",
            &chat_body(&question, Some(-1)),
        ),
        ClientKind::Whole => {
            let body =
                serde_json::json!({"prompt": format!("The number {n} is"), "max_tokens": 16});
            post("/v1/completions", "application/json", &body.to_string())
        }
        ClientKind::ClaudeCode => {
            let body = serde_json::json!({
                "model": "claude-opus-5-5", "max_tokens": 64, "stream": true,
                "system": [{"type": "text", "text": "You are a Claude agent."},
                           {"type": "text", "text": "You are brief.", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": question},
                             {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Platform: linux"}]}],
                "tools": [], "thinking": {"type": "adaptive"}, "metadata": {"user_id": format!("load-{n}")},
            });
            post(
                "/v1/messages?beta=true",
                "application/json",
                &body.to_string(),
            )
        }
        ClientKind::Codex => {
            let body = serde_json::json!({
                "model": "SmolLM2-135M-Instruct.Q4_1", "stream": true, "store": false,
                "max_output_tokens": 64, "tool_choice": "auto", "parallel_tool_calls": true,
                "input": [
                    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a brief coding assistant."}]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]},
                ],
                "tools": [{"type": "function", "name": "exec_command", "description": "Runs a command.",
                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}],
            });
            post("/v1/responses", "application/json", &body.to_string())
        }
        ClientKind::LongStops => {
            static BODY: LazyLock<Vec<u8>> = LazyLock::new(|| {
                let stop = "s".repeat(256 << 10);
                let extra =
                    serde_json::json!({"stop": [stop.clone(), stop.clone(), stop.clone(), stop]});
                post(
                    "/v1/chat/completions",
                    "application/json",
                    &chat_with("Hi", extra),
                )
            });
            BODY.clone()
        }
        ClientKind::ManyTools => {
            let tools: Vec<serde_json::Value> = (0..200)
                .map(|i| serde_json::json!({"type": "function", "function": {"name": format!("tool_{i}"), "parameters": {"type": "object"}}}))
                .collect();
            let body = chat_with(&question, serde_json::json!({"tools": tools}));
            post("/v1/chat/completions", "application/json", &body)
        }
        ClientKind::ForeignHost => post_to(
            "attacker.example",
            "/v1/chat/completions",
            "application/json",
            &chat_body(&question, None),
        ),
        ClientKind::CostlySchema => {
            let body = chat_with(
                &question,
                serde_json::json!({"response_format": costly_schema()}),
            );
            post("/v1/chat/completions", "application/json", &body)
        }
        ClientKind::MetricsPoll => {
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()
        }
        ClientKind::IdleKeepAlive => b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
        ClientKind::SlowHeader => {
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec()
        }
        // Built once: megabytes a request would weigh on the memory measured.
        ClientKind::Oversized => {
            static BODY: LazyLock<Vec<u8>> = LazyLock::new(|| {
                let words = "x".repeat(5 << 20);
                post(
                    "/v1/chat/completions",
                    "application/json",
                    &chat_body(&words, None),
                )
            });
            BODY.clone()
        }
        ClientKind::Malformed => post(
            "/v1/chat/completions",
            "application/json",
            r#"{"messages": [{"role": "user", "content": "#,
        ),
        ClientKind::HugeHeader => {
            static HEAD: LazyLock<Vec<u8>> = LazyLock::new(|| {
                format!(
                    "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
                    "y".repeat(1 << 20)
                )
                .into_bytes()
            });
            HEAD.clone()
        }
    }
}

/// Sends the `n`th request of a client of `kind` and reads how it ends. It reads while it
/// writes: a server that refuses a body before it has all arrived answers, then closes.
pub async fn send(target: &Target, kind: ClientKind, n: usize) -> Outcome {
    let started = Instant::now();
    let Ok(stream) = TcpStream::connect(target.addr).await else {
        return Outcome::NoAnswer;
    };
    let (mut reader, mut writer) = stream.into_split();
    let bytes = request(kind, n);
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&bytes).await;
        // Kept open (never half-closed): a client still sending, or waiting.
        writer
    });
    if kind == ClientKind::Vanishing {
        // Somewhere between queued and the first tokens.
        tokio::time::sleep(Duration::from_millis(50 + (n as u64 * 37) % 1500)).await;
        writing.abort();
        return Outcome::HungUp;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(target.patience, async {
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    writing.abort();
    if read.is_err() {
        return Outcome::Held;
    }
    let Some(status) = status_of(&answer) else {
        return match kind {
            ClientKind::SlowHeader => Outcome::Dropped {
                after_s: started.elapsed().as_secs_f64(),
            },
            _ => Outcome::NoAnswer,
        };
    };
    let text = String::from_utf8_lossy(&answer);
    match status {
        // Answered, then held idle until the server closed it.
        200 if kind == ClientKind::IdleKeepAlive => Outcome::Dropped {
            after_s: started.elapsed().as_secs_f64(),
        },
        200 if kind == ClientKind::MetricsPoll => {
            match text.contains("sublet_requests_started_total") {
                true => Outcome::Served,
                false => Outcome::NoAnswer,
            }
        }
        200 if kind == ClientKind::Whole => match text.contains("\"text_completion\"") {
            true => Outcome::Served,
            false => Outcome::NoAnswer,
        },
        200 if kind == ClientKind::ClaudeCode => match text.contains("event: message_stop") {
            true => Outcome::Served,
            false => Outcome::NoAnswer,
        },
        200 if kind == ClientKind::Codex => {
            match text.contains("event: response.completed")
                || text.contains("event: response.incomplete")
            {
                true => Outcome::Served,
                false => Outcome::NoAnswer,
            }
        }
        200 if text.contains("data: [DONE]") && !text.contains("\"error\"") => Outcome::Served,
        200 => Outcome::NoAnswer,
        429 | 503 => Outcome::Busy { status },
        status => Outcome::Refused { status },
    }
}

/// The status of an HTTP/1.1 response.
fn status_of(response: &[u8]) -> Option<u16> {
    let line = response.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

/// Counts of each outcome, for one kind of client.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    pub sent: usize,
    pub served: usize,
    /// 429 and 503 (come back later).
    pub busy: usize,
    /// Other refusals, by status.
    pub refused: BTreeMap<u16, usize>,
    pub hung_up: usize,
    pub dropped: usize,
    /// The longest a dropped connection was held.
    pub dropped_after_max_s: f64,
    pub no_answer: usize,
    pub held: usize,
}

impl Tally {
    pub fn add(&mut self, outcome: Outcome) {
        self.sent += 1;
        match outcome {
            Outcome::Served => self.served += 1,
            Outcome::Busy { .. } => self.busy += 1,
            Outcome::Refused { status } => *self.refused.entry(status).or_default() += 1,
            Outcome::HungUp => self.hung_up += 1,
            Outcome::Dropped { after_s } => {
                self.dropped += 1;
                self.dropped_after_max_s = self.dropped_after_max_s.max(after_s);
            }
            Outcome::NoAnswer => self.no_answer += 1,
            Outcome::Held => self.held += 1,
        }
    }
}

/// A load run's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadFigures {
    pub by_kind: BTreeMap<ClientKind, Tally>,
    /// The voice turn's first token, ms: alone before the load, and under it.
    pub voice_alone_ms: Vec<f64>,
    pub voice_loaded_ms: Vec<f64>,
    /// Resident memory, MB: before the load, its peak, and once the load has ended.
    pub rss_before_mb: f64,
    pub rss_peak_mb: f64,
    pub rss_after_mb: f64,
    /// The server's own count of requests cancelled (clients gone).
    pub cancelled: u64,
    /// Requests the server started that it never counted as ended.
    pub unaccounted: i64,
}

impl LoadFigures {
    pub fn add(&mut self, kind: ClientKind, outcome: Outcome) {
        self.by_kind.entry(kind).or_default().add(outcome);
    }

    /// No request unanswered or held, every bad request refused (never served), no other
    /// refused but for 429/503, every admitted request counted as ended.
    pub fn sound(&self) -> Result<(), String> {
        for (kind, tally) in &self.by_kind {
            if tally.no_answer + tally.held > 0 {
                return Err(format!(
                    "{kind:?}: {} without an answer, {} held",
                    tally.no_answer, tally.held
                ));
            }
            if kind.is_bad() && tally.served > 0 {
                return Err(format!("{kind:?}: {} served", tally.served));
            }
            if !kind.may_be_refused() && !tally.refused.is_empty() {
                return Err(format!("{kind:?}: refused {:?}", tally.refused));
            }
        }
        match self.unaccounted {
            0 => Ok(()),
            n => Err(format!("{n} requests started and never counted as ended")),
        }
    }

    /// The voice turn's median first token under load over its median alone.
    pub fn voice_ratio(&self) -> Option<f64> {
        Some(median(&self.voice_loaded_ms)? / median(&self.voice_alone_ms)?)
    }
}

pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_from_the_first_line_only() {
        assert_eq!(status_of(b"HTTP/1.1 429 Too Many Requests\r\n"), Some(429));
        assert_eq!(
            status_of(b"HTTP/1.1 200 OK\r\nX: HTTP/1.1 500\r\n"),
            Some(200)
        );
        assert_eq!(status_of(b""), None);
        assert_eq!(status_of(b"garbage 200\r\n"), None);
    }

    #[test]
    fn a_run_is_unsound_when_a_request_goes_unanswered_or_a_bad_one_is_served() {
        let mut figures = LoadFigures::default();
        figures.add(ClientKind::Streamed, Outcome::Served);
        figures.add(ClientKind::Streamed, Outcome::Busy { status: 429 });
        figures.add(ClientKind::Oversized, Outcome::Refused { status: 413 });
        figures.add(ClientKind::SlowHeader, Outcome::Dropped { after_s: 10.2 });
        assert_eq!(figures.sound(), Ok(()));
        let streamed = &figures.by_kind[&ClientKind::Streamed];
        assert_eq!((streamed.sent, streamed.served, streamed.busy), (2, 1, 1));

        let mut unanswered = figures.clone();
        unanswered.add(ClientKind::Whole, Outcome::NoAnswer);
        assert!(unanswered.sound().is_err());
        let mut held = figures.clone();
        held.add(ClientKind::SlowHeader, Outcome::Held);
        assert!(held.sound().is_err());
        let mut served = figures.clone();
        served.add(ClientKind::Malformed, Outcome::Served);
        assert!(served.sound().is_err());
        let mut refused = figures.clone();
        refused.add(ClientKind::Streamed, Outcome::Refused { status: 403 });
        assert!(refused.sound().is_err(), "a plain request refused");
        let mut schema = figures.clone();
        schema.add(ClientKind::CostlySchema, Outcome::Refused { status: 400 });
        schema.add(ClientKind::CostlySchema, Outcome::Served);
        assert_eq!(schema.sound(), Ok(()));
        let mut lost = figures;
        lost.unaccounted = 1;
        assert!(lost.sound().is_err());
    }

    #[test]
    fn the_voice_ratio_compares_medians() {
        let figures = LoadFigures {
            voice_alone_ms: vec![100.0, 300.0, 200.0],
            voice_loaded_ms: vec![250.0, 900.0, 260.0],
            ..LoadFigures::default()
        };
        assert_eq!(figures.voice_ratio(), Some(1.3));
        assert_eq!(LoadFigures::default().voice_ratio(), None);
    }
}
