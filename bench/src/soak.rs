//! The soak's plan and figures, as plain code: which fault each call gets, and what the
//! run's records add up to (turns answered and failed, turns lost without a record, faults
//! survived, resident memory's slope after warm-up, file descriptors).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sublet_agent::TurnRecord;

/// A fault one call of the soak gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// None beyond the engine refusal every call's second turn gets.
    None,
    /// The agent's signal connection dropped mid-call (it resumes).
    SignalDropped,
    /// The caller's media stopped mid-call, their connection up (the agent hangs up).
    MediaStopped,
    /// The call's thread panics at its first answered turn (the worker reports it failed).
    CallPanics,
    /// The worker's connection dropped mid-call (it registers again).
    WorkerDropped,
}

/// The faults in the order calls get them, round and round.
pub const SCHEDULE: [Fault; 5] = [
    Fault::None,
    Fault::SignalDropped,
    Fault::MediaStopped,
    Fault::CallPanics,
    Fault::WorkerDropped,
];

/// The fault of call number `n` (0, 1, …).
pub fn fault_of(n: usize) -> Fault {
    SCHEDULE[n % SCHEDULE.len()]
}

/// One call of the soak, as it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakCall {
    pub room: String,
    pub fault: Fault,
    /// Turns the agent's detector ended (each must have a record).
    pub turns_ended: usize,
    /// The turns its record on disk holds.
    pub recorded: Vec<TurnRecord>,
    /// How the call ended, as the worker reported it (its `CallEnd`, or its failure).
    pub ended: String,
    /// The worker reported the call failed.
    pub failed: bool,
    /// The fault's effect was seen (a resume, a hang-up for stopped media, a failure
    /// reported for the panic, a new registration for the dropped worker).
    pub fault_seen: bool,
}

/// A sample of the process.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ProcessSample {
    pub at_s: f64,
    pub rss_mb: f64,
    pub fds: usize,
    pub threads: usize,
    /// WebRTC peer connections not yet freed (the agent's and the test server's).
    #[serde(default)]
    pub peer_connections: usize,
    /// glibc's arena chunks in use, MB (large blocks mapped on their own left out: a call
    /// maps and unmaps ~2 GB of them, mostly never touched): resident memory growing
    /// while this stays level is memory the allocator keeps, not memory the program holds.
    #[serde(default)]
    pub heap_in_use_mb: Option<f64>,
    /// glibc's arena chunks freed but kept, MB.
    #[serde(default)]
    pub heap_free_kept_mb: Option<f64>,
    /// Each part's large heap blocks, MB resident (`sublet-heap`): which part holds what
    /// resident memory gains.
    #[serde(default)]
    pub parts_resident_mb: Option<PartsMb>,
}

/// A figure for each part of the program that holds large heap blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PartsMb {
    pub engine: f64,
    pub whisper: f64,
    pub turn_detector: f64,
    pub voice: f64,
    pub other: f64,
}

impl PartsMb {
    /// Each part's large blocks now, MB resident; `None` unless malloc is interposed.
    pub fn now() -> Option<Self> {
        use sublet_heap::Owner;
        let blocks = sublet_heap::large_blocks()?;
        let mb = |owner| blocks.of(owner).resident as f64 / (1024.0 * 1024.0);
        Some(Self {
            engine: mb(Owner::Engine),
            whisper: mb(Owner::Whisper),
            turn_detector: mb(Owner::TurnDetector),
            voice: mb(Owner::Voice),
            other: mb(Owner::Other),
        })
    }
}

/// What a soak adds up to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakFigures {
    pub calls: usize,
    pub turns_ended: usize,
    /// Recorded turns by outcome.
    pub outcomes: BTreeMap<String, usize>,
    /// Turns ended with no record on disk.
    pub turns_lost: usize,
    /// Faults injected and seen to take effect with the worker going on, by fault.
    pub faults_injected: BTreeMap<String, usize>,
    pub faults_survived: BTreeMap<String, usize>,
    /// Resident memory's slope after warm-up, MB a minute (least squares).
    pub rss_slope_mb_per_min: Option<f64>,
    /// The arenas' chunks in use: their slope after warm-up, MB a minute: level while resident memory
    /// climbs means the allocator keeps freed memory; climbing with it, the program holds more.
    #[serde(default)]
    pub heap_slope_mb_per_min: Option<f64>,
    /// Each part's resident large blocks: their slope after warm-up, MB a minute.
    #[serde(default)]
    pub parts_slope_mb_per_min: Option<PartsMb>,
    /// The least resident memory in each five minutes after warm-up, MB: a leak lifts it
    /// call after call, where the swings of the agents' sessions only move the highs.
    #[serde(default)]
    pub rss_lows_mb: Vec<f64>,
    pub rss_first_mb: Option<f64>,
    pub rss_last_mb: Option<f64>,
    pub fds_min_max: Option<(usize, usize)>,
    pub threads_min_max: Option<(usize, usize)>,
    /// WebRTC peer connections not yet freed: first and last sample.
    #[serde(default)]
    pub peer_connections_first_last: Option<(usize, usize)>,
}

/// The span of each window whose least resident memory [`SoakFigures::rss_lows_mb`] keeps.
const LOW_WINDOW_S: f64 = 300.0;

/// The figures from the calls and the samples; samples before `warm_up_s` are left out of
/// the memory slope.
pub fn figures(calls: &[SoakCall], samples: &[ProcessSample], warm_up_s: f64) -> SoakFigures {
    let mut outcomes = BTreeMap::new();
    let mut faults_injected = BTreeMap::new();
    let mut faults_survived = BTreeMap::new();
    let mut turns_lost = 0;
    for call in calls {
        for turn in &call.recorded {
            *outcomes.entry(name(&turn.outcome)).or_insert(0) += 1;
        }
        turns_lost += call.turns_ended.saturating_sub(call.recorded.len());
        if call.fault != Fault::None {
            *faults_injected.entry(name(&call.fault)).or_insert(0) += 1;
            if call.fault_seen {
                *faults_survived.entry(name(&call.fault)).or_insert(0) += 1;
            }
        }
    }
    let warm = samples.iter().filter(|s| s.at_s >= warm_up_s);
    let rss: Vec<(f64, f64)> = warm.clone().map(|s| (s.at_s / 60.0, s.rss_mb)).collect();
    let heap: Vec<(f64, f64)> = warm
        .clone()
        .filter_map(|s| Some((s.at_s / 60.0, s.heap_in_use_mb?)))
        .collect();
    let parts: Vec<(f64, PartsMb)> = warm
        .clone()
        .filter_map(|s| Some((s.at_s / 60.0, s.parts_resident_mb?)))
        .collect();
    let part_slope = |part: fn(&PartsMb) -> f64| {
        slope(&parts.iter().map(|(t, p)| (*t, part(p))).collect::<Vec<_>>())
    };
    let parts_slope = (|| {
        Some(PartsMb {
            engine: part_slope(|p| p.engine)?,
            whisper: part_slope(|p| p.whisper)?,
            turn_detector: part_slope(|p| p.turn_detector)?,
            voice: part_slope(|p| p.voice)?,
            other: part_slope(|p| p.other)?,
        })
    })();
    let mut rss_lows_mb: Vec<f64> = Vec::new();
    for s in warm {
        let window = ((s.at_s - warm_up_s) / LOW_WINDOW_S) as usize;
        if rss_lows_mb.len() <= window {
            rss_lows_mb.resize(window + 1, f64::INFINITY);
        }
        rss_lows_mb[window] = rss_lows_mb[window].min(s.rss_mb);
    }
    rss_lows_mb.retain(|v| v.is_finite());
    let min_max = |values: Vec<usize>| Some((*values.iter().min()?, *values.iter().max()?));
    SoakFigures {
        calls: calls.len(),
        turns_ended: calls.iter().map(|c| c.turns_ended).sum(),
        outcomes,
        turns_lost,
        faults_injected,
        faults_survived,
        rss_slope_mb_per_min: slope(&rss),
        heap_slope_mb_per_min: slope(&heap),
        parts_slope_mb_per_min: parts_slope,
        rss_lows_mb,
        rss_first_mb: samples.first().map(|s| s.rss_mb),
        rss_last_mb: samples.last().map(|s| s.rss_mb),
        fds_min_max: min_max(samples.iter().map(|s| s.fds).collect()),
        threads_min_max: min_max(samples.iter().map(|s| s.threads).collect()),
        peer_connections_first_last: samples
            .first()
            .zip(samples.last())
            .map(|(a, b)| (a.peer_connections, b.peer_connections)),
    }
}

/// The least-squares slope of y over x; `None` with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
}

/// A value's name as the report writes it (its serde name).
fn name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sublet_agent::TurnOutcome;

    fn turn(outcome: TurnOutcome) -> TurnRecord {
        let mut turn: TurnRecord = serde_json::from_value(serde_json::json!({
            "index": 1, "transcript": "hi", "reply": "hello", "caller_stop_s": 1.0,
            "end_of_turn_s": 1.5, "transcript_s": 1.5, "first_token_s": 1.6,
            "first_sentence_s": 1.7, "first_audio_s": 1.8, "end_of_turn_score": 0.9
        }))
        .unwrap();
        turn.outcome = outcome;
        turn
    }

    #[test]
    fn the_figures_count_lost_turns_faults_and_the_memory_slope() {
        let call = |fault, ended, recorded: Vec<TurnRecord>, seen| SoakCall {
            room: "r".into(),
            fault,
            turns_ended: ended,
            recorded,
            ended: String::new(),
            failed: false,
            fault_seen: seen,
        };
        let calls = [
            call(
                Fault::None,
                3,
                vec![
                    turn(TurnOutcome::Answered),
                    turn(TurnOutcome::EngineFailed),
                    turn(TurnOutcome::Answered),
                ],
                false,
            ),
            // One turn ended with no record: lost.
            call(
                Fault::CallPanics,
                2,
                vec![turn(TurnOutcome::Answered)],
                true,
            ),
            call(
                Fault::MediaStopped,
                1,
                vec![turn(TurnOutcome::Answered)],
                false,
            ),
        ];
        // 60 MB a minute during warm-up, flat after.
        let samples: Vec<ProcessSample> = (0..20)
            .map(|i| ProcessSample {
                at_s: i as f64 * 30.0,
                rss_mb: 100.0 + (i.min(4) as f64) * 30.0,
                fds: 40 + i % 3,
                threads: 30,
                peer_connections: 2,
                heap_in_use_mb: Some(80.0 + (i.min(4) as f64) * 20.0),
                heap_free_kept_mb: Some(10.0),
                // The engine's blocks flat; Whisper's grow 2 MB a minute throughout.
                parts_resident_mb: Some(PartsMb {
                    engine: 300.0,
                    whisper: 100.0 + i as f64,
                    ..PartsMb::default()
                }),
            })
            .collect();
        let f = figures(&calls, &samples, 120.0);
        assert_eq!((f.calls, f.turns_ended, f.turns_lost), (3, 6, 1));
        assert_eq!(f.outcomes["answered"], 4);
        assert_eq!(f.outcomes["engine_failed"], 1);
        assert_eq!(f.faults_injected["call_panics"], 1);
        assert_eq!(f.faults_survived.get("call_panics"), Some(&1));
        assert_eq!(f.faults_survived.get("media_stopped"), None);
        assert!(f.rss_slope_mb_per_min.unwrap().abs() < 1e-9, "{f:?}");
        assert!(f.heap_slope_mb_per_min.unwrap().abs() < 1e-9, "{f:?}");
        let parts = f.parts_slope_mb_per_min.unwrap();
        assert!(
            parts.engine.abs() < 1e-9 && (parts.whisper - 2.0).abs() < 1e-9,
            "{parts:?}"
        );
        // Samples from 120 s to 570 s: the windows from 120 s and from 420 s.
        assert_eq!(f.rss_lows_mb, vec![220.0, 220.0]);
        assert_eq!(f.fds_min_max, Some((40, 42)));
        assert_eq!(fault_of(3), Fault::CallPanics);
        assert!((slope(&[(0.0, 1.0), (1.0, 3.0)]).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 1.0)]), None);
    }
}
