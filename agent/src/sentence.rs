//! Cuts a reply streaming in token by token into sentences, releasing each one the moment
//! it is known to be complete, so the first can be spoken while the rest is generated.
//!
//! A sentence ends at `.`, `!` or `?` (with any closing quotes or brackets) followed by
//! whitespace, or at a line break. Not an end: a decimal point ("3.5"), a known abbreviation
//! ("Dr.", "e.g."), a single initial ("J."), a list number ("1."), or a fragment too short
//! to say on its own (it is joined to the next sentence instead).
//!
//! With [`SentenceSplitter::first_clause_words`], the reply's first piece may also end at a
//! clause mark (`,` `;` `:`) after that many words: a long first sentence then starts being
//! spoken at its first clause instead of its end.

/// Shortest sentence (in letters and digits) released on its own.
const MIN_CHARS: usize = 4;

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no",
    "fig", "inc", "ltd", "co", "mt", "ave", "u.s", "a.m", "p.m",
];

/// Marks that end a clause, for the first piece of a reply.
const CLAUSE_MARKS: &[char] = &[',', ';', ':'];

#[derive(Debug, Default)]
pub struct SentenceSplitter {
    buffer: String,
    /// What the model writes that is not to be spoken (a reasoning block).
    unspoken: crate::unspoken::Unspoken,
    /// Release the first piece at a clause mark after this many words (`None`: sentences only).
    first_clause_words: Option<usize>,
    /// Something was released already.
    released: bool,
}

impl SentenceSplitter {
    /// Sentences only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also releases the reply's first clause, at a clause mark after at least `words`
    /// words, when it comes before the first sentence's end.
    pub fn first_clause_words(mut self, words: usize) -> Self {
        self.first_clause_words = Some(words);
        self
    }

    /// Adds streamed text; returns the sentences it completed, in order.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        let text = self.unspoken.filter(text);
        self.buffer.push_str(&text);
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
        if let (false, true, Some(words)) = (self.released, out.is_empty(), self.first_clause_words)
        {
            if let Some(cut) = self.first_clause(words) {
                out.push(self.buffer[..cut].trim().to_string());
                self.buffer.drain(..cut);
            }
        }
        self.released |= !out.is_empty();
        out
    }

    /// Byte index just past a clause mark followed by whitespace with at least `words`
    /// words before it.
    fn first_clause(&self, words: usize) -> Option<usize> {
        let text = &self.buffer;
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            let followed_by_space = chars.peek().is_some_and(|&(_, n)| n.is_whitespace());
            if CLAUSE_MARKS.contains(&c)
                && followed_by_space
                && text[..i].split_whitespace().count() >= words
            {
                return Some(i + c.len_utf8());
            }
        }
        None
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
/// welcome. … You're welcome.") or that says some three-word phrase of the reply a third
/// time ("… personal and professional … personal and professional … personal and
/// professional"). Each ends the reply: its generation is cancelled.
#[derive(Debug)]
pub struct ReplyLimit {
    max_sentences: usize,
    /// The sentences said so far, lowercased letters and digits only.
    said: Vec<String>,
    /// Every word said so far (clauses included), lowercased.
    words: Vec<String>,
}

/// A phrase this long said this often is a loop.
const LOOP_PHRASE_WORDS: usize = 3;
const LOOP_TIMES: usize = 3;

impl ReplyLimit {
    pub fn new(max_sentences: usize) -> Self {
        Self {
            max_sentences,
            said: Vec::new(),
            words: Vec::new(),
        }
    }

    /// Whether to speak `sentence` (or a first clause); `false` ends the reply. A clause
    /// does not count as one of the reply's sentences.
    pub fn admit(&mut self, sentence: &str) -> bool {
        if self.full() || self.would_loop(sentence) {
            return false;
        }
        if sentence.trim_end().ends_with(CLAUSE_MARKS) {
            self.words.extend(words(sentence));
            return true;
        }
        let key: String = sentence
            .chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect();
        if self.said.contains(&key) {
            return false;
        }
        self.said.push(key);
        self.words.extend(words(sentence));
        true
    }

    /// Whether the reply has said all it may.
    pub fn full(&self) -> bool {
        self.said.len() >= self.max_sentences
    }

    /// Whether `sentence` would make some phrase of the reply its third time.
    fn would_loop(&self, sentence: &str) -> bool {
        let mut all = self.words.clone();
        let before = all.len();
        all.extend(words(sentence));
        let phrases: Vec<&[String]> = all.windows(LOOP_PHRASE_WORDS).collect();
        // Only phrases that end in the new sentence can newly reach the count.
        let new_from = before.saturating_sub(LOOP_PHRASE_WORDS - 1);
        phrases[new_from.min(phrases.len())..]
            .iter()
            .any(|phrase| phrases.iter().filter(|other| *other == phrase).count() >= LOOP_TIMES)
    }
}

/// Lowercased words, letters, digits and apostrophes only: a reply's words as they are
/// compared for repeats.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == '\'')
                .flat_map(char::to_lowercase)
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
}

/// Drops what a voice cannot say: markdown marks and emoji.
pub(crate) fn speakable(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, '*' | '#' | '`' | '_' | '~' | '|' | '<' | '>'))
        .filter(|c| (*c as u32) < 0x1F000)
        .collect()
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
    fn a_long_first_sentence_starts_at_its_first_clause() {
        let stream = |text: &str| {
            let mut s = SentenceSplitter::new().first_clause_words(4);
            let mut out = Vec::new();
            for c in text.chars() {
                out.extend(s.push(&c.to_string()));
            }
            out.extend(s.finish());
            out
        };
        assert_eq!(
            stream("I'm sorry for any inconvenience, but I cannot order food, sadly. Ask me."),
            vec![
                "I'm sorry for any inconvenience,",
                "but I cannot order food, sadly.",
                "Ask me."
            ]
        );
        // Too few words before the comma, or a sentence first: sentences only.
        assert_eq!(
            stream("Sure, I can help. Yes, it is."),
            vec!["Sure, I can help.", "Yes, it is."]
        );
        // "3,000" is no clause.
        assert_eq!(
            stream("The tower is about 3,000 feet tall."),
            vec!["The tower is about 3,000 feet tall."]
        );
        // A clause does not count against the reply's sentences.
        let mut limit = ReplyLimit::new(1);
        assert!(limit.admit("I'm sorry for any inconvenience,"));
        assert!(limit.admit("but I cannot order food."));
        assert!(!limit.admit("Ask me."));
    }

    #[test]
    fn a_phrase_said_a_third_time_ends_the_reply() {
        let mut limit = ReplyLimit::new(4);
        assert!(limit.admit("I'm sorry, but as a chatbot for personal and professional use,"));
        assert!(limit.admit("I cannot help with personal and professional matters."));
        assert!(!limit.admit("I'm here to assist with any personal and professional issues."));
        // Twice is not a loop.
        let mut limit = ReplyLimit::new(4);
        assert!(limit.admit("It is two hours by train."));
        assert!(limit.admit("It is two hours by car, too."));
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
