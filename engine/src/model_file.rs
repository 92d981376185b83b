//! A GGUF a user brings, looked at before the engine loads it: refused at start with a
//! reason (not a GGUF, cut short, an architecture or tensor type the engine cannot run, no
//! tokenizer, no chat template) instead of failing or aborting at load or at the first
//! request, and what it says of itself.
//!
//! The header is walked here, every length checked against the file's size, before
//! candle's reader sees it: candle allocates whatever a length field says, so a corrupt
//! file could abort the process.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The architectures mistral.rs 0.8.1 loads from a GGUF (`pipeline/gguf.rs`).
pub const GGUF_ARCHITECTURES: &[&str] = &[
    "llama",
    "mistral3",
    "phi2",
    "phi3",
    "starcoder2",
    "qwen2",
    "qwen3",
    "qwen3moe",
];

/// What a GGUF says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufFacts {
    /// `general.architecture`, lowercased.
    pub architecture: String,
    /// `general.name`, if set.
    pub name: Option<String>,
    /// Its chat template (`tokenizer.chat_template`), if it carries one.
    pub chat_template: Option<String>,
    pub tensors: usize,
}

/// Why a GGUF cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufProblem {
    #[error("no such file")]
    NoFile,
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("not a GGUF file (it starts with {0:?}, not \"GGUF\")")]
    NotGguf(String),
    #[error("GGUF version {0} is not supported (2 or 3)")]
    Version(u32),
    #[error("corrupt GGUF header: {0}")]
    Corrupt(String),
    #[error("cut short: its tensors need {needs} bytes, the file has {has}")]
    Truncated { needs: u64, has: u64 },
    #[error(
        "architecture {0:?} is not one the engine loads from GGUF ({list})",
        list = GGUF_ARCHITECTURES.join(", ")
    )]
    Architecture(String),
    #[error("tensor {name} is of ggml type {kind}, which the engine does not run")]
    TensorType { name: String, kind: u32 },
    #[error("it holds no weights (a tokenizer-only GGUF)")]
    NoWeights,
    #[error("it carries no tokenizer (tokenizer.ggml.tokens)")]
    NoTokenizer,
    #[error("it carries no chat template: give one with --chat-template FILE (.jinja, or .json with a chat_template field)")]
    NoChatTemplate,
}

/// Reads `path`'s header and checks that the engine can serve it; `chat_template_given`
/// says a template comes from elsewhere.
pub fn inspect_gguf(path: &Path, chat_template_given: bool) -> Result<GgufFacts, GgufProblem> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => GgufProblem::NoFile,
        _ => GgufProblem::Unreadable(e.to_string()),
    })?;
    let len = file
        .metadata()
        .map_err(|e| GgufProblem::Unreadable(e.to_string()))?
        .len();
    if path.is_dir() {
        return Err(GgufProblem::Unreadable("it is a folder".into()));
    }
    let mut header = Header {
        reader: BufReader::with_capacity(1 << 20, file),
        at: 0,
        len,
    };
    let magic = header
        .bytes(4)
        .map_err(|_| GgufProblem::NotGguf(String::new()))?;
    if magic != b"GGUF" {
        return Err(GgufProblem::NotGguf(
            String::from_utf8_lossy(&magic).into_owned(),
        ));
    }
    let version = header.u32()?;
    if !(2..=3).contains(&version) {
        return Err(GgufProblem::Version(version));
    }
    let tensor_count = header.count(8 + 4 + 8 + 4)?;
    let kv_count = header.count(8 + 4 + 1)?;
    let mut facts = GgufFacts {
        architecture: String::new(),
        name: None,
        chat_template: None,
        tensors: tensor_count,
    };
    let mut alignment = 32u64;
    let mut has_tokens = false;
    for _ in 0..kv_count {
        let key = header.string()?;
        let kind = header.u32()?;
        match (key.as_str(), kind) {
            ("general.architecture", STRING) => {
                facts.architecture = header.string()?.to_ascii_lowercase()
            }
            ("general.name", STRING) => facts.name = Some(header.string()?),
            ("general.alignment", U32) => alignment = u64::from(header.u32()?.max(1)),
            ("tokenizer.chat_template", STRING) => {
                facts.chat_template = Some(header.string()?).filter(|t| !t.trim().is_empty())
            }
            ("tokenizer.ggml.tokens", ARRAY) => {
                has_tokens = header.skip_array()? > 0;
            }
            _ => header.skip_value(kind)?,
        }
    }
    let mut tensors = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name = header.string()?;
        let dims = header.u32()?;
        if dims > 4 {
            return Err(GgufProblem::Corrupt(format!(
                "tensor {name} has {dims} dimensions"
            )));
        }
        let mut elements = 1u64;
        for _ in 0..dims {
            elements = elements
                .checked_mul(header.u64()?)
                .ok_or_else(|| GgufProblem::Corrupt(format!("tensor {name} is too large")))?;
        }
        let kind = header.u32()?;
        let offset = header.u64()?;
        tensors.push((name, elements, kind, offset));
    }
    let data_start = header.at.div_ceil(alignment) * alignment;
    let mut needs = 0;
    for (name, elements, kind, offset) in tensors {
        let Some((block, bytes)) = ggml_type_size(kind) else {
            return Err(GgufProblem::TensorType { name, kind });
        };
        let size = elements.div_ceil(block).saturating_mul(bytes);
        needs = needs.max(data_start.saturating_add(offset).saturating_add(size));
    }
    if needs > len {
        return Err(GgufProblem::Truncated { needs, has: len });
    }
    if !GGUF_ARCHITECTURES.contains(&facts.architecture.as_str()) {
        return Err(GgufProblem::Architecture(facts.architecture));
    }
    if !has_tokens {
        return Err(GgufProblem::NoTokenizer);
    }
    if facts.chat_template.is_none() && !chat_template_given {
        return Err(GgufProblem::NoChatTemplate);
    }
    if facts.tensors == 0 {
        return Err(GgufProblem::NoWeights);
    }
    Ok(facts)
}

/// The text of a chat template file (a Jinja file, or a JSON file's `chat_template`).
pub fn read_chat_template(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str::<serde_json::Value>(&text)
            .ok()?
            .get("chat_template")?
            .as_str()
            .map(str::to_string),
        _ => Some(text),
    }
}

/// Whether a chat template renders a system message: Gemma's refuses one outright.
pub fn takes_system_role(template: &str) -> bool {
    template.contains("system") && !template.contains("System role not supported")
}

/// Whether the model's template (the file given, else the GGUF's) renders system
/// messages; with neither known, it is taken to.
pub(crate) fn system_role(given: Option<&Path>, facts: Option<GgufFacts>) -> bool {
    let template = match given {
        Some(path) => read_chat_template(path),
        None => facts.and_then(|facts| facts.chat_template),
    };
    template.as_deref().is_none_or(takes_system_role)
}

/// Whether mistral.rs's model for this GGUF decodes sequences of different lengths in one
/// forward pass, and runs mixed passes: its llama, qwen2 and qwen3 models do (patches 5
/// and 24 of the series, 25 for the qwen models), the others batch only sequences
/// of equal length.
pub(crate) fn batches_unequal_lengths(facts: Option<&GgufFacts>) -> bool {
    facts.is_some_and(|facts| {
        matches!(
            facts.architecture.as_str(),
            "llama" | "mistral3" | "qwen2" | "qwen3"
        )
    })
}

/// Checks a chat template file given for a GGUF: a Jinja template, or a JSON file with a
/// `chat_template` string (a Hugging Face `tokenizer_config.json`).
pub fn check_chat_template(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("jinja") if !text.trim().is_empty() => Ok(()),
        Some("jinja") => Err("the template is empty".into()),
        Some("json") => {
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
            match value.get("chat_template") {
                Some(serde_json::Value::String(t)) if !t.trim().is_empty() => Ok(()),
                _ => Err("the JSON holds no chat_template string".into()),
            }
        }
        _ => Err("a chat template file must end in .jinja or .json".into()),
    }
}

const U32: u32 = 4;
const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// (elements per block, bytes per block) of the ggml tensor types candle reads.
fn ggml_type_size(kind: u32) -> Option<(u64, u64)> {
    Some(match kind {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

/// The header read in order, each length checked against what the file has left.
struct Header {
    reader: BufReader<File>,
    at: u64,
    len: u64,
}

impl Header {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, GgufProblem> {
        if n > self.len.saturating_sub(self.at) {
            return Err(GgufProblem::Truncated {
                needs: self.at.saturating_add(n),
                has: self.len,
            });
        }
        let mut buf = vec![0u8; n as usize];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| GgufProblem::Unreadable(e.to_string()))?;
        self.at += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64) -> Result<(), GgufProblem> {
        if n > self.len.saturating_sub(self.at) {
            return Err(GgufProblem::Truncated {
                needs: self.at.saturating_add(n),
                has: self.len,
            });
        }
        std::io::copy(&mut (&mut self.reader).take(n), &mut std::io::sink())
            .map_err(|e| GgufProblem::Unreadable(e.to_string()))?;
        self.at += n;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, GgufProblem> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, GgufProblem> {
        let b = self.bytes(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("eight bytes")))
    }

    /// A count of items each at least `min_bytes` long, which the file must have room for.
    fn count(&mut self, min_bytes: u64) -> Result<usize, GgufProblem> {
        let n = self.u64()?;
        if n.saturating_mul(min_bytes) > self.len.saturating_sub(self.at) {
            return Err(GgufProblem::Corrupt(format!(
                "a count of {n} does not fit the file"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, GgufProblem> {
        let n = self.u64()?;
        let bytes = self.bytes(n)?;
        String::from_utf8(bytes).map_err(|_| GgufProblem::Corrupt("a string is not UTF-8".into()))
    }

    fn skip_value(&mut self, kind: u32) -> Result<(), GgufProblem> {
        match kind {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4..=6 => self.skip(4),
            10..=12 => self.skip(8),
            STRING => {
                let n = self.u64()?;
                self.skip(n)
            }
            ARRAY => self.skip_array().map(|_| ()),
            other => Err(GgufProblem::Corrupt(format!("unknown value type {other}"))),
        }
    }

    /// Skips an array; its length.
    fn skip_array(&mut self) -> Result<u64, GgufProblem> {
        let kind = self.u32()?;
        let fixed = match kind {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        let n = self.u64()?;
        match fixed {
            Some(size) => self.skip(n.saturating_mul(size))?,
            None => {
                if n.saturating_mul(8) > self.len.saturating_sub(self.at) {
                    return Err(GgufProblem::Corrupt(format!(
                        "an array of {n} does not fit the file"
                    )));
                }
                for _ in 0..n {
                    self.skip_value(kind)?;
                }
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("sublet-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A GGUF header with `kvs` string entries and no tensors.
    fn header(kvs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (key, value) in kvs {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(STRING.to_le_bytes());
            out.extend((value.len() as u64).to_le_bytes());
            out.extend(value.as_bytes());
        }
        out
    }

    #[test]
    fn files_that_cannot_be_served_are_refused_with_their_reason() {
        let missing = std::env::temp_dir().join("sublet-no-such.gguf");
        assert_eq!(inspect_gguf(&missing, false), Err(GgufProblem::NoFile));

        let text = temp("text.gguf", b"hello, I am not a model");
        assert!(matches!(inspect_gguf(&text, false), Err(GgufProblem::NotGguf(m)) if m == "hell"));

        // A length field far past the file's end: refused, never allocated.
        let mut absurd = b"GGUF".to_vec();
        absurd.extend(3u32.to_le_bytes());
        absurd.extend(0u64.to_le_bytes());
        absurd.extend(1u64.to_le_bytes());
        absurd.extend(u64::MAX.to_le_bytes());
        absurd.extend([0u8; 16]);
        let absurd = temp("absurd.gguf", &absurd);
        assert!(matches!(
            inspect_gguf(&absurd, false),
            Err(GgufProblem::Truncated { .. })
        ));

        let gemma = temp("gemma.gguf", &header(&[("general.architecture", "gemma3")]));
        assert_eq!(
            inspect_gguf(&gemma, false),
            Err(GgufProblem::Architecture("gemma3".into()))
        );
        let no_tokens = temp("notok.gguf", &header(&[("general.architecture", "qwen2")]));
        assert_eq!(
            inspect_gguf(&no_tokens, false),
            Err(GgufProblem::NoTokenizer)
        );
        for path in [text, absurd, gemma, no_tokens] {
            std::fs::remove_file(path).ok();
        }
    }

    #[test]
    fn a_chat_template_file_must_hold_a_template() {
        let jinja = temp(
            "t.jinja",
            b"{% for m in messages %}{{ m.content }}{% endfor %}",
        );
        let json = temp("t.json", br#"{"chat_template": "{{ messages }}"}"#);
        let empty_json = temp("e.json", br#"{"bos_token": "<s>"}"#);
        let txt = temp("t.txt", b"{{ messages }}");
        assert_eq!(check_chat_template(&jinja), Ok(()));
        assert_eq!(check_chat_template(&json), Ok(()));
        assert!(check_chat_template(&empty_json).is_err());
        assert!(check_chat_template(&txt).is_err());
        for path in [jinja, json, empty_json, txt] {
            std::fs::remove_file(path).ok();
        }
    }
}
