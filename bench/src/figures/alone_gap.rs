//! make-room's turns against the same utterances alone: what the agents beside a caller
//! still cost them, paired by utterance, so that a short or a long recording does not pass
//! for a slow or a fast round.
//!
//! Each answered make-room turn is set against the mean of the same recording's same
//! utterance answered in the voice-alone rounds with as many callers. The SLO share
//! compares make-room's slowest turns with the voice-alone p95 of a few dozen turns; this
//! figure uses every turn, so it moves less with the machine from one run to the next.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{RoundRecord, MAKE_ROOM_ON, VOICE_ALONE};
use crate::stats::{bootstrap_interval, VoiceTurn};

/// make-room's turns with one number of callers, each against its utterance alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AloneGap {
    pub callers: usize,
    /// make-room's answered turns whose utterance was answered alone too.
    pub turns: usize,
    /// The mean over those turns of voice to voice minus the utterance's mean alone.
    pub voice_to_voice_mean_s: f64,
    /// A bootstrap 95% interval on that mean.
    pub voice_to_voice_interval_s: [f64; 2],
    /// The same for each stage (end of turn, transcript, first token, first sentence,
    /// first audio).
    pub stage_means_s: [f64; 5],
}

/// The recording and utterance a turn replays: a call is named `recording#round.caller`.
fn utterance_of(turn: &VoiceTurn) -> (&str, usize) {
    let recording = turn.call.split('#').next().unwrap_or(&turn.call);
    (recording, turn.utterance)
}

/// Voice to voice and the stages of an answered turn.
fn answered(turn: &VoiceTurn) -> Option<(f64, [f64; 5])> {
    Some((turn.voice_to_voice_s?, turn.stages_s?))
}

/// One gap per number of callers with make-room and voice-alone rounds both.
pub(super) fn alone_gaps(rounds: &[RoundRecord], counts: &[usize]) -> Vec<AloneGap> {
    counts
        .iter()
        .filter_map(|&callers| alone_gap(rounds, callers))
        .collect()
}

fn alone_gap(rounds: &[RoundRecord], callers: usize) -> Option<AloneGap> {
    let turns_of = |condition: &'static str| {
        rounds
            .iter()
            .filter(move |r| r.condition == condition && r.callers == callers)
            .flat_map(|r| &r.turns)
            .filter_map(|t| Some((utterance_of(t), answered(t)?)))
    };
    // Each utterance's sums alone: voice to voice, stages, count.
    let mut alone: HashMap<(&str, usize), (f64, [f64; 5], usize)> = HashMap::new();
    for (key, (v2v, stages)) in turns_of(VOICE_ALONE) {
        let sums = alone.entry(key).or_insert((0.0, [0.0; 5], 0));
        sums.0 += v2v;
        sums.1.iter_mut().zip(stages).for_each(|(s, x)| *s += x);
        sums.2 += 1;
    }
    let mut gaps = Vec::new();
    let mut stage_sums = [0.0; 5];
    for (key, (v2v, stages)) in turns_of(MAKE_ROOM_ON) {
        let Some((alone_v2v, alone_stages, n)) = alone.get(&key) else {
            continue;
        };
        let n = *n as f64;
        gaps.push(v2v - alone_v2v / n);
        for (i, sum) in stage_sums.iter_mut().enumerate() {
            *sum += stages[i] - alone_stages[i] / n;
        }
    }
    if gaps.is_empty() {
        return None;
    }
    let count = gaps.len() as f64;
    Some(AloneGap {
        callers,
        turns: gaps.len(),
        voice_to_voice_mean_s: mean(&gaps),
        voice_to_voice_interval_s: bootstrap_interval(&gaps, mean),
        stage_means_s: stage_sums.map(|s| s / count),
    })
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}
