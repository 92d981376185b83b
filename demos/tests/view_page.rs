//! The live page in a real browser: headless Chromium opens the page `room --view` serves,
//! joins the test server's room as the caller with LiveKit's browser SDK, its fake
//! microphone asking a recorded question, and the real agent answers. The page must show
//! the caller's transcript (partial, then final), the reply, the turn's stage bars and the
//! engine's KV figure; a screenshot goes to the test runner's artifacts
//! (`CARGO_TARGET_TMPDIR`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sublet_agent::{AgentConfig, Quiet, VoiceAgent};
use sublet_audio::{read_wav, write_wav, Audio};
use sublet_demos::{CallerRoom, ViewArgs, PARTIAL_TRANSCRIPT_EVERY_S};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{Engine, EngineConfig, VOICE_PRIORITY};
use sublet_livekit::{CallOptions, LiveKitAgent};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_tests::official_clients::{browser_page, recorded_question};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const ROOM: &str = "view-1";

#[test]
fn the_page_shows_a_call_answered_in_the_browser() {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-view-{}", std::process::id()));
    // The question after 3 s of quiet (the page joins and publishes meanwhile), then quiet
    // for the answer.
    let question = read_wav(recorded_question(&cache, &dir)).unwrap();
    let quiet = |s: f64| vec![0.0; (s * question.rate as f64) as usize];
    let samples = [quiet(3.0), question.samples.clone(), quiet(6.0)].concat();
    let wav = dir.join("browser-question.wav");
    write_wav(&wav, &Audio::new(samples, question.rate)).unwrap();

    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    // The deployed shape: make-room schedules the engine, so the page has KV figures.
    let engine = Arc::new(
        Engine::load(&EngineConfig {
            make_room: Some(PolicyConfig {
                switches: Switches::all(),
                whole_prompt_priority: Some(VOICE_PRIORITY),
                ..PolicyConfig::default()
            }),
            ..EngineConfig::bundled(&cache).unwrap()
        })
        .unwrap(),
    );
    let agent = VoiceAgent::with_engine(
        cache.clone(),
        Arc::clone(&engine),
        AgentConfig {
            partial_transcripts_s: Some(PARTIAL_TRANSCRIPT_EVERY_S),
            ..AgentConfig::default()
        },
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let view = ViewArgs {
        view: Some("127.0.0.1:0".parse().unwrap()),
    };
    let room = CallerRoom::Fixed {
        credentials: credentials.clone(),
        room: ROOM.into(),
    };
    let addr = view
        .spawn("view test", runtime.handle(), &engine, room)
        .unwrap()
        .expect("the page is served");

    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("view_page.png");
    let _ = std::fs::remove_file(&screenshot);
    let page_url = format!("http://{addr}/");
    let browser = {
        let (wav, screenshot) = (wav.clone(), screenshot.clone());
        std::thread::spawn(move || browser_page(&page_url, &wav, &screenshot, 120))
    };
    let token = credentials.agent_token(ROOM, "sublet-agent").unwrap();
    let options = CallOptions {
        nobody_timeout: Duration::from_secs(60),
        ..CallOptions::default()
    };
    let call = agent
        .answer_room(
            runtime.handle(),
            &credentials.url,
            &token,
            &options,
            &mut Quiet,
        )
        .unwrap();
    let (ok, events) = browser.join().unwrap();
    eprintln!(
        "the call: {} turns, ended: {}",
        call.turns.len(),
        call.ended
    );
    let page = events
        .iter()
        .find(|e| e["event"] == "page")
        .unwrap_or_else(|| panic!("the browser reported nothing: {events:?}"));
    eprintln!("the page showed: {page:#}");
    assert!(ok, "the page never showed a whole answered turn: {page:#}");

    let texts = |key: &str| -> Vec<String> {
        page[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_lowercase)
            .collect()
    };
    // The page shows what the agent heard, as it heard it (the question through the
    // browser's Opus may come out "remain" for "rain").
    let first = &call.turns[0];
    let caller = texts("caller");
    assert!(
        caller.contains(&first.transcript.to_lowercase()) && first.transcript.contains("going to"),
        "the page's caller transcript {caller:?}, the agent's {:?}",
        first.transcript
    );
    let partials = texts("partials");
    assert!(
        !partials.is_empty(),
        "no partial transcript was shown while the caller spoke"
    );
    assert!(
        texts("agent")
            .iter()
            .any(|t| *t == first.reply.to_lowercase()),
        "the page's reply is not the agent's {:?}: {:?}",
        first.reply,
        texts("agent")
    );
    let turn = page["turns"][0]["text"].as_str().unwrap_or_default();
    let v2v = format!("voice to voice {:.2} s", first.voice_to_voice_s());
    assert!(turn.contains(&v2v), "{turn:?} lacks {v2v:?}");
    for stage in sublet_agent::STAGE_NAMES {
        assert!(turn.contains(stage), "{turn:?} lacks the stage {stage:?}");
    }
    assert_eq!(page["turns"][0]["bars"], 5, "one bar per stage");
    let status = page["status"].as_str().unwrap_or_default();
    assert!(
        status.starts_with(&format!("in {ROOM} as caller-")),
        "the page never finished publishing the microphone: {status:?}"
    );
    let engine_text = page["engine"].as_str().unwrap_or_default();
    let budget = engine.scheduler_state().kv_budget_tokens;
    assert!(
        engine_text.contains(&format!(" of {budget} tokens")) && budget > 0,
        "the engine panel lacks KV use against the budget of {budget}: {engine_text:?}"
    );
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    eprintln!("screenshot: {}", screenshot.display());
}
