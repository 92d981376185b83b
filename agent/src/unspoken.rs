//! What a model writes that is not for the caller's ears: a reasoning block
//! (`<think>…</think>`, Qwen3's and the reasoning distills') is dropped from the reply as it
//! streams, before the sentence splitter, so the voice never reads it out even when the
//! template's switch to turn thinking off is missing or ignored. Pure.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Filters a streamed reply, a chunk at a time; tags may be split across chunks.
#[derive(Debug, Default, Clone)]
pub struct Unspoken {
    /// Inside a reasoning block.
    thinking: bool,
    /// The end of the last chunk, held while it may be the start of a tag.
    held: String,
}

impl Unspoken {
    /// The part of `text` (after whatever was held) the caller may hear.
    pub fn filter(&mut self, text: &str) -> String {
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(text);
        let mut out = String::new();
        loop {
            let tag = if self.thinking { CLOSE } else { OPEN };
            match rest.find(tag) {
                Some(at) => {
                    if !self.thinking {
                        out.push_str(&rest[..at]);
                    }
                    rest = rest[at + tag.len()..].to_string();
                    self.thinking = !self.thinking;
                }
                None => {
                    let keep = partial_tag_len(&rest, tag);
                    let (done, held) = rest.split_at(rest.len() - keep);
                    if !self.thinking {
                        out.push_str(done);
                    }
                    self.held = held.to_string();
                    return out;
                }
            }
        }
    }
}

/// How many bytes at the end of `text` begin `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.is_char_boundary(text.len().saturating_sub(n)) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(chunks: &[&str]) -> String {
        let mut filter = Unspoken::default();
        chunks.iter().map(|c| filter.filter(c)).collect()
    }

    #[test]
    fn a_reasoning_block_is_never_heard_wherever_the_chunks_split_it() {
        let reply =
            "<think>\nThe caller wants a room on the 14th.\n</think>\n\nCertainly, the 14th.";
        let want = "\n\nCertainly, the 14th.";
        assert_eq!(heard(&[reply]), want);
        // Every split into two chunks, and one character at a time.
        for at in 1..reply.len() {
            assert_eq!(heard(&[&reply[..at], &reply[at..]]), want, "split at {at}");
        }
        let chars: Vec<String> = reply.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(heard(&chars), want);
    }

    #[test]
    fn plain_text_and_a_lone_angle_bracket_pass_through() {
        assert_eq!(
            heard(&["Two is < three, ", "and <b> stays."]),
            "Two is < three, and <b> stays."
        );
        // Held while it may begin a tag, released when it does not.
        let mut filter = Unspoken::default();
        assert_eq!(filter.filter("a <thi"), "a ");
        assert_eq!(filter.filter("s"), "<this");
    }
}
