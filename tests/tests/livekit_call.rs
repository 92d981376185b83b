//! A call in a LiveKit room, end to end: LiveKit's official Node client publishes a
//! recorded question into the test server's room and records what it hears; the agent
//! answers it through the whole voice pipeline.

use std::time::Duration;

use sublet_agent::{AgentConfig, Quiet, VoiceAgent};
use sublet_audio::read_wav;
use sublet_livekit::{CallEnd, CallOptions, LiveKitAgent, TrackIgnored};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tests::official_clients::{livekit_caller, recorded_question, room_token};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";

#[test]
fn a_caller_in_a_livekit_room_hears_the_agent_answer() {
    answer_a_call("call-7", None);
}

#[test]
fn a_call_goes_on_when_the_agents_signal_connection_drops_mid_question() {
    // The caller joins at 2 s and asks from about 3 s to 8 s.
    answer_a_call("call-8", Some(Duration::from_millis(5500)));
}

/// One question asked and answered; with `drop_signal_at`, the server drops the agent's
/// signal connection that long after the agent joined, and the call must go on regardless.
fn answer_a_call(room: &'static str, drop_signal_at: Option<Duration>) {
    // One call at a time: two pipelines on two cores would blur the latencies the test prints.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-{room}-{}", std::process::id()));
    let question_wav = recorded_question(&cache, &dir);
    let recording = dir.join("heard.wav");

    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let url = server.url.clone();
    let (q, r) = (question_wav.clone(), recording.clone());
    let caller = std::thread::spawn(move || {
        // Give the agent a moment to join first, as a dispatched agent would.
        std::thread::sleep(Duration::from_secs(2));
        let token = room_token(KEY, SECRET, "caller", room, Duration::from_secs(600));
        livekit_caller(
            &url,
            &token,
            &[
                "--publish-wav",
                q.to_str().unwrap(),
                "--listen",
                "20",
                "--record",
                r.to_str().unwrap(),
            ],
        )
    });
    let token = credentials.agent_token(room, "sublet-agent").unwrap();
    let call = std::thread::scope(|scope| {
        if let Some(at) = drop_signal_at {
            let server = &server;
            scope.spawn(move || {
                std::thread::sleep(at);
                assert!(server.drop_signal(room, "sublet-agent"));
            });
        }
        agent
            .answer_room(
                runtime.handle(),
                &credentials.url,
                &token,
                &CallOptions::default(),
                &mut Quiet,
            )
            .unwrap()
    });
    let expected_resumes = usize::from(drop_signal_at.is_some());
    assert_eq!(
        call.signal_resumes.len(),
        expected_resumes,
        "{}",
        call.ended
    );
    let (ok, events) = caller.join().unwrap();
    assert!(ok, "{events:?}");
    assert_eq!(call.caller.as_deref(), Some("caller"), "{}", call.ended);
    assert_eq!(call.turns.len(), 1, "{:?}", call.turns);
    let turn = &call.turns[0];
    eprintln!(
        "agent: {:?} → {:?} (voice to voice {:.2} s by the agent's clock; end-of-turn score {:?}; stages {:?} s)",
        turn.transcript,
        turn.reply,
        turn.voice_to_voice_s(),
        turn.end_of_turn_score,
        turn.stage_latencies()
    );
    assert!(
        word_error_rate("Is it going to rain today?", &turn.transcript) < 0.35,
        "{:?}",
        turn.transcript
    );

    let heard_event = events
        .iter()
        .find(|e| e["event"] == "heard")
        .expect("the caller's report");
    eprintln!("caller: {heard_event}");
    let heard = read_wav(&recording).unwrap().resampled(16_000);
    let _ = std::fs::remove_dir_all(&dir);
    let mut stt = Transcriber::load(&cache).unwrap();
    let text = stt.transcribe(&heard.samples).unwrap();
    let wer = word_error_rate(&turn.reply, &text);
    eprintln!("the caller heard {text:?} (WER {wer:.3} against the reply the agent logged)");
    assert!(
        wer < 0.35,
        "heard {text:?}, the agent said {:?}",
        turn.reply
    );
    assert!(
        heard_event["voice_to_voice_ms"].as_f64().is_some(),
        "{heard_event}"
    );

    // The caller saw the agent's state change, in order, through the participant attribute.
    let states: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "attributes" && e["identity"] == "sublet-agent")
        .filter_map(|e| e["changed"]["lk.agent.state"].as_str())
        .collect();
    eprintln!("the agent's states, as the caller saw them: {states:?}");
    let order = ["thinking", "speaking", "listening"];
    let mut at = 0;
    for state in &states {
        if at < order.len() && *state == order[at] {
            at += 1;
        }
    }
    assert_eq!(at, order.len(), "states seen: {states:?}");

    // And the turn's transcripts, both sides, on `lk.transcription`.
    let transcripts: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["event"] == "transcription")
        .map(|e| {
            (
                e["identity"].as_str().unwrap_or(""),
                e["text"].as_str().unwrap_or(""),
            )
        })
        .collect();
    eprintln!("transcripts the caller received: {transcripts:?}");
    assert!(
        transcripts.contains(&("caller", turn.transcript.as_str())),
        "{transcripts:?}"
    );
    assert!(
        transcripts.contains(&("sublet-agent", turn.reply.as_str())),
        "{transcripts:?}"
    );
    assert!(events
        .iter()
        .filter(|e| e["event"] == "transcription")
        .all(|e| e["attributes"]["lk.transcription_final"] == "true"));
}

#[test]
fn a_caller_whose_audio_stops_while_they_stay_in_the_room_is_hung_up() {
    let options = CallOptions {
        media_timeout: Some(Duration::from_secs(3)),
        ..CallOptions::default()
    };
    let call = hung_up_after(
        "call-9",
        &options,
        &[],
        |server, room| server.stop_media(room, "caller"),
        "the caller's audio stopped for 3 s",
    );
    assert_eq!(call.ended, CallEnd::MediaStopped(Duration::from_secs(3)));
}

#[test]
fn a_muted_caller_is_hung_up_and_their_camera_never_heard() {
    let options = CallOptions {
        muted_timeout: Some(Duration::from_secs(3)),
        ..CallOptions::default()
    };
    let call = hung_up_after(
        "call-10",
        &options,
        &["--publish-video", "20"],
        |server, room| server.mute_audio(room, "caller"),
        "the caller stayed muted for 3 s",
    );
    assert_eq!(call.ended, CallEnd::MutedTooLong(Duration::from_secs(3)));
    // The caller's VP8 camera arrived first and was not fed to the Opus decoder.
    assert_eq!(
        call.ignored_tracks,
        vec![("caller".to_owned(), TrackIgnored::Video)]
    );
}

/// A caller asks one question (with `caller_options` for their client), then keeps an open
/// microphone until 30 s after joining; 15 s after the agent joined the server does
/// `fault` to them. The agent must answer, then hang up about 3 s after the fault, long
/// before the caller leaves, saying `reason` to the call's observer.
fn hung_up_after(
    room: &'static str,
    options: &CallOptions,
    caller_options: &'static [&'static str],
    fault: impl FnOnce(&TestServer, &str) -> bool + Send,
    reason: &str,
) -> sublet_livekit::RoomCall {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-{room}-{}", std::process::id()));
    let question_wav = recorded_question(&cache, &dir);
    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = server.url.clone();
    let q = question_wav.clone();
    // Its client sends silence all the while, so only the fault stops the agent hearing it.
    let caller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let token = room_token(KEY, SECRET, "caller", room, Duration::from_secs(600));
        let mut args = vec!["--publish-wav", q.to_str().unwrap(), "--listen", "30"];
        args.extend_from_slice(caller_options);
        livekit_caller(&url, &token, &args)
    });
    let token = credentials.agent_token(room, "sublet-agent").unwrap();
    let joined = std::time::Instant::now();
    let fault_after = Duration::from_secs(15);
    let mut end_seen = EndSeen(None);
    let call = std::thread::scope(|scope| {
        let server = &server;
        scope.spawn(move || {
            std::thread::sleep(fault_after);
            assert!(fault(server, room));
        });
        agent
            .answer_room(
                runtime.handle(),
                &credentials.url,
                &token,
                options,
                &mut end_seen,
            )
            .unwrap()
    });
    let ended_after = joined.elapsed();
    let _ = caller.join();
    let _ = std::fs::remove_dir_all(&dir);
    // Hung up about 3 s after the fault (the agent's playout may run on a little), long
    // before the caller left.
    assert!(
        ended_after >= fault_after + Duration::from_secs(3)
            && ended_after < fault_after + Duration::from_secs(10),
        "{ended_after:?}: {}",
        call.ended
    );
    assert_eq!(call.turns.len(), 1, "{:?}", call.turns);
    assert!(call.turns[0].outcome.answered(), "{:?}", call.turns[0]);
    // The call's observer (its record, in `room` and `worker`) was told why it ended.
    assert_eq!(end_seen.0.as_deref(), Some(reason));
    call
}

/// Keeps the reason a call ended.
struct EndSeen(Option<String>);

impl sublet_agent::CallObserver for EndSeen {
    fn call_ended(&mut self, reason: &str) {
        self.0 = Some(reason.to_owned());
    }
}
