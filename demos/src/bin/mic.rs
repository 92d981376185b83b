//! Talk to the agent through this machine's microphone and speaker, with a live view of
//! the call: the caller's and the agent's states, partial and final transcripts, the
//! agent's replies and each turn's stage latencies.
//!
//! ```text
//! mic [--input NAME] [--output NAME] [--full-duplex] [--seconds N] [--timeline TURNS.json] [--records DIR]
//! mic --list-devices
//! ```
//!
//! By default the microphone is muted while the agent speaks (half duplex), so that the
//! agent never hears itself through the speaker; with headphones, `--full-duplex` lets the
//! caller talk over the agent and interrupt it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use sublet_agent::{
    turn_table, CallObserver, Interruption, InterruptionOutcome, Playout, TurnRecord,
};
use sublet_audio::device::{device_names, open_microphone, open_speaker};
use sublet_demos::{AgentArgs, EngineArgs, Recorded, RecordsArgs, TimelineFile};
use sublet_turn_detect::TurnEvent;

#[derive(Parser, Debug)]
#[command(name = "mic")]
struct Args {
    /// The input device (default: the system's default).
    #[arg(long)]
    input: Option<String>,
    /// The output device (default: the system's default).
    #[arg(long)]
    output: Option<String>,
    /// List the devices and exit.
    #[arg(long)]
    list_devices: bool,
    /// Keep the microphone open while the agent speaks, so the caller can interrupt it
    /// (use headphones: the agent would hear itself through a loudspeaker).
    #[arg(long)]
    full_duplex: bool,
    /// Stop after this many seconds (default: at Ctrl-C).
    #[arg(long)]
    seconds: Option<f64>,
    /// Where to write each turn's transcript, reply and stage times as JSON.
    #[arg(long)]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    records: RecordsArgs,
}

/// How long the microphone stays muted after the agent stops (half duplex): its voice's
/// echo in the room.
const ECHO_TAIL: Duration = Duration::from_millis(300);

/// The live view: one line per event, with the call's clock.
struct Console {
    started: Instant,
}

impl Console {
    fn say(&self, what: &str) {
        eprintln!("[{:6.1}s] {what}", self.started.elapsed().as_secs_f64());
    }
}

impl CallObserver for Console {
    fn turn_event(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::SpeechStarted { .. } => self.say("you: speaking…"),
            TurnEvent::SpeechStopped {
                end_of_turn_score, ..
            } => self.say(&format!(
                "you: paused (end-of-turn score {end_of_turn_score:.2})"
            )),
            TurnEvent::EndOfTurn { .. } => self.say("agent: thinking…"),
        }
    }

    fn partial_transcript(&mut self, text: &str) {
        if !text.is_empty() {
            self.say(&format!("you (so far): {text}"));
        }
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        let [end_of_turn, transcript, token, sentence, audio] = turn.stage_latencies();
        self.say(&format!("you said: {}", turn.transcript));
        self.say(&format!("agent: {}", turn.reply));
        self.say(&format!(
            "turn {}: end of turn {end_of_turn:.2} s · transcript {transcript:.2} · first token \
             {token:.2} · first sentence {sentence:.2} · first audio {audio:.2} · voice to voice \
             {:.2} s",
            turn.index,
            turn.voice_to_voice_s()
        ));
    }

    fn interruption(&mut self, interruption: &Interruption) {
        let stopped_ms = (interruption.stopped_s - interruption.speech_s) * 1000.0;
        match &interruption.outcome {
            InterruptionOutcome::Resumed => self.say(&format!(
                "agent: paused {stopped_ms:.0} ms after you began, then went on (no words)"
            )),
            InterruptionOutcome::Cut { heard, .. } => self.say(&format!(
                "agent: stopped {stopped_ms:.0} ms after you began; you heard {heard:?}"
            )),
        }
    }
}

fn run(args: Args) -> Result<()> {
    if args.list_devices {
        let (inputs, outputs) = device_names()?;
        println!("inputs:\n  {}", inputs.join("\n  "));
        println!("outputs:\n  {}", outputs.join("\n  "));
        return Ok(());
    }
    let half_duplex = !args.full_duplex;
    let mut config = args.agent.config();
    // Half duplex: the agent cannot hear the caller over itself.
    config.interruptions.enabled &= args.full_duplex;
    config.partial_transcripts_s = Some(sublet_demos::PARTIAL_TRANSCRIPT_EVERY_S);
    let agent = args.engine.voice_agent_with(config)?;

    let mut playout = None;
    let speaker = open_speaker(args.output.as_deref(), |rate| {
        let queue = Playout::new(rate);
        playout = Some(queue.clone());
        move |out: &mut [f32]| {
            queue.pull(out);
        }
    })?;
    let playout = playout.context("the speaker was not opened")?;
    let (audio_tx, audio_in) = mpsc::channel::<Vec<f32>>();
    let stop = Arc::new(AtomicBool::new(false));
    let microphone = {
        let (playout, stop) = (playout.clone(), stop.clone());
        let mut audio_tx = Some(audio_tx);
        let mut agent_spoke_at: Option<Instant> = None;
        open_microphone(args.input.as_deref(), move |mut samples| {
            if stop.load(Ordering::Relaxed) {
                audio_tx = None; // the call ends
                return;
            }
            if playout.pending() {
                agent_spoke_at = Some(Instant::now());
            }
            if half_duplex && agent_spoke_at.is_some_and(|at| at.elapsed() < ECHO_TAIL) {
                samples.fill(0.0);
            }
            if let Some(tx) = &audio_tx {
                let _ = tx.send(samples);
            }
        })?
    };
    eprintln!(
        "mic: listening on {} ({} Hz), speaking on {} ({} Hz), {}; {}",
        microphone.name,
        microphone.rate,
        speaker.name,
        speaker.rate,
        if half_duplex {
            "half duplex (muted while the agent speaks)"
        } else {
            "full duplex (you can interrupt)"
        },
        match args.seconds {
            Some(s) => format!("for {s} s"),
            None => "Ctrl-C to stop".into(),
        }
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stopper = stop.clone();
    let seconds = args.seconds;
    std::thread::spawn(move || {
        runtime.block_on(async {
            let limit = async {
                match seconds {
                    Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = limit => {}
            }
        });
        stopper.store(true, Ordering::Relaxed);
    });
    let console = Console {
        started: Instant::now(),
    };
    // Kept current after every turn: an error or a kill loses none answered so far.
    let timeline = match &args.timeline {
        Some(path) => Some(TimelineFile::create(path, serde_json::Map::new())?),
        None => None,
    };
    let log = args.records.open(
        "mic",
        "microphone",
        &agent.cache.model_names(),
        serde_json::Map::new(),
    )?;
    eprintln!("mic: this call's record: {}", log.path().display());
    let mut recorded = Recorded::new(console, log, timeline);
    let turns = match agent.answer_live(audio_in, &playout, &mut recorded) {
        Ok(turns) => turns,
        Err(e) => return Err(recorded.failed(e)),
    };
    // Let the last reply finish playing.
    while playout.pending() {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(microphone);
    drop(speaker);
    println!("{}", turn_table(&turns));
    recorded.finish(serde_json::Map::from_iter([(
        "reason".to_string(),
        "the microphone was stopped".into(),
    )]))?;
    eprintln!("mic: {} turns", turns.len());
    Ok(())
}

fn main() -> ExitCode {
    sublet_demos::main("mic", || run(Args::parse()))
}
