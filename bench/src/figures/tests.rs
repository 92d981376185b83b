//! The figures recomputed from small hand-made records.
use super::*;

fn turn(v2v: f64) -> VoiceTurn {
    VoiceTurn {
        call: "c".into(),
        utterance: 0,
        voice_to_voice_s: Some(v2v),
        first_token_s: Some(0.2),
        first_sentence_s: Some(0.5),
        stages_s: Some([1.0, 0.2, 0.2, 0.3, v2v - 1.7]),
        words: None,
        reply_gap_s: Some(0.0),
    }
}

fn sample(t_s: f64, kv: usize, held: u64, waiting: usize) -> Sample {
    Sample {
        t_s,
        kv_used_tokens: kv,
        kv_budget_tokens: 100,
        running: 1,
        waiting,
        kv_preemptions: 0,
        growth_preemptions: 0,
        held_request_steps: held,
        hold_releases: 0,
        prefill_chunks: 0,
        hints_seen: 0,
        hints_superseded: 0,
        first_sentence_releases: 0,
        paced_steps: held / 4,
        retained_turns: 0,
        retained_hits: held / 2,
        turn_prompt_tokens: held * 100,
        turn_cached_tokens: held * 75,
        steps: held * 10,
        schedule_ns: held * 10 * 40_000,
        cpu_ms: (t_s * 1500.0) as u64,
        steal_ms: Some((t_s * 100.0) as u64),
        prefill_tokens: held * 30,
        decode_tokens: held * 20,
        call_prefill_tokens: held * 10,
        call_decode_tokens: held * 5,
    }
}

fn round(condition: &str, seed: Option<u64>, v2v: &[f64], tokens: usize) -> RoundRecord {
    RoundRecord {
        condition: condition.into(),
        seed,
        callers: 2,
        window_s: 0.0,
        duration_s: 12.0,
        turns: v2v.iter().map(|v| turn(*v)).collect(),
        agent_calls: vec![AgentCallRecord {
            session: "a".into(),
            started_s: 0.0,
            first_token_s: Some(1.0),
            ended_s: 5.0,
            output_tokens: tokens,
            token_times_s: Vec::new(),
            error: None,
        }],
        samples: vec![
            sample(0.0, 95, 10, 0),
            sample(5.0, 50, 12, 0),
            sample(7.0, 60, 12, 1),
            sample(9.0, 40, 12, 0),
            sample(11.0, 99, 20, 0),
        ],
    }
}

/// A voice-alone round and two pairs with two callers.
fn two_pairs() -> Vec<RoundRecord> {
    vec![
        round(VOICE_ALONE, None, &[2.0, 3.0], 0),
        round(MAKE_ROOM_OFF, Some(1), &[10.0, 20.0], 100),
        round(MAKE_ROOM_ON, Some(1), &[2.0, 4.0], 90),
        // The second pair runs on first (so a drifting machine favours neither).
        round(MAKE_ROOM_ON, Some(2), &[3.0, 3.0], 80),
        round(MAKE_ROOM_OFF, Some(2), &[8.0, 6.0], 100),
    ]
}

#[test]
fn rounds_pair_by_seed_and_conditions_pool() {
    let rounds = two_pairs();
    let figures = figures(&rounds, 10.0);
    assert_eq!(figures.slo_for(2), 3.25);
    assert_eq!(figures.slos.len(), 1);
    assert_eq!(figures.pairs.len(), 2);
    assert_eq!(figures.pairs[0].p95_voice_to_voice_off_over_on, 5.0);
    assert!((figures.pairs[1].agent_throughput_on_over_off - 0.8).abs() < 1e-12);
    let on = figures.condition(MAKE_ROOM_ON, 2).unwrap();
    assert_eq!((on.condition.as_str(), on.rounds), (MAKE_ROOM_ON, 2));
    assert_eq!(on.summary.turns, 4);
    assert_eq!(on.summary.over_slo, 1);
    assert!((on.summary.agent_tokens_per_s - 8.5).abs() < 1e-12);
    // At the budget: 95% used, or a request waiting for room. Samples after the 10 s
    // window do not count toward KV use; counters span the round.
    let engine = &figures.rounds[1].engine;
    assert_eq!(
        (engine.at_budget_share, engine.held_request_steps),
        (0.5, 10)
    );
    assert!((engine.mean_use - 0.6125).abs() < 1e-12);
    // 100 steps at 40 µs each.
    assert!((engine.scheduler_us_per_step - 40.0).abs() < 1e-9);
    assert!((on.scheduler_us_per_step - 40.0).abs() < 1e-9);
    // 16.5 s of CPU over the 11 s the samples span.
    assert!((engine.cpu_cores.unwrap() - 1.5).abs() < 1e-9);
    // 1.1 s taken by the host over the same 11 s.
    assert!((engine.steal_cores.unwrap() - 0.1).abs() < 1e-9);
    assert_eq!(engine.retained_hits, 5);
    assert!((engine.turn_prompt_cached_share.unwrap() - 0.75).abs() < 1e-12);
    // The counters grew by 10 "held" units: the calls' share is taken out of the totals.
    assert_eq!(
        engine.work,
        Some(EngineWork {
            call_prompt_tokens: 100,
            call_decoded_tokens: 50,
            agent_prompt_tokens: 200,
            agent_decoded_tokens: 150,
            seconds: 11.0,
        })
    );
    // Records from before these were sampled: not known, not zero.
    let mut old = rounds[1].samples.clone();
    for s in &mut old {
        (s.cpu_ms, s.turn_prompt_tokens, s.turn_cached_tokens) = (0, 0, 0);
        s.steal_ms = None;
        (s.prefill_tokens, s.call_prefill_tokens) = (0, 0);
    }
    let engine = engine_figures(&old, 10.0);
    assert_eq!(
        (
            engine.cpu_cores,
            engine.steal_cores,
            engine.turn_prompt_cached_share,
            engine.work
        ),
        (None, None, None, None)
    );
    assert!((on.stage_means_s[4] - 1.3).abs() < 1e-12);
}

#[test]
fn each_number_of_callers_has_its_own_slo_pairs_and_conditions() {
    let with = |callers, mut r: RoundRecord| {
        r.callers = callers;
        r
    };
    let rounds = vec![
        with(2, round(VOICE_ALONE, None, &[1.0, 2.0], 0)),
        with(4, round(VOICE_ALONE, None, &[3.0, 4.0], 0)),
        with(2, round(MAKE_ROOM_OFF, Some(1), &[10.0], 100)),
        with(2, round(MAKE_ROOM_ON, Some(1), &[3.0], 100)),
        // Same seed, other callers: not a pair.
        with(4, round(MAKE_ROOM_ON, Some(1), &[3.0], 100)),
        with(4, round(MAKE_ROOM_OFF, Some(2), &[12.0], 100)),
        with(4, round(MAKE_ROOM_ON, Some(2), &[4.0], 100)),
    ];
    let figures = figures(&rounds, 10.0);
    assert_eq!((figures.slo_for(2), figures.slo_for(4)), (2.25, 4.25));
    assert_eq!(figures.caller_counts(), vec![2, 4]);
    // The 2-caller turn of 3 s is over its SLO; the 4-caller turns of 3 and 4 s are not.
    assert_eq!(
        figures.condition(MAKE_ROOM_ON, 2).unwrap().summary.over_slo,
        1
    );
    assert_eq!(
        figures.condition(MAKE_ROOM_ON, 4).unwrap().summary.over_slo,
        0
    );
    assert_eq!(figures.condition(MAKE_ROOM_ON, 4).unwrap().rounds, 2);
    let pairs: Vec<(usize, Option<u64>)> =
        figures.pairs.iter().map(|p| (p.callers, p.seed)).collect();
    assert_eq!(pairs, vec![(2, Some(1)), (4, Some(2))]);
    assert_eq!(figures.conditions.len(), 6);
}

#[test]
fn an_unpaired_round_has_no_ratio() {
    let rounds = vec![
        round(VOICE_ALONE, None, &[2.0], 0),
        round(MAKE_ROOM_OFF, Some(1), &[10.0], 100),
        round(MAKE_ROOM_ON, Some(2), &[2.0], 90),
    ];
    assert!(figures(&rounds, 10.0).pairs.is_empty());
}

#[test]
fn an_agents_alone_round_is_the_agents_reference_and_no_number_of_callers() {
    let mut alone = round(AGENTS_ALONE, Some(1), &[], 200);
    alone.callers = 0;
    let rounds: Vec<RoundRecord> = std::iter::once(alone).chain(two_pairs()).collect();
    let figures = figures(&rounds, 10.0);
    assert_eq!(figures.caller_counts(), vec![2]);
    assert_eq!(figures.slos.len(), 1);
    let reference = figures.condition(AGENTS_ALONE, 0).unwrap();
    assert_eq!((reference.rounds, reference.summary.turns), (1, 0));
    assert!((reference.summary.agent_tokens_per_s - 20.0).abs() < 1e-12);
    // Seed 1's pair is measured against it; seed 2 had no agents-alone round.
    let of = |p: &PairRatios| {
        (
            p.agent_throughput_off_over_alone,
            p.agent_throughput_on_over_alone,
        )
    };
    assert_eq!(of(&figures.pairs[0]), (Some(0.5), Some(0.45)));
    assert_eq!(of(&figures.pairs[1]), (None, None));
}

#[test]
fn a_shorter_pair_is_set_against_the_agents_alone_rounds_same_stretch() {
    // Alone for 20 s: 160 tokens by 10 s, 40 more after it (10 tokens/s over its window).
    let mut alone = round(AGENTS_ALONE, Some(1), &[], 200);
    alone.callers = 0;
    alone.window_s = 20.0;
    alone.agent_calls[0].ended_s = 18.0;
    alone.agent_calls[0].token_times_s =
        (0..200).map(|i| if i < 160 { 9.0 } else { 15.0 }).collect();
    // The pair ran 10 s windows: its 50 tokens in 10 s against the alone round's first 10 s
    // (16 tokens/s), not its whole window's 10.
    let mut pair = vec![
        round(MAKE_ROOM_OFF, Some(1), &[10.0], 50),
        round(MAKE_ROOM_ON, Some(1), &[2.0], 50),
    ];
    for r in &mut pair {
        r.window_s = 10.0;
    }
    let rounds: Vec<RoundRecord> = std::iter::once(alone).chain(pair).collect();
    let figures = figures(&rounds, 20.0);
    let reference = figures.condition(AGENTS_ALONE, 0).unwrap();
    assert!((reference.summary.agent_tokens_per_s - 10.0).abs() < 1e-12);
    assert_eq!(
        figures.pairs[0].agent_throughput_off_over_alone,
        Some(0.3125)
    );
}

#[test]
fn make_room_turns_are_set_against_the_same_utterance_alone() {
    let replay = |call: &str, utterance: usize, v2v: Option<f64>| VoiceTurn {
        call: call.into(),
        utterance,
        voice_to_voice_s: v2v,
        stages_s: v2v.map(|v| [0.5, 0.0, 0.1, 0.1, v - 0.7]),
        ..turn(1.0)
    };
    let with = |condition: &str, callers: usize, turns: Vec<VoiceTurn>| RoundRecord {
        callers,
        turns,
        ..round(condition, None, &[], 0)
    };
    let rounds = vec![
        with(
            VOICE_ALONE,
            2,
            vec![
                replay("a.wav#0.0", 0, Some(1.0)),
                replay("a.wav#0.0", 1, Some(2.0)),
                replay("b.wav#0.1", 0, Some(3.0)),
            ],
        ),
        with(VOICE_ALONE, 2, vec![replay("a.wav#3.0", 0, Some(1.2))]),
        // Four callers' utterances alone are not two callers'.
        with(VOICE_ALONE, 4, vec![replay("c.wav#0.0", 0, Some(0.5))]),
        with(
            MAKE_ROOM_ON,
            2,
            vec![
                // 1.5 against a.wav's first utterance alone, 1.1 on average: +0.4.
                replay("a.wav#1.0", 0, Some(1.5)),
                // +0.1.
                replay("a.wav#1.0", 1, Some(2.1)),
                // No reply: the SLO share counts it, not this.
                replay("b.wav#1.1", 0, None),
                // Never answered alone with two callers.
                replay("c.wav#1.1", 0, Some(9.0)),
            ],
        ),
    ];
    let gaps = figures(&rounds, 10.0).alone_gaps;
    assert_eq!(gaps.len(), 1, "no make-room round with four callers");
    let gap = &gaps[0];
    assert_eq!((gap.callers, gap.turns), (2, 2));
    assert!((gap.voice_to_voice_mean_s - 0.25).abs() < 1e-9);
    // All of it in the last stage, as the turns were made.
    assert!((gap.stage_means_s[4] - 0.25).abs() < 1e-9);
    assert!(gap.stage_means_s[..4].iter().all(|s| s.abs() < 1e-9));
    let [low, high] = gap.voice_to_voice_interval_s;
    assert!((0.1 - 1e-9..=0.25).contains(&low) && (0.25..=0.4 + 1e-9).contains(&high));
}
