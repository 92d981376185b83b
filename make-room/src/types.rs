//! What the policy works on: its switches and limits, the requests it tracks, the plan of a
//! step, and the counters of what fired.

/// Each part of make-room, on or off.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Switches {
    pub priority: bool,
    pub kv_preemption: bool,
    pub budget_cap: bool,
    pub decode_hold: bool,
    pub turn_hint: bool,
    pub call_retention: bool,
}

impl Switches {
    pub fn all() -> Self {
        Self {
            priority: true,
            kv_preemption: true,
            budget_cap: true,
            decode_hold: true,
            turn_hint: true,
            call_retention: true,
        }
    }
}

impl std::str::FromStr for Switches {
    type Err = String;

    /// `all`, `none`, or a comma-separated list of switch names.
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "all" => return Ok(Self::all()),
            "none" | "" => return Ok(Self::default()),
            _ => {}
        }
        let mut switches = Self::default();
        for name in text.split(',').map(str::trim) {
            let switch = match name {
                "priority" => &mut switches.priority,
                "kv_preemption" => &mut switches.kv_preemption,
                "budget_cap" => &mut switches.budget_cap,
                "decode_hold" => &mut switches.decode_hold,
                "turn_hint" => &mut switches.turn_hint,
                "call_retention" => &mut switches.call_retention,
                other => {
                    return Err(format!(
                        "unknown make-room switch {other:?} (expected all, none, or a list of \
                         priority, kv_preemption, budget_cap, decode_hold, turn_hint, call_retention)"
                    ))
                }
            };
            *switch = true;
        }
        Ok(switches)
    }
}

/// The engine's limits and make-room's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    pub switches: Switches,
    /// Most sequences running at once.
    pub max_running: usize,
    /// KV cache room, in tokens.
    pub kv_budget_tokens: usize,
    /// Tokens in a block of the engine's KV cache (1: a cache per sequence, the CPU's; 32
    /// on a GPU's paged pool). A retained turn holds whole blocks, and is counted so.
    pub kv_block_tokens: usize,
    /// Most prompt plus decode tokens in one step (`None`: whole prompts, as stock).
    pub chunk_tokens: Option<usize>,
    /// The step's token budget while no voice turn is near (no request at
    /// `whole_prompt_priority` or more urgent, no turn hint held): fewer, larger prompt
    /// chunks, since on a CPU each pass has a fixed cost. `None`: always `chunk_tokens`.
    pub idle_chunk_tokens: Option<usize>,
    /// Prompts at this priority or a more urgent one are never split (a voice turn's is
    /// short, and on a CPU every extra pass costs a full read of the weights): such a
    /// prompt runs whole, in a step where no other prompt has taken tokens yet.
    pub whole_prompt_priority: Option<i32>,
    /// The budget cap's window T, in tokens (and its bound on consecutive held steps).
    pub window_tokens: usize,
    /// Most requests the KV preemption takes from in one step.
    pub max_preemptions: usize,
    /// How long a turn hint holds: it must last until the turn arrives, which on a CPU is
    /// ~0.5 s after the hint (the end of turn 0.1 s after it, then the transcript), more
    /// when the transcript is slow.
    pub hint_hold_ms: u64,
    /// End a turn's hold when its agent has the reply's first sentence
    /// ([`crate::Scheduler::first_sentence_out`]), not only at the window's end. On by
    /// default: the caller hears nothing sooner from a longer hold, and with four callers
    /// the hold ending there cut the agents' held request-steps by 44% (see
    /// `docs/benchmarking.md`, run 14).
    pub release_at_first_sentence: bool,
    /// With the budget cap on, while a call's reply decodes, the agents' prompt chunks go
    /// into one step of this many, the others being decodes only: the rest of a reply
    /// must keep ahead of its own speech, and beside four callers one token per agents'
    /// 64-token chunk left 7 of 60 replies with a silence between their sentences (run 46
    /// in `docs/benchmarking.md`). It only reorders the agents' work. 0 or 1: every step.
    pub reply_pace_steps: usize,
    /// Most tokens kept for finished call turns, and for how long.
    pub retain_tokens: usize,
    pub retain_ms: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            switches: Switches::default(),
            max_running: 16,
            kv_budget_tokens: 16_384,
            kv_block_tokens: 1,
            chunk_tokens: None,
            idle_chunk_tokens: None,
            whole_prompt_priority: None,
            window_tokens: 48,
            max_preemptions: 2,
            hint_hold_ms: 1_200,
            release_at_first_sentence: true,
            reply_pace_steps: 4,
            retain_tokens: 4_096,
            retain_ms: 30_000,
        }
    }
}

/// A request as the scheduler tracks it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Arrival order: first come, first served.
    pub id: u64,
    /// Lower is more urgent.
    pub priority: i32,
    /// The call a voice turn belongs to.
    pub call: Option<u64>,
    pub prompt_len: usize,
    pub max_new: usize,
    pub generated: usize,
    /// Tokens whose KV the request holds.
    pub computed: usize,
    /// Tokens its next admission can reload instead of recomputing (prefix cache).
    pub cached: usize,
    /// `cached` is exactly what the engine holds for it (a prefix-cache hit the engine
    /// found itself), so a retained call turn it takes over adds nothing to it.
    pub cached_exact: bool,
    pub running: bool,
    /// The call's agent has its first sentence: this turn holds nothing back any more.
    pub first_sentence_out: bool,
    pub(super) admission: u64,
    pub(super) held_steps: usize,
}

impl Request {
    pub fn new(
        id: u64,
        priority: i32,
        call: Option<u64>,
        prompt_len: usize,
        max_new: usize,
    ) -> Self {
        Self {
            id,
            priority,
            call,
            prompt_len,
            max_new: max_new.max(1),
            generated: 0,
            computed: 0,
            cached: 0,
            cached_exact: false,
            running: false,
            first_sentence_out: false,
            admission: 0,
            held_steps: 0,
        }
    }

    /// Tokens that must be in the KV before the next decode: the prompt and every
    /// generated token but the last.
    pub fn target(&self) -> usize {
        self.prompt_len + self.generated.saturating_sub(1)
    }

    pub fn prefilling(&self) -> bool {
        self.computed < self.target()
    }

    pub fn done(&self) -> bool {
        self.generated >= self.max_new
    }

    /// Prefilling, or not yet past its first `window` tokens nor its first sentence.
    pub(super) fn in_window(&self, window: usize) -> bool {
        !self.first_sentence_out && (self.prefilling() || self.generated < window)
    }

    /// KV its completion will hold at most.
    pub fn peak_kv(&self) -> usize {
        self.prompt_len + self.max_new - 1
    }
}

/// What one step does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub preempted: Vec<u64>,
    pub admitted: Vec<u64>,
    /// Prompt tokens computed per request this step.
    pub prefill: Vec<(u64, usize)>,
    pub decode: Vec<u64>,
    /// Running requests kept from progress by a hold.
    pub held: Vec<u64>,
}

impl Plan {
    /// Tokens the step computes.
    pub fn tokens(&self) -> usize {
        self.prefill.iter().map(|(_, n)| n).sum::<usize>() + self.decode.len()
    }
}

/// What fired, for `/metrics` and the probes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub steps: u64,
    pub prefill_chunks: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    /// Of those, the tokens computed for calls (turns and turn hints): what answering the
    /// callers takes of the engine, the rest being the agents'.
    pub call_prefill_tokens: u64,
    pub call_decode_tokens: u64,
    /// Preemptions to let a running request grow (the engine's own, with or without make-room).
    pub growth_preemptions: u64,
    /// Preemptions to admit a more urgent waiting request.
    pub kv_preemptions: u64,
    /// Preemptions to give a more urgent waiting request a place when `max_running`
    /// requests already run (with `kv_preemption` on).
    pub slot_preemptions: u64,
    /// Request-steps held back by the budget cap, the decode hold or a turn hint.
    pub held_request_steps: u64,
    /// Holds skipped because the request had waited `window_tokens` steps in a row.
    pub hold_releases: u64,
    pub hints_seen: u64,
    /// Hints withdrawn before they started, because their turn had arrived.
    pub hints_superseded: u64,
    /// Voice turns whose hold ended at their first sentence, before the window's end.
    pub first_sentence_releases: u64,
    /// Steps that left the agents' prompts out to pace a call's reply
    /// ([`PolicyConfig::reply_pace_steps`]).
    pub paced_steps: u64,
    pub retained_turns: u64,
    pub retained_hits: u64,
    /// Voice turns' prompt tokens at their arrival, and how many of them the engine's
    /// cache already held (a turn that finds its call's last turn computes only what
    /// the caller just said).
    pub turn_prompt_tokens: u64,
    pub turn_cached_tokens: u64,
    pub refused: u64,
}

/// A request the engine can never serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Its prompt and reply would need more KV than the whole budget.
    TooLong { needed: usize, budget: usize },
}

impl std::error::Error for Refused {}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLong { needed, budget } => {
                write!(
                    f,
                    "request needs {needed} tokens of KV, more than the {budget} the engine has"
                )
            }
        }
    }
}
