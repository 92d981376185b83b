//! The caller is nearer than the room: speech well below the caller's own level is someone
//! else's (a voice behind them, the agent's own reply echoed back), not the caller's.
//!
//! Plain code over each VAD frame's samples and speech probability:
//! - the frame's level is a running envelope of its power above `high_pass_hz` (a phone
//!   line's band: a voice's pitch, which a phone line drops, would make the same caller
//!   louder on one line than on another), in dB: it rises over a syllable
//!   (`envelope_rise_s`) and falls faster (`envelope_fall_s`), so that the room is heard
//!   for itself soon after the caller stops, and a peak of it does not pass for them;
//! - the caller's level follows the envelope of the frames heard as their speech: up
//!   quickly (`rise_s`: a caller who first speaks after a room's voice takes over the level
//!   within a word or two), down slowly (`fall_s`: a quieter sentence does not lower it to
//!   the room's);
//! - a frame whose envelope is more than `margin_db` below the caller's level is not the
//!   caller's, unless it comes within `hold_s` of a frame of their speech within
//!   `strong_db` of their level (a sentence's quiet last words; a room's voice, further
//!   below, seldom comes that near, so it does not keep the hold open), nor so quiet that
//!   it is the room's silence after the caller's speech (its own power within `silence_db`
//!   of the room's floor, the quietest frames of the last seconds, with the last frame
//!   above it the caller's: a pause between their words is theirs, and whether it ends
//!   their turn is the VAD's and the endpoint rules' to say; silence after a voice behind
//!   them is that voice's, and the VAD's lingering on it is not the caller's speech): its
//!   speech probability reads 0 for the
//!   turn-taking rules, and its audio is turned down by `attenuation_db` for the
//!   end-of-turn model and the transcriber, with the gain ramped across the frame so that
//!   no click is added.
//!
//! Before the caller's first speech there is no level, and nothing is gated.

/// The gate's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelGateConfig {
    /// How far under the caller's level a frame's envelope may be and still be theirs.
    pub margin_db: f64,
    /// The envelope's time constant toward a louder frame…
    pub envelope_rise_s: f64,
    /// …and toward a quieter one.
    pub envelope_fall_s: f64,
    /// The caller's level rises toward louder speech with this time constant…
    pub rise_s: f64,
    /// …and falls toward quieter speech with this one.
    pub fall_s: f64,
    /// How much a gated frame's audio is turned down.
    pub attenuation_db: f64,
    /// The frequency under which a frame's power is not counted (0: all of it).
    pub high_pass_hz: f64,
    /// The speech probability at which a frame counts toward the caller's level.
    pub speech_probability: f32,
    /// How long after a strong frame of the caller's speech a quieter one is still theirs…
    pub hold_s: f64,
    /// …where a strong frame is within this many dB of the caller's level.
    pub strong_db: f64,
    /// A frame whose own power is within this many dB of the room's floor is silence,
    /// not someone else's speech, and is left to the VAD…
    pub silence_db: f64,
    /// …where the floor falls at once to a quieter frame and rises this many dB a second
    /// (slowly: a voice behind the caller, with its gaps between words, keeps it low).
    pub floor_rise_db_s: f64,
    /// A sound after a pause of the caller's is held theirs at least this long (a word's
    /// onset is quiet, and the envelope takes a moment to rise to their level)…
    pub onset_s: f64,
    /// …where a pause is their silence up to this long (longer, their turn is over, and
    /// a sound after it has no such grace: it may well be the room's).
    pub pause_s: f64,
}

impl Default for LevelGateConfig {
    fn default() -> Self {
        Self {
            margin_db: 10.0,
            envelope_rise_s: 0.1,
            envelope_fall_s: 0.05,
            rise_s: 0.3,
            fall_s: 4.0,
            // Turning the room down 24 dB cost clean transcripts 0.03 of word error rate and
            // a phone line's 0.07, for 0.05 gained behind a voice (`latency`, 2026-12-07).
            attenuation_db: 0.0,
            high_pass_hz: 300.0,
            speech_probability: 0.5,
            hold_s: 0.3,
            strong_db: 4.0,
            silence_db: 6.0,
            floor_rise_db_s: 3.0,
            onset_s: 0.1,
            pause_s: 0.5,
        }
    }
}

/// What the gate made of a frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gated {
    /// The speech probability the turn-taking rules should see.
    pub probability: f32,
    /// The frame's audio gain at its start and at its end (1 where it is the caller's).
    pub gain: (f32, f32),
    /// Whether the frame was held to be someone other than the caller.
    pub dropped: bool,
}

/// The gate's state for one caller.
#[derive(Debug, Clone)]
pub struct LevelGate {
    config: LevelGateConfig,
    /// The running mean of the samples' power.
    envelope: f64,
    /// The caller's level, in dB, once they have spoken.
    caller_db: Option<f64>,
    /// The gain the previous frame ended at.
    gain: f32,
    /// Seconds since the caller's last strong speech frame.
    since_caller_s: f64,
    /// The room's floor: the quietest frames' power, in dB.
    floor_db: Option<f64>,
    /// Whether the last frame above the floor was someone else's.
    room_spoke_last: bool,
    /// Seconds of silence since the last frame above the floor.
    silent_for_s: f64,
    /// The high-pass filter's state: its last two inputs and outputs.
    filter: [f64; 4],
}

/// Levels below this are silence (digital zero would be -inf dB).
const FLOOR_DB: f64 = -120.0;

fn db(power: f64) -> f64 {
    (10.0 * power.log10()).max(FLOOR_DB)
}

impl LevelGate {
    pub fn new(config: LevelGateConfig) -> Self {
        Self {
            config,
            envelope: 0.0,
            caller_db: None,
            gain: 1.0,
            since_caller_s: f64::INFINITY,
            floor_db: None,
            room_spoke_last: false,
            silent_for_s: 0.0,
            filter: [0.0; 4],
        }
    }

    /// The caller's level in dB (full scale), once they have spoken.
    pub fn caller_db(&self) -> Option<f64> {
        self.caller_db
    }

    /// One frame of `rate` Hz audio and the VAD's probability that it holds speech.
    pub fn frame(&mut self, samples: &[f32], rate: f64, probability: f32) -> Gated {
        let duration_s = samples.len() as f64 / rate;
        let power = match samples.len() {
            0 => 0.0,
            n => self.band_energy(samples, rate) / n as f64,
        };
        let c = &self.config;
        let time_constant = match power > self.envelope {
            true => c.envelope_rise_s,
            false => c.envelope_fall_s,
        };
        self.envelope += (1.0 - (-duration_s / time_constant).exp()) * (power - self.envelope);
        let level_db = db(self.envelope);
        let below = self
            .caller_db
            .is_some_and(|caller| level_db < caller - c.margin_db);
        let frame_db = db(power);
        let floor = match self.floor_db {
            Some(floor) => frame_db.min(floor + c.floor_rise_db_s * duration_s),
            None => frame_db,
        };
        self.floor_db = Some(floor);
        let silent = frame_db < floor + c.silence_db;
        self.since_caller_s += duration_s;
        let someone_elses = below && self.since_caller_s > c.hold_s;
        let dropped = match silent {
            true => someone_elses && self.room_spoke_last,
            false => someone_elses,
        };
        if !silent {
            self.room_spoke_last = dropped;
            self.silent_for_s = 0.0;
        } else {
            self.silent_for_s += duration_s;
            if !self.room_spoke_last && self.silent_for_s <= c.pause_s {
                // The caller's pause: their next sound is held theirs for its onset.
                self.since_caller_s = self.since_caller_s.min(c.hold_s - c.onset_s);
            }
        }
        let strong = self
            .caller_db
            .is_none_or(|caller| level_db >= caller - c.strong_db);
        if probability >= c.speech_probability && strong {
            self.since_caller_s = 0.0;
        }
        if probability >= c.speech_probability && !below {
            self.caller_db = Some(match self.caller_db {
                None => level_db,
                Some(caller) => {
                    let time_constant = if level_db > caller {
                        c.rise_s
                    } else {
                        c.fall_s
                    };
                    caller + (1.0 - (-duration_s / time_constant).exp()) * (level_db - caller)
                }
            });
        }
        let end_gain = match dropped {
            true => 10f64.powf(-c.attenuation_db / 20.0) as f32,
            false => 1.0,
        };
        let gain = (self.gain, end_gain);
        self.gain = end_gain;
        Gated {
            probability: if dropped { 0.0 } else { probability },
            gain,
            dropped,
        }
    }

    /// The frame's energy above `high_pass_hz`: a second-order high-pass (the Audio EQ
    /// Cookbook's, Q = 1/√2), its state carried across frames.
    fn band_energy(&mut self, samples: &[f32], rate: f64) -> f64 {
        let cutoff = self.config.high_pass_hz;
        if cutoff <= 0.0 {
            return samples.iter().map(|&s| (s as f64).powi(2)).sum();
        }
        let w = 2.0 * std::f64::consts::PI * cutoff / rate;
        let (cos, alpha) = (w.cos(), w.sin() / std::f64::consts::SQRT_2);
        let a0 = 1.0 + alpha;
        let b = [
            (1.0 + cos) / 2.0 / a0,
            -(1.0 + cos) / a0,
            (1.0 + cos) / 2.0 / a0,
        ];
        let a = [-2.0 * cos / a0, (1.0 - alpha) / a0];
        let [mut x1, mut x2, mut y1, mut y2] = self.filter;
        let mut energy = 0.0;
        for &s in samples {
            let x = s as f64;
            let y = b[0] * x + b[1] * x1 + b[2] * x2 - a[0] * y1 - a[1] * y2;
            (x2, x1, y2, y1) = (x1, x, y1, y);
            energy += y * y;
        }
        self.filter = [x1, x2, y1, y2];
        energy
    }

    /// `samples` with a frame's gain ramped from its start to its end.
    pub fn apply(samples: &mut [f32], (from, to): (f32, f32)) {
        if from == 1.0 && to == 1.0 {
            return;
        }
        let n = samples.len().max(1) as f32;
        for (i, s) in samples.iter_mut().enumerate() {
            *s *= from + (to - from) * (i as f32 + 1.0) / n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: f64 = 16_000.0;
    const FRAME: usize = 512;

    /// A frame of a tone at `db` (full scale, RMS).
    fn tone(db: f64, phase: &mut f64) -> Vec<f32> {
        let amplitude = 10f64.powf(db / 20.0) * 2f64.sqrt();
        (0..FRAME)
            .map(|_| {
                *phase += 2.0 * std::f64::consts::PI * 1000.0 / RATE;
                (amplitude * phase.sin()) as f32
            })
            .collect()
    }

    /// `seconds` of frames at `db`, each with the VAD's `probability`: what the gate made
    /// of them.
    fn feed(gate: &mut LevelGate, db: f64, seconds: f64, probability: f32) -> Vec<Gated> {
        let mut phase = 0.0;
        let frames = (seconds * RATE / FRAME as f64) as usize;
        (0..frames)
            .map(|_| gate.frame(&tone(db, &mut phase), RATE, probability))
            .collect()
    }

    /// Digital silence.
    const ZERO: f64 = -120.0;

    /// `seconds` of a voice as speech comes: syllables of 0.2 s at `db`, each followed by
    /// 0.1 s of the room at `gap_db` (a steady tone would be the room's floor itself).
    fn speak(
        gate: &mut LevelGate,
        db: f64,
        gap_db: f64,
        seconds: f64,
        probability: f32,
    ) -> Vec<Gated> {
        let mut phase = 0.0;
        let frames = (seconds * RATE / FRAME as f64) as usize;
        (0..frames)
            .map(|i| {
                let at_s = i as f64 * FRAME as f64 / RATE;
                let level = if at_s % 0.3 < 0.2 { db } else { gap_db };
                gate.frame(&tone(level, &mut phase), RATE, probability)
            })
            .collect()
    }

    #[test]
    fn nothing_is_gated_before_the_caller_speaks() {
        let mut gate = LevelGate::new(LevelGateConfig::default());
        let quiet = feed(&mut gate, -50.0, 1.0, 0.0);
        assert!(quiet.iter().all(|g| !g.dropped && g.gain == (1.0, 1.0)));
        // The first speech sets the level, however quiet.
        let first = feed(&mut gate, -40.0, 1.0, 0.9);
        assert!(first.iter().all(|g| !g.dropped && g.probability == 0.9));
        assert!((gate.caller_db().unwrap() + 40.0).abs() < 1.0);
    }

    #[test]
    fn a_voice_well_below_the_caller_is_not_the_caller() {
        let mut gate = LevelGate::new(LevelGateConfig {
            attenuation_db: 24.0,
            ..LevelGateConfig::default()
        });
        feed(&mut gate, -20.0, 2.0, 0.9);
        // The caller pauses; a voice 12 dB down speaks on (past the envelope's decay).
        let behind = speak(&mut gate, -32.0, ZERO, 1.0, 0.9);
        // Dropped once the envelope has fallen and the hold after the caller's speech ended
        // (its gaps too: the VAD's lingering on it is not the caller's speech).
        assert!(behind[..9].iter().all(|g| !g.dropped));
        assert!(behind[20..]
            .iter()
            .all(|g| g.dropped && g.probability == 0.0));
        // Its audio is turned down, ramped from the caller's gain on the first dropped frame.
        let first = behind.iter().find(|g| g.dropped).unwrap();
        assert_eq!(first.gain.0, 1.0);
        assert!((first.gain.1 - 10f32.powf(-24.0 / 20.0)).abs() < 1e-6);
        // The caller's level held while the other voice spoke.
        assert!((gate.caller_db().unwrap() + 20.0).abs() < 1.0);
        // The caller speaks again: theirs at once.
        let back = feed(&mut gate, -20.0, 0.5, 0.9);
        assert!(back[3..].iter().all(|g| !g.dropped && g.probability == 0.9));
    }

    #[test]
    fn a_caller_a_little_quieter_is_still_the_caller() {
        let mut gate = LevelGate::new(LevelGateConfig::default());
        feed(&mut gate, -20.0, 2.0, 0.9);
        let softer = feed(&mut gate, -26.0, 10.0, 0.9);
        assert!(softer.iter().all(|g| !g.dropped));
        // The level followed them down, so a yet quieter sentence is theirs too.
        let softer_still = feed(&mut gate, -33.0, 5.0, 0.9);
        assert!(softer_still.iter().all(|g| !g.dropped));
    }

    #[test]
    fn a_louder_caller_after_a_room_voice_takes_the_level() {
        let mut gate = LevelGate::new(LevelGateConfig::default());
        // The room's voice speaks first, so it sets the level…
        speak(&mut gate, -32.0, ZERO, 2.0, 0.9);
        // …then the caller, 12 dB louder, who takes it within a second…
        feed(&mut gate, -20.0, 1.5, 0.9);
        assert!(gate.caller_db().unwrap() > -22.0);
        // …after which the room's voice is gated.
        let behind = speak(&mut gate, -32.0, ZERO, 1.0, 0.9);
        assert!(behind[20..].iter().all(|g| g.dropped));
    }

    #[test]
    fn a_sentences_quiet_end_is_held_as_the_callers() {
        let mut gate = LevelGate::new(LevelGateConfig::default());
        feed(&mut gate, -20.0, 2.0, 0.9);
        // Their last words, 15 dB down: theirs for the hold's 0.3 s after their strong
        // speech…
        let tail = speak(&mut gate, -35.0, ZERO, 0.6, 0.9);
        let held = tail.iter().take_while(|g| !g.dropped).count();
        assert!((8..=11).contains(&held), "{held} frames held");
        // …and after it, as long as it stays that far down, someone else's.
        assert!(tail[held..].iter().all(|g| g.dropped));
    }

    #[test]
    fn a_voice_under_the_band_does_not_count() {
        // A tone of 100 Hz, under a phone line's band, is not a caller's level.
        let mut gate = LevelGate::new(LevelGateConfig::default());
        let mut phase = 0.0;
        let amplitude = 0.1f64 * 2f64.sqrt();
        for _ in 0..60 {
            let frame: Vec<f32> = (0..FRAME)
                .map(|_| {
                    phase += 2.0 * std::f64::consts::PI * 100.0 / RATE;
                    (amplitude * phase.sin()) as f32
                })
                .collect();
            gate.frame(&frame, RATE, 0.9);
        }
        assert!(
            gate.caller_db().unwrap() < -20.0 - 10.0,
            "{:?}",
            gate.caller_db()
        );
    }

    #[test]
    fn a_pause_between_the_callers_words_is_left_to_the_vad() {
        // The caller speaks in a quiet room, 40 dB under them…
        let mut gate = LevelGate::new(LevelGateConfig::default());
        speak(&mut gate, -20.0, -60.0, 2.0, 0.9);
        // …and pauses past the hold, which the VAD still hears as their speech going on:
        // its probability stands…
        let pause = feed(&mut gate, -60.0, 0.8, 0.6);
        assert!(pause.iter().all(|g| !g.dropped && g.probability == 0.6));
        // …but their turn is over: a voice 15 dB down is someone else's from its first
        // frame, and so are its gaps.
        let voice = speak(&mut gate, -35.0, -60.0, 1.0, 0.6);
        assert!(voice.iter().all(|g| g.dropped));
        // So is digital silence after it, where a VAD still lingers on that voice…
        let after = feed(&mut gate, ZERO, 0.3, 0.6);
        assert!(after.iter().all(|g| g.dropped));
        // …but not the same silence after the caller's own words…
        speak(&mut gate, -20.0, -60.0, 1.0, 0.9);
        let pause = feed(&mut gate, ZERO, 0.4, 0.6);
        assert!(pause.iter().all(|g| !g.dropped));
        // …nor the quiet onset of their next word after that short pause.
        let onset = feed(&mut gate, -35.0, 0.2, 0.9);
        let held = onset.iter().take_while(|g| !g.dropped).count();
        assert_eq!(held, 3, "the onset's first {held} frames held");
    }

    #[test]
    fn the_gain_ramps_back_up_across_a_frame() {
        let mut samples = vec![1.0f32; 4];
        LevelGate::apply(&mut samples, (0.0, 1.0));
        assert_eq!(samples, [0.25, 0.5, 0.75, 1.0]);
        let mut kept = vec![0.5f32; 4];
        LevelGate::apply(&mut kept, (1.0, 1.0));
        assert_eq!(kept, [0.5; 4]);
    }
}
