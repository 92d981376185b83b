//! Joins one LiveKit room now and answers the caller there, then leaves when they do. With
//! `--api ADDR` it also serves coding agents the OpenAI-compatible API on the call's engine,
//! make-room and the turn hint on. With `--view ADDR` it serves a page that joins the room
//! as the caller from a browser and shows the call live (`sublet_demos::view`).
//!
//! ```text
//! room --url URL --token TOKEN [--api ADDR]
//! room --room NAME [--api ADDR] [--view ADDR]   (with LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET)
//! ```

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use sublet_agent::turn_table;
use sublet_demos::{CallArgs, CallerRoom, Progress, Recorded};
use sublet_livekit::{LiveKitAgent, LiveKitCredentials};

#[derive(Parser, Debug)]
#[command(name = "room")]
struct Args {
    /// The LiveKit server (default: `LIVEKIT_URL`).
    #[arg(long, env = "LIVEKIT_URL")]
    url: Option<String>,
    /// An access token to join with; without it one is minted for `--room` from
    /// `LIVEKIT_API_KEY` and `LIVEKIT_API_SECRET`.
    #[arg(long)]
    token: Option<String>,
    /// The room to join, when minting the token.
    #[arg(long)]
    room: Option<String>,
    /// The agent's identity in the room, when minting the token.
    #[arg(long, default_value = "sublet-agent")]
    identity: String,
    #[command(flatten)]
    call: CallArgs,
}

fn run(args: Args) -> Result<()> {
    let (url, token, caller_room) = match (args.token.clone(), args.room.clone()) {
        (Some(_), _) if args.call.view.view.is_some() => {
            bail!("--view needs --room and LiveKit's key and secret, to mint the page's caller a token")
        }
        (Some(token), _) => match args.url {
            Some(url) => (url, token, CallerRoom::None),
            None => bail!("--token needs --url (or LIVEKIT_URL)"),
        },
        (None, Some(room)) => {
            let mut credentials = LiveKitCredentials::from_env()?;
            if let Some(url) = args.url {
                credentials.url = url;
            }
            let token = credentials.agent_token(&room, &args.identity)?;
            let url = credentials.url.clone();
            (url, token, CallerRoom::Fixed { credentials, room })
        }
        (None, None) => {
            bail!("give --url and --token, or --room NAME with LiveKit's environment variables")
        }
    };
    let (agent, runtime) = args.call.start("room")?;
    args.call.view.spawn(
        "room",
        runtime.handle(),
        &agent.engine,
        Some(&agent),
        caller_room,
    )?;
    eprintln!("room: joining {url}");
    let options = args.call.room_options();
    let fields = serde_json::Map::from_iter([("url".to_string(), url.clone().into())]);
    let log = args.call.records.open(
        "room",
        args.room.as_deref().unwrap_or("room"),
        &agent.cache.model_names(),
        fields,
    )?;
    eprintln!("room: this call's record: {}", log.path().display());
    // The call's end is written to the record by the call itself (`call_ended`).
    let mut recorded = Recorded::new(Progress::default(), log, None);
    let call = agent.answer_room(runtime.handle(), &url, &token, &options, &mut recorded)?;
    println!("{}", turn_table(&call.turns));
    eprintln!(
        "room: {} turns with {}; the call ended: {}",
        call.turns.len(),
        call.caller.as_deref().unwrap_or("nobody"),
        call.ended
    );
    Ok(())
}

fn main() -> ExitCode {
    sublet_demos::main("room", || run(Args::parse()))
}
