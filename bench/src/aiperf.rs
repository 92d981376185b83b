//! AIPerf, NVIDIA's benchmark client, as the agents' driver: a tool no one here wrote
//! replays the agent sessions against the OpenAI-compatible API, and its own per-request
//! records become the round's agent calls.
//!
//! AIPerf runs offline: it sizes its prompts with the model's tokenizer, which it loads
//! through Hugging Face's libraries. The engine's tokenizer is written out as a
//! `tokenizer.json` in a local Hugging Face cache (`HF_HOME`, hub layout), since AIPerf's
//! prompt workers set `HF_HUB_OFFLINE` and then take a plain folder for a hub name.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::mooncake::{shared_block, to_mooncake};
use crate::stats::AgentCallRecord;
use crate::trace::{jsonl, AgentCall};

/// The tokenizer's name in the local cache.
const TOKENIZER: &str = "sublet/engine-tokenizer";
/// Each session starts again as a new task this often through the window, seconds.
pub const TASK_EVERY_S: f64 = 60.0;
/// How long AIPerf may take to send its first request (it starts seven processes and
/// builds every prompt first).
const START_LIMIT: Duration = Duration::from_secs(180);
/// How long its requests in flight may run on after the window before it is stopped.
const GRACE_S: u64 = 60;

/// AIPerf, ready to drive rounds: its program and the folder its files go to.
pub struct AiPerf {
    program: PathBuf,
    dir: PathBuf,
    model: String,
}

impl AiPerf {
    /// AIPerf at `program` (the `aiperf` of its virtual environment), with the engine's
    /// tokenizer (`tokenizer_json`) written into `dir` for it.
    pub fn prepare(program: &Path, dir: &Path, tokenizer_json: &str, model: &str) -> Result<Self> {
        if !program.is_file() {
            bail!("no AIPerf at {}", program.display());
        }
        // Hub layout: refs/main names the snapshot that holds the files.
        let revision = "0000000000000000000000000000000000000001";
        let repo = dir
            .join("hf/hub")
            .join(format!("models--{}", TOKENIZER.replace('/', "--")));
        let snapshot = repo.join("snapshots").join(revision);
        std::fs::create_dir_all(&snapshot)?;
        std::fs::create_dir_all(repo.join("refs"))?;
        std::fs::write(repo.join("refs/main"), revision)?;
        std::fs::write(snapshot.join("tokenizer.json"), tokenizer_json)?;
        // Without a class AIPerf's loader finds no special tokens; the engine's own
        // tokenizer.json holds them, so the fast class reads them from there.
        std::fs::write(
            snapshot.join("tokenizer_config.json"),
            "{\"tokenizer_class\": \"PreTrainedTokenizerFast\"}\n",
        )?;
        Ok(Self {
            program: program.to_owned(),
            dir: dir.to_owned(),
            model: model.to_owned(),
        })
    }

    /// Starts AIPerf on `calls` for round `round` and returns once the engine has its first
    /// request (`started` says so), so that the round's clock starts with the agents' load.
    pub fn start(
        &self,
        base_url: &str,
        calls: &[AgentCall],
        window: Duration,
        round: usize,
        started: impl Fn() -> bool,
    ) -> Result<Running> {
        let dir = self.dir.join(format!("round-{round}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let trace = dir.join("trace.jsonl");
        std::fs::write(
            &trace,
            to_mooncake(calls, window.as_secs_f64(), TASK_EVERY_S),
        )?;
        let log = std::fs::File::create(dir.join("aiperf.log"))?;
        let artifacts = dir.join("artifacts");
        let mut command = Command::new(&self.program);
        command
            .arg("profile")
            .args(["--model", &self.model, "--url", base_url])
            .args(["--endpoint-type", "chat", "--streaming"])
            .arg("--input-file")
            .arg(&trace)
            .args([
                "--custom-dataset-type",
                "mooncake_trace",
                "--fixed-schedule",
            ])
            .args(["--tokenizer", TOKENIZER])
            // The shared context is one block: its text the same in every session's
            // first call (the engine's prefix cache holds it once).
            .args(shared_block(calls).map(|n| format!("--isl-block-size={n}")))
            .arg("--artifact-dir")
            .arg(&artifacts)
            .args(["--benchmark-duration", &format!("{}", window.as_secs())])
            .args(["--benchmark-grace-period", &GRACE_S.to_string()])
            // Few processes: they share two cores with the engine and the calls.
            .args(["--workers-max", "1", "--record-processors", "1"])
            .args([
                "--ui-type",
                "none",
                "--no-server-metrics",
                "--no-gpu-telemetry",
            ])
            // AIPerf's prompt text comes from its seed: each round its own, as the
            // replayer opens each round's prompts with its number, or a pair's second round
            // would find the first's prompts in the engine's prefix cache (a run seeded by
            // the pair saw its second rounds' agents 3-4 times as fast as its first's). The
            // pair's rounds share the trace: the sessions' lengths and pauses.
            .args(["--random-seed", &(1000 + round).to_string()])
            .arg("--use-server-token-count")
            .env("HF_HOME", self.dir.join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so that stopping it stops every process it started.
            .process_group(0);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        // From here on, dropping `running` stops AIPerf.
        let mut running = Running {
            child,
            artifacts,
            window,
            log: dir.join("aiperf.log"),
        };
        let until = Instant::now() + START_LIMIT;
        while !started() {
            if let Some(status) = running.child.try_wait()? {
                bail!(
                    "AIPerf ended ({status}) before sending a request: see {}",
                    running.log.display()
                );
            }
            if Instant::now() > until {
                bail!("AIPerf sent no request in {START_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(running)
    }
}

/// AIPerf replaying a round's sessions.
pub struct Running {
    child: Child,
    artifacts: PathBuf,
    window: Duration,
    log: PathBuf,
}

impl Running {
    /// Waits for AIPerf to end (stopping it once `stop` has been set for longer than its
    /// grace period) and reads its records; times are made relative to `round_start`, the
    /// moment that was `round_start_unix` on the wall clock.
    pub fn finish(
        mut self,
        stop: &AtomicBool,
        round_start: Instant,
        round_start_unix: SystemTime,
    ) -> Result<Vec<AgentCallRecord>> {
        let deadline = round_start + self.window + Duration::from_secs(GRACE_S + 30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("AIPerf failed ({status}): see {}", self.log.display());
                }
                break;
            }
            if stop.load(Ordering::Relaxed) && Instant::now() > deadline {
                self.stop();
                bail!("AIPerf ran past its window and grace period; stopped");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let path = self.artifacts.join("profile_export.jsonl");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading AIPerf's records at {}", path.display()))?;
        let start_ns = round_start_unix
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        records(&text, start_ns)
    }
}

impl Running {
    /// Stops AIPerf's whole process group: asked first, then killed.
    fn stop(&mut self) {
        let group = format!("-{}", self.child.id());
        let signal = |name: &str| {
            let _ = Command::new("kill")
                .args([name, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM");
        let until = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        signal("-KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    /// A round that failed before it read AIPerf's records leaves no AIPerf behind.
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            self.stop();
        }
    }
}

/// AIPerf's per-request records (`profile_export.jsonl`) as agent calls, times relative to
/// `round_start_ns` (nanoseconds since the Unix epoch, as AIPerf's own are). Warm-up
/// requests are left out; a failed request keeps its error.
pub fn records(text: &str, round_start_ns: u128) -> Result<Vec<AgentCallRecord>> {
    let mut calls = Vec::new();
    for (n, record) in jsonl::<Value>(text, "AIPerf record")? {
        let meta = &record["metadata"];
        if meta["benchmark_phase"].as_str().unwrap_or("profiling") != "profiling" {
            continue;
        }
        let at_s = |key: &str| -> Result<f64> {
            let ns = meta[key]
                .as_u64()
                .with_context(|| format!("AIPerf record {n}: no {key}"))?;
            Ok((i128::from(ns) - round_start_ns as i128) as f64 / 1e9)
        };
        let metric = |key: &str| record["metrics"][key]["value"].as_f64();
        let started_s = at_s("request_start_ns")?;
        let first_token_s = metric("time_to_first_token").map(|ms| ms / 1000.0);
        let mut token_times_s = Vec::new();
        if let Some(first) = first_token_s {
            let mut at = started_s + first;
            token_times_s.push(at);
            let gaps = record["metrics"]["inter_chunk_latency"]["value"].as_array();
            for gap in gaps.into_iter().flatten().filter_map(Value::as_f64) {
                at += gap / 1000.0;
                token_times_s.push(at);
            }
        }
        let ms3 = |s: f64| (s * 1000.0).round() / 1000.0;
        calls.push(AgentCallRecord {
            session: meta["conversation_id"].as_str().unwrap_or("").to_owned(),
            started_s: ms3(started_s),
            first_token_s,
            ended_s: ms3(at_s("request_end_ns")?),
            output_tokens: metric("output_sequence_length")
                .or_else(|| metric("usage_completion_tokens"))
                .unwrap_or(0.0) as usize,
            token_times_s: token_times_s.into_iter().map(ms3).collect(),
            error: record
                .get("error")
                .filter(|e| !e.is_null())
                .map(|e| e["message"].as_str().unwrap_or("failed").to_owned()),
        });
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aiperf_records_become_agent_calls() {
        // As AIPerf 0.13 writes them (trimmed): absolute wall-clock nanoseconds, metrics
        // in milliseconds.
        let text = r#"{"metadata":{"conversation_id":"agent-1.0","turn_index":1,"request_start_ns":1796222541491145208,"request_end_ns":1796222541559104005,"benchmark_phase":"profiling"},"metrics":{"time_to_first_token":{"value":12.0,"unit":"ms"},"inter_chunk_latency":{"value":[10.0,20.0],"unit":"ms"},"output_sequence_length":{"value":3,"unit":"tokens"}}}
{"metadata":{"conversation_id":"agent-2.0","request_start_ns":1796222542491145208,"request_end_ns":1796222542591145208,"benchmark_phase":"profiling"},"metrics":{"error_isl":{"value":50}},"error":{"type":"ClientConnectorError","message":"connection refused"}}
{"metadata":{"conversation_id":"w","request_start_ns":1796222540491145208,"request_end_ns":1796222540591145208,"benchmark_phase":"warmup"},"metrics":{}}
"#;
        let start = 1_796_222_541_491_145_208u128 - 2_000_000_000;
        let calls = records(text, start).unwrap();
        assert_eq!(calls.len(), 2, "the warm-up request is left out");
        let ok = &calls[0];
        assert_eq!(ok.session, "agent-1.0");
        assert_eq!(ok.started_s, 2.0);
        assert_eq!(ok.first_token_s, Some(0.012));
        assert_eq!(ok.token_times_s, vec![2.012, 2.022, 2.042]);
        assert_eq!((ok.output_tokens, ok.ended_s), (3, 2.068));
        assert_eq!(ok.error, None);
        assert_eq!(calls[1].error.as_deref(), Some("connection refused"));
        assert_eq!(calls[1].first_token_s, None);
        assert!(records("not json", 0).is_err());
    }
}
