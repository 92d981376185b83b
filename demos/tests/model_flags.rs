//! The models a user brings: every demo takes `--llm`, `--stt` and `--voice` (and their
//! variables); a file that cannot run is refused at start, before any call, naming its
//! flag; and a call on models given this way records them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sublet_models::ModelCache;

fn cache() -> ModelCache {
    ModelCache::from_env()
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("sublet-model-flags-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first `bytes` of `from`, written to `to`.
fn cut(from: &Path, bytes: usize, to: &Path) -> PathBuf {
    let whole = std::fs::read(from).unwrap();
    std::fs::write(to, &whole[..bytes.min(whole.len())]).unwrap();
    to.to_path_buf()
}

/// `program` with `args`, cleared of the model variables a developer may have set.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> Output {
    let dir = scratch("run");
    let mut command = Command::new(program);
    command
        .args(args)
        .env("SUBLET_RECORDS", dir.join("records"))
        .env("LIVEKIT_URL", "ws://127.0.0.1:9")
        .env("LIVEKIT_API_KEY", "devkey")
        .env("LIVEKIT_API_SECRET", "secret-secret-secret-secret-secret")
        .env("HF_ENDPOINT", "http://127.0.0.1:9");
    for var in [
        "SUBLET_LLM",
        "SUBLET_STT",
        "SUBLET_VOICE",
        "SUBLET_CHAT_TEMPLATE",
    ] {
        command.env_remove(var);
    }
    command.output().unwrap()
}

fn playback(extra: &[&std::ffi::OsStr]) -> (bool, String) {
    let call = cache().call("three_turns.wav").expect("cargo xtask setup");
    let dir = scratch("playback");
    let mut args: Vec<&std::ffi::OsStr> = vec![call.as_os_str()];
    let (out, timeline) = (dir.join("reply.wav"), dir.join("turns.json"));
    args.extend([
        "--out".as_ref(),
        out.as_os_str(),
        "--timeline".as_ref(),
        timeline.as_os_str(),
        "--fast".as_ref(),
    ]);
    args.extend(extra);
    let output = run(env!("CARGO_BIN_EXE_playback"), &args);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Refused at start: a failing exit, a message naming the flag and saying why, and no
/// model loaded (so no call answered).
fn assert_refused(flag: &str, value: &Path, why: &str) {
    let started = std::time::Instant::now();
    let (ok, stderr) = playback(&[flag.as_ref(), value.as_os_str()]);
    assert!(!ok, "{flag} {}: accepted\n{stderr}", value.display());
    assert!(
        stderr.contains(&format!("{flag} {}", value.display())) && stderr.contains(why),
        "{flag} {}: expected {why:?} in\n{stderr}",
        value.display()
    );
    assert!(!stderr.contains("models loaded"), "{stderr}");
    assert!(
        started.elapsed().as_secs() < 20,
        "{flag}: refused only after {:?}",
        started.elapsed()
    );
}

#[test]
fn a_bad_llm_is_refused_at_start_naming_its_flag() {
    let dir = scratch("llm");
    let gguf = cache().llm_gguf().unwrap();
    assert_refused("--llm", &dir.join("missing.gguf"), "no such file");
    assert_refused(
        "--llm",
        &cut(&gguf, 20 << 20, &dir.join("cut.gguf")),
        "cut short",
    );
    let text = dir.join("notes.gguf");
    std::fs::write(&text, b"these are my notes, not a model").unwrap();
    assert_refused("--llm", &text, "not a GGUF file");
    // A GGUF of an architecture the engine does not load (its header only).
    let mut gemma = b"GGUF".to_vec();
    gemma.extend(3u32.to_le_bytes());
    gemma.extend(0u64.to_le_bytes());
    gemma.extend(1u64.to_le_bytes());
    let (key, value) = ("general.architecture", "gemma3");
    gemma.extend((key.len() as u64).to_le_bytes());
    gemma.extend(key.as_bytes());
    gemma.extend(8u32.to_le_bytes());
    gemma.extend((value.len() as u64).to_le_bytes());
    gemma.extend(value.as_bytes());
    let gemma_path = dir.join("gemma.gguf");
    std::fs::write(&gemma_path, gemma).unwrap();
    assert_refused("--llm", &gemma_path, "architecture \"gemma3\"");
    // A hub id, with the hub out of reach and the model not in its cache.
    let (ok, stderr) = playback(&[
        "--llm".as_ref(),
        "someone/some-model-GGUF:model.gguf".as_ref(),
    ]);
    assert!(
        !ok && stderr.contains("--llm someone/some-model-GGUF"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cannot be reached") && stderr.contains("local file"),
        "{stderr}"
    );
    let template = dir.join("template.txt");
    std::fs::write(&template, "{{ messages }}").unwrap();
    assert_refused("--chat-template", &template, ".jinja or .json");
}

#[test]
fn a_bad_whisper_model_is_refused_at_start_naming_its_flag() {
    let dir = scratch("stt");
    let ggml = cache().whisper_ggml().unwrap();
    assert_refused("--stt", &dir.join("missing.bin"), "no such file");
    assert_refused(
        "--stt",
        &cut(&ggml, 10 << 20, &dir.join("cut.bin")),
        "cut short",
    );
    let gguf = cache().llm_gguf().unwrap();
    assert_refused(
        "--stt",
        &cut(&gguf, 1 << 20, &dir.join("llm.bin")),
        "not a whisper.cpp",
    );
    let folder = dir.join("not-whisper");
    std::fs::create_dir_all(&folder).unwrap();
    assert_refused("--stt", &folder, "CTranslate2 Whisper");
}

#[test]
fn a_bad_voice_is_refused_at_start_naming_its_flag() {
    let dir = scratch("voice");
    let onnx = cache().piper_voice().unwrap();
    assert_refused("--voice", &dir.join("missing.onnx"), "no such file");
    // The voice without its configuration beside it.
    let alone = dir.join("alone.onnx");
    std::fs::copy(&onnx, &alone).unwrap();
    assert_refused("--voice", &alone, "configuration");
    // A cut-short model with a good configuration.
    let cut_voice = cut(&onnx, 1 << 20, &dir.join("cut.onnx"));
    std::fs::copy(cache().piper_config().unwrap(), dir.join("cut.onnx.json")).unwrap();
    assert_refused("--voice", &cut_voice, "Protobuf parsing failed");
}

#[test]
fn every_demo_takes_the_model_flags() {
    let missing = scratch("every").join("missing.gguf");
    let call = cache().call("three_turns.wav").expect("cargo xtask setup");
    let call = call.to_str().unwrap();
    for (name, program, args) in [
        ("playback", env!("CARGO_BIN_EXE_playback"), vec![call]),
        (
            "serve",
            env!("CARGO_BIN_EXE_serve"),
            vec!["--addr", "127.0.0.1:0"],
        ),
        ("mic", env!("CARGO_BIN_EXE_mic"), vec!["--seconds", "1"]),
        ("room", env!("CARGO_BIN_EXE_room"), vec!["--room", "r"]),
        ("worker", env!("CARGO_BIN_EXE_worker"), vec![]),
    ] {
        for flag in ["--stt", "--voice"] {
            let help = run(program, &["--help".as_ref()]);
            let text = String::from_utf8_lossy(&help.stdout);
            assert!(text.contains(flag), "{name} --help has no {flag}:\n{text}");
        }
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        all.extend(["--llm".as_ref(), missing.as_os_str()]);
        let output = run(program, &all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("--llm {}: no such file", missing.display())),
            "{name}: {stderr}"
        );
        // The variable works as the flag does.
        let mut command = Command::new(program);
        command
            .args(&all[..all.len() - 2])
            .env("SUBLET_LLM", &missing)
            .env("LIVEKIT_URL", "ws://127.0.0.1:9")
            .env("LIVEKIT_API_KEY", "devkey")
            .env("LIVEKIT_API_SECRET", "secret-secret-secret-secret-secret")
            .env("SUBLET_RECORDS", scratch("every").join("records"));
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("$SUBLET_LLM"), "{name}: {stderr}");
    }
}

#[test]
fn a_call_on_models_given_by_flag_records_them() {
    // The bundled models, named as a user would name their own: the GGUF by path,
    // Whisper as its CTranslate2 folder (converted into the cache on first use), the
    // voice by its .onnx.
    let cache = cache();
    let ct2 = cache.path("stt/ct2-tiny.en");
    let dir = scratch("given");
    let records = dir.join("records");
    let llm = cache.llm_gguf().unwrap();
    let voice = cache.piper_voice().unwrap();
    let (ok, stderr) = playback(&[
        "--llm".as_ref(),
        llm.as_os_str(),
        "--stt".as_ref(),
        ct2.as_os_str(),
        "--voice".as_ref(),
        voice.as_os_str(),
        "--records".as_ref(),
        records.as_os_str(),
    ]);
    assert!(ok, "{stderr}");
    let record = std::fs::read_dir(&records)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&record)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        first["call"]["models"]["llm"], "SmolLM2-135M-Instruct.Q4_1",
        "{first}"
    );
    assert!(
        first["call"]["models"]["stt"]
            .as_str()
            .unwrap()
            .starts_with("ct2-tiny.en-"),
        "the converted folder: {first}"
    );
    assert_eq!(
        first["call"]["models"]["voice"], "en_US-joe-medium",
        "{first}"
    );
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("\"transcript\""), "no turn answered: {text}");
}
