//! The adapter's pass building, without the engine.

use super::*;
use crate::make_room::{PolicyConfig, Switches};

fn policy_with(requests: &[(u64, i32, usize)]) -> make_room::Scheduler {
    let mut policy = make_room::Scheduler::new(PolicyConfig {
        switches: Switches::all(),
        ..PolicyConfig::default()
    });
    for &(id, priority, prompt) in requests {
        policy
            .add(Request::new(id, priority, None, prompt, 64), 0)
            .unwrap();
    }
    policy
}

#[test]
fn a_step_splits_into_batchable_passes_most_urgent_first() {
    // Two agents with equal prompts batch; the voice turn's prompt runs first, alone.
    let mut policy = policy_with(&[(1, 1, 40), (2, 1, 40), (3, 1, 50), (4, 0, 12)]);
    let plan = policy.schedule(0);
    assert_eq!(
        plan.prefill.len(),
        1,
        "the budget cap holds agent prefill: {plan:?}"
    );
    assert_eq!(
        passes(&policy, &plan, Batching::EqualLengths),
        vec![Pass::Prefill {
            ids: vec![4],
            start: 0,
            len: 12
        }]
    );
    let mut policy = make_room::Scheduler::new(PolicyConfig::default());
    for (id, prompt) in [(1, 40), (2, 40), (3, 50)] {
        policy
            .add(Request::new(id, 1, None, prompt, 64), 0)
            .unwrap();
    }
    let plan = policy.schedule(0);
    assert_eq!(
        passes(&policy, &plan, Batching::EqualLengths),
        vec![
            Pass::Prefill {
                ids: vec![1, 2],
                start: 0,
                len: 40
            },
            Pass::Prefill {
                ids: vec![3],
                start: 0,
                len: 50
            },
        ]
    );
    policy.finish_step(&plan, 1, &[]);
    let plan = policy.schedule(2);
    assert_eq!(
        passes(&policy, &plan, Batching::EqualLengths),
        vec![Pass::Decode(vec![1, 2]), Pass::Decode(vec![3])]
    );
    // A model that decodes unequal lengths together gets one decode pass.
    assert_eq!(
        passes(&policy, &plan, Batching::UnequalDecodes),
        vec![Pass::Decode(vec![1, 2, 3])]
    );
}

#[test]
fn unequal_decodes_join_the_most_urgent_decode_ahead_of_prompts() {
    // A voice turn (priority 0) and two agents decode, at three KV lengths, while a
    // fourth request's prompt runs: one decode pass, at the voice turn's place, then
    // the prompt.
    let mut policy = make_room::Scheduler::new(PolicyConfig::default());
    for (id, priority, prompt) in [(1, 1, 40), (2, 1, 50), (3, 0, 12)] {
        policy
            .add(Request::new(id, priority, None, prompt, 64), 0)
            .unwrap();
    }
    let plan = policy.schedule(0);
    policy.finish_step(&plan, 1, &[]);
    policy.add(Request::new(4, 1, None, 30, 64), 0).unwrap();
    let plan = policy.schedule(2);
    let out = passes(&policy, &plan, Batching::UnequalDecodes);
    let Pass::Decode(ids) = &out[0] else {
        panic!("decodes first: {out:?}")
    };
    let mut ids = ids.clone();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3], "{out:?}");
    assert_eq!(
        out[1..],
        [Pass::Prefill {
            ids: vec![4],
            start: 0,
            len: 30
        }]
    );
    // Without it, each KV length is a pass of its own.
    assert_eq!(passes(&policy, &plan, Batching::EqualLengths).len(), 4);
}

#[test]
fn a_chunk_that_ends_its_prompt_never_shares_a_pass_with_one_that_does_not() {
    // Prompts of 40 and 50 tokens, 40 each this step: the first ends its prompt and
    // samples, the second must not, and the engine decides that per pass.
    let mut policy = make_room::Scheduler::new(PolicyConfig {
        chunk_tokens: Some(80),
        ..PolicyConfig::default()
    });
    for (id, prompt) in [(1, 40), (2, 50), (3, 60)] {
        policy
            .add(Request::new(id, 1, None, prompt, 64), 0)
            .unwrap();
    }
    let plan = policy.schedule(0);
    assert_eq!(plan.prefill, vec![(1, 40), (2, 40)]);
    assert_eq!(
        passes(&policy, &plan, Batching::EqualLengths),
        vec![
            Pass::Prefill {
                ids: vec![1],
                start: 0,
                len: 40
            },
            Pass::Prefill {
                ids: vec![2],
                start: 0,
                len: 40
            },
        ]
    );
}

#[test]
fn a_preempted_replys_recompute_never_shares_a_pass_with_a_prompt_that_samples() {
    // A reply preempted by recompute after 3 tokens (its KV to redo: 40 + 2) and a fresh
    // 42-token prompt: equal chunks, but only the fresh one samples.
    let mut policy = make_room::Scheduler::new(PolicyConfig::default());
    let mut resumed = Request::new(1, 1, None, 40, 64);
    resumed.generated = 3;
    policy.add(resumed, 0).unwrap();
    policy.add(Request::new(2, 1, None, 42, 64), 0).unwrap();
    let plan = policy.schedule(0);
    assert_eq!(plan.prefill, vec![(1, 42), (2, 42)]);
    assert_eq!(
        passes(&policy, &plan, Batching::UnequalDecodes).len(),
        2,
        "{plan:?}"
    );
}

#[test]
fn mixed_batching_puts_the_decodes_in_the_last_prompt_pass_unless_a_call_waits_on_it() {
    // Two agents decode at different lengths while a third agent's prompt runs: one pass.
    let mut policy = make_room::Scheduler::new(PolicyConfig::default());
    for (id, prompt) in [(1, 40), (2, 50)] {
        policy
            .add(Request::new(id, 1, None, prompt, 64), 0)
            .unwrap();
    }
    let plan = policy.schedule(0);
    policy.finish_step(&plan, 1, &[]);
    policy.add(Request::new(3, 1, None, 30, 64), 0).unwrap();
    let plan = policy.schedule(2);
    let out = passes(&policy, &plan, Batching::Mixed);
    let [Pass::Mixed {
        decode,
        ids,
        start: 0,
        len: 30,
    }] = &out[..]
    else {
        panic!("one mixed pass: {out:?}")
    };
    assert_eq!((decode.len(), &ids[..]), (2, &[3][..]), "{out:?}");

    // A call's prompt is more urgent than the agents' decodes: it runs alone, first,
    // and the decodes go into the agents' prompt pass after it.
    policy.finish_step(&plan, 3, &[]);
    policy.add(Request::new(4, 0, None, 12, 64), 0).unwrap();
    policy.add(Request::new(5, 1, None, 20, 64), 0).unwrap();
    let plan = policy.schedule(4);
    let out = passes(&policy, &plan, Batching::Mixed);
    assert_eq!(
        out[0],
        Pass::Prefill {
            ids: vec![4],
            start: 0,
            len: 12
        },
        "{out:?}"
    );
    assert!(
        matches!(&out[1..], [Pass::Mixed { decode, .. }] if decode.len() == 3),
        "{out:?}"
    );

    // With only a call's prompt to join, and no call decoding, the agents' decodes keep
    // a pass of their own, after it.
    policy.finish_step(&plan, 5, &[4]);
    policy.add(Request::new(6, 0, None, 12, 64), 0).unwrap();
    let plan = policy.schedule(6);
    let out = passes(&policy, &plan, Batching::Mixed);
    assert!(
        matches!(&out[..], [Pass::Prefill { ids, .. }, Pass::Decode(decode)]
            if ids == &vec![6] && decode.len() == 4),
        "{out:?}"
    );
}
