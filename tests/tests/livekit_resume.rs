//! A signal connection that drops mid-call: the agent resumes it and the call goes on, or
//! the call ends with a clear message when the server will not take it back. LiveKit's own
//! client resumes against the test server too, which is what makes the server's side of a
//! resume trustworthy.

use std::time::Duration;

use serde_json::Value;
use sublet_livekit::{RoomConnection, RoomEvent};
use sublet_livekit_testserver::TestServer;
use sublet_tests::official_clients::{livekit_caller, room_token};
use tokio::sync::mpsc::UnboundedReceiver;

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const AGENT: &str = "sublet-agent";

fn join_agent(
    server: &TestServer,
    room: &str,
    runtime: &tokio::runtime::Runtime,
) -> (RoomConnection, UnboundedReceiver<RoomEvent>) {
    let credentials = server.credentials();
    let token = credentials.agent_token(room, AGENT).unwrap();
    runtime
        .block_on(RoomConnection::join(&credentials.url, &token))
        .unwrap()
}

/// The official caller in `room`, in its own thread, with `args`.
fn spawn_caller(
    server: &TestServer,
    room: &str,
    args: &'static [&'static str],
) -> std::thread::JoinHandle<(bool, Vec<Value>)> {
    let url = server.url.clone();
    let token = room_token(KEY, SECRET, "caller", room, Duration::from_secs(600));
    std::thread::spawn(move || livekit_caller(&url, &token, args))
}

/// The first event `wanted` picks, within `limit`.
async fn next_event(
    events: &mut UnboundedReceiver<RoomEvent>,
    limit: Duration,
    wanted: impl Fn(&RoomEvent) -> bool,
) -> RoomEvent {
    tokio::time::timeout(limit, async {
        loop {
            let event = events.recv().await.expect("the room connection's events");
            if wanted(&event) {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no such room event in {limit:?}"))
}

/// The values of `lk.agent.state` the caller saw the agent set, in order (a value set
/// again after a resume counts once).
fn agent_states(events: &[Value]) -> Vec<&str> {
    let mut states: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "attributes" && e["identity"] == AGENT)
        .filter_map(|e| e["changed"]["lk.agent.state"].as_str())
        .collect();
    states.dedup();
    states
}

#[test]
fn the_agent_resumes_a_dropped_signal_connection_and_the_call_goes_on() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (agent, mut events) = join_agent(&server, "resume-1", &runtime);
    let caller = spawn_caller(
        &server,
        "resume-1",
        &["--publish-tone", "8", "--listen", "9"],
    );
    let resumed = runtime.block_on(async {
        let is_audio = |e: &RoomEvent| matches!(e, RoomEvent::Audio { .. });
        next_event(&mut events, Duration::from_secs(20), is_audio).await;
        assert!(server.drop_signal("resume-1", AGENT));
        // Said while the connection is down: held, and delivered once it is resumed.
        agent
            .set_attributes(&[("lk.agent.state", "thinking")])
            .await;
        let resumed = next_event(&mut events, Duration::from_secs(20), |e| {
            matches!(
                e,
                RoomEvent::Resumed { .. } | RoomEvent::Disconnected { .. }
            )
        })
        .await;
        // The caller's audio still arrives.
        let mut heard = 0;
        while heard < 16_000 {
            if let RoomEvent::Audio { samples, .. } =
                next_event(&mut events, Duration::from_secs(5), is_audio).await
            {
                heard += samples.len();
            }
        }
        agent
            .set_attributes(&[("lk.agent.state", "listening")])
            .await;
        resumed
    });
    eprintln!("{resumed:?}");
    let RoomEvent::Resumed { attempts, .. } = resumed else {
        panic!("the agent did not resume: {resumed:?}");
    };
    assert!(attempts >= 1);
    let (ok, seen) = caller.join().unwrap();
    assert!(ok, "{seen:?}");
    assert_eq!(agent_states(&seen), ["thinking", "listening"], "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|e| e["event"] == "participant_left" && e["identity"] == AGENT),
        "the caller saw the agent leave: {seen:?}"
    );
    assert_eq!(server.participants("resume-1"), [AGENT]);
    runtime.block_on(agent.leave());
}

#[test]
fn a_resume_the_server_refuses_ends_the_call_with_a_clear_message() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    server.refuse_resumes();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (_agent, mut events) = join_agent(&server, "resume-2", &runtime);
    assert!(server.drop_signal("resume-2", AGENT));
    let ended = runtime.block_on(next_event(&mut events, Duration::from_secs(20), |e| {
        matches!(
            e,
            RoomEvent::Resumed { .. } | RoomEvent::Disconnected { .. }
        )
    }));
    let RoomEvent::Disconnected { reason } = ended else {
        panic!("resumed although the server refuses: {ended:?}");
    };
    eprintln!("{reason}");
    assert!(reason.contains("could not be resumed"), "{reason}");
    assert!(reason.contains("refused"), "{reason}");
}

#[test]
fn the_official_client_resumes_against_the_test_server() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (agent, _events) = join_agent(&server, "resume-3", &runtime);
    let caller = spawn_caller(&server, "resume-3", &["--listen", "10"]);
    let joined = std::time::Instant::now();
    while !server
        .participants("resume-3")
        .contains(&"caller".to_owned())
    {
        assert!(
            joined.elapsed() < Duration::from_secs(20),
            "the caller never joined"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(server.drop_signal("resume-3", "caller"));
    std::thread::sleep(Duration::from_secs(4));
    runtime.block_on(agent.set_attributes(&[("lk.agent.state", "speaking")]));
    let (ok, seen) = caller.join().unwrap();
    assert!(ok, "{seen:?}");
    for event in ["reconnecting", "reconnected"] {
        assert!(
            seen.iter().any(|e| e["event"] == event),
            "{event}: {seen:?}"
        );
    }
    assert_eq!(agent_states(&seen), ["speaking"], "{seen:?}");
    runtime.block_on(agent.leave());
}
