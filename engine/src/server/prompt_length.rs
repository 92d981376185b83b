//! A prompt too long for the model, refused before the engine's thread sees it.
//!
//! The prompt's text is bounded first from its bytes alone (it surely fits when short and
//! cannot when long), then tokenized on a blocking worker; a prompt whose text alone takes
//! more tokens than the model holds gets OpenAI's `context_length_exceeded`. The count leaves out the chat template's few tokens a
//! message, so a prompt just over the limit still reaches the engine, which refuses it
//! exactly: this check only keeps the slow cases off the engine's thread.

use crate::{Prompt, TokenCounter};

use super::openai::{Api, ApiError};

/// `Err` if `prompt` cannot fit in `max_len` tokens.
pub(super) async fn check(
    counter: &TokenCounter,
    max_len: usize,
    prompt: &Prompt,
) -> Result<(), ApiError> {
    let texts: Vec<&str> = prompt.texts().collect();
    let text = texts.join("\n");
    // A token covers at least one byte (one more for a prefix the tokenizer may add):
    // a text this short fits without being tokenized here, as nearly every request does.
    if text.len() < max_len {
        return Ok(());
    }
    // Joins between messages may merge or split a token at each boundary.
    let limit = max_len + texts.len();
    let at_least = counter.at_least(&text);
    if at_least > limit {
        return Err(too_long(format!("at least {at_least}"), max_len, prompt));
    }
    let counter = counter.clone();
    let tokens = tokio::task::spawn_blocking(move || counter.count(&text))
        .await
        .map_err(|e| ApiError::server(format!("counting the prompt's tokens: {e}")))?;
    match tokens {
        Some(tokens) if tokens > limit => Err(too_long(tokens.to_string(), max_len, prompt)),
        _ => Ok(()),
    }
}

fn too_long(tokens: String, max_len: usize, prompt: &Prompt) -> ApiError {
    let (api, what) = match prompt {
        Prompt::Chat(_) => (Api::Chat, "the messages take"),
        Prompt::Text(_) => (Api::Text, "the prompt takes"),
    };
    ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::invalid(
            Some(api.prompt_field()),
            format!("{what} {tokens} tokens; this model takes at most {max_len}"),
        )
    }
}
