//! The agent in a LiveKit room on the test server, with LiveKit's official Node client as
//! the caller.

use std::time::{Duration, Instant};

use sublet_livekit::{RoomConnection, RoomEvent};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tests::official_clients::{livekit_caller, room_token};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const JFK: &str = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country.";

/// A test server with the agent already in `room`.
fn agent_in_room(
    room: &str,
) -> (
    TestServer,
    tokio::runtime::Runtime,
    RoomConnection,
    tokio::sync::mpsc::UnboundedReceiver<RoomEvent>,
) {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let token = credentials.agent_token(room, "sublet-agent").unwrap();
    let (connection, events) = runtime
        .block_on(RoomConnection::join(&credentials.url, &token))
        .unwrap();
    (server, runtime, connection, events)
}

#[test]
fn the_agent_hears_the_caller_through_webrtc_and_opus() {
    let cache = ModelCache::from_env();
    let (server, runtime, room, mut events) = agent_in_room("call-5");
    assert_eq!(room.room_name, "call-5");

    let url = server.url.clone();
    let wav = cache.jfk_wav().unwrap();
    let caller = std::thread::spawn(move || {
        let token = room_token(KEY, SECRET, "caller", "call-5", Duration::from_secs(600));
        livekit_caller(&url, &token, &["--publish-wav", wav.to_str().unwrap()])
    });
    let mut heard = Vec::new();
    let mut joined = false;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(40) {
        let event = runtime.block_on(async {
            tokio::time::timeout(Duration::from_millis(500), events.recv()).await
        });
        match event {
            Ok(Some(RoomEvent::Audio { identity, samples })) => {
                assert_eq!(identity, "caller");
                heard.extend(samples);
            }
            Ok(Some(RoomEvent::ParticipantJoined { identity })) => joined |= identity == "caller",
            Ok(Some(RoomEvent::ParticipantLeft { identity })) if identity == "caller" => break,
            Ok(Some(other)) => eprintln!("{other:?}"),
            Ok(None) => break,
            Err(_) => {}
        }
    }
    let (ok, caller_events) = caller.join().unwrap();
    assert!(ok, "{caller_events:?}");
    assert!(joined, "the agent never saw the caller join");
    runtime.block_on(room.leave());

    let seconds = heard.len() as f64 / 16_000.0;
    assert!(
        seconds > 10.0,
        "the agent heard {seconds:.1} s of the 11 s question"
    );
    let mut stt = Transcriber::load(&cache).unwrap();
    let text = stt.transcribe(&heard).unwrap();
    let wer = word_error_rate(JFK, &text);
    eprintln!("the agent heard {seconds:.1} s: {text:?} (WER {wer:.3})");
    assert!(wer < 0.15, "{text:?}");
}

#[test]
fn the_caller_hears_the_agent_through_webrtc_and_opus() {
    let cache = ModelCache::from_env();
    let (server, runtime, room, mut events) = agent_in_room("call-6");
    // Published before the caller comes, as a call's agent does: the caller is sent the
    // track as it joins.
    let speech = sublet_audio::read_wav(cache.jfk_wav().unwrap()).unwrap();
    let mut voice = runtime.block_on(room.publish_audio(speech.rate)).unwrap();
    let recording = std::env::temp_dir().join(format!("sublet-heard-{}.wav", std::process::id()));
    let url = server.url.clone();
    let path = recording.clone();
    let caller = std::thread::spawn(move || {
        let token = room_token(KEY, SECRET, "caller", "call-6", Duration::from_secs(600));
        livekit_caller(
            &url,
            &token,
            &["--listen", "18", "--record", path.to_str().unwrap()],
        )
    });
    // Like a microphone, the agent's track carries silence until it speaks (the server
    // forwards a track once its first packet arrives); it speaks once the caller is there
    // and has had a moment to subscribe.
    runtime
        .block_on(async {
            let silence = vec![0.0; speech.rate as usize / 50];
            let mut joined_at = None;
            let started = std::time::Instant::now();
            while joined_at.is_none_or(|at: std::time::Instant| at.elapsed() < Duration::from_secs(3)) {
                assert!(started.elapsed() < Duration::from_secs(30), "the caller never joined");
                voice.send(&silence).await?;
                while let Ok(event) = events.try_recv() {
                    if matches!(&event, RoomEvent::ParticipantJoined { identity } if identity == "caller") {
                        joined_at.get_or_insert_with(std::time::Instant::now);
                    }
                }
            }
            for piece in speech.samples.chunks(320) {
                voice.send(piece).await?;
            }
            voice.finish().await
        })
        .unwrap();
    let (ok, events) = caller.join().unwrap();
    runtime.block_on(room.leave());
    assert!(ok, "{events:?}");
    let subscribed = events
        .iter()
        .find(|e| e["event"] == "subscribed")
        .expect("the caller was sent the agent's track");
    assert_eq!(subscribed["identity"], "sublet-agent");

    let heard = sublet_audio::read_wav(&recording)
        .unwrap()
        .resampled(16_000);
    let _ = std::fs::remove_file(&recording);
    let mut stt = Transcriber::load(&cache).unwrap();
    let text = stt.transcribe(&heard.samples).unwrap();
    let wer = word_error_rate(JFK, &text);
    eprintln!(
        "the caller heard {:.1} s: {text:?} (WER {wer:.3})",
        heard.duration_s()
    );
    assert!(wer < 0.15, "{text:?}");
}
