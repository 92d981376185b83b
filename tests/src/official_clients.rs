//! LiveKit's official clients, run by the tests: the Node SDK as a caller
//! (`clients/livekit_caller.cjs`), the Agents framework as a worker
//! (`clients/livekit_worker.py`), and the browser SDK in headless Chromium on the live page
//! (`clients/view_browser.cjs`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use livekit_api::access_token::{AccessToken, VideoGrants};
use serde_json::Value;
use sublet_models::ModelCache;

/// The first question of the bundled recorded call ("Is it going to rain today?", 3.55 s
/// with its silence), written to `dir/question.wav` for a caller to publish.
pub fn recorded_question(cache: &ModelCache, dir: &Path) -> std::path::PathBuf {
    let call = sublet_audio::read_wav(cache.call("quick_questions.wav").unwrap()).unwrap();
    // "Is it going to rain today?" (2.6–4.25 s of the call) after a second of silence. The
    // call opens with "Good morning." (1.5–2.25 s) and a 0.35 s pause, which the detector
    // may rightly take for a turn of its own: whether it does is a race these tests, about
    // one answered question, must not run.
    let at = |s: f64| (s * call.rate as f64) as usize;
    let mut samples = vec![0.0; at(1.0)];
    samples.extend_from_slice(&call.samples[at(2.45)..at(5.0)]);
    let question = sublet_audio::Audio::new(samples, call.rate);
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("question.wav");
    sublet_audio::write_wav(&path, &question).unwrap();
    path
}

/// [`recorded_question`] with `before_s` of quiet before it and `after_s` after: time for
/// a caller to join, or for a greeting, and for the reply.
pub fn question_between_quiet(
    cache: &ModelCache,
    dir: &Path,
    before_s: f64,
    after_s: f64,
) -> sublet_audio::Audio {
    let question = sublet_audio::read_wav(recorded_question(cache, dir)).unwrap();
    let quiet = |s: f64| vec![0.0; (s * question.rate as f64) as usize];
    let samples = [quiet(before_s), question.samples, quiet(after_s)].concat();
    sublet_audio::Audio::new(samples, question.rate)
}

/// An access token for `identity` to join `room`, valid for `ttl`.
pub fn room_token(key: &str, secret: &str, identity: &str, room: &str, ttl: Duration) -> String {
    AccessToken::with_api_key(key, secret)
        .with_identity(identity)
        .with_ttl(ttl)
        .with_grants(VideoGrants {
            room_join: true,
            room: room.into(),
            ..Default::default()
        })
        .to_jwt()
        .expect("a token")
}

/// Runs the caller script with `args`; returns its exit status and the JSON events it
/// printed (its log goes to this process's stderr).
pub fn livekit_caller(url: &str, token: &str, args: &[&str]) -> (bool, Vec<Value>) {
    let cache = ModelCache::from_env();
    let script = crate_dir().join("clients/livekit_caller.cjs");
    let mut node = Command::new("node");
    node.arg(script).args([url, token]).args(args).env(
        "NODE_PATH",
        cache
            .node_modules()
            .expect("setup installed the node clients"),
    );
    run_client(node)
}

/// Where the browser test finds Chromium: `SUBLET_CHROMIUM`, else Debian's `chromium`
/// (setup installs it).
pub fn chromium() -> std::path::PathBuf {
    std::env::var_os("SUBLET_CHROMIUM")
        .map(Into::into)
        .unwrap_or_else(|| "/usr/bin/chromium".into())
}

/// Opens the live page at `page_url` in headless Chromium (puppeteer-core), its fake
/// microphone playing `wav`, until it shows a whole answered turn or `seconds` pass; writes
/// a screenshot to `screenshot`. Returns the script's exit status and what the page showed.
pub fn browser_page(
    page_url: &str,
    wav: &Path,
    screenshot: &Path,
    seconds: u32,
) -> (bool, Vec<Value>) {
    let cache = ModelCache::from_env();
    let script = crate_dir().join("clients/view_browser.cjs");
    let mut node = Command::new("node");
    node.arg(script)
        .arg(page_url)
        .arg(chromium())
        .arg(wav)
        .arg(screenshot)
        .arg(seconds.to_string())
        .env(
            "NODE_PATH",
            cache
                .node_modules()
                .expect("setup installed the node clients"),
        );
    run_client(node)
}

/// Runs an official client's script; returns its exit status and the JSON events it
/// printed on stdout (its log goes to this process's stderr).
fn run_client(mut command: Command) -> (bool, Vec<Value>) {
    let output = command.output().expect("the client runs");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    let events = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (output.status.success(), events)
}

/// Runs one of the API client scripts (`clients/SCRIPT`, on the official `openai` or
/// `anthropic` Python client) against `base_url` with `api_key`; what it saw, as the one
/// JSON object it printed. Panics, with its stderr, if it fails.
pub fn api_client(script: &str, base_url: &str, api_key: &str) -> Value {
    let python = ModelCache::from_env()
        .python()
        .expect("run `cargo xtask setup` for the test clients");
    let output = Command::new(python)
        .arg(crate_dir().join("clients").join(script))
        .args([base_url, api_key])
        .output()
        .expect("the client runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "client failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("the client prints JSON");
    println!(
        "{}",
        serde_json::to_string_pretty(&seen).unwrap_or_default()
    );
    seen
}

/// Runs the worker script on LiveKit's official Agents framework, registered as
/// `agent_name`; returns its exit status and the JSON events it printed.
pub fn livekit_agents_worker(
    url: &str,
    key: &str,
    secret: &str,
    agent_name: &str,
) -> (bool, Vec<Value>) {
    let python = ModelCache::from_env()
        .python()
        .expect("setup installed the Python clients");
    let script = crate_dir().join("clients/livekit_worker.py");
    let mut python = Command::new(python);
    python.arg(script).args([url, key, secret, agent_name]);
    run_client(python)
}

/// This crate's folder. At run time `cargo test`, `cargo run` and `cargo xtask` give the
/// folder of the package that runs (this crate, or another of the workspace beside it);
/// the one compiled in may be another checkout's (cargo reuses a shared target directory's
/// build for the same sources), so it is only the fallback.
fn crate_dir() -> std::path::PathBuf {
    let compiled = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::var_os("CARGO_MANIFEST_DIR")
        .and_then(|running| {
            let root = std::path::Path::new(&running).parent()?;
            Some(root.join(compiled.file_name()?))
        })
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .unwrap_or_else(|| compiled.to_path_buf())
}
