//! What the agent heard and said, scored: scripted multi-turn calls in the project's own
//! voices (a booking whose date is corrected and whose reference is read back, numbers, a
//! question of fact, an off-topic request, a greeting), each reply judged by what it must
//! and must not contain, the transcripts by their word error rate. Pure: the `quality`
//! binary plays the calls through the agent and hands the turns here.

use serde::Serialize;

use crate::test_callers::{Script, Speaker};

/// What a turn's reply is judged on.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judged {
    /// A detail the caller gave earlier in the call, to be kept (a corrected date, a
    /// reference read back).
    Detail,
    /// A question of fact.
    Fact,
    /// How it answers (no forbidden words); nothing it must say.
    Manner,
}

/// A turn's expectations: each group in `must` is satisfied by any one of its phrases
/// (case-insensitive); no phrase of `must_not` may appear.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub judged: Judged,
    pub must: &'static [&'static [&'static str]],
    pub must_not: &'static [&'static str],
}

/// A scripted call and what each of its replies must hold.
pub struct QualityCall {
    pub script: Script,
    pub expect: &'static [Expect],
}

const NONE: &[&[&str]] = &[];
/// Phrases that answer no one: the bundled model's condolences to a plain statement, a
/// refusal of what the agent is there to do.
const OFF_THE_POINT: &[&str] = &[
    "sorry for any loss",
    "sorry for your loss",
    "as an ai",
    "unable to assist",
    "phone-based",
];

/// Bumped whenever a script changes (its calls are spoken again).
pub const VERSION: &str = "1";

pub const CALLS: &[QualityCall] = &[
    QualityCall {
        script: Script {
            name: "booking",
            speaker: Speaker::Piper {
                length_scale: 1.05,
                noise_scale: 0.667,
            },
            turns: &[
                &[("Hello, I would like to book a room for two nights.", 0.0)],
                &[
                    ("I arrive on the twelfth of March.", 0.6),
                    ("Sorry, I mean the fourteenth of March.", 0.0),
                ],
                &[("My booking reference is K L seven four two.", 0.0)],
                &[("Can you read back my arrival date and my reference?", 0.0)],
            ],
        },
        expect: &[
            Expect {
                judged: Judged::Manner,
                must: NONE,
                must_not: &[
                    "unable to book",
                    "cannot book",
                    "can't book",
                    "unable to assist",
                    "phone-based",
                ],
            },
            Expect {
                judged: Judged::Detail,
                must: &[&["fourteenth", "14"]],
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Manner,
                must: NONE,
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Detail,
                must: &[
                    &["fourteenth", "14"],
                    &[
                        "742",
                        "seven four two",
                        "seven forty-two",
                        "seven forty two",
                    ],
                ],
                must_not: &["twelfth", "12th"],
            },
        ],
    },
    QualityCall {
        script: Script {
            name: "numbers",
            speaker: Speaker::Espeak {
                voice: "en-us+f3",
                words_per_minute: 140,
                pitch: 35,
            },
            turns: &[
                &[
                    ("My phone number is five five five,", 0.9),
                    ("two three four,", 0.7),
                    ("six seven eight nine.", 0.0),
                ],
                &[("Can you say that number back to me?", 0.0)],
            ],
        },
        expect: &[
            Expect {
                judged: Judged::Manner,
                must: NONE,
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Detail,
                must: &[
                    &["555", "five five five"],
                    &["6789", "six seven eight nine"],
                ],
                must_not: OFF_THE_POINT,
            },
        ],
    },
    QualityCall {
        script: Script {
            name: "facts",
            speaker: Speaker::Piper {
                length_scale: 0.9,
                noise_scale: 0.5,
            },
            turns: &[
                &[("Hi. What is the capital of France?", 0.0)],
                &[("How many days are there in a leap year?", 0.0)],
                &[("Which planet is closest to the sun?", 0.0)],
            ],
        },
        expect: &[
            Expect {
                judged: Judged::Fact,
                must: &[&["paris"]],
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Fact,
                must: &[&[
                    "366",
                    "three hundred sixty-six",
                    "three hundred and sixty-six",
                ]],
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Fact,
                must: &[&["mercury"]],
                must_not: OFF_THE_POINT,
            },
        ],
    },
    QualityCall {
        script: Script {
            name: "greeting_off_topic",
            speaker: Speaker::Espeak {
                voice: "en-gb+m3",
                words_per_minute: 170,
                pitch: 60,
            },
            turns: &[
                &[("Good morning!", 0.0)],
                &[("I went for a walk in the park today.", 0.0)],
                &[(
                    "Can you write me a computer program that sorts a list?",
                    0.0,
                )],
            ],
        },
        expect: &[
            Expect {
                judged: Judged::Manner,
                must: &[&["morning", "hello", "hi", "good"]],
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Manner,
                must: NONE,
                must_not: OFF_THE_POINT,
            },
            Expect {
                judged: Judged::Manner,
                must: NONE,
                must_not: &["def ", "```", "import ", "#include", "print("],
            },
        ],
    },
];

/// One reply, judged.
#[derive(Debug, Clone, Serialize)]
pub struct TurnScore {
    pub call: String,
    pub turn: usize,
    pub judged: Judged,
    pub said: String,
    pub heard: String,
    pub reply: String,
    /// Groups of `must` the reply satisfied, of how many.
    pub kept: usize,
    pub expected: usize,
    /// Phrases of `must_not` the reply holds.
    pub forbidden: Vec<String>,
    pub words: usize,
    /// The reply repeats a run of four words three times or more.
    pub looped: bool,
    pub wer: f64,
    pub voice_to_voice_s: Option<f64>,
    pub failed: bool,
}

/// One turn of a played call: what the caller said, what the agent heard and replied.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exchange<'a> {
    pub said: &'a str,
    pub heard: &'a str,
    pub reply: &'a str,
    /// The transcript's word error rate against what was said.
    pub wer: f64,
    pub voice_to_voice_s: Option<f64>,
    /// The turn failed (late, or a stage failed) and the fallback phrase was said.
    pub failed: bool,
}

/// Judges one reply.
pub fn score_turn(call: &str, turn: usize, expect: &Expect, exchange: Exchange) -> TurnScore {
    let Exchange {
        said,
        heard,
        reply,
        wer,
        voice_to_voice_s,
        failed,
    } = exchange;
    let lower = reply.to_lowercase();
    let kept = expect
        .must
        .iter()
        .filter(|any| {
            any.iter()
                .any(|phrase| lower.contains(&phrase.to_lowercase()))
        })
        .count();
    let forbidden = expect
        .must_not
        .iter()
        .filter(|phrase| lower.contains(&phrase.to_lowercase()))
        .map(|p| p.to_string())
        .collect();
    TurnScore {
        call: call.to_string(),
        turn,
        judged: expect.judged,
        said: said.to_string(),
        heard: heard.to_string(),
        reply: reply.to_string(),
        kept,
        expected: expect.must.len(),
        forbidden,
        words: reply.split_whitespace().count(),
        looped: loops(reply),
        wer,
        voice_to_voice_s,
        failed,
    }
}

/// Whether some run of four words comes back three times or more.
pub fn loops(reply: &str) -> bool {
    let words: Vec<String> = reply
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect();
    let mut seen = std::collections::HashMap::new();
    words.windows(4).any(|w| {
        let n = seen.entry(w.to_vec()).or_insert(0);
        *n += 1;
        *n >= 3
    })
}

/// A model set's figures over every call.
#[derive(Debug, Clone, Serialize)]
pub struct QualitySummary {
    pub models: String,
    pub details_kept: (usize, usize),
    pub facts_right: (usize, usize),
    pub manner_ok: (usize, usize),
    pub forbidden: usize,
    pub median_words: f64,
    pub loops: usize,
    pub mean_wer: f64,
    pub median_voice_to_voice_s: Option<f64>,
    pub turns: usize,
    pub unanswered: usize,
}

pub fn summarize(models: &str, scores: &[TurnScore]) -> QualitySummary {
    let tally = |judged: fn(&Judged) -> bool| {
        scores
            .iter()
            .filter(|s| judged(&s.judged))
            .fold((0, 0), |(k, e), s| (k + s.kept, e + s.expected))
    };
    let manner: Vec<&TurnScore> = scores
        .iter()
        .filter(|s| matches!(s.judged, Judged::Manner))
        .collect();
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    QualitySummary {
        models: models.to_string(),
        details_kept: tally(|j| matches!(j, Judged::Detail)),
        facts_right: tally(|j| matches!(j, Judged::Fact)),
        manner_ok: (
            manner
                .iter()
                .filter(|s| s.kept == s.expected && s.forbidden.is_empty())
                .count(),
            manner.len(),
        ),
        forbidden: scores.iter().map(|s| s.forbidden.len()).sum(),
        median_words: median(scores.iter().map(|s| s.words as f64).collect()).unwrap_or(0.0),
        loops: scores.iter().filter(|s| s.looped).count(),
        mean_wer: scores.iter().map(|s| s.wer).sum::<f64>() / scores.len().max(1) as f64,
        median_voice_to_voice_s: median(scores.iter().filter_map(|s| s.voice_to_voice_s).collect()),
        turns: scores.len(),
        unanswered: scores
            .iter()
            .filter(|s| s.failed || s.reply.trim().is_empty())
            .count(),
    }
}

/// The table of model sets side by side, as Markdown.
pub fn table(summaries: &[QualitySummary]) -> String {
    let mut out = String::from(
        "| models | details kept | facts right | manner ok | forbidden phrases | words per reply (median) | loops | transcript WER | voice to voice (median) | unanswered |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {}/{} | {}/{} | {}/{} | {} | {:.0} | {} | {:.1}% | {} | {}/{} |\n",
            s.models,
            s.details_kept.0,
            s.details_kept.1,
            s.facts_right.0,
            s.facts_right.1,
            s.manner_ok.0,
            s.manner_ok.1,
            s.forbidden,
            s.median_words,
            s.loops,
            100.0 * s.mean_wer,
            s.median_voice_to_voice_s
                .map_or("–".into(), |v| format!("{v:.2} s")),
            s.unanswered,
            s.turns,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_judged_by_what_it_kept_and_what_it_must_not_say() {
        let expect = &CALLS[0].expect[3];
        let reply = |reply| Exchange {
            reply,
            ..Exchange::default()
        };
        let good = score_turn(
            "booking",
            3,
            expect,
            reply("You arrive on the 14th of March, reference K L 742."),
        );
        assert_eq!((good.kept, good.expected, good.forbidden.len()), (2, 2, 0));
        let lost = score_turn(
            "booking",
            3,
            expect,
            reply("You arrive on the twelfth of March."),
        );
        assert_eq!(
            (lost.kept, lost.forbidden.clone()),
            (0, vec!["twelfth".to_string()])
        );
        let summary = summarize("m", &[good, lost]);
        assert_eq!(summary.details_kept, (2, 4));
        assert_eq!(summary.forbidden, 1);
    }

    #[test]
    fn a_reply_that_goes_round_in_circles_is_a_loop() {
        assert!(loops(
            "I am here to help. I am here to help. I am here to help you."
        ));
        assert!(!loops("I am here to help. What can I do for you today?"));
    }

    #[test]
    fn every_call_has_an_expectation_per_turn() {
        for call in CALLS {
            assert_eq!(
                call.script.turns.len(),
                call.expect.len(),
                "{}",
                call.script.name
            );
        }
    }
}
