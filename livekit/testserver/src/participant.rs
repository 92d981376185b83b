//! One participant, from join to leave: its signal connection, its two peer connections,
//! the tracks it publishes (forwarded to everyone else in the room) and the tracks it is
//! sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::ws::{Message, WebSocket};
use bytes::BytesMut;
use livekit_api::access_token::Claims;
use livekit_protocol as proto;
use prost::Message as _;
use proto::signal_request::Message as Request;
use proto::signal_response::Message as Reply;
use tokio::sync::{mpsc, oneshot};
use webrtc::data_channel::{DataChannel, DataChannelEvent};
use webrtc::media_stream::track_remote::{TrackRemote, TrackRemoteEvent};

use super::{now_ms, RoomState, ServerState};
use sublet_livekit::peer::{OutputTrack, Peer};

/// A published track and where its packets go.
struct Published {
    info: proto::TrackInfo,
    outputs: Arc<Mutex<Vec<Arc<OutputTrack>>>>,
}

pub struct Participant {
    info: Mutex<proto::ParticipantInfo>,
    /// What the participant is sent on its signal connection; held while it has none.
    signal: mpsc::UnboundedSender<Reply>,
    /// A resumed signal connection, or the test's order to drop the current one.
    control: mpsc::UnboundedSender<Control>,
    publisher: Peer,
    subscriber: Peer,
    /// Tracks announced by `AddTrack` and not yet arrived, by the client's id (`cid`).
    pending: Mutex<Vec<(String, proto::TrackInfo)>>,
    published: Mutex<Vec<Published>>,
    /// The `_reliable` data channel the client opened: data packets come and go on it.
    reliable: Mutex<Option<Arc<dyn DataChannel>>>,
    /// One subscriber negotiation at a time; the client's answer to the one in flight.
    negotiation: tokio::sync::Mutex<()>,
    answer: Mutex<Option<oneshot::Sender<String>>>,
    /// The test stopped this participant's media: its packets are no longer forwarded,
    /// as when a media path breaks under a live signal connection.
    media_stopped: Arc<AtomicBool>,
}

/// What changes a participant's signal connection from outside its session.
pub enum Control {
    /// The client came back (`/rtc?reconnect=1&sid=…`) on this connection.
    Resume(Box<WebSocket>),
    /// Drop the connection without a word, as a failing network would.
    Drop,
}

/// How long a participant whose signal connection dropped is kept for it to resume.
const RESUME_WINDOW: Duration = Duration::from_secs(15);

impl Participant {
    pub fn info(&self) -> proto::ParticipantInfo {
        lock(&self.info).clone()
    }

    pub fn control(&self, control: Control) {
        let _ = self.control.send(control);
    }

    /// Stops forwarding the media this participant publishes; its signal connection
    /// stays up.
    pub fn stop_media(&self) {
        self.media_stopped.store(true, Ordering::Relaxed);
    }

    fn send(&self, message: Reply) {
        let _ = self.signal.send(message);
    }
}

/// Mutes every audio track `me` publishes in `room`, as LiveKit's `MutePublishedTrack`
/// does: its packets stop and everyone else is told it is muted.
pub fn mute_audio(state: &ServerState, room: &str, me: &Participant) {
    let info = {
        let mut info = lock(&me.info);
        let audio = proto::TrackType::Audio as i32;
        for track in info.tracks.iter_mut().filter(|t| t.r#type == audio) {
            track.muted = true;
        }
        info.version += 1;
        info.clone()
    };
    me.stop_media();
    for other in others(state, room, &info.sid) {
        other.send(Reply::Update(proto::ParticipantUpdate {
            participants: vec![info.clone()],
        }));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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

/// The answer to a resume the server will not allow: leave, and do not come back.
pub fn refusal() -> Message {
    reply(Reply::Leave(proto::LeaveRequest {
        can_reconnect: false,
        reason: proto::DisconnectReason::StateMismatch as i32,
        action: proto::leave_request::Action::Disconnect as i32,
        ..Default::default()
    }))
}

fn others(state: &ServerState, room: &str, me: &str) -> Vec<Arc<Participant>> {
    let rooms = lock(&state.rooms);
    rooms.get(room).map_or_else(Vec::new, |r| {
        r.participants
            .values()
            .filter(|p| p.info().sid != me)
            .cloned()
            .collect()
    })
}

fn participant_info(state: &ServerState, claims: &Claims) -> proto::ParticipantInfo {
    proto::ParticipantInfo {
        sid: state.id("PA_"),
        identity: claims.sub.clone(),
        name: claims.name.clone(),
        attributes: claims.attributes.clone(),
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
    }
}

/// Serves one signal connection, from join to leave.
pub async fn serve(state: Arc<ServerState>, claims: Claims, mut socket: WebSocket) -> Result<()> {
    let room_name = claims.video.room.clone();
    let info = participant_info(&state, &claims);
    let sid = info.sid.clone();
    let (signal, mut outbox) = mpsc::unbounded_channel::<Reply>();
    let (control, mut controls) = mpsc::unbounded_channel::<Control>();
    let (remote_tx, mut remote_tracks) = mpsc::unbounded_channel();
    let (data_tx, mut data_channels) = mpsc::unbounded_channel::<Arc<dyn DataChannel>>();
    let me = Arc::new(Participant {
        info: Mutex::new(info.clone()),
        signal,
        control,
        publisher: Peer::new(state.media_ip, Some(remote_tx), Some(data_tx)).await?,
        subscriber: Peer::new(state.media_ip, None, None).await?,
        reliable: Mutex::new(None),
        pending: Mutex::new(Vec::new()),
        published: Mutex::new(Vec::new()),
        negotiation: tokio::sync::Mutex::new(()),
        answer: Mutex::new(None),
        media_stopped: Arc::new(AtomicBool::new(false)),
    });
    let (room_sid, others_now) = {
        let mut rooms = lock(&state.rooms);
        let room = rooms.entry(room_name.clone()).or_insert_with(|| {
            // A new room: workers that take every room (no agent name) are sent one.
            if claims.kind != "agent" {
                let (state, room) = (state.clone(), room_name.clone());
                tokio::spawn(async move {
                    let _ = super::worker::dispatch(&state, &room, "").await;
                });
            }
            RoomState {
                sid: state.id("RM_"),
                participants: Default::default(),
            }
        });
        let others: Vec<_> = room.participants.values().cloned().collect();
        room.participants.insert(sid.clone(), me.clone());
        (room.sid.clone(), others)
    };
    for other in &others_now {
        other.send(Reply::Update(proto::ParticipantUpdate {
            participants: vec![info.clone()],
        }));
    }
    let join = proto::JoinResponse {
        room: Some(proto::Room {
            sid: room_sid,
            name: room_name.clone(),
            num_participants: others_now.len() as u32 + 1,
            creation_time: now_ms() / 1000,
            creation_time_ms: now_ms(),
            ..Default::default()
        }),
        participant: Some(info.clone()),
        other_participants: others_now.iter().map(|p| p.info()).collect(),
        server_version: "sublet-test-1".into(),
        subscriber_primary: false,
        ping_interval: 5,
        ping_timeout: 15,
        ..Default::default()
    };
    socket.send(reply(Reply::Join(join))).await?;
    // Everything already published in the room is sent to the newcomer.
    for other in &others_now {
        let publisher = other.info();
        for published in lock(&other.published).iter() {
            subscribe(
                me.clone(),
                publisher.clone(),
                published.info.clone(),
                published.outputs.clone(),
            );
        }
    }

    // The signal connection, while the participant has one; when it drops, the participant
    // stays (its media keeps flowing, its messages wait) until it resumes or the window ends.
    let mut socket = Some(socket);
    let mut gone_since: Option<tokio::time::Instant> = None;
    let result = loop {
        let resume_deadline = gone_since.map(|at| at + RESUME_WINDOW);
        tokio::select! {
            outgoing = outbox.recv(), if socket.is_some() => match outgoing {
                Some(message) => {
                    if let Some(s) = socket.as_mut() {
                        if s.send(reply(message)).await.is_err() {
                            socket = None;
                            gone_since = Some(tokio::time::Instant::now());
                        }
                    }
                }
                None => break Ok(()),
            },
            control = controls.recv() => match control {
                Some(Control::Resume(mut resumed)) => {
                    let response = proto::ReconnectResponse::default();
                    if resumed.send(reply(Reply::Reconnect(response))).await.is_ok() {
                        socket = Some(*resumed);
                        gone_since = None;
                        // Who is in the room now: LiveKit's clients take anyone missing
                        // from this snapshot as gone.
                        me.send(Reply::Update(proto::ParticipantUpdate {
                            participants: others(&state, &room_name, &sid)
                                .iter()
                                .map(|p| p.info())
                                .collect(),
                        }));
                    }
                }
                Some(Control::Drop) => {
                    socket = None;
                    gone_since.get_or_insert_with(tokio::time::Instant::now);
                }
                None => break Ok(()),
            },
            _ = sleep_until(resume_deadline) => {
                break Err(anyhow::anyhow!(
                    "{} did not resume its signal connection within {} s",
                    info.identity,
                    RESUME_WINDOW.as_secs()
                ));
            }
            track = remote_tracks.recv() => {
                if let Some(track) = track {
                    publish(&state, &room_name, &me, track).await;
                }
            }
            channel = data_channels.recv() => {
                if let Some(channel) = channel {
                    if channel.label().await.is_ok_and(|l| l == "_reliable") {
                        *lock(&me.reliable) = Some(channel.clone());
                        tokio::spawn(relay(state.clone(), room_name.clone(), me.clone(), channel));
                    }
                }
            }
            incoming = receive(&mut socket) => {
                let data = match incoming {
                    Some(Ok(Message::Binary(data))) => data,
                    Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => continue,
                    // Closed without a leave: the client may come back.
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        socket = None;
                        gone_since = Some(tokio::time::Instant::now());
                        continue;
                    }
                };
                let request = proto::SignalRequest::decode(data.as_ref())
                    .context("a signal request that is not LiveKit protobuf")?;
                if !handle(&state, &room_name, &me, request.message).await? {
                    break Ok(());
                }
            }
        }
    };
    me.publisher.close().await;
    me.subscriber.close().await;
    let mut rooms = lock(&state.rooms);
    if let Some(room) = rooms.get_mut(&room_name) {
        room.participants.remove(&sid);
        let gone = proto::ParticipantInfo {
            state: proto::participant_info::State::Disconnected as i32,
            ..me.info()
        };
        for other in room.participants.values() {
            other.send(Reply::Update(proto::ParticipantUpdate {
                participants: vec![gone.clone()],
            }));
        }
        if room.participants.is_empty() {
            rooms.remove(&room_name);
        }
    }
    result
}

/// The next message on the signal connection; never, while there is none.
async fn receive(socket: &mut Option<WebSocket>) -> Option<Result<Message, axum::Error>> {
    match socket {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Handles one signal request; `false` when the participant leaves. Replies go through
/// the participant's outbox, in order with everything else it is sent.
async fn handle(
    state: &ServerState,
    room: &str,
    me: &Participant,
    request: Option<Request>,
) -> Result<bool> {
    match request {
        Some(Request::Offer(offer)) => {
            let answer = me.publisher.answer(offer.sdp).await?;
            // The answer names the offer it answers: LiveKit's browser SDK waits for its
            // offer's id to come back before a track's publication completes.
            me.send(Reply::Answer(proto::SessionDescription {
                r#type: "answer".into(),
                sdp: answer,
                id: offer.id,
                ..Default::default()
            }));
        }
        Some(Request::Answer(answer)) => {
            if let Some(waiting) = lock(&me.answer).take() {
                let _ = waiting.send(answer.sdp);
            }
        }
        Some(Request::Trickle(trickle)) => {
            let peer = if trickle.target == proto::SignalTarget::Subscriber as i32 {
                &me.subscriber
            } else {
                &me.publisher
            };
            if let Err(e) = peer.add_candidate(&trickle.candidate_init).await {
                eprintln!("livekit test server: {e:#}");
            }
        }
        Some(Request::AddTrack(add)) => {
            let track = proto::TrackInfo {
                sid: state.id("TR_"),
                r#type: add.r#type,
                name: add.name.clone(),
                source: add.source,
                muted: add.muted,
                disable_red: add.disable_red,
                stream: add.stream.clone(),
                mime_type: if add.r#type == proto::TrackType::Video as i32 {
                    "video/vp8".into()
                } else {
                    "audio/opus".into()
                },
                ..Default::default()
            };
            lock(&me.pending).push((add.cid.clone(), track.clone()));
            me.send(Reply::TrackPublished(proto::TrackPublishedResponse {
                cid: add.cid,
                track: Some(track),
            }));
        }
        Some(Request::UpdateMetadata(update)) => {
            let allowed = me.info().permission.is_some_and(|p| p.can_update_metadata);
            let reason = if allowed {
                let info = {
                    let mut info = lock(&me.info);
                    for (key, value) in update.attributes {
                        // An empty value deletes the attribute.
                        if value.is_empty() {
                            info.attributes.remove(&key);
                        } else {
                            info.attributes.insert(key, value);
                        }
                    }
                    info.version += 1;
                    info.clone()
                };
                let everyone = others(state, room, "");
                for p in everyone {
                    p.send(Reply::Update(proto::ParticipantUpdate {
                        participants: vec![info.clone()],
                    }));
                }
                proto::request_response::Reason::Ok
            } else {
                proto::request_response::Reason::NotAllowed
            };
            me.send(Reply::RequestResponse(proto::RequestResponse {
                request_id: update.request_id,
                reason: reason as i32,
                ..Default::default()
            }));
        }
        Some(Request::PingReq(ping)) => {
            me.send(Reply::PongResp(proto::Pong {
                last_ping_timestamp: ping.timestamp,
                timestamp: now_ms(),
            }));
        }
        Some(Request::Ping(_)) => me.send(Reply::Pong(now_ms())),
        Some(Request::Leave(_)) => return Ok(false),
        _ => {}
    }
    Ok(true)
}

/// A track arrived on the participant's publisher connection: it is published, forwarded
/// to everyone else in the room.
async fn publish(
    state: &ServerState,
    room: &str,
    me: &Arc<Participant>,
    track: Arc<dyn TrackRemote>,
) {
    let cid = track.track_id().await;
    let info = {
        let mut pending = lock(&me.pending);
        let at = pending
            .iter()
            .position(|(c, _)| *c == cid)
            .or(if pending.is_empty() { None } else { Some(0) });
        match at {
            Some(i) => pending.remove(i).1,
            None => return,
        }
    };
    let outputs = Arc::new(Mutex::new(Vec::new()));
    lock(&me.info).tracks.push(info.clone());
    lock(&me.published).push(Published {
        info: info.clone(),
        outputs: outputs.clone(),
    });
    let publisher = me.info();
    for other in others(state, room, &publisher.sid) {
        other.send(Reply::Update(proto::ParticipantUpdate {
            participants: vec![publisher.clone()],
        }));
        subscribe(other, publisher.clone(), info.clone(), outputs.clone());
    }
    tokio::spawn(forward(track, outputs, me.media_stopped.clone()));
}

/// Relays the data packets a participant sends (text streams among them) to everyone else
/// in the room, naming the sender unless it sends on someone's behalf.
async fn relay(
    state: Arc<ServerState>,
    room: String,
    me: Arc<Participant>,
    channel: Arc<dyn DataChannel>,
) {
    while let Some(event) = channel.poll().await {
        let DataChannelEvent::OnMessage(message) = event else {
            continue;
        };
        let Ok(mut packet) = proto::DataPacket::decode(&message.data[..]) else {
            eprintln!("livekit test server: a data message that is not a DataPacket");
            continue;
        };
        let info = me.info();
        if packet.participant_identity.is_empty() {
            packet.participant_identity = info.identity.clone();
        }
        packet.participant_sid = info.sid.clone();
        let bytes = BytesMut::from(&packet.encode_to_vec()[..]);
        for other in others(&state, &room, &info.sid) {
            let target = lock(&other.reliable).clone();
            if let Some(target) = target {
                let _ = target.send(bytes.clone()).await;
            }
        }
    }
}

/// Copies a published track's packets to every subscriber's output track, until its
/// participant's media is stopped.
async fn forward(
    track: Arc<dyn TrackRemote>,
    outputs: Arc<Mutex<Vec<Arc<OutputTrack>>>>,
    stopped: Arc<AtomicBool>,
) {
    while let Some(event) = track.poll().await {
        if stopped.load(Ordering::Relaxed) {
            continue;
        }
        if let TrackRemoteEvent::OnRtpPacket(packet) = event {
            let targets: Vec<_> = lock(&outputs).clone();
            for target in targets {
                // A subscriber whose connection is not up yet misses the packet.
                let _ = target.write(packet.clone()).await;
            }
        }
    }
}

/// Sends `track` of `publisher` to `subscriber`: the participant update that names it, then
/// a subscriber offer carrying it (stream id `PA_…|TR_…`, as LiveKit's clients expect).
fn subscribe(
    subscriber: Arc<Participant>,
    publisher: proto::ParticipantInfo,
    track: proto::TrackInfo,
    outputs: Arc<Mutex<Vec<Arc<OutputTrack>>>>,
) {
    tokio::spawn(async move {
        let _one_at_a_time = subscriber.negotiation.lock().await;
        subscriber.send(Reply::Update(proto::ParticipantUpdate {
            participants: vec![publisher.clone()],
        }));
        let result = async {
            let stream = format!("{}|{}", publisher.sid, track.sid);
            let output = if track.r#type == proto::TrackType::Video as i32 {
                subscriber
                    .subscriber
                    .add_video_track(&stream, &track.sid)
                    .await?
            } else {
                subscriber
                    .subscriber
                    .add_audio_track(&stream, &track.sid)
                    .await?
            };
            lock(&outputs).push(output);
            let offer = subscriber.subscriber.offer().await?;
            let (answer_tx, answer_rx) = oneshot::channel();
            *lock(&subscriber.answer) = Some(answer_tx);
            subscriber.send(Reply::Offer(proto::SessionDescription {
                r#type: "offer".into(),
                sdp: offer,
                ..Default::default()
            }));
            let answer = tokio::time::timeout(Duration::from_secs(10), answer_rx)
                .await
                .context("no answer to the subscriber offer in 10 s")??;
            subscriber.subscriber.accept_answer(answer).await
        }
        .await;
        if let Err(e) = result {
            eprintln!(
                "livekit test server: subscribing {}: {e:#}",
                publisher.identity
            );
        }
    });
}
