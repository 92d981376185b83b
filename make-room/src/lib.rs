//! make-room: the scheduling policy that protects a caller's turn from coding agents.
//!
//! Plain code over counts of tokens and steps, with no model and no clock of its own, so
//! that [`sim`] can drive it through millions of random workloads and check it never
//! stalls the engine. Every part has its own switch and all are off by default; with all
//! off, and among equal priorities with any on, it schedules as the stock engine does:
//! first come first served, whole prompts, up to `max_running` sequences.
//!
//! - **priority**: waiting requests are admitted by (priority, arrival), lower first;
//! - **KV preemption**: when the most urgent waiting request has no KV room, up to two
//!   lower-priority running requests are preempted (newest first, the engine's own victim
//!   order), none if two would not make the room; they resume from their cached prefix;
//! - **budget cap**: while a more urgent request prefills or decodes its first
//!   `window_tokens`, less urgent prefill (and, with the decode hold, decoding) waits; no
//!   request waits more than `window_tokens` steps in a row for it; optionally
//!   (`release_at_first_sentence`) the hold ends when the call's agent says the reply's
//!   first sentence is out; after it, while the reply decodes, less urgent prefill goes
//!   into one step of `reply_pace_steps`, so the rest of the reply keeps ahead of speech;
//! - **turn hint**: a caller who just stopped speaking holds less urgent prefill for
//!   `hint_hold_ms` so the turn that follows finds room;
//! - **call retention**: a finished call turn's KV stays cached for the call's next turn.
//!
//! Prompt chunking (`chunk_tokens`) and the KV budget are mechanism, not policy: they
//! apply with every switch off too.

mod admission;
mod policy;
pub mod sim;
mod types;

pub use admission::{Admitted, RequestKind};
pub use policy::Scheduler;
pub use types::{Counters, Plan, PolicyConfig, Refused, Request, Switches};
