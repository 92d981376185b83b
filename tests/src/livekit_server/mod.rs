//! A LiveKit-protocol test server: enough of LiveKit's signal protocol (v0, two peer
//! connections per participant) and media forwarding for one room with a caller and the
//! agent. It stands in for a LiveKit server, which cannot be installed here, and is trusted
//! only because LiveKit's own client (npm `@livekit/rtc-node`) works against it.
//!
//! What it does so far: checks the access token (HS256, the API key's secret), answers
//! `/rtc/v1` with 404 so clients fall back to the v0 path, sends the `JoinResponse`,
//! answers the publisher peer connection's offers (webrtc-rs), takes trickled candidates,
//! answers pings, and lets a participant leave.

mod peer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use livekit_api::access_token::{Claims, TokenVerifier};
use livekit_protocol as proto;
use prost::Message as _;
use proto::signal_request::Message as Request;
use proto::signal_response::Message as Reply;
use tokio::sync::mpsc;

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
            media_ip: peer::media_ip(),
            rooms: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/rtc", get(rtc))
            .route("/rtc/v1", get(|| async { StatusCode::NOT_FOUND }))
            .route("/rtc/validate", get(validate))
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

    /// The identities in `room` now.
    pub fn participants(&self, room: &str) -> Vec<String> {
        let rooms = self.state.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = rooms
            .get(room)
            .map(|r| {
                r.participants
                    .values()
                    .map(|p| p.info.identity.clone())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

struct ServerState {
    verifier: TokenVerifier,
    /// The address peer connections gather on (LiveKit's clients ignore loopback).
    media_ip: std::net::IpAddr,
    rooms: Mutex<HashMap<String, RoomState>>,
    next_id: AtomicU64,
}

impl ServerState {
    /// An id with LiveKit's prefix (`PA_`, `RM_`, `TR_`): its clients check them.
    fn id(&self, prefix: &str) -> String {
        format!(
            "{prefix}{:012X}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }
}

struct RoomState {
    sid: String,
    participants: HashMap<String, ParticipantState>,
}

struct ParticipantState {
    info: proto::ParticipantInfo,
    signal: mpsc::UnboundedSender<Reply>,
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
    upgrade.on_upgrade(move |socket| async move {
        if let Err(e) = serve_participant(state, claims, socket).await {
            eprintln!("livekit test server: {e:#}");
        }
    })
}

fn reply(message: Reply) -> Message {
    Message::Binary(
        proto::SignalResponse {
            message: Some(message),
        }
        .encode_to_vec()
        .into(),
    )
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One participant's signal connection, from join to leave.
async fn serve_participant(
    state: Arc<ServerState>,
    claims: Claims,
    mut socket: WebSocket,
) -> Result<()> {
    let room_name = claims.video.room.clone();
    let (tx, mut outbox) = mpsc::unbounded_channel::<Reply>();
    let info = proto::ParticipantInfo {
        sid: state.id("PA_"),
        identity: claims.sub.clone(),
        name: claims.name.clone(),
        state: proto::participant_info::State::Active as i32,
        joined_at: now_ms() / 1000,
        joined_at_ms: now_ms(),
        kind: if claims.kind == "agent" {
            proto::participant_info::Kind::Agent as i32
        } else {
            proto::participant_info::Kind::Standard as i32
        },
        permission: Some(proto::ParticipantPermission {
            can_subscribe: claims.video.can_subscribe.unwrap_or(true),
            can_publish: claims.video.can_publish.unwrap_or(true),
            can_publish_data: claims.video.can_publish_data.unwrap_or(true),
            can_update_metadata: claims.video.can_update_own_metadata.unwrap_or(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (room_sid, others) = {
        let mut rooms = state.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let room = rooms.entry(room_name.clone()).or_insert_with(|| RoomState {
            sid: state.id("RM_"),
            participants: HashMap::new(),
        });
        let others: Vec<_> = room.participants.values().map(|p| p.info.clone()).collect();
        for other in room.participants.values() {
            let _ = other.signal.send(Reply::Update(proto::ParticipantUpdate {
                participants: vec![info.clone()],
            }));
        }
        room.participants.insert(
            info.sid.clone(),
            ParticipantState {
                info: info.clone(),
                signal: tx.clone(),
            },
        );
        (room.sid.clone(), others)
    };
    let join = proto::JoinResponse {
        room: Some(proto::Room {
            sid: room_sid,
            name: room_name.clone(),
            num_participants: others.len() as u32 + 1,
            creation_time: now_ms() / 1000,
            creation_time_ms: now_ms(),
            ..Default::default()
        }),
        participant: Some(info.clone()),
        other_participants: others,
        server_version: "sublet-test-1".into(),
        subscriber_primary: false,
        ping_interval: 5,
        ping_timeout: 15,
        ..Default::default()
    };
    socket.send(reply(Reply::Join(join))).await?;

    let publisher =
        peer::Peer::new(state.media_ip, proto::SignalTarget::Publisher, tx.clone()).await?;
    let result = loop {
        tokio::select! {
            outgoing = outbox.recv() => match outgoing {
                Some(message) => socket.send(reply(message)).await?,
                None => break Ok(()),
            },
            incoming = socket.recv() => {
                let data = match incoming {
                    Some(Ok(Message::Binary(data))) => data,
                    Some(Ok(Message::Close(_))) | None => break Ok(()),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => break Err(e).context("signal connection"),
                };
                let request = proto::SignalRequest::decode(data.as_ref())
                    .context("a signal request that is not LiveKit protobuf")?;
                match request.message {
                    Some(Request::Offer(offer)) => {
                        let answer = publisher.answer(offer.sdp).await?;
                        socket.send(reply(Reply::Answer(proto::SessionDescription {
                            r#type: "answer".into(),
                            sdp: answer,
                            ..Default::default()
                        }))).await?;
                    }
                    Some(Request::Trickle(trickle))
                        if trickle.target == proto::SignalTarget::Publisher as i32 =>
                    {
                        if let Err(e) = publisher.add_candidate(&trickle.candidate_init).await {
                            eprintln!("livekit test server: {e:#}");
                        }
                    }
                    Some(Request::PingReq(ping)) => {
                        socket.send(reply(Reply::PongResp(proto::Pong {
                            last_ping_timestamp: ping.timestamp,
                            timestamp: now_ms(),
                        }))).await?;
                    }
                    Some(Request::Ping(_)) => socket.send(reply(Reply::Pong(now_ms()))).await?,
                    Some(Request::Leave(_)) => break Ok(()),
                    _ => {}
                }
            }
        }
    };
    publisher.close().await;
    let mut rooms = state.rooms.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(room) = rooms.get_mut(&room_name) {
        room.participants.remove(&info.sid);
        let gone = proto::ParticipantInfo {
            state: proto::participant_info::State::Disconnected as i32,
            ..info
        };
        for other in room.participants.values() {
            let _ = other.signal.send(Reply::Update(proto::ParticipantUpdate {
                participants: vec![gone.clone()],
            }));
        }
        if room.participants.is_empty() {
            rooms.remove(&room_name);
        }
    }
    result
}
