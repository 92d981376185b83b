//! When the caller speaks and when they have finished.
//!
//! Three parts, policy apart from mechanism:
//! - [`vad`]: Silero VAD v6 on 32 ms frames at 16 kHz, its recurrent state carried across frames;
//! - [`smart_turn`]: the Smart Turn v3.2 end-of-turn model on the last 8 s of audio;
//! - [`endpoint`]: the pure rules that turn speech probabilities and an end-of-turn score
//!   into speech-started, speech-stopped and end-of-turn events.
//!
//! [`TurnDetector`] wires the three for a stream of audio.

pub mod endpoint;
pub mod mel;
pub mod smart_turn;
pub mod vad;

mod detector;

pub use detector::{TurnDetector, TurnEvent};
pub use endpoint::{EndpointConfig, EndpointEvent, Endpointer};
pub use smart_turn::SmartTurn;
pub use vad::{SileroVad, VAD_FRAME};
