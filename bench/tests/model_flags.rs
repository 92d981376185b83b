//! Every benchmark takes the models a user brings (`--llm`, `--stt`, `--voice`) and
//! refuses a file that cannot run before it measures anything, naming the flag.

use std::process::Command;

#[test]
fn every_benchmark_takes_the_model_flags_and_refuses_a_bad_file_at_start() {
    let dir = std::env::temp_dir().join(format!("sublet-bench-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.gguf");
    for (name, program) in [
        ("bench", env!("CARGO_BIN_EXE_bench")),
        ("latency", env!("CARGO_BIN_EXE_latency")),
        ("engine_bench", env!("CARGO_BIN_EXE_engine_bench")),
        ("memory", env!("CARGO_BIN_EXE_memory")),
        ("load", env!("CARGO_BIN_EXE_load")),
        ("soak", env!("CARGO_BIN_EXE_soak")),
        ("quality", env!("CARGO_BIN_EXE_quality")),
    ] {
        let help = Command::new(program).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in ["--llm", "--stt", "--voice", "--chat-template"] {
            assert!(help.contains(flag), "{name} --help has no {flag}:\n{help}");
        }
        let started = std::time::Instant::now();
        let output = Command::new(program)
            .arg("--llm")
            .arg(&missing)
            .env("SUBLET_RECORDS", dir.join("records"))
            .current_dir(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("--llm {}: no such file", missing.display())),
            "{name}: {stderr}"
        );
        assert!(
            started.elapsed().as_secs() < 30,
            "{name} refused only after {:?}",
            started.elapsed()
        );
    }
}
