//! A planned step cut into the passes the engine can batch.

use super::Batching;
use crate::make_room::{self, Plan, Request};

/// One forward pass: sequences the engine can batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pass {
    Decode(Vec<u64>),
    Prefill {
        ids: Vec<u64>,
        start: usize,
        len: usize,
    },
    /// A prompt chunk's pass with the step's decodes in it ([`Batching::Mixed`]).
    Mixed {
        decode: Vec<u64>,
        ids: Vec<u64>,
        start: usize,
        len: usize,
    },
}

/// Splits a step into the passes the engine can batch: by priority, most urgent first;
/// within a priority decodes before prompt chunks (as stock runs them), and sequences
/// grouped by chunk start, length and whether it samples (prompts) and, unless the model
/// decodes unequal lengths together, by KV length (decodes). From
/// [`Batching::UnequalDecodes`] all the step's decodes are one pass, at its most urgent
/// decode's place: on a CPU a pass reads every weight once, whatever it decodes. With
/// [`Batching::Mixed`] that pass goes into the step's last prompt pass, unless that
/// prompt is more urgent than every decode (a call's prompt is never slowed by the
/// agents' decodes).
pub(super) fn passes(policy: &make_room::Scheduler, plan: &Plan, batching: Batching) -> Vec<Pass> {
    let unequal_decodes_together = batching != Batching::EqualLengths;
    let request = |id: u64| policy.request(id).expect("planned request exists");
    // (priority, first id, pass)
    let mut keyed: Vec<(i32, u64, Pass)> = Vec::new();
    for &id in &plan.decode {
        let r = request(id);
        let found = keyed.iter_mut().find(|(p, _, pass)| {
            matches!(pass, Pass::Decode(ids) if unequal_decodes_together
                || (*p == r.priority && request(ids[0]).computed == r.computed))
        });
        match found {
            Some((p, _, Pass::Decode(ids))) => {
                ids.push(id);
                *p = (*p).min(r.priority);
            }
            _ => keyed.push((r.priority, id, Pass::Decode(vec![id]))),
        }
    }
    for &(id, n) in &plan.prefill {
        let r = request(id);
        let (start, len) = (r.computed, n);
        // A chunk that ends a prompt samples a token; one that does not, or one that
        // recomputes a preempted reply's KV up to its last token, samples nothing, which
        // the engine decides for a whole pass.
        let samples =
            |r: &Request, start: usize, len: usize| r.generated == 0 && start + len >= r.target();
        let found = keyed.iter_mut().find(|(p, _, pass)| {
            *p == r.priority
                && matches!(pass, Pass::Prefill { ids, start: s, len: l }
                    if *s == start && *l == len && samples(request(ids[0]), start, len) == samples(r, start, len))
        });
        match found {
            Some((_, _, Pass::Prefill { ids, .. })) => ids.push(id),
            _ => keyed.push((
                r.priority,
                id,
                Pass::Prefill {
                    ids: vec![id],
                    start,
                    len,
                },
            )),
        }
    }
    // Stable: decodes stay ahead of prompt chunks within a priority.
    keyed.sort_by_key(|(priority, _, pass)| (*priority, matches!(pass, Pass::Prefill { .. })));
    if batching == Batching::Mixed {
        mix_decodes_into_last_prompt(&mut keyed);
    }
    keyed.into_iter().map(|(_, _, pass)| pass).collect()
}

/// [`Batching::Mixed`]: the step's one decode pass joins its last (least urgent) prompt
/// pass, if that prompt is not more urgent than the decodes.
fn mix_decodes_into_last_prompt(keyed: &mut Vec<(i32, u64, Pass)>) {
    let decode = keyed
        .iter()
        .position(|(_, _, pass)| matches!(pass, Pass::Decode(_)));
    let prompt = keyed
        .iter()
        .rposition(|(_, _, pass)| matches!(pass, Pass::Prefill { .. }));
    let (Some(d), Some(p)) = (decode, prompt) else {
        return;
    };
    if keyed[p].0 < keyed[d].0 {
        return;
    }
    let (_, _, Pass::Decode(decode)) = keyed.remove(d) else {
        unreachable!("found as a decode pass")
    };
    let p = if d < p { p - 1 } else { p };
    let entry = &mut keyed[p].2;
    if let Pass::Prefill { ids, start, len } = entry {
        *entry = Pass::Mixed {
            decode,
            ids: std::mem::take(ids),
            start: *start,
            len: *len,
        };
    }
}
