//! The models a user brings (`--llm`, `--chat-template`, `--stt`, `--voice`, or their
//! environment variables), checked and made ready before a call or request is taken: a
//! hub id fetched, a CTranslate2 Whisper converted, each file read far enough to know the
//! engine and the speech models can run it. A file that cannot is refused with the flag
//! it came from.

use std::path::Path;

use sublet_engine::{check_chat_template, gguf_from_hub, inspect_gguf, GgufFacts};
use sublet_models::{LlmSource, ModelArgs, ModelCache, ModelChoice, ModelFlag, RefusedModel};

/// The model cache with the user's models in place of the bundled ones, each checked,
/// and the bundled ones still in use checked against their sha256.
pub fn choose(args: &ModelArgs) -> anyhow::Result<ModelCache> {
    let cache = choose_in(ModelCache::from_env(), args)?;
    cache.verify_bundled()?;
    Ok(cache)
}

/// [`choose`] over a given cache.
pub fn choose_in(cache: ModelCache, args: &ModelArgs) -> Result<ModelCache, RefusedModel> {
    let mut choice = ModelChoice::default();
    if let Some(template) = &args.chat_template {
        check_chat_template(template)
            .map_err(|why| RefusedModel::new(ModelFlag::ChatTemplate, template.display(), why))?;
        choice.chat_template = Some(template.clone());
    }
    if let Some(given) = &args.llm {
        let refuse = |why: String| RefusedModel::new(ModelFlag::Llm, given, why);
        let path = match LlmSource::parse(given) {
            LlmSource::File(path) => path,
            LlmSource::Hub { repo, file } => {
                gguf_from_hub(&repo, file.as_deref()).map_err(refuse)?
            }
        };
        check_llm(&path, choice.chat_template.is_some()).map_err(refuse)?;
        choice.llm = Some(path);
    }
    if let Some(given) = &args.stt {
        let ggml = sublet_stt::prepare_model(given, &cache)
            .map_err(|why| RefusedModel::new(ModelFlag::Stt, given.display(), why))?;
        choice.stt = Some(ggml);
    }
    let voice = args.voice.clone();
    choice.voice = voice.clone();
    let cache = cache.with_choice(choice);
    if let Some(given) = voice {
        check_voice(&given, &cache)
            .map_err(|why| RefusedModel::new(ModelFlag::Voice, given.display(), why))?;
    }
    Ok(cache)
}

/// What the engine will find in a GGUF, or why it cannot serve it.
pub fn check_llm(path: &Path, template_given: bool) -> Result<GgufFacts, String> {
    inspect_gguf(path, template_given).map_err(|problem| problem.to_string())
}

fn check_voice(given: &Path, cache: &ModelCache) -> Result<(), String> {
    if !given.is_file() {
        return Err("no such file".into());
    }
    sublet_tts::check_voice(cache).map_err(|e| format!("{e:#}"))
}
