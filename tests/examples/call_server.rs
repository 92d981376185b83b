//! The LiveKit test server on its own, for trying a worker by hand: a call through
//! LiveKit's official Node client while other clients use the worker's API (as
//! `docs/agents-api.md` runs Claude Code and Codex beside a call).
//!
//! ```sh
//! cargo run --release -p sublet-tests --example call_server
//! ```
//!
//! It prints the worker's environment and a caller's command (room `call-1`, the bundled
//! recorded question), then serves until stopped.

use std::time::Duration;

use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_tests::official_clients::{question_between_quiet, room_token};

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";

fn main() -> anyhow::Result<()> {
    let server = TestServer::start(KEY, SECRET)?;
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join("sublet-call-server");
    // The recorded question, with quiet before it (to join) and after it (the reply).
    let question = question_between_quiet(&cache, &dir, 2.0, 8.0);
    let wav = dir.join("question-in-quiet.wav");
    sublet_audio::write_wav(&wav, &question)?;
    let token = room_token(KEY, SECRET, "caller", "call-1", Duration::from_secs(3600));
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/livekit_caller.cjs");
    println!(
        "LIVEKIT_URL={} LIVEKIT_API_KEY={KEY} LIVEKIT_API_SECRET={SECRET}",
        server.url
    );
    println!(
        "NODE_PATH={} node {} {} {token} --publish-wav {} --listen 14",
        cache.node_modules()?.display(),
        script.display(),
        server.url,
        wav.display()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
