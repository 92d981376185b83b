//! Cuts a reply streaming in token by token into sentences, releasing each one the moment
//! it is known to be complete, so the first can be spoken while the rest is generated.
//!
//! A sentence ends at `.`, `!` or `?` (with any closing quotes or brackets) followed by
//! whitespace, or at a line break. Not an end: a decimal point ("3.5"), a known abbreviation
//! ("Dr.", "e.g."), a single initial ("J."), a list number ("1."), or a fragment too short
//! to say on its own (it is joined to the next sentence instead).

/// Shortest sentence (in letters and digits) released on its own.
const MIN_CHARS: usize = 4;

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no",
    "fig", "inc", "ltd", "co", "mt", "ave", "u.s", "a.m", "p.m",
];

#[derive(Debug, Default)]
pub struct SentenceSplitter {
    buffer: String,
}

impl SentenceSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds streamed text; returns the sentences it completed, in order.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.buffer.push_str(text);
        let mut out = Vec::new();
        let mut start_search = 0;
        while let Some(cut) = self.find_boundary(start_search) {
            let sentence = self.buffer[..cut].trim().to_string();
            if letters(&sentence) >= MIN_CHARS {
                out.push(sentence);
                self.buffer.drain(..cut);
                start_search = 0;
            } else {
                start_search = cut;
            }
        }
        out
    }

    /// The text left when the reply ends, if any is worth saying.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buffer);
        let rest = rest.trim();
        (letters(rest) > 0).then(|| rest.to_string())
    }

    /// Byte index just past the first sentence end at or after `from`, if one is certain.
    fn find_boundary(&self, from: usize) -> Option<usize> {
        let text = &self.buffer;
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for (k, &(i, c)) in chars.iter().enumerate() {
            if i < from {
                continue;
            }
            if c == '\n' {
                return Some(i + 1);
            }
            if !matches!(c, '.' | '!' | '?') {
                continue;
            }
            // Take closing punctuation with the sentence.
            let mut end = k + 1;
            while end < chars.len()
                && matches!(
                    chars[end].1,
                    '"' | '\'' | ')' | ']' | '”' | '’' | '.' | '!' | '?'
                )
            {
                end += 1;
            }
            let Some(&(_, next)) = chars.get(end) else {
                return None; // wait: the next character decides
            };
            if !next.is_whitespace() {
                continue; // "3.5", "e.g", "U.S."
            }
            if c == '.' && !ends_sentence(&text[..i]) {
                continue;
            }
            return Some(chars.get(end).map_or(text.len(), |&(j, _)| j));
        }
        None
    }
}

/// Whether a period after `before` can end a sentence.
fn ends_sentence(before: &str) -> bool {
    let word = before
        .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '"')
        .next()
        .unwrap_or("");
    let lower = word.to_lowercase();
    if ABBREVIATIONS.contains(&lower.as_str()) {
        return false;
    }
    let alnum: Vec<char> = word.chars().filter(|c| c.is_alphanumeric()).collect();
    // A single initial ("J.") or a list number ("1.", "12.") opening a line or the reply.
    if alnum.len() == 1 && alnum[0].is_uppercase() {
        return false;
    }
    if !alnum.is_empty() && alnum.iter().all(|c| c.is_ascii_digit()) {
        let head = before[..before.len() - word.len()].trim_end_matches([' ', '\t']);
        if head.is_empty() || head.ends_with('\n') {
            return false;
        }
    }
    true
}

fn letters(s: &str) -> usize {
    s.chars().filter(|c| c.is_alphanumeric()).count()
}

/// Which of a reply's sentences are spoken: at most `max_sentences`, and none from the
/// first one that repeats a sentence the reply already said (a small model looping, "You're
/// welcome. … You're welcome."). Either ends the reply: its generation is cancelled.
#[derive(Debug)]
pub struct ReplyLimit {
    max_sentences: usize,
    /// The sentences said so far, lowercased letters and digits only.
    said: Vec<String>,
}

impl ReplyLimit {
    pub fn new(max_sentences: usize) -> Self {
        Self {
            max_sentences,
            said: Vec::new(),
        }
    }

    /// Whether to speak `sentence`; `false` ends the reply.
    pub fn admit(&mut self, sentence: &str) -> bool {
        let key: String = sentence
            .chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect();
        if self.full() || self.said.contains(&key) {
            return false;
        }
        self.said.push(key);
        true
    }

    /// Whether the reply has said all it may.
    pub fn full(&self) -> bool {
        self.said.len() >= self.max_sentences
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `text` in small pieces and returns every sentence released.
    fn split(text: &str, piece: usize) -> Vec<String> {
        let mut s = SentenceSplitter::new();
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for chunk in chars.chunks(piece) {
            out.extend(s.push(&chunk.iter().collect::<String>()));
        }
        out.extend(s.finish());
        out
    }

    #[test]
    fn releases_sentences_as_they_complete() {
        let mut s = SentenceSplitter::new();
        assert!(s.push("The capital of France is Paris").is_empty());
        assert!(
            s.push(".").is_empty(),
            "must wait for what follows the period"
        );
        assert_eq!(s.push(" It"), vec!["The capital of France is Paris."]);
        assert_eq!(s.push(" is big!\n"), vec!["It is big!"]);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn decimals_abbreviations_and_initials_do_not_split() {
        for piece in [1, 3, 100] {
            assert_eq!(
                split("It costs 3.5 dollars at Dr. Smith's shop, e.g. on Main St. today. J. R. R. Tolkien wrote it.", piece),
                vec![
                    "It costs 3.5 dollars at Dr. Smith's shop, e.g. on Main St. today.",
                    "J. R. R. Tolkien wrote it.",
                ]
            );
        }
    }

    #[test]
    fn short_fragments_join_the_next_sentence() {
        assert_eq!(split("Hi. I can help.", 2), vec!["Hi. I can help."]);
        assert_eq!(
            split("Ok. Yes. I can help.", 1),
            vec!["Ok. Yes.", "I can help."]
        );
        assert_eq!(
            split("Sure! Paris is lovely.", 1),
            vec!["Sure!", "Paris is lovely."]
        );
    }

    #[test]
    fn list_numbers_are_not_sentences() {
        assert_eq!(
            split("1. Buy milk.\n2. Call home.", 1),
            vec!["1. Buy milk.", "2. Call home."]
        );
    }

    #[test]
    fn closing_quotes_stay_with_their_sentence() {
        assert_eq!(
            split("He said \"yes.\" Then he left.", 4),
            vec!["He said \"yes.\"", "Then he left."]
        );
    }

    #[test]
    fn a_reply_stops_at_its_limit_or_at_its_first_repeat() {
        let mut limit = ReplyLimit::new(2);
        assert!(limit.admit("You're welcome."));
        assert!(!limit.full());
        assert!(
            !limit.admit("You're  welcome!"),
            "a repeat, whatever its punctuation"
        );
        assert!(limit.admit("Have a nice day."));
        assert!(limit.full());
        assert!(!limit.admit("Goodbye."));
        let mut one = ReplyLimit::new(1);
        assert!(one.admit("A spider has 8 legs."));
        assert!(!one.admit("Spiders are arachnids."));
    }
}
