//! `gpu_check`, the engine's part of `gpu/check.sh`, run here on the CPU: the tokenizer it
//! carries is small, the random model it makes loads and answers, and the smoke test
//! passes (the same greedy answers alone, batched under mistral.rs's own scheduler, and
//! batched and chunked under make-room's), on that model and on the bundled one.

use std::path::Path;
use std::process::Command;

use sublet_models::ModelCache;

fn gpu_check(args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_gpu_check"))
        .args(args)
        .output()
        .expect("gpu_check runs");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn a_random_model_from_the_carried_tokenizer_answers_the_same_alone_and_batched() {
    let bundled = ModelCache::from_env()
        .llm_gguf()
        .expect("cargo xtask setup");
    let dir = std::env::temp_dir().join(format!("sublet-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer = dir.join("tokenizer.gguf");
    let model = dir.join("random-tiny.gguf");

    let out = gpu_check(&[
        "tokenizer",
        "--from",
        path(&bundled),
        "--out",
        path(&tokenizer),
    ]);
    assert!(out.status.success());
    let size = std::fs::metadata(&tokenizer).unwrap().len();
    assert!(size < 4 << 20, "the carried tokenizer is {size} bytes");

    let make = |seed: &str, out_path: &Path| {
        let args = [
            "model",
            "--template",
            path(&tokenizer),
            "--size",
            "tiny",
            "--seed",
            seed,
        ];
        let out = gpu_check(&[&args[..], &["--out", path(out_path)]].concat());
        assert!(out.status.success());
        std::fs::read(out_path).unwrap()
    };
    let first = make("7", &model);
    let again = make("7", &dir.join("again.gguf"));
    let other = make("8", &dir.join("other.gguf"));
    assert!(first == again, "the same seed makes the same model");
    assert!(first != other, "another seed makes another model");

    for (name, model) in [("random", &model), ("bundled", &bundled)] {
        let json = dir.join(format!("smoke-{name}.json"));
        let out = gpu_check(&["smoke", "--model", path(model), "--json", path(&json)]);
        assert!(
            out.status.success(),
            "the smoke test passes on the CPU ({name})"
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let alone = report["alone"].as_array().unwrap();
        assert!(
            alone.iter().all(|a| !a.as_str().unwrap().is_empty()),
            "every prompt got an answer: {alone:?}"
        );
        // On a CPU batching and chunking change no token at all: mistral.rs's scheduler
        // once ran a sequence that had waited mid-reply as a prompt again, and the
        // answers of prompts that hit the prefix cache (here: all of them, asked a second
        // time) went wrong from their second or third token.
        let runs = report["together"].as_array().unwrap();
        let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["stock", "make_room_chunked", "make_room"]);
        // Every prompt ran in several chunks (on an engine whose prefix cache was empty).
        let chunks = runs[1]["prefill_chunks"].as_u64().unwrap();
        assert!(
            chunks > 2 * alone.len() as u64,
            "{name}: {chunks} prompt chunks"
        );
        for run in runs {
            assert_eq!(
                run["identical"],
                alone.len(),
                "{name}, {}: alone {alone:?}, together {:?}, first differences {:?}",
                run["name"],
                run["answers"],
                run["first_difference"]
            );
        }
    }

    // A GPU asked of a CPU build fails with a clear error, not a crash.
    let out = gpu_check(&["smoke", "--model", path(&model), "--device", "cuda"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cuda:0"));
    std::fs::remove_dir_all(&dir).ok();
}
