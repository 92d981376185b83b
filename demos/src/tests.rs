//! The shared flags, parsed as a command line would give them.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    engine: EngineArgs,
}

#[test]
fn switches_parse_from_the_command_line() {
    let cli = Cli::try_parse_from(["x", "--make-room", "priority,kv_preemption"]).unwrap();
    let switches = cli.engine.make_room.unwrap();
    assert!(switches.priority && switches.kv_preemption && !switches.budget_cap);
    let cli = Cli::try_parse_from(["x", "--make-room", "all", "--kv-budget", "2048"]).unwrap();
    assert_eq!(cli.engine.make_room, Some(Switches::all()));
    assert_eq!(cli.engine.kv_budget, 2048);
    assert!(Cli::try_parse_from(["x", "--make-room", "fastest"]).is_err());
    // A budget means nothing without make-room's scheduler.
    assert!(Cli::try_parse_from(["x", "--kv-budget", "2048"]).is_err());
    assert_eq!(Cli::try_parse_from(["x"]).unwrap().engine.make_room, None);
}

#[test]
fn a_persona_file_sets_the_agent_and_a_bad_one_is_a_clear_error() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/personas/booking.toml");
    let cli = CallCli::try_parse_from(["x", "--persona", example]).unwrap();
    let config = cli.call.config();
    assert!(config.greeting.starts_with("Harbour Hotel"), "{config:?}");
    assert!(config.system_prompt.contains("Harbour Hotel"));
    assert_eq!(config.voice.length_scale, Some(1.1));
    let missing = CallCli::try_parse_from(["x", "--persona", "/no/such/persona.toml"])
        .err()
        .expect("a missing persona is refused")
        .to_string();
    assert!(missing.contains("/no/such/persona.toml"), "{missing}");
}

#[derive(Parser)]
struct CallCli {
    #[command(flatten)]
    call: CallArgs,
}

/// make-room's switches and the turn hint a call's process runs with.
fn shape(args: &[&str]) -> (Option<Switches>, bool) {
    let call = CallCli::try_parse_from(args).unwrap().call;
    let shared = call.api.shared();
    let config = call.engine.engine_config(&ModelCache::from_env(), shared);
    let switches = config.unwrap().make_room.map(|p| p.switches);
    (switches, call.config().turn_hints)
}

#[test]
fn agents_sharing_the_engine_turn_make_room_and_the_turn_hint_on() {
    assert_eq!(shape(&["x"]), (None, false));
    assert_eq!(shape(&["x", "--turn-hints"]), (None, true));
    let api = ["x", "--api", "127.0.0.1:8000"];
    assert_eq!(shape(&api), (Some(Switches::all()), true));
    let off = [&api[..], &["--make-room", "none", "--no-turn-hints"]].concat();
    assert_eq!(shape(&off), (Some(Switches::default()), false));
    assert!(CallCli::try_parse_from(["x", "--turn-hints", "--no-turn-hints"]).is_err());
    assert!(CallCli::try_parse_from(["x", "--api", "not-an-address"]).is_err());
}

#[test]
fn metrics_show_each_speech_models_load_and_each_parts_resident_blocks() {
    // A block the engine's code allocates and touches half of.
    let block = {
        let _engine = sublet_heap::owned_by(sublet_heap::Owner::Engine);
        let mut block = vec![0u8; 8 << 20];
        block[..4 << 20].fill(1);
        block
    };
    let memory = SpeechMemory {
        whisper_bytes: Some(5),
        ..SpeechMemory::default()
    };
    let text = speech_metrics(&memory);
    assert!(
        text.contains("sublet_speech_model_bytes{model=\"whisper\"} 5\n"),
        "{text}"
    );
    assert!(
        !text.contains("model=\"voice\""),
        "a model not loaded: {text}"
    );
    let figure = |pages: &str| -> u64 {
        let key = format!("sublet_heap_large_block_bytes{{part=\"engine\",pages=\"{pages}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&key)).expect(&key);
        line[key.len()..].parse().unwrap()
    };
    assert!(figure("allocated") >= 8 << 20, "{text}");
    assert!(figure("resident") >= 4 << 20, "{text}");
    drop(block);
}
