//! Every call's turns kept on disk as each turn ends: one JSON-lines file per call in a
//! records directory (the demos' `--records DIR`), a line for the call, one per turn, and
//! one for how the call ended. Each line is written whole in one write and synced before the next turn,
//! so a call killed at any moment leaves every finished turn readable; a reader skips a
//! last line cut short.
//!
//! ```text
//! {"call":{"program":"playback","call":"three_turns.wav",...}}
//! {"turn":{"index":1,"transcript":"...","reply":"...","caller_stop_s":3.74,...}}
//! {"ended":{"reason":"the recording ended"}}
//! ```

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::record::TurnRecord;
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

/// One call's record, open for its turns.
#[derive(Debug)]
pub struct CallLog {
    path: PathBuf,
    file: File,
}

impl CallLog {
    /// Starts a call's record in `dir` (created if need be), named by the time, the
    /// program and `call`, its first line `{"call": fields}` with the program added.
    pub fn create(
        dir: &Path,
        program: &str,
        call: &str,
        mut fields: Map<String, Value>,
    ) -> Result<Self> {
        // What callers said: the directory and each record readable by their owner only.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating the records directory {}", dir.display()))?;
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let name: String = call
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .take(80)
            .collect();
        let path = dir.join(format!("{millis}-{program}-{name}.jsonl"));
        let file = File::options()
            .create_new(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut log = Self { path, file };
        fields.insert("program".into(), program.into());
        fields.insert("call".into(), call.into());
        log.line(json!({ "call": fields }))?;
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a finished turn, on disk before it returns.
    pub fn turn(&mut self, turn: &TurnRecord) -> Result<()> {
        self.line(json!({ "turn": turn }))
    }

    /// The call is over: how it ended, the record's last line.
    pub fn end(mut self, fields: Map<String, Value>) -> Result<()> {
        self.line(json!({ "ended": fields }))
    }

    fn line(&mut self, value: Value) -> Result<()> {
        let mut text = serde_json::to_string(&value)?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// A call's record read back.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    pub call: Map<String, Value>,
    pub turns: Vec<TurnRecord>,
    /// How the call ended; `None` when it was cut off (killed, crashed).
    pub ended: Option<Map<String, Value>>,
}

/// Reads a call's record; a last line cut short (the process killed mid-write) is skipped,
/// a bad line anywhere else is an error.
pub fn read_call_record(path: &Path) -> Result<CallRecord> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut record = CallRecord {
        call: Map::new(),
        turns: Vec::new(),
        ended: None,
    };
    let lines: Vec<&str> = text.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        let value = match parsed {
            Ok(value) => value,
            Err(_) if at + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => return Err(e).with_context(|| format!("{}:{}", path.display(), at + 1)),
        };
        let mut object = match value {
            Value::Object(object) => object,
            other => anyhow::bail!("{}:{}: not an object: {other}", path.display(), at + 1),
        };
        if let Some(Value::Object(call)) = object.remove("call") {
            record.call = call;
        } else if let Some(turn) = object.remove("turn") {
            record.turns.push(
                serde_json::from_value(turn)
                    .with_context(|| format!("{}:{}", path.display(), at + 1))?,
            );
        } else if let Some(Value::Object(ended)) = object.remove("ended") {
            record.ended = Some(ended);
        }
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(index: usize) -> TurnRecord {
        serde_json::from_value(json!({
            "index": index, "transcript": "What is two plus two?", "reply": "Four.",
            "caller_stop_s": 1.0, "end_of_turn_s": 1.5, "transcript_s": 1.5,
            "first_token_s": 1.6, "first_sentence_s": 1.7, "first_audio_s": 1.8,
            "end_of_turn_score": 0.9
        }))
        .unwrap()
    }

    #[test]
    fn a_record_reads_back_and_a_torn_last_line_is_skipped() {
        let dir = std::env::temp_dir().join(format!("sublet-records-{}", std::process::id()));
        let mut log =
            CallLog::create(&dir, "playback", "a call/with odd name.wav", Map::new()).unwrap();
        let path = log.path().to_owned();
        // What callers said is readable by the records' owner only, whatever the umask.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&path)), (0o700, 0o600));
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with("-playback-a_call_with_odd_name.wav.jsonl"));
        log.turn(&turn(1)).unwrap();
        log.turn(&turn(2)).unwrap();
        // Killed now: two turns, no end.
        let cut = read_call_record(&path).unwrap();
        assert_eq!((cut.turns.len(), cut.ended.is_none()), (2, true));
        assert_eq!(cut.call["program"], "playback");
        // Killed mid-line: the torn line is skipped.
        let whole = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{whole}{{\"turn\":{{\"index\":3,\"trans")).unwrap();
        assert_eq!(read_call_record(&path).unwrap().turns.len(), 2);
        // A bad line that is not the last is an error.
        std::fs::write(&path, format!("garbage\n{whole}")).unwrap();
        assert!(read_call_record(&path).is_err());
        std::fs::write(&path, &whole).unwrap();
        let log = CallLog {
            file: File::options().append(true).open(&path).unwrap(),
            path: path.clone(),
        };
        log.end(Map::from_iter([("reason".into(), "done".into())]))
            .unwrap();
        let ended = read_call_record(&path).unwrap();
        assert_eq!(ended.turns, [turn(1), turn(2)]);
        assert_eq!(ended.ended.unwrap()["reason"], "done");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
