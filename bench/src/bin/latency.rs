//! The voice turn's latency as a caller feels it, voice alone: scripted test calls in
//! several voices played in real time through the whole pipeline, under the current
//! defaults and the old configuration (fixed 0.5 s / 3.0 s endpointing, no transcript cue,
//! no preemption) in the same run, side by side.
//!
//! ```text
//! latency [--json PATH] [--configs old,new]
//! ```
//!
//! A configuration is `old` or `new`, optionally with changes: `new+preemptive`,
//! `new-early` (no early transcript), `new+dynamic` (dynamic endpointing), `old+preemptive`,
//! `new+threshold=0.8` (Smart Turn's score that counts as sure), `new+unsure=1.5` (the wait
//! for plain words the model is unsure of, in seconds).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use serde_json::json;
use sublet_agent::{AgentConfig, CallObserver, Pacing, TurnRecord, VoiceAgent};
use sublet_bench::latency::{figures, LatencyFigures, PlayedCall, Spread, LATE_S};
use sublet_bench::test_callers;
use sublet_engine::{Engine, EngineConfig};
use sublet_models::ModelCache;
use sublet_turn_detect::TurnEvent;

#[derive(Parser, Debug)]
#[command(name = "latency")]
struct Args {
    /// Write every configuration's figures and turns here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The configurations to compare, in order (see the module docs).
    #[arg(long, value_delimiter = ',', default_value = "old,new")]
    configs: Vec<String>,
}

fn progress(line: impl AsRef<str>) {
    eprintln!("latency: {}", line.as_ref());
}

/// The agent configuration a name stands for.
fn config(name: &str) -> Result<AgentConfig> {
    let base = &name[..name.find(['+', '-']).unwrap_or(name.len())];
    let mut config = match base {
        "new" => AgentConfig::default(),
        "old" => {
            let mut old = AgentConfig {
                early_transcript: false,
                preemptive_generation: false,
                ..AgentConfig::default()
            };
            old.endpoint.dynamic = false;
            old.endpoint.end_of_turn_threshold = 0.5;
            old.endpoint.min_delay_s = 0.5;
            old.endpoint.max_delay_s = 3.0;
            old
        }
        other => bail!("unknown configuration {other:?} (old or new)"),
    };
    // Each change is the text after a sign, up to the next sign.
    let mut rest = &name[base.len()..];
    while let Some(sign) = rest.chars().next() {
        let end = rest[1..].find(['+', '-']).map_or(rest.len(), |i| i + 1);
        let (change, on) = (&rest[1..end], sign == '+');
        match change.split_once('=') {
            Some(("threshold", value)) => config.endpoint.end_of_turn_threshold = value.parse()?,
            Some(("unsure", value)) => config.endpoint.unsure_words_delay_s = Some(value.parse()?),
            _ => match change {
                "preemptive" => config.preemptive_generation = on,
                "early" => config.early_transcript = on,
                "dynamic" => config.endpoint.dynamic = on,
                other => bail!("unknown change {other:?} in {name:?}"),
            },
        }
        rest = &rest[end..];
    }
    Ok(config)
}

/// Keeps every end of turn the detector decided, and shows each answered turn.
struct Seen {
    ends_of_turn_s: Vec<f64>,
}

impl CallObserver for Seen {
    fn turn_event(&mut self, event: &TurnEvent) {
        if let TurnEvent::EndOfTurn { decided_s, .. } = event {
            self.ends_of_turn_s.push(*decided_s);
        }
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        progress(format!(
            "  {:.2} s  {:?} → {:?}",
            turn.voice_to_voice_s(),
            turn.transcript,
            turn.reply
        ));
    }
}

fn run(args: Args) -> Result<()> {
    let configs: Vec<(String, AgentConfig)> = args
        .configs
        .iter()
        .map(|name| Ok((name.clone(), config(name)?)))
        .collect::<Result<_>>()?;
    let cache = ModelCache::from_env();
    let calls = test_callers::ensure(&cache, &mut |line| progress(line))?;
    progress("loading the engine");
    let engine = Arc::new(Engine::load(&EngineConfig::bundled(&cache)?)?);
    let mut results: Vec<(String, LatencyFigures, Vec<PlayedCall>)> = Vec::new();
    for (name, config) in configs {
        let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config);
        let mut played = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let audio = sublet_audio::read_wav(&call.wav)?;
            progress(format!(
                "{name}: call {}/{} {} ({:.0} s, real time)",
                i + 1,
                calls.len(),
                call.name,
                audio.duration_s()
            ));
            let mut seen = Seen {
                ends_of_turn_s: Vec::new(),
            };
            let started = Instant::now();
            let outcome =
                agent.answer_recording(&audio, Pacing::Realtime, audio.rate, &mut seen)?;
            progress(format!(
                "{name}: {} answered in {:.0} s",
                call.name,
                started.elapsed().as_secs_f64()
            ));
            played.push(PlayedCall {
                call: call.name.clone(),
                script: call.turns.clone(),
                turns: outcome.turns,
                ends_of_turn_s: seen.ends_of_turn_s,
            });
        }
        results.push((name, figures(&played), played));
    }
    print_table(&results);
    if let Some(path) = &args.json {
        let configs: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|(name, figures, calls)| {
                (name.clone(), json!({ "figures": figures, "calls": calls }))
            })
            .collect();
        let report = json!({ "late_s": LATE_S, "configs": configs });
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        progress(format!("wrote {}", path.display()));
    }
    Ok(())
}

fn print_table(results: &[(String, LatencyFigures, Vec<PlayedCall>)]) {
    let Some((_, first, _)) = results.first() else {
        return;
    };
    println!(
        "\n{} calls, {} scripted turns, {} mid-turn pauses; voice alone",
        results[0].2.len(),
        first.scripted_turns,
        first.mid_turn_pauses
    );
    let row = |label: &str, cell: &dyn Fn(&LatencyFigures) -> String| {
        let cells: String = results
            .iter()
            .map(|(_, f, _)| format!("{:>18}", cell(f)))
            .collect();
        println!("{label:<34}{cells}");
    };
    let names: String = results.iter().map(|(n, _, _)| format!("{n:>18}")).collect();
    println!("{:<34}{names}", "");
    let spread = |s: Option<Spread>| match s {
        Some(s) => format!("{:.2} / {:.2}", s.p50, s.p95),
        None => "-".into(),
    };
    row("voice to voice p50 / p95, s", &|f| spread(f.voice_to_voice));
    for (i, (name, _)) in first.stages.iter().enumerate() {
        row(&format!("  {name}"), &|f| spread(f.stages[i].1));
    }
    row("false cut-offs", &|f| f.false_cut_offs.to_string());
    row(&format!("late turns (over {LATE_S} s)"), &|f| {
        format!("{} of {}", f.late_turns, f.answered)
    });
    row("turns not answered at their end", &|f| f.missed.to_string());
    row("replies: median words", &|f| {
        format!("{:.0}", f.replies.median_words)
    });
    row("  looping (3 words, 3 times)", &|f| {
        f.replies.looping.to_string()
    });
    row("  repeated phrase (4 words, twice)", &|f| {
        f.replies.repeated_phrase.to_string()
    });
    row("  echoing the caller", &|f| f.replies.echoing.to_string());
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
