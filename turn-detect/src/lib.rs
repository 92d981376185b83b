//! When the caller speaks and when they have finished.
//!
//! Three parts, policy apart from mechanism:
//! - [`vad`]: Silero VAD v6 on 32 ms frames at 16 kHz, its recurrent state carried across frames;
//! - [`smart_turn`]: the Smart Turn v3.2 end-of-turn model on the last 8 s of audio;
//! - [`endpoint`]: the pure rules that turn speech probabilities, an end-of-turn score and
//!   the transcript's cue into speech-started, speech-stopped and end-of-turn events;
//! - [`transcript_cue`]: the pure rules that read a cue from the caller's last words;
//! - [`level_gate`]: the pure rule that speech well below the caller's own level (a voice
//!   behind them, the agent's echo) is not the caller's.
//!
//! [`TurnDetector`] wires the three for a stream of audio.

pub mod endpoint;
pub mod level_gate;
pub mod mel;
pub mod smart_turn;
pub mod transcript_cue;
pub mod vad;

mod detector;

pub use detector::{TurnDetector, TurnEvent, TURN_PAD_S};
pub use endpoint::{EndpointConfig, EndpointEvent, Endpointer};
pub use level_gate::{LevelGate, LevelGateConfig};
pub use smart_turn::SmartTurn;
pub use transcript_cue::{transcript_cue, TranscriptCue};
pub use vad::{SileroVad, VAD_FRAME};
