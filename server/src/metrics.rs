//! What the server has served, in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::api::Api;
use sublet_engine::memory::EngineMemory;
use sublet_engine::scheduler::SchedulerState;

#[derive(Debug, Default, Clone, Copy)]
struct PerPriority {
    started: u64,
    finished: u64,
    failed: u64,
    cancelled: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Counters kept by the server.
#[derive(Debug, Default)]
pub struct Metrics {
    next_id: AtomicU64,
    /// By the API a request came through and its priority.
    by_priority: Mutex<BTreeMap<(Api, i32), PerPriority>>,
    refused: Mutex<BTreeMap<u16, u64>>,
}

impl Metrics {
    fn with<R>(&self, api: Api, priority: i32, f: impl FnOnce(&mut PerPriority) -> R) -> R {
        let mut map = self.by_priority.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry((api, priority)).or_default())
    }

    /// A request was admitted; returns its number.
    pub fn started(&self, api: Api, priority: i32) -> u64 {
        self.with(api, priority, |p| p.started += 1);
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn finished(
        &self,
        api: Api,
        priority: i32,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) {
        self.with(api, priority, |p| {
            p.finished += 1;
            p.prompt_tokens += prompt_tokens as u64;
            p.completion_tokens += completion_tokens as u64;
        });
    }

    pub fn failed(&self, api: Api, priority: i32) {
        self.with(api, priority, |p| p.failed += 1);
    }

    /// The client went away before the request ended (it is cancelled in the engine).
    pub fn cancelled(&self, api: Api, priority: i32) {
        self.with(api, priority, |p| p.cancelled += 1);
    }

    /// A request refused before it reached the engine, by HTTP status.
    pub fn refused(&self, status: u16) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    pub fn render(&self) -> String {
        let map = self
            .by_priority
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = String::new();
        type Value = fn(&PerPriority) -> u64;
        let families: [(&str, &str, &str, Value); 7] = [
            (
                "sublet_requests_started_total",
                "Completion requests (of any API) admitted to the engine.",
                "counter",
                |p| p.started,
            ),
            (
                "sublet_requests_finished_total",
                "Completion requests (of any API) answered to the end.",
                "counter",
                |p| p.finished,
            ),
            (
                "sublet_requests_failed_total",
                "Completion requests (of any API) that failed in the engine.",
                "counter",
                |p| p.failed,
            ),
            (
                "sublet_requests_cancelled_total",
                "Completion requests (of any API) whose client went away before they ended.",
                "counter",
                |p| p.cancelled,
            ),
            (
                "sublet_requests_in_flight",
                "Completion requests (of any API) admitted and not yet ended.",
                "gauge",
                |p| {
                    p.started
                        .saturating_sub(p.finished + p.failed + p.cancelled)
                },
            ),
            (
                "sublet_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                "counter",
                |p| p.prompt_tokens,
            ),
            (
                "sublet_completion_tokens_total",
                "Tokens generated for finished requests.",
                "counter",
                |p| p.completion_tokens,
            ),
        ];
        for (name, help, kind, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((api, priority), p) in &map {
                let api = api.label();
                let _ = writeln!(
                    out,
                    "{name}{{api=\"{api}\",priority=\"{priority}\"}} {}",
                    value(p)
                );
            }
        }
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let _ = writeln!(
            out,
            "# HELP sublet_requests_refused_total Requests refused before the engine, by HTTP status.\n# TYPE sublet_requests_refused_total counter"
        );
        for (status, n) in refused {
            let _ = writeln!(
                out,
                "sublet_requests_refused_total{{status=\"{status}\"}} {n}"
            );
        }
        out
    }
}

/// A metric family: name, kind, help, and its samples (labels, value).
type Family = (&'static str, &'static str, &'static str, Vec<(String, u64)>);

/// The engine's scheduler: make-room's switches and counters, KV use, queue lengths. Empty
/// when mistral.rs's own scheduler runs the engine.
pub fn render_scheduler(state: &SchedulerState) -> String {
    let mut out = String::new();
    if !state.make_room {
        return out;
    }
    let plain = |value: u64| vec![(String::new(), value)];
    let by_priority = |counts: &[(i32, usize)]| -> Vec<(String, u64)> {
        counts
            .iter()
            .map(|(p, n)| (format!("{{priority=\"{p}\"}}"), *n as u64))
            .collect()
    };
    let s = &state.switches;
    let switches: Vec<(String, u64)> = [
        ("priority", s.priority),
        ("kv_preemption", s.kv_preemption),
        ("budget_cap", s.budget_cap),
        ("decode_hold", s.decode_hold),
        ("turn_hint", s.turn_hint),
        ("call_retention", s.call_retention),
    ]
    .iter()
    .map(|(name, on)| (format!("{{switch=\"{name}\"}}"), u64::from(*on)))
    .collect();
    let c = &state.counters;
    let families: [Family; 20] = [
        (
            "sublet_make_room_switch",
            "gauge",
            "make-room's switches (1 on, 0 off).",
            switches,
        ),
        (
            "sublet_kv_used_tokens",
            "gauge",
            "KV in use by running requests, in tokens.",
            plain(state.kv_used_tokens as u64),
        ),
        (
            "sublet_kv_budget_tokens",
            "gauge",
            "The engine's KV budget, in tokens.",
            plain(state.kv_budget_tokens as u64),
        ),
        (
            "sublet_scheduler_running",
            "gauge",
            "Requests running, by priority.",
            by_priority(&state.running_by_priority),
        ),
        (
            "sublet_scheduler_waiting",
            "gauge",
            "Requests waiting, by priority.",
            by_priority(&state.waiting_by_priority),
        ),
        (
            "sublet_scheduler_steps_total",
            "counter",
            "Steps the scheduler planned.",
            plain(c.steps),
        ),
        (
            "sublet_prefill_chunks_total",
            "counter",
            "Prompt chunks computed.",
            plain(c.prefill_chunks),
        ),
        (
            "sublet_prefill_tokens_total",
            "counter",
            "Prompt tokens computed.",
            plain(c.prefill_tokens),
        ),
        (
            "sublet_call_tokens_total",
            "counter",
            "Tokens computed for calls (turns and turn hints), of the prompt and decoded tokens above.",
            vec![
                ("{stage=\"prompt\"}".into(), c.call_prefill_tokens),
                ("{stage=\"decode\"}".into(), c.call_decode_tokens),
            ],
        ),
        (
            "sublet_decode_tokens_total",
            "counter",
            "Tokens decoded.",
            plain(c.decode_tokens),
        ),
        (
            "sublet_preemptions_total",
            "counter",
            "Running requests preempted: to let another grow, or to admit a more urgent one (for KV room, or for a place among those running).",
            vec![
                ("{reason=\"growth\"}".into(), c.growth_preemptions),
                ("{reason=\"kv\"}".into(), c.kv_preemptions),
                ("{reason=\"slot\"}".into(), c.slot_preemptions),
            ],
        ),
        (
            "sublet_held_request_steps_total",
            "counter",
            "Request-steps held back by the budget cap, the decode hold or a turn hint.",
            plain(c.held_request_steps),
        ),
        (
            "sublet_hold_releases_total",
            "counter",
            "Holds let go because a request had waited the window.",
            plain(c.hold_releases),
        ),
        (
            "sublet_turn_hints_total",
            "counter",
            "Turn hints seen.",
            plain(c.hints_seen),
        ),
        (
            "sublet_turn_hints_superseded_total",
            "counter",
            "Turn hints withdrawn before they started, because their turn had arrived.",
            plain(c.hints_superseded),
        ),
        (
            "sublet_first_sentence_releases_total",
            "counter",
            "Voice turns whose hold ended at their first sentence, before the window's end.",
            plain(c.first_sentence_releases),
        ),
        (
            "sublet_paced_steps_total",
            "counter",
            "Steps that left the agents' prompts out to pace a call's reply.",
            plain(c.paced_steps),
        ),
        (
            "sublet_turn_prompt_tokens_total",
            "counter",
            "Voice turns' prompt tokens as they arrived: all of them, and those the prefix cache held.",
            vec![
                ("{of=\"all\"}".into(), c.turn_prompt_tokens),
                ("{of=\"cached\"}".into(), c.turn_cached_tokens),
            ],
        ),
        (
            "sublet_kv_refused_total",
            "counter",
            "Requests refused: they would need more KV than the budget.",
            plain(c.refused),
        ),
        (
            "sublet_scheduler_nanoseconds_total",
            "counter",
            "Time the scheduler spent deciding.",
            plain(state.schedule_ns),
        ),
    ];
    for (name, kind, help, samples) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }
    out
}

/// Where the memory goes: the engine's own figures (weights, KV, the heap's peak in a
/// step) and the process's resident memory and heap they are read against. A figure not
/// known here (off glibc, without the counting allocator) is left out.
pub fn render_memory(memory: &EngineMemory) -> String {
    let heap = sublet_engine::memory::heap_figures();
    let gauges: [(&str, &str, Option<u64>); 8] = [
        (
            "sublet_engine_weights_bytes",
            "The heap loading the engine's model took (weights as held, tokenizer).",
            memory.weights_bytes,
        ),
        (
            "sublet_engine_kv_allocated_bytes",
            "KV allocated by the requests the scheduler holds, running or preempted.",
            Some(memory.kv_allocated_bytes),
        ),
        (
            "sublet_engine_kv_used_bytes",
            "Of that KV, the bytes holding tokens.",
            Some(memory.kv_used_bytes),
        ),
        (
            "sublet_engine_prefix_cache_bytes",
            "KV the engine's prefix cache keeps of finished requests.",
            Some(memory.prefix_cache_bytes),
        ),
        (
            "sublet_engine_step_peak_bytes",
            "The most the heap rose within one scheduled step: activations and workspace.",
            memory.step_peak_bytes,
        ),
        (
            "sublet_process_resident_bytes",
            "The process's resident memory.",
            sublet_engine::memory::resident_bytes(),
        ),
        (
            "sublet_process_heap_in_use_bytes",
            "Bytes allocated and not freed (Rust and C libraries together).",
            heap.map(|h| h.in_use()),
        ),
        (
            "sublet_process_heap_free_kept_bytes",
            "Bytes freed but kept by the allocator's arenas.",
            heap.map(|h| h.arena_free),
        ),
    ];
    let mut out = String::new();
    for (name, help, value) in gauges {
        if let Some(value) = value {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_memory_it_knows() {
        let memory = EngineMemory {
            weights_bytes: Some(100),
            kv_allocated_bytes: 40,
            step_peak_bytes: None,
            ..EngineMemory::default()
        };
        let text = render_memory(&memory);
        for line in [
            "sublet_engine_weights_bytes 100",
            "sublet_engine_kv_allocated_bytes 40",
            "sublet_engine_prefix_cache_bytes 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        assert!(!text.contains("sublet_engine_step_peak_bytes"), "{text}");
        assert!(text.contains("sublet_process_resident_bytes "), "{text}");
    }

    #[test]
    fn renders_the_scheduler_only_when_make_room_runs() {
        assert_eq!(render_scheduler(&SchedulerState::default()), "");
        let state = SchedulerState {
            make_room: true,
            kv_used_tokens: 700,
            kv_budget_tokens: 1024,
            running_by_priority: vec![(0, 1), (1, 3)],
            ..SchedulerState::default()
        };
        let text = render_scheduler(&state);
        for line in [
            "sublet_kv_used_tokens 700",
            "sublet_kv_budget_tokens 1024",
            "sublet_scheduler_running{priority=\"1\"} 3",
            "sublet_make_room_switch{switch=\"priority\"} 0",
            "sublet_preemptions_total{reason=\"kv\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }

    #[test]
    fn renders_counts_per_api_and_priority() {
        let m = Metrics::default();
        m.started(Api::Chat, 1);
        m.started(Api::Chat, 1);
        m.started(Api::Chat, 0);
        m.started(Api::Messages, 1);
        m.finished(Api::Chat, 1, 10, 5);
        m.started(Api::Chat, 1);
        m.cancelled(Api::Chat, 1);
        m.refused(400);
        let text = m.render();
        for line in [
            "sublet_requests_started_total{api=\"chat_completions\",priority=\"1\"} 3",
            "sublet_requests_started_total{api=\"messages\",priority=\"1\"} 1",
            "sublet_requests_in_flight{api=\"chat_completions\",priority=\"1\"} 1",
            "sublet_requests_in_flight{api=\"messages\",priority=\"1\"} 1",
            "sublet_requests_cancelled_total{api=\"chat_completions\",priority=\"1\"} 1",
            "sublet_completion_tokens_total{api=\"chat_completions\",priority=\"1\"} 5",
            "sublet_requests_refused_total{status=\"400\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
