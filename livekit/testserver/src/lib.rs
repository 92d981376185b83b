//! A LiveKit-protocol test server: enough of LiveKit's signal protocol (v0, two peer
//! connections per participant) and media forwarding for one room with a caller and the
//! agent. It stands in for a LiveKit server, which cannot be installed here, and is trusted
//! only because LiveKit's own client (npm `@livekit/rtc-node`) works against it.
//!
//! It checks the access token (HS256, the API key's secret), answers `/rtc/v1` with 404 so
//! clients fall back to the v0 path, and serves each participant (`participant.rs`): the
//! join, pings, the publisher peer connection it answers and the subscriber one it offers
//! (webrtc-rs, `peer.rs`), and every published audio track forwarded to everyone else.

mod participant;
mod worker;

pub use worker::JobView;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use livekit_api::access_token::{Claims, TokenVerifier};

/// A running test server; dropping it stops it.
pub struct TestServer {
    /// `ws://127.0.0.1:PORT`, what a client is given as the LiveKit URL.
    pub url: String,
    state: Arc<ServerState>,
    _runtime: tokio::runtime::Runtime,
}

impl TestServer {
    /// Starts a server that accepts tokens signed with `api_key`/`api_secret`.
    pub fn start(api_key: &str, api_secret: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("livekit-test-server")
            .build()?;
        let state = Arc::new(ServerState {
            verifier: TokenVerifier::with_api_key(api_key, api_secret),
            media_ip: sublet_livekit::peer::media_ip(),
            rooms: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            refuse_resumes: AtomicBool::new(false),
            api_key: api_key.into(),
            api_secret: api_secret.into(),
            workers: Mutex::new(Vec::new()),
            jobs: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/rtc", get(rtc))
            .route("/rtc/v1", get(|| async { StatusCode::NOT_FOUND }))
            .route("/rtc/validate", get(validate))
            .route("/agent", get(agent))
            .with_state(state.clone());
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr: SocketAddr = listener.local_addr()?;
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url: format!("ws://{addr}"),
            state,
            _runtime: runtime,
        })
    }

    /// What the agent needs to use this server: its URL and the API key it accepts.
    pub fn credentials(&self) -> sublet_livekit::LiveKitCredentials {
        sublet_livekit::LiveKitCredentials {
            url: self.url.clone(),
            api_key: self.state.api_key.clone(),
            api_secret: self.state.api_secret.clone(),
        }
    }

    /// The identities in `room` now.
    pub fn participants(&self, room: &str) -> Vec<String> {
        let rooms = self.state.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = rooms
            .get(room)
            .map(|r| r.participants.values().map(|p| p.info().identity).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Drops `identity`'s signal connection in `room` without a word, as a failing network
    /// would; `false` if nobody by that name is there. The participant may resume.
    pub fn drop_signal(&self, room: &str, identity: &str) -> bool {
        let participant = self.state.participant(room, |p| p.identity == identity);
        if let Some(participant) = &participant {
            participant.control(participant::Control::Drop);
        }
        participant.is_some()
    }

    /// Stops forwarding the media `identity` publishes in `room` while its signal
    /// connection stays up, as a broken media path would; `false` if nobody by that name
    /// is there.
    pub fn stop_media(&self, room: &str, identity: &str) -> bool {
        let participant = self.state.participant(room, |p| p.identity == identity);
        if let Some(participant) = &participant {
            participant.stop_media();
        }
        participant.is_some()
    }

    /// Mutes the microphone `identity` publishes in `room` from the server's side (LiveKit's
    /// `MutePublishedTrack`); `false` if nobody by that name is there.
    pub fn mute_audio(&self, room: &str, identity: &str) -> bool {
        let participant = self.state.participant(room, |p| p.identity == identity);
        if let Some(participant) = &participant {
            participant::mute_audio(&self.state, room, participant);
        }
        participant.is_some()
    }

    /// Drops every connected worker's connection without a word, as a failing network
    /// would; returns how many there were.
    pub fn drop_workers(&self) -> usize {
        let workers = self.state.workers.lock().unwrap_or_else(|e| e.into_inner());
        let connected: Vec<_> = workers.iter().filter(|w| w.connected()).collect();
        connected.iter().for_each(|w| w.drop_connection());
        connected.len()
    }

    /// Dispatches an agent to `room` (LiveKit's explicit dispatch): offers the job to the
    /// workers registered as `agent_name` and assigns it to the first that takes it.
    pub fn dispatch(&self, room: &str, agent_name: &str) -> Result<String> {
        self._runtime
            .block_on(worker::dispatch(&self.state, room, agent_name))
    }

    /// Every job dispatched so far, with its worker's last report.
    pub fn jobs(&self) -> Vec<JobView> {
        self.state
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every status each worker that registered reported, by worker id.
    pub fn worker_statuses(&self) -> Vec<(String, Vec<livekit_protocol::UpdateWorkerStatus>)> {
        let workers = self.state.workers.lock().unwrap_or_else(|e| e.into_inner());
        workers
            .iter()
            .map(|w| {
                let statuses = w.statuses.lock().unwrap_or_else(|e| e.into_inner());
                (w.id.clone(), statuses.clone())
            })
            .collect()
    }

    /// One of a participant's attributes (the agent's `lk.agent.state`, say).
    pub fn attribute(&self, room: &str, identity: &str, key: &str) -> Option<String> {
        let participant = self.state.participant(room, |p| p.identity == identity)?;
        participant.info().attributes.get(key).cloned()
    }

    /// From now on, a client that tries to resume its signal connection is told to leave.
    pub fn refuse_resumes(&self) {
        self.state.refuse_resumes.store(true, Ordering::Relaxed);
    }
}

struct ServerState {
    verifier: TokenVerifier,
    /// The address peer connections gather on (LiveKit's clients ignore loopback).
    media_ip: std::net::IpAddr,
    rooms: Mutex<HashMap<String, RoomState>>,
    next_id: AtomicU64,
    refuse_resumes: AtomicBool,
    /// To sign the tokens assigned jobs join with.
    api_key: String,
    api_secret: String,
    workers: Mutex<Vec<Arc<worker::Worker>>>,
    jobs: Mutex<Vec<JobView>>,
}

impl ServerState {
    /// An id with LiveKit's prefix (`PA_`, `RM_`, `TR_`): its clients check them.
    fn id(&self, prefix: &str) -> String {
        format!(
            "{prefix}{:012X}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn participant(
        &self,
        room: &str,
        which: impl Fn(&livekit_protocol::ParticipantInfo) -> bool,
    ) -> Option<Arc<participant::Participant>> {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        rooms
            .get(room)?
            .participants
            .values()
            .find(|p| which(&p.info()))
            .cloned()
    }
}

struct RoomState {
    sid: String,
    /// By participant sid.
    participants: HashMap<String, Arc<participant::Participant>>,
}

/// The token from `Authorization: Bearer …` or `?access_token=`.
fn token(headers: &HeaderMap, query: &HashMap<String, String>) -> Option<String> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| query.get("access_token").cloned())
}

/// The token's claims, or why it is refused (401).
fn authorize(
    state: &ServerState,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Claims, (StatusCode, String)> {
    let refuse = |why: String| (StatusCode::UNAUTHORIZED, why);
    let token = token(headers, query).ok_or_else(|| refuse("no access token".into()))?;
    let claims = state.verifier.verify(&token).map_err(|e| {
        refuse(format!(
            "invalid access token: it does not verify with this server's API key and secret ({e})"
        ))
    })?;
    // Strictly: the JWT library allows a minute's leeway past `exp`.
    if claims.exp as i64 <= now_ms() / 1000 {
        return Err(refuse("the access token has expired".into()));
    }
    if !claims.video.room_join || claims.video.room.is_empty() {
        return Err(refuse("the access token grants no room to join".into()));
    }
    Ok(claims)
}

/// What clients call after a failed connect, to learn why.
async fn validate(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    match authorize(&state, &headers, &query) {
        Ok(_) => (StatusCode::OK, "success").into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn rtc(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let claims = match authorize(&state, &headers, &query) {
        Ok(claims) => claims,
        Err(refusal) => return refusal.into_response(),
    };
    // A client resuming its session after its signal connection dropped.
    if query.get("reconnect").is_some_and(|r| r == "1") {
        let sid = query.get("sid").cloned().unwrap_or_default();
        let resumable = state
            .participant(&claims.video.room, |p| {
                p.sid == sid && p.identity == claims.sub
            })
            .filter(|_| !state.refuse_resumes.load(Ordering::Relaxed));
        return upgrade.on_upgrade(move |mut socket| async move {
            match resumable {
                Some(participant) => {
                    participant.control(participant::Control::Resume(Box::new(socket)))
                }
                None => {
                    let _ = socket.send(participant::refusal()).await;
                }
            }
        });
    }
    upgrade.on_upgrade(move |socket| async move {
        if let Err(e) = participant::serve(state, claims, socket).await {
            eprintln!("livekit test server: {e:#}");
        }
    })
}

/// A worker registering (`/agent`): its token must carry the `agent` grant.
async fn agent(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(token) = token(&headers, &query) else {
        return (StatusCode::UNAUTHORIZED, "no access token").into_response();
    };
    match state.verifier.verify(&token) {
        Ok(claims) if claims.video.agent => {}
        Ok(_) => {
            let why = "the access token does not grant `agent`";
            return (StatusCode::UNAUTHORIZED, why).into_response();
        }
        Err(e) => {
            let why = format!("invalid access token ({e})");
            return (StatusCode::UNAUTHORIZED, why).into_response();
        }
    }
    upgrade.on_upgrade(move |socket| async move {
        if let Err(e) = worker::serve(state, socket).await {
            eprintln!("livekit test server: a worker: {e:#}");
        }
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
