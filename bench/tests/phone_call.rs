//! A phone caller in a LiveKit room: LiveKit's official Node client publishes a question
//! as a SIP trunk hands it on (8 kHz, 300–3,400 Hz, through G.711 μ-law), and the agent,
//! whose turn detector and transcriber need 16 kHz, hears one turn and answers it.

use std::time::Duration;

use sublet_agent::{AgentConfig, Quiet, VoiceAgent};
use sublet_bench::conditions::phone_line_8k;
use sublet_livekit::{CallOptions, LiveKitAgent};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_stt::word_error_rate;
use sublet_tests::official_clients::{livekit_caller, recorded_question, room_token};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";

#[test]
fn a_phone_caller_at_8_khz_is_heard_and_answered() {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-phone-{}", std::process::id()));
    let question = sublet_audio::read_wav(recorded_question(&cache, &dir)).unwrap();
    let phone = phone_line_8k(&question.resampled(sublet_audio::SPEECH_RATE));
    assert_eq!(phone.rate, 8000);
    let phone_wav = dir.join("phone.wav");
    sublet_audio::write_wav(&phone_wav, &phone).unwrap();

    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = server.url.clone();
    let wav = phone_wav.clone();
    let caller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let token = room_token(KEY, SECRET, "caller", "phone-1", Duration::from_secs(600));
        livekit_caller(
            &url,
            &token,
            &["--publish-wav", wav.to_str().unwrap(), "--listen", "12"],
        )
    });
    let token = credentials.agent_token("phone-1", "sublet-agent").unwrap();
    let call = agent
        .answer_room(
            runtime.handle(),
            &credentials.url,
            &token,
            &CallOptions::default(),
            &mut Quiet,
        )
        .unwrap();
    let (ok, events) = caller.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{events:?}");
    let spoke = events.iter().find(|e| e["event"] == "spoke").unwrap();
    eprintln!("the caller: {spoke}");
    assert_eq!(call.turns.len(), 1, "{:?}", call.turns);
    let turn = &call.turns[0];
    eprintln!(
        "agent: {:?} → {:?} (voice to voice {:.2} s)",
        turn.transcript,
        turn.reply,
        turn.voice_to_voice_s()
    );
    assert!(
        word_error_rate("Is it going to rain today?", &turn.transcript) < 0.35,
        "{:?}",
        turn.transcript
    );
    assert!(!turn.reply.is_empty());
}
