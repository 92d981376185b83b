//! Coding-agent sessions as a trace: one JSON object per line, one line per call.
//!
//! ```json
//! {"session": "s1", "pause_s": 0.0, "context_tokens": 600, "output_tokens": 40}
//! {"session": "s1", "pause_s": 2.5, "context_tokens": 120, "output_tokens": 200}
//! ```
//!
//! A session's calls run in order. Each call waits `pause_s` after the previous one ended
//! (the agent running a tool), then resends the session's whole context so far plus
//! `context_tokens` new tokens (so consecutive calls share a long prefix), and asks for
//! `output_tokens` tokens of answer, which join the context too. Sessions run at once,
//! each from the start of the round.
//!
//! A public coding-agent trace converts line by line: per request, its session (or
//! conversation) id, the idle time since that session's previous response ended, the
//! prompt tokens it added beyond the previous request's prompt and response (for the first
//! request, its whole prompt), and its completion tokens.

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// One call of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCall {
    pub session: String,
    /// Seconds after the session's previous call ended (for the first call: after the
    /// round began).
    pub pause_s: f64,
    /// Tokens this call adds to the session's context.
    pub context_tokens: usize,
    /// Tokens of answer it asks for.
    pub output_tokens: usize,
    /// Of `context_tokens`, how many open with the round's shared context (the repository
    /// and instructions every session reads, the same text in each): a public trace's
    /// shared prefix. Meant for a session's first call.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_tokens: usize,
}

impl AgentCall {
    /// The shared context this call opens with, tokens: `shared_tokens`, never more than
    /// the call's context (a hand-written trace may say more; parsing refuses it).
    pub fn shared_prefix(&self) -> usize {
        self.shared_tokens.min(self.context_tokens)
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The JSON objects of a JSONL text, each with its line number (from 1), blank lines
/// skipped; a line that does not parse is an error naming it as `what` and its number.
pub fn jsonl<T: DeserializeOwned>(text: &str, what: &str) -> Result<Vec<(usize, T)>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let value = serde_json::from_str(line)
                .with_context(|| format!("{what} {}: {line:?}", n + 1))?;
            Ok((n + 1, value))
        })
        .collect()
}

/// Reads a trace; a bad line is an error that names it.
pub fn parse(text: &str) -> Result<Vec<AgentCall>> {
    let mut calls = Vec::new();
    for (line, call) in jsonl::<AgentCall>(text, "trace line")? {
        if !(call.pause_s >= 0.0 && call.pause_s.is_finite()) || call.output_tokens == 0 {
            bail!("trace line {line}: pause_s must be ≥ 0 and output_tokens ≥ 1");
        }
        if call.shared_tokens > call.context_tokens {
            bail!("trace line {line}: shared_tokens must be at most context_tokens");
        }
        calls.push(call);
    }
    Ok(calls)
}

/// Writes a trace, one call per line.
pub fn to_jsonl(calls: &[AgentCall]) -> String {
    calls
        .iter()
        .map(|c| serde_json::to_string(c).expect("a call serializes") + "\n")
        .collect()
}

/// The calls of each session, in order, sessions in order of first appearance.
pub fn sessions(calls: &[AgentCall]) -> Vec<Vec<AgentCall>> {
    let mut sessions: Vec<Vec<AgentCall>> = Vec::new();
    for call in calls {
        match sessions.iter_mut().find(|s| s[0].session == call.session) {
            Some(session) => session.push(call.clone()),
            None => sessions.push(vec![call.clone()]),
        }
    }
    sessions
}

/// The shape of generated sessions. The defaults are scaled to this project's CPU engine
/// and small model: twelve sessions whose first contexts together outgrow a 4,096-token
/// KV budget three times over, each growing to nearly the whole budget by its last call
/// (so that the agents' KV fills the budget and a voice turn must take room), with
/// prompts long enough that prefill is in most steps.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    pub sessions: usize,
    pub calls_per_session: usize,
    /// Tokens every session's first call opens with, the same text in each (the
    /// repository and instructions all the agents read): computed once, it then comes
    /// from the prefix cache, yet each running request holds it in its own KV.
    pub shared_context: usize,
    /// The first call's own context after the shared one, tokens (uniform in the range).
    pub first_context: (usize, usize),
    /// What each later call adds (a tool's output), tokens.
    pub growth: (usize, usize),
    /// Answers: mostly short, sometimes long.
    pub short_output: (usize, usize),
    pub long_output: (usize, usize),
    pub long_output_share: f64,
    /// The tool pause before each later call, seconds.
    pub pause_s: (f64, f64),
    /// Sessions start spread over this many seconds.
    pub stagger_s: f64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self {
            sessions: 12,
            calls_per_session: 6,
            shared_context: 0,
            first_context: (1000, 1800),
            growth: (80, 250),
            short_output: (16, 48),
            long_output: (96, 160),
            long_output_share: 0.3,
            pause_s: (0.5, 3.0),
            stagger_s: 6.0,
        }
    }
}

/// Sessions from a seed: the same seed gives the same trace.
pub fn generate(seed: u64, config: &GeneratorConfig) -> Vec<AgentCall> {
    let mut rng = StdRng::seed_from_u64(seed);
    let between = |(lo, hi): (usize, usize), rng: &mut StdRng| rng.random_range(lo..=hi);
    let mut calls = Vec::new();
    for s in 0..config.sessions {
        for c in 0..config.calls_per_session {
            let pause_s = if c == 0 {
                config.stagger_s * s as f64 / config.sessions.max(1) as f64
            } else {
                rng.random_range(config.pause_s.0..=config.pause_s.1)
            };
            // Milliseconds are plenty, and they survive a trip through JSON exactly.
            let pause_s = (pause_s * 1000.0).round() / 1000.0;
            let context_tokens = if c == 0 {
                config.shared_context + between(config.first_context, &mut rng)
            } else {
                between(config.growth, &mut rng)
            };
            let long = rng.random_bool(config.long_output_share.clamp(0.0, 1.0));
            let output = if long {
                config.long_output
            } else {
                config.short_output
            };
            calls.push(AgentCall {
                session: format!("agent-{s}"),
                pause_s,
                context_tokens,
                output_tokens: between(output, &mut rng),
                shared_tokens: if c == 0 { config.shared_context } else { 0 },
            });
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_round_trips_and_groups_by_session() {
        let config = GeneratorConfig::default();
        let calls = generate(7, &config);
        assert_eq!(calls.len(), config.sessions * config.calls_per_session);
        assert_eq!(parse(&to_jsonl(&calls)).unwrap(), calls);
        let sessions = sessions(&calls);
        assert_eq!(sessions.len(), config.sessions);
        assert!(sessions.iter().all(|s| s.len() == config.calls_per_session));
        assert_eq!(generate(7, &GeneratorConfig::default()), calls);
        assert_ne!(generate(8, &GeneratorConfig::default()), calls);
    }

    #[test]
    fn bad_lines_are_named() {
        let error = parse("{\"session\":\"a\",\"pause_s\":0,\"context_tokens\":5,\"output_tokens\":3}\nnot json\n")
            .unwrap_err();
        assert!(format!("{error:#}").contains("trace line 2"), "{error:#}");
        let error =
            parse("{\"session\":\"a\",\"pause_s\":-1,\"context_tokens\":5,\"output_tokens\":3}")
                .unwrap_err();
        assert!(format!("{error:#}").contains("pause_s"), "{error:#}");
        let error = parse(
            "{\"session\":\"a\",\"pause_s\":0,\"context_tokens\":5,\"output_tokens\":3,\"shared_tokens\":6}",
        )
        .unwrap_err();
        assert!(format!("{error:#}").contains("shared_tokens"), "{error:#}");
    }

    #[test]
    fn a_shared_context_opens_each_sessions_first_call() {
        let config = GeneratorConfig {
            shared_context: 1200,
            ..GeneratorConfig::default()
        };
        let calls = generate(7, &config);
        for session in sessions(&calls) {
            assert_eq!(session[0].shared_tokens, 1200);
            assert!(session[0].context_tokens > 1200 + config.first_context.0 - 1);
            assert!(session[1..].iter().all(|c| c.shared_tokens == 0));
        }
        // It survives the trip through JSON; without one, the line does not mention it.
        assert_eq!(parse(&to_jsonl(&calls)).unwrap(), calls);
        assert!(!to_jsonl(&generate(7, &GeneratorConfig::default())).contains("shared_tokens"));
    }
}
