//! Why a room call or a worker stopped: enums for callers to branch on, each shown as the
//! sentence the binaries print.

use std::fmt;
use std::time::Duration;

/// Why a call in a room ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEnd {
    /// The participant the agent answered left the room.
    CallerLeft { identity: String },
    /// The agent was asked to hang up (a drain): once no turn was in progress, or after the
    /// grace period with one still going.
    HungUp {
        turn_in_progress: bool,
        grace: Duration,
    },
    /// Nobody spoke in the room for this long after the agent joined.
    NobodySpoke(Duration),
    /// The caller's audio stopped arriving for this long while they stayed in the room
    /// unmuted (`CallOptions::media_timeout`).
    MediaStopped(Duration),
    /// The caller's microphone stayed muted this long (`CallOptions::muted_timeout`).
    MutedTooLong(Duration),
    /// The call reached its longest (`CallOptions::max_length`).
    TooLong(Duration),
    /// The room's connection ended: the server's reason, or no reason when its events
    /// stopped.
    SignalLost { reason: Option<String> },
    /// The agent stopped taking the caller's audio.
    AgentStopped,
}

impl fmt::Display for CallEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallEnd::CallerLeft { identity } => write!(f, "{identity} left the room"),
            CallEnd::HungUp {
                turn_in_progress: false,
                ..
            } => {
                write!(f, "the agent hung up after the turn in progress")
            }
            CallEnd::HungUp { grace, .. } => write!(
                f,
                "the agent hung up; a turn was still in progress after {} s",
                grace.as_secs()
            ),
            CallEnd::NobodySpoke(after) => {
                write!(f, "nobody spoke in the room for {} s", after.as_secs())
            }
            CallEnd::MediaStopped(after) => {
                write!(f, "the caller's audio stopped for {} s", after.as_secs())
            }
            CallEnd::MutedTooLong(after) => {
                write!(f, "the caller stayed muted for {} s", after.as_secs())
            }
            CallEnd::TooLong(after) => {
                write!(f, "the call reached its longest, {} s", after.as_secs())
            }
            CallEnd::SignalLost {
                reason: Some(reason),
            } => f.write_str(reason),
            CallEnd::SignalLost { reason: None } => write!(f, "the room connection ended"),
            CallEnd::AgentStopped => write!(f, "the agent stopped listening"),
        }
    }
}

/// Why a worker stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerEnd {
    /// Asked to drain, it finished its calls (`calls_were_running`: whether any was).
    Drained { calls_were_running: bool },
    /// The connection dropped and every attempt to register again failed.
    Failed(String),
}

impl fmt::Display for WorkerEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerEnd::Drained {
                calls_were_running: true,
            } => write!(f, "drained: every call ended"),
            WorkerEnd::Drained {
                calls_were_running: false,
            } => write!(f, "drained: no calls were running"),
            WorkerEnd::Failed(error) => f.write_str(error),
        }
    }
}
