//! make-room on the real engine: the probes' two cases (a voice turn when agents hold the
//! whole KV budget, and while an agent prefill is in flight), switches off and on. Each
//! case fails by itself if its condition did not hold when the turn was sent; these tests
//! check what the scheduler did, from its own state, not how fast it was (the timings and
//! their ratios are `cargo xtask probe`'s to print).

use sublet_engine::probe::{self, ProbeOptions};
use sublet_engine::EngineConfig;
use sublet_models::ModelCache;

#[test]
fn make_room_takes_kv_and_steps_from_agents_for_a_voice_turn() {
    let cache = ModelCache::from_env();
    let options = ProbeOptions::default();
    let report = probe::run(&EngineConfig::bundled(&cache).unwrap(), &options, |line| {
        eprintln!("{line}")
    })
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());

    // KV full: with make-room the turn preempts agents; without, it waits while they run.
    let kv = &report.kv_full;
    assert!(kv.on.kv_preemptions() >= 1, "{:?}", kv.on.after.counters);
    assert_eq!(kv.off.kv_preemptions(), 0);
    assert!(
        kv.off.agent_tokens > kv.on.agent_tokens,
        "agents made {} tokens during the turn off, {} on",
        kv.off.agent_tokens,
        kv.on.agent_tokens
    );

    // Prefill in flight: with make-room the turn's first token comes while the agent's
    // prompt is still being computed; without, only after it.
    let prefill = &report.prefill_in_flight;
    assert!(
        prefill.on.agent_prefills_at_first_token() > 0,
        "{:?}",
        prefill.on.at_first_token
    );
    assert_eq!(
        prefill.off.agent_prefills_at_first_token(),
        0,
        "{:?}",
        prefill.off.at_first_token
    );
    assert!(
        prefill.on.after.counters.held_request_steps
            > prefill.on.at_arrival.counters.held_request_steps
    );

    // The voice turn's reply is the same text whatever the agents do: 17 tokens measured.
    for turn in [&report.alone, &kv.off, &kv.on, &prefill.off, &prefill.on] {
        assert_eq!(turn.gaps_ms.len(), probe::GAPS);
    }
}
