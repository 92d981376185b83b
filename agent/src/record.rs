//! What one turn took, stage by stage, and the table the demos print.

use serde::{Deserialize, Serialize};

/// One caller turn and the agent's reply. Times are seconds from the start of the call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub index: usize,
    /// What the caller said, as transcribed.
    pub transcript: String,
    /// What the agent said.
    pub reply: String,
    /// The caller stopped speaking (end of their last speech frame).
    pub caller_stop_s: f64,
    /// The turn was judged over.
    pub end_of_turn_s: f64,
    /// The final transcript was ready.
    pub transcript_s: f64,
    /// The engine streamed the reply's first token.
    pub first_token_s: f64,
    /// The reply's first complete sentence existed.
    pub first_sentence_s: f64,
    /// The first audio of the reply went out.
    pub first_audio_s: f64,
    /// The longest silence inside the reply: a sentence had played out and the next was
    /// not ready (0: none, or not measured where nothing played the reply in real time).
    #[serde(default)]
    pub reply_gap_s: f64,
    /// Smart Turn's score when the caller stopped.
    pub end_of_turn_score: Option<f32>,
    /// The reply given was started as the caller stopped speaking, before the end of their
    /// turn was certain (preemptive generation).
    #[serde(default)]
    pub preemptive: bool,
    /// Replies started that way during the turn and cancelled because the caller went on.
    #[serde(default)]
    pub preemptive_discarded: usize,
    /// The reply given opened with a sentence synthesized before the turn ended.
    #[serde(default)]
    pub opening_ahead: bool,
    /// The turn's transcript was started before the caller's stop was certain (at a short
    /// quiet), so it was made beside Smart Turn's score rather than after it.
    #[serde(default)]
    pub transcript_ahead: bool,
    /// Transcripts started at shorter quiets in the turn and called off because the caller
    /// went on speaking.
    #[serde(default)]
    pub transcripts_called_off: usize,
    /// The caller was still speaking at the turn cap (`EndpointConfig::max_turn_s`): the
    /// turn was ended there and answered, and what they said after it is the next turn.
    #[serde(default)]
    pub capped: bool,
    /// Whether the caller got the reply, or what failed instead (then `reply` is the
    /// fallback phrase, or what was said before the failure).
    #[serde(default)]
    pub outcome: TurnOutcome,
    /// The failure's message, for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a turn ended for the caller. A failed turn is the turn's alone: the agent says its
/// fallback phrase (when nothing of the reply was said yet) and the call goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The reply was spoken.
    #[default]
    Answered,
    /// The reply's first sentence was not ready by the deadline
    /// (`AgentConfig::reply_deadline_s`): its request was cancelled.
    Late,
    /// The transcriber failed on the turn's audio.
    TranscriptFailed,
    /// The engine refused the request or failed during the reply.
    EngineFailed,
    /// The reply's speech could not be synthesized.
    SpeechFailed,
}

impl TurnOutcome {
    pub fn answered(self) -> bool {
        self == TurnOutcome::Answered
    }
}

impl TurnRecord {
    /// Caller stop to first audio: what the caller waits.
    pub fn voice_to_voice_s(&self) -> f64 {
        self.first_audio_s - self.caller_stop_s
    }

    /// The stage times in pipeline order.
    pub fn stage_times(&self) -> [f64; 6] {
        [
            self.caller_stop_s,
            self.end_of_turn_s,
            self.transcript_s,
            self.first_token_s,
            self.first_sentence_s,
            self.first_audio_s,
        ]
    }

    /// Each stage's own latency: end of turn, transcript, first token, first sentence,
    /// first audio, each measured from the stage before.
    pub fn stage_latencies(&self) -> [f64; 5] {
        let t = self.stage_times();
        [
            t[1] - t[0],
            t[2] - t[1],
            t[3] - t[2],
            t[4] - t[3],
            t[5] - t[4],
        ]
    }
}

pub const STAGE_NAMES: [&str; 5] = [
    "end of turn",
    "transcript",
    "first token",
    "first sentence",
    "first audio",
];

/// The median of each stage's latency and of voice-to-voice, over some turns.
pub fn stage_medians(turns: &[TurnRecord]) -> Option<([f64; 5], f64)> {
    if turns.is_empty() {
        return None;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let mut stages = [0.0; 5];
    for (i, s) in stages.iter_mut().enumerate() {
        *s = median(turns.iter().map(|t| t.stage_latencies()[i]).collect());
    }
    Some((
        stages,
        median(turns.iter().map(TurnRecord::voice_to_voice_s).collect()),
    ))
}

/// A plain-text table: one row per turn with each stage's latency in milliseconds, then
/// the medians.
pub fn turn_table(turns: &[TurnRecord]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:>4} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>8}  {}\n",
        "turn",
        "stop(s)",
        "eot",
        "transcript",
        "1st tok",
        "1st sent",
        "1st audio",
        "v2v",
        "caller → agent"
    ));
    let row = |label: String, stop: String, l: [f64; 5], v2v: f64, text: String| {
        format!(
            "{label:>4} {stop:>8} {:>7.0} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>8.0}  {text}\n",
            l[0] * 1e3,
            l[1] * 1e3,
            l[2] * 1e3,
            l[3] * 1e3,
            l[4] * 1e3,
            v2v * 1e3
        )
    };
    for t in turns {
        let failure = match t.outcome {
            TurnOutcome::Answered => String::new(),
            outcome => format!(" ({outcome:?})"),
        } + if t.capped { " (capped)" } else { "" };
        out.push_str(&row(
            t.index.to_string(),
            format!("{:.2}", t.caller_stop_s),
            t.stage_latencies(),
            t.voice_to_voice_s(),
            format!(
                "{:?} → {:?}{failure}",
                clip(&t.transcript, 40),
                clip(&t.reply, 60)
            ),
        ));
    }
    let answered: Vec<TurnRecord> = turns
        .iter()
        .filter(|t| t.outcome.answered())
        .cloned()
        .collect();
    if let Some((medians, v2v)) = stage_medians(&answered) {
        out.push_str(&row(
            "p50".into(),
            String::new(),
            medians,
            v2v,
            "(ms; each stage from the one before)".into(),
        ));
    }
    out
}

/// `s` cut to its first `n` characters, with "…" when anything was cut (a table cell).
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(stop: f64) -> TurnRecord {
        TurnRecord {
            index: 1,
            transcript: "hi".into(),
            reply: "hello".into(),
            caller_stop_s: stop,
            end_of_turn_s: stop + 0.5,
            transcript_s: stop + 0.7,
            first_token_s: stop + 1.0,
            first_sentence_s: stop + 1.5,
            first_audio_s: stop + 1.75,
            reply_gap_s: 0.0,
            end_of_turn_score: Some(0.9),
            preemptive: false,
            preemptive_discarded: 0,
            opening_ahead: false,
            transcript_ahead: false,
            transcripts_called_off: 0,
            capped: false,
            outcome: TurnOutcome::Answered,
            error: None,
        }
    }

    #[test]
    fn latencies_and_medians() {
        let t = turn(2.0);
        let l = t.stage_latencies();
        assert!((l[0] - 0.5).abs() < 1e-9 && (l[4] - 0.25).abs() < 1e-9);
        assert!((t.voice_to_voice_s() - 1.75).abs() < 1e-9);
        let (m, v2v) = stage_medians(&[turn(1.0), turn(5.0), turn(9.0)]).unwrap();
        assert!((m[2] - 0.3).abs() < 1e-9 && (v2v - 1.75).abs() < 1e-9);
        assert!(turn_table(std::slice::from_ref(&t)).contains("1750"));
        // A failed turn is shown as such and left out of the medians.
        let late = TurnRecord {
            outcome: TurnOutcome::Late,
            first_audio_s: 60.0,
            ..turn(1.0)
        };
        let table = turn_table(&[t, late]);
        assert!(table.contains("(Late)") && table.lines().last().unwrap().contains("1750"));
    }
}
