//! The policy's own checks, step by step.
use super::*;

#[test]
fn a_turns_hold_ends_at_its_first_sentence() {
    let config = PolicyConfig {
        switches: Switches::all(),
        window_tokens: 32,
        release_at_first_sentence: true,
        ..PolicyConfig::default()
    };
    let mut without = Scheduler::new(PolicyConfig {
        release_at_first_sentence: false,
        ..config.clone()
    });
    let mut off = Scheduler::new(PolicyConfig {
        switches: Switches::default(),
        ..config.clone()
    });
    let mut scheduler = Scheduler::new(config);
    let step = |scheduler: &mut Scheduler, at: u64| {
        let plan = scheduler.schedule(at);
        scheduler.finish_step(&plan, at + 1, &[]);
        plan
    };
    scheduler.add(Request::new(1, 1, None, 20, 200), 0).unwrap();
    step(&mut scheduler, 0);
    scheduler
        .add(Request::new(2, 0, Some(7), 30, 48), 0)
        .unwrap();
    for at in 1..4 {
        let plan = step(&mut scheduler, at);
        assert_eq!(plan.held, vec![1], "the agent waits out the turn's window");
    }
    // Another call's first sentence changes nothing; this call's ends the hold.
    scheduler.first_sentence_out(8);
    assert_eq!(step(&mut scheduler, 4).held, vec![1]);
    scheduler.first_sentence_out(7);
    let plan = step(&mut scheduler, 5);
    assert!(
        plan.held.is_empty() && plan.decode == vec![2, 1],
        "{plan:?}"
    );
    assert_eq!(scheduler.counters.first_sentence_releases, 1);
    // Unless asked to, the hold lasts the window.
    without.add(Request::new(1, 1, None, 20, 200), 0).unwrap();
    step(&mut without, 0);
    without.add(Request::new(2, 0, Some(7), 30, 48), 0).unwrap();
    without.first_sentence_out(7);
    assert_eq!(step(&mut without, 1).held, vec![1]);
    assert_eq!(without.counters.first_sentence_releases, 0);
    // With nothing held (make-room's switches off) there is nothing to release.
    off.add(Request::new(2, 0, Some(7), 30, 48), 0).unwrap();
    step(&mut off, 0);
    off.first_sentence_out(7);
    assert_eq!(off.counters.first_sentence_releases, 0);
    // The call's next turn holds the agent again.
    scheduler
        .add(Request::new(3, 0, Some(7), 30, 48), 0)
        .unwrap();
    assert_eq!(step(&mut scheduler, 6).held, vec![1]);
}

#[test]
fn a_caller_gone_quiet_shrinks_the_steps_and_holds_no_one() {
    let config = PolicyConfig {
        switches: Switches::all(),
        chunk_tokens: Some(16),
        idle_chunk_tokens: Some(64),
        whole_prompt_priority: Some(0),
        hint_hold_ms: 500,
        ..PolicyConfig::default()
    };
    let mut scheduler = Scheduler::new(config.clone());
    scheduler.add(Request::new(1, 1, None, 20, 200), 0).unwrap();
    scheduler.add(Request::new(2, 1, None, 900, 20), 0).unwrap();
    let plan = scheduler.schedule(0);
    assert_eq!(plan.tokens(), 64, "idle: full steps: {plan:?}");
    scheduler.finish_step(&plan, 1, &[]);
    scheduler.turn_coming(7, 10);
    let plan = scheduler.schedule(10);
    assert_eq!(plan.tokens(), 16, "quiet: small steps: {plan:?}");
    assert!(plan.held.is_empty(), "and no one held: {plan:?}");
    scheduler.finish_step(&plan, 11, &[]);
    assert_eq!(scheduler.schedule(600).tokens(), 64, "the quiet lapses");
    // With the turn hint off, a quiet caller changes nothing.
    let mut off = Scheduler::new(PolicyConfig {
        switches: Switches {
            turn_hint: false,
            ..Switches::all()
        },
        ..config
    });
    off.add(Request::new(2, 1, None, 900, 20), 0).unwrap();
    off.turn_coming(7, 0);
    assert_eq!(off.schedule(0).tokens(), 64);
}

#[test]
fn a_quiet_callers_hold_ends_when_their_turn_arrives_or_they_speak_again() {
    let mut scheduler = Scheduler::new(PolicyConfig {
        switches: Switches::all(),
        chunk_tokens: Some(16),
        idle_chunk_tokens: Some(64),
        whole_prompt_priority: Some(0),
        window_tokens: 4,
        hint_hold_ms: 1_000,
        ..PolicyConfig::default()
    });
    let step = |scheduler: &mut Scheduler, at: u64| {
        let plan = scheduler.schedule(at);
        scheduler.finish_step(&plan, at, &[]);
        plan
    };
    scheduler
        .add(Request::new(1, 1, None, 5_000, 20), 0)
        .unwrap();
    assert_eq!(step(&mut scheduler, 0).tokens(), 64);
    // Callers 7 and 8 go quiet; 7 speaks again: 8's hold stands.
    scheduler.turn_coming(7, 1);
    scheduler.turn_coming(8, 1);
    scheduler.turn_not_coming(7);
    assert_eq!(
        step(&mut scheduler, 2).tokens(),
        16,
        "8 may still be coming"
    );
    scheduler.turn_not_coming(8);
    assert_eq!(step(&mut scheduler, 3).tokens(), 64, "no one is coming");
    // 8's turn arrives within the hold: the steps stay small while it runs, and once its
    // reply is done the hold it came under is over too.
    scheduler.turn_coming(8, 4);
    scheduler
        .add(Request::new(2, 0, Some(8), 10, 3), 5)
        .unwrap();
    let mut at = 5;
    while scheduler.request(2).is_some() {
        let plan = step(&mut scheduler, at);
        assert!(plan.tokens() <= 16 + 1, "{plan:?}");
        at += 1;
    }
    assert!(at < 1_000, "all within the hold's second");
    assert_eq!(
        step(&mut scheduler, at).tokens(),
        64,
        "the turn took its hold with it"
    );
}

#[test]
fn the_tokens_computed_for_calls_are_counted_apart_from_the_agents() {
    let mut scheduler = Scheduler::new(PolicyConfig {
        switches: Switches::default(),
        chunk_tokens: Some(8),
        ..PolicyConfig::default()
    });
    // An agent's 20-token prompt and a call's 5-token one, one step at a time.
    scheduler.add(Request::new(1, 1, None, 20, 3), 0).unwrap();
    scheduler.add(Request::new(2, 0, Some(7), 5, 3), 0).unwrap();
    for at in 0..20 {
        let plan = scheduler.schedule(at);
        scheduler.finish_step(&plan, at + 1, &[]);
        if scheduler.is_idle() {
            break;
        }
    }
    let c = &scheduler.counters;
    assert_eq!((c.prefill_tokens, c.call_prefill_tokens), (25, 5), "{c:?}");
    // The prompt's last token gives the first reply token; two more are decoded each.
    assert_eq!((c.decode_tokens, c.call_decode_tokens), (4, 2), "{c:?}");
}

#[test]
fn with_priority_a_step_yields_the_cores_unless_a_turn_runs_in_it() {
    let config = PolicyConfig {
        switches: Switches::all(),
        chunk_tokens: Some(16),
        whole_prompt_priority: Some(0),
        window_tokens: 2,
        ..PolicyConfig::default()
    };
    let mut scheduler = Scheduler::new(config.clone());
    let step = |scheduler: &mut Scheduler, at: u64| {
        let plan = scheduler.schedule(at);
        scheduler.finish_step(&plan, at + 1, &[]);
        scheduler.step_may_yield()
    };
    scheduler.add(Request::new(1, 1, None, 40, 50), 0).unwrap();
    assert!(step(&mut scheduler, 0), "an agent's step");
    scheduler
        .add(Request::new(2, 0, Some(7), 10, 3), 1)
        .unwrap();
    // The turn's prompt, then its tokens (the agent held for the window, then beside it).
    let yielded: Vec<bool> = (1..6).map(|at| step(&mut scheduler, at)).collect();
    assert_eq!(
        yielded,
        [false, false, false, true, true],
        "the turn ends after three"
    );
    // Without priority, no step yields: the agents' work is the caller's equal.
    let mut off = Scheduler::new(PolicyConfig {
        switches: Switches::default(),
        ..config
    });
    off.add(Request::new(1, 1, None, 40, 50), 0).unwrap();
    assert!(!step(&mut off, 0));
}
