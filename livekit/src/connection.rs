//! The agent in a LiveKit room: the signal connection (`livekit-signaling`), the
//! subscriber peer connection the server offers, and each participant's microphone decoded
//! from Opus and resampled to the pipeline's 16 kHz.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use livekit_protocol as proto;
use livekit_signaling::{SignalClient, SignalError, SignalEvent, SignalOptions};
use prost::Message as _;
use proto::signal_request::Message as Request;
use proto::signal_response::Message as Reply;
use rtc::rtp_transceiver::rtp_sender::RtpCodecKind;
use sublet_audio::StreamResampler;
use tokio::sync::{mpsc, oneshot};
use webrtc::data_channel::DataChannel;
use webrtc::media_stream::track_remote::{TrackRemote, TrackRemoteEvent};

use super::hearing::{self, ArrivingTrack, Hearing, Pace, TrackIgnored};
use super::participants;
use super::peer::{media_ip, Peer};
use super::publish::AudioPublisher;

/// The pipeline's sample rate.
const PIPELINE_RATE: u32 = 16_000;
/// WebRTC's Opus clock.
const OPUS_RATE: u32 = 48_000;

/// What happens in the room, as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum RoomEvent {
    ParticipantJoined {
        identity: String,
    },
    ParticipantLeft {
        identity: String,
    },
    /// The next piece of a participant's microphone, 16 kHz mono.
    Audio {
        identity: String,
        samples: Vec<f32>,
    },
    /// A participant's microphone is muted, or unmuted (every audio track it publishes
    /// muted, by the server's participant update). A muted client sends no audio.
    MicrophoneMuted {
        identity: String,
        muted: bool,
    },
    /// A track a participant published that the agent does not decode, and why.
    TrackIgnored {
        identity: String,
        reason: TrackIgnored,
    },
    /// The signal connection dropped and was resumed; media flowed on meanwhile.
    Resumed {
        /// Why it dropped.
        dropped: String,
        attempts: u32,
        after: Duration,
    },
    /// The room connection ended, and why.
    Disconnected {
        reason: String,
    },
}

/// The waits before each attempt to resume a dropped signal connection (about 16 s in
/// all, as LiveKit's own clients retry); a server that refuses the resume ends it at once.
const RESUME_BACKOFF_MS: [u64; 8] = [0, 250, 500, 1_000, 2_000, 4_000, 4_000, 4_000];

/// The agent's connection to one room.
pub struct RoomConnection {
    signal: Arc<SignalClient>,
    subscriber: Arc<Peer>,
    publisher: Arc<Peer>,
    waiting: Arc<Waiting>,
    data: Arc<dyn DataChannel>,
    next_stream: AtomicU64,
    /// Set once the agent leaves, so that the signal loop does not resume what it closed.
    leaving: Arc<AtomicBool>,
    pub identity: String,
    pub participant_sid: String,
    pub room_name: String,
}

type Names = Arc<Mutex<HashMap<String, String>>>;
/// What the server said of each track published in the room, by track sid.
type TrackInfos = Arc<Mutex<HashMap<String, proto::TrackInfo>>>;

/// A track's audio may run this far ahead of real time (a burst after a network stall)
/// before its packets are dropped: one second at Opus's clock.
const PACE_BURST: usize = OPUS_RATE as usize;

/// Replies the agent waits for: the server's answer to a publisher offer, and the
/// `TrackPublished` for each track it asked to publish (by its client id).
#[derive(Default)]
struct Waiting {
    answer: Mutex<Option<oneshot::Sender<String>>>,
    published: Mutex<HashMap<String, oneshot::Sender<proto::TrackInfo>>>,
    /// What the server confirmed the agent publishes, told again after a resume.
    tracks: Mutex<Vec<proto::TrackPublishedResponse>>,
    /// The agent's attributes as last set, set again after a resume: an update sent into a
    /// connection that had died without a word is lost.
    attributes: Mutex<HashMap<String, String>>,
}

/// How long the server has to answer a publication or an offer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl RoomConnection {
    /// Joins the room `token` grants on the LiveKit server at `url`.
    pub async fn join(
        url: &str,
        token: &str,
    ) -> Result<(Self, mpsc::UnboundedReceiver<RoomEvent>)> {
        let mut options = SignalOptions::default();
        options.region_failover = false;
        options.client_capabilities = Vec::new();
        options.client_protocol = 1;
        let (signal, join, events) = SignalClient::connect(url, token, options, None)
            .await
            .map_err(|e| anyhow!("could not join the LiveKit room at {url}: {e}"))?;
        let participant = join
            .participant
            .context("the join response names no participant")?;
        let room_name = join.room.map(|r| r.name).unwrap_or_default();
        let track_infos: TrackInfos = Arc::new(Mutex::new(HashMap::new()));
        remember_tracks(&track_infos, &join.other_participants);
        let names: Names = Arc::new(Mutex::new(
            join.other_participants
                .into_iter()
                .map(|p| (p.sid, p.identity))
                .collect(),
        ));
        let (tracks_tx, tracks) = mpsc::unbounded_channel();
        let subscriber = Arc::new(Peer::new(media_ip(), Some(tracks_tx), None).await?);
        let publisher = Arc::new(Peer::new(media_ip(), None, None).await?);
        // LiveKit's reliable data channel, negotiated with the publisher connection.
        let data = publisher.data_channel("_reliable").await?;
        tokio::spawn({
            let data = data.clone();
            async move { while data.poll().await.is_some() {} }
        });
        let signal = Arc::new(signal);
        let waiting = Arc::new(Waiting::default());
        let (room_events, room_rx) = mpsc::unbounded_channel();
        let leaving = Arc::new(AtomicBool::new(false));
        let peers = Peers {
            subscriber: subscriber.clone(),
            publisher: publisher.clone(),
            waiting: waiting.clone(),
            leaving: leaving.clone(),
        };
        tokio::spawn(run(
            signal.clone(),
            peers,
            events,
            tracks,
            (names, track_infos),
            room_events,
        ));
        Ok((
            Self {
                signal,
                subscriber,
                publisher,
                waiting,
                data,
                next_stream: AtomicU64::new(1),
                leaving,
                identity: participant.identity,
                participant_sid: participant.sid,
                room_name,
            },
            room_rx,
        ))
    }

    /// Publishes the agent's microphone track; audio sent to the returned publisher (at
    /// `input_rate`) is what the room hears.
    pub async fn publish_audio(&self, input_rate: u32) -> Result<AudioPublisher> {
        let cid = format!("sublet-agent-audio-{}", self.participant_sid);
        let output = self.publisher.add_audio_track("sublet-agent", &cid).await?;
        let (published_tx, published) = oneshot::channel();
        lock(&self.waiting.published).insert(cid.clone(), published_tx);
        self.signal
            .send(Request::AddTrack(proto::AddTrackRequest {
                cid: cid.clone(),
                name: "agent".into(),
                r#type: proto::TrackType::Audio as i32,
                source: proto::TrackSource::Microphone as i32,
                ..Default::default()
            }))
            .await;
        tokio::time::timeout(REPLY_TIMEOUT, published)
            .await
            .context("the server did not confirm the agent's track in 10 s")?
            .context("the room connection ended")?;
        let offer = self.publisher.offer().await?;
        let (answer_tx, answer) = oneshot::channel();
        *lock(&self.waiting.answer) = Some(answer_tx);
        self.signal
            .send(Request::Offer(proto::SessionDescription {
                r#type: "offer".into(),
                sdp: offer,
                ..Default::default()
            }))
            .await;
        let answer = tokio::time::timeout(REPLY_TIMEOUT, answer)
            .await
            .context("the server did not answer the agent's offer in 10 s")?
            .context("the room connection ended")?;
        self.publisher.accept_answer(answer).await?;
        AudioPublisher::new(output, input_rate)
    }

    /// Sets the agent's own participant attributes (LiveKit's `lk.agent.state` among them).
    pub async fn set_attributes(&self, attributes: &[(&str, &str)]) {
        let attributes: HashMap<String, String> = attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        lock(&self.waiting.attributes).extend(attributes.clone());
        send_attributes(&self.signal, attributes).await;
    }

    /// Sends `text` as one text stream on `topic` (LiveKit's data streams: header, chunk,
    /// trailer on the reliable channel), from the agent or on behalf of `sender`.
    pub async fn send_text(
        &self,
        topic: &str,
        text: &str,
        attributes: &[(&str, &str)],
        sender: Option<&str>,
    ) -> Result<()> {
        let stream_id = format!(
            "ST_{}_{}",
            self.participant_sid,
            self.next_stream.fetch_add(1, Ordering::Relaxed)
        );
        let attributes: HashMap<String, String> = attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let header = proto::data_stream::Header {
            stream_id: stream_id.clone(),
            timestamp: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            topic: topic.into(),
            mime_type: "text/plain".into(),
            total_length: Some(text.len() as u64),
            attributes: attributes.clone(),
            content_header: Some(proto::data_stream::header::ContentHeader::TextHeader(
                proto::data_stream::TextHeader::default(),
            )),
            ..Default::default()
        };
        let chunk = proto::data_stream::Chunk {
            stream_id: stream_id.clone(),
            chunk_index: 0,
            content: text.as_bytes().to_vec(),
            ..Default::default()
        };
        let trailer = proto::data_stream::Trailer {
            stream_id,
            attributes,
            ..Default::default()
        };
        use proto::data_packet::Value;
        for value in [
            Value::StreamHeader(header),
            Value::StreamChunk(chunk),
            Value::StreamTrailer(trailer),
        ] {
            let packet = proto::DataPacket {
                participant_identity: sender.unwrap_or(&self.identity).to_owned(),
                value: Some(value),
                ..Default::default()
            };
            self.data
                .send(bytes::BytesMut::from(&packet.encode_to_vec()[..]))
                .await
                .context("sending on the reliable data channel")?;
        }
        Ok(())
    }

    /// Leaves the room.
    pub async fn leave(&self) {
        self.leaving.store(true, Ordering::Relaxed);
        self.signal
            .send(Request::Leave(proto::LeaveRequest {
                can_reconnect: false,
                reason: proto::DisconnectReason::ClientInitiated as i32,
                ..Default::default()
            }))
            .await;
        self.signal.close().await;
        self.subscriber.close().await;
        self.publisher.close().await;
    }
}

/// The peer connections and waiting replies the signal loop serves.
struct Peers {
    subscriber: Arc<Peer>,
    publisher: Arc<Peer>,
    waiting: Arc<Waiting>,
    leaving: Arc<AtomicBool>,
}

/// The signal loop: the server's offers for the subscriber connection, its candidates, who
/// joins and leaves, and each track that arrives.
async fn run(
    signal: Arc<SignalClient>,
    peers: Peers,
    mut events: livekit_signaling::SignalEvents,
    mut tracks: mpsc::UnboundedReceiver<Arc<dyn TrackRemote>>,
    (names, track_infos): (Names, TrackInfos),
    room_events: mpsc::UnboundedSender<RoomEvent>,
) {
    let hearing = Arc::new(Mutex::new(Hearing::default()));
    let reason = loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(SignalEvent::Message(message)) => {
                    if let Err(e) = handle(&signal, &peers, *message, (&names, &track_infos), &room_events).await {
                        break format!("{e:#}");
                    }
                }
                Some(SignalEvent::Close(_)) if peers.leaving.load(Ordering::Relaxed) => {
                    break "the agent left".into()
                }
                Some(SignalEvent::Close(dropped)) => {
                    let started = std::time::Instant::now();
                    match resume(&signal, &peers).await {
                        Ok(attempts) => {
                            let _ = room_events.send(RoomEvent::Resumed {
                                dropped: dropped.into_owned(),
                                attempts,
                                after: started.elapsed(),
                            });
                        }
                        Err(e) => {
                            break format!(
                                "the signal connection to the LiveKit server dropped ({dropped}) and could not be resumed: {e:#}"
                            )
                        }
                    }
                }
                None => break "the signal connection ended".into(),
            },
            track = tracks.recv() => {
                if let Some(track) = track {
                    let stream = track.stream_id().await;
                    let sid = stream.split('|').next().unwrap_or_default().to_owned();
                    let identity = lock(&names).get(&sid).cloned().unwrap_or(sid);
                    let track_id = track.track_id().await;
                    let audio = track.kind().await == RtpCodecKind::Audio;
                    let info = lock(&track_infos).get(&track_id).cloned();
                    let arriving = ArrivingTrack { identity: &identity, audio, info: info.as_ref() };
                    let admitted = lock(&hearing).admit(arriving);
                    match admitted {
                        Ok(()) => {
                            tokio::spawn(decode(track, identity, hearing.clone(), room_events.clone()));
                        }
                        Err(reason) => {
                            let _ = room_events.send(RoomEvent::TrackIgnored { identity, reason });
                        }
                    }
                }
            }
        }
    };
    let _ = room_events.send(RoomEvent::Disconnected { reason });
}

async fn handle(
    signal: &SignalClient,
    peers: &Peers,
    message: Reply,
    (names, track_infos): (&Names, &TrackInfos),
    room_events: &mpsc::UnboundedSender<RoomEvent>,
) -> Result<()> {
    match message {
        Reply::Offer(offer) => {
            let answer = peers.subscriber.answer(offer.sdp).await?;
            signal
                .send(Request::Answer(proto::SessionDescription {
                    r#type: "answer".into(),
                    sdp: answer,
                    ..Default::default()
                }))
                .await;
        }
        Reply::Trickle(trickle) => {
            let peer = if trickle.target == proto::SignalTarget::Subscriber as i32 {
                &peers.subscriber
            } else {
                &peers.publisher
            };
            peer.add_candidate(&trickle.candidate_init).await?;
        }
        Reply::Answer(answer) => {
            if let Some(waiting) = lock(&peers.waiting.answer).take() {
                let _ = waiting.send(answer.sdp);
            }
        }
        Reply::TrackPublished(published) => {
            lock(&peers.waiting.tracks).push(published.clone());
            if let Some(waiting) = lock(&peers.waiting.published).remove(&published.cid) {
                let _ = waiting.send(published.track.unwrap_or_default());
            }
        }
        Reply::Update(update) => {
            remember_tracks(track_infos, &update.participants);
            for event in participants::on_update(&mut lock(names), update) {
                let _ = room_events.send(event);
            }
        }
        Reply::Leave(leave) => {
            return Err(anyhow!(
                "the server asked the agent to leave (reason {})",
                leave.reason
            ));
        }
        _ => {}
    }
    Ok(())
}

/// Keeps what the server says of the tracks `participants` publish.
fn remember_tracks(track_infos: &TrackInfos, participants: &[proto::ParticipantInfo]) {
    let mut infos = lock(track_infos);
    for track in participants.iter().flat_map(|p| &p.tracks) {
        infos.insert(track.sid.clone(), track.clone());
    }
}

async fn send_attributes(signal: &SignalClient, attributes: HashMap<String, String>) {
    signal
        .send(Request::UpdateMetadata(proto::UpdateParticipantMetadata {
            attributes,
            request_id: signal.next_request_id(),
            ..Default::default()
        }))
        .await;
}

/// Resumes the session on a new signal connection (`/rtc?reconnect=1&sid=…`), then tells
/// the server what the agent's connections carry; the peer connections themselves never
/// went down, so media needs nothing. Returns the attempts it took.
async fn resume(signal: &SignalClient, peers: &Peers) -> Result<u32> {
    let mut last_error = String::new();
    for (attempt, wait_ms) in RESUME_BACKOFF_MS.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(*wait_ms)).await;
        if peers.leaving.load(Ordering::Relaxed) {
            return Err(anyhow!("the agent left while resuming"));
        }
        match signal
            .restart(proto::ReconnectReason::RrSignalDisconnected)
            .await
        {
            Ok(_) => {
                let answer = peers.subscriber.local_description().await;
                let tracks = lock(&peers.waiting.tracks).clone();
                signal
                    .send(Request::SyncState(proto::SyncState {
                        answer: answer.map(|sdp| proto::SessionDescription {
                            r#type: "answer".into(),
                            sdp,
                            ..Default::default()
                        }),
                        publish_tracks: tracks,
                        data_channels: vec![proto::DataChannelInfo {
                            label: "_reliable".into(),
                            target: proto::SignalTarget::Publisher as i32,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }))
                    .await;
                // Sends held while the connection was down go now.
                signal.set_reconnected().await;
                let attributes = lock(&peers.waiting.attributes).clone();
                if !attributes.is_empty() {
                    send_attributes(signal, attributes).await;
                }
                return Ok(attempt as u32 + 1);
            }
            Err(SignalError::LeaveRequest { reason, action }) => {
                return Err(anyhow!(
                    "the server refused to resume the session (reason {reason:?}, action {action:?})"
                ));
            }
            Err(e @ SignalError::Client(..)) => {
                return Err(anyhow!("the server refused the agent's token: {e}"));
            }
            Err(e) => last_error = e.to_string(),
        }
    }
    let total_s = RESUME_BACKOFF_MS.iter().sum::<u64>() as f64 / 1000.0;
    Err(anyhow!(
        "{} attempts over {total_s:.0} s failed; the last: {last_error}",
        RESUME_BACKOFF_MS.len()
    ))
}

/// Decodes one remote audio track to 16 kHz pieces until it ends, no faster than real
/// time; a track whose packets turn out not to be Opus is ignored from its first packet.
async fn decode(
    track: Arc<dyn TrackRemote>,
    identity: String,
    hearing: Arc<Mutex<Hearing>>,
    room_events: mpsc::UnboundedSender<RoomEvent>,
) {
    decode_until_ended(&*track, &identity, &room_events).await;
    lock(&hearing).ended(&identity);
}

async fn decode_until_ended(
    track: &dyn TrackRemote,
    identity: &str,
    room_events: &mpsc::UnboundedSender<RoomEvent>,
) {
    let Ok(mut decoder) = opus::Decoder::new(OPUS_RATE, opus::Channels::Mono) else {
        return;
    };
    let mut resampler = StreamResampler::new(OPUS_RATE, PIPELINE_RATE);
    let mut pace = Pace::new(OPUS_RATE, PACE_BURST);
    let mut codec_checked = false;
    let mut dropped = 0u64;
    // The longest Opus packet: 120 ms at 48 kHz.
    let mut pcm = vec![0f32; 5760];
    while let Some(event) = track.poll().await {
        let TrackRemoteEvent::OnRtpPacket(packet) = event else {
            continue;
        };
        if !codec_checked {
            codec_checked = true;
            let mime = track.codec(packet.header.ssrc).await.map(|c| c.mime_type);
            if let Some(mime) = mime.filter(|m| !hearing::is_opus(m)) {
                let reason = TrackIgnored::NotOpus(mime);
                let identity = identity.to_owned();
                let _ = room_events.send(RoomEvent::TrackIgnored { identity, reason });
                return;
            }
        }
        if packet.payload.is_empty() {
            continue;
        }
        let samples = opus::packet::get_nb_samples(&packet.payload, OPUS_RATE).unwrap_or(0);
        if !pace.take(std::time::Instant::now(), samples) {
            dropped += 1;
            if dropped == 1 {
                tracing::warn!(
                    "room: {identity} sends audio faster than real time; the excess is dropped"
                );
            }
            continue;
        }
        let Ok(n) = decoder.decode_float(&packet.payload, &mut pcm, false) else {
            continue;
        };
        let samples = resampler.push(&pcm[..n]);
        if !samples.is_empty()
            && room_events
                .send(RoomEvent::Audio {
                    identity: identity.to_owned(),
                    samples,
                })
                .is_err()
        {
            return;
        }
    }
}
