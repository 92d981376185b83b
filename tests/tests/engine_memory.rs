//! What the engine and the speech models report of their memory, on the real models: a
//! binary of its own, whose global allocator counts the heap (as the demos' do), and one
//! test, so that no other test's loads fall within its measurements.

use std::time::{Duration, Instant};

use sublet_agent::{AgentConfig, VoiceAgent};
use sublet_engine::make_room::PolicyConfig;
use sublet_engine::memory::{CountingAllocator, EngineMemory};
use sublet_engine::{ChatRequest, Engine, EngineConfig, Message, Role, StreamEvent};
use sublet_models::ModelCache;

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;
sublet_heap::interpose_malloc!();

/// SmolLM2-135M's KV per token on the CPU: 30 layers × 3 KV heads × 64 dimensions × keys
/// and values × 2 bytes (the cache holds f16, patch 9).
const KV_BYTES_PER_TOKEN: u64 = 30 * 3 * 64 * 2 * 2;
/// A sequence's cache starts with room for 512 tokens (mistral.rs's growth step).
const FIRST_CAPACITY: u64 = 512;

fn wait_for(engine: &Engine, what: &str, ready: impl Fn(&EngineMemory) -> bool) -> EngineMemory {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let memory = engine.memory();
        if ready(&memory) {
            return memory;
        }
        assert!(Instant::now() < until, "{what}: {memory:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_engine_and_the_speech_models_report_where_their_memory_goes() {
    HEAP.start();
    let cache = ModelCache::from_env();
    let config = EngineConfig {
        make_room: Some(PolicyConfig::default()),
        ..EngineConfig::from_cache(&cache).unwrap()
    };
    let gguf_bytes = std::fs::metadata(&config.model).unwrap().len();
    let engine = std::sync::Arc::new(Engine::load(&config).unwrap());
    // The warm-up's KV reaches the prefix cache as the engine's loop frees its sequence,
    // which may be just after the load returns.
    let loaded = wait_for(&engine, "the warm-up's KV in the prefix cache", |m| {
        m.prefix_cache_bytes > 0
    });
    println!("loaded: {loaded:?} (the GGUF: {gguf_bytes} bytes)");
    // Quantized matrices are held as the file stores them; mistral.rs dequantizes the
    // token embeddings (49,152 × 576) to f32 besides (~290 MB in all, measured here).
    let weights = loaded.weights_bytes.expect("glibc's figures");
    assert!(
        weights > gguf_bytes && weights < gguf_bytes * 4,
        "weights {weights} against a {gguf_bytes}-byte GGUF"
    );
    // The load's warm-up left at most one sequence's KV in the prefix cache.
    assert_eq!(loaded.kv_allocated_bytes, 0);
    assert!(loaded.prefix_cache_bytes <= FIRST_CAPACITY * KV_BYTES_PER_TOKEN);

    // A reply under way holds a cache of its own, partly filled.
    let question = vec![Message::new(Role::User, "Count from one to fifty.")];
    let mut stream = engine.chat(ChatRequest::new(question, 96)).unwrap();
    for _ in 0..8 {
        assert!(matches!(
            stream.next_blocking(),
            Some(Ok(StreamEvent::Text(_)))
        ));
    }
    let during = wait_for(&engine, "a running request's KV", |m| {
        m.kv_allocated_bytes > 0
    });
    println!("during a reply: {during:?}");
    assert_eq!(
        during.kv_allocated_bytes,
        FIRST_CAPACITY * KV_BYTES_PER_TOKEN
    );
    assert!(during.kv_used_bytes > 0 && during.kv_used_bytes < during.kv_allocated_bytes);
    while let Some(event) = stream.next_blocking() {
        event.unwrap();
    }

    // Finished, its KV lives on in the prefix cache, and no request holds any.
    let cached_before = loaded.prefix_cache_bytes;
    let after = wait_for(
        &engine,
        "the finished request's KV in the prefix cache",
        |m| m.prefix_cache_bytes > cached_before && m.kv_allocated_bytes == 0,
    );
    println!("after: {after:?}");
    assert_eq!(
        after.prefix_cache_bytes - cached_before,
        FIRST_CAPACITY * KV_BYTES_PER_TOKEN
    );
    // The counting allocator saw the steps' activations, and not the load's heap.
    assert!(
        after.step_peak_bytes.is_some_and(|b| b > 0 && b < weights),
        "{after:?}"
    );

    // The speech models: Whisper and Piper at a call's start.
    let agent = VoiceAgent::with_engine(cache, engine, AgentConfig::default());
    let _responder = agent.new_responder().unwrap();
    let _detector = agent.new_detector().unwrap();
    let speech = agent.speech_memory();
    println!("speech models: {speech:?}");
    for (model, bytes) in [
        ("whisper", speech.whisper_bytes),
        ("voice", speech.voice_bytes),
        ("turn detector", speech.turn_detector_bytes),
    ] {
        assert!(bytes.is_some_and(|b| b > 1 << 20), "{model}: {bytes:?}");
    }

    // Each model's large blocks, by the pages they hold: the engine's weights are all
    // touched; Whisper, Piper and the turn detector hold blocks of their own, a part of
    // each resident; together they fit in the process.
    let blocks = sublet_heap::large_blocks().expect("malloc is interposed here");
    let resident = sublet_heap::resident_bytes().unwrap();
    println!("large blocks: {blocks:?}, resident {resident}");
    use sublet_heap::Owner;
    let engine_blocks = blocks.of(Owner::Engine);
    assert!(
        engine_blocks.resident >= weights * 9 / 10,
        "the engine's blocks {engine_blocks:?} against weights {weights}"
    );
    for owner in [Owner::Whisper, Owner::Voice, Owner::TurnDetector] {
        let b = blocks.of(owner);
        assert!(b.resident > 1 << 20, "{owner:?}: {b:?}");
    }
    // whisper.cpp allocates its state's buffers for the longest audio and touches what a
    // call uses: counted by size they would read several times what the process holds.
    let whisper = blocks.of(Owner::Whisper);
    assert!(
        whisper.resident < whisper.allocated / 2,
        "Whisper's blocks {whisper:?}"
    );
    assert!(
        blocks.total().resident < resident,
        "{blocks:?} against {resident}"
    );
}
