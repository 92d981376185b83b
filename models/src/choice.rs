//! The models a user brings instead of the bundled ones: what they asked for on the command
//! line or in the environment ([`ModelArgs`]), the files that became of it ([`ModelChoice`],
//! which [`crate::ModelCache`] hands out in the bundled files' place), and why a file was
//! refused ([`RefusedModel`], naming the flag).
//!
//! Checking a file is each runtime crate's business (the engine reads a GGUF, the speech
//! crates a Whisper or Piper file); `sublet_agent::models` runs the checks in order.

use std::fmt;
use std::path::{Path, PathBuf};

/// What the user asked for: `--llm`, `--chat-template`, `--stt`, `--voice`, or their
/// environment variables. Unset fields keep the bundled model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ModelArgs {
    /// The LLM: a GGUF file, or a Hugging Face model id with its file
    /// (`OWNER/NAME:FILE.gguf`; `HF_TOKEN` for gated models). Default: the bundled
    /// SmolLM2-135M-Instruct.
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "SUBLET_LLM", value_name = "GGUF|HUB_ID")
    )]
    pub llm: Option<String>,
    /// A chat template (a Jinja file, or a JSON file with a `chat_template` field) for a
    /// GGUF that carries none.
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "SUBLET_CHAT_TEMPLATE", value_name = "FILE")
    )]
    pub chat_template: Option<PathBuf>,
    /// Speech to text: a whisper.cpp ggml file, or a CTranslate2 Whisper folder (converted
    /// into the model cache on first use). Default: the bundled Whisper tiny.en.
    #[cfg_attr(
        feature = "cli",
        arg(long, env = "SUBLET_STT", value_name = "GGML|CT2_DIR")
    )]
    pub stt: Option<PathBuf>,
    /// The agent's voice: a Piper `.onnx` with its `.onnx.json` beside it. Default: the
    /// bundled en_US joe.
    #[cfg_attr(feature = "cli", arg(long, env = "SUBLET_VOICE", value_name = "ONNX"))]
    pub voice: Option<PathBuf>,
}

/// What the LLM flag names: a file here, or a model on the Hugging Face hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmSource {
    File(PathBuf),
    Hub { repo: String, file: Option<String> },
}

impl LlmSource {
    /// A path that exists, ends in `.gguf` or starts like a path is a file; `OWNER/NAME`
    /// (with `:FILE` after it, optionally) is a hub id.
    pub fn parse(given: &str) -> Self {
        let path = Path::new(given);
        let (head, file) = match given.split_once(':') {
            Some((head, file)) => (head, Some(file).filter(|f| !f.is_empty())),
            None => (given, None),
        };
        let hub_like = head.split('/').count() == 2
            && !head.ends_with(".gguf")
            && !given.starts_with(['/', '.', '~']);
        if path.exists() || !hub_like {
            return Self::File(path.to_path_buf());
        }
        Self::Hub {
            repo: head.to_string(),
            file: file.map(str::to_string),
        }
    }
}

/// The files in use where the bundled ones are not, once checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelChoice {
    /// A local GGUF (a hub model once downloaded).
    pub llm: Option<PathBuf>,
    /// The chat template given for it.
    pub chat_template: Option<PathBuf>,
    /// A whisper.cpp ggml file (a CTranslate2 folder once converted).
    pub stt: Option<PathBuf>,
    /// A Piper `.onnx`; its `.onnx.json` lies beside it.
    pub voice: Option<PathBuf>,
}

/// The flags a model comes from, as the user typed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFlag {
    Llm,
    ChatTemplate,
    Stt,
    Voice,
}

impl ModelFlag {
    pub fn flag(self) -> &'static str {
        match self {
            Self::Llm => "--llm",
            Self::ChatTemplate => "--chat-template",
            Self::Stt => "--stt",
            Self::Voice => "--voice",
        }
    }

    pub fn env(self) -> &'static str {
        match self {
            Self::Llm => "SUBLET_LLM",
            Self::ChatTemplate => "SUBLET_CHAT_TEMPLATE",
            Self::Stt => "SUBLET_STT",
            Self::Voice => "SUBLET_VOICE",
        }
    }
}

impl fmt::Display for ModelFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag())
    }
}

/// A model refused at start, before any call or request is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedModel {
    pub flag: ModelFlag,
    /// What was given, as given.
    pub given: String,
    pub why: String,
}

impl RefusedModel {
    pub fn new(flag: ModelFlag, given: impl fmt::Display, why: impl fmt::Display) -> Self {
        Self {
            flag,
            given: given.to_string(),
            why: why.to_string(),
        }
    }
}

impl fmt::Display for RefusedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {} (from {} or ${})",
            self.flag,
            self.given,
            self.why,
            self.flag,
            self.flag.env()
        )
    }
}

impl std::error::Error for RefusedModel {}

/// A model's name for records and `/v1/models`: its file's stem.
pub fn model_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    for suffix in [".gguf", ".onnx", ".bin"] {
        if let Some(stem) = name.strip_suffix(suffix) {
            return stem.to_string();
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_llm_flag_is_a_file_or_a_hub_id() {
        assert_eq!(
            LlmSource::parse("models/tiny.gguf"),
            LlmSource::File("models/tiny.gguf".into())
        );
        assert_eq!(
            LlmSource::parse("/no/such/model"),
            LlmSource::File("/no/such/model".into())
        );
        assert_eq!(
            LlmSource::parse("Qwen/Qwen2.5-1.5B-Instruct-GGUF:qwen2.5-1.5b-instruct-q4_k_m.gguf"),
            LlmSource::Hub {
                repo: "Qwen/Qwen2.5-1.5B-Instruct-GGUF".into(),
                file: Some("qwen2.5-1.5b-instruct-q4_k_m.gguf".into())
            }
        );
        assert_eq!(
            LlmSource::parse("bartowski/Llama-3.2-1B-Instruct-GGUF"),
            LlmSource::Hub {
                repo: "bartowski/Llama-3.2-1B-Instruct-GGUF".into(),
                file: None
            }
        );
        assert_eq!(LlmSource::parse("model"), LlmSource::File("model".into()));
    }

    #[test]
    fn a_refusal_names_the_flag_and_its_variable() {
        let refused = RefusedModel::new(ModelFlag::Stt, "/x.bin", "not a whisper.cpp file");
        assert_eq!(
            refused.to_string(),
            "--stt /x.bin: not a whisper.cpp file (from --stt or $SUBLET_STT)"
        );
        assert_eq!(
            model_name(Path::new("/m/Qwen2.5-0.5B.Q4_K_M.gguf")),
            "Qwen2.5-0.5B.Q4_K_M"
        );
    }
}
