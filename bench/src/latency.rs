//! The latency benchmark's figures (pure): from each played call's turn records, its ends
//! of turn and its script, what a caller feels — voice to voice and each stage's share,
//! turns cut off mid-sentence, turns answered late or never, and what the replies sound
//! like (looping, echoing the caller, length).

use serde::{Deserialize, Serialize};
use sublet_agent::{TurnRecord, STAGE_NAMES};

use crate::stats::percentile;
use crate::test_callers::ScriptedTurn;

/// Voice to voice past this is a late turn: the caller notices the wait.
pub const LATE_S: f64 = 1.5;
/// A stop detected this close to a turn's scripted end is the turn's end (the VAD's frame
/// and the trimmed speech's last sound differ by a little).
const END_SLACK_S: f64 = 0.35;

/// One call as played under one configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlayedCall {
    pub call: String,
    pub script: Vec<ScriptedTurn>,
    pub turns: Vec<TurnRecord>,
    /// Every end of turn the detector decided, in call time (answered or not).
    pub ends_of_turn_s: Vec<f64>,
    /// When the speech began of each time the agent was talked over, in call time.
    #[serde(default)]
    pub interruptions_s: Vec<f64>,
}

/// The p50 and p95 of one quantity, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub p50: f64,
    pub p95: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Self> {
        (!values.is_empty()).then(|| Self {
            p50: percentile(values, 50.0),
            p95: percentile(values, 95.0),
        })
    }
}

/// What the replies sounded like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyFigures {
    pub replies: usize,
    pub median_words: f64,
    /// Replies with some three-word phrase three or more times (a loop).
    pub looping: usize,
    /// Replies with some four-word phrase twice or more.
    pub repeated_phrase: usize,
    /// Replies that say most of the caller's turn back to them.
    pub echoing: usize,
}

/// One configuration's figures over all its calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyFigures {
    /// Scripted turns, and the pauses inside them.
    pub scripted_turns: usize,
    pub mid_turn_pauses: usize,
    /// Turns answered at their end (the ones the latencies are over).
    pub answered: usize,
    /// Ends of turn decided while the caller was still inside a scripted turn.
    pub false_cut_offs: usize,
    /// Answered turns whose voice to voice was over [`LATE_S`].
    pub late_turns: usize,
    /// Scripted turns with no answer at their end.
    pub missed: usize,
    /// Turns the agent took that end no scripted turn and fall in none (someone else's
    /// words, or noise, taken for the caller's).
    #[serde(default)]
    pub extra_turns: usize,
    /// Times the agent was talked over by speech that was not the caller's (outside every
    /// scripted turn: its own echo, a voice behind).
    #[serde(default)]
    pub self_interruptions: usize,
    /// Answered turns whose reply was started at the stop, and those of them whose first
    /// sentence was already synthesized when the turn ended.
    #[serde(default)]
    pub preemptive: usize,
    #[serde(default)]
    pub opening_ahead: usize,
    /// Answered turns whose transcript was started before the stop was certain.
    #[serde(default)]
    pub transcript_ahead: usize,
    pub voice_to_voice: Option<Spread>,
    /// The answered turns' transcripts against their scripts: the mean word error rate.
    #[serde(default)]
    pub word_error_rate: Option<f64>,
    /// Each stage of [`STAGE_NAMES`], measured from the one before.
    pub stages: Vec<(String, Option<Spread>)>,
    pub replies: ReplyFigures,
}

/// The figures of `calls`.
pub fn figures(calls: &[PlayedCall]) -> LatencyFigures {
    let mut answered: Vec<&TurnRecord> = Vec::new();
    let mut errors: Vec<f64> = Vec::new();
    let mut false_cut_offs = 0;
    let mut missed = 0;
    for call in calls {
        false_cut_offs += call
            .ends_of_turn_s
            .iter()
            .filter(|&&t| inside_a_turn(&call.script, t))
            .count();
        for scripted in &call.script {
            // A failed turn (its fallback said) is a missed one.
            let at_end = call.turns.iter().find(|r| {
                r.outcome.answered()
                    && r.caller_stop_s >= scripted.end_s - END_SLACK_S
                    && r.caller_stop_s <= scripted.end_s + END_SLACK_S
            });
            match at_end {
                Some(record) => {
                    answered.push(record);
                    errors.push(sublet_stt::word_error_rate(
                        &scripted.text,
                        &record.transcript,
                    ));
                }
                None => missed += 1,
            }
        }
    }
    // Turns taken outside every scripted turn (one inside a turn is a false cut-off).
    let extra_turns = calls
        .iter()
        .flat_map(|call| {
            call.turns.iter().filter(|r| {
                let t = r.caller_stop_s;
                !call
                    .script
                    .iter()
                    .any(|turn| t > turn.start_s - END_SLACK_S && t < turn.end_s + END_SLACK_S)
            })
        })
        .count();
    let self_interruptions = calls
        .iter()
        .flat_map(|call| {
            call.interruptions_s.iter().filter(|&&t| {
                !call
                    .script
                    .iter()
                    .any(|turn| t > turn.start_s - END_SLACK_S && t < turn.end_s)
            })
        })
        .count();
    let v2v: Vec<f64> = answered.iter().map(|r| r.voice_to_voice_s()).collect();
    let stages = STAGE_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let values: Vec<f64> = answered.iter().map(|r| r.stage_latencies()[i]).collect();
            (name.to_string(), Spread::of(&values))
        })
        .collect();
    let all_replies: Vec<(&str, &str)> = calls
        .iter()
        .flat_map(|c| c.turns.iter())
        .map(|r| (r.transcript.as_str(), r.reply.as_str()))
        .collect();
    LatencyFigures {
        scripted_turns: calls.iter().map(|c| c.script.len()).sum(),
        mid_turn_pauses: calls
            .iter()
            .flat_map(|c| &c.script)
            .map(|t| t.pauses.len())
            .sum(),
        answered: answered.len(),
        false_cut_offs,
        late_turns: v2v.iter().filter(|&&v| v > LATE_S).count(),
        missed,
        extra_turns,
        self_interruptions,
        preemptive: answered.iter().filter(|r| r.preemptive).count(),
        opening_ahead: answered.iter().filter(|r| r.opening_ahead).count(),
        transcript_ahead: answered.iter().filter(|r| r.transcript_ahead).count(),
        voice_to_voice: Spread::of(&v2v),
        word_error_rate: (!errors.is_empty())
            .then(|| errors.iter().sum::<f64>() / errors.len() as f64),
        stages,
        replies: reply_figures(&all_replies),
    }
}

/// The agent's call clock against the script's, for a call through a room: the agent's
/// clock starts with the first audio it received, somewhere after the caller began. The
/// median, over the turns it answered, of its stop less the nearest scripted end (0 when
/// it answered none).
pub fn clock_offset_s(script: &[ScriptedTurn], turns: &[TurnRecord]) -> f64 {
    let offsets: Vec<f64> = turns
        .iter()
        .filter_map(|record| {
            script
                .iter()
                .map(|t| record.caller_stop_s - t.end_s)
                .min_by(|a, b| a.abs().total_cmp(&b.abs()))
        })
        .collect();
    if offsets.is_empty() {
        return 0.0;
    }
    percentile(&offsets, 50.0)
}

/// `call` on the script's clock: every time in it less `offset_s`.
pub fn on_script_clock(mut call: PlayedCall, offset_s: f64) -> PlayedCall {
    for t in call
        .ends_of_turn_s
        .iter_mut()
        .chain(call.interruptions_s.iter_mut())
    {
        *t -= offset_s;
    }
    for r in &mut call.turns {
        for t in [
            &mut r.caller_stop_s,
            &mut r.end_of_turn_s,
            &mut r.transcript_s,
            &mut r.first_token_s,
            &mut r.first_sentence_s,
            &mut r.first_audio_s,
        ] {
            *t -= offset_s;
        }
    }
    call
}

/// What the caller heard of one call through a room: when reply audio began, on the
/// script's clock (the caller's own).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeardCall {
    pub script: Vec<ScriptedTurn>,
    pub onsets_s: Vec<f64>,
}

/// Voice to voice as the caller heard it, for each scripted turn: its end to the first
/// onset after it and before the next turn begins (`None`: no answer heard).
pub fn heard_voice_to_voice(call: &HeardCall) -> Vec<Option<f64>> {
    call.script
        .iter()
        .enumerate()
        .map(|(i, turn)| {
            let next_start = call.script.get(i + 1).map_or(f64::INFINITY, |t| t.start_s);
            call.onsets_s
                .iter()
                .find(|&&at| at > turn.end_s && at < next_start)
                .map(|at| at - turn.end_s)
        })
        .collect()
}

/// The caller's side of calls through a room.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeardFigures {
    pub scripted_turns: usize,
    /// Scripted turns the caller heard an answer to.
    pub answered: usize,
    pub voice_to_voice: Option<Spread>,
    /// Answers heard more than [`LATE_S`] after the turn's end.
    pub late_turns: usize,
}

pub fn heard_figures(calls: &[HeardCall]) -> HeardFigures {
    let all: Vec<Option<f64>> = calls.iter().flat_map(heard_voice_to_voice).collect();
    let heard: Vec<f64> = all.iter().flatten().copied().collect();
    HeardFigures {
        scripted_turns: all.len(),
        answered: heard.len(),
        voice_to_voice: Spread::of(&heard),
        late_turns: heard.iter().filter(|&&v| v > LATE_S).count(),
    }
}

/// What a turn detector alone made of a call (no agent): its ends of turn against the
/// script, by the rules [`figures`] counts answered turns with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DetectedTurns {
    /// Scripted turns with an end of turn at their end.
    pub at_end: usize,
    /// Scripted turns with none.
    pub missed: usize,
    /// Ends of turn decided while the caller had not finished.
    pub cut_offs: usize,
    /// Ends of turn of speech outside every scripted turn.
    pub extra: usize,
}

impl DetectedTurns {
    /// `ends`: each end of turn's (end of its speech, when it was decided), in seconds.
    pub fn of(script: &[ScriptedTurn], ends: &[(f64, f64)]) -> Self {
        let near = |t: f64, at: f64| t >= at - END_SLACK_S && t <= at + END_SLACK_S;
        let at_end = script
            .iter()
            .filter(|turn| {
                ends.iter()
                    .any(|&(speech_end, _)| near(speech_end, turn.end_s))
            })
            .count();
        Self {
            at_end,
            missed: script.len() - at_end,
            cut_offs: ends
                .iter()
                .filter(|&&(_, decided)| inside_a_turn(script, decided))
                .count(),
            extra: ends
                .iter()
                .filter(|&&(speech_end, _)| {
                    !script.iter().any(|turn| {
                        speech_end > turn.start_s - END_SLACK_S
                            && speech_end < turn.end_s + END_SLACK_S
                    })
                })
                .count(),
        }
    }

    pub fn and(self, other: Self) -> Self {
        Self {
            at_end: self.at_end + other.at_end,
            missed: self.missed + other.missed,
            cut_offs: self.cut_offs + other.cut_offs,
            extra: self.extra + other.extra,
        }
    }
}

/// Whether `t` falls inside a scripted turn, before its end: the caller had not finished.
fn inside_a_turn(script: &[ScriptedTurn], t: f64) -> bool {
    script
        .iter()
        .any(|turn| t > turn.start_s && t < turn.end_s - END_SLACK_S)
}

/// Replies' figures; each is `(what the caller said, the reply)`.
pub fn reply_figures(replies: &[(&str, &str)]) -> ReplyFigures {
    let lengths: Vec<f64> = replies
        .iter()
        .map(|(_, reply)| words(reply).len() as f64)
        .collect();
    ReplyFigures {
        replies: replies.len(),
        median_words: percentile(&lengths, 50.0),
        looping: replies
            .iter()
            .filter(|(_, r)| most_repeated(&words(r), 3) >= 3)
            .count(),
        repeated_phrase: replies
            .iter()
            .filter(|(_, r)| most_repeated(&words(r), 4) >= 2)
            .count(),
        echoing: replies.iter().filter(|(c, r)| echoes(c, r)).count(),
    }
}

/// The text's words as the reply limit compares them.
fn words(text: &str) -> Vec<String> {
    sublet_agent::sentence::words(text).collect()
}

/// How often the most frequent run of `n` words occurs.
fn most_repeated(words: &[String], n: usize) -> usize {
    let mut counts = std::collections::HashMap::new();
    for run in words.windows(n) {
        *counts.entry(run).or_insert(0usize) += 1;
    }
    counts.into_values().max().unwrap_or(0)
}

/// The reply says back a run of the caller's words that is most of what they said (at
/// least five words in a row, and 70% of theirs): "The capital of Japan is Tokyo" answers
/// "What is the capital of Japan?", it does not echo it.
fn echoes(caller: &str, reply: &str) -> bool {
    let (caller, reply) = (words(caller), words(reply));
    let needed = 5.max((caller.len() as f64 * 0.7).ceil() as usize);
    (needed..=caller.len()).any(|n| {
        caller
            .windows(n)
            .any(|run| reply.windows(n).any(|other| other == run))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripted(start_s: f64, end_s: f64, pauses: Vec<(f64, f64)>) -> ScriptedTurn {
        ScriptedTurn {
            text: "I would like to order a large pizza with mushrooms.".into(),
            start_s,
            end_s,
            pauses,
        }
    }

    #[test]
    fn a_detectors_ends_of_turn_are_counted_against_the_script() {
        let script = [scripted(1.0, 4.0, vec![]), scripted(10.0, 12.0, vec![])];
        // At the first turn's end; a cut-off inside the second, then its real end; one of
        // someone else's words between them.
        let ends = [(4.1, 4.6), (10.8, 11.2), (12.0, 12.5), (7.0, 7.5)];
        let counted = DetectedTurns::of(&script, &ends);
        assert_eq!(
            counted,
            DetectedTurns {
                at_end: 2,
                missed: 0,
                cut_offs: 1,
                extra: 1,
            }
        );
        let none = DetectedTurns::of(&script, &[]);
        assert_eq!((none.missed, none.and(counted).at_end), (2, 2));
    }

    fn record(caller_stop_s: f64, v2v: f64) -> TurnRecord {
        TurnRecord {
            index: 1,
            transcript: "I would like to order a large pizza with mushrooms.".into(),
            reply: "Sure, one large mushroom pizza.".into(),
            caller_stop_s,
            end_of_turn_s: caller_stop_s + 0.5,
            transcript_s: caller_stop_s + 0.5,
            first_token_s: caller_stop_s + 0.6,
            first_sentence_s: caller_stop_s + 0.7,
            first_audio_s: caller_stop_s + v2v,
            reply_gap_s: 0.0,
            end_of_turn_score: Some(0.9),
            preemptive: false,
            preemptive_discarded: 0,
            opening_ahead: false,
            transcript_ahead: false,
            transcripts_called_off: 0,
            capped: false,
            outcome: sublet_agent::TurnOutcome::Answered,
            error: None,
        }
    }

    #[test]
    fn the_caller_hears_each_turn_answered_at_the_first_onset_after_its_end() {
        let call = HeardCall {
            script: vec![scripted(1.0, 4.0, vec![]), scripted(10.0, 12.0, vec![])],
            // An onset inside the first turn (the agent talking over it) is not its
            // answer; its second sentence (6.0) is not a turn's answer either; the second
            // turn is never answered.
            onsets_s: vec![3.0, 4.9, 6.0],
        };
        let v2v = heard_voice_to_voice(&call);
        assert_eq!(v2v.len(), 2);
        assert!((v2v[0].unwrap() - 0.9).abs() < 1e-9, "{v2v:?}");
        assert_eq!(v2v[1], None);
        let figures = heard_figures(&[call]);
        assert_eq!((figures.scripted_turns, figures.answered), (2, 1));
        assert_eq!(figures.late_turns, 0);
    }

    #[test]
    fn an_agents_clock_is_put_on_the_scripts() {
        let script = vec![scripted(1.0, 4.0, vec![]), scripted(10.0, 12.0, vec![])];
        // The agent heard the caller from 0.8 s into the call: its times run 0.8 s early.
        let turns = vec![record(3.25, 1.0), record(11.2, 1.0)];
        let offset = clock_offset_s(&script, &turns);
        assert!((offset + 0.8).abs() < 1e-9, "{offset}");
        let call = PlayedCall {
            call: "c".into(),
            script: script.clone(),
            turns,
            ends_of_turn_s: vec![3.75, 11.7],
            interruptions_s: vec![],
        };
        let shifted = on_script_clock(call, offset);
        assert!((shifted.turns[1].caller_stop_s - 12.0).abs() < 1e-9);
        assert!((shifted.ends_of_turn_s[0] - 4.55).abs() < 1e-9);
        // Voice to voice is a difference on one clock: unchanged.
        assert!((shifted.turns[0].voice_to_voice_s() - 1.0).abs() < 1e-9);
        let figures = figures(&[shifted]);
        assert_eq!((figures.answered, figures.false_cut_offs), (2, 0));
    }

    #[test]
    fn an_end_of_turn_in_a_pause_is_a_false_cut_off() {
        let script = vec![scripted(1.0, 4.0, vec![(2.0, 3.0)])];
        let call = PlayedCall {
            call: "c".into(),
            script: script.clone(),
            // Cut off in the pause (answered), then the whole turn answered late.
            turns: vec![record(2.0, 0.9), record(4.05, 1.8)],
            ends_of_turn_s: vec![2.5, 4.6],
            interruptions_s: vec![],
        };
        let f = figures(&[call]);
        assert_eq!(f.false_cut_offs, 1);
        assert_eq!(f.answered, 1);
        assert_eq!(f.late_turns, 1);
        assert_eq!(f.missed, 0);
        assert_eq!(f.mid_turn_pauses, 1);
        let v2v = f.voice_to_voice.unwrap();
        assert!((v2v.p50 - 1.8).abs() < 1e-9);
        // The same call decided only at the turn's end: no cut-off.
        let call = PlayedCall {
            call: "c".into(),
            script,
            turns: vec![record(4.05, 0.9)],
            ends_of_turn_s: vec![4.6],
            interruptions_s: vec![],
        };
        let f = figures(std::slice::from_ref(&call));
        assert_eq!((f.false_cut_offs, f.late_turns), (0, 0));
        assert_eq!(f.self_interruptions, 0);
        // Talked over inside the caller's turn (them), and in the quiet after it (not them).
        let talked_over = PlayedCall {
            interruptions_s: vec![call.script[0].start_s + 0.5, call.script[0].end_s + 1.0],
            ..call
        };
        assert_eq!(figures(&[talked_over]).self_interruptions, 1);
    }

    #[test]
    fn a_turn_never_answered_at_its_end_is_missed() {
        let call = PlayedCall {
            call: "c".into(),
            script: vec![scripted(1.0, 4.0, vec![]), scripted(10.0, 12.0, vec![])],
            turns: vec![record(4.1, 0.8), record(7.0, 0.8)],
            ends_of_turn_s: vec![4.6, 7.5],
            interruptions_s: vec![],
        };
        let f = figures(&[call]);
        assert_eq!((f.answered, f.missed), (1, 1));
        // The turn at 7 s, between the caller's two, was someone else's.
        assert_eq!(f.extra_turns, 1);
    }

    #[test]
    fn loops_repeats_and_echoes_are_counted() {
        let looped = "You can say this message to anyone. You can say this message to \
                      anyone. You can say this message to anyone.";
        let f = reply_figures(&[
            ("Hello.", looped),
            (
                "What is the capital of Japan?",
                "The capital of Japan is Tokyo.",
            ),
            (
                "I need to call my sister and then book a taxi.",
                "You need to call my sister and then book a taxi, I see.",
            ),
        ]);
        assert_eq!(f.replies, 3);
        assert_eq!(f.looping, 1);
        assert_eq!(f.repeated_phrase, 1);
        // Only the third says the caller's words back.
        assert_eq!(f.echoing, 1);
        assert_eq!(f.median_words, 13.0);
    }
}
