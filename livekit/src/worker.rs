//! The agent as a LiveKit agent worker: registered at `<url>/agent`, it is offered jobs (a
//! room each), takes them while it has room, answers each call on its own thread against
//! the one shared engine, reports its load, and drains on request: it declines new jobs,
//! lets every call finish the turn in progress, then leaves.

mod jobs;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use livekit_net::WsConnection;
use livekit_protocol as proto;
use prost::Message as _;
use proto::server_message::Message as FromServer;
use proto::worker_message::Message as ToServer;
use tokio::sync::{mpsc, watch};

use super::{CallOptions, LiveKitCredentials, RoomCall, WorkerEnd};
use sublet_agent::CallObserver;
use sublet_agent::VoiceAgent;

use crate::call::panic_message;
use crate::LiveKitAgent;
use jobs::{Jobs, OFFER_TIMEOUT};

/// How often the worker tells the server its load (LiveKit's own workers: every 2.5 s).
const STATUS_INTERVAL: Duration = Duration::from_millis(2500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The waits before each attempt to register again after the connection dropped (about
/// two minutes in all); the calls in progress go on meanwhile.
const REREGISTER_BACKOFF: [Duration; 8] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(30),
];
/// The participant attribute that names the agent in its rooms.
const AGENT_NAME_ATTRIBUTE: &str = "lk.agent.name";

/// How the worker registers and how much it takes on.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Take only jobs dispatched to this name; empty: every new room (automatic dispatch).
    pub agent_name: String,
    /// The most calls at once; offers beyond it are declined.
    pub max_calls: usize,
    /// How each call treats silence, stopped audio and a drain.
    pub call: CallOptions,
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
    /// The ids it registered as again, each time its connection had dropped.
    pub registered_again: Vec<String>,
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
        credentials.clone(),
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
                    // A call that panics is that call's failure: reported, its slot freed,
                    // the other calls and the worker going on.
                    let call = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        let mut call_observer = observer(&job.room);
                        agent.answer_room_until(
                            runtime,
                            &job.url,
                            &job.token,
                            &options.call,
                            &mut *call_observer,
                            job.hang_up,
                        )
                    }))
                    .unwrap_or_else(|panic| {
                        Err(anyhow!("the call panicked: {}", panic_message(&*panic)))
                    })
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
    let session = runtime
        .block_on(session)
        .map_err(|e| anyhow!("the worker's connection task failed: {e}"))?;
    Ok(WorkerReport {
        worker_id,
        registered_again: session.registered_again,
        jobs,
        declined: session.declined,
        ended: session.ended,
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

/// How the worker's session ended.
struct Session {
    declined: usize,
    ended: WorkerEnd,
    registered_again: Vec<String>,
}

/// The worker's side of the connection: offers, assignments, terminations, its status,
/// and draining; when the connection drops, it registers again (with the calls going on)
/// unless it is draining.
async fn serve(
    mut connection: Arc<dyn WsConnection>,
    credentials: LiveKitCredentials,
    options: WorkerOptions,
    mut drain: watch::Receiver<bool>,
    assigned: std::sync::mpsc::Sender<Assigned>,
    mut done: mpsc::UnboundedReceiver<JobDone>,
) -> Session {
    let mut worker = WorkerState {
        jobs: Jobs::new(options.max_calls, OFFER_TIMEOUT),
        options,
        hang_ups: HashMap::new(),
        seq: 0,
    };
    let mut registered_again = Vec::new();
    let mut status = tokio::time::interval(STATUS_INTERVAL);
    let ended = 'session: loop {
        let lost = loop {
            tokio::select! {
                message = receive(&*connection) => match message {
                    Ok(Some(message)) => {
                        let reply = worker.handle(message, &credentials.url, &assigned);
                        for message in reply {
                            if send(&*connection, message).await.is_err() {
                                break;
                            }
                        }
                    }
                    Ok(None) => break "the server closed the worker connection".to_owned(),
                    Err(e) => break format!("{e:#}"),
                },
                Some((job_id, error)) = done.recv() => {
                    let end = worker.job_done(&job_id);
                    let status = if error.is_some() { proto::JobStatus::JsFailed } else { proto::JobStatus::JsSuccess };
                    let _ = send(&*connection, job_update(&job_id, status, error.unwrap_or_default())).await;
                    let _ = send(&*connection, worker.status()).await;
                    if let Some(end) = end {
                        break 'session end;
                    }
                }
                Ok(()) = drain.changed(), if !worker.jobs.draining() => {
                    if *drain.borrow() {
                        let end = worker.start_draining();
                        let _ = send(&*connection, worker.status()).await;
                        if let Some(end) = end {
                            break 'session end;
                        }
                    }
                }
                _ = status.tick() => {
                    let _ = send(&*connection, worker.status()).await;
                }
            }
        };
        connection.close().await;
        tracing::warn!(
            "worker: the connection dropped ({lost}); {}",
            match worker.jobs.draining() {
                true => "draining, waiting for the calls to end",
                false => "registering again",
            }
        );
        // Draining, the calls only have to end; otherwise register again, the calls going
        // on meanwhile.
        let mut attempts = 0;
        let mut last_error = lost.clone();
        loop {
            let wait = match (worker.jobs.draining(), REREGISTER_BACKOFF.get(attempts)) {
                (true, _) => Duration::MAX,
                (false, Some(wait)) => *wait,
                (false, None) => {
                    break 'session WorkerEnd::Failed(format!(
                        "the worker connection dropped ({lost}) and {attempts} attempts to \
                         register again failed; the last: {last_error}"
                    ));
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // Ended while unregistered: once registered again, the server hears of
                // the calls still running.
                Some((job_id, _)) = done.recv() => {
                    if let Some(end) = worker.job_done(&job_id) {
                        break 'session end;
                    }
                    continue;
                }
                Ok(()) = drain.changed(), if !worker.jobs.draining() => {
                    if *drain.borrow() {
                        if let Some(end) = worker.start_draining() {
                            break 'session end;
                        }
                    }
                    continue;
                }
            }
            attempts += 1;
            match register(&credentials, &worker.options).await {
                Ok((again, worker_id)) => {
                    connection = again;
                    registered_again.push(worker_id);
                    // The server learns the calls still running, and the load.
                    for job_id in worker.hang_ups.keys() {
                        let running =
                            job_update(job_id, proto::JobStatus::JsRunning, String::new());
                        let _ = send(&*connection, running).await;
                    }
                    let _ = send(&*connection, worker.status()).await;
                    continue 'session;
                }
                Err(e) => last_error = format!("{e:#}"),
            }
        }
    };
    connection.close().await;
    Session {
        declined: worker.jobs.declined(),
        ended,
        registered_again,
    }
}

struct WorkerState {
    options: WorkerOptions,
    jobs: Jobs,
    /// Each running call's hang-up switch, by job id.
    hang_ups: HashMap<String, watch::Sender<bool>>,
    seq: u64,
}

impl WorkerState {
    /// What the worker answers to one server message.
    fn handle(
        &mut self,
        message: FromServer,
        default_url: &str,
        assigned: &std::sync::mpsc::Sender<Assigned>,
    ) -> Vec<ToServer> {
        let now = Instant::now();
        match message {
            FromServer::Availability(request) => {
                let job = request.job.unwrap_or_default();
                let available = self.jobs.offer(&job.id, now);
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
                if let Err(refusal) = self.jobs.assign(&job.id, now) {
                    tracing::warn!(job = %job.id, "worker: assignment refused: {}", refusal.reason());
                    return vec![job_update(
                        &job.id,
                        proto::JobStatus::JsFailed,
                        refusal.reason().into(),
                    )];
                }
                let (hang_up_tx, hang_up) = watch::channel(false);
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

    /// A call ended; the session's end if that was the last call of a drain.
    fn job_done(&mut self, job_id: &str) -> Option<WorkerEnd> {
        self.hang_ups.remove(job_id);
        self.jobs.ended(job_id);
        self.jobs.drained().then_some(WorkerEnd::Drained {
            calls_were_running: true,
        })
    }

    /// Declines new work and asks every call to hang up after its turn in progress; the
    /// session's end if no call was running.
    fn start_draining(&mut self) -> Option<WorkerEnd> {
        let calls_were_running = self.jobs.running() > 0;
        self.jobs.drain();
        for hang_up in self.hang_ups.values() {
            let _ = hang_up.send(true);
        }
        self.jobs
            .drained()
            .then_some(WorkerEnd::Drained { calls_were_running })
    }

    /// The worker's status: full while draining or at its limit; load as a share of it.
    fn status(&mut self) -> ToServer {
        self.seq += 1;
        let now = Instant::now();
        let status = if self.jobs.full(now) {
            proto::WorkerStatus::WsFull
        } else {
            proto::WorkerStatus::WsAvailable
        };
        ToServer::UpdateWorker(proto::UpdateWorkerStatus {
            status: Some(status as i32),
            load: self.jobs.load(now) as f32 / self.options.max_calls.max(1) as f32,
            job_count: self.jobs.running() as u32,
            draining: self.jobs.draining(),
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
