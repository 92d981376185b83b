//! LiveKit's agent-worker protocol, the server's side (`/agent`): workers register, the
//! server offers each job (a room) to a worker with the wanted agent name, and assigns it
//! with a token for the room when the worker takes it; workers report job and load status.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use axum::extract::ws::{Message, WebSocket};
use livekit_api::access_token::AccessToken;
use livekit_protocol as proto;
use prost::Message as _;
use proto::server_message::Message as ToWorker;
use proto::worker_message::Message as FromWorker;
use tokio::sync::{mpsc, oneshot};

use super::{now_ms, ServerState};

/// A registered worker, as the server sees it.
pub struct Worker {
    pub id: String,
    pub agent_name: String,
    outbox: mpsc::UnboundedSender<ToWorker>,
    /// Offers awaiting the worker's answer, by job id.
    offers: Mutex<HashMap<String, oneshot::Sender<proto::AvailabilityResponse>>>,
    /// Every status the worker reported, in order (kept after it leaves, for the tests).
    pub statuses: Mutex<Vec<proto::UpdateWorkerStatus>>,
    connected: AtomicBool,
    /// The test's order to drop the connection, as a failing network would.
    dropped: tokio::sync::Notify,
}

impl Worker {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Drops the worker's connection without a word.
    pub fn drop_connection(&self) {
        self.dropped.notify_one();
    }
}

/// A job the server dispatched, and what its worker last said of it.
#[derive(Debug, Clone)]
pub struct JobView {
    pub id: String,
    pub room: String,
    pub worker_id: String,
    /// `proto::JobStatus` as its worker reported it.
    pub status: proto::JobStatus,
    pub error: String,
}

/// How long a worker has to answer an offer (LiveKit's own server waits a few seconds).
const OFFER_TIMEOUT: Duration = Duration::from_secs(5);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn frame(message: ToWorker) -> Message {
    Message::Binary(
        proto::ServerMessage {
            message: Some(message),
        }
        .encode_to_vec()
        .into(),
    )
}

/// Serves one worker connection, from registration until it closes.
pub async fn serve(state: Arc<ServerState>, mut socket: WebSocket) -> Result<()> {
    let register = match next(&mut socket).await? {
        Some(FromWorker::Register(register)) => register,
        other => {
            return Err(anyhow!(
                "a worker's first message was {other:?}, not Register"
            ))
        }
    };
    let (outbox, mut outgoing) = mpsc::unbounded_channel();
    let worker = Arc::new(Worker {
        id: state.id("AW_"),
        agent_name: register.agent_name,
        outbox,
        offers: Mutex::new(HashMap::new()),
        statuses: Mutex::new(Vec::new()),
        connected: AtomicBool::new(true),
        dropped: tokio::sync::Notify::new(),
    });
    socket
        .send(frame(ToWorker::Register(proto::RegisterWorkerResponse {
            worker_id: worker.id.clone(),
            server_info: Some(proto::ServerInfo {
                version: "sublet-test-1".into(),
                protocol: 16,
                ..Default::default()
            }),
            ..Default::default()
        })))
        .await?;
    lock(&state.workers).push(worker.clone());
    let result = loop {
        tokio::select! {
            message = outgoing.recv() => match message {
                Some(message) => socket.send(frame(message)).await?,
                None => break Ok(()),
            },
            incoming = next(&mut socket) => match incoming {
                Ok(Some(message)) => handle(&state, &worker, message),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            },
            _ = worker.dropped.notified() => break Ok(()),
        }
    };
    worker.connected.store(false, Ordering::Relaxed);
    result
}

/// The worker's next message; `None` once it closed.
async fn next(socket: &mut WebSocket) -> Result<Option<FromWorker>> {
    loop {
        match socket.recv().await {
            Some(Ok(Message::Binary(data))) => {
                let message = proto::WorkerMessage::decode(data.as_ref())
                    .context("a worker message that is not LiveKit protobuf")?;
                if let Some(message) = message.message {
                    return Ok(Some(message));
                }
            }
            Some(Ok(Message::Close(_))) | None => return Ok(None),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e).context("the worker connection"),
        }
    }
}

fn handle(state: &ServerState, worker: &Worker, message: FromWorker) {
    match message {
        FromWorker::Availability(answer) => {
            if let Some(offer) = lock(&worker.offers).remove(&answer.job_id) {
                let _ = offer.send(answer);
            }
        }
        FromWorker::UpdateJob(update) => {
            if let Some(job) = lock(&state.jobs).iter_mut().find(|j| j.id == update.job_id) {
                job.status = update.status();
                job.error = update.error;
            }
        }
        FromWorker::UpdateWorker(status) => lock(&worker.statuses).push(status),
        FromWorker::Ping(ping) => {
            let _ = worker.outbox.send(ToWorker::Pong(proto::WorkerPong {
                last_timestamp: ping.timestamp,
                timestamp: now_ms(),
            }));
        }
        _ => {}
    }
}

/// Offers a job in `room` to the workers registered as `agent_name`, least loaded first,
/// and assigns it to the first that takes it; returns the job's id.
pub async fn dispatch(state: &ServerState, room: &str, agent_name: &str) -> Result<String> {
    let mut workers: Vec<Arc<Worker>> = lock(&state.workers)
        .iter()
        .filter(|w| w.agent_name == agent_name && w.connected.load(Ordering::Relaxed))
        .cloned()
        .collect();
    if workers.is_empty() {
        return Err(anyhow!("no worker is registered as {agent_name:?}"));
    }
    let load = |w: &Arc<Worker>| lock(&w.statuses).last().map_or(0.0, |s| s.load);
    workers.sort_by(|a, b| load(a).total_cmp(&load(b)));
    let job = proto::Job {
        id: state.id("AJ_"),
        dispatch_id: state.id("AD_"),
        r#type: proto::JobType::JtRoom as i32,
        room: Some(proto::Room {
            name: room.into(),
            ..Default::default()
        }),
        agent_name: agent_name.into(),
        state: Some(proto::JobState {
            status: proto::JobStatus::JsPending as i32,
            started_at: now_ms(),
            ..Default::default()
        }),
        ..Default::default()
    };
    for worker in workers {
        let (answer_tx, answer) = oneshot::channel();
        lock(&worker.offers).insert(job.id.clone(), answer_tx);
        let _ = worker
            .outbox
            .send(ToWorker::Availability(proto::AvailabilityRequest {
                job: Some(job.clone()),
                resuming: false,
            }));
        let Ok(Ok(answer)) = tokio::time::timeout(OFFER_TIMEOUT, answer).await else {
            continue;
        };
        if !answer.available {
            continue;
        }
        let token = agent_token(state, room, &job.id, &answer)?;
        lock(&state.jobs).push(JobView {
            id: job.id.clone(),
            room: room.into(),
            worker_id: worker.id.clone(),
            status: proto::JobStatus::JsPending,
            error: String::new(),
        });
        let _ = worker
            .outbox
            .send(ToWorker::Assignment(proto::JobAssignment {
                job: Some(job.clone()),
                url: None,
                token,
            }));
        return Ok(job.id);
    }
    Err(anyhow!(
        "no worker registered as {agent_name:?} took the job"
    ))
}

/// The token a worker joins the room with, as LiveKit's server makes it: the identity
/// (`agent-AJ_…` unless the worker asked for one) and attributes the worker asked for, and
/// an agent's grants.
fn agent_token(
    state: &ServerState,
    room: &str,
    job_id: &str,
    answer: &proto::AvailabilityResponse,
) -> Result<String> {
    let identity = match answer.participant_identity.as_str() {
        "" => format!("agent-{job_id}"),
        asked => asked.to_owned(),
    };
    AccessToken::with_api_key(&state.api_key, &state.api_secret)
        .with_identity(&identity)
        .with_name(&answer.participant_name)
        .with_kind("agent")
        .with_attributes(answer.participant_attributes.clone())
        .with_ttl(Duration::from_secs(3600))
        .with_grants(sublet_livekit::agent_grants(room))
        .to_jwt()
        .context("signing a job's token")
}
