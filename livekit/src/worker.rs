//! The agent as a LiveKit agent worker: registered at `<url>/agent`, it is offered jobs (a
//! room each), takes them while it has room, answers each call on its own thread against
//! the one shared engine, reports its load, and drains on request: it declines new jobs,
//! lets every call finish the turn in progress, then leaves.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use livekit_net::WsConnection;
use livekit_protocol as proto;
use prost::Message as _;
use proto::server_message::Message as FromServer;
use proto::worker_message::Message as ToServer;
use tokio::sync::{mpsc, watch};

use super::{LiveKitCredentials, RoomCall, WorkerEnd};
use sublet_agent::CallObserver;
use sublet_agent::VoiceAgent;

use crate::LiveKitAgent;

/// How often the worker tells the server its load (LiveKit's own workers: every 2.5 s).
const STATUS_INTERVAL: Duration = Duration::from_millis(2500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The participant attribute that names the agent in its rooms.
const AGENT_NAME_ATTRIBUTE: &str = "lk.agent.name";

/// How the worker registers and how much it takes on.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Take only jobs dispatched to this name; empty: every new room (automatic dispatch).
    pub agent_name: String,
    /// The most calls at once; offers beyond it are declined.
    pub max_calls: usize,
}

/// One job the worker ran.
#[derive(Debug)]
pub struct JobReport {
    pub job_id: String,
    pub room: String,
    /// The call, or why it failed.
    pub call: Result<RoomCall, String>,
}

/// What a worker did, once it stopped.
#[derive(Debug)]
pub struct WorkerReport {
    pub worker_id: String,
    pub jobs: Vec<JobReport>,
    /// Offers declined because the worker was full or draining.
    pub declined: usize,
    /// Why the worker stopped.
    pub ended: WorkerEnd,
}

/// A job the server assigned, for a call thread to answer.
struct Assigned {
    job_id: String,
    room: String,
    url: String,
    token: String,
    hang_up: watch::Receiver<bool>,
}

/// A call thread's end: the job, and its error if it failed.
type JobDone = (String, Option<String>);

/// [`crate::LiveKitAgent::work`].
pub(crate) fn work(
    agent: &VoiceAgent,
    runtime: &tokio::runtime::Handle,
    credentials: &LiveKitCredentials,
    options: &WorkerOptions,
    drain: watch::Receiver<bool>,
    observer: &(dyn Fn(&str) -> Box<dyn CallObserver> + Sync),
) -> Result<WorkerReport> {
    let (connection, worker_id) = runtime.block_on(register(credentials, options))?;
    let (assigned_tx, assigned) = std::sync::mpsc::channel::<Assigned>();
    let (done_tx, done) = mpsc::unbounded_channel::<JobDone>();
    let session = runtime.spawn(serve(
        connection,
        credentials.url.clone(),
        options.clone(),
        drain,
        assigned_tx,
        done,
    ));
    let jobs = std::thread::scope(|scope| {
        let calls: Vec<_> = assigned
            .into_iter()
            .map(|job| {
                let done_tx = done_tx.clone();
                scope.spawn(move || {
                    let mut call_observer = observer(&job.room);
                    let call = agent
                        .answer_room_until(
                            runtime,
                            &job.url,
                            &job.token,
                            &mut *call_observer,
                            job.hang_up,
                        )
                        .map_err(|e| format!("{e:#}"));
                    let _ = done_tx.send((job.job_id.clone(), call.as_ref().err().cloned()));
                    JobReport {
                        job_id: job.job_id,
                        room: job.room,
                        call,
                    }
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|call| call.join().map_err(|_| anyhow!("a call thread panicked")))
            .collect::<Result<Vec<_>>>()
    })?;
    let (declined, ended) = runtime
        .block_on(session)
        .map_err(|e| anyhow!("the worker's connection task failed: {e}"))?;
    Ok(WorkerReport {
        worker_id,
        jobs,
        declined,
        ended,
    })
}

/// Connects to `<url>/agent` and registers; returns the connection and the worker's id.
async fn register(
    credentials: &LiveKitCredentials,
    options: &WorkerOptions,
) -> Result<(Arc<dyn WsConnection>, String)> {
    let url = credentials.worker_url();
    let client = livekit_net::ws_client().context("no WebSocket transport")?;
    let headers = vec![livekit_net::Header {
        name: "Authorization".into(),
        value: format!("Bearer {}", credentials.worker_token()?),
    }];
    let connection = client
        .connect(url.clone(), headers, CONNECT_TIMEOUT.as_millis() as u64)
        .await
        .map_err(|e| anyhow!("could not register as a worker at {url}: {e}"))?
        .connection;
    send(
        &*connection,
        ToServer::Register(proto::RegisterWorkerRequest {
            r#type: proto::JobType::JtRoom as i32,
            agent_name: options.agent_name.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            allowed_permissions: Some(proto::ParticipantPermission {
                can_subscribe: true,
                can_publish: true,
                can_publish_data: true,
                can_update_metadata: true,
                ..Default::default()
            }),
            ..Default::default()
        }),
    )
    .await?;
    let first = tokio::time::timeout(CONNECT_TIMEOUT, receive(&*connection))
        .await
        .with_context(|| format!("{url} did not answer the worker's registration in 10 s"))??;
    match first {
        Some(FromServer::Register(registered)) => Ok((connection, registered.worker_id)),
        Some(other) => bail!("{url} answered the registration with {other:?}"),
        None => bail!("{url} closed the connection instead of registering the worker"),
    }
}

async fn send(connection: &dyn WsConnection, message: ToServer) -> Result<()> {
    let frame = proto::WorkerMessage {
        message: Some(message),
    };
    connection
        .send(frame.encode_to_vec())
        .await
        .map_err(|e| anyhow!("the worker connection: {e}"))
}

/// The server's next message; `None` once it closed the connection.
async fn receive(connection: &dyn WsConnection) -> Result<Option<FromServer>> {
    loop {
        let frame = connection
            .recv()
            .await
            .map_err(|e| anyhow!("the worker connection: {e}"))?;
        let Some(frame) = frame else {
            return Ok(None);
        };
        let message = proto::ServerMessage::decode(&frame[..])
            .context("a worker message that is not LiveKit protobuf")?;
        if let Some(message) = message.message {
            return Ok(Some(message));
        }
    }
}

/// The worker's side of the connection: offers, assignments, terminations, its status,
/// and draining. Returns the offers it declined and why it stopped.
async fn serve(
    connection: Arc<dyn WsConnection>,
    default_url: String,
    options: WorkerOptions,
    mut drain: watch::Receiver<bool>,
    assigned: std::sync::mpsc::Sender<Assigned>,
    mut done: mpsc::UnboundedReceiver<JobDone>,
) -> (usize, WorkerEnd) {
    let mut worker = WorkerState {
        options,
        hang_ups: HashMap::new(),
        accepted: 0,
        draining: false,
        seq: 0,
        declined: 0,
    };
    let mut status = tokio::time::interval(STATUS_INTERVAL);
    let ended = loop {
        tokio::select! {
            message = receive(&*connection) => match message {
                Ok(Some(message)) => {
                    let reply = worker.handle(message, &default_url, &assigned);
                    for message in reply {
                        if send(&*connection, message).await.is_err() {
                            break;
                        }
                    }
                }
                Ok(None) => break WorkerEnd::ServerClosed,
                Err(e) => break WorkerEnd::Failed(format!("{e:#}")),
            },
            Some((job_id, error)) = done.recv() => {
                worker.hang_ups.remove(&job_id);
                let status = if error.is_some() { proto::JobStatus::JsFailed } else { proto::JobStatus::JsSuccess };
                let _ = send(&*connection, job_update(&job_id, status, error.unwrap_or_default())).await;
                let _ = send(&*connection, worker.status()).await;
                if worker.draining && worker.hang_ups.is_empty() {
                    break WorkerEnd::Drained { calls_were_running: true };
                }
            }
            Ok(()) = drain.changed(), if !worker.draining => {
                if *drain.borrow() {
                    worker.draining = true;
                    for hang_up in worker.hang_ups.values() {
                        let _ = hang_up.send(true);
                    }
                    let _ = send(&*connection, worker.status()).await;
                    if worker.hang_ups.is_empty() {
                        break WorkerEnd::Drained { calls_were_running: false };
                    }
                }
            }
            _ = status.tick() => {
                let _ = send(&*connection, worker.status()).await;
            }
        }
    };
    connection.close().await;
    (worker.declined, ended)
}

struct WorkerState {
    options: WorkerOptions,
    /// Each running call's hang-up switch, by job id.
    hang_ups: HashMap<String, watch::Sender<bool>>,
    /// Offers accepted and not yet assigned: they count toward the load.
    accepted: usize,
    draining: bool,
    seq: u64,
    declined: usize,
}

impl WorkerState {
    fn calls(&self) -> usize {
        self.hang_ups.len() + self.accepted
    }

    /// What the worker answers to one server message.
    fn handle(
        &mut self,
        message: FromServer,
        default_url: &str,
        assigned: &std::sync::mpsc::Sender<Assigned>,
    ) -> Vec<ToServer> {
        match message {
            FromServer::Availability(request) => {
                let job = request.job.unwrap_or_default();
                let available = !self.draining && self.calls() < self.options.max_calls;
                if available {
                    self.accepted += 1;
                } else {
                    self.declined += 1;
                }
                let mut attributes = HashMap::new();
                attributes.insert(
                    AGENT_NAME_ATTRIBUTE.to_owned(),
                    self.options.agent_name.clone(),
                );
                vec![ToServer::Availability(proto::AvailabilityResponse {
                    job_id: job.id.clone(),
                    available,
                    participant_identity: format!("agent-{}", job.id),
                    participant_name: "Sublet".into(),
                    participant_attributes: attributes,
                    ..Default::default()
                })]
            }
            FromServer::Assignment(assignment) => {
                let job = assignment.job.unwrap_or_default();
                self.accepted = self.accepted.saturating_sub(1);
                let (hang_up_tx, hang_up) = watch::channel(self.draining);
                self.hang_ups.insert(job.id.clone(), hang_up_tx);
                let _ = assigned.send(Assigned {
                    job_id: job.id.clone(),
                    room: job.room.map(|r| r.name).unwrap_or_default(),
                    url: assignment.url.unwrap_or_else(|| default_url.to_owned()),
                    token: assignment.token,
                    hang_up,
                });
                vec![
                    job_update(&job.id, proto::JobStatus::JsRunning, String::new()),
                    self.status(),
                ]
            }
            FromServer::Termination(termination) => {
                if let Some(hang_up) = self.hang_ups.get(&termination.job_id) {
                    let _ = hang_up.send(true);
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The worker's status: full while draining or at its limit; load as a share of it.
    fn status(&mut self) -> ToServer {
        self.seq += 1;
        let full = self.draining || self.calls() >= self.options.max_calls;
        let status = if full {
            proto::WorkerStatus::WsFull
        } else {
            proto::WorkerStatus::WsAvailable
        };
        ToServer::UpdateWorker(proto::UpdateWorkerStatus {
            status: Some(status as i32),
            load: self.calls() as f32 / self.options.max_calls.max(1) as f32,
            job_count: self.hang_ups.len() as u32,
            draining: self.draining,
            seq: self.seq,
        })
    }
}

fn job_update(job_id: &str, status: proto::JobStatus, error: String) -> ToServer {
    ToServer::UpdateJob(proto::UpdateJobStatus {
        job_id: job_id.to_owned(),
        status: status as i32,
        error,
    })
}
