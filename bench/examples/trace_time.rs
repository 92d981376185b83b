//! Where the engine's time went, from a scheduler trace (`SUBLET_SCHEDULER_TRACE=FILE`):
//! the passes between two times, by kind (a call's or an agents', prompt chunk or decode,
//! or a mixed pass of both; the agents' prompt chunks by length, since on a CPU each pass
//! has a fixed cost), with their tokens and milliseconds per token.
//!
//! ```text
//! cargo run --release -p sublet-bench --example trace_time -- TRACE [FROM_S TO_S]
//! ```
//!
//! A pass lasts from its line to the next pass or plan: the engine takes its next work
//! only when a pass is over. Times are the trace's, seconds since the scheduler started
//! (the bench's log says when each round began).

use std::collections::{BTreeMap, HashSet};

use sublet_engine::VOICE_PRIORITY;

/// The numbers in `text`, in order.
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The text after `key` up to the next `]` (a bracketed list in a trace line).
fn list<'a>(body: &'a str, key: &str) -> &'a str {
    body.split_once(key)
        .and_then(|(_, rest)| rest.split_once(']'))
        .map_or("", |(list, _)| list)
}

#[derive(Default)]
struct Tally {
    ms: u64,
    tokens: u64,
    passes: u64,
}

/// A prompt pass's kind (a call's, or the agents' by chunk length) and its tokens, from
/// its `ids: [..]` and `len: ..`.
fn prompt_kind(body: &str, calls: &HashSet<u64>) -> (String, u64) {
    let ids = numbers(list(body, "ids: ["));
    let len = body
        .split_once("len: ")
        .map_or(0, |(_, n)| numbers(n).first().copied().unwrap_or(0));
    let tokens = len * ids.len() as u64;
    if ids.iter().all(|id| calls.contains(id)) {
        return ("call prompt".to_owned(), tokens);
    }
    let size = match len {
        0..=16 => "1-16",
        17..=32 => "17-32",
        _ => "33+",
    };
    (format!("agents' prompt, {size}-token chunks"), tokens)
}

/// A decode pass's kind (whose sequences it decodes) and its tokens.
fn decode_kind(ids: &[u64], calls: &HashSet<u64>) -> (String, u64) {
    let of_calls = ids.iter().filter(|id| calls.contains(id)).count();
    let kind = match (of_calls, ids.len() - of_calls) {
        (_, 0) => "call decode",
        (0, _) => "agents' decode",
        _ => "call and agents' decode",
    };
    (kind.to_owned(), ids.len() as u64)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        anyhow::bail!("usage: trace_time TRACE [FROM_S TO_S]");
    };
    let from_ms = args.get(1).map_or(Ok(0.0), |s| s.parse::<f64>())? * 1000.0;
    let to_ms = args
        .get(2)
        .map_or(Ok(f64::MAX / 2.0), |s| s.parse::<f64>())?
        * 1000.0;
    let text = std::fs::read_to_string(path)?;

    let mut calls: HashSet<u64> = HashSet::new();
    // (start ms, kind, tokens) of each pass, and the times of the lines that end one.
    let mut passes: Vec<(u64, String, u64)> = Vec::new();
    let mut ends: Vec<u64> = Vec::new();
    for line in text.lines() {
        let Some((at, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(at) = at.parse::<u64>() else { continue };
        let (event, body) = rest.split_once(' ').unwrap_or((rest, ""));
        match event {
            "add" => {
                let field = |key: &str| {
                    body.split_whitespace()
                        .find_map(|f| f.strip_prefix(key))
                        .and_then(|v| v.parse::<i64>().ok())
                };
                if let (Some(id), Some(priority)) = (field("id="), field("priority=")) {
                    if priority <= i64::from(VOICE_PRIORITY) {
                        calls.insert(id as u64);
                    }
                }
            }
            "plan" => ends.push(at),
            "pass" => {
                ends.push(at);
                let kind = if let Some(prefill) = body.strip_prefix("Prefill") {
                    prompt_kind(prefill, &calls)
                } else if let Some(mixed) = body.strip_prefix("Mixed") {
                    // `Mixed { decode: [..], ids: [..], start: .., len: .. }`
                    let (prompt, prompt_tokens) = prompt_kind(mixed, &calls);
                    let (decode, decodes) = decode_kind(&numbers(list(mixed, "decode: [")), &calls);
                    (
                        format!("mixed: {prompt} + {decode}"),
                        prompt_tokens + decodes,
                    )
                } else {
                    decode_kind(&numbers(body), &calls)
                };
                passes.push((at, kind.0, kind.1));
            }
            _ => {}
        }
    }

    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let (mut first, mut last) = (u64::MAX, 0);
    for (start, kind, tokens) in passes {
        if (start as f64) < from_ms || (start as f64) >= to_ms {
            continue;
        }
        // The lines are in time order, so the ends are sorted.
        let Some(&end) = ends.get(ends.partition_point(|&e| e <= start)) else {
            continue;
        };
        first = first.min(start);
        last = last.max(end);
        let tally = tallies.entry(kind).or_default();
        tally.ms += end - start;
        tally.tokens += tokens;
        tally.passes += 1;
    }
    if tallies.is_empty() {
        anyhow::bail!("no passes in that stretch");
    }
    let busy: u64 = tallies.values().map(|t| t.ms).sum();
    println!(
        "passes from {:.1} s to {:.1} s: busy {:.1} s of {:.1} s",
        first as f64 / 1000.0,
        last as f64 / 1000.0,
        busy as f64 / 1000.0,
        (last - first) as f64 / 1000.0
    );
    println!(
        "{:<36} {:>8} {:>8} {:>8} {:>9}",
        "pass", "passes", "s", "tokens", "ms/token"
    );
    for (kind, t) in &tallies {
        println!(
            "{:<36} {:>8} {:>8.1} {:>8} {:>9.2}",
            kind,
            t.passes,
            t.ms as f64 / 1000.0,
            t.tokens,
            t.ms as f64 / t.tokens.max(1) as f64
        );
    }
    Ok(())
}
