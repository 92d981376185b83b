//! Serves the bundled engine over the OpenAI-compatible API, for coding agents alone
//! (`worker --api` and `room --api` serve it beside the calls, on the calls' engine).
//!
//! ```text
//! serve [--addr 127.0.0.1:8000] [--api-key KEY] [--api-max-in-flight 64] [--api-priority-floor 1]
//!       [--make-room all [--kv-budget 4096] [--chunk 16]] [--view ADDR]
//!
//! With `--view ADDR` a page shows the engine live (`sublet_demos::view`).
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Parser;
use sublet_demos::{
    api_router, check_exposure, listen, ApiLimitArgs, CallerRoom, EngineArgs, ViewArgs,
};
use sublet_engine::Engine;
use sublet_server::{serve, ConnectionLimits};

#[derive(Parser, Debug)]
#[command(name = "serve")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    addr: SocketAddr,
    /// Require this key as `Authorization: Bearer <key>` (default: `SUBLET_API_KEY`, else none).
    #[arg(long, env = "SUBLET_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(flatten)]
    limits: ApiLimitArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    view: ViewArgs,
}

fn run(args: Args) -> Result<()> {
    check_exposure("--addr", args.addr, args.api_key.as_deref())?;
    let cache = args.engine.models()?;
    let engine = Arc::new(Engine::load(&args.engine.engine_config(&cache, false)?)?);
    let app = api_router(&engine, args.limits.server_config(args.api_key));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    args.view
        .spawn("serve", runtime.handle(), &engine, None, CallerRoom::None)?;
    runtime.block_on(async {
        let listener = listen(args.addr).await?;
        eprintln!(
            "serve: {} on http://{}/v1",
            engine.model_name(),
            listener.local_addr()?
        );
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        serve(listener, app, ConnectionLimits::default(), shutdown).await;
        Ok(())
    })
}

fn main() -> ExitCode {
    sublet_demos::main("serve", || run(Args::parse()))
}
