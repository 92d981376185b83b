//! The agents' door under load, on the loopback, while a caller's turns are timed: the
//! bundled engine with make-room on, the OpenAI-compatible server in this process with its
//! default limits, and hundreds of clients of every kind a public endpoint meets (streamed
//! and whole requests, ones asking to outrank the callers, ones that hang up mid-queue,
//! stall mid-header, or send oversized, malformed or absurd requests: stop texts and tools
//! past their bounds, a foreign Host, a schema built to be costly, /metrics in a loop,
//! kept-alive connections held idle). A voice turn goes to
//! the engine in process, as the voice agent sends it, first alone and then every few
//! seconds under the load; its first token is compared.
//!
//! Reports requests served, refused (429/503 and others, by status), hung up and dropped;
//! the server's own count of cancelled requests and of any it never counted as ended;
//! resident memory before, at its peak and after; and the voice turn's first token alone
//! and under load. Exits non-zero if any request went unanswered or was held, a bad one
//! was served, or the server lost count.
//!
//! ```text
//! load [--seconds 60] [--clients 240] [--vanishing 60] [--slow-header 40] [--bad 10]
//!      [--voice-every 3] [--json target/load.json]
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use sublet_bench::load::{median, send, ClientKind, LoadFigures, Outcome, Target};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{
    ChatRequest, Engine, EngineConfig, Message, Role, StreamEvent, VOICE_PRIORITY,
};
use sublet_models::ModelArgs;
use sublet_server::{router, serve, ConnectionLimits, Metrics, ServerConfig};

#[derive(Parser, Debug)]
#[command(name = "load")]
struct Args {
    /// How long the clients keep sending.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Clients sending real requests: streamed chats, a sixth of them asking for
    /// `priority: -1`, and a sixth whole text completions.
    #[arg(long, default_value_t = 240)]
    clients: usize,
    /// Clients that send a streamed request and hang up within 1.5 s.
    #[arg(long, default_value_t = 60)]
    vanishing: usize,
    /// Clients that send one header line and wait.
    #[arg(long, default_value_t = 40)]
    slow_header: usize,
    /// Clients of each hostile kind (oversized body, malformed JSON, 1 MiB header, long stop
    /// texts, too many tools, a foreign Host, a costly schema, /metrics polled, a
    /// kept-alive connection held idle).
    #[arg(long, default_value_t = 10)]
    bad: usize,
    /// Seconds between the voice turns sent under the load.
    #[arg(long, default_value_t = 3.0)]
    voice_every: f64,
    /// Where the figures go as JSON.
    #[arg(long, default_value = "target/load.json")]
    json: PathBuf,
    #[command(flatten)]
    models: ModelArgs,
}

/// A caller's turn, as the voice agent sends it: a new call's each time, so no call's
/// retained KV makes room for it, and the caller's words its own (the persona is the
/// same for every call, as in a deployment: the prefix cache may hold it, never the rest).
fn voice_turn(engine: &Engine) -> Result<f64> {
    static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
    let call = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
    let conversation = vec![
        Message::new(Role::System, "You are a helpful voice assistant on a phone call. Answer in one or two short, plain spoken sentences."),
        Message::new(Role::User, format!("Hi, this is patient number {call}. I need to move my dentist appointment from Tuesday the 14th.")),
        Message::new(Role::Assistant, "Of course. Which day would suit you better?"),
        Message::new(Role::User, "Thursday the 16th, in the afternoon if you can."),
    ];
    let request = ChatRequest {
        priority: VOICE_PRIORITY,
        session: Some(call),
        ..ChatRequest::new(conversation, 8)
    };
    let sent = Instant::now();
    let mut reply = engine.chat(request)?;
    loop {
        match reply.next_blocking() {
            Some(Ok(StreamEvent::Text(_))) => return Ok(sent.elapsed().as_secs_f64() * 1e3),
            Some(Ok(_)) => {}
            Some(Err(e)) => bail!("the voice turn failed: {e}"),
            None => bail!("the voice turn ended without a token"),
        }
    }
}

fn rss_mb() -> f64 {
    sublet_bench::resident_mb().unwrap_or(0.0)
}

/// The sum over priorities of one of the server's counters.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn main() -> Result<()> {
    // Calls run here, each on threads of its own.
    sublet_agent::allocator::for_long_running_process();
    let args = Args::parse();
    let cache = sublet_agent::models::choose(&args.models)?;
    eprintln!("load: loading the bundled engine, make-room on");
    let engine = Arc::new(Engine::load(&EngineConfig {
        // As `worker --api` runs it (its defaults: a 4096-token KV budget, 16-token chunks).
        make_room: Some(PolicyConfig {
            switches: Switches::all(),
            kv_budget_tokens: 4096,
            chunk_tokens: Some(16),
            whole_prompt_priority: Some(VOICE_PRIORITY),
            ..PolicyConfig::default()
        }),
        ..EngineConfig::from_cache(&cache)?
    })?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let target = Target {
        addr: listener.local_addr()?,
        patience: Duration::from_secs(120),
    };
    let metrics = Arc::new(Metrics::default());
    let config = ServerConfig::default();
    let app = router(engine.clone(), config.clone(), metrics.clone());
    runtime.spawn(serve(
        listener,
        app,
        ConnectionLimits::default(),
        std::future::pending(),
    ));

    let mut figures = LoadFigures {
        rss_before_mb: rss_mb(),
        ..LoadFigures::default()
    };
    voice_turn(&engine)?; // warm-up
    for _ in 0..5 {
        figures.voice_alone_ms.push(voice_turn(&engine)?);
    }
    eprintln!(
        "load: voice turn alone, first token {:.0} ms (median of 5)",
        median(&figures.voice_alone_ms).unwrap_or(f64::NAN)
    );

    let kinds = client_kinds(&args);
    eprintln!(
        "load: {} clients for {:.0} s against http://{} (at most {} requests in flight)",
        kinds.len(),
        args.seconds,
        target.addr,
        config.max_in_flight
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let outcomes = Arc::new(Mutex::new(Vec::<(ClientKind, Outcome)>::new()));
    let clients: Vec<_> = kinds
        .into_iter()
        .enumerate()
        .map(|(client, kind)| {
            let (target, outcomes) = (target.clone(), outcomes.clone());
            runtime.spawn(async move {
                // Spread over the first two seconds, not one burst of connections.
                tokio::time::sleep(Duration::from_millis((client as u64 * 7) % 2000)).await;
                let mut n = client * 10_000;
                while Instant::now() < deadline {
                    let outcome = send(&target, kind, n).await;
                    n += 1;
                    outcomes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((kind, outcome));
                    let pause = match (kind, outcome) {
                        (_, Outcome::Busy { .. }) => 1000, // Retry-After: 1
                        (
                            ClientKind::Streamed
                            | ClientKind::Urgent
                            | ClientKind::Whole
                            | ClientKind::ClaudeCode
                            | ClientKind::Codex,
                            _,
                        ) => 0,
                        _ => 300,
                    };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            })
        })
        .collect();

    let done = AtomicBool::new(false);
    let peak = Mutex::new(figures.rss_before_mb);
    let loaded = std::thread::scope(|scope| -> Result<Vec<f64>> {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let now = rss_mb();
                let mut peak = peak.lock().unwrap_or_else(|e| e.into_inner());
                *peak = peak.max(now);
                drop(peak);
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let voice = scope.spawn(|| -> Result<Vec<f64>> {
            let mut loaded = Vec::new();
            // Once every client has started.
            std::thread::sleep(Duration::from_secs(3));
            while Instant::now() + Duration::from_secs(2) < deadline {
                let at = Instant::now();
                let ms = voice_turn(&engine)?;
                eprintln!(
                    "load: {:>4.0} s  voice turn first token {ms:.0} ms, {} requests answered so far, {:.0} MB resident",
                    started.elapsed().as_secs_f64(),
                    outcomes.lock().map_or(0, |o| o.len()),
                    rss_mb()
                );
                loaded.push(ms);
                std::thread::sleep(
                    Duration::from_secs_f64(args.voice_every).saturating_sub(at.elapsed()),
                );
            }
            Ok(loaded)
        });
        let loaded = voice.join().expect("the voice thread does not panic");
        runtime.block_on(async {
            for client in clients {
                let _ = client.await;
            }
        });
        done.store(true, Ordering::Relaxed);
        loaded
    })?;
    figures.voice_loaded_ms = loaded;
    figures.rss_peak_mb = *peak.lock().unwrap_or_else(|e| e.into_inner());
    for (kind, outcome) in outcomes.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        figures.add(kind, outcome);
    }

    // The server's count, once everything in flight has ended (the hung-up clients'
    // requests cancelled).
    let wait_until = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = metrics.render();
        if counter(&text, "sublet_requests_in_flight") == 0 || Instant::now() > wait_until {
            break text;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let ended = ["finished", "failed", "cancelled"]
        .map(|what| counter(&text, &format!("sublet_requests_{what}_total")));
    figures.cancelled = ended[2];
    figures.unaccounted =
        counter(&text, "sublet_requests_started_total") as i64 - ended.iter().sum::<u64>() as i64;
    figures.rss_after_mb = rss_mb();
    let after_ms = voice_turn(&engine).context("a voice turn after the load")?;

    print_report(&figures, after_ms);
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&figures)?)?;
    eprintln!("load: figures in {}", args.json.display());
    figures.sound().map_err(anyhow::Error::msg)
}

/// One kind for each client, in the proportions `args` ask for.
fn client_kinds(args: &Args) -> Vec<ClientKind> {
    let mut kinds = Vec::new();
    for i in 0..args.clients {
        kinds.push(match i % 8 {
            0 => ClientKind::Urgent,
            1 => ClientKind::Whole,
            2 => ClientKind::ClaudeCode,
            3 => ClientKind::Codex,
            _ => ClientKind::Streamed,
        });
    }
    kinds.extend(std::iter::repeat_n(ClientKind::Vanishing, args.vanishing));
    kinds.extend(std::iter::repeat_n(
        ClientKind::SlowHeader,
        args.slow_header,
    ));
    for kind in [
        ClientKind::Oversized,
        ClientKind::Malformed,
        ClientKind::HugeHeader,
        ClientKind::LongStops,
        ClientKind::ManyTools,
        ClientKind::ForeignHost,
        ClientKind::CostlySchema,
        ClientKind::MetricsPoll,
        ClientKind::IdleKeepAlive,
    ] {
        kinds.extend(std::iter::repeat_n(kind, args.bad));
    }
    kinds
}

fn print_report(figures: &LoadFigures, after_ms: f64) {
    println!(
        "\n{:<14} {:>6} {:>6} {:>6} {:>16} {:>7} {:>7} {:>9} {:>5}",
        "client", "sent", "served", "busy", "refused", "hung up", "dropped", "no answer", "held"
    );
    for (kind, t) in &figures.by_kind {
        let refused: Vec<String> = t.refused.iter().map(|(s, n)| format!("{n}×{s}")).collect();
        println!(
            "{:<14} {:>6} {:>6} {:>6} {:>16} {:>7} {:>7} {:>9} {:>5}",
            format!("{kind:?}"),
            t.sent,
            t.served,
            t.busy,
            refused.join(" "),
            t.hung_up,
            t.dropped,
            t.no_answer,
            t.held
        );
    }
    if let Some(slow) = figures.by_kind.get(&ClientKind::SlowHeader) {
        println!(
            "slow-header connections dropped after at most {:.1} s",
            slow.dropped_after_max_s
        );
    }
    println!(
        "server: {} cancelled (clients gone), {} never counted as ended",
        figures.cancelled, figures.unaccounted
    );
    println!(
        "memory: {:.0} MB before, {:.0} MB at the peak, {:.0} MB after",
        figures.rss_before_mb, figures.rss_peak_mb, figures.rss_after_mb
    );
    let loaded = &figures.voice_loaded_ms;
    let mut sorted = loaded.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "voice turn, first token: alone {:.0} ms, under load {:.0} ms median, {:.0} ms worst of {} ({:.2}× alone); after the load {after_ms:.0} ms",
        median(&figures.voice_alone_ms).unwrap_or(f64::NAN),
        median(loaded).unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN),
        loaded.len(),
        figures.voice_ratio().unwrap_or(f64::NAN)
    );
}
