//! Where the agent finds its LiveKit server, and the access tokens it mints for itself.

use std::time::Duration;

use anyhow::{Context, Result};
use livekit_api::access_token::{AccessToken, VideoGrants};

/// What an agent may do in `room`: publish, subscribe, send data and set its own
/// attributes (`lk.agent.state`), as LiveKit's server grants a dispatched agent.
pub fn agent_grants(room: &str) -> VideoGrants {
    VideoGrants {
        room_join: true,
        room: room.into(),
        can_publish: Some(true),
        can_subscribe: Some(true),
        can_publish_data: Some(true),
        can_update_own_metadata: Some(true),
        agent: true,
        ..Default::default()
    }
}

/// A LiveKit server and the API key the agent signs its tokens with.
#[derive(Debug, Clone)]
pub struct LiveKitCredentials {
    pub url: String,
    pub api_key: String,
    pub api_secret: String,
}

impl LiveKitCredentials {
    /// From `LIVEKIT_URL`, `LIVEKIT_API_KEY` and `LIVEKIT_API_SECRET`, as LiveKit's own tools.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| {
            std::env::var(name).with_context(|| {
                format!(
                    "{name} is not set (the LiveKit server's URL, API key and secret are needed)"
                )
            })
        };
        Ok(Self {
            url: var("LIVEKIT_URL")?,
            api_key: var("LIVEKIT_API_KEY")?,
            api_secret: var("LIVEKIT_API_SECRET")?,
        })
    }

    /// A token for the agent to join `room` as `identity`: it may publish, subscribe, send
    /// data and set its own attributes (`lk.agent.state`).
    pub fn agent_token(&self, room: &str, identity: &str) -> Result<String> {
        AccessToken::with_api_key(&self.api_key, &self.api_secret)
            .with_identity(identity)
            .with_name("Sublet")
            .with_kind("agent")
            .with_ttl(Duration::from_secs(6 * 3600))
            .with_grants(agent_grants(room))
            .to_jwt()
            .context("signing the agent's access token")
    }

    /// A token for a caller to join `room` as `identity` (a browser, say): publish,
    /// subscribe and send data, for an hour.
    pub fn caller_token(&self, room: &str, identity: &str) -> Result<String> {
        AccessToken::with_api_key(&self.api_key, &self.api_secret)
            .with_identity(identity)
            .with_ttl(Duration::from_secs(3600))
            .with_grants(VideoGrants {
                room_join: true,
                room: room.into(),
                can_publish: Some(true),
                can_subscribe: Some(true),
                can_publish_data: Some(true),
                ..Default::default()
            })
            .to_jwt()
            .context("signing the caller's access token")
    }

    /// A token to register as an agent worker at `<url>/agent`: the `agent` grant, no room.
    pub fn worker_token(&self) -> Result<String> {
        AccessToken::with_api_key(&self.api_key, &self.api_secret)
            .with_ttl(Duration::from_secs(6 * 3600))
            .with_grants(VideoGrants {
                agent: true,
                ..Default::default()
            })
            .to_jwt()
            .context("signing the worker's access token")
    }

    /// `<url>/agent`, where workers register.
    pub fn worker_url(&self) -> String {
        format!("{}/agent", self.url.trim_end_matches('/'))
    }
}
