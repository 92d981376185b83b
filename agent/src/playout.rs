//! The agent's voice on its way out: sentences queued as they are synthesized and pulled
//! in real time by whatever plays them (a LiveKit track, a sound card, a test's virtual
//! speaker). It can pause, resume and be cut short, and it knows how much of each reply
//! the caller actually heard.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use sublet_audio::Audio;

use crate::responder::{AudioOut, SpokenSentence};

/// One synthesized sentence in the queue.
struct Segment {
    turn: usize,
    text: String,
    samples: Vec<f32>,
    played: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Segment>,
    paused: bool,
    /// What the caller heard of each turn's reply, sentence by sentence.
    heard: HashMap<usize, String>,
    /// Turns cut short: sentences of theirs still arriving are dropped.
    cut: HashSet<usize>,
    /// Samples pulled so far, silence included: the speaker's clock.
    clock: usize,
    /// The turn whose sentence emptied the queue, and when: if its next sentence comes,
    /// the caller heard a silence inside the reply.
    ran_dry: Option<(usize, usize)>,
    /// Each turn's longest such silence, in samples.
    longest_gap: HashMap<usize, usize>,
}

/// The shared queue; clones are handles to the same one.
#[derive(Clone)]
pub struct Playout {
    state: Arc<Mutex<State>>,
    rate: u32,
}

impl Playout {
    /// A queue played at `rate` samples a second.
    pub fn new(rate: u32) -> Self {
        Self {
            state: Arc::default(),
            rate,
        }
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a sentence of turn `turn`'s reply.
    pub fn push(&self, turn: usize, text: &str, audio: &Audio) {
        let samples = audio.resampled(self.rate).samples;
        let mut state = self.state();
        if samples.is_empty() || state.cut.contains(&turn) {
            return;
        }
        if let Some((dry_turn, at)) = state.ran_dry.take() {
            if dry_turn == turn {
                let gap = state.clock - at;
                let longest = state.longest_gap.entry(turn).or_default();
                *longest = (*longest).max(gap);
            }
        }
        state.queue.push_back(Segment {
            turn,
            text: text.to_owned(),
            samples,
            played: 0,
        });
    }

    /// Fills `out` with the next samples to play (silence while paused or with nothing
    /// queued); returns whether any of it was the agent's speech.
    pub fn pull(&self, out: &mut [f32]) -> bool {
        let mut state = self.state();
        let mut filled = 0;
        while filled < out.len() && !state.paused {
            let Some(segment) = state.queue.front_mut() else {
                break;
            };
            let n = (segment.samples.len() - segment.played).min(out.len() - filled);
            out[filled..filled + n]
                .copy_from_slice(&segment.samples[segment.played..segment.played + n]);
            segment.played += n;
            filled += n;
            if segment.played == segment.samples.len() {
                let done = state.queue.pop_front().expect("the front segment");
                append(state.heard.entry(done.turn).or_default(), &done.text);
                if state.queue.is_empty() {
                    state.ran_dry = Some((done.turn, state.clock + filled));
                }
            }
        }
        out[filled..].fill(0.0);
        state.clock += out.len();
        filled > 0
    }

    /// True while there is speech queued and not paused.
    pub fn speaking(&self) -> bool {
        let state = self.state();
        !state.paused && !state.queue.is_empty()
    }

    /// True while there is speech queued, paused or not.
    pub fn pending(&self) -> bool {
        !self.state().queue.is_empty()
    }

    /// The caller speaks over the agent: a silence from here on is theirs, not a gap.
    pub fn pause(&self) {
        let mut state = self.state();
        state.paused = true;
        state.ran_dry = None;
    }

    pub fn resume(&self) {
        self.state().paused = false;
    }

    /// Drops everything queued, and returns each cut turn with what the caller heard of
    /// it: whole sentences played, and the share of the words of the sentence cut short
    /// that its played audio covers.
    pub fn cut(&self) -> Vec<(usize, String)> {
        let mut state = self.state();
        state.paused = false;
        state.ran_dry = None;
        let cut: Vec<Segment> = state.queue.drain(..).collect();
        let mut turns = Vec::new();
        for segment in cut {
            if !turns.contains(&segment.turn) {
                turns.push(segment.turn);
                state.cut.insert(segment.turn);
            }
            if segment.played > 0 {
                let share = segment.played as f64 / segment.samples.len() as f64;
                let words: Vec<&str> = segment.text.split_whitespace().collect();
                let kept = (words.len() as f64 * share).floor() as usize;
                append(
                    state.heard.entry(segment.turn).or_default(),
                    &words[..kept].join(" "),
                );
            }
        }
        turns
            .into_iter()
            .map(|turn| (turn, state.heard.get(&turn).cloned().unwrap_or_default()))
            .collect()
    }

    /// What the caller has heard so far of turn `turn`'s reply: its sentences played whole,
    /// and what was heard of one cut short.
    pub fn heard(&self, turn: usize) -> String {
        self.state().heard.get(&turn).cloned().unwrap_or_default()
    }

    /// The longest silence the caller heard inside turn `turn`'s reply so far, in seconds:
    /// a sentence of it had played out and the next was not yet synthesized (0: none).
    pub fn longest_gap_s(&self, turn: usize) -> f64 {
        let samples = self.state().longest_gap.get(&turn).copied().unwrap_or(0);
        samples as f64 / f64::from(self.rate)
    }

    /// A writer for the responder.
    pub fn writer(&self) -> PlayoutWriter {
        PlayoutWriter(self.clone())
    }
}

fn append(text: &mut String, more: &str) {
    if more.is_empty() {
        return;
    }
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(more);
}

/// The responder's side of a [`Playout`]: each sentence is queued as it is synthesized.
pub struct PlayoutWriter(Playout);

impl AudioOut for PlayoutWriter {
    fn play(&mut self, _at_s: f64, sentence: &SpokenSentence) {
        self.0.push(sentence.turn, sentence.text, sentence.audio);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(seconds: f64) -> Audio {
        Audio::new(vec![0.5; (seconds * 1000.0) as usize], 1000)
    }

    #[test]
    fn plays_in_order_pauses_and_resumes() {
        let playout = Playout::new(1000);
        playout.push(1, "One two.", &tone(0.01));
        let mut out = [1.0f32; 4];
        assert!(playout.pull(&mut out));
        assert_eq!(out, [0.5; 4]);
        playout.pause();
        assert!(!playout.speaking() && playout.pending());
        assert!(!playout.pull(&mut out));
        assert_eq!(out, [0.0; 4]);
        playout.resume();
        let mut rest = [0.0f32; 10];
        assert!(playout.pull(&mut rest));
        // 6 samples were left, then silence.
        assert_eq!(&rest[..6], &[0.5; 6]);
        assert_eq!(&rest[6..], &[0.0; 4]);
        assert!(!playout.pending());
    }

    #[test]
    fn a_silence_inside_a_reply_is_measured_and_one_between_replies_is_not() {
        let playout = Playout::new(1000);
        let mut out = [0.0f32; 10];
        playout.push(1, "First.", &tone(0.01));
        playout.pull(&mut out); // played out whole
        playout.pull(&mut out); // 10 ms of silence: the next sentence is late
        playout.pull(&mut out[..5]);
        playout.push(1, "Second.", &tone(0.01));
        assert!((playout.longest_gap_s(1) - 0.015).abs() < 1e-9);
        playout.pull(&mut out);
        playout.pull(&mut out); // the reply is over; the next turn's begins later
        playout.push(2, "Next turn.", &tone(0.01));
        assert_eq!(playout.longest_gap_s(2), 0.0);
        // A sentence queued in time leaves no gap.
        playout.push(2, "On time.", &tone(0.01));
        playout.pull(&mut out);
        playout.pull(&mut out);
        assert_eq!(playout.longest_gap_s(2), 0.0);
        // Silence while the caller speaks over the agent is theirs.
        playout.pause();
        playout.pull(&mut out);
        playout.resume();
        playout.push(2, "After the caller.", &tone(0.01));
        assert_eq!(playout.longest_gap_s(2), 0.0);
        assert!((playout.longest_gap_s(1) - 0.015).abs() < 1e-9);
    }

    #[test]
    fn a_cut_reply_keeps_what_was_heard() {
        let playout = Playout::new(1000);
        playout.push(3, "It will rain.", &tone(0.01));
        playout.push(3, "Take an umbrella with you today.", &tone(0.01));
        playout.push(3, "Goodbye.", &tone(0.01));
        let mut out = [0.0f32; 15];
        playout.pull(&mut out); // the first sentence, and half of the second
        assert_eq!(
            playout.cut(),
            vec![(3, "It will rain. Take an umbrella".to_owned())]
        );
        assert!(!playout.pending());
        assert!(!playout.pull(&mut out));
        assert_eq!(playout.heard(3), "It will rain. Take an umbrella");
        // The rest of that reply, still being synthesized, is not played.
        playout.push(3, "More.", &tone(0.01));
        assert!(!playout.pending());
    }
}
