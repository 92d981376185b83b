//! Sublet's own commands, run as `cargo xtask <command>`:
//!
//! - `setup`: system packages (when root), every bundled model into the cache (checked by
//!   sha256), the Whisper ggml conversion, the recorded test calls. A second run only checks.
//! - `demo`: setup, then answer the bundled recorded call and print its turn table.
//! - `test`: setup, then the whole test suite in release.
//! - `probe`: setup, then make-room's probes on the real engine, off against on.
//! - `bench`: setup, then the evaluation: recorded calls beside replayed agent sessions.
//! - `engine-bench`: setup and llama.cpp, then the engine's speed beside llama.cpp's.
//! - `load`: setup, then the agents' API under hundreds of clients of every kind while a
//!   voice turn is timed.
//! - `latency`: setup, then scripted test calls in real time, voice alone, the current
//!   defaults beside the old configuration.
//! - `memory`: setup, then where the memory goes: idle, one call, a call beside agents.
//! - `build --cuda`: the engine's GPU binaries, built without a GPU (see [`cuda`]).
//! - `patches save`: regenerate the patch series on mistral.rs from an edited copy.

mod apt;
mod calls;
mod client_env;
mod cuda;
mod fetch;
mod fixtures;
mod patches;
mod whisper_ggml;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sublet_models::ModelCache;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup            install system packages (as root), fetch and check the models, make test calls
  demo [ARGS]      setup, then answer the bundled recorded call (ARGS go to `playback`)
  test [ARGS]      setup, then run the whole test suite in release (ARGS go to `cargo test`)
  probe [ARGS]     setup, then make-room's probes, off against on (e.g. --json target/probe.json)
  bench [ARGS]     setup, then calls beside agent sessions, make-room off against on
                   (--agents N --calls M --rounds R --minutes T --out DIR)
  engine-bench [ARGS]
                   setup (and llama.cpp, built once), then the engine's speed against
                   llama.cpp on the same model and prompts (--json PATH --weights f16)
  latency [ARGS]   setup, then test calls in several voices, voice alone, in real time: voice to
                   voice per stage, false cut-offs, late turns, old configuration beside the new
                   (--json PATH --configs old,new,new+preemptive --livekit: through a LiveKit
                   room, LiveKit's official client as the caller)
  quality [ARGS]   setup, then scripted calls in the project's voices (a booking with a corrected
                   date and a reference read back, numbers, facts, an off-topic request, a
                   greeting), each reply judged: details kept, facts right, words, loops, WER,
                   voice to voice; the bundled models and any given (--llm --stt --voice)
                   side by side (--json PATH --markdown PATH)
  soak [ARGS]      setup, then calls back to back through the LiveKit test server beside agents,
                   faults on a schedule: turns lost, faults survived, memory's slope
                   (--minutes 30 --out target/soak)
  load [ARGS]      setup, then hundreds of API clients of every kind on the loopback (streamed,
                   hanging up, stalling mid-header, oversized, malformed) while a voice turn is
                   timed: served, refused, cancelled, memory, first token against no load
                   (--seconds 60 --clients 240 --json target/load.json)
  memory [ARGS]    setup, then where the memory goes (weights per model, KV, the prefix cache,
                   a step's activations, the allocator, the runtime) against resident memory:
                   idle, one call, the call beside agents (--agents 4)
  fixtures         fetch the opt-in models to try beside the bundled ones (Qwen2.5-Coder-0.5B
                   GGUF, Whisper base as CTranslate2) into the cache's fixtures/, sha256-pinned
  build --cuda     the engine's GPU binaries (CUDA 13.0 from its wheels, sm_90 unless
                   --compute-cap N), stripped and compressed into gpu/bin for gpu/check.sh
  patches save     write patches/<crate>/ back from the commits in patched/<crate>

environment:
  SUBLET_MODELS    the model cache (default ~/.cache/sublet/models)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo xtask bench -- --agents 8` and `cargo xtask bench --agents 8` mean the same
    // (`test` passes its arguments to `cargo test`, where `--` has its own meaning).
    let rest = match args.get(1).map(String::as_str) {
        Some("--") => &args[2..],
        _ => args.get(1..).unwrap_or_default(),
    };
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup().map(|_| ()),
        Some("demo") => demo(rest),
        Some("test") => test(&args[1..]),
        Some("probe") => probe(rest),
        Some("bench") => bench(rest),
        Some("engine-bench") => engine_bench(rest),
        Some("latency") => latency(rest),
        Some("quality") => quality(rest),
        Some("soak") => soak(rest),
        Some("load") => load(rest),
        Some("memory") => memory(rest),
        Some("fixtures") => setup().and_then(|cache| {
            for path in fixtures::fetch(&cache)? {
                println!("{}", path.display());
            }
            Ok(())
        }),
        Some("build") => setup().and_then(|cache| cuda::build(&cache, rest)),
        Some("patches") if args.get(1).map(String::as_str) == Some("save") => patches::save(),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("xtask: unknown command {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The repository root (the folder above this crate). `cargo run` gives the crate's
/// folder at run time; the one compiled in may be another checkout's, since cargo reuses a
/// shared target directory's build for the same sources at another path.
fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("xtask lives inside the repository")
        .to_path_buf()
}

fn setup() -> Result<ModelCache> {
    let started = Instant::now();
    apt::ensure_packages()?;
    patches::ensure_patched()?;
    let cache = ModelCache::from_env();
    eprintln!("setup: model cache {}", cache.root().display());
    fetch::fetch_all(&cache)?;
    whisper_ggml::ensure_converted(&cache)?;
    calls::ensure_calls(&cache)?;
    client_env::ensure_python_env(&cache)?;
    client_env::ensure_node_env(&cache)?;
    eprintln!("setup: ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(cache)
}

/// A cargo command for the main workspace, in the environment the user's own shell would
/// give it: `cargo run` added variables for this xtask (its package's metadata, library
/// paths) that build scripts watch, and passing them on would rebuild the workspace's
/// dependencies every time the build switches between `cargo xtask` and plain `cargo`.
fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(repo_root());
    for (key, value) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        let set_by_cargo_run = key_str.starts_with("CARGO_PKG_")
            || matches!(
                key_str.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            );
        if set_by_cargo_run {
            command.env_remove(&key);
        } else if key_str == "LD_LIBRARY_PATH" {
            let kept: Vec<PathBuf> = std::env::split_paths(&value)
                .filter(|p| {
                    let p = p.to_string_lossy();
                    !p.contains("/target/")
                        && !p.contains("/toolchains/")
                        && !p.ends_with("/target")
                })
                .collect();
            match kept.is_empty() {
                true => command.env_remove(&key),
                false => command.env(
                    &key,
                    std::env::join_paths(kept).expect("paths came from the environment"),
                ),
            };
        }
    }
    command
}

fn run(mut command: Command) -> Result<()> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

fn demo(extra: &[String]) -> Result<()> {
    let cache = setup()?;
    let out = repo_root().join("target/demo");
    std::fs::create_dir_all(&out)?;
    let call = cache.call(calls::DEMO_CALL)?;
    eprintln!("demo: building and answering {}", call.display());
    let mut command = cargo_run("sublet-demos", "playback")?;
    command
        .arg(&call)
        .arg("--out")
        .arg(out.join("reply.wav"))
        .arg("--timeline")
        .arg(out.join("turns.json"))
        .arg("--records")
        .arg(out.join("records"))
        .args(extra);
    run(command)
}

fn probe(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-engine", "make_room_probe")?;
    command.args(extra);
    run(command).context("make-room's probes: a case missed its targets (MISSED), or the probe failed")
}

fn bench(extra: &[String]) -> Result<()> {
    let cache = setup()?;
    // `--agent-driver aiperf` (or `=aiperf`): AIPerf in the cache first.
    let aiperf = extra
        .windows(2)
        .any(|w| w[0] == "--agent-driver" && w[1] == "aiperf")
        || extra.iter().any(|a| a == "--agent-driver=aiperf");
    if aiperf {
        client_env::ensure_aiperf(&cache)?;
    }
    let mut command = cargo_run("sublet-bench", "bench")?;
    command.args(extra);
    run(command)
}

fn soak(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-bench", "soak")?;
    command.args(extra);
    run(command)
}

fn load(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-bench", "load")?;
    command.args(extra);
    run(command)
}

fn memory(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-bench", "memory")?;
    command.args(extra);
    run(command)
}

fn latency(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-bench", "latency")?;
    command.args(extra);
    run(command)
}

fn quality(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo_run("sublet-bench", "quality")?;
    command.args(extra);
    run(command)
}

fn engine_bench(extra: &[String]) -> Result<()> {
    let cache = setup()?;
    let mut command = cargo_run("sublet-bench", "engine_bench")?;
    if !extra.iter().any(|a| a == "--no-llama") {
        let python = client_env::ensure_llama_cpp(&cache)?;
        command
            .arg("--llama-python")
            .arg(python)
            .arg("--llama-script")
            .arg(repo_root().join("bench/llama_cpp/engine_bench.py"));
    }
    command.args(extra);
    run(command)
}

/// `BIN` of `PACKAGE`, built first with the whole workspace's features (those `cargo xtask
/// test` builds with), arguments to follow. `cargo run -p PACKAGE` would resolve features for
/// that package alone, and so rebuild mistral.rs after a test run (about 3 minutes here).
fn cargo_run(package: &str, bin: &str) -> Result<Command> {
    let mut build = cargo();
    build
        .args(["build", "--release", "--workspace", "--bins"])
        .arg("--message-format=json-render-diagnostics")
        .stdout(std::process::Stdio::piped());
    eprintln!("xtask: cargo build --release --workspace --bins (for {bin})");
    let mut child = build.spawn().context("starting cargo build")?;
    let stdout = child.stdout.take().context("cargo build's output")?;
    let executable = built_executable(std::io::BufReader::new(stdout), package, bin);
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo build --release --workspace --bins failed ({status})");
    }
    let executable =
        executable?.with_context(|| format!("cargo built no binary {bin} of {package}"))?;
    let mut command = Command::new(executable);
    command.current_dir(repo_root());
    Ok(command)
}

/// Whether a cargo package id (`path+file:///…#NAME@VERSION`, or older cargo's `NAME VERSION
/// (…)`) names `package`.
fn is_package(id: &str, package: &str) -> bool {
    id.contains(&format!("#{package}@")) || id.starts_with(&format!("{package} "))
}

/// The path of `package`'s binary `bin` in cargo's JSON messages.
fn built_executable(
    messages: impl std::io::BufRead,
    package: &str,
    bin: &str,
) -> Result<Option<PathBuf>> {
    let mut found = None;
    for line in messages.lines() {
        let message: serde_json::Value = match serde_json::from_str(&line?) {
            Ok(message) => message,
            Err(_) => continue,
        };
        let is_bin = message["reason"] == "compiler-artifact"
            && message["target"]["name"] == bin
            && message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "bin"))
            && message["package_id"]
                .as_str()
                .is_some_and(|id| is_package(id, package));
        if let (true, Some(path)) = (is_bin, message["executable"].as_str()) {
            found = Some(PathBuf::from(path));
        }
    }
    Ok(found)
}

fn test(extra: &[String]) -> Result<()> {
    setup()?;
    let mut command = cargo();
    command
        .args(["test", "--release", "--workspace"])
        .args(extra);
    run(command)
}
