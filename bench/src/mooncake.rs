//! The Mooncake-style trace AIPerf replays, to and from the bench's own sessions.
//!
//! One JSON object per line, one line per request, times in milliseconds:
//!
//! ```json
//! {"session_id": "agent-0.0", "timestamp": 0, "input_length": 1200, "output_length": 40}
//! {"session_id": "agent-0.0", "delay": 2500, "input_length": 150, "output_length": 120}
//! ```
//!
//! AIPerf keeps each session's conversation (its replies included) and sends a session's
//! first request at `timestamp`, each later one `delay` after the previous reply ended,
//! with `input_length` new tokens: the bench's [`AgentCall`] exactly, so its sessions go
//! to AIPerf line for line. A call that opens with the trace's shared context lists it as
//! one block, `"hash_ids": [0]`, with AIPerf's block size set to its length
//! ([`shared_block`]): AIPerf then writes the same text at the start of every such call
//! and fresh text after it, as the replayer does. Public traces without sessions
//! (Mooncake's own) list whole requests with `hash_ids`, the blocks of their prompt;
//! [`from_mooncake`] joins a request to the session whose last request its blocks extend.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::trace::{jsonl, sessions, AgentCall};

/// One line of a Mooncake-style trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MooncakeRow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// When the request is sent, ms from the start (a session's first request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<f64>,
    /// How long after the session's previous reply ended, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<f64>,
    pub input_length: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_length: Option<usize>,
    /// The prompt's blocks, for traces that record prefix sharing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hash_ids: Vec<u64>,
}

/// The hash id of the trace's shared context, the one block every session's first call
/// opens with.
const SHARED_BLOCK_ID: u64 = 0;

/// The length of the context the trace's sessions share, tokens (AIPerf's
/// `--isl-block-size` for [`to_mooncake`]'s rows); `None` when they share none.
pub fn shared_block(calls: &[AgentCall]) -> Option<usize> {
    calls
        .iter()
        .map(AgentCall::shared_prefix)
        .max()
        .filter(|n| *n > 0)
}

/// The rows AIPerf replays for `calls` over a window of `window_s`: each session runs as a
/// task that starts again, as a new session with a fresh context, every `task_every_s`
/// seconds while the window lasts (AIPerf's schedule is fixed in advance, so a session
/// cannot start over when its last reply ends, as the bench's own replayer does: a task
/// slower than the interval overlaps the next, and the load is heavier than the
/// replayer's).
pub fn to_mooncake(calls: &[AgentCall], window_s: f64, task_every_s: f64) -> String {
    let block = shared_block(calls);
    let mut lines = String::new();
    for session in sessions(calls) {
        let first_s = session[0].pause_s;
        for task in 0.. {
            let start_s = first_s + task as f64 * task_every_s.max(1.0);
            if start_s >= window_s {
                break;
            }
            for (i, call) in session.iter().enumerate() {
                let ms = |s: f64| (s * 1000.0).round();
                let row = MooncakeRow {
                    session_id: Some(format!("{}.{task}", call.session)),
                    timestamp: (i == 0).then(|| ms(start_s)),
                    delay: (i > 0).then(|| ms(call.pause_s)),
                    input_length: call.context_tokens.max(1),
                    output_length: Some(call.output_tokens),
                    hash_ids: match block {
                        Some(n) if call.shared_prefix() == n => {
                            vec![SHARED_BLOCK_ID]
                        }
                        _ => Vec::new(),
                    },
                };
                lines += &(serde_json::to_string(&row).expect("a row serializes") + "\n");
            }
        }
    }
    lines
}

/// The sessions of a Mooncake-style trace, token counts multiplied by `scale` (a public
/// trace sized for a GPU, scaled down to this engine). Rows with a `session_id` are that
/// session's calls in order, `input_length` being what each adds. Rows without one are
/// whole requests: a row joins the session whose last row's blocks (`hash_ids`, all but
/// a partial last one) begin its own, and adds its prompt beyond that row's prompt and
/// reply; any other row starts a session. A session's first call waits for its
/// timestamp; a later one its `delay`, or else the time since the previous row was sent
/// (when that row's reply ended is not recorded).
pub fn from_mooncake(text: &str, scale: f64) -> Result<Vec<AgentCall>> {
    if !(scale > 0.0 && scale.is_finite()) {
        bail!("the trace's scale must be a positive number, not {scale}");
    }
    let rows = jsonl::<MooncakeRow>(text, "trace line")?;
    let start_ms = rows
        .iter()
        .filter_map(|(_, r)| r.timestamp)
        .fold(f64::INFINITY, f64::min);
    let scaled = |tokens: usize| ((tokens as f64 * scale).round() as usize).max(1);
    // Each session's name and its last row.
    let mut open: Vec<(String, MooncakeRow)> = Vec::new();
    let mut calls = Vec::new();
    for (n, (line, row)) in rows.into_iter().enumerate() {
        let Some(output) = row.output_length.filter(|o| *o > 0) else {
            bail!("trace line {line}: output_length must be at least 1");
        };
        let since_ms = |earlier: &MooncakeRow| match (row.delay, row.timestamp, earlier.timestamp) {
            (Some(delay), _, _) => delay,
            (None, Some(now), Some(then)) => (now - then).max(0.0),
            _ => 0.0,
        };
        let first_ms = row.timestamp.map_or(0.0, |t| (t - start_ms).max(0.0));
        let (session, pause_ms, context) = if let Some(id) = &row.session_id {
            match open.iter().find(|(name, _)| name == id) {
                Some((_, last)) => (id.clone(), since_ms(last), row.input_length),
                None => (id.clone(), first_ms, row.input_length),
            }
        } else {
            match extended_session(&open, &row.hash_ids) {
                Some(i) => {
                    let (name, last) = &open[i];
                    let before = last.input_length + last.output_length.unwrap_or(0);
                    (
                        name.clone(),
                        since_ms(last),
                        row.input_length.saturating_sub(before),
                    )
                }
                None => (format!("request-{}", n + 1), first_ms, row.input_length),
            }
        };
        if !(pause_ms >= 0.0 && pause_ms.is_finite()) {
            bail!("trace line {line}: timestamps and delays must be ≥ 0 ms");
        }
        calls.push(AgentCall {
            session: session.clone(),
            pause_s: pause_ms.round() / 1000.0,
            context_tokens: scaled(context),
            output_tokens: scaled(output),
            shared_tokens: 0,
        });
        match open.iter_mut().find(|(name, _)| *name == session) {
            Some(slot) => slot.1 = row,
            None => open.push((session, row)),
        }
    }
    Ok(calls)
}

/// The open session whose last row's blocks, all but its last (which may be partial),
/// begin `hash_ids`: the one sharing the most blocks (a system prompt alone is shared by
/// unrelated sessions), the most recent of equals.
fn extended_session(open: &[(String, MooncakeRow)], hash_ids: &[u64]) -> Option<usize> {
    (0..open.len())
        .filter_map(|i| {
            let last = &open[i].1.hash_ids;
            let whole = last.len().saturating_sub(1).max(1);
            (!last.is_empty() && hash_ids.len() > whole && hash_ids[..whole] == last[..whole])
                .then_some((whole, i))
        })
        .max()
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{generate, GeneratorConfig};

    #[test]
    fn the_bench_sessions_go_to_aiperf_and_come_back_the_same() {
        let config = GeneratorConfig {
            sessions: 3,
            calls_per_session: 4,
            ..GeneratorConfig::default()
        };
        let calls = generate(5, &config);
        // A window shorter than the interval between tasks: each session once.
        let rows = to_mooncake(&calls, 30.0, 60.0);
        assert_eq!(rows.lines().count(), calls.len());
        let back = from_mooncake(&rows, 1.0).unwrap();
        for (a, b) in calls.iter().zip(&back) {
            assert_eq!(
                (a.pause_s, a.context_tokens, a.output_tokens),
                (b.pause_s, b.context_tokens, b.output_tokens)
            );
            assert_eq!(b.session, format!("{}.0", a.session));
        }
        // Every 20 s through a 50 s window: tasks at 0, 20 and 40 s after each first start.
        let rows = to_mooncake(&calls, 50.0, 20.0);
        assert_eq!(rows.lines().count(), 3 * calls.len());
        let first: MooncakeRow = serde_json::from_str(rows.lines().nth(8).unwrap()).unwrap();
        assert_eq!(first.session_id.as_deref(), Some("agent-0.2"));
        assert_eq!(first.timestamp, Some(40_000.0));
        assert_eq!(first.delay, None);
        // Without a shared context no call lists a block.
        assert_eq!(shared_block(&calls), None);
        assert!(!rows.contains("hash_ids"));
    }

    #[test]
    fn the_shared_context_goes_to_aiperf_as_one_block() {
        let config = GeneratorConfig {
            sessions: 3,
            calls_per_session: 3,
            shared_context: 400,
            ..GeneratorConfig::default()
        };
        let calls = generate(5, &config);
        assert_eq!(shared_block(&calls), Some(400));
        let rows: Vec<MooncakeRow> = to_mooncake(&calls, 30.0, 60.0)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for (call, row) in calls.iter().zip(&rows) {
            // Each session's first call opens with the block, and is longer than it (its
            // own context follows, fresh); later calls add their own tokens only.
            match call.shared_tokens {
                0 => assert!(row.hash_ids.is_empty()),
                _ => {
                    assert_eq!(row.hash_ids, vec![SHARED_BLOCK_ID]);
                    assert!(row.input_length > 400);
                }
            }
        }
        assert_eq!(rows.iter().filter(|r| !r.hash_ids.is_empty()).count(), 3);
    }

    #[test]
    fn whole_requests_join_the_session_whose_blocks_they_extend() {
        let trace = r#"
{"timestamp": 1000, "input_length": 300, "output_length": 40, "hash_ids": [1, 2, 3]}
{"timestamp": 1500, "input_length": 200, "output_length": 10, "hash_ids": [1, 7]}
{"timestamp": 4000, "input_length": 500, "output_length": 60, "hash_ids": [1, 2, 4, 5, 6]}
{"timestamp": 9000, "input_length": 700, "output_length": 20, "hash_ids": [1, 2, 4, 5, 8, 9, 10]}
"#;
        let calls = from_mooncake(trace, 1.0).unwrap();
        let got: Vec<(&str, f64, usize, usize)> = calls
            .iter()
            .map(|c| {
                (
                    c.session.as_str(),
                    c.pause_s,
                    c.context_tokens,
                    c.output_tokens,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("request-1", 0.0, 300, 40),
                // Shares only the first block (a system prompt): its own session.
                ("request-2", 0.5, 200, 10),
                // Extends request 1's whole blocks (its last, 3, may have been partial).
                ("request-1", 3.0, 160, 60),
                ("request-1", 5.0, 140, 20),
            ]
        );
        // Scaled to a tenth.
        let scaled = from_mooncake(trace, 0.1).unwrap();
        assert_eq!((scaled[0].context_tokens, scaled[0].output_tokens), (30, 4));
    }

    #[test]
    fn bad_rows_are_named() {
        let error = from_mooncake("{\"input_length\": 10}\n", 1.0).unwrap_err();
        assert!(format!("{error:#}").contains("output_length"), "{error:#}");
        let error =
            from_mooncake("{\"input_length\": 10, \"output_length\": 2}\nnope", 1.0).unwrap_err();
        assert!(format!("{error:#}").contains("trace line 2"), "{error:#}");
        assert!(from_mooncake("", 0.0).is_err());
    }
}
