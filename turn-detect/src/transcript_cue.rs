//! The transcript as a second end-of-turn signal: what the caller's last words say about
//! whether they have finished, as plain rules over the transcriber's text.
//!
//! - A question (the text ends with `?`) is finished: the caller is waiting for an answer.
//! - A trailing continuation is not: the last word joins or fills (`and`, `so`, `um`, `the`,
//!   `to`, …), or the text ends in a comma or an ellipsis. (How long that holds the turn
//!   depends on the end-of-turn model's score too: `crate::endpoint`.)
//! - A number may not be: a number being dictated goes on after a breath, but one can also
//!   end the turn ("… six seven eight nine"), so it waits as long as an unsure stop.
//! - So is a verb that needs an object, said last after "to" or "please" ("remind me to
//!   buy", "I would like to order"), even when the transcriber heard a question in it;
//!   and any verb said last after a wish's "to" ("I would like to …", "I need to …"): a
//!   caller telling an agent what they want names it next, and the transcriber often
//!   mishears the verb itself ("book" as "work"). Holding a finished "I want to sleep."
//!   costs one long wait; cutting off "I would like to book … a table" talks over them.
//! - Anything else says nothing; the end-of-turn model's score decides alone.
//!
//! Bracketed or parenthesised notes the transcriber adds (`[BLANK_AUDIO]`, `(laughs)`) are
//! not words.

/// What the last words say about the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptCue {
    /// A question: the caller has finished.
    Question,
    /// A word or mark that goes on: the caller has not finished.
    Trailing,
    /// A number: perhaps dictated in parts, perhaps the answer's end.
    Number,
    /// Nothing either way.
    Neutral,
}

/// Words after which a sentence goes on: conjunctions, fillers, articles, prepositions,
/// possessives, and the start of a number's decimal part.
const TRAILING_WORDS: &[&str] = &[
    "and", "or", "but", "so", "because", "cause", "then", "if", "when", "while", "that", "which",
    "who", "where", "um", "uh", "er", "erm", "hmm", "like", "the", "a", "an", "to", "of", "with",
    "for", "from", "at", "in", "on", "by", "about", "into", "my", "your", "our", "their", "his",
    "her", "its", "is", "are", "was", "were", "am", "plus", "minus", "point", "than", "as", "also",
    "maybe", "just",
];

/// Verbs that take an object: said last, the sentence has not reached it yet.
const OBJECT_VERBS: &[&str] = &[
    "order", "buy", "book", "get", "make", "bring", "find", "reserve", "schedule", "cancel",
    "send", "pick", "put", "give", "take", "tell", "ask", "remind", "add", "change", "pay",
];

/// Words after which such a verb dangles: the infinitive's "to" ("I would like to order"),
/// a request's "please". After a subject it may be whole ("the one I will take").
const BEFORE_A_VERB: &[&str] = &["to", "please"];

/// Words of wanting before an infinitive ("like to", "want to", "need to"): whatever verb
/// follows, what is wanted usually comes after it.
const WANTING: &[&str] = &[
    "like", "love", "want", "wanted", "need", "needed", "wish", "hoping",
];

/// Number words: a caller dictating digits may not be done.
const NUMBER_WORDS: &[&str] = &[
    "zero",
    "oh",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
    "hundred",
    "thousand",
];

/// The cue in `transcript`.
pub fn transcript_cue(transcript: &str) -> TranscriptCue {
    let text = without_notes(transcript);
    let text = text.trim_end();
    if dangling_verb(text) {
        return TranscriptCue::Trailing;
    }
    if text.ends_with('?') {
        return TranscriptCue::Question;
    }
    if text.ends_with(',') || text.ends_with("...") || text.ends_with('…') || text.ends_with('-')
    {
        return TranscriptCue::Trailing;
    }
    let Some(last) = text.split_whitespace().last() else {
        return TranscriptCue::Neutral;
    };
    let word: String = last
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase();
    if TRAILING_WORDS.contains(&&*word) {
        return TranscriptCue::Trailing;
    }
    if word.chars().any(|c| c.is_ascii_digit()) || NUMBER_WORDS.contains(&&*word) {
        return TranscriptCue::Number;
    }
    TranscriptCue::Neutral
}

/// Whether the text ends with a verb still waiting for its object.
fn dangling_verb(text: &str) -> bool {
    let words: Vec<String> = text
        .split_whitespace()
        .rev()
        .take(3)
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect();
    match words.as_slice() {
        // A joining word there is trailing by `transcript_cue`'s later rules anyway.
        [last, before, wish, ..] if before == "to" && WANTING.contains(&wish.as_str()) => {
            !last.is_empty()
        }
        [last, before, ..] => {
            OBJECT_VERBS.contains(&last.as_str()) && BEFORE_A_VERB.contains(&before.as_str())
        }
        _ => false,
    }
}

/// The text without `[…]` and `(…)` notes.
fn without_notes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_is_finished() {
        assert_eq!(
            transcript_cue("What time do you open tomorrow?"),
            TranscriptCue::Question
        );
        assert_eq!(
            transcript_cue(" Is it far? [BLANK_AUDIO] "),
            TranscriptCue::Question
        );
    }

    #[test]
    fn a_joining_word_a_filler_or_a_comma_goes_on() {
        for text in [
            "I would like to book a table and",
            "So I was thinking, um",
            "It's for my wife and the",
            "I need to go to",
            "First of all,",
            "Well...",
            "My number is five five five,",
            "It costs three point",
            "Could you remind me to buy?",
            "I would like to order.",
            "I would like to work.",
            "We need to renew?",
            "I'd love to visit",
        ] {
            assert_eq!(transcript_cue(text), TranscriptCue::Trailing, "{text:?}");
        }
    }

    #[test]
    fn a_number_may_go_on() {
        for text in [
            "The card number is 4929 1234",
            "My number is five five five, two",
            "I want three",
        ] {
            assert_eq!(transcript_cue(text), TranscriptCue::Number, "{text:?}");
        }
    }

    #[test]
    fn a_plain_statement_says_nothing() {
        for text in [
            "I would like to book a table for two people tonight.",
            "Thanks, that's all",
            "",
            "[BLANK_AUDIO]",
            "Hello there (laughs)",
            "I placed an order.",
            "That's the one I will take",
            "I went to work.",
            "I would like to book it, please.",
        ] {
            assert_eq!(transcript_cue(text), TranscriptCue::Neutral, "{text:?}");
        }
    }
}
