//! Registers with a LiveKit server as an agent worker and answers the calls it is given,
//! several at once on the one engine. SIGTERM (or Ctrl-C) drains it: it declines new jobs,
//! lets each call finish the turn in progress, hangs up, and exits. With `--api ADDR` it
//! also serves coding agents the OpenAI-compatible API on the calls' engine, make-room and
//! the turn hint on. With `--view ADDR` it serves a page whose every visit calls a new room
//! from the browser and shows the call live (`sublet_demos::view`).
//!
//! ```text
//! worker [--agent-name NAME] [--max-calls N] [--api ADDR] [--view ADDR]   (with LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET)
//! ```

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use sublet_agent::{turn_table, CallObserver};
use sublet_demos::{CallArgs, CallerRoom, Progress, Recorded};
use sublet_livekit::{LiveKitAgent, LiveKitCredentials, WorkerOptions};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(name = "worker")]
struct Args {
    /// The LiveKit server (default: `LIVEKIT_URL`).
    #[arg(long, env = "LIVEKIT_URL")]
    url: Option<String>,
    /// Take only jobs dispatched to this agent name; without it, every new room.
    #[arg(long, default_value = "")]
    agent_name: String,
    /// The most calls at once; offers beyond it are declined.
    #[arg(long, default_value_t = 4)]
    max_calls: usize,
    #[command(flatten)]
    call: CallArgs,
}

fn run(args: Args) -> Result<()> {
    let mut credentials = LiveKitCredentials::from_env()?;
    if let Some(url) = args.url {
        credentials.url = url;
    }
    let (agent, runtime) = args.call.start("worker")?;
    // Each visit to the page calls a new room, which LiveKit gives a worker taking every
    // new room (no `--agent-name`); named by this process, so that rooms of another run or
    // another worker's page are never reused.
    anyhow::ensure!(
        args.call.view.view.is_none() || args.agent_name.is_empty(),
        "--view needs a worker that takes every new room: with --agent-name, LiveKit would \
         send it none of the page's rooms"
    );
    let view_room = CallerRoom::PerVisit {
        credentials: credentials.clone(),
        prefix: format!(
            "sublet-view-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ),
    };
    args.call.view.spawn(
        "worker",
        runtime.handle(),
        &agent.engine,
        Some(&agent),
        view_room,
    )?;
    let (drain_tx, drain) = watch::channel(false);
    runtime.spawn(async move {
        let (Ok(mut term), Ok(mut interrupt)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        eprintln!("worker: draining: declining new calls, finishing the turns in progress");
        let _ = drain_tx.send(true);
    });
    let options = WorkerOptions {
        agent_name: args.agent_name,
        max_calls: args.max_calls,
        call: args.call.room_options(),
    };
    eprintln!(
        "worker: registering at {} (agent name {:?}, up to {} calls)",
        credentials.worker_url(),
        options.agent_name,
        options.max_calls
    );
    let records = args.call.records.clone();
    let models = agent.cache.model_names();
    let progress = |room: &str| -> Box<dyn CallObserver> {
        eprintln!("worker: joining room {room}");
        let progress = Progress {
            label: format!("[{room}]"),
        };
        // Each call's turns kept as they end; its end is written by the call itself.
        match records.open("worker", room, &models, serde_json::Map::new()) {
            Ok(log) => {
                eprintln!("[{room}] this call's record: {}", log.path().display());
                Box::new(Recorded::new(progress, log, None))
            }
            Err(e) => {
                eprintln!("[{room}] no record kept for this call: {e:#}");
                Box::new(progress)
            }
        }
    };
    let report = agent.work(runtime.handle(), &credentials, &options, drain, &progress)?;
    for job in &report.jobs {
        match &job.call {
            Ok(call) => {
                eprintln!("[{}] the call ended: {}", job.room, call.ended);
                println!("{} ({})\n{}", job.room, job.job_id, turn_table(&call.turns));
            }
            Err(e) => eprintln!("[{}] the call failed: {e}", job.room),
        }
    }
    eprintln!(
        "worker {}: {} calls, {} offers declined; {}",
        report.worker_id,
        report.jobs.len(),
        report.declined,
        report.ended
    );
    Ok(())
}

fn main() -> ExitCode {
    sublet_demos::main("worker", || run(Args::parse()))
}
