//! ONNX Runtime allows one environment per process; the VAD, the end-of-turn model and the
//! voice all share this one, loaded from the library setup placed in the cache.

use std::sync::OnceLock;

use ort::environment::Environment;

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
