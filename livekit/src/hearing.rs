//! Which of a room's tracks the agent decodes, and how fast it takes their audio: plain
//! rules over what a participant publishes, since anyone in the room can publish anything.
//!
//! - A track is decoded only if it is audio, Opus, from a participant's microphone (by the
//!   server's track info; a track the server has not described yet is taken as LiveKit's
//!   clients publish their microphone), the first such of its participant, and one of at
//!   most [`MOST_HEARD`] at a time. A video track fed to the Opus decoder would have been
//!   heard as noise.
//! - A track's audio is taken no faster than real time ([`Pace`]): a sender that sends
//!   a minute of audio in a second has all but its first second dropped, so a flood costs
//!   neither decoding nor a queue that would delay the caller's next turn.

use std::collections::HashSet;
use std::fmt;
use std::time::Instant;

use livekit_protocol as proto;

/// Most tracks decoded at once in one room: the caller's microphone and some room to
/// spare for others present; the rest are ignored.
pub const MOST_HEARD: usize = 8;

/// Why a participant's track is not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackIgnored {
    /// A video track.
    Video,
    /// Audio in a codec other than Opus (its MIME type).
    NotOpus(String),
    /// Audio from another source than a microphone (screen share audio, say).
    NotMicrophone(String),
    /// The participant's microphone is decoded already.
    AnotherMicrophone,
    /// [`MOST_HEARD`] tracks are decoded already.
    TooMany,
}

impl fmt::Display for TrackIgnored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackIgnored::Video => f.write_str("a video track"),
            TrackIgnored::NotOpus(mime) => write!(f, "audio in {mime}, not Opus"),
            TrackIgnored::NotMicrophone(source) => {
                write!(f, "audio from {source}, not a microphone")
            }
            TrackIgnored::AnotherMicrophone => f.write_str("a second microphone"),
            TrackIgnored::TooMany => write!(f, "{MOST_HEARD} tracks are heard already"),
        }
    }
}

/// What is known of a track when it arrives.
#[derive(Debug, Clone, Copy)]
pub struct ArrivingTrack<'a> {
    pub identity: &'a str,
    pub audio: bool,
    /// The server's description of it (`TrackInfo`), if it sent one.
    pub info: Option<&'a proto::TrackInfo>,
}

/// The tracks being decoded in one room, by their participants.
#[derive(Debug, Default)]
pub struct Hearing {
    heard: HashSet<String>,
}

impl Hearing {
    /// Whether `track` is decoded; if so its participant's place is taken until
    /// [`Hearing::ended`].
    pub fn admit(&mut self, track: ArrivingTrack<'_>) -> Result<(), TrackIgnored> {
        let video = proto::TrackType::Video as i32;
        if !track.audio || track.info.is_some_and(|i| i.r#type == video) {
            return Err(TrackIgnored::Video);
        }
        if let Some(info) = track.info {
            let source =
                proto::TrackSource::try_from(info.source).unwrap_or(proto::TrackSource::Unknown);
            // A client that names no source is taken as publishing its microphone.
            if !matches!(
                source,
                proto::TrackSource::Microphone | proto::TrackSource::Unknown
            ) {
                return Err(TrackIgnored::NotMicrophone(
                    source.as_str_name().to_lowercase(),
                ));
            }
            if !info.mime_type.is_empty() && !is_opus(&info.mime_type) {
                return Err(TrackIgnored::NotOpus(info.mime_type.clone()));
            }
        }
        if self.heard.contains(track.identity) {
            return Err(TrackIgnored::AnotherMicrophone);
        }
        if self.heard.len() >= MOST_HEARD {
            return Err(TrackIgnored::TooMany);
        }
        self.heard.insert(track.identity.to_owned());
        Ok(())
    }

    /// `identity`'s decoded track ended: its place is free.
    pub fn ended(&mut self, identity: &str) {
        self.heard.remove(identity);
    }
}

/// Whether a MIME type names Opus (`audio/opus`, any case).
pub fn is_opus(mime: &str) -> bool {
    mime.eq_ignore_ascii_case("audio/opus")
}

/// A track's audio taken no faster than real time: a bucket of `burst` samples, filled at
/// the sample rate, that each packet's samples must fit in. A sender that pauses (a muted
/// or silent client sends nothing) gains at most `burst`; a late burst of packets after a
/// network stall up to it goes through.
#[derive(Debug)]
pub struct Pace {
    rate: f64,
    burst: f64,
    credit: f64,
    last: Option<Instant>,
}

impl Pace {
    /// At `rate` samples a second, with `burst` samples of slack.
    pub fn new(rate: u32, burst: usize) -> Self {
        Self {
            rate: f64::from(rate),
            burst: burst as f64,
            credit: burst as f64,
            last: None,
        }
    }

    /// Whether a packet of `samples` arriving at `now` is taken.
    pub fn take(&mut self, now: Instant, samples: usize) -> bool {
        if let Some(last) = self.last {
            let gained = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.credit = (self.credit + gained).min(self.burst);
        }
        self.last = Some(now);
        let samples = samples as f64;
        if samples > self.credit {
            return false;
        }
        self.credit -= samples;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn info(r#type: proto::TrackType, source: proto::TrackSource, mime: &str) -> proto::TrackInfo {
        proto::TrackInfo {
            r#type: r#type as i32,
            source: source as i32,
            mime_type: mime.into(),
            ..Default::default()
        }
    }

    fn track<'a>(
        identity: &'a str,
        audio: bool,
        info: Option<&'a proto::TrackInfo>,
    ) -> ArrivingTrack<'a> {
        ArrivingTrack {
            identity,
            audio,
            info,
        }
    }

    #[test]
    fn only_each_participants_first_opus_microphone_is_heard() {
        use proto::{TrackSource as S, TrackType as T};
        let mut hearing = Hearing::default();
        let vp8 = info(T::Video, S::Camera, "video/VP8");
        assert_eq!(
            hearing.admit(track("a", false, Some(&vp8))),
            Err(TrackIgnored::Video)
        );
        // A video track the server described as audio is still not decoded.
        assert_eq!(
            hearing.admit(track("a", false, None)),
            Err(TrackIgnored::Video)
        );
        let screen = info(T::Audio, S::ScreenShareAudio, "audio/opus");
        assert!(matches!(
            hearing.admit(track("a", true, Some(&screen))),
            Err(TrackIgnored::NotMicrophone(_))
        ));
        let pcmu = info(T::Audio, S::Microphone, "audio/PCMU");
        assert_eq!(
            hearing.admit(track("a", true, Some(&pcmu))),
            Err(TrackIgnored::NotOpus("audio/PCMU".into()))
        );
        let mic = info(T::Audio, S::Microphone, "audio/opus");
        assert_eq!(hearing.admit(track("a", true, Some(&mic))), Ok(()));
        assert_eq!(
            hearing.admit(track("a", true, Some(&mic))),
            Err(TrackIgnored::AnotherMicrophone)
        );
        assert_eq!(hearing.admit(track("b", true, None)), Ok(()));
        hearing.ended("a");
        assert_eq!(hearing.admit(track("a", true, Some(&mic))), Ok(()));
    }

    #[test]
    fn a_room_decodes_at_most_its_most_tracks() {
        let mut hearing = Hearing::default();
        let names: Vec<String> = (0..=MOST_HEARD).map(|i| format!("p{i}")).collect();
        for name in &names[..MOST_HEARD] {
            assert_eq!(hearing.admit(track(name, true, None)), Ok(()));
        }
        assert_eq!(
            hearing.admit(track(&names[MOST_HEARD], true, None)),
            Err(TrackIgnored::TooMany)
        );
        hearing.ended("p0");
        assert_eq!(hearing.admit(track(&names[MOST_HEARD], true, None)), Ok(()));
    }

    /// 20 ms packets at 48 kHz, sent `speed` times faster than real time for `seconds`:
    /// the seconds of audio taken.
    fn taken_at(speed: f64, seconds: f64) -> f64 {
        let mut pace = Pace::new(48_000, 48_000);
        let start = Instant::now();
        let packets = (seconds * speed / 0.02) as usize;
        let mut taken = 0;
        for i in 0..packets {
            let at = start + Duration::from_secs_f64(i as f64 * 0.02 / speed);
            if pace.take(at, 960) {
                taken += 960;
            }
        }
        taken as f64 / 48_000.0
    }

    #[test]
    fn audio_beyond_real_time_is_dropped() {
        // In real time, everything.
        assert!((taken_at(1.0, 10.0) - 10.0).abs() < 0.03);
        // Four times too fast for 10 s: the 10 s that passed and the one of slack.
        let flood = taken_at(4.0, 10.0);
        assert!((10.5..=11.05).contains(&flood), "{flood}");
    }

    #[test]
    fn a_pause_earns_no_more_than_the_burst() {
        let mut pace = Pace::new(48_000, 48_000);
        let start = Instant::now();
        assert!(pace.take(start, 960));
        // A minute of silence, then three seconds of audio at once: one second taken.
        let later = start + Duration::from_secs(60);
        let taken = (0..150).filter(|_| pace.take(later, 960)).count();
        assert_eq!(taken, 50);
    }
}
