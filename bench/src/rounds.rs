//! One round of the bench: recorded calls replayed in real time through the voice agent,
//! beside replayed coding-agent sessions on the same engine (through its agents' API),
//! with the engine's state sampled throughout.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use serde_json::Value;
use sublet_agent::{AgentConfig, CallObserver, Pacing, TurnRecord, VoiceAgent};
use sublet_models::ModelCache;

use crate::aiperf::AiPerf;
use crate::figures::{RoundRecord, Sample};
use crate::stats::{TurnWords, VoiceTurn};
use crate::{agents, trace};

/// What one round runs.
#[derive(Clone, Copy)]
pub struct RoundPlan<'a> {
    /// The voice agent each call copies (with a system prompt of the call's own); its
    /// engine is the one the agent sessions reach at `base_url`.
    pub agent: &'a VoiceAgent,
    /// The agents' OpenAI-compatible API, served on the agent's engine.
    pub base_url: &'a str,
    pub recordings: &'a [Recording],
    /// Callers at once.
    pub calls: usize,
    /// The coding-agent sessions replayed beside the calls (none: voice alone).
    pub sessions: &'a [trace::AgentCall],
    /// How long callers and agents keep starting calls.
    pub window: Duration,
    /// The round's condition, as the report names it.
    pub condition: &'static str,
    pub seed: Option<u64>,
    /// The round's number in the run (part of each call's system prompt).
    pub index: usize,
    /// Callers replay the recordings back to back until the window closes, not once.
    pub fill_window: bool,
    /// AIPerf drives the sessions instead of the bench's own replayer.
    pub aiperf: Option<&'a AiPerf>,
}

/// Calls start this far apart.
const CALL_STAGGER_S: f64 = 3.0;
/// The engine's state is sampled this often through every round.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// A progress line this often (in samples) while a round runs.
const PROGRESS_EVERY_SAMPLES: usize = 80;

/// Counts a call's answered turns, for the progress lines.
struct CountTurns<'a>(&'a AtomicUsize);

impl CallObserver for CountTurns<'_> {
    fn turn_answered(&mut self, _turn: &TurnRecord) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The agent for one call of a round, with [`call_system_prompt`].
fn call_agent(agent: &VoiceAgent, round: usize, caller: usize, repeat: usize) -> VoiceAgent {
    let config = AgentConfig {
        system_prompt: call_system_prompt(&agent.config.system_prompt, round, caller, repeat),
        ..agent.config.clone()
    };
    agent.with_config(config)
}

/// A call's system prompt: the agent's instructions, then the call's own number. Every
/// call shares the instructions, as the calls of one deployment do, so a call's first turn
/// finds them in the engine's prefix cache and computes only its own tail and words; the
/// number keeps a replayed recording from finding a whole earlier call's prompt there.
fn call_system_prompt(instructions: &str, round: usize, caller: usize, repeat: usize) -> String {
    format!("{instructions} This is call {round}.{caller}.{repeat}.")
}

/// Runs one round as `plan` says, to its end: the window, then the calls in progress.
pub fn run_round(plan: &RoundPlan) -> Result<RoundRecord> {
    let RoundPlan {
        agent,
        base_url,
        recordings,
        calls,
        sessions,
        window: limit,
        condition,
        seed,
        index: round,
        fill_window,
        aiperf,
    } = *plan;
    let engine = &*agent.engine;
    // AIPerf takes seconds to start: the round's clock starts with its first request.
    let aiperf = match aiperf {
        Some(aiperf) if !sessions.is_empty() => {
            Some(aiperf.start(base_url, sessions, limit, round, || {
                let state = engine.scheduler_state();
                state.running + state.waiting > 0
            })?)
        }
        _ => None,
    };
    if aiperf.is_none() {
        agents::warm_shared_context(base_url, sessions, round)
            .context("putting the agents' shared context in the prefix cache")?;
    }
    let round_start = Instant::now();
    let round_start_unix = SystemTime::now();
    let stop = AtomicBool::new(false);
    let calls_done = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let (turns, agent_calls) = std::thread::scope(|scope| -> Result<_> {
        scope.spawn(|| {
            while !calls_done.load(Ordering::Relaxed) {
                let state = engine.scheduler_state();
                let t_s = round_start.elapsed().as_secs_f64();
                samples.lock().unwrap().push(Sample {
                    t_s: (t_s * 1000.0).round() / 1000.0,
                    kv_used_tokens: state.kv_used_tokens,
                    kv_budget_tokens: state.kv_budget_tokens,
                    running: state.running,
                    waiting: state.waiting,
                    kv_preemptions: state.counters.kv_preemptions,
                    growth_preemptions: state.counters.growth_preemptions,
                    held_request_steps: state.counters.held_request_steps,
                    hold_releases: state.counters.hold_releases,
                    prefill_chunks: state.counters.prefill_chunks,
                    hints_seen: state.counters.hints_seen,
                    hints_superseded: state.counters.hints_superseded,
                    first_sentence_releases: state.counters.first_sentence_releases,
                    paced_steps: state.counters.paced_steps,
                    retained_turns: state.counters.retained_turns,
                    retained_hits: state.counters.retained_hits,
                    turn_prompt_tokens: state.counters.turn_prompt_tokens,
                    turn_cached_tokens: state.counters.turn_cached_tokens,
                    steps: state.counters.steps,
                    schedule_ns: state.schedule_ns,
                    cpu_ms: crate::process_cpu_ms(),
                    steal_ms: crate::host_steal_ms(),
                    prefill_tokens: state.counters.prefill_tokens,
                    decode_tokens: state.counters.decode_tokens,
                    call_prefill_tokens: state.counters.call_prefill_tokens,
                    call_decode_tokens: state.counters.call_decode_tokens,
                });
                let taken = samples.lock().unwrap().len();
                if taken % PROGRESS_EVERY_SAMPLES == 0 {
                    eprintln!(
                        "bench:   {t_s:.0} s: {} turns answered; engine: {} running, {} waiting, \
                         KV {}/{}",
                        answered.load(Ordering::Relaxed),
                        state.running,
                        state.waiting,
                        state.kv_used_tokens,
                        state.kv_budget_tokens
                    );
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        let stop = &stop;
        let replayer = (!sessions.is_empty()).then(|| {
            scope.spawn(move || match aiperf {
                Some(running) => running.finish(stop, round_start, round_start_unix),
                None => Ok(agents::replay(base_url, sessions, stop, round_start, round)),
            })
        });
        // Each caller replays one recording, or (`fill_window`) the recordings back to back
        // from its own until the window closes; agents and callers stop starting calls
        // when it closes, and the calls in progress run to their end.
        let window_ends = round_start + limit;
        let callers: Vec<_> = (0..calls)
            .map(|i| {
                let answered = &answered;
                scope.spawn(move || -> Result<Vec<VoiceTurn>> {
                    std::thread::sleep(Duration::from_secs_f64(i as f64 * CALL_STAGGER_S));
                    let mut turns = Vec::new();
                    for k in 0.. {
                        if k > 0 && (!fill_window || Instant::now() >= window_ends) {
                            break;
                        }
                        let recording = &recordings[(i + k) % recordings.len()];
                        let outcome = call_agent(agent, round, i, k)
                            .answer_recording(
                                &recording.audio,
                                Pacing::Realtime,
                                16_000,
                                &mut CountTurns(answered),
                            )?
                            .turns;
                        turns.extend(match_turns(
                            &format!("{}#{i}.{k}", recording.name),
                            &recording.utterance_ends,
                            &outcome,
                        ));
                    }
                    Ok(turns)
                })
            })
            .collect();
        // Every caller joined before any error is returned: the sampler and the agents
        // run until the flags below are set, and the scope waits for them.
        let mut outcomes = Vec::new();
        for caller in callers {
            while !caller.is_finished() {
                if Instant::now() >= window_ends {
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            outcomes.push(
                caller
                    .join()
                    .map_err(|_| anyhow::anyhow!("a call panicked"))
                    .and_then(|turns| turns),
            );
        }
        let failed = outcomes.iter().any(|o| o.is_err());
        if replayer.is_some() && !failed {
            while Instant::now() < window_ends {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        stop.store(true, Ordering::Relaxed);
        calls_done.store(true, Ordering::Relaxed);
        let agent_calls = match replayer {
            Some(r) => r
                .join()
                .map_err(|_| anyhow::anyhow!("the agents' driver panicked"))??,
            None => Vec::new(),
        };
        let mut turns = Vec::new();
        for outcome in outcomes {
            turns.extend(outcome?);
        }
        Ok((turns, agent_calls))
    })?;
    Ok(RoundRecord {
        condition: condition.to_owned(),
        seed,
        callers: calls,
        window_s: limit.as_secs_f64(),
        duration_s: round_start.elapsed().as_secs_f64(),
        turns,
        agent_calls,
        samples: samples.into_inner().unwrap(),
    })
}

/// A recorded call, read once for every round that replays it.
pub struct Recording {
    pub name: &'static str,
    pub audio: sublet_audio::Audio,
    /// Where each utterance ends, from the JSON beside the recording.
    pub utterance_ends: Vec<f64>,
}

impl Recording {
    pub fn load(cache: &ModelCache, name: &'static str) -> Result<Self> {
        let json = cache.call(&name.replace(".wav", ".json"))?;
        let spans: Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
        Ok(Self {
            name,
            audio: sublet_audio::read_wav(cache.call(name)?)?,
            utterance_ends: spans["utterances"]
                .as_array()
                .context("no utterances")?
                .iter()
                .filter_map(|u| u["end_s"].as_f64())
                .collect(),
        })
    }
}

/// Each utterance's turn: the first answered turn whose caller stop is near the
/// utterance's end; none (or one whose reply failed or came too late, its fallback said)
/// is a failed turn.
fn match_turns(call: &str, utterance_ends: &[f64], turns: &[TurnRecord]) -> Vec<VoiceTurn> {
    utterance_ends
        .iter()
        .enumerate()
        .map(|(utterance, end_s)| {
            let turn = turns
                .iter()
                .find(|t| (t.caller_stop_s - end_s).abs() < 1.0)
                .filter(|t| t.outcome.answered());
            VoiceTurn {
                call: call.to_owned(),
                utterance,
                voice_to_voice_s: turn.map(|t| t.voice_to_voice_s()),
                first_token_s: turn.map(|t| t.first_token_s - t.transcript_s),
                first_sentence_s: turn.map(|t| t.first_sentence_s - t.transcript_s),
                stages_s: turn.map(|t| t.stage_latencies()),
                words: turn.map(|t| TurnWords {
                    transcript: t.transcript.clone(),
                    reply: t.reply.clone(),
                    end_of_turn_score: t.end_of_turn_score,
                    preemptive: t.preemptive,
                    opening_ahead: t.opening_ahead,
                }),
                reply_gap_s: turn.map(|t| t.reply_gap_s),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::call_system_prompt;

    #[test]
    fn calls_share_the_instructions_and_not_the_rest() {
        let instructions = "Answer briefly.";
        let prompts = [
            call_system_prompt(instructions, 1, 0, 0),
            call_system_prompt(instructions, 1, 1, 0),
            call_system_prompt(instructions, 1, 0, 1),
            call_system_prompt(instructions, 2, 0, 0),
        ];
        for (i, prompt) in prompts.iter().enumerate() {
            assert!(prompt.starts_with(instructions), "{prompt}");
            for other in &prompts[i + 1..] {
                assert_ne!(prompt, other);
            }
        }
    }
}
