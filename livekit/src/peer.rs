//! One WebRTC peer connection (webrtc-rs), as both sides of LiveKit's protocol use it: the
//! agent's subscriber connection and the test server's. Its offers and answers carry every
//! candidate already gathered (host candidates on the media address), so it never
//! trickles its own; it takes the other side's trickled candidates, early ones included.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rtc::interceptor::Registry;
use rtc::media_stream::MediaStreamTrack;
use rtc::peer_connection::configuration::interceptor_registry::register_default_interceptors;
use rtc::peer_connection::configuration::media_engine::{
    MediaEngine, MIME_TYPE_OPUS, MIME_TYPE_VP8,
};
use rtc::peer_connection::configuration::RTCConfigurationBuilder;
use rtc::peer_connection::sdp::RTCSessionDescription;
use rtc::peer_connection::transport::RTCIceCandidateInit;
use rtc::rtp_transceiver::rtp_sender::{
    RTCRtpCodec, RTCRtpCodecParameters, RTCRtpCodingParameters, RTCRtpEncodingParameters,
    RtpCodecKind,
};
use tokio::sync::{mpsc, watch};
use webrtc::data_channel::DataChannel;
use webrtc::media_stream::track_local::static_rtp::TrackLocalStaticRTP;
use webrtc::media_stream::track_local::TrackLocal;
use webrtc::media_stream::track_remote::TrackRemote;
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCIceGatheringState,
};

/// The machine's address towards its default route: LiveKit's clients ignore loopback
/// candidates, so media must use a real interface.
pub fn media_ip() -> IpAddr {
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

struct Handler {
    gathered: watch::Sender<bool>,
    remote_tracks: Option<mpsc::UnboundedSender<Arc<dyn TrackRemote>>>,
    remote_data: Option<mpsc::UnboundedSender<Arc<dyn DataChannel>>>,
}

/// Peer connections whose event handler is still alive: webrtc-rs frees a connection's
/// handler with the connection, so this counts the connections not yet freed (the soak
/// samples it, to tell a leak of connections from other growth).
static LIVE_HANDLERS: AtomicUsize = AtomicUsize::new(0);

/// Peer connections made in this process and not yet freed.
pub fn live_peer_connections() -> usize {
    LIVE_HANDLERS.load(Ordering::Relaxed)
}

impl Handler {
    fn new(
        gathered: watch::Sender<bool>,
        remote_tracks: Option<mpsc::UnboundedSender<Arc<dyn TrackRemote>>>,
        remote_data: Option<mpsc::UnboundedSender<Arc<dyn DataChannel>>>,
    ) -> Self {
        LIVE_HANDLERS.fetch_add(1, Ordering::Relaxed);
        Self {
            gathered,
            remote_tracks,
            remote_data,
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        LIVE_HANDLERS.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Handler {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        let _ = self.gathered.send(state == RTCIceGatheringState::Complete);
    }

    async fn on_track(&self, track: Arc<dyn TrackRemote>) {
        if let Some(tracks) = &self.remote_tracks {
            let _ = tracks.send(track);
        }
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        if let Some(channels) = &self.remote_data {
            let _ = channels.send(channel);
        }
    }
}

/// A track the server sends to one subscriber; forwarded packets take its SSRC.
pub struct OutputTrack {
    track: Arc<TrackLocalStaticRTP>,
    ssrc: u32,
}

impl OutputTrack {
    pub async fn write(&self, mut packet: rtc::rtp::Packet) -> Result<()> {
        packet.header.ssrc = self.ssrc;
        // The publisher's header extensions were negotiated on its own connection.
        packet.header.extension = false;
        packet.header.extensions.clear();
        packet.header.extension_profile = 0;
        self.track.write_rtp(packet).await?;
        Ok(())
    }
}

pub struct Peer {
    connection: Box<dyn PeerConnection>,
    gathered: watch::Receiver<bool>,
    /// Candidates trickled before the offer they belong to (clients send them early).
    early_candidates: tokio::sync::Mutex<Option<Vec<RTCIceCandidateInit>>>,
}

fn opus() -> RTCRtpCodec {
    RTCRtpCodec {
        mime_type: MIME_TYPE_OPUS.to_owned(),
        clock_rate: 48000,
        channels: 2,
        sdp_fmtp_line: "minptime=10;useinbandfec=1".to_owned(),
        rtcp_feedback: vec![],
    }
}

fn vp8() -> RTCRtpCodec {
    RTCRtpCodec {
        mime_type: MIME_TYPE_VP8.to_owned(),
        clock_rate: 90000,
        channels: 0,
        sdp_fmtp_line: String::new(),
        rtcp_feedback: vec![],
    }
}

fn codecs() -> Result<MediaEngine> {
    let mut media = MediaEngine::default();
    let opus = RTCRtpCodecParameters {
        rtp_codec: opus(),
        payload_type: 111,
    };
    let vp8 = RTCRtpCodecParameters {
        rtp_codec: vp8(),
        payload_type: 96,
    };
    media.register_codec(opus, RtpCodecKind::Audio)?;
    media.register_codec(vp8, RtpCodecKind::Video)?;
    Ok(media)
}

impl Peer {
    /// A peer connection gathering on `ip`; tracks and data channels the other side opens
    /// on it go to `remote_tracks` and `remote_data`.
    pub async fn new(
        ip: IpAddr,
        remote_tracks: Option<mpsc::UnboundedSender<Arc<dyn TrackRemote>>>,
        remote_data: Option<mpsc::UnboundedSender<Arc<dyn DataChannel>>>,
    ) -> Result<Self> {
        let mut media = codecs()?;
        let registry = register_default_interceptors(Registry::new(), &mut media)?;
        let (gathered_tx, gathered) = watch::channel(false);
        let connection = PeerConnectionBuilder::new()
            .with_configuration(RTCConfigurationBuilder::new().build())
            .with_media_engine(media)
            .with_interceptor_registry(registry)
            .with_handler(Arc::new(Handler::new(
                gathered_tx,
                remote_tracks,
                remote_data,
            )))
            .with_udp_addrs(vec![format!("{ip}:0")])
            .build()
            .await
            .context("creating a peer connection")?;
        Ok(Self {
            connection: Box::new(connection),
            gathered,
            early_candidates: tokio::sync::Mutex::new(Some(Vec::new())),
        })
    }

    /// Answers `offer`; the answer carries the gathered candidates.
    pub async fn answer(&self, offer: String) -> Result<String> {
        self.set_remote(RTCSessionDescription::offer(offer)?)
            .await?;
        let answer = self.connection.create_answer(None).await?;
        self.local_with_candidates(answer).await
    }

    /// An offer for what was added since the last one.
    pub async fn offer(&self) -> Result<String> {
        let offer = self.connection.create_offer(None).await?;
        self.local_with_candidates(offer).await
    }

    pub async fn accept_answer(&self, answer: String) -> Result<()> {
        self.set_remote(RTCSessionDescription::answer(answer)?)
            .await
    }

    /// Opens an ordered, reliable data channel (LiveKit's `_reliable`).
    pub async fn data_channel(&self, label: &str) -> Result<Arc<dyn DataChannel>> {
        Ok(self.connection.create_data_channel(label, None).await?)
    }

    /// Adds an Opus track this connection will send.
    pub async fn add_audio_track(
        &self,
        stream_id: &str,
        track_id: &str,
    ) -> Result<Arc<OutputTrack>> {
        self.add_track(stream_id, track_id, RtpCodecKind::Audio, opus())
            .await
    }

    /// Adds a VP8 track this connection will send (the test server forwards video).
    pub async fn add_video_track(
        &self,
        stream_id: &str,
        track_id: &str,
    ) -> Result<Arc<OutputTrack>> {
        self.add_track(stream_id, track_id, RtpCodecKind::Video, vp8())
            .await
    }

    async fn add_track(
        &self,
        stream_id: &str,
        track_id: &str,
        kind: RtpCodecKind,
        codec: RTCRtpCodec,
    ) -> Result<Arc<OutputTrack>> {
        static NEXT_SSRC: AtomicU32 = AtomicU32::new(0x5b1e_0001);
        let ssrc = NEXT_SSRC.fetch_add(1, Ordering::Relaxed);
        let track = Arc::new(TrackLocalStaticRTP::new(MediaStreamTrack::new(
            stream_id.to_owned(),
            track_id.to_owned(),
            track_id.to_owned(),
            kind,
            vec![RTCRtpEncodingParameters {
                rtp_coding_parameters: RTCRtpCodingParameters {
                    ssrc: Some(ssrc),
                    ..Default::default()
                },
                codec,
                ..Default::default()
            }],
        )));
        self.connection.add_track(track.clone()).await?;
        Ok(Arc::new(OutputTrack { track, ssrc }))
    }

    async fn set_remote(&self, description: RTCSessionDescription) -> Result<()> {
        self.connection
            .set_remote_description(description)
            .await
            .context("the other side's session description")?;
        if let Some(early) = self.early_candidates.lock().await.take() {
            for candidate in early {
                self.connection.add_ice_candidate(candidate).await?;
            }
        }
        Ok(())
    }

    async fn local_with_candidates(&self, description: RTCSessionDescription) -> Result<String> {
        self.connection.set_local_description(description).await?;
        let mut gathered = self.gathered.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), gathered.wait_for(|done| *done)).await;
        let local = self
            .connection
            .local_description()
            .await
            .context("no local description")?;
        Ok(local.sdp)
    }

    /// The local description now in force (an answer, for a connection the server offers).
    pub async fn local_description(&self) -> Option<String> {
        self.connection.local_description().await.map(|d| d.sdp)
    }

    /// A candidate the other side trickled, as LiveKit's JSON.
    pub async fn add_candidate(&self, json: &str) -> Result<()> {
        let candidate: RTCIceCandidateInit =
            serde_json::from_str(json).with_context(|| format!("a trickled candidate: {json}"))?;
        if let Some(early) = self.early_candidates.lock().await.as_mut() {
            early.push(candidate);
            return Ok(());
        }
        self.connection.add_ice_candidate(candidate).await?;
        Ok(())
    }

    pub async fn close(&self) {
        let _ = self.connection.close().await;
    }
}
