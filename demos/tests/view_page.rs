//! The live page in a real browser: headless Chromium opens the page `room --view` serves,
//! joins the test server's room as the caller with LiveKit's browser SDK, its fake
//! microphone asking a recorded question, and the real agent answers. The page must show
//! the caller's transcript (partial, then final), the reply, the turn's stage bars and the
//! engine's KV figure; a screenshot goes to the test runner's artifacts
//! (`CARGO_TARGET_TMPDIR`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sublet_agent::CallObserver;
use sublet_agent::{AgentConfig, Quiet, VoiceAgent};
use sublet_audio::write_wav;
use sublet_demos::{CallerRoom, ViewArgs, PARTIAL_TRANSCRIPT_EVERY_S};
use sublet_engine::{deployed_make_room, Engine, EngineConfig};
use sublet_livekit::{CallOptions, LiveKitAgent, WorkerOptions};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_tests::official_clients::{browser_page, question_between_quiet};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const ROOM: &str = "view-1";
/// The worker's agent name, which the test server dispatches to.
const WORKER_NAME: &str = "sublet";

/// How the page's caller reaches the agent.
#[derive(Clone, Copy, PartialEq)]
enum Answered {
    /// `room --view`: the agent is in the page's room already.
    ByRoom,
    /// `worker --view`: each visit calls a new room, which is dispatched to the worker.
    ByWorker,
}

#[test]
fn the_page_shows_a_call_answered_in_the_browser() {
    a_call_on_the_page(Answered::ByRoom);
}

#[test]
fn a_visit_to_a_workers_page_calls_a_new_room_that_the_worker_answers() {
    a_call_on_the_page(Answered::ByWorker);
}

fn a_call_on_the_page(answered: Answered) {
    // One browser call at a time: two on two cores would only slow both.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-view-{}", std::process::id()));
    // The question after some quiet (the page publishes meanwhile, and a worker's agent,
    // dispatched once the page is in the room, joins), then quiet for the answer.
    let quiet_before_s = match answered {
        Answered::ByRoom => 3.0,
        Answered::ByWorker => 8.0,
    };
    let wav = dir.join("browser-question.wav");
    write_wav(
        &wav,
        &question_between_quiet(&cache, &dir, quiet_before_s, 6.0),
    )
    .unwrap();

    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    // The deployed shape: make-room schedules the engine, so the page has KV figures.
    let engine = Arc::new(
        Engine::load(&EngineConfig {
            make_room: Some(deployed_make_room()),
            ..EngineConfig::from_cache(&cache).unwrap()
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
        view_public: false,
    };
    let (caller_room, room) = match answered {
        Answered::ByRoom => (
            CallerRoom::Fixed {
                credentials: credentials.clone(),
                room: ROOM.into(),
            },
            ROOM.to_owned(),
        ),
        Answered::ByWorker => (
            CallerRoom::PerVisit {
                credentials: credentials.clone(),
                prefix: "sublet-view".into(),
            },
            "sublet-view-1".to_owned(),
        ),
    };
    let addr = view
        .spawn(
            "view test",
            runtime.handle(),
            &engine,
            Some(&agent),
            caller_room,
        )
        .unwrap()
        .expect("the page is served");

    let name = match answered {
        Answered::ByRoom => "view_page.png",
        Answered::ByWorker => "view_page_worker.png",
    };
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&screenshot);
    let page_url = format!("http://{addr}/");
    let browser = {
        let (wav, screenshot) = (wav.clone(), screenshot.clone());
        std::thread::spawn(move || browser_page(&page_url, &wav, &screenshot, 120))
    };
    let call = match answered {
        Answered::ByRoom => {
            let token = credentials.agent_token(ROOM, "sublet-agent").unwrap();
            agent
                .answer_room(
                    runtime.handle(),
                    &credentials.url,
                    &token,
                    &CallOptions::default(),
                    &mut Quiet,
                )
                .unwrap()
        }
        Answered::ByWorker => {
            let (drain_tx, drain) = tokio::sync::watch::channel(false);
            let options = WorkerOptions {
                agent_name: WORKER_NAME.into(),
                max_calls: 1,
                call: CallOptions::default(),
            };
            let quiet = |_: &str| -> Box<dyn CallObserver> { Box::new(Quiet) };
            std::thread::scope(|scope| {
                let worker = scope
                    .spawn(|| agent.work(runtime.handle(), &credentials, &options, drain, &quiet));
                let dispatched = dispatch_when_the_page_joins(&server, &room);
                // Drained whatever happened, so that a failure ends the test, not hangs it.
                drain_tx.send(true).unwrap();
                let mut report = worker.join().unwrap().unwrap();
                dispatched.unwrap();
                assert_eq!(report.jobs.len(), 1, "{report:?}");
                let job = report.jobs.remove(0);
                assert_eq!(job.room, room);
                job.call.unwrap()
            })
        }
    };
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
    // The page shows what the agent heard, as it heard it. Through the browser's Opus,
    // Whisper may hear "remain" for "rain" or "terrain" for "to rain", so the question
    // counts as heard when most of its words are there.
    let first = &call.turns[0];
    let caller = texts("caller");
    let heard = first.transcript.to_lowercase();
    let question_words = ["is", "it", "going", "rain", "today"];
    let words_heard = question_words.iter().filter(|w| heard.contains(*w)).count();
    assert!(
        caller.contains(&heard) && words_heard >= 3,
        "the page's caller transcript {caller:?}, the agent's {:?} ({words_heard} of the \
         question's words)",
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
        status.starts_with(&format!("in {room} as caller-")),
        "the page never finished publishing the microphone: {status:?}"
    );
    let engine_text = page["engine"].as_str().unwrap_or_default();
    let budget = engine.scheduler_state().kv_budget_tokens;
    assert!(
        engine_text.contains(&format!(" of {budget} tokens")) && budget > 0,
        "the engine panel lacks KV use against the budget of {budget}: {engine_text:?}"
    );
    // Where the memory goes: the engine's weights as the engine reports them, and the
    // speech models the call loaded, each part's blocks by the pages they touch.
    let weights_mb = engine.memory().weights_bytes.unwrap() as f64 / (1024.0 * 1024.0);
    for shown in [
        format!("engine weights{weights_mb:.0} MB"),
        "whisper".into(),
        "voice".into(),
        "prefix cache".into(),
        // Each part's large blocks by resident pages (the demos interpose malloc).
        "engine large blocks".into(),
        "whisper large blocks".into(),
    ] {
        assert!(
            engine_text.contains(&shown),
            "the engine panel lacks {shown:?}: {engine_text:?}"
        );
    }
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    eprintln!("screenshot: {}", screenshot.display());
}

/// Once the worker has registered and the page's caller is in `room`, dispatches the
/// worker there (the test server dispatches explicitly, where LiveKit's automatic
/// dispatch would for a new room); returns when that call has ended.
fn dispatch_when_the_page_joins(server: &TestServer, room: &str) -> Result<(), String> {
    let started = std::time::Instant::now();
    let wait = |what: &str, done: &dyn Fn() -> bool| -> Result<(), String> {
        while !done() {
            if started.elapsed() > Duration::from_secs(180) {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    };
    wait("the worker to register", &|| {
        !server.worker_statuses().is_empty()
    })?;
    wait("the page's caller", &|| {
        server
            .participants(room)
            .iter()
            .any(|p| p.starts_with("caller-"))
    })?;
    server
        .dispatch(room, WORKER_NAME)
        .map_err(|e| format!("{e:#}"))?;
    wait("the call to end", &|| {
        server.jobs().iter().any(|j| {
            matches!(
                j.status,
                livekit_protocol::JobStatus::JsSuccess | livekit_protocol::JobStatus::JsFailed
            )
        })
    })
}
