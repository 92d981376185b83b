//! How long a room call may go on: the flags `room` and `worker` share, checked when
//! parsed (a negative, absurd or non-numeric number of seconds is a usage error, not a
//! panic).

use std::time::Duration;

use clap::Args;

/// The most seconds a limit takes (a year): beyond it a limit means nothing.
const MOST_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// When the agent hangs up on its own.
#[derive(Args, Debug, Clone)]
pub struct CallLimits {
    /// Hang up on a caller whose audio stopped arriving (unmuted, still in the room) for
    /// this many seconds; 0: never.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = seconds)]
    pub media_timeout: f64,
    /// Hang up on a caller whose microphone stays muted this many seconds; 0: never.
    #[arg(long, value_name = "SECONDS", default_value = "300", value_parser = seconds)]
    pub muted_timeout: f64,
    /// Hang up this many seconds after the caller was first heard; 0: no limit.
    #[arg(long, value_name = "SECONDS", default_value = "3600", value_parser = seconds)]
    pub max_call: f64,
}

/// A number of seconds from 0 to a year.
fn seconds(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=MOST_SECONDS).contains(&value) {
        return Err(format!(
            "{text} s is not between 0 and {MOST_SECONDS} (a year)"
        ));
    }
    Ok(value)
}

/// `seconds` as a limit, 0 as none.
fn limit(seconds: f64) -> Option<Duration> {
    (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

impl CallLimits {
    /// Each room call's options under these limits.
    pub fn room_options(&self) -> sublet_livekit::CallOptions {
        sublet_livekit::CallOptions {
            media_timeout: limit(self.media_timeout),
            muted_timeout: limit(self.muted_timeout),
            max_length: limit(self.max_call),
            ..sublet_livekit::CallOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: CallLimits,
    }

    #[test]
    fn limits_default_to_the_options_and_zero_means_none() {
        let defaults = Cli::parse_from(["x"]).limits.room_options();
        let options = sublet_livekit::CallOptions::default();
        assert_eq!(defaults, options);
        let none = Cli::parse_from(["x", "--muted-timeout", "0", "--max-call", "0"]);
        let none = none.limits.room_options();
        assert_eq!((none.muted_timeout, none.max_length), (None, None));
        let set = Cli::parse_from(["x", "--max-call", "90"])
            .limits
            .room_options();
        assert_eq!(set.max_length, Some(Duration::from_secs(90)));
    }

    #[test]
    fn absurd_seconds_are_usage_errors() {
        for bad in ["-1", "1e30", "NaN", "inf", "soon"] {
            for flag in ["--media-timeout", "--muted-timeout", "--max-call"] {
                let error = Cli::try_parse_from(["x", flag, bad]).err();
                assert!(error.is_some(), "{flag} {bad} was taken");
            }
        }
    }
}
