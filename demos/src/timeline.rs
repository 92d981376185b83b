//! A call's timeline on disk, kept current as the call goes: rewritten whole after every
//! answered turn (a temporary file renamed over it), so a call that ends in an error or is
//! killed leaves every turn answered until then, and a reader never sees half a file. It
//! is a view of the call's record (`sublet_agent::call_log`), kept beside it for `playback` and `mic`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Map, Value};
use sublet_agent::{CallObserver, Interruption, TurnRecord};
use sublet_turn_detect::TurnEvent;

use sublet_agent::call_log::CallLog;

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

/// A call's observer (its progress on stderr, say) that keeps the call's record: each
/// answered turn appended to its [`CallLog`] and, where one is kept, its timeline file (a
/// view of the same turns as one JSON document), and the call's end.
pub struct Recorded<O> {
    pub inner: O,
    log: Option<CallLog>,
    timeline: Option<TimelineFile>,
}

impl<O> Recorded<O> {
    pub fn new(inner: O, log: CallLog, timeline: Option<TimelineFile>) -> Self {
        Self {
            inner,
            log: Some(log),
            timeline,
        }
    }

    /// The call failed with `error`: the record's end says so (the timeline stays
    /// incomplete). Returns the error, for the caller to report.
    pub fn failed(&mut self, error: anyhow::Error) -> anyhow::Error {
        let fields = Map::from_iter([("error".to_string(), Value::from(format!("{error:#}")))]);
        if let Some(log) = self.log.take() {
            if let Err(e) = log.end(fields) {
                tracing::warn!("records: {e:#}");
            }
        }
        error
    }

    /// The call is over: `fields` end its record and complete its timeline.
    pub fn finish(&mut self, fields: Map<String, Value>) -> Result<()> {
        if let Some(timeline) = self.timeline.take() {
            timeline.finish(fields.clone())?;
        }
        match self.log.take() {
            Some(log) => log.end(fields),
            None => Ok(()),
        }
    }
}

impl<O: CallObserver> CallObserver for Recorded<O> {
    fn turn_event(&mut self, event: &TurnEvent) {
        self.inner.turn_event(event);
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        self.inner.turn_answered(turn);
        if let Some(log) = &mut self.log {
            if let Err(e) = log.turn(turn) {
                tracing::warn!("records: {e:#}");
            }
        }
        if let Some(timeline) = &mut self.timeline {
            if let Err(e) = timeline.add(turn) {
                tracing::warn!("timeline: {e:#}");
            }
        }
    }

    fn interruption(&mut self, interruption: &Interruption) {
        self.inner.interruption(interruption);
    }

    fn partial_transcript(&mut self, text: &str) {
        self.inner.partial_transcript(text);
    }

    fn call_ended(&mut self, reason: &str) {
        self.inner.call_ended(reason);
        let fields = Map::from_iter([("reason".to_string(), Value::from(reason))]);
        if let Err(e) = self.finish(fields) {
            tracing::warn!("records: {e:#}");
        }
    }
}
