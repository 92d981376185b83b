//! Text to IPA phonemes with espeak-ng (the voice `en-us`), the way Piper voices were trained.
//!
//! espeak-ng drops punctuation from its phonemes, but Piper voices use it for prosody, so
//! the text is cut into clauses here and each clause's closing punctuation is put back.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Mutex;

use anyhow::{bail, Result};

#[link(name = "espeak-ng")]
extern "C" {
    fn espeak_Initialize(
        output: c_int,
        buflength: c_int,
        path: *const c_char,
        options: c_int,
    ) -> c_int;
    fn espeak_SetVoiceByName(name: *const c_char) -> c_int;
    fn espeak_TextToPhonemes(
        textptr: *mut *const c_void,
        textmode: c_int,
        phonememode: c_int,
    ) -> *const c_char;
}

const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
const CHARS_UTF8: c_int = 1;
const PHONEMES_IPA: c_int = 0x02;

/// espeak-ng keeps global state; one caller at a time, initialised once.
static ESPEAK: Mutex<Option<String>> = Mutex::new(None);

/// Phonemizes `text` with the espeak-ng voice `voice`: one string of IPA with clause
/// punctuation and spaces kept.
pub fn phonemize(text: &str, voice: &str) -> Result<String> {
    let mut current = ESPEAK.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_deref() != Some(voice) {
        // SAFETY: called under the lock; a null path means espeak-ng's installed data.
        unsafe {
            if current.is_none()
                && espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, std::ptr::null(), 0) < 0
            {
                bail!("espeak-ng failed to initialise: is the espeak-ng-data package installed?");
            }
            let name = CString::new(voice)?;
            if espeak_SetVoiceByName(name.as_ptr()) != 0 {
                bail!("espeak-ng has no voice {voice:?}");
            }
        }
        *current = Some(voice.to_string());
    }
    let mut out = String::new();
    for (clause, punctuation) in clauses(text) {
        let ipa = clause_phonemes(&clause)?;
        if ipa.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&ipa);
        if let Some(p) = punctuation {
            out.push(p);
        }
    }
    Ok(out)
}

/// Must be called with the espeak lock held.
fn clause_phonemes(clause: &str) -> Result<String> {
    let text = CString::new(clause.replace('\0', " "))?;
    let mut pointer = text.as_ptr() as *const c_void;
    let mut parts = Vec::new();
    // SAFETY: espeak advances `pointer` through the NUL-terminated text and sets it to
    // null at the end; the returned phonemes live until the next call and are copied.
    unsafe {
        while !pointer.is_null() {
            let phonemes = espeak_TextToPhonemes(&mut pointer, CHARS_UTF8, PHONEMES_IPA);
            if phonemes.is_null() {
                break;
            }
            let s = CStr::from_ptr(phonemes)
                .to_string_lossy()
                .trim()
                .to_string();
            if !s.is_empty() {
                parts.push(s);
            }
        }
    }
    Ok(parts.join(" "))
}

/// Splits text at clause punctuation, keeping which mark closed each clause.
fn clauses(text: &str) -> Vec<(String, Option<char>)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next_is_break = chars.get(i + 1).is_none_or(|n| n.is_whitespace());
        if matches!(c, '.' | ',' | '?' | '!' | ';' | ':') && next_is_break {
            if !current.trim().is_empty() {
                out.push((current.trim().to_string(), Some(c)));
            }
            current.clear();
        } else {
            current.push(c);
        }
    }
    if !current.trim().is_empty() {
        out.push((current.trim().to_string(), None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_keep_their_punctuation() {
        assert_eq!(
            clauses("Hello, world. It costs 3.5 dollars!"),
            vec![
                ("Hello".to_string(), Some(',')),
                ("world".to_string(), Some('.')),
                ("It costs 3.5 dollars".to_string(), Some('!')),
            ]
        );
    }

    #[test]
    fn espeak_speaks_ipa() {
        let ipa = phonemize("Hello world, how are you?", "en-us").unwrap();
        assert!(ipa.contains("həlˈoʊ"), "{ipa}");
        assert!(ipa.contains(',') && ipa.ends_with('?'), "{ipa}");
    }
}
