//! The agent as a LiveKit agent worker: one worker process registered with the test
//! server takes two calls dispatched at once, answers both on the one shared engine,
//! reports its load, declines what it has no room for, and drains: it finishes the turns
//! in progress, refuses new jobs, hangs up and stops. The test server's side of the worker
//! protocol is checked first with a worker on LiveKit's own Agents framework.
//! A worker whose connection drops registers again, and a call that panics is reported
//! failed while the other call on the worker is answered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sublet_agent::{AgentConfig, CallObserver, Quiet, VoiceAgent};
use sublet_audio::read_wav;
use sublet_livekit::{CallEnd, CallOptions, LiveKitAgent, WorkerEnd, WorkerOptions};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tests::official_clients::{
    livekit_agents_worker, livekit_caller, recorded_question, room_token,
};
use tokio::sync::watch;

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const ROOMS: [&str; 2] = ["worker-1", "worker-2"];

/// Waits until `ready` holds, or fails after `limit` saying what was awaited.
fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_worker_on_livekits_agents_framework_takes_a_job_from_the_test_server() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let (job, (ok, events)) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| livekit_agents_worker(&server.url, KEY, SECRET, "py-agent"));
        wait_for("the worker to register", Duration::from_secs(60), || {
            !server.worker_statuses().is_empty()
        });
        let job = server
            .dispatch("official-1", "py-agent")
            .expect("the job was taken");
        // The job's participant joined with the token the assignment carried.
        wait_for(
            "the worker's agent in the room",
            Duration::from_secs(30),
            || {
                server
                    .attribute("official-1", &format!("agent-{job}"), "lk.agent.state")
                    .is_some()
            },
        );
        (job, worker.join().unwrap())
    });
    assert!(ok, "{events:?}");
    let joined = events
        .iter()
        .find(|e| e["event"] == "job")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(joined["job_id"], job.as_str());
    assert_eq!(joined["room"], "official-1");
    let registered = events.iter().find(|e| e["event"] == "registered");
    assert!(
        registered.is_some_and(|r| r["worker_id"].as_str().unwrap().starts_with("AW_")),
        "{events:?}"
    );
    assert!(events
        .iter()
        .any(|e| e["event"] == "done" && e["job_finished"] == true));
    let jobs = server.jobs();
    assert_eq!(
        jobs[0].status,
        livekit_protocol::JobStatus::JsSuccess,
        "{jobs:?}"
    );
}

#[test]
fn a_new_room_is_sent_to_a_worker_that_takes_every_room() {
    let server = TestServer::start(KEY, SECRET).unwrap();
    let (caller, (ok, events)) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| livekit_agents_worker(&server.url, KEY, SECRET, ""));
        wait_for("the worker to register", Duration::from_secs(60), || {
            !server.worker_statuses().is_empty()
        });
        // Nobody dispatches: the caller's new room is offered to the worker on its own.
        let token = room_token(
            KEY,
            SECRET,
            "caller",
            "automatic-1",
            Duration::from_secs(600),
        );
        let caller = livekit_caller(&server.url, &token, &["--listen", "6"]);
        (caller, worker.join().unwrap())
    });
    assert!(caller.0, "{:?}", caller.1);
    assert!(ok, "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "job" && e["room"] == "automatic-1"),
        "{events:?}"
    );
}

#[test]
fn one_worker_answers_two_calls_at_once_then_drains() {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-worker-{}", std::process::id()));
    let question = recorded_question(&cache, &dir);
    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let options = WorkerOptions {
        agent_name: "sublet".into(),
        max_calls: 2,
        call: CallOptions::default(),
    };
    let (drain_tx, drain) = watch::channel(false);
    let quiet = |_room: &str| -> Box<dyn CallObserver> { Box::new(Quiet) };

    let (report, callers, declined_when_full, declined_when_draining) =
        std::thread::scope(|scope| {
            let worker =
                scope.spawn(|| agent.work(runtime.handle(), &credentials, &options, drain, &quiet));
            wait_for("the worker to register", Duration::from_secs(20), || {
                !server.worker_statuses().is_empty()
            });
            // Two calls dispatched at once; a third finds the worker full.
            let jobs: Vec<_> = ROOMS
                .iter()
                .map(|room| scope.spawn(|| server.dispatch(room, "sublet")))
                .collect();
            let jobs: Vec<String> = jobs
                .into_iter()
                .map(|job| job.join().unwrap().expect("a worker took the job"))
                .collect();
            let declined_when_full = server.dispatch("worker-3", "sublet");
            // A caller in each room asks the recorded question and listens.
            let callers: Vec<_> = ROOMS
                .iter()
                .map(|room| {
                    let url = server.url.clone();
                    let recording = dir.join(format!("{room}.wav"));
                    let question = question.clone();
                    scope.spawn(move || {
                        let token =
                            room_token(KEY, SECRET, "caller", room, Duration::from_secs(600));
                        let args = [
                            "--publish-wav",
                            question.to_str().unwrap(),
                            "--listen",
                            "40",
                            "--record",
                            recording.to_str().unwrap(),
                        ];
                        (livekit_caller(&url, &token, &args), recording)
                    })
                })
                .collect();
            // Drain once both agents have begun answering: each must finish its reply.
            let mut answering = [false; 2];
            wait_for(
                "both agents to begin answering",
                Duration::from_secs(60),
                || {
                    for (at, (room, job)) in ROOMS.iter().zip(&jobs).enumerate() {
                        let state =
                            server.attribute(room, &format!("agent-{job}"), "lk.agent.state");
                        answering[at] |= matches!(state.as_deref(), Some("thinking" | "speaking"));
                    }
                    answering.iter().all(|a| *a)
                },
            );
            drain_tx.send(true).unwrap();
            wait_for(
                "the worker to report draining",
                Duration::from_secs(10),
                || {
                    server
                        .worker_statuses()
                        .iter()
                        .any(|(_, s)| s.last().is_some_and(|s| s.draining))
                },
            );
            let declined_when_draining = server.dispatch("worker-4", "sublet");
            let report = worker.join().unwrap().expect("the worker ran");
            let callers: Vec<_> = callers.into_iter().map(|c| c.join().unwrap()).collect();
            (report, callers, declined_when_full, declined_when_draining)
        });

    eprintln!("worker {}: {}", report.worker_id, report.ended);
    assert!(
        matches!(report.ended, WorkerEnd::Drained { .. }),
        "{}",
        report.ended
    );
    assert!(declined_when_full.is_err(), "{declined_when_full:?}");
    assert!(
        declined_when_draining.is_err(),
        "{declined_when_draining:?}"
    );
    assert_eq!(report.declined, 2);
    // The worker reported both calls at once, at full load, and then draining.
    let statuses = &server
        .worker_statuses()
        .into_iter()
        .find(|(id, _)| *id == report.worker_id)
        .expect("the worker's statuses")
        .1;
    assert!(
        statuses.iter().any(|s| s.job_count == 2 && s.load >= 1.0),
        "{statuses:?}"
    );
    assert!(statuses.last().unwrap().draining, "{statuses:?}");
    let jobs = server.jobs();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for job in &jobs {
        assert_eq!(
            job.status,
            livekit_protocol::JobStatus::JsSuccess,
            "{job:?}"
        );
    }

    let mut stt = Transcriber::load(&cache).unwrap();
    assert_eq!(report.jobs.len(), 2);
    for job in &report.jobs {
        let call = job.call.as_ref().expect("the call");
        eprintln!("{} ({}): {}", job.room, job.job_id, call.ended);
        assert!(
            matches!(
                call.ended,
                CallEnd::HungUp {
                    turn_in_progress: false,
                    ..
                }
            ),
            "{}",
            call.ended
        );
        assert_eq!(call.turns.len(), 1, "{:?}", call.turns);
        let turn = &call.turns[0];
        let ((ok, events), recording) =
            &callers[ROOMS.iter().position(|r| *r == job.room).unwrap()];
        assert!(ok, "{events:?}");
        // The caller heard the whole reply before the agent hung up, and saw it leave.
        let heard = read_wav(recording).unwrap().resampled(16_000);
        let text = stt.transcribe(&heard.samples).unwrap();
        let wer = word_error_rate(&turn.reply, &text);
        let report: Vec<&Value> = events.iter().filter(|e| e["event"] == "heard").collect();
        eprintln!(
            "{}: {:?} → {:?}; the caller heard {text:?} (WER {wer:.3}); {report:?}",
            job.room, turn.transcript, turn.reply
        );
        assert!(
            wer < 0.35,
            "heard {text:?}, the agent said {:?}",
            turn.reply
        );
        let agent = format!("agent-{}", job.job_id);
        assert!(
            events
                .iter()
                .any(|e| e["event"] == "participant_left" && e["identity"] == agent.as_str()),
            "{events:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A call observer that panics when its call's first turn is answered (a bug in one call),
/// or counts the turns answered.
enum OnAnswer {
    Panic,
    Count(Arc<AtomicUsize>),
}

impl CallObserver for OnAnswer {
    fn turn_answered(&mut self, _turn: &sublet_agent::TurnRecord) {
        match self {
            OnAnswer::Panic => panic!("injected: this call's observer fails"),
            OnAnswer::Count(answered) => {
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn a_worker_registers_again_after_its_connection_drops_and_outlives_a_panicking_call() {
    const PANICS: &str = "worker-panics";
    const ANSWERED: &str = "worker-answered";
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-worker-faults-{}", std::process::id()));
    let question = recorded_question(&cache, &dir);
    let server = TestServer::start(KEY, SECRET).unwrap();
    let credentials = server.credentials();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let options = WorkerOptions {
        agent_name: "sublet".into(),
        max_calls: 2,
        call: CallOptions::default(),
    };
    let (drain_tx, drain) = watch::channel(false);
    let answered = Arc::new(AtomicUsize::new(0));
    let observers = |room: &str| -> Box<dyn CallObserver> {
        match room {
            PANICS => Box::new(OnAnswer::Panic),
            _ => Box::new(OnAnswer::Count(answered.clone())),
        }
    };
    let registrations = || server.worker_statuses().len();
    let report = std::thread::scope(|scope| {
        let worker =
            scope.spawn(|| agent.work(runtime.handle(), &credentials, &options, drain, &observers));
        wait_for("the worker to register", Duration::from_secs(20), || {
            registrations() == 1
        });
        // The network drops the worker's connection: it registers again by itself.
        assert_eq!(server.drop_workers(), 1);
        wait_for(
            "the worker to register again",
            Duration::from_secs(20),
            || registrations() == 2,
        );
        let jobs: Vec<String> = [PANICS, ANSWERED]
            .iter()
            .map(|room| {
                server
                    .dispatch(room, "sublet")
                    .expect("the worker took the job")
            })
            .collect();
        let callers: Vec<_> = [PANICS, ANSWERED]
            .iter()
            .map(|room| {
                let url = server.url.clone();
                let question = question.clone();
                scope.spawn(move || {
                    let token = room_token(KEY, SECRET, "caller", room, Duration::from_secs(600));
                    let args = [
                        "--publish-wav",
                        question.to_str().unwrap(),
                        "--listen",
                        "30",
                    ];
                    livekit_caller(&url, &token, &args)
                })
            })
            .collect();
        // The panicking call is reported failed and its agent leaves the room; the other
        // call is answered.
        let failed = |job: &str| {
            server
                .jobs()
                .iter()
                .any(|j| j.id == job && j.status == livekit_protocol::JobStatus::JsFailed)
        };
        wait_for(
            "the panicking call to fail",
            Duration::from_secs(60),
            || failed(&jobs[0]),
        );
        let agent_in =
            |room: &str, job: &str| server.participants(room).contains(&format!("agent-{job}"));
        wait_for(
            "the failed call's agent to leave",
            Duration::from_secs(10),
            || !agent_in(PANICS, &jobs[0]),
        );
        wait_for("the other call's answer", Duration::from_secs(60), || {
            answered.load(Ordering::Relaxed) == 1
        });
        drain_tx.send(true).unwrap();
        let report = worker.join().unwrap().expect("the worker ran");
        for caller in callers {
            let _ = caller.join();
        }
        report
    });
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("worker {}: {}", report.worker_id, report.ended);
    assert_eq!(report.registered_again.len(), 1, "{report:?}");
    assert!(
        matches!(report.ended, WorkerEnd::Drained { .. }),
        "{}",
        report.ended
    );
    assert_eq!(report.jobs.len(), 2, "{report:?}");
    for job in &report.jobs {
        match (job.room.as_str(), &job.call) {
            (PANICS, Err(error)) => assert!(error.contains("injected"), "{error}"),
            (ANSWERED, Ok(call)) => {
                assert_eq!(call.turns.len(), 1, "{:?}", call.turns);
                assert!(call.turns[0].outcome.answered(), "{:?}", call.turns);
            }
            _ => panic!("{job:?}"),
        }
    }
    // The server was told: one job failed, the other succeeded.
    let statuses: Vec<_> = server.jobs().iter().map(|j| j.status).collect();
    assert!(
        statuses.contains(&livekit_protocol::JobStatus::JsFailed)
            && statuses.contains(&livekit_protocol::JobStatus::JsSuccess),
        "{statuses:?}"
    );
}
