//! LiveKit's official Node SDK (`@livekit/rtc-node`, with LiveKit's own WebRTC) against the
//! project's LiveKit-protocol test server: the server is trusted only as far as the
//! official client works with it.

use std::time::Duration;

use sublet_livekit_testserver::TestServer;
use sublet_tests::official_clients::{livekit_caller, room_token};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";

fn token(secret: &str, identity: &str, room: &str, ttl: Duration) -> String {
    room_token(KEY, secret, identity, room, ttl)
}

#[test]
fn the_official_client_joins_a_room_and_leaves() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let (ok, events) = livekit_caller(
        &server.url,
        &token(SECRET, "caller", "call-1", Duration::from_secs(600)),
        &[],
    );
    assert!(ok, "{events:?}");
    let connected = events
        .iter()
        .find(|e| e["event"] == "connected")
        .expect("connected");
    assert_eq!(connected["identity"], "caller");
    assert_eq!(connected["room"], "call-1");
    assert!(connected["participant_sid"]
        .as_str()
        .unwrap()
        .starts_with("PA_"));
    assert!(connected["room_sid"].as_str().unwrap().starts_with("RM_"));
    assert!(
        events.iter().any(|e| e["event"] == "disconnected"),
        "{events:?}"
    );
    // The server let the participant go.
    std::thread::sleep(Duration::from_millis(500));
    assert!(server.participants("call-1").is_empty());
}

#[test]
fn a_wrong_secret_or_an_expired_token_is_refused_with_a_clear_error() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let expired = token(SECRET, "caller", "call-2", Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(2100));
    for (what, token) in [
        (
            "wrong secret",
            token(
                "not-the-secret-at-all-but-long",
                "caller",
                "call-2",
                Duration::from_secs(600),
            ),
        ),
        ("expired", expired),
    ] {
        let (ok, events) = livekit_caller(&server.url, &token, &[]);
        assert!(!ok, "{what}: {events:?}");
        let error = events
            .iter()
            .find(|e| e["event"] == "error")
            .expect("an error event");
        let message = error["message"].as_str().unwrap().to_lowercase();
        eprintln!("{what}: {message}");
        assert!(
            message.contains("401") || message.contains("token") || message.contains("auth"),
            "{what}: {message}"
        );
    }
}

#[test]
fn a_published_microphone_track_reaches_the_other_participant() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let url = server.url.clone();
    let listener_token = token(SECRET, "bob", "call-3", Duration::from_secs(600));
    let listener =
        std::thread::spawn(move || livekit_caller(&url, &listener_token, &["--listen", "7"]));
    std::thread::sleep(Duration::from_millis(1500));
    let speaker_token = token(SECRET, "alice", "call-3", Duration::from_secs(600));
    let (ok, spoken) = livekit_caller(&server.url, &speaker_token, &["--publish-tone", "4"]);
    assert!(ok, "{spoken:?}");
    assert!(
        spoken.iter().any(|e| e["event"] == "published"),
        "{spoken:?}"
    );
    let (ok, heard) = listener.join().unwrap();
    assert!(ok, "{heard:?}");
    let subscribed = heard
        .iter()
        .find(|e| e["event"] == "subscribed")
        .unwrap_or_else(|| panic!("bob was never sent alice's track: {heard:?}"));
    assert_eq!(subscribed["identity"], "alice");
    assert!(subscribed["track_sid"].as_str().unwrap().starts_with("TR_"));
    let heard = heard
        .iter()
        .find(|e| e["event"] == "heard")
        .expect("a report");
    // 4 s of tone in 10 ms frames, and loud (a 0.3 full-scale sine has an RMS near 7,000).
    assert!(heard["frames"].as_u64().unwrap() > 200, "{heard}");
    assert!(heard["rms"].as_f64().unwrap() > 2000.0, "{heard}");
}
