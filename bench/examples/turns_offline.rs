//! The turn detector alone on the latency bench's test calls, as fast as it runs (no agent,
//! no real time): its ends of turn against each script per condition and level-gate
//! setting, in seconds rather than `latency`'s minutes, for tuning the gate before a
//! `latency` run confirms it with the whole pipeline.
//!
//! ```text
//! turns_offline [--conditions clean,voices8] [--gates off,9,12/0.3/0]
//! ```
//!
//! A gate is `off` or `MARGIN[/HOLD[/DOWN[/RISE[/FALL[/ENV_RISE[/ENV_FALL[/STRONG[/HIGH_PASS[/SILENCE[/ONSET[/PAUSE]]]]]]]]]]]`: dB under
//! the caller's level, seconds held after their speech, dB a dropped frame is turned down,
//! the caller's level's and the envelope's time constants, dB under the caller's level of a
//! frame that holds the gate open, the frequency under which power is not counted, dB
//! above the room's floor of a frame that is silence, seconds a sound after the caller's
//! pause of theirs is held theirs, and the longest such pause (`LevelGateConfig`'s defaults
//! where left out).

use anyhow::Result;
use clap::Parser;
use sublet_bench::conditions::Condition;
use sublet_bench::latency::DetectedTurns;
use sublet_bench::test_callers;
use sublet_models::ModelArgs;
use sublet_turn_detect::{EndpointConfig, LevelGateConfig, TurnDetector, TurnEvent};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "clean,voices8", value_parser = Condition::parse)]
    conditions: Vec<Condition>,
    /// The gates to try (see the module docs).
    #[arg(long, value_delimiter = ',', default_value = "off,9")]
    gates: Vec<String>,
    #[command(flatten)]
    models: ModelArgs,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cache = sublet_agent::models::choose(&args.models)?;
    let calls = test_callers::ensure(&cache, &mut |line| eprintln!("{line}"))?;
    println!("| condition | gate | at their end | missed | cut-offs | extra |");
    println!("|---|---|---:|---:|---:|---:|");
    for condition in &args.conditions {
        let heard = test_callers::heard_in(*condition, &calls)?;
        for gate in &args.gates {
            let level_gate = match gate.as_str() {
                "off" => None,
                settings => {
                    let mut config = LevelGateConfig::default();
                    let mut values = settings.split('/');
                    for field in [
                        &mut config.margin_db,
                        &mut config.hold_s,
                        &mut config.attenuation_db,
                        &mut config.rise_s,
                        &mut config.fall_s,
                        &mut config.envelope_rise_s,
                        &mut config.envelope_fall_s,
                        &mut config.strong_db,
                        &mut config.high_pass_hz,
                        &mut config.silence_db,
                        &mut config.onset_s,
                        &mut config.pause_s,
                    ] {
                        if let Some(value) = values.next() {
                            *field = value.parse()?;
                        }
                    }
                    Some(config)
                }
            };
            let config = EndpointConfig {
                level_gate,
                ..EndpointConfig::default()
            };
            let mut detector = TurnDetector::load(&cache, config.clone())?;
            let mut total = DetectedTurns::default();
            for call in &heard {
                detector.reset(config.clone());
                let audio = sublet_audio::read_wav(&call.wav)?;
                let tail = vec![0.0; 4 * audio.rate as usize];
                let mut ends = Vec::new();
                for chunk in audio.samples.chunks(320).chain(tail.chunks(320)) {
                    for event in detector.push(chunk)? {
                        if let TurnEvent::EndOfTurn {
                            speech_end_s,
                            decided_s,
                            ..
                        } = event
                        {
                            ends.push((speech_end_s, decided_s));
                        }
                    }
                }
                let detected = DetectedTurns::of(&call.turns, &ends);
                if std::env::var_os("VERBOSE").is_some() && detected.missed + detected.extra > 0 {
                    let script: Vec<_> = call.turns.iter().map(|t| (t.start_s, t.end_s)).collect();
                    eprintln!("{} {gate}: script {script:.2?}, ends {ends:.2?}", call.name);
                }
                total = total.and(detected);
            }
            println!(
                "| {} | {gate} | {} | {} | {} | {} |",
                condition.name(),
                total.at_end,
                total.missed,
                total.cut_offs,
                total.extra
            );
        }
    }
    Ok(())
}
