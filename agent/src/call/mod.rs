//! One call, whatever brings its audio: a recording played in (`recorded`), a live caller
//! (`live`: a LiveKit room, a microphone), and the caller's side both share (`caller`:
//! turn events dispatched, turns answered on the responder's thread), told to whoever
//! watches (`observer`).
//!
//! The files depend one way: `observer` ← `caller` ← `live` ← `recorded` (a recording in
//! real time is played as a live call).

mod caller;
mod live;
mod observer;
mod recorded;

pub use observer::{CallObserver, Interruption, InterruptionOutcome, Quiet, WordCheck};
pub use recorded::{CallOutcome, Echo, Pacing, ReplyTrack};
