//! ONNX Runtime allows one environment per process; the VAD, the end-of-turn model and the
//! voice all share this one, loaded from the library setup placed in the cache.

use std::path::Path;
use std::sync::OnceLock;

use ort::environment::Environment;
use ort::session::Session;

use crate::ModelCache;

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// The process-wide ONNX Runtime environment, created on first use.
pub fn onnx_environment(cache: &ModelCache) -> Result<&'static Environment, String> {
    ENVIRONMENT
        .get_or_init(|| {
            let library = cache.onnx_runtime().map_err(|e| e.to_string())?;
            ort::init_from(&library)
                .map_err(|e| format!("cannot load ONNX Runtime from {}: {e}", library.display()))?
                .with_name("sublet")
                .build()
                .map_err(|e| format!("cannot start ONNX Runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A session for the model at `path` on `intra_threads` threads that sleep when idle.
///
/// ONNX Runtime's threads spin-wait between runs by default; beside an engine that keeps
/// every core busy, two pipelines' spinning threads starved each other (a 0.25 s
/// transcript took 5 s in the bench), so spinning is off for every model here.
pub fn onnx_session(
    cache: &ModelCache,
    path: &Path,
    intra_threads: usize,
) -> Result<Session, String> {
    let env = onnx_environment(cache)?;
    let fail = |e: &dyn std::fmt::Display| format!("loading {}: {e}", path.display());
    Session::builder(env)
        .map_err(|e| fail(&e))?
        .with_intra_threads(intra_threads)
        .map_err(|e| fail(&e))?
        .with_intra_op_spinning(false)
        .map_err(|e| fail(&e))?
        .with_inter_op_spinning(false)
        .map_err(|e| fail(&e))?
        .commit_from_file(path)
        .map_err(|e| fail(&e))
}
