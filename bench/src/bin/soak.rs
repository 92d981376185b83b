//! The soak: calls back to back through the LiveKit test server, each from LiveKit's
//! official Node client playing a recorded call, answered by the agent worker beside
//! replayed coding agents on the same engine, with faults on a schedule (the agent's signal
//! connection dropped, the caller's media stopped, a call thread panicking, the worker's
//! connection dropped, and every call's second turn refused by the engine). Each call's
//! turns go to its record on disk as they end. Reports turns answered and failed, turns
//! lost without a record, faults survived, resident memory over time and its slope after
//! warm-up, and file descriptors.
//!
//! ```text
//! soak [--minutes 30] [--out target/soak] [--agents 4] [--warm-up-minutes 5]
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use sublet_agent::call_log::{read_call_record, CallLog};
use sublet_agent::{AgentConfig, CallObserver, TurnFaults, TurnRecord, VoiceAgent};
use sublet_bench::soak::{
    fault_of, figures, Fault, PartsMb, ProcessSample, SoakCall, SoakFigures, SCHEDULE,
};
use sublet_bench::{agents, trace};
use sublet_engine::{deployed_make_room, Engine, EngineConfig};
use sublet_livekit::{CallEnd, CallOptions, LiveKitAgent, WorkerOptions};
use sublet_livekit_testserver::TestServer;
use sublet_models::ModelArgs;
use sublet_tests::official_clients::{livekit_caller, room_token};
use sublet_turn_detect::TurnEvent;
use tokio::sync::watch;

const KEY: &str = "devkey";
const SECRET: &str = "a-secret-long-enough-for-hs256-signing";
const AGENT_NAME: &str = "soak";
/// The recorded call every caller plays: three turns in 32 s.
const CALL: &str = "three_turns.wav";
/// When each fault strikes, after the caller starts: mid-call, between its turns.
const FAULT_AFTER: Duration = Duration::from_secs(12);
const MEDIA_TIMEOUT: Duration = Duration::from_secs(5);
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(name = "soak")]
struct Args {
    /// How long to keep starting calls.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Where the records, `soak.json` and `report.md` go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
    /// Coding-agent sessions replayed beside the calls.
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Samples before this are left out of resident memory's slope.
    #[arg(long, default_value_t = 5.0)]
    warm_up_minutes: f64,
    #[command(flatten)]
    models: ModelArgs,
}

/// What one call's observer saw, kept past the call.
#[derive(Default)]
struct Tally {
    turns_ended: usize,
    record: Option<PathBuf>,
}

type Tallies = Arc<Mutex<HashMap<String, Tally>>>;

/// Counts the turns the detector ended, appends each answered turn to the call's record,
/// and panics at the first answered turn when the call's fault says so (after the record).
struct SoakObserver {
    room: String,
    tallies: Tallies,
    log: Option<CallLog>,
    panics: bool,
}

impl CallObserver for SoakObserver {
    fn turn_event(&mut self, event: &TurnEvent) {
        if let TurnEvent::EndOfTurn { .. } = event {
            let mut tallies = self.tallies.lock().unwrap_or_else(|e| e.into_inner());
            tallies.entry(self.room.clone()).or_default().turns_ended += 1;
        }
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        if let Some(log) = &mut self.log {
            if let Err(e) = log.turn(turn) {
                eprintln!("soak: [{}] {e:#}", self.room);
            }
        }
        if self.panics {
            panic!("injected: the soak's call panics");
        }
    }

    fn call_ended(&mut self, reason: &str) {
        if let Some(log) = self.log.take() {
            let fields = serde_json::Map::from_iter([("reason".to_string(), reason.into())]);
            let _ = log.end(fields);
        }
    }
}

// Each part's large blocks by resident pages, sampled beside resident memory.
sublet_heap::interpose_malloc!();

fn main() -> Result<()> {
    // Calls run here, each on threads of its own.
    sublet_agent::allocator::for_long_running_process();
    let args = Args::parse();
    let records = args.out.join("records");
    std::fs::create_dir_all(&records)?;
    let cache = sublet_agent::models::choose(&args.models)?;
    let engine = Arc::new(Engine::load(&EngineConfig {
        make_room: Some(deployed_make_room()),
        ..EngineConfig::from_cache(&cache)?
    })?);
    let config = AgentConfig {
        turn_hints: true,
        faults: TurnFaults {
            engine: vec![2],
            ..TurnFaults::default()
        },
        ..AgentConfig::default()
    };
    let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config);
    let runtime = tokio::runtime::Runtime::new()?;
    let base_url = agents::serve_api(&engine, &runtime)?;
    // LiveKit's Node client plays 16-bit mono.
    let wav = args.out.join("call.wav");
    sublet_audio::write_wav(&wav, &sublet_audio::read_wav(cache.call(CALL)?)?)?;
    let call_s = sublet_audio::read_wav(&wav)?.duration_s();

    let server = TestServer::start(KEY, SECRET)?;
    let credentials = server.credentials();
    let options = WorkerOptions {
        agent_name: AGENT_NAME.into(),
        max_calls: 2,
        call: CallOptions {
            media_timeout: Some(MEDIA_TIMEOUT),
            ..CallOptions::default()
        },
    };
    let tallies: Tallies = Arc::default();
    let observers = |room: &str| -> Box<dyn CallObserver> {
        let log = CallLog::create(&records, "soak", room, serde_json::Map::new())
            .map_err(|e| eprintln!("soak: [{room}] no record: {e:#}"))
            .ok();
        let mut tallies_now = tallies.lock().unwrap_or_else(|e| e.into_inner());
        tallies_now.entry(room.to_owned()).or_default().record =
            log.as_ref().map(|l| l.path().to_owned());
        Box::new(SoakObserver {
            room: room.to_owned(),
            tallies: tallies.clone(),
            log,
            panics: room_fault(room) == Some(Fault::CallPanics),
        })
    };
    let (drain_tx, drain) = watch::channel(false);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let window = Duration::from_secs_f64(args.minutes * 60.0);
    let samples = Mutex::new(Vec::<ProcessSample>::new());
    let sessions = trace::generate(
        1,
        &trace::GeneratorConfig {
            sessions: args.agents,
            ..trace::GeneratorConfig::default()
        },
    );
    eprintln!(
        "soak: {:.0} min of calls ({CALL}, {call_s:.0} s each) beside {} agent sessions; records in {}",
        args.minutes,
        args.agents,
        records.display()
    );
    let (report, seen) = std::thread::scope(|scope| -> Result<_> {
        let worker =
            scope.spawn(|| agent.work(runtime.handle(), &credentials, &options, drain, &observers));
        let replay = scope.spawn(|| agents::replay(&base_url, &sessions, &stop, started, 0));
        let sampler = scope.spawn(|| {
            sublet_bench::sample_until(&stop, SAMPLE_EVERY, || {
                if let Some(sample) = sample(started) {
                    samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(sample);
                }
            })
        });
        wait_for(Duration::from_secs(60), || {
            !server.worker_statuses().is_empty()
        })
        .context("the worker did not register")?;
        let mut seen = HashMap::new();
        let mut n = 0;
        while started.elapsed() < window {
            let room = format!("soak-{n}-{:?}", fault_of(n)).to_lowercase();
            let effect = one_call(&server, &room, fault_of(n), &wav, call_s)?;
            seen.insert(room.clone(), effect);
            let last = samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last()
                .copied();
            eprintln!(
                "soak: {:.1} min: call {} ({:?}) done; {}",
                started.elapsed().as_secs_f64() / 60.0,
                n + 1,
                fault_of(n),
                last.map_or(String::new(), |s| format!(
                    "resident {:.0} MB (arenas: {:.0} MB in use, {:.0} MB free kept; large blocks resident: {}), {} fds, {} threads, {} peer connections not freed",
                    s.rss_mb,
                    s.heap_in_use_mb.unwrap_or(f64::NAN),
                    s.heap_free_kept_mb.unwrap_or(f64::NAN),
                    s.parts_resident_mb.map_or("–".into(), |p| parts(&p, "MB")),
                    s.fds,
                    s.threads,
                    s.peer_connections
                ))
            );
            n += 1;
        }
        drain_tx.send(true)?;
        let report = worker.join().expect("the worker thread")?;
        stop.store(true, Ordering::Relaxed);
        let agent_calls = replay.join().expect("the agents' thread");
        let _ = sampler.join();
        eprintln!("soak: the agents made {} requests", agent_calls.len());
        Ok((report, seen))
    })?;
    let tallies = std::mem::take(&mut *tallies.lock().unwrap_or_else(|e| e.into_inner()));
    let mut calls = Vec::new();
    for job in &report.jobs {
        let tally = tallies.get(&job.room);
        let recorded = match tally.and_then(|t| t.record.as_deref()) {
            Some(path) => read_call_record(path)?.turns,
            None => Vec::new(),
        };
        let fault = room_fault(&job.room).unwrap_or(Fault::None);
        let effect = seen.get(&job.room).copied().unwrap_or_default();
        let fault_seen = match (fault, &job.call) {
            (Fault::None, _) => false,
            (Fault::SignalDropped, Ok(call)) => !call.signal_resumes.is_empty(),
            (Fault::MediaStopped, Ok(call)) => matches!(call.ended, CallEnd::MediaStopped(_)),
            (Fault::CallPanics, Err(error)) => error.contains("injected"),
            (Fault::WorkerDropped, Ok(_)) => effect.registered_again,
            _ => false,
        };
        calls.push(SoakCall {
            room: job.room.clone(),
            fault,
            turns_ended: tally.map_or(0, |t| t.turns_ended),
            recorded,
            ended: match &job.call {
                Ok(call) => call.ended.to_string(),
                Err(error) => error.clone(),
            },
            failed: job.call.is_err(),
            fault_seen,
        });
    }
    let samples = samples.into_inner().unwrap_or_else(|e| e.into_inner());
    let figures = figures(&calls, &samples, args.warm_up_minutes * 60.0);
    write_report(
        &args,
        &calls,
        &samples,
        &figures,
        report.registered_again.len(),
    )?;
    Ok(())
}

/// What a call's fault visibly did, from outside the worker.
#[derive(Debug, Clone, Copy, Default)]
struct Effect {
    registered_again: bool,
}

/// The fault a room was given (its name says).
fn room_fault(room: &str) -> Option<Fault> {
    SCHEDULE
        .into_iter()
        .find(|f| room.ends_with(&format!("-{f:?}").to_lowercase()))
}

/// One call: dispatched to the worker, the caller playing `wav`, the fault at its time;
/// returns once the caller left and the job ended.
fn one_call(
    server: &TestServer,
    room: &str,
    fault: Fault,
    wav: &Path,
    call_s: f64,
) -> Result<Effect> {
    // After a dropped worker connection the worker may still be registering again.
    let mut job = server.dispatch(room, AGENT_NAME);
    let retry_until = Instant::now() + Duration::from_secs(60);
    while job.is_err() && Instant::now() < retry_until {
        std::thread::sleep(Duration::from_millis(500));
        job = server.dispatch(room, AGENT_NAME);
    }
    let job = job.with_context(|| format!("no worker took {room}"))?;
    let url = server.url.clone();
    let token = room_token(KEY, SECRET, "caller", room, Duration::from_secs(3600));
    let wav = wav.to_str().context("a UTF-8 path")?.to_owned();
    let listen = format!("{:.0}", call_s + 12.0);
    let caller = std::thread::spawn(move || {
        livekit_caller(&url, &token, &["--publish-wav", &wav, "--listen", &listen])
    });
    let registered = server.worker_statuses().len();
    std::thread::sleep(FAULT_AFTER);
    match fault {
        Fault::SignalDropped => {
            server.drop_signal(room, &format!("agent-{job}"));
        }
        Fault::MediaStopped => {
            server.stop_media(room, "caller");
        }
        Fault::WorkerDropped => {
            server.drop_workers();
        }
        Fault::None | Fault::CallPanics => {}
    }
    let (ok, events) = caller
        .join()
        .map_err(|_| anyhow::anyhow!("the caller's thread panicked"))?;
    if !ok && fault == Fault::None {
        bail!("the caller in {room} failed: {events:?}");
    }
    // The job's end, as its worker reported it.
    let ended = || {
        server.jobs().iter().any(|j| {
            j.id == job
                && matches!(
                    j.status,
                    livekit_protocol::JobStatus::JsSuccess | livekit_protocol::JobStatus::JsFailed
                )
        })
    };
    if wait_for(Duration::from_secs(60), ended).is_err() {
        eprintln!("soak: {room}: the job had not ended a minute after its caller left");
    }
    Ok(Effect {
        registered_again: server.worker_statuses().len() > registered,
    })
}

fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let until = Instant::now() + limit;
    while !ready() {
        if Instant::now() >= until {
            bail!("waited {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// This process's resident memory, file descriptors and threads now.
fn sample(started: Instant) -> Option<ProcessSample> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    const MB: f64 = 1024.0 * 1024.0;
    let heap = sublet_agent::allocator::heap_figures();
    Some(ProcessSample {
        at_s: started.elapsed().as_secs_f64(),
        rss_mb: sublet_bench::resident_mb()?,
        fds: std::fs::read_dir("/proc/self/fd").ok()?.count(),
        threads: field("Threads:")? as usize,
        peer_connections: sublet_livekit::peer::live_peer_connections(),
        heap_in_use_mb: heap.map(|h| h.arena_in_use as f64 / MB),
        heap_free_kept_mb: heap.map(|h| h.arena_free as f64 / MB),
        parts_resident_mb: PartsMb::now(),
    })
}

/// Each part's figure, in a line.
fn parts(p: &PartsMb, unit: &str) -> String {
    format!(
        "engine {:.1}, Whisper {:.1}, turn detector {:.1}, Piper {:.1}, other {:.1} {unit}",
        p.engine, p.whisper, p.turn_detector, p.voice, p.other
    )
}

fn write_report(
    args: &Args,
    calls: &[SoakCall],
    samples: &[ProcessSample],
    figures: &SoakFigures,
    registered_again: usize,
) -> Result<()> {
    let longest_trim_ms = sublet_agent::allocator::longest_trim().as_secs_f64() * 1e3;
    let json = serde_json::json!({
        "command": format!("cargo xtask soak --minutes {}", args.minutes),
        "figures": figures,
        "worker_registered_again": registered_again,
        "calls": calls,
        "samples": samples,
        "longest_malloc_trim_ms": longest_trim_ms,
    });
    std::fs::write(
        args.out.join("soak.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let mut md = format!(
        "# Soak\n\n- Command: `cargo xtask soak --minutes {}`\n- Calls: {} ({CALL}), turns the detector ended: {}, turns lost without a record: **{}**\n- Turns recorded by outcome: {:?}\n- Faults injected: {:?}; survived: {:?} (the worker registered again {registered_again} times)\n- Resident memory: {:.0} MB first, {:.0} MB last; slope after {:.0} min of warm-up: **{} MB/min** (glibc's arena chunks in use: {} MB/min; the longest return of free pages, `malloc_trim`, took {longest_trim_ms:.1} ms)\n- Each part's resident large blocks, slope after warm-up: {}\n- The least resident memory in each 5 minutes after warm-up: {} MB\n- File descriptors (min, max): {:?}; threads (min, max): {:?}; WebRTC peer connections not freed (first, last sample): {:?}\n\n| room | fault | turns ended | recorded | fault seen | ended |\n|---|---|---:|---:|---|---|\n",
        args.minutes,
        figures.calls,
        figures.turns_ended,
        figures.turns_lost,
        figures.outcomes,
        figures.faults_injected,
        figures.faults_survived,
        figures.rss_first_mb.unwrap_or(0.0),
        figures.rss_last_mb.unwrap_or(0.0),
        args.warm_up_minutes,
        figures
            .rss_slope_mb_per_min
            .map_or("–".into(), |s| format!("{s:.2}")),
        figures
            .heap_slope_mb_per_min
            .map_or("–".into(), |s| format!("{s:.2}")),
        figures
            .parts_slope_mb_per_min
            .map_or("–".into(), |p| parts(&p, "MB/min")),
        figures
            .rss_lows_mb
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        figures.fds_min_max,
        figures.threads_min_max,
        figures.peer_connections_first_last,
    );
    for call in calls {
        md += &format!(
            "| {} | {:?} | {} | {} | {} | {} |\n",
            call.room,
            call.fault,
            call.turns_ended,
            call.recorded.len(),
            call.fault_seen,
            call.ended.replace('|', "/")
        );
    }
    std::fs::write(args.out.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}
