//! A prompt's length in tokens, told off the engine's thread.
//!
//! mistral.rs applies the chat template and tokenizes a request on its own thread, the one
//! that runs every forward pass: a prompt of megabytes held every voice turn for a second
//! or more before it was refused. The server asks a [`TokenCounter`] first, on a thread
//! of its own, and refuses a prompt that cannot fit before the engine sees it.

use std::sync::Arc;

/// Tokenizes a text and counts its tokens (`None` if the tokenizer failed).
type Count = dyn Fn(&str) -> Option<usize> + Send + Sync;
/// The tokenizer as Hugging Face's `tokenizer.json` text.
type ToJson = dyn Fn() -> Option<String> + Send + Sync;

/// Counts a text's tokens with the model's own tokenizer, on the calling thread.
#[derive(Clone)]
pub struct TokenCounter {
    count: Arc<Count>,
    to_json: Option<Arc<ToJson>>,
    /// Bytes of the longest token's text, doubled: a text of n bytes takes at least
    /// n / this many tokens (the margin covers normalizers that shorten a text).
    bytes_per_token_bound: usize,
}

impl TokenCounter {
    /// `count` tokenizes a text (without special tokens); `longest_token_bytes` is the
    /// longest vocabulary entry's length in bytes.
    pub fn new(
        count: impl Fn(&str) -> Option<usize> + Send + Sync + 'static,
        longest_token_bytes: usize,
    ) -> Self {
        Self {
            count: Arc::new(count),
            to_json: None,
            bytes_per_token_bound: 2 * longest_token_bytes.max(1),
        }
    }

    /// The counter that can also write its tokenizer out (see [`Self::tokenizer_json`]).
    pub(crate) fn with_json(
        mut self,
        to_json: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.to_json = Some(Arc::new(to_json));
        self
    }

    /// The model's tokenizer as a `tokenizer.json` text, for tools outside the process
    /// that must count tokens as the engine does (AIPerf sizes its prompts with it).
    pub fn tokenizer_json(&self) -> Option<String> {
        self.to_json.as_ref().and_then(|f| f())
    }

    /// The fewest tokens `text` can take, from its length alone (no tokenizing).
    pub fn at_least(&self, text: &str) -> usize {
        text.len().div_ceil(self.bytes_per_token_bound)
    }

    /// The tokens `text` takes, or `None` if the tokenizer failed on it. Slow for long
    /// texts (a 100 KB prompt's refusal took 61-70 ms here): call it off any thread that
    /// must stay quick.
    pub fn count(&self, text: &str) -> Option<usize> {
        (self.count)(text)
    }
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("bytes_per_token_bound", &self.bytes_per_token_bound)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_from_bytes_never_exceeds_the_count() {
        // One token a word of up to 5 bytes: the bound takes 10 bytes a token.
        let counter = TokenCounter::new(|t| Some(t.split_whitespace().count()), 5);
        for text in ["", "a", "hello", "hello world", &"word ".repeat(1000)] {
            assert!(
                counter.at_least(text) <= counter.count(text).unwrap(),
                "{text:?}"
            );
        }
        assert_eq!(counter.at_least(&"x".repeat(95)), 10);
    }
}
