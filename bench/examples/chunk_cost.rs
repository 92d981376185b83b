//! What a short prompt chunk costs at a long context, against a decode step there: the
//! time to first token of a request whose context the prefix cache holds, so that only its
//! new tokens are computed (an agent's next turn, or a chunk of its prompt). Prints two
//! greedy answers first, to compare before and after a change to the attention path.
//!
//! ```text
//! cargo run --release -p sublet-bench --example chunk_cost -- [NOTE_REPEATS]
//! ```
//!
//! `NOTE_REPEATS` (14) sizes the context (~760 tokens; 28: ~1,500). `WORDS` (`1,12,40`)
//! lists the new turns' lengths in words, `ROUNDS` (6) the requests of each length.

use std::time::Instant;

use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{ChatRequest, Engine, EngineConfig, Message, Prompt, Role, StreamEvent};
use sublet_models::ModelCache;

const NOTES: &str = "The harbour town keeps a ledger of every ship that docks: its name, \
    its cargo, the day it arrived and the day it left. Fishing boats come and go each \
    morning, while the larger traders stay for a week to unload grain, timber and cloth. ";

/// A reply's text, its time to first token and the gaps between its later tokens, in s.
fn reply(engine: &Engine, request: ChatRequest) -> anyhow::Result<(String, f64, Vec<f64>)> {
    let sent = Instant::now();
    let mut stream = engine.chat(request)?;
    let (mut text, mut first, mut gaps, mut last) = (String::new(), None, Vec::new(), sent);
    while let Some(event) = stream.next_blocking() {
        match event? {
            StreamEvent::Text(piece) => {
                let now = Instant::now();
                match first {
                    None => first = Some((now - sent).as_secs_f64()),
                    Some(_) => gaps.push((now - last).as_secs_f64()),
                }
                last = now;
                text.push_str(&piece);
            }
            StreamEvent::Done(_) => break,
            StreamEvent::ToolCalls(_) => {}
        }
    }
    Ok((text, first.unwrap_or(f64::NAN), gaps))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let repeats: usize = std::env::args().nth(1).map_or(Ok(14), |a| a.parse())?;
    let rounds = env_or("ROUNDS", 6usize).max(1);
    let words: Vec<usize> = std::env::var("WORDS")
        .unwrap_or_else(|_| "1,12,40".into())
        .split(',')
        .map(|w| w.trim().parse())
        .collect::<Result<_, _>>()?;
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            switches: Switches::all(),
            ..PolicyConfig::default()
        }),
        ..EngineConfig::from_cache(&cache)?
    })?;
    let context = vec![
        Message::new(Role::System, "You are a helpful assistant."),
        Message::new(Role::User, NOTES.repeat(repeats)),
    ];
    let tokens = |m: &[Message]| engine.prompt_tokens(&Prompt::Chat(m.to_vec()));
    let context_tokens = tokens(&context)?;
    let (_, cold, _) = reply(&engine, ChatRequest::new(context.clone(), 1))?;
    println!(
        "context: {context_tokens} tokens, prefilled in {:.0} ms",
        cold * 1e3
    );
    let (_, _, gaps) = reply(&engine, ChatRequest::new(context.clone(), 40))?;
    println!(
        "decode step at that context: {:.1} ms (median gap)",
        median(gaps) * 1e3
    );
    let next_turn = |text: String| {
        let mut m = context.clone();
        m.push(Message::new(Role::Assistant, "Noted."));
        m.push(Message::new(Role::User, text));
        m
    };
    for question in [
        "Which ships stay for a week?",
        "What does the ledger record?",
    ] {
        let request = ChatRequest {
            temperature: Some(0.0),
            ..ChatRequest::new(next_turn(question.into()), 30)
        };
        println!("answer to {question:?}: {:?}", reply(&engine, request)?.0);
    }
    for n in words {
        let mut times = Vec::new();
        let mut new_tokens = 0;
        for round in 0..rounds {
            // A new first word each round: the prefix cache serves the context, not the turn.
            let text: Vec<String> = (0..n)
                .map(|i| format!("w{}", (round * 7 + i) % 10))
                .collect();
            let messages = next_turn(format!("{round} {}", text.join(" ")));
            new_tokens = tokens(&messages)? - context_tokens;
            times.push(reply(&engine, ChatRequest::new(messages, 1))?.1 * 1e3);
        }
        let all: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
        println!(
            "{new_tokens} new tokens: first token after {:.1} ms (median; all {})",
            median(times.clone()),
            all.join(", ")
        );
    }
    Ok(())
}
