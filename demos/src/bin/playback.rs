//! Answers a recorded call end to end and shows what each turn took.
//!
//! ```text
//! playback CALL.wav --out REPLY.wav --timeline TURNS.json [--realtime | --fast] [--records DIR]
//! ```
//!
//! Each turn is on disk as it ends: appended to the call's record in the records
//! directory, and in the timeline file (rewritten whole).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use sublet_agent::{turn_table, Pacing, STAGE_NAMES};
use sublet_demos::{AgentArgs, EngineArgs, Progress, Recorded, RecordsArgs, TimelineFile};

/// Feed a recorded call (any WAV) through the voice pipeline and write the agent's replies.
#[derive(Parser, Debug)]
#[command(name = "playback")]
struct Args {
    /// The recorded call: a WAV file of any rate and channel count, 16-bit or float.
    call: PathBuf,
    /// Where to write the agent's audio, aligned to the call's timeline.
    #[arg(long, default_value = "reply.wav")]
    out: PathBuf,
    /// Where to write each turn's transcript, reply and stage times as JSON.
    #[arg(long, default_value = "turns.json")]
    timeline: PathBuf,
    /// Play the call in real time, as a live caller would (the default).
    #[arg(long, conflicts_with = "fast")]
    realtime: bool,
    /// Play the call as fast as possible; each turn is answered before the call goes on.
    #[arg(long)]
    fast: bool,
    /// Sample rate of the reply WAV (default: the call's own rate), 1,000 to 384,000 Hz.
    #[arg(long, value_parser = clap::value_parser!(u32).range(
        *sublet_audio::WAV_RATES.start() as i64..=*sublet_audio::WAV_RATES.end() as i64))]
    rate: Option<u32>,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    records: RecordsArgs,
}

fn run(args: Args) -> Result<()> {
    let call = sublet_audio::read_wav(&args.call)?;
    let pacing = if args.fast {
        Pacing::Fast
    } else {
        Pacing::Realtime
    };
    eprintln!(
        "playback: {} ({:.1} s at {} Hz), {}",
        args.call.display(),
        call.duration_s(),
        call.rate,
        if pacing == Pacing::Fast {
            "fast"
        } else {
            "real time"
        }
    );
    let loading = Instant::now();
    let agent = args.engine.voice_agent_with(args.agent.config())?;
    eprintln!(
        "playback: models loaded in {:.1} s",
        loading.elapsed().as_secs_f64()
    );

    let pacing_name = if pacing == Pacing::Fast {
        "fast"
    } else {
        "realtime"
    };
    let mut fields = serde_json::Map::from_iter([
        ("call".to_string(), args.call.display().to_string().into()),
        ("pacing".to_string(), pacing_name.into()),
    ]);
    // Kept current after every turn: an error or a kill loses none answered so far.
    let name = args.call.display().to_string();
    let models = agent.cache.model_names();
    fields.insert("models".into(), sublet_demos::models_json(&models));
    let log = args
        .records
        .open("playback", &name, &models, fields.clone())?;
    eprintln!("playback: this call's record: {}", log.path().display());
    let timeline = TimelineFile::create(&args.timeline, fields)?;
    let mut recorded = Recorded::new(Progress::default(), log, Some(timeline));
    let outcome = match agent.answer_recording(
        &call,
        pacing,
        args.rate.unwrap_or(call.rate),
        &mut recorded,
    ) {
        Ok(outcome) => outcome,
        Err(e) => return Err(recorded.failed(e)),
    };
    let mut reply = outcome.reply.audio;
    let call_len = (call.duration_s() * reply.rate as f64) as usize;
    if reply.samples.len() < call_len {
        reply.samples.resize(call_len, 0.0);
    }
    sublet_audio::write_wav(&args.out, &reply)?;

    let medians = sublet_agent::stage_medians(&outcome.turns).map(|(stages, v2v)| {
        let mut m: serde_json::Map<String, serde_json::Value> = STAGE_NAMES
            .iter()
            .zip(stages)
            .map(|(name, s)| (name.replace(' ', "_"), s.into()))
            .collect();
        m.insert("voice_to_voice".into(), v2v.into());
        m
    });
    recorded.finish(serde_json::Map::from_iter([
        ("reason".to_string(), "the recording ended".into()),
        (
            "median_stage_latency_s".to_string(),
            serde_json::to_value(medians)?,
        ),
    ]))?;

    println!("{}", turn_table(&outcome.turns));
    eprintln!(
        "playback: {} turns; reply audio in {}, timeline in {}",
        outcome.turns.len(),
        args.out.display(),
        args.timeline.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    sublet_demos::main("playback", || run(Args::parse()))
}
