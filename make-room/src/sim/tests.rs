//! The simulator's own checks: hand-built workloads with their expected plans, and a
//! bounded stall search.

use super::*;

/// Two long agent requests, then (with a hint 100 ms before) a voice turn at `voice_ms`.
fn voice_beside_agents(
    switches: Switches,
    kv_budget_tokens: usize,
    agent_new: usize,
    voice_ms: u64,
) -> RunReport {
    let config = PolicyConfig {
        max_running: 8,
        kv_budget_tokens,
        chunk_tokens: Some(128),
        ..PolicyConfig::default()
    };
    let workload = Workload {
        config,
        arrivals: vec![
            (
                0,
                Arrival::Request(Request::new(0, 1, None, 900, agent_new)),
            ),
            (
                0,
                Arrival::Request(Request::new(1, 1, None, 900, agent_new)),
            ),
            (voice_ms - 100, Arrival::Hint(0)),
            (
                voice_ms,
                Arrival::Request(Request::new(2, 0, Some(7), 150, 30)),
            ),
        ],
    };
    run(&workload, &switches, false)
}

fn first_token(report: &RunReport, id: u64) -> u64 {
    report
        .first_token_ms
        .iter()
        .find(|(i, _)| *i == id)
        .expect("first token")
        .1
}

#[test]
fn make_room_answers_the_turn_sooner_during_agent_prefill() {
    let off = voice_beside_agents(Switches::default(), 2_000, 200, 800);
    let on = voice_beside_agents(Switches::all(), 2_000, 200, 800);
    assert!(
        off.violation.is_none() && on.violation.is_none(),
        "{off:?} {on:?}"
    );
    let (off_ms, on_ms) = (first_token(&off, 2) - 800, first_token(&on, 2) - 800);
    println!(
        "prefill in flight: voice first token after {off_ms} ms off, {on_ms} ms on; {:?}",
        on.counters
    );
    assert!(
        on_ms * 5 < off_ms,
        "voice first token: off {off_ms} ms, on {on_ms} ms"
    );
    assert!(on.counters.held_request_steps > 0, "{:?}", on.counters);
    assert_eq!((off.finished, on.finished), (3, 3));
}

#[test]
fn make_room_answers_the_turn_sooner_with_the_kv_full() {
    // The agents' replies outgrow the KV; find a moment when it is full (less room than
    // the turn's first chunk) for the turn to arrive, in both runs.
    let kv_full = |r: &RunReport| {
        r.kv_free_at_arrival
            .iter()
            .any(|&(id, free)| id == 2 && free < 128)
    };
    let arrival = (5_000..12_000)
        .step_by(10)
        .find(|&ms| {
            kv_full(&voice_beside_agents(Switches::default(), 3_000, 2_000, ms))
                && kv_full(&voice_beside_agents(Switches::all(), 3_000, 2_000, ms))
        })
        .expect("a moment with the KV full");
    let off = voice_beside_agents(Switches::default(), 3_000, 2_000, arrival);
    let on = voice_beside_agents(Switches::all(), 3_000, 2_000, arrival);
    assert!(
        off.violation.is_none() && on.violation.is_none(),
        "{off:?} {on:?}"
    );
    let (off_ms, on_ms) = (
        first_token(&off, 2) - arrival,
        first_token(&on, 2) - arrival,
    );
    println!(
        "KV full at {arrival} ms: voice first token after {off_ms} ms off, {on_ms} ms on; {:?}",
        on.counters
    );
    assert!(
        on_ms * 5 < off_ms,
        "voice first token: off {off_ms} ms, on {on_ms} ms"
    );
    assert!(on.counters.kv_preemptions >= 1, "{:?}", on.counters);
    assert_eq!(off.counters.kv_preemptions, 0);
    assert_eq!((off.finished, on.finished), (3, 3));
}

#[test]
fn a_voice_turn_takes_a_place_when_agents_fill_every_one() {
    // Two agents run long replies in the engine's two places; a turn arrives.
    let run_with = |switches: Switches| {
        let workload = Workload {
            config: PolicyConfig {
                max_running: 2,
                kv_budget_tokens: 100_000,
                chunk_tokens: Some(128),
                ..PolicyConfig::default()
            },
            arrivals: vec![
                (0, Arrival::Request(Request::new(0, 1, None, 100, 2_000))),
                (0, Arrival::Request(Request::new(1, 1, None, 100, 2_000))),
                (
                    1_000,
                    Arrival::Request(Request::new(2, 0, Some(7), 150, 30)),
                ),
            ],
        };
        run(&workload, &switches, false)
    };
    let (off, on) = (run_with(Switches::default()), run_with(Switches::all()));
    assert!(
        off.violation.is_none() && on.violation.is_none(),
        "{off:?} {on:?}"
    );
    let (off_ms, on_ms) = (first_token(&off, 2) - 1_000, first_token(&on, 2) - 1_000);
    println!("places full: voice first token after {off_ms} ms off, {on_ms} ms on");
    assert!(
        on_ms * 5 < off_ms,
        "voice first token: off {off_ms} ms, on {on_ms} ms"
    );
    assert_eq!(on.counters.slot_preemptions, 1, "{:?}", on.counters);
    assert_eq!(off.counters.slot_preemptions, 0);
    assert_eq!((off.finished, on.finished), (3, 3));
}

#[test]
fn prompts_take_the_idle_chunk_until_a_voice_turn_is_near() {
    let mut scheduler = Scheduler::new(PolicyConfig {
        switches: Switches::all(),
        kv_budget_tokens: 4000,
        chunk_tokens: Some(16),
        idle_chunk_tokens: Some(64),
        whole_prompt_priority: Some(0),
        ..PolicyConfig::default()
    });
    scheduler.add(Request::new(1, 1, None, 800, 10), 0).unwrap();
    let plan = scheduler.schedule(0);
    assert_eq!(plan.prefill, vec![(1, 64)], "alone: the idle chunk");
    scheduler.finish_step(&plan, 10, &[]);
    // The caller stops speaking: chunks shrink before their turn arrives.
    scheduler.turn_hint(0, 10);
    let plan = scheduler.schedule(10);
    assert!(plan.tokens() <= 16, "{plan:?}");
    scheduler.finish_step(&plan, 20, &[]);
    // The hint lapses with no turn: back to the idle chunk.
    let plan = scheduler.schedule(10_000);
    assert_eq!(
        plan.prefill.iter().map(|p| p.1).sum::<usize>(),
        64,
        "{plan:?}"
    );
    scheduler.finish_step(&plan, 10_010, &[]);
    // A voice turn is running: small chunks beside it; with the switches off, the idle
    // chunk all the same.
    scheduler
        .add(Request::new(2, 0, Some(7), 40, 96), 10_010)
        .unwrap();
    let plan = scheduler.schedule(10_010);
    assert!(plan.tokens() <= 40 + 16, "{plan:?}");
    // Past its window the reply only has to keep ahead of speech: the idle chunk again,
    // in one step of `reply_pace_steps`; the steps between decode the reply alone.
    let mut past = scheduler.clone();
    past.finish_step(&plan, 10_020, &[]);
    for at in 0..scheduler.config().window_tokens as u64 {
        let plan = past.schedule(10_020 + at);
        past.finish_step(&plan, 10_021 + at, &[]);
    }
    let every = past.config().reply_pace_steps;
    let paced_before = past.counters.paced_steps;
    let mut chunks = Vec::new();
    for at in 0..every as u64 {
        let plan = past.schedule(20_000 + at);
        assert!(plan.decode.contains(&2), "the reply decodes on: {plan:?}");
        chunks.push(plan.tokens() - plan.decode.len());
        past.finish_step(&plan, 20_001 + at, &[]);
    }
    chunks.sort();
    let mut expected = vec![0; every - 1];
    expected.push(63);
    assert_eq!(chunks, expected);
    assert_eq!(past.counters.paced_steps - paced_before, every as u64 - 1);
    scheduler.set_switches(Switches::default());
    scheduler.finish_step(&plan, 10_020, &[]);
    let plan = scheduler.schedule(10_020);
    let agent_chunk: usize = plan.prefill.iter().filter(|p| p.0 == 1).map(|p| p.1).sum();
    assert!(agent_chunk > 16, "{plan:?}");
}

#[test]
fn a_hint_that_arrives_with_its_turn_never_runs() {
    // The engine is busy in an agent's long prompt when the caller's hint and turn
    // arrive together: the hint must not compute the prefix the turn computes itself.
    let config = PolicyConfig {
        kv_budget_tokens: 2000,
        chunk_tokens: Some(64),
        ..PolicyConfig::default()
    };
    let workload = Workload {
        config,
        arrivals: vec![
            (0, Arrival::Request(Request::new(0, 1, None, 900, 20))),
            (40, Arrival::Request(Request::new(1, 0, Some(7), 120, 1))),
            (40, Arrival::Request(Request::new(2, 0, Some(7), 150, 30))),
        ],
    };
    let report = run(&workload, &Switches::all(), true);
    assert!(report.violation.is_none(), "{report:?}");
    assert_eq!((report.finished, report.withdrawn), (2, 1));
    assert!(report.trace.iter().all(|plan| !plan.admitted.contains(&1)));
    // With the hint off it is a request like any other, and runs.
    let report = run(&workload, &Switches::default(), false);
    assert_eq!((report.finished, report.withdrawn), (3, 0));
}

#[test]
fn a_hold_cannot_stall_the_engine() {
    // A voice request too big to be admitted beside a running agent must not freeze the
    // agent's prefill through holds.
    let config = PolicyConfig {
        max_running: 2,
        kv_budget_tokens: 300,
        chunk_tokens: Some(16),
        window_tokens: 4,
        ..PolicyConfig::default()
    };
    let workload = Workload {
        config,
        arrivals: vec![
            (0, Arrival::Request(Request::new(0, 1, None, 200, 20))),
            (0, Arrival::Hint(0)),
            (1, Arrival::Request(Request::new(1, 0, None, 250, 10))),
        ],
    };
    let report = run(&workload, &Switches::all(), false);
    assert!(report.violation.is_none(), "{report:?}");
    assert_eq!(report.finished, 2);
}

#[test]
fn a_call_turn_takes_over_its_retained_kv_but_reuses_only_what_the_engine_holds() {
    let mut scheduler = Scheduler::new(PolicyConfig {
        switches: Switches::all(),
        kv_budget_tokens: 1000,
        ..PolicyConfig::default()
    });
    // The call's first turn: a 90-token prompt and 11 tokens; it finishes holding 100.
    scheduler
        .add(Request::new(1, 0, Some(7), 90, 11), 0)
        .unwrap();
    let mut now = 0;
    while !scheduler.is_idle() {
        let plan = scheduler.schedule(now);
        now += 10;
        scheduler.finish_step(&plan, now, &[]);
    }
    assert_eq!(scheduler.retained_tokens(), 100);
    // Its next turn arrives with a 60-token prefix the engine found in its cache.
    let mut turn = Request::new(2, 0, Some(7), 120, 8);
    turn.cached = 60;
    turn.cached_exact = true;
    scheduler.add(turn, now).unwrap();
    let plan = scheduler.schedule(now);
    assert_eq!(
        scheduler.retained_tokens(),
        0,
        "the turn took the room over"
    );
    assert_eq!(
        plan.prefill,
        vec![(2, 60)],
        "it computes what the engine lacks"
    );
    assert_eq!(scheduler.counters.retained_hits, 1);
    // When it finishes it is kept in turn; turning retention off lets go of it.
    scheduler.finish_step(&plan, now + 10, &[]);
    while !scheduler.is_idle() {
        now += 10;
        let plan = scheduler.schedule(now);
        scheduler.finish_step(&plan, now + 10, &[]);
    }
    assert_eq!(scheduler.retained_tokens(), 127);
    scheduler.set_switches(Switches::default());
    assert_eq!(scheduler.retained_tokens(), 0);
}

#[test]
fn the_invariant_checks_can_fail() {
    // A scheduler that never schedules anything must be reported as a stall.
    let mut workload = random_workload(3);
    workload.config.chunk_tokens = Some(0);
    workload.config.idle_chunk_tokens = Some(0);
    let report = run(&workload, &Switches::default(), false);
    assert!(
        report
            .violation
            .as_deref()
            .is_some_and(|v| v.starts_with("stall")),
        "{report:?}"
    );
}

#[test]
fn bounded_stall_search_finds_nothing() {
    let summary = search(0, 20_000, |_| {});
    assert_eq!(summary.caused_by_options, 0, "{summary:?}");
    assert_eq!(summary.stock_mismatches, 0, "{summary:?}");
    assert_eq!(summary.with_options_off, 0, "{summary:?}");
}
