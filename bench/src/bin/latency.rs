//! The voice turn's latency as a caller feels it, voice alone: scripted test calls in
//! several voices played in real time through the whole pipeline, under the current
//! defaults and the old configuration (fixed 0.5 s / 3.0 s endpointing, no transcript cue,
//! no preemption) in the same run, side by side.
//!
//! ```text
//! latency [--json PATH] [--configs old,new] [--conditions clean,phone,noise15,echo,…] [--livekit]
//! ```
//!
//! `--conditions` plays every call in each condition (`sublet_bench::conditions`): `clean`
//! as recorded, `phone` (8 kHz μ-law, 300–3,400 Hz), `noiseN` (pink noise N dB below the
//! caller's speech), `voicesN` (another test voice N dB below the caller), `echoN` or `echo`
//! (the agent's own voice fed back into the call as it plays, N or 20 dB down, 150 ms late:
//! a speakerphone). Each configuration runs in each condition, a column `config@condition`;
//! "talked over by not the caller" counts the times the agent's reply was interrupted by
//! speech outside every scripted turn (its echo, a voice behind).
//!
//! With `--livekit` every call goes through a LiveKit room of the LiveKit test server,
//! LiveKit's official Node client as the caller: voice to voice is timed on the caller's
//! side as well (its end of a turn to the first reply audio it heard).
//!
//! A configuration is `old` or `new`, optionally with changes: `new+preemptive`,
//! `new-early` (no early transcript), `new+dynamic` (dynamic endpointing), `old+preemptive`,
//! `new+threshold=0.8` (Smart Turn's score that counts as sure), `new+unsure=1.5` (the wait
//! for plain words the model is unsure of, in seconds), `new+early_after=0.25` (the quiet,
//! in seconds, at which the early transcript starts), `new-gate` (the level gate, on by
//! default, off: every frame the VAD hears is the caller's), `new+gate_margin=9` (how far under the caller's
//! level, in dB, a frame is still theirs), `new+gate_down=24` (how far, in dB, a frame
//! held to be someone else's is turned down), `new-trim` (the process's free
//! memory not handed back every few seconds: `sublet_agent::allocator::set_trimming`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use serde_json::json;
use sublet_agent::{AgentConfig, CallObserver, Interruption, Pacing, TurnRecord, VoiceAgent};
use sublet_bench::conditions::Condition;
use sublet_bench::latency::{
    clock_offset_s, figures, heard_figures, on_script_clock, HeardCall, HeardFigures,
    LatencyFigures, PlayedCall, Spread, LATE_S,
};
use sublet_bench::room_calls::{play_in_room, API_KEY, API_SECRET};
use sublet_bench::test_callers;
use sublet_engine::{Engine, EngineConfig};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelArgs;
use sublet_turn_detect::{LevelGateConfig, TurnEvent};

#[derive(Parser, Debug)]
#[command(name = "latency")]
struct Args {
    /// Write every configuration's figures and turns here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The configurations to compare, in order (see the module docs).
    #[arg(long, value_delimiter = ',', default_value = "old,new")]
    configs: Vec<String>,
    /// Through a LiveKit room, the official client as the caller.
    #[arg(long)]
    livekit: bool,
    /// The conditions each call is heard in (see the module docs).
    #[arg(long, value_delimiter = ',', default_value = "clean", value_parser = Condition::parse)]
    conditions: Vec<Condition>,
    #[command(flatten)]
    models: ModelArgs,
}

/// One configuration's calls and figures.
struct ConfigRun {
    name: String,
    figures: LatencyFigures,
    calls: Vec<PlayedCall>,
    /// Through a room: what the caller heard.
    heard: Option<(HeardFigures, Vec<HeardCall>)>,
}

fn progress(line: impl AsRef<str>) {
    eprintln!("latency: {}", line.as_ref());
}

/// What a configuration's name stands for.
struct Config {
    agent: AgentConfig,
    /// The allocator's trimmer on (the default) or off.
    trim: bool,
}

/// The agent configuration a name stands for.
fn config(name: &str) -> Result<Config> {
    let mut trim = true;
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
            old.endpoint.level_gate = None;
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
            Some(("early_after", value)) => config.early_transcript_after_s = value.parse()?,
            Some(("gate_margin", value)) => gate(&mut config).margin_db = value.parse()?,
            Some(("gate_down", value)) => gate(&mut config).attenuation_db = value.parse()?,
            _ => match change {
                "preemptive" => config.preemptive_generation = on,
                "early" => config.early_transcript = on,
                "dynamic" => config.endpoint.dynamic = on,
                "gate" => config.endpoint.level_gate = on.then(Default::default),
                "trim" => trim = on,
                other => bail!("unknown change {other:?} in {name:?}"),
            },
        }
        rest = &rest[end..];
    }
    Ok(Config {
        agent: config,
        trim,
    })
}

/// The configuration's level gate, on, to change.
fn gate(config: &mut AgentConfig) -> &mut LevelGateConfig {
    config
        .endpoint
        .level_gate
        .get_or_insert_with(Default::default)
}

/// Keeps every end of turn the detector decided, and shows each answered turn.
struct Seen {
    ends_of_turn_s: Vec<f64>,
    interruptions_s: Vec<f64>,
}

impl CallObserver for Seen {
    fn turn_event(&mut self, event: &TurnEvent) {
        if let TurnEvent::EndOfTurn { decided_s, .. } = event {
            self.ends_of_turn_s.push(*decided_s);
        }
    }

    fn interruption(&mut self, interruption: &Interruption) {
        self.interruptions_s.push(interruption.speech_s);
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
    let configs: Vec<(String, Config)> = args
        .configs
        .iter()
        .map(|name| Ok((name.clone(), config(name)?)))
        .collect::<Result<_>>()?;
    let cache = sublet_agent::models::choose(&args.models)?;
    let calls = test_callers::ensure(&cache, &mut |line| progress(line))?;
    progress("loading the engine");
    let engine = Arc::new(Engine::load(&EngineConfig::from_cache(&cache)?)?);
    if args.livekit && args.conditions.iter().any(|c| c.echo().is_some()) {
        bail!("--livekit plays calls through the caller's own client: no echo condition there");
    }
    let room = match args.livekit {
        true => Some((
            TestServer::start(API_KEY, API_SECRET)?,
            tokio::runtime::Runtime::new()?,
        )),
        false => None,
    };
    let mut results: Vec<ConfigRun> = Vec::new();
    let runs = args.conditions.iter().flat_map(|condition| {
        configs
            .iter()
            .map(move |(name, config)| (*condition, name, config))
    });
    for (condition, name, config) in runs {
        let calls = test_callers::heard_in(condition, &calls)?;
        let name = match args.conditions.as_slice() {
            [Condition::Clean] => name.clone(),
            _ => format!("{name}@{}", condition.name()),
        };
        sublet_agent::allocator::set_trimming(config.trim);
        let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config.agent.clone());
        let mut played = Vec::new();
        let mut heard = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let audio = sublet_audio::read_wav(&call.wav)?;
            let how = if room.is_some() {
                "LiveKit room"
            } else {
                "real time"
            };
            progress(format!(
                "{name}: call {}/{} {} ({:.0} s, {how})",
                i + 1,
                calls.len(),
                call.name,
                audio.duration_s()
            ));
            let mut seen = Seen {
                ends_of_turn_s: Vec::new(),
                interruptions_s: Vec::new(),
            };
            let started = Instant::now();
            let turns = match &room {
                Some((server, runtime)) => {
                    let room_name = format!("latency-{}-{}", results.len(), i);
                    let in_room = play_in_room(
                        &agent,
                        server,
                        runtime.handle(),
                        &room_name,
                        call,
                        &mut seen,
                    )?;
                    heard.push(HeardCall {
                        script: call.turns.clone(),
                        onsets_s: in_room.onsets_s,
                    });
                    in_room.turns
                }
                None => {
                    agent
                        .answer_recording_with(
                            &audio,
                            Pacing::Realtime,
                            audio.rate,
                            condition.echo(),
                            &mut seen,
                        )?
                        .turns
                }
            };
            progress(format!(
                "{name}: {} answered in {:.0} s",
                call.name,
                started.elapsed().as_secs_f64()
            ));
            let offset_s = match room {
                Some(_) => clock_offset_s(&call.turns, &turns),
                None => 0.0,
            };
            let call = PlayedCall {
                call: call.name.clone(),
                script: call.turns.clone(),
                turns,
                ends_of_turn_s: seen.ends_of_turn_s,
                interruptions_s: seen.interruptions_s,
            };
            played.push(on_script_clock(call, offset_s));
        }
        results.push(ConfigRun {
            name,
            figures: figures(&played),
            heard: room.as_ref().map(|_| (heard_figures(&heard), heard)),
            calls: played,
        });
    }
    print_table(&results);
    if let Some(path) = &args.json {
        let configs: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|run| {
                let heard = run
                    .heard
                    .as_ref()
                    .map(|(figures, calls)| json!({ "figures": figures, "calls": calls }));
                let value = json!({ "figures": run.figures, "calls": run.calls, "heard": heard });
                (run.name.clone(), value)
            })
            .collect();
        let report = json!({ "late_s": LATE_S, "livekit": args.livekit, "configs": configs });
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        progress(format!("wrote {}", path.display()));
    }
    Ok(())
}

/// The calls as heard in `condition`, each written next to its clean recording (the
/// voices behind a caller are the next call's).
fn print_table(results: &[ConfigRun]) {
    let Some(first_run) = results.first() else {
        return;
    };
    let first = &first_run.figures;
    let through = match first_run.heard {
        Some(_) => "through a LiveKit room, the official client as the caller",
        None => "played in real time",
    };
    println!(
        "\n{} calls, {} scripted turns, {} mid-turn pauses; voice alone, {through}",
        first_run.calls.len(),
        first.scripted_turns,
        first.mid_turn_pauses
    );
    let spread = |s: Option<Spread>| match s {
        Some(s) => format!("{:.2} / {:.2}", s.p50, s.p95),
        None => "-".into(),
    };
    let names: String = results.iter().map(|r| format!("{:>18}", r.name)).collect();
    println!("{:<34}{names}", "");
    if first_run.heard.is_some() {
        let heard_row = |label: &str, cell: &dyn Fn(&HeardFigures) -> String| {
            let cells: String = results
                .iter()
                .map(|r| r.heard.as_ref().map_or("-".into(), |(h, _)| cell(h)))
                .map(|c| format!("{c:>18}"))
                .collect();
            println!("{label:<34}{cells}");
        };
        heard_row("caller's voice to voice p50 / p95", &|h| {
            spread(h.voice_to_voice)
        });
        heard_row(&format!("  late (over {LATE_S} s)"), &|h| {
            format!("{} of {}", h.late_turns, h.answered)
        });
        heard_row("  turns with no answer heard", &|h| {
            (h.scripted_turns - h.answered).to_string()
        });
        println!("by the agent's clock:");
    }
    let row = |label: &str, cell: &dyn Fn(&LatencyFigures) -> String| {
        let cells: String = results
            .iter()
            .map(|r| format!("{:>18}", cell(&r.figures)))
            .collect();
        println!("{label:<34}{cells}");
    };
    row("voice to voice p50 / p95, s", &|f| spread(f.voice_to_voice));
    for (i, (name, _)) in first.stages.iter().enumerate() {
        row(&format!("  {name}"), &|f| spread(f.stages[i].1));
    }
    row("transcripts' word error rate", &|f| {
        f.word_error_rate.map_or("-".into(), |w| format!("{w:.2}"))
    });
    row("false cut-offs", &|f| f.false_cut_offs.to_string());
    row(&format!("late turns (over {LATE_S} s)"), &|f| {
        format!("{} of {}", f.late_turns, f.answered)
    });
    row("turns not answered at their end", &|f| f.missed.to_string());
    row("talked over by not the caller", &|f| {
        f.self_interruptions.to_string()
    });
    row("turns taken outside the caller's", &|f| {
        f.extra_turns.to_string()
    });
    row("transcripts started before the stop", &|f| {
        f.transcript_ahead.to_string()
    });
    row("replies started at the stop", &|f| f.preemptive.to_string());
    row("  opening synthesized by the end", &|f| {
        f.opening_ahead.to_string()
    });
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
    // Calls run here, each on threads of its own.
    sublet_agent::allocator::for_long_running_process();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
