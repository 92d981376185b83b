//! An engine-thread panic under make-room, on the bundled model: every request in flight
//! fails with a clear error instead of hanging, and the next requests are served, with the
//! answers they had before the fault.

use std::time::{Duration, Instant};

use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{
    ChatRequest, Engine, EngineConfig, EngineError, Message, ReplyStream, Role, StreamEvent,
};
use sublet_models::ModelCache;

fn request(text: &str, max_tokens: usize) -> ChatRequest {
    ChatRequest::new(vec![Message::new(Role::User, text)], max_tokens)
}

/// A reply's text, or the error it ended with; fails if it takes over a minute.
fn finish(mut stream: ReplyStream) -> Result<String, EngineError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut text = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stream.next_before(Instant::now() + left) {
            Ok(Some(Ok(StreamEvent::Text(piece)))) => text.push_str(&piece),
            Ok(Some(Ok(StreamEvent::Done(_)))) => return Ok(text),
            Ok(Some(Ok(StreamEvent::ToolCalls(calls)))) => panic!("no tools offered: {calls:?}"),
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) => panic!("the stream ended with neither an answer nor an error"),
            Err(_) => panic!("no answer and no error within a minute: the client hangs"),
        }
    }
}

#[test]
fn an_engine_panic_fails_the_requests_in_flight_and_the_next_ones_are_served() {
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            switches: Switches::all(),
            chunk_tokens: Some(16),
            ..PolicyConfig::default()
        }),
        ..EngineConfig::from_cache(&cache).expect("cargo xtask setup")
    })
    .expect("the bundled model loads");
    let question = "What is the capital of France?";
    let before = finish(engine.chat(request(question, 12)).unwrap()).expect("an answer");
    assert!(!before.is_empty());

    // Two requests in flight (one decoding, one still in its prompt's chunks), then the
    // fault at the next step.
    let long = "Explain, step by step and naming every data structure, how a compiler turns source code into a program. ".repeat(6);
    let streams = [
        engine.chat(request(&long, 200)).unwrap(),
        engine.chat(request(question, 200)).unwrap(),
    ];
    std::thread::sleep(Duration::from_millis(300));
    assert!(engine.panic_at_next_step());
    for stream in streams {
        match finish(stream) {
            Err(EngineError::Internal(message)) => {
                assert!(message.contains("internal fault"), "{message}")
            }
            other => panic!("a request in flight ended {other:?}"),
        }
    }

    // The engine restarts for the next request, which runs as before, and so does the one after.
    for _ in 0..2 {
        let after = finish(engine.chat(request(question, 12)).unwrap()).expect("served again");
        assert_eq!(after, before);
    }
    // Nothing of the failed requests is left in the scheduler.
    sublet_engine::probe::wait_idle(&engine).expect("an idle engine");
}
