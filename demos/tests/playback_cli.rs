//! `playback` refuses what is not a readable WAV, with a clear message and a failing exit.

use std::process::Command;

fn playback_on(bytes: &[u8], name: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("sublet-playback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(name);
    std::fs::write(&input, bytes).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_playback"))
        .arg(&input)
        .arg("--out")
        .arg(dir.join("reply.wav"))
        .arg("--timeline")
        .arg(dir.join("turns.json"))
        .arg("--fast")
        .env("SUBLET_RECORDS", dir.join("records"))
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_text_file_is_refused() {
    let (ok, stderr) = playback_on(b"hello, I am not audio\n", "notes.wav");
    assert!(!ok);
    assert!(stderr.contains("not a readable WAV"), "{stderr}");
    assert!(
        stderr.contains("notes.wav"),
        "the message names the file: {stderr}"
    );
}

#[test]
fn a_corrupt_wav_is_refused() {
    // A RIFF/WAVE header whose format chunk is cut off.
    let mut bytes = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00".to_vec();
    bytes.extend_from_slice(&[0xff; 3]);
    let (ok, stderr) = playback_on(&bytes, "corrupt.wav");
    assert!(!ok);
    assert!(
        stderr.contains("playback: error") && stderr.contains("corrupt.wav"),
        "{stderr}"
    );
}

#[test]
fn a_wav_claiming_an_absurd_rate_is_refused_at_once() {
    // 8-bit mono, so the header is consistent (a byte a frame) at 4,294,967,291 Hz: read
    // as it claims, resampling it to 16 kHz grew the process to 24 GB.
    let rate = 4_294_967_291u32;
    let frames = 16_000u32;
    let mut bytes = b"RIFF".to_vec();
    bytes.extend_from_slice(&(36 + frames).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&16u32.to_le_bytes());
    bytes.extend_from_slice(&[1, 0, 1, 0]); // PCM, one channel
    bytes.extend_from_slice(&rate.to_le_bytes());
    bytes.extend_from_slice(&rate.to_le_bytes()); // bytes a second
    bytes.extend_from_slice(&[1, 0, 8, 0]); // a byte a frame, 8 bits
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&frames.to_le_bytes());
    bytes.extend(std::iter::repeat_n(128u8, frames as usize));
    let (ok, stderr) = playback_on(&bytes, "absurd_rate.wav");
    assert!(!ok);
    assert!(stderr.contains("4294967291 Hz"), "{stderr}");
}

#[test]
fn a_call_killed_midway_keeps_the_turns_answered_so_far() {
    let call = sublet_models::ModelCache::from_env()
        .call("three_turns.wav")
        .expect("run `cargo xtask setup` for the test calls");
    let dir = std::env::temp_dir().join(format!("sublet-killed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let timeline = dir.join("turns.json");
    // In real time, so the call is still going after its first answer.
    let mut child = Command::new(env!("CARGO_BIN_EXE_playback"))
        .arg(&call)
        .arg("--out")
        .arg(dir.join("reply.wav"))
        .arg("--timeline")
        .arg(&timeline)
        .arg("--realtime")
        .arg("--records")
        .arg(dir.join("records"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let seen = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no turn answered"
        );
        let read: Option<serde_json::Value> = std::fs::read_to_string(&timeline)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        if let Some(seen) = read.filter(|t| t["turns"].as_array().is_some_and(|t| !t.is_empty())) {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(seen["complete"], false, "{seen}");
    // What the killed call left on disk: a whole timeline, the answered turns in it.
    let left: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    assert_eq!(left["complete"], false, "{left}");
    let turns = left["turns"].as_array().unwrap();
    assert!(!turns.is_empty() && turns.len() < 3, "{left}");
    assert!(
        turns[0]["transcript"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{left}"
    );
    // And the call's record: the same turns, each on disk as it ended, and no end.
    let records: Vec<_> = std::fs::read_dir(dir.join("records"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let record = sublet_demos::read_call_record(&records[0]).unwrap();
    assert!(record.ended.is_none(), "{record:?}");
    assert_eq!(record.call["program"], "playback", "{record:?}");
    assert!(record.turns.len() >= turns.len(), "{record:?}");
    assert_eq!(
        record.turns[0].transcript,
        turns[0]["transcript"].as_str().unwrap(),
        "{record:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reply_rate_outside_what_a_wav_takes_is_an_error_not_a_panic() {
    for rate in ["0", "999", "384001"] {
        let output = Command::new(env!("CARGO_BIN_EXE_playback"))
            .args(["call.wav", "--rate", rate])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{rate}: {stderr}");
        assert!(
            stderr.contains("--rate") && !stderr.contains("panicked"),
            "{rate}: {stderr}"
        );
    }
}
