//! The microphone demo through a real sound stack: a private PulseAudio server that `mic`
//! reaches through ALSA (cpal). A recorded question is played into the virtual microphone;
//! the agent's reply is recorded from the virtual speaker and transcribed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tests::official_clients::recorded_question;
use sublet_tests::pulse::{stop_recording, PulseAudio};

#[test]
fn the_agent_answers_a_question_asked_into_the_microphone() {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-mic-{}", std::process::id()));
    let question = recorded_question(&cache, &dir);
    let (timeline, log, heard) = (
        dir.join("turns.json"),
        dir.join("mic.log"),
        dir.join("speaker.wav"),
    );
    let pulse = PulseAudio::start().unwrap();
    let mut mic = pulse
        .command(env!("CARGO_BIN_EXE_mic"))
        .args(["--seconds", "25", "--timeline"])
        .arg(&timeline)
        .arg("--records")
        .arg(dir.join("records"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("mic: listening")
    {
        assert!(
            mic.try_wait().unwrap().is_none(),
            "mic exited: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "mic never started listening"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let recording = pulse.record_speaker(&heard).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    pulse.say(&question).unwrap();
    let status = mic.wait().unwrap();
    stop_recording(recording).unwrap();
    let console = std::fs::read_to_string(&log).unwrap();
    eprintln!("{console}");
    assert!(status.success(), "{console}");

    let turns: Value = serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    let turns = turns["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{turns:?}");
    // The call's record holds the same turn, and how the call ended.
    let record = std::fs::read_dir(dir.join("records"))
        .unwrap()
        .next()
        .expect("a record")
        .unwrap()
        .path();
    let record = sublet_demos::read_call_record(&record).unwrap();
    assert_eq!(record.turns.len(), 1, "{record:?}");
    assert_eq!(record.turns[0].reply, turns[0]["reply"].as_str().unwrap());
    assert!(record.ended.is_some(), "{record:?}");
    let (transcript, reply) = (
        turns[0]["transcript"].as_str().unwrap(),
        turns[0]["reply"].as_str().unwrap(),
    );
    assert!(
        word_error_rate("Is it going to rain today?", transcript) < 0.35,
        "{transcript:?}"
    );
    // The live view showed the turn, its words and its stage latencies.
    assert!(console.contains("you: speaking") && console.contains("agent: thinking"));
    assert!(console.contains("you (so far): "), "no partial transcript");
    assert!(console.contains(&format!("agent: {reply}")) && console.contains("voice to voice"));
    // And the speaker played the reply.
    let played = sublet_audio::read_wav(&heard).unwrap().resampled(16_000);
    let text = Transcriber::load(&cache)
        .unwrap()
        .transcribe(&played.samples)
        .unwrap();
    let wer = word_error_rate(reply, &text);
    eprintln!("the speaker played {text:?} (WER {wer:.3} against {reply:?})");
    assert!(wer < 0.35, "played {text:?}, the agent said {reply:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
