//! A prompt too long for the model, refused before the engine's thread sees it.
//!
//! Counted is everything the chat template renders: each message's content, the tool calls
//! an assistant message carries (names and arguments), and the tools offered (names,
//! descriptions, parameters as JSON). The text is bounded first from its bytes alone (it
//! surely fits when short and cannot when long), then tokenized on a blocking worker; a
//! prompt whose text alone takes more tokens than the model holds gets OpenAI's
//! `context_length_exceeded`. The count leaves out the chat template's few tokens a
//! message, so a prompt just over the limit still reaches the engine, which refuses it
//! exactly: this check only keeps the slow cases off the engine's thread.

use std::borrow::Cow;

use sublet_engine::{ChatRequest, Prompt, TokenCounter};

use super::error::ApiError;

/// `Err` if `request`'s prompt cannot fit in `max_len` tokens; `field` is the request's
/// field that holds the prompt, named in the refusal.
pub(super) async fn check(
    counter: &TokenCounter,
    max_len: usize,
    request: &ChatRequest,
    field: &'static str,
) -> Result<(), ApiError> {
    let texts = rendered_texts(request);
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
        return Err(too_long(
            format!("at least {at_least}"),
            max_len,
            request,
            field,
        ));
    }
    let counter = counter.clone();
    let tokens = tokio::task::spawn_blocking(move || counter.count(&text))
        .await
        .map_err(|e| ApiError::server(format!("counting the prompt's tokens: {e}")))?;
    match tokens {
        Some(tokens) if tokens > limit => {
            Err(too_long(tokens.to_string(), max_len, request, field))
        }
        _ => Ok(()),
    }
}

fn too_long(
    tokens: String,
    max_len: usize,
    request: &ChatRequest,
    field: &'static str,
) -> ApiError {
    let what = match &request.prompt {
        Prompt::Chat(_) if !request.tools.is_empty() => "the messages and tools take",
        Prompt::Chat(_) => "the messages take",
        Prompt::Text(_) => "the prompt takes",
    };
    ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::invalid(
            Some(field),
            format!("{what} {tokens} tokens; this model takes at most {max_len}"),
        )
    }
}

/// Tokens the chat template adds around each message, as an estimate (SmolLM2's and
/// Qwen's ChatML: `<|im_start|>`, the role, a newline, `<|im_end|>`, a newline).
const TEMPLATE_TOKENS_PER_MESSAGE: usize = 5;

/// `request`'s prompt in tokens, as Anthropic's `count_tokens` gives it: every text the
/// chat template renders, tokenized on a blocking worker, and an estimate of the
/// template's own tokens.
pub(super) async fn count(
    counter: &TokenCounter,
    request: &ChatRequest,
) -> Result<usize, ApiError> {
    let text = rendered_texts(request).join("\n");
    let messages = match &request.prompt {
        Prompt::Chat(messages) => messages.len(),
        Prompt::Text(_) => 0,
    };
    let counter = counter.clone();
    let tokens = tokio::task::spawn_blocking(move || counter.count(&text))
        .await
        .map_err(|e| ApiError::server(format!("counting the prompt's tokens: {e}")))?
        .ok_or_else(|| ApiError::server("the tokenizer failed on the prompt"))?;
    Ok(tokens + TEMPLATE_TOKENS_PER_MESSAGE * messages)
}

/// The texts of `request` that its chat template renders into the prompt.
fn rendered_texts(request: &ChatRequest) -> Vec<Cow<'_, str>> {
    let mut texts: Vec<Cow<'_, str>> = request.prompt.texts().map(Cow::Borrowed).collect();
    if let Prompt::Chat(messages) = &request.prompt {
        for call in messages.iter().flat_map(|m| &m.tool_calls) {
            texts.push(Cow::Borrowed(&call.name));
            texts.push(Cow::Borrowed(&call.arguments));
        }
    }
    for tool in &request.tools {
        texts.push(Cow::Borrowed(&tool.name));
        if let Some(description) = &tool.description {
            texts.push(Cow::Borrowed(description));
        }
        if let Some(parameters) = &tool.parameters {
            texts.push(Cow::Owned(
                serde_json::to_string(parameters).unwrap_or_default(),
            ));
        }
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;
    use sublet_engine::{Message, Role, Tool, ToolCall};

    fn checked(request: &ChatRequest) -> Result<(), ApiError> {
        // One token a byte: the count is the text's length.
        let counter = TokenCounter::new(|t| Some(t.len()), 1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(check(&counter, 1000, request, "messages"))
    }

    #[test]
    fn tools_and_tool_calls_count_toward_the_prompt() {
        let short = ChatRequest::new(vec![Message::new(Role::User, "hi")], 10);
        assert!(checked(&short).is_ok());
        let offered = ChatRequest {
            tools: vec![Tool {
                name: "f".into(),
                description: Some("d".repeat(2000)),
                parameters: None,
            }],
            ..short.clone()
        };
        let refused = checked(&offered).unwrap_err();
        assert_eq!(refused.code, Some("context_length_exceeded"));
        assert!(
            refused.message.contains("messages and tools"),
            "{}",
            refused.message
        );
        let mut called = Message::new(Role::Assistant, "");
        called.tool_calls.push(ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: "x".repeat(2000),
        });
        let calls = ChatRequest::new(vec![Message::new(Role::User, "hi"), called], 10);
        assert_eq!(
            checked(&calls).unwrap_err().code,
            Some("context_length_exceeded")
        );
    }
}
