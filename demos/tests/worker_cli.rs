//! `worker` registers with a LiveKit server and drains on SIGTERM: with no call running it
//! leaves at once and exits cleanly, saying so.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sublet_livekit_testserver::TestServer;

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";

#[test]
fn sigterm_drains_the_worker_and_it_exits_cleanly() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(["--agent-name", "sublet"])
        .env("LIVEKIT_URL", &server.url)
        .env("LIVEKIT_API_KEY", KEY)
        .env("LIVEKIT_API_SECRET", SECRET)
        .env(
            "SUBLET_RECORDS",
            std::env::temp_dir().join("sublet-worker-cli-records"),
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while server.worker_statuses().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the worker never registered"
        );
        assert!(worker.try_wait().unwrap().is_none(), "the worker exited");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = worker.wait().unwrap();
    let mut stderr = String::new();
    worker
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    eprintln!("{stderr}");
    assert!(exit.success(), "{stderr}");
    assert!(stderr.contains("draining"), "{stderr}");
    assert!(
        stderr.contains("drained: no calls were running"),
        "{stderr}"
    );
    let statuses = &server.worker_statuses()[0].1;
    assert!(statuses.last().is_some_and(|s| s.draining), "{statuses:?}");
}
