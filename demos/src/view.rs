//! The call as a person sees it (`--view ADDR`): a page served by the process that answers
//! the calls, which joins the LiveKit room as the caller with LiveKit's own browser SDK,
//! publishes the microphone and plays the agent, and shows what the room carries (the
//! agent's state, partial and final transcripts, each turn's record on
//! [`sublet_livekit::TURN_TOPIC`]) beside the engine's state, polled from this process.
//!
//! Routes:
//! - `/`, `/view.js`: the page (`demos/static/`, compiled in);
//! - `/livekit-client.js`: npm `livekit-client`'s browser build, from the Node folder setup
//!   fills in the model cache (nothing is fetched from elsewhere at run time);
//! - `/session`: a LiveKit URL and a fresh caller's token for the call's room, or 404 where
//!   this process answers no calls (`serve`: the page then shows the engine alone);
//! - `/engine`: the engine's state as JSON ([`engine_state`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Args;
use serde_json::{json, Value};
use sublet_agent::{SpeechMemory, VoiceAgent};
use sublet_engine::memory::{self, EngineMemory};
use sublet_engine::Engine;
use sublet_livekit::LiveKitCredentials;
use sublet_models::ModelCache;

use crate::listen;

const PAGE: &str = include_str!("../static/view.html");
const SCRIPT: &str = include_str!("../static/view.js");

/// Serve the live page.
#[derive(Args, Debug, Clone, Default)]
pub struct ViewArgs {
    /// Serve a live page at this address (for example 127.0.0.1:8080): where this process
    /// answers calls, it joins one as the caller from the browser and shows it (the
    /// transcripts, partial ones too, the agent's state, each turn's stage times); always,
    /// the engine's state. Loopback addresses only, unless `--view-public`.
    #[arg(long, value_name = "ADDR")]
    pub view: Option<SocketAddr>,
    /// Let `--view` listen on an address other machines can reach. Anyone who reaches the
    /// page gets a token to join the call's room, so only on a network you trust (and
    /// browsers give a page on plain HTTP the microphone only on localhost).
    #[arg(long, requires = "view")]
    pub view_public: bool,
}

/// Which room the page's caller joins.
#[derive(Debug, Clone)]
pub enum CallerRoom {
    /// The one room this process answers (`room`).
    Fixed {
        credentials: LiveKitCredentials,
        room: String,
    },
    /// A new room for each visit, `<prefix>-<n>`, which LiveKit dispatches to a worker
    /// (`worker`).
    PerVisit {
        credentials: LiveKitCredentials,
        prefix: String,
    },
    /// No calls here (`serve`): the page shows the engine alone.
    None,
}

/// What the page's routes share.
struct View {
    engine: Arc<Engine>,
    /// The voice agent whose speech models' memory the page shows (none under `serve`).
    speech: Option<VoiceAgent>,
    room: CallerRoom,
    client_js: axum::body::Bytes,
    visits: AtomicU64,
    /// What `/engine` shows, sampled: the page polls it, and anyone may loop on it.
    engine_state: sublet_engine::memory::Sampled<Value>,
    /// Sessions handed out lately: each may start a call (a room, an agent dispatched).
    sessions: SessionLimit,
}

/// At most [`SessionLimit::MOST`] sessions a minute, the page's whole audience together:
/// each visit may start a call, and a loop of GETs must not start hundreds.
#[derive(Default)]
struct SessionLimit {
    recent: std::sync::Mutex<std::collections::VecDeque<std::time::Instant>>,
}

impl SessionLimit {
    const MOST: usize = 10;
    const PER: std::time::Duration = std::time::Duration::from_secs(60);

    /// A session now, or the seconds until one is allowed.
    fn take(&self, now: std::time::Instant) -> Result<(), u64> {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while recent
            .front()
            .is_some_and(|&t| now.duration_since(t) >= Self::PER)
        {
            recent.pop_front();
        }
        if recent.len() >= Self::MOST {
            let oldest = recent[0];
            let wait = Self::PER.saturating_sub(now.duration_since(oldest));
            return Err(wait.as_secs().max(1));
        }
        recent.push_back(now);
        Ok(())
    }
}

impl ViewArgs {
    /// Listens on `--view`, if given, and serves the page on `runtime` until the process
    /// ends; returns the address it listens on.
    pub fn spawn(
        &self,
        program: &'static str,
        runtime: &tokio::runtime::Handle,
        engine: &Arc<Engine>,
        speech: Option<&VoiceAgent>,
        room: CallerRoom,
    ) -> Result<Option<SocketAddr>> {
        let Some(addr) = self.view else {
            return Ok(None);
        };
        anyhow::ensure!(
            addr.ip().is_loopback() || self.view_public,
            "--view {addr} would give anyone who reaches it a token to the call's room; \
             use a loopback address (127.0.0.1), or add --view-public"
        );
        let speech = speech.map(|agent| agent.with_config(agent.config.clone()));
        let app = router(engine.clone(), speech, room, &ModelCache::from_env())?;
        let listener = runtime.block_on(listen(addr))?;
        let local = listener.local_addr()?;
        eprintln!("{program}: the live page on http://{local}/");
        runtime.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!("the live page's server stopped: {e}");
            }
        });
        Ok(Some(local))
    }
}

/// Where setup put `livekit-client`'s browser build.
pub fn livekit_client_js(cache: &ModelCache) -> Result<PathBuf> {
    let path = cache
        .node_modules()?
        .join("livekit-client/dist/livekit-client.umd.js");
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: run `cargo xtask setup` (it installs npm livekit-client)",
        path.display()
    );
    Ok(path)
}

/// The page's routes over `engine` (and `speech`'s models), its caller joining `room`.
pub fn router(
    engine: Arc<Engine>,
    speech: Option<VoiceAgent>,
    room: CallerRoom,
    cache: &ModelCache,
) -> Result<Router> {
    let path = livekit_client_js(cache)?;
    let client_js = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let view = Arc::new(View {
        engine,
        speech,
        room,
        client_js: client_js.into(),
        visits: AtomicU64::new(0),
        engine_state: sublet_engine::memory::Sampled::new(sublet_engine::memory::SAMPLE_EVERY),
        sessions: SessionLimit::default(),
    });
    Ok(Router::new()
        .route("/", get(page))
        .route("/view.js", get(script))
        .route("/livekit-client.js", get(client))
        .route("/session", get(session))
        .route("/engine", get(engine_route))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .with_state(view))
}

/// The page, never inside another site's frame: `?autostart` starts a call with the
/// microphone, which a framing page could otherwise trigger and hide.
async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        PAGE,
    )
}

async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript")], SCRIPT)
}

async fn client(State(view): State<Arc<View>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript")],
        view.client_js.clone(),
    )
}

/// Whether a request names this page by an address or `localhost`: a page of another
/// site that resolves its own name to this address (DNS rebinding) gets no token.
fn named_directly(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = sublet_server::host_name(host);
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

async fn session(State(view): State<Arc<View>>, headers: HeaderMap) -> Response {
    if !named_directly(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "open the page by its address (or localhost), not through another name",
        )
            .into_response();
    }
    let visit = view.visits.fetch_add(1, Ordering::Relaxed) + 1;
    let identity = format!("caller-{visit}");
    let (credentials, room) = match &view.room {
        CallerRoom::Fixed { credentials, room } => (credentials, room.clone()),
        CallerRoom::PerVisit {
            credentials,
            prefix,
        } => (credentials, format!("{prefix}-{visit}")),
        CallerRoom::None => {
            return (
                StatusCode::NOT_FOUND,
                "this process answers no calls: the page shows the engine alone",
            )
                .into_response()
        }
    };
    if let Err(wait_s) = view.sessions.take(std::time::Instant::now()) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, wait_s.to_string())],
            format!(
                "{} calls started from this page in the last minute, its most: try again in {wait_s} s",
                SessionLimit::MOST
            ),
        )
            .into_response();
    }
    match credentials.caller_token(&room, &identity) {
        Ok(token) => Json(json!({
            "url": credentials.url,
            "room": room,
            "identity": identity,
            "token": token,
        }))
        .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response(),
    }
}

async fn engine_route(State(view): State<Arc<View>>) -> Json<Value> {
    Json(view.engine_state.get(|| {
        let speech = view.speech.as_ref().map(VoiceAgent::speech_memory);
        let mut state = engine_state(&view.engine, speech);
        if let Some(agent) = &view.speech {
            let names = agent.cache.model_names();
            state["speech_models"] = json!({ "stt": names.stt, "voice": names.voice });
        }
        state
    }))
}

/// The engine as the page shows it: KV use against the budget, requests running and
/// waiting by priority, make-room's counters, and where the memory goes.
pub fn engine_state(engine: &Engine, speech: Option<SpeechMemory>) -> Value {
    let state = engine.scheduler_state();
    let by_priority = |list: &[(i32, usize)]| -> Value {
        list.iter()
            .map(|(priority, n)| json!({ "priority": priority, "requests": n }))
            .collect()
    };
    let c = &state.counters;
    json!({
        "model": engine.model_name(),
        "make_room": state.make_room,
        "kv": { "used_tokens": state.kv_used_tokens, "budget_tokens": state.kv_budget_tokens },
        "running": by_priority(&state.running_by_priority),
        "waiting": by_priority(&state.waiting_by_priority),
        "counters": {
            "kv_preemptions": c.kv_preemptions,
            "held_request_steps": c.held_request_steps,
            "hints_seen": c.hints_seen,
            "prefill_chunks": c.prefill_chunks,
        },
        "memory": memory_figures(&engine.memory(), speech),
    })
}

/// Where the memory goes, each figure in bytes (null where not known): the process's
/// resident memory and heap, the engine's weights, KV and heap peak per step, and each
/// speech model's heap at its load, and each part's large blocks (allocated, resident).
pub fn memory_figures(engine: &EngineMemory, speech: Option<SpeechMemory>) -> Value {
    let heap = memory::heap_figures();
    let speech = speech.unwrap_or_default();
    json!({
        "resident_bytes": memory::resident_bytes(),
        "heap_in_use_bytes": heap.map(|h| h.in_use()),
        "heap_free_kept_bytes": heap.map(|h| h.arena_free),
        "engine_weights_bytes": engine.weights_bytes,
        "kv_allocated_bytes": engine.kv_allocated_bytes,
        "kv_used_bytes": engine.kv_used_bytes,
        "prefix_cache_bytes": engine.prefix_cache_bytes,
        "step_peak_bytes": engine.step_peak_bytes,
        "whisper_bytes": speech.whisper_bytes,
        "turn_detector_bytes": speech.turn_detector_bytes,
        "voice_bytes": speech.voice_bytes,
        "large_blocks": sublet_heap::large_blocks().map(|blocks| {
            sublet_heap::Owner::ALL
                .iter()
                .map(|&owner| {
                    let b = blocks.of(owner);
                    json!({ "part": owner.name(), "allocated_bytes": b.allocated, "resident_bytes": b.resident })
                })
                .collect::<Vec<_>>()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sessions_are_limited_per_minute() {
        let limit = SessionLimit::default();
        let start = std::time::Instant::now();
        for i in 0..SessionLimit::MOST {
            assert!(limit.take(start + Duration::from_secs(i as u64)).is_ok());
        }
        let later = start + Duration::from_secs(20);
        assert_eq!(limit.take(later), Err(40));
        // A minute after the first, one more.
        assert!(limit.take(start + Duration::from_secs(60)).is_ok());
        assert!(limit.take(start + Duration::from_secs(60)).is_err());
    }

    #[test]
    fn the_page_refuses_to_be_framed() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let response = runtime.block_on(page()).into_response();
        let headers = response.headers();
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            "frame-ancestors 'none'"
        );
    }

    #[test]
    fn only_an_address_or_localhost_gets_a_caller_token() {
        let named = |host: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, host.parse().unwrap());
            named_directly(&headers)
        };
        assert!(named("127.0.0.1:8080"));
        assert!(named("localhost:8080"));
        assert!(named("[::1]:8080"));
        assert!(named("192.168.1.20"));
        assert!(!named("evil.example:8080"), "a rebound name");
        assert!(!named("localhost.evil.example"));
        assert!(!named_directly(&HeaderMap::new()), "no Host at all");
    }
}
