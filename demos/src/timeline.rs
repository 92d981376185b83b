//! A call's timeline on disk, kept current as the call goes: rewritten whole after every
//! answered turn (a temporary file renamed over it), so a call that ends in an error or is
//! killed leaves every turn answered until then, and a reader never sees half a file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Map, Value};
use sublet_agent::{CallObserver, Interruption, TurnRecord};
use sublet_turn_detect::TurnEvent;

/// The timeline file: the call's fields, `"turns"` so far, and `"complete"`, true once the
/// call has ended as it should.
pub struct TimelineFile {
    path: PathBuf,
    fields: Map<String, Value>,
    turns: Vec<TurnRecord>,
}

impl TimelineFile {
    /// Starts the timeline at `path` with `fields` beside its turns, written at once.
    pub fn create(path: &Path, fields: Map<String, Value>) -> Result<Self> {
        let file = Self {
            path: path.to_owned(),
            fields,
            turns: Vec::new(),
        };
        file.write(false)?;
        Ok(file)
    }

    /// Adds an answered turn, on disk at once.
    pub fn add(&mut self, turn: &TurnRecord) -> Result<()> {
        self.turns.push(turn.clone());
        self.write(false)
    }

    /// The call is over: `fields` added, and the timeline marked complete.
    pub fn finish(mut self, fields: Map<String, Value>) -> Result<()> {
        self.fields.extend(fields);
        self.write(true)
    }

    fn write(&self, complete: bool) -> Result<()> {
        let mut object = self.fields.clone();
        object.insert("complete".into(), complete.into());
        object.insert("turns".into(), serde_json::to_value(&self.turns)?);
        let mut partial = self.path.clone().into_os_string();
        partial.push(".partial");
        std::fs::write(&partial, serde_json::to_string_pretty(&object)? + "\n")
            .with_context(|| format!("writing {}", self.path.display()))?;
        std::fs::rename(&partial, &self.path)
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// A call's observer (its progress on stderr, say), each answered turn also into its
/// timeline file.
pub struct Recorded<'a, O> {
    pub inner: O,
    pub timeline: &'a mut TimelineFile,
}

impl<O: CallObserver> CallObserver for Recorded<'_, O> {
    fn turn_event(&mut self, event: &TurnEvent) {
        self.inner.turn_event(event);
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        self.inner.turn_answered(turn);
        if let Err(e) = self.timeline.add(turn) {
            eprintln!("timeline: {e:#}");
        }
    }

    fn interruption(&mut self, interruption: &Interruption) {
        self.inner.interruption(interruption);
    }

    fn partial_transcript(&mut self, text: &str) {
        self.inner.partial_transcript(text);
    }
}
