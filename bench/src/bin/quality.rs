//! What the agent hears and says: the quality calls (`sublet_bench::quality`) played
//! through the voice agent, each reply judged, on the bundled models and, beside them, on
//! the models given (`--llm`, `--stt`, `--voice`).
//!
//! ```text
//! quality [--llm GGUF] [--stt PATH] [--voice ONNX] [--json PATH] [--markdown PATH]
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Parser;
use serde_json::json;
use sublet_agent::persona::Persona;
use sublet_agent::{AgentConfig, Pacing, Quiet, VoiceAgent};
use sublet_bench::quality::{
    score_turn, summarize, table, Exchange, QualitySummary, TurnScore, CALLS, VERSION,
};
use sublet_bench::test_callers::{ensure_calls, Script};
use sublet_engine::{Engine, EngineConfig};
use sublet_models::{ModelArgs, ModelCache};

#[derive(Parser, Debug)]
#[command(name = "quality")]
struct Args {
    /// Where every turn and the figures go, as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Where the table and each reply go, as Markdown.
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
    /// Only the models given, not the bundled ones beside them.
    #[arg(long)]
    given_only: bool,
    /// Who the agent is (a persona TOML, as the demos take): to compare instructions.
    #[arg(long)]
    persona: Option<std::path::PathBuf>,
    #[command(flatten)]
    models: ModelArgs,
}

fn progress(line: impl AsRef<str>) {
    eprintln!("quality: {}", line.as_ref());
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quality: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let given = sublet_agent::models::choose(&args.models)?;
    let bundled = ModelCache::from_env();
    let scripts: Vec<&Script> = CALLS.iter().map(|c| &c.script).collect();
    let calls = ensure_calls(&bundled, "quality", VERSION, &scripts, &mut |l| progress(l))?;
    let mut sets: Vec<ModelCache> = Vec::new();
    let any_given = args.models != ModelArgs::default();
    if !(args.given_only && any_given) {
        sets.push(bundled);
    }
    if any_given {
        sets.push(given);
    }
    let mut summaries: Vec<QualitySummary> = Vec::new();
    let mut all: Vec<(String, Vec<TurnScore>)> = Vec::new();
    for cache in sets {
        let names = cache.model_names();
        let label = format!("{} + {} + {}", names.llm, names.stt, names.voice);
        progress(format!("loading {label}"));
        let engine = Arc::new(Engine::load(&EngineConfig::from_cache(&cache)?)?);
        let config = match &args.persona {
            Some(path) => Persona::load(path)?.apply(AgentConfig::default()),
            None => AgentConfig::default(),
        };
        let agent = VoiceAgent::with_engine(cache.clone(), engine, config);
        let mut scores = Vec::new();
        for (call, quality) in calls.iter().zip(CALLS) {
            let audio = sublet_audio::read_wav(&call.wav)?;
            let outcome = agent.answer_recording(&audio, Pacing::Fast, audio.rate, &mut Quiet)?;
            for (i, (scripted, expect)) in call.turns.iter().zip(quality.expect).enumerate() {
                // The agent's turns that ended inside this scripted turn's span (a turn cut
                // in two is both its parts).
                let next_start = call.turns.get(i + 1).map_or(f64::MAX, |t| t.start_s);
                let ours: Vec<_> = outcome
                    .turns
                    .iter()
                    .filter(|t| t.caller_stop_s >= scripted.start_s && t.caller_stop_s < next_start)
                    .collect();
                let heard = ours
                    .iter()
                    .map(|t| t.transcript.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                let reply = ours
                    .iter()
                    .map(|t| t.reply.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                let score = score_turn(
                    &call.name,
                    i + 1,
                    expect,
                    Exchange {
                        said: &scripted.text,
                        heard: &heard,
                        reply: &reply,
                        wer: sublet_stt::word_error_rate(&scripted.text, &heard),
                        voice_to_voice_s: ours.last().map(|t| t.voice_to_voice_s()),
                        failed: ours.is_empty() || ours.iter().any(|t| !t.outcome.answered()),
                    },
                );
                progress(format!(
                    "{} turn {}: heard {:?}; replied {:?} ({}/{} kept{})",
                    call.name,
                    i + 1,
                    score.heard,
                    score.reply,
                    score.kept,
                    score.expected,
                    match score.forbidden.is_empty() {
                        true => String::new(),
                        false => format!(", said {:?}", score.forbidden),
                    }
                ));
                scores.push(score);
            }
        }
        summaries.push(summarize(&label, &scores));
        all.push((label, scores));
    }
    let markdown = report(&summaries, &all);
    println!("{}", table(&summaries));
    if let Some(path) = &args.markdown {
        std::fs::write(path, &markdown)?;
    }
    if let Some(path) = &args.json {
        let value = json!({
            "summaries": summaries,
            "turns": all.iter().map(|(label, s)| json!({"models": label, "turns": s})).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")?;
    }
    Ok(())
}

/// The table, then every turn: what was said, heard and replied.
fn report(summaries: &[QualitySummary], all: &[(String, Vec<TurnScore>)]) -> String {
    let mut out = table(summaries);
    for (label, scores) in all {
        out.push_str(&format!("\n### {label}\n\n| call | turn | heard | reply | kept | forbidden |\n|---|---|---|---|---|---|\n"));
        for s in scores {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {}/{} | {} |\n",
                s.call,
                s.turn,
                s.heard.replace('|', "/"),
                s.reply.replace('|', "/").replace('\n', " "),
                s.kept,
                s.expected,
                s.forbidden.join(", ")
            ));
        }
    }
    out
}
