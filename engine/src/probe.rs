//! The make-room probes on the real engine, in one process and one run: a voice turn
//! alone, then the same turn (a) when agent requests hold the whole KV budget and (b) while
//! a long agent prefill is in flight, each with make-room's switches off and on.
//!
//! Each case checks from the scheduler's own state that its condition held when the turn
//! was sent, and fails otherwise: a probe that cannot fail proves nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::make_room::{PolicyConfig, Switches};
use crate::scheduler::SchedulerState;
use crate::{
    ChatRequest, Engine, EngineConfig, Message, ReplyStream, Role, StreamEvent, VOICE_PRIORITY,
};

/// Inter-token gaps reported per voice turn.
pub const GAPS: usize = 16;

#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub kv_budget_tokens: usize,
    pub chunk_tokens: usize,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            kv_budget_tokens: 1024,
            chunk_tokens: 16,
        }
    }
}

/// What one voice turn measured.
#[derive(Debug, Clone, Serialize)]
pub struct Turn {
    pub first_token_ms: f64,
    pub gaps_ms: Vec<f64>,
    pub median_gap_ms: f64,
    /// The text of the measured tokens (greedy, so the same whatever runs beside it).
    pub text: String,
    /// The agents' tokens from the turn's sending to its last measured token.
    pub agent_tokens: usize,
    /// The scheduler when the turn was sent, and when its first token arrived.
    pub at_arrival: SchedulerState,
    pub at_first_token: SchedulerState,
    pub after: SchedulerState,
}

impl Turn {
    /// Running agent requests still prefilling when the turn's first token arrived.
    pub fn agent_prefills_at_first_token(&self) -> usize {
        less_urgent(&self.at_first_token.prefilling_by_priority)
    }

    pub fn kv_preemptions(&self) -> u64 {
        self.after.counters.kv_preemptions - self.at_arrival.counters.kv_preemptions
    }
}

/// One case, off against on.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub off: Turn,
    pub on: Turn,
    pub first_token_ratio_off_on: f64,
    pub first_token_ratio_on_alone: f64,
    pub median_gap_ratio_on_alone: f64,
    pub meets_targets: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kv_budget_tokens: usize,
    pub chunk_tokens: usize,
    pub voice_prompt_tokens: usize,
    pub alone: Turn,
    pub kv_full: CaseReport,
    pub prefill_in_flight: CaseReport,
    /// The scheduler's own time per planned step on the real engine, off and on.
    pub scheduler_us_per_step_off: f64,
    pub scheduler_us_per_step_on: f64,
    pub meets_targets: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A caller's third turn, with the voice agent's kind of system prompt. Each is a new
/// call's, so that no call's retained KV makes room for it.
fn voice_request() -> ChatRequest {
    static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
    let conversation = [
        (Role::System, "You are a helpful voice assistant on a phone call. Answer in one or two short, plain spoken sentences."),
        (Role::User, "Hi, I would like to plan a trip to Lisbon in May."),
        (Role::Assistant, "Lovely choice! May is warm and sunny in Lisbon. How many days will you stay?"),
        (Role::User, "About five days. Tell me what I should see first, and why."),
    ];
    ChatRequest {
        priority: VOICE_PRIORITY,
        session: Some(NEXT_CALL.fetch_add(1, Ordering::Relaxed)),
        ..ChatRequest::new(
            conversation
                .iter()
                .map(|(role, text)| Message::new(*role, *text))
                .collect(),
            GAPS + 8,
        )
    }
}

/// Sends the voice turn and times its first `GAPS + 1` tokens.
fn voice_turn(engine: &Engine, agent_tokens: &AtomicUsize) -> Result<Turn> {
    let at_arrival = engine.scheduler_state();
    let agents_before = agent_tokens.load(Ordering::SeqCst);
    let sent = Instant::now();
    let mut stream = engine.chat(voice_request())?;
    let mut times = Vec::new();
    let mut text = String::new();
    let mut at_first_token = None;
    while times.len() <= GAPS {
        match stream.next_blocking() {
            Some(Ok(StreamEvent::Text(piece))) => {
                times.push(sent.elapsed());
                text.push_str(&piece);
                at_first_token.get_or_insert_with(|| engine.scheduler_state());
            }
            Some(Ok(StreamEvent::Done(_))) | None => break,
            Some(Ok(StreamEvent::ToolCalls(_))) => {} // the probe asks for no tools
            Some(Err(e)) => bail!("the voice turn failed: {e}"),
        }
    }
    let agent_tokens = agent_tokens.load(Ordering::SeqCst) - agents_before;
    drop(stream);
    let first_token = *times.first().context("the voice turn produced no token")?;
    let gaps_ms: Vec<f64> = times.windows(2).map(|w| ms(w[1] - w[0])).collect();
    Ok(Turn {
        first_token_ms: ms(first_token),
        median_gap_ms: median(&gaps_ms),
        gaps_ms,
        text,
        agent_tokens,
        at_arrival,
        at_first_token: at_first_token.expect("a first token"),
        after: engine.scheduler_state(),
    })
}

/// Agent requests streaming in the background, counting their tokens until stopped.
struct Agents {
    tokens: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Agents {
    fn start(engine: &Engine, requests: Vec<ChatRequest>) -> Result<Self> {
        let tokens = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for request in requests {
            let stream = engine.chat(request)?;
            let (tokens, stop) = (tokens.clone(), stop.clone());
            threads.push(std::thread::spawn(move || drain(stream, &tokens, &stop)));
        }
        Ok(Self {
            tokens,
            stop,
            threads,
        })
    }

    /// Stops every agent: dropping a stream cancels its request.
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

fn drain(mut stream: ReplyStream, tokens: &AtomicUsize, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match stream.next_blocking() {
            Some(Ok(StreamEvent::Text(_))) => {
                tokens.fetch_add(1, Ordering::SeqCst);
            }
            _ => return,
        }
    }
}

/// A coding agent's request of about `words` words.
/// Each starts differently, so that no agent finds another's prompt in the prefix cache.
fn agent_request(words: usize, max_tokens: usize) -> ChatRequest {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let filler = "Explain each step in detail, naming the data structures involved. ";
    let mut text = format!("Task {n}: explain how a compiler turns source code into a program. ");
    while text.split_whitespace().count() < words {
        text.push_str(filler);
    }
    ChatRequest::new(vec![Message::new(Role::User, text)], max_tokens)
}

/// Waits until `condition` holds in the scheduler's state, or fails after two minutes.
fn wait_for(
    engine: &Engine,
    what: &str,
    condition: impl Fn(&SchedulerState) -> bool,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let state = engine.scheduler_state();
        if condition(&state) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("{what} never held: {state:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until no request is in flight (cancelled ones leave at their next token), so
/// that new switches apply and nothing of one measurement runs beside the next.
pub fn wait_idle(engine: &Engine) -> Result<()> {
    wait_for(engine, "an idle engine", |s| {
        s.running == 0 && s.waiting == 0
    })
}

/// Requests less urgent than a voice turn, from counts per priority.
fn less_urgent(counts: &[(i32, usize)]) -> usize {
    counts
        .iter()
        .filter(|(p, _)| *p > VOICE_PRIORITY)
        .map(|(_, n)| n)
        .sum()
}

fn agents_running(state: &SchedulerState) -> usize {
    less_urgent(&state.running_by_priority)
}

fn agents_prefilling(state: &SchedulerState) -> usize {
    less_urgent(&state.prefilling_by_priority)
}

/// The probes' cases.
#[derive(Debug, Clone, Copy)]
pub enum Case {
    KvFull,
    PrefillInFlight,
}

impl Case {
    pub fn name(self) -> &'static str {
        match self {
            Case::KvFull => "kv_full",
            Case::PrefillInFlight => "prefill_in_flight",
        }
    }

    /// Starts the agents, waits until the case's condition holds, and runs the voice turn.
    /// Whether the case's condition holds in `state` for a voice prompt of `voice_prompt`
    /// tokens: less free KV than it needs, with agents running; or an agent prefilling.
    pub fn held(self, state: &SchedulerState, voice_prompt: usize) -> bool {
        match self {
            Case::KvFull => {
                agents_running(state) > 0
                    && state.kv_budget_tokens.saturating_sub(state.kv_used_tokens) < voice_prompt
            }
            Case::PrefillInFlight => agents_prefilling(state) > 0,
        }
    }

    /// `long_agent` is the KV-full agent's prompt, in words and in tokens.
    fn run(
        self,
        engine: &Engine,
        voice_prompt: usize,
        long_agent: (usize, usize),
        options: &ProbeOptions,
    ) -> Result<Turn> {
        let budget = options.kv_budget_tokens;
        let agents = match self {
            Case::KvFull => {
                // One long-context agent whose prompt and reply take the whole budget (so
                // no growth preemption frees room by itself): once its free KV is less than
                // the voice prompt, only its finishing or a preemption lets the turn in.
                let (words, prompt) = long_agent;
                let reply = budget.saturating_sub(prompt).max(1);
                let agents = Agents::start(engine, vec![agent_request(words, reply)])?;
                wait_for(engine, "KV full", |s| self.held(s, voice_prompt))?;
                agents
            }
            Case::PrefillInFlight => {
                let agents = Agents::start(engine, vec![agent_request(budget * 3 / 5, 8)])?;
                let before = engine.scheduler_state().counters.prefill_tokens;
                // The agent's prompt has begun and is not done.
                wait_for(engine, "an agent prefill in flight", |s| {
                    self.held(s, voice_prompt) && s.counters.prefill_tokens > before
                })?;
                agents
            }
        };
        let turn = voice_turn(engine, &agents.tokens);
        agents.stop();
        let turn = turn?;
        if !self.held(&turn.at_arrival, voice_prompt) {
            bail!(
                "{}: the condition did not hold when the turn was sent: {:?}",
                self.name(),
                turn.at_arrival
            );
        }
        wait_idle(engine)?;
        Ok(turn)
    }
}

/// Loads the engine with make-room's scheduler and runs every case; `progress` hears each
/// stage as it starts and ends.
pub fn run(
    engine_config: &EngineConfig,
    options: &ProbeOptions,
    mut progress: impl FnMut(&str),
) -> Result<Report> {
    let config = EngineConfig {
        make_room: Some(PolicyConfig {
            kv_budget_tokens: options.kv_budget_tokens,
            chunk_tokens: Some(options.chunk_tokens),
            whole_prompt_priority: Some(VOICE_PRIORITY),
            ..PolicyConfig::default()
        }),
        max_running: 8,
        ..engine_config.clone()
    };
    progress(&format!(
        "loading the engine (KV budget {} tokens, chunks of {} tokens)",
        options.kv_budget_tokens, options.chunk_tokens
    ));
    let engine = Engine::load(&config)?;
    let none = AtomicUsize::new(0);

    // The voice turn alone, three times; the median by first token.
    engine.set_make_room_switches(Switches::all());
    let mut alone = Vec::new();
    for _ in 0..3 {
        alone.push(voice_turn(&engine, &none)?);
        wait_idle(&engine)?;
    }
    let voice_prompt = engine.prompt_tokens(&voice_request().prompt)?;
    alone.sort_by(|a, b| a.first_token_ms.total_cmp(&b.first_token_ms));
    let alone = alone.swap_remove(1);
    progress(&format!(
        "alone: first token {:.0} ms, median gap {:.1} ms (prompt {voice_prompt} tokens)",
        alone.first_token_ms, alone.median_gap_ms
    ));

    // The KV-full agent's prompt leaves a little more room than the voice prompt needs.
    let target = options.kv_budget_tokens.saturating_sub(voice_prompt + 16);
    let sample_words = 200;
    let sample = engine.prompt_tokens(&agent_request(sample_words, 1).prompt)?;
    let words = target * sample_words / sample.max(1);
    let long_agent = (
        words,
        engine.prompt_tokens(&agent_request(words, 1).prompt)?,
    );
    if long_agent.1 + voice_prompt >= options.kv_budget_tokens {
        bail!("the KV budget is too small for the probe: {long_agent:?} tokens");
    }
    progress(&format!(
        "KV-full agent: {} prompt tokens of a {} budget",
        long_agent.1, options.kv_budget_tokens
    ));

    let mut cost = [(0u64, 0u64); 2];
    let mut cases = Vec::new();
    for case in [Case::KvFull, Case::PrefillInFlight] {
        let mut turns = Vec::new();
        for (i, (label, switches)) in [("off", Switches::default()), ("on", Switches::all())]
            .into_iter()
            .enumerate()
        {
            engine.set_make_room_switches(switches);
            progress(&format!("{}: make-room {label} …", case.name()));
            let before = engine.scheduler_state();
            let turn = case.run(&engine, voice_prompt, long_agent, options)?;
            let after = engine.scheduler_state();
            cost[i].0 += after.schedule_ns - before.schedule_ns;
            cost[i].1 += after.counters.steps - before.counters.steps;
            progress(&format!(
                "{}: make-room {label}: first token {:.0} ms, median gap {:.1} ms, agents made {} tokens meanwhile",
                case.name(),
                turn.first_token_ms,
                turn.median_gap_ms,
                turn.agent_tokens
            ));
            turns.push(turn);
        }
        let on = turns.pop().expect("on");
        let off = turns.pop().expect("off");
        let first_token_ratio_off_on = off.first_token_ms / on.first_token_ms;
        let first_token_ratio_on_alone = on.first_token_ms / alone.first_token_ms;
        let median_gap_ratio_on_alone = on.median_gap_ms / alone.median_gap_ms;
        cases.push(CaseReport {
            meets_targets: first_token_ratio_off_on >= 10.0
                && first_token_ratio_on_alone <= 1.5
                && median_gap_ratio_on_alone <= 1.5,
            off,
            on,
            first_token_ratio_off_on,
            first_token_ratio_on_alone,
            median_gap_ratio_on_alone,
        });
    }
    let prefill_in_flight = cases.pop().expect("two cases");
    let kv_full = cases.pop().expect("two cases");
    let per_step = |(ns, steps): (u64, u64)| ns as f64 / 1000.0 / steps.max(1) as f64;
    Ok(Report {
        kv_budget_tokens: options.kv_budget_tokens,
        chunk_tokens: options.chunk_tokens,
        voice_prompt_tokens: voice_prompt,
        meets_targets: kv_full.meets_targets && prefill_in_flight.meets_targets,
        alone,
        kv_full,
        prefill_in_flight,
        scheduler_us_per_step_off: per_step(cost[0]),
        scheduler_us_per_step_on: per_step(cost[1]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_condition_fails_when_absent() {
        let full = SchedulerState {
            kv_used_tokens: 1000,
            kv_budget_tokens: 1024,
            running_by_priority: vec![(1, 1)],
            prefilling_by_priority: vec![(1, 1)],
            ..SchedulerState::default()
        };
        assert!(Case::KvFull.held(&full, 96));
        assert!(Case::PrefillInFlight.held(&full, 96));
        // Room for the voice prompt; or only the voice turn itself running and prefilling.
        let roomy = SchedulerState {
            kv_used_tokens: 900,
            ..full.clone()
        };
        assert!(!Case::KvFull.held(&roomy, 96));
        let voice_only = SchedulerState {
            running_by_priority: vec![(VOICE_PRIORITY, 1)],
            prefilling_by_priority: vec![(VOICE_PRIORITY, 1)],
            ..full
        };
        assert!(!Case::KvFull.held(&voice_only, 96));
        assert!(!Case::PrefillInFlight.held(&voice_only, 96));
    }
}
