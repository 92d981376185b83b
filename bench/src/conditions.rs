//! Where a caller calls from, as audio: the project's clean test calls rendered as a
//! phone line, with steady noise, or with other people talking behind the caller. Pure
//! functions of the samples (and a seed), so that every run hears the same conditions.
//!
//! - **Phone**: band-limited to 300–3,400 Hz, at 8 kHz, through G.711 μ-law, as LiveKit's
//!   SIP bridge delivers a phone caller (brought back to 16 kHz by the project's resampler,
//!   as the pipeline takes it).
//! - **Noise**: pink noise (Paul Kellet's filter over seeded white noise) at a signal-to-noise
//!   ratio measured against the caller's speech, not the call's silences.
//! - **Voices**: another test call (another voice) under the caller's, its speech a set number
//!   of decibels below the caller's, as in an office or a café.
//! - **Echo**: the caller's audio as it is, and the agent's own voice fed back into it as it
//!   plays, a set number of decibels down and 150 ms late (a speakerphone): not a rendering
//!   of the audio but a way of playing the call ([`Condition::echo`]).

use sublet_audio::{resample, Audio, SPEECH_RATE};

/// A condition a call is heard in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Condition {
    Clean,
    Phone,
    /// Pink noise at this signal-to-noise ratio, in dB.
    Noise {
        snr_db: f64,
    },
    /// Another voice this many dB below the caller's.
    Voices {
        below_db: f64,
    },
    /// The agent's voice echoed back this many dB down.
    Echo {
        below_db: f64,
    },
}

/// How late a speakerphone's echo comes back: the room's path and the caller's client.
pub const ECHO_DELAY_S: f64 = 0.15;

impl Condition {
    /// Parses `clean`, `phone`, `noiseN` (N dB SNR), `voicesN` (N dB below the caller),
    /// `echoN` (the agent's voice N dB down; `echo`: 20 dB).
    pub fn parse(name: &str) -> Result<Self, String> {
        let number = |rest: &str| {
            rest.parse::<f64>()
                .ok()
                .filter(|db| db.is_finite() && (0.0..=60.0).contains(db))
                .ok_or_else(|| format!("{name:?}: the decibels must be a number from 0 to 60"))
        };
        match name {
            "clean" => Ok(Self::Clean),
            "phone" => Ok(Self::Phone),
            "echo" => Ok(Self::Echo { below_db: 20.0 }),
            _ => match (
                name.strip_prefix("noise"),
                name.strip_prefix("voices"),
                name.strip_prefix("echo"),
            ) {
                (Some(rest), _, _) => Ok(Self::Noise {
                    snr_db: number(rest)?,
                }),
                (_, Some(rest), _) => Ok(Self::Voices {
                    below_db: number(rest)?,
                }),
                (_, _, Some(rest)) => Ok(Self::Echo {
                    below_db: number(rest)?,
                }),
                _ => Err(format!(
                    "unknown condition {name:?} (clean, phone, noiseN, voicesN, echoN)"
                )),
            },
        }
    }

    /// Its name, as [`Condition::parse`] reads it.
    pub fn name(&self) -> String {
        match self {
            Self::Clean => "clean".into(),
            Self::Phone => "phone".into(),
            Self::Noise { snr_db } => format!("noise{snr_db}"),
            Self::Voices { below_db } => format!("voices{below_db}"),
            Self::Echo { below_db } => format!("echo{below_db}"),
        }
    }

    /// The echo to play the call with, in the echo condition.
    pub fn echo(&self) -> Option<sublet_agent::Echo> {
        match *self {
            Self::Echo { below_db } => Some(sublet_agent::Echo {
                below_db,
                delay_s: ECHO_DELAY_S,
            }),
            _ => None,
        }
    }

    /// `call` (16 kHz, its speech in `speech` spans of seconds) heard in this condition;
    /// `other` is another call, the voices behind the caller.
    pub fn apply(&self, call: &Audio, speech: &[(f64, f64)], other: &Audio, seed: u64) -> Audio {
        assert_eq!(call.rate, SPEECH_RATE, "conditions apply to 16 kHz calls");
        match *self {
            // An echo is added as the call plays, from the reply it hears.
            Self::Clean | Self::Echo { .. } => call.clone(),
            Self::Phone => phone_line(call),
            Self::Noise { snr_db } => {
                let noise = pink_noise(call.samples.len(), seed);
                mixed_below(call, speech, &noise, &[(0.0, call.duration_s())], snr_db)
            }
            Self::Voices { below_db } => {
                assert_eq!(other.rate, SPEECH_RATE);
                // The other call looped to the caller's length, from a second in.
                let offset = SPEECH_RATE as usize;
                let behind: Vec<f32> = (0..call.samples.len())
                    .map(|i| other.samples[(i + offset) % other.samples.len()])
                    .collect();
                let behind_audio = Audio::new(behind.clone(), SPEECH_RATE);
                let loud = loud_spans(&behind_audio);
                mixed_below(call, speech, &behind, &loud, below_db)
            }
        }
    }
}

/// `call` with `extra` added, scaled so that its level over `extra_spans` is `below_db`
/// under the call's level over `speech`.
fn mixed_below(
    call: &Audio,
    speech: &[(f64, f64)],
    extra: &[f32],
    extra_spans: &[(f64, f64)],
    below_db: f64,
) -> Audio {
    let caller = rms_over(&call.samples, speech);
    let level = rms_over(extra, extra_spans);
    let gain = match level > 0.0 {
        true => caller / level * 10f64.powf(-below_db / 20.0),
        false => 0.0,
    } as f32;
    let samples = call
        .samples
        .iter()
        .zip(extra)
        .map(|(s, e)| (s + gain * e).clamp(-1.0, 1.0))
        .collect();
    Audio::new(samples, call.rate)
}

/// The root mean square of `samples` (16 kHz) over the spans, in seconds.
pub fn rms_over(samples: &[f32], spans: &[(f64, f64)]) -> f64 {
    let at = |s: f64| ((s * SPEECH_RATE as f64) as usize).min(samples.len());
    let (sum, count) = spans
        .iter()
        .flat_map(|&(from, to)| &samples[at(from)..at(to)])
        .fold((0.0, 0usize), |(sum, n), &s| {
            (sum + (s as f64).powi(2), n + 1)
        });
    match count {
        0 => 0.0,
        n => (sum / n as f64).sqrt(),
    }
}

/// The spans of 20 ms frames louder than a tenth of the loudest frame (an estimate of
/// where a recording speaks).
fn loud_spans(audio: &Audio) -> Vec<(f64, f64)> {
    let frame = (audio.rate / 50) as usize;
    let levels: Vec<f64> = audio
        .samples
        .chunks(frame)
        .map(|c| (c.iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / c.len() as f64).sqrt())
        .collect();
    let loudest = levels.iter().cloned().fold(0.0, f64::max);
    let seconds = |i: usize| (i * frame) as f64 / audio.rate as f64;
    levels
        .iter()
        .enumerate()
        .filter(|(_, &l)| l > loudest / 10.0)
        .map(|(i, _)| (seconds(i), seconds(i + 1)))
        .collect()
}

/// A phone line: 300–3,400 Hz, 8 kHz, μ-law, then back to 16 kHz.
fn phone_line(call: &Audio) -> Audio {
    let narrow = phone_line_8k(call);
    Audio::new(resample(&narrow.samples, 8000, call.rate), call.rate)
}

/// What a phone line carries of `call`: 300–3,400 Hz at 8 kHz, each sample through G.711
/// μ-law and back, as a SIP trunk hands a phone caller's audio on.
pub fn phone_line_8k(call: &Audio) -> Audio {
    let mut band = call.samples.clone();
    // Two passes of each second-order filter: 24 dB an octave outside the band.
    for _ in 0..2 {
        Biquad::high_pass(300.0, call.rate as f64).run(&mut band);
        Biquad::low_pass(3400.0, call.rate as f64).run(&mut band);
    }
    let narrow = resample(&band, call.rate, 8000);
    let coded: Vec<f32> = narrow
        .iter()
        .map(|&s| mu_law_decode(mu_law_encode(s)))
        .collect();
    Audio::new(coded, 8000)
}

/// A second-order filter (the Audio EQ Cookbook's, Q = 1/√2).
struct Biquad {
    b: [f64; 3],
    a: [f64; 2],
}

impl Biquad {
    fn new(cutoff: f64, rate: f64, high: bool) -> Self {
        let w = 2.0 * std::f64::consts::PI * cutoff / rate;
        let alpha = w.sin() / (2.0 * std::f64::consts::FRAC_1_SQRT_2);
        let cos = w.cos();
        let a0 = 1.0 + alpha;
        let b = match high {
            true => [(1.0 + cos) / 2.0, -(1.0 + cos), (1.0 + cos) / 2.0],
            false => [(1.0 - cos) / 2.0, 1.0 - cos, (1.0 - cos) / 2.0],
        };
        Self {
            b: b.map(|x| x / a0),
            a: [-2.0 * cos / a0, (1.0 - alpha) / a0],
        }
    }

    fn high_pass(cutoff: f64, rate: f64) -> Self {
        Self::new(cutoff, rate, true)
    }

    fn low_pass(cutoff: f64, rate: f64) -> Self {
        Self::new(cutoff, rate, false)
    }

    fn run(&self, samples: &mut [f32]) {
        let (mut x1, mut x2, mut y1, mut y2) = (0.0, 0.0, 0.0, 0.0);
        for s in samples {
            let x = *s as f64;
            let y =
                self.b[0] * x + self.b[1] * x1 + self.b[2] * x2 - self.a[0] * y1 - self.a[1] * y2;
            (x2, x1, y2, y1) = (x1, x, y1, y);
            *s = y as f32;
        }
    }
}

/// G.711 μ-law: a sample in [-1, 1] as its 8-bit code.
fn mu_law_encode(sample: f32) -> u8 {
    const BIAS: i32 = 0x84;
    let pcm = (sample.clamp(-1.0, 1.0) * 32767.0) as i32;
    let sign = if pcm < 0 { 0x80 } else { 0 };
    let magnitude = (pcm.abs().min(32635) + BIAS) as u32;
    let exponent = (31 - magnitude.leading_zeros()).saturating_sub(7).min(7);
    let mantissa = (magnitude >> (exponent + 3)) & 0x0F;
    !(sign | (exponent << 4) as u8 | mantissa as u8)
}

/// G.711 μ-law: a code as its sample.
fn mu_law_decode(code: u8) -> f32 {
    const BIAS: i32 = 0x84;
    let code = !code;
    let exponent = ((code >> 4) & 0x07) as i32;
    let mantissa = (code & 0x0F) as i32;
    let magnitude = (((mantissa << 3) + BIAS) << exponent) - BIAS;
    let pcm = if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    };
    pcm as f32 / 32768.0
}

/// Pink noise (−3 dB an octave), about unit level: Paul Kellet's economy filter over white
/// noise from a seeded generator.
pub fn pink_noise(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut white = move || {
        // xorshift64*: enough for noise, and the same for a seed on every machine.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (bits as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
    };
    let (mut b0, mut b1, mut b2) = (0.0, 0.0, 0.0);
    (0..len)
        .map(|_| {
            let w = white();
            b0 = 0.99765 * b0 + w * 0.0990460;
            b1 = 0.96300 * b1 + w * 0.2965164;
            b2 = 0.57000 * b2 + w * 1.0526913;
            ((b0 + b1 + b2 + w * 0.1848) * 0.25) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16 kHz tone of `hz`, `seconds` long, at amplitude `level`.
    fn tone(hz: f64, seconds: f64, level: f32) -> Audio {
        let n = (seconds * SPEECH_RATE as f64) as usize;
        let samples = (0..n)
            .map(|i| {
                level
                    * (2.0 * std::f64::consts::PI * hz * i as f64 / SPEECH_RATE as f64).sin() as f32
            })
            .collect();
        Audio::new(samples, SPEECH_RATE)
    }

    fn db(ratio: f64) -> f64 {
        20.0 * ratio.log10()
    }

    #[test]
    fn noise_sits_at_its_ratio_below_the_speech() {
        // Speech in the middle second only: the ratio is against it, not the silence.
        let mut call = tone(440.0, 3.0, 0.0);
        let speech = tone(440.0, 1.0, 0.3);
        call.samples[16_000..32_000].copy_from_slice(&speech.samples);
        let spans = [(1.0, 2.0)];
        let noisy = Condition::Noise { snr_db: 15.0 }.apply(&call, &spans, &call, 7);
        let noise: Vec<f32> = noisy
            .samples
            .iter()
            .zip(&call.samples)
            .map(|(n, c)| n - c)
            .collect();
        let ratio = db(rms_over(&call.samples, &spans) / rms_over(&noise, &[(0.0, 3.0)]));
        assert!((ratio - 15.0).abs() < 0.1, "{ratio} dB");
        // The same seed, the same noise.
        assert_eq!(
            noisy.samples,
            Condition::Noise { snr_db: 15.0 }
                .apply(&call, &spans, &call, 7)
                .samples
        );
    }

    #[test]
    fn another_voice_sits_below_the_caller() {
        let call = tone(300.0, 2.0, 0.4);
        let other = tone(700.0, 2.0, 0.2);
        let mixed = Condition::Voices { below_db: 8.0 }.apply(&call, &[(0.0, 2.0)], &other, 1);
        let behind: Vec<f32> = mixed
            .samples
            .iter()
            .zip(&call.samples)
            .map(|(m, c)| m - c)
            .collect();
        let ratio = db(rms_over(&call.samples, &[(0.0, 2.0)]) / rms_over(&behind, &[(0.0, 2.0)]));
        assert!((ratio - 8.0).abs() < 0.2, "{ratio} dB");
    }

    #[test]
    fn a_phone_line_keeps_the_voice_band_only() {
        let level = |audio: &Audio| rms_over(&audio.samples, &[(0.5, 1.5)]);
        let voice = tone(1000.0, 2.0, 0.3);
        let kept = db(level(&Condition::Phone.apply(&voice, &[], &voice, 0)) / level(&voice));
        assert!(kept.abs() < 1.0, "1 kHz passes: {kept} dB");
        for hz in [100.0, 6000.0] {
            let outside = tone(hz, 2.0, 0.3);
            let cut =
                db(level(&Condition::Phone.apply(&outside, &[], &outside, 0)) / level(&outside));
            assert!(cut < -20.0, "{hz} Hz is cut: {cut} dB");
        }
    }

    #[test]
    fn mu_law_round_trips_within_its_step() {
        for i in -100..=100 {
            let s = i as f32 / 100.0;
            let back = mu_law_decode(mu_law_encode(s));
            // μ-law's steps grow with the level: within 3% of it, or a small floor.
            assert!((back - s).abs() <= 0.03 * s.abs() + 0.002, "{s} -> {back}");
        }
    }

    #[test]
    fn names_read_back() {
        for name in ["clean", "phone", "noise15", "noise10", "voices8", "echo20"] {
            assert_eq!(Condition::parse(name).unwrap().name(), name);
        }
        for bad in [
            "noise",
            "noise-3",
            "noiseNaN",
            "voices1e9",
            "echoes",
            "echo99",
        ] {
            assert!(Condition::parse(bad).is_err(), "{bad}");
        }
        // `echo` alone is a speakerphone's 20 dB; only the echo condition plays with one.
        let echo = Condition::parse("echo").unwrap().echo().unwrap();
        assert_eq!((echo.below_db, echo.delay_s), (20.0, ECHO_DELAY_S));
        assert_eq!(Condition::parse("voices8").unwrap().echo(), None);
    }
}
