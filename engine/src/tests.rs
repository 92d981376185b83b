//! The engine's load failures, each its own case.

use super::*;

fn config(model: PathBuf) -> EngineConfig {
    EngineConfig {
        model,
        chat_template: None,
        weights: Weights::default(),
        max_running: 1,
        accelerator: Accelerator::Cpu,
        make_room: None,
        compute_nice: 0,
        mixed_passes: true,
    }
}

/// A caller tells a model it must fetch from one that will not load.
#[test]
fn load_failures_say_which_case_they_are() {
    let missing = std::env::temp_dir().join("sublet-no-such-model.gguf");
    let err = Engine::load(&config(missing.clone())).err();
    assert!(
        matches!(&err, Some(LoadError::NoFile(p)) if *p == missing),
        "{err:?}"
    );

    let corrupt = std::env::temp_dir().join(format!("sublet-corrupt-{}.gguf", std::process::id()));
    std::fs::write(&corrupt, b"GGUF but not really a model file at all").unwrap();
    let err = Engine::load(&config(corrupt.clone())).err();
    std::fs::remove_file(&corrupt).ok();
    assert!(
        matches!(&err, Some(LoadError::Model { path, .. }) if *path == corrupt),
        "{err:?}"
    );
}
