//! Incremental detokenizer: token ids in one at a time, newly completed text out, never a split UTF-8
//! character. Holds only per-sequence decoding state; the tokenizer is passed in on every call and
//! nothing here knows about reasoning or tool calls.

use crate::tokenizer::{Tokenizer, TokenizerError};

const REPLACEMENT: char = '\u{FFFD}';
/// Ids held before giving up on waiting. Byte-level streams hold at most a few ids (a character has at
/// most 4 bytes); only long runs of skipped special tokens inside a character could get here.
const MAX_WINDOW: usize = 64;

/// Per-sequence state of incremental decoding.
///
/// Text comes from decoding a short window of recent ids: `window[..read]` is left context whose text
/// (`read_text`) is already emitted, kept so the decoder sees the same neighbours; `window[read..]` is
/// pending. A step emits the new text once the decoded window no longer ends in U+FFFD (no byte sequence
/// left open). When an id turns out to start a fresh character, what was held before it can no longer
/// change and is released as it is (with its U+FFFD). `finish` flushes the rest, so for byte-level
/// tokenizers the concatenation of all pieces equals `tokenizer.decode(all ids)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detokenizer {
    skip_special_tokens: bool,
    window: Vec<u32>,
    read: usize,
    read_text: String,
}

impl Detokenizer {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            skip_special_tokens,
            window: Vec::new(),
            read: 0,
            read_text: String::new(),
        }
    }

    /// Starts after `context` (e.g. the last few prompt ids) without emitting it, so decoders that treat
    /// the first token specially (SentencePiece's leading space) see the real left context.
    pub fn with_context(
        tokenizer: &Tokenizer,
        skip_special_tokens: bool,
        context: &[u32],
    ) -> Result<Self, TokenizerError> {
        Ok(Self {
            skip_special_tokens,
            window: context.to_vec(),
            read: context.len(),
            read_text: tokenizer.decode(context, skip_special_tokens)?,
        })
    }

    /// Adds one generated id; returns the text it completes (often empty mid-character).
    pub fn step(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let held_before = self.has_pending();
        self.window.push(id);
        let full = self.decode(tokenizer, &self.window)?;
        if !full.ends_with(REPLACEMENT) {
            let Some(new_text) = full.strip_prefix(self.read_text.as_str()) else {
                // The decoder rewrote emitted text (only non-byte-level decoders with cleanup rules do);
                // wait for more ids rather than emit something inconsistent.
                return Ok(String::new());
            };
            let new_text = new_text.to_string();
            self.keep_as_context(tokenizer, 1)?;
            return Ok(new_text);
        }
        let mut out = String::new();
        if held_before {
            // The window ends in an open (or invalid) byte sequence. If `id` decodes the same alone as
            // after the held ids, it starts a fresh character: the held text is final.
            let before = self.decode(tokenizer, &self.window[..self.window.len() - 1])?;
            let alone = self.decode(tokenizer, &[id])?;
            if !alone.is_empty() && full.strip_prefix(before.as_str()) == Some(alone.as_str()) {
                out.push_str(text_after(&before, &self.read_text));
                // The id before `id` becomes the context; `id` stays pending.
                let keep_from = self.window.len() - 2;
                self.window.drain(..keep_from);
                self.read = 1;
                self.read_text = self.decode(tokenizer, &self.window[..1])?;
            }
        }
        if self.window.len() > MAX_WINDOW {
            out.push_str(&self.release(tokenizer)?);
        }
        Ok(out)
    }

    /// Adds several ids; returns the text they complete.
    pub fn step_all(
        &mut self,
        tokenizer: &Tokenizer,
        ids: &[u32],
    ) -> Result<String, TokenizerError> {
        let mut text = String::new();
        for &id in ids {
            text.push_str(&self.step(tokenizer, id)?);
        }
        Ok(text)
    }

    /// Text held back at the end of the sequence (an open byte sequence becomes U+FFFD, as in `decode`).
    /// The detokenizer is empty afterwards.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let text = self.release(tokenizer)?;
        self.window.clear();
        self.read = 0;
        self.read_text.clear();
        Ok(text)
    }

    /// Whether ids are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        self.read < self.window.len()
    }

    fn decode(&self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, TokenizerError> {
        tokenizer.decode(ids, self.skip_special_tokens)
    }

    /// Emits the pending text as it decodes now.
    fn release(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        if !self.has_pending() {
            return Ok(String::new());
        }
        let full = self.decode(tokenizer, &self.window)?;
        let text = text_after(&full, &self.read_text).to_string();
        self.keep_as_context(tokenizer, 1)?;
        Ok(text)
    }

    /// Marks everything emitted and keeps the last `n` ids as left context.
    fn keep_as_context(&mut self, tokenizer: &Tokenizer, n: usize) -> Result<(), TokenizerError> {
        let keep_from = self.window.len().saturating_sub(n);
        self.window.drain(..keep_from);
        self.read = self.window.len();
        self.read_text = self.decode(tokenizer, &self.window)?;
        Ok(())
    }
}

/// `full` without the already emitted `emitted` at its start; if the decoder changed that text, without
/// the longest common prefix instead (never repeats emitted text).
fn text_after<'a>(full: &'a str, emitted: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(emitted) {
        return rest;
    }
    let common = full
        .char_indices()
        .zip(emitted.chars())
        .find(|((_, a), b)| a != b)
        .map_or(full.len().min(emitted.len()), |((i, _), _)| i);
    &full[common..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer"),
        )
        .unwrap()
    }

    /// Ids of the byte-level tokens for single bytes (the fixture vocabulary has all 256).
    fn byte_token(tok: &Tokenizer, byte: u8) -> u32 {
        // GPT-2 byte-to-char map: printable Latin-1 bytes map to themselves, the rest to U+0100 + n.
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut next = 0u32;
        let mut ch = None;
        for b in 0..=255u8 {
            if printable(b) {
                if b == byte {
                    ch = char::from_u32(u32::from(b));
                }
            } else {
                if b == byte {
                    ch = char::from_u32(256 + next);
                }
                next += 1;
            }
        }
        tok.token_to_id(&ch.unwrap().to_string()).unwrap()
    }

    fn run(tok: &Tokenizer, ids: &[u32], detok: &mut Detokenizer) -> Vec<String> {
        let mut pieces: Vec<String> = ids.iter().map(|&id| detok.step(tok, id).unwrap()).collect();
        pieces.push(detok.finish(tok).unwrap());
        assert_eq!(
            pieces.concat(),
            tok.decode(ids, false).unwrap(),
            "ids {ids:?}"
        );
        pieces
    }

    #[test]
    fn garbage_byte_streams_stay_exact_and_bounded() {
        let tok = tokenizer();
        let (lead, cont1, cont2) = (
            byte_token(&tok, 0xE6),
            byte_token(&tok, 0x97),
            byte_token(&tok, 0xA5),
        );
        assert_eq!(tok.decode(&[lead, cont1, cont2], false).unwrap(), "日");
        // 200 lone lead bytes, the last one completed: 199 U+FFFD then 日.
        let mut ids = vec![lead; 200];
        ids.extend([cont1, cont2]);
        let mut detok = Detokenizer::new(false);
        let mut max_window = 0;
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.push(detok.step(&tok, id).unwrap());
            max_window = max_window.max(detok.window.len());
        }
        pieces.push(detok.finish(&tok).unwrap());
        assert_eq!(pieces.concat(), format!("{}日", "\u{FFFD}".repeat(199)));
        assert!(max_window <= 3, "window grew to {max_window}");
        // Each lone lead byte is released as soon as the next one shows it can no longer complete.
        assert_eq!(pieces[1], "\u{FFFD}");

        // Lone continuation bytes, then a character split over three ids.
        let mut ids = vec![cont1; 50];
        ids.extend([lead, cont1, cont2, lead]);
        let pieces = run(&tok, &ids, &mut Detokenizer::new(false));
        assert_eq!(
            pieces.concat(),
            format!("{}日\u{FFFD}", "\u{FFFD}".repeat(50))
        );
    }

    #[test]
    fn held_text_never_splits_a_character() {
        let tok = tokenizer();
        let (lead, cont1, cont2) = (
            byte_token(&tok, 0xE6),
            byte_token(&tok, 0x97),
            byte_token(&tok, 0xA5),
        );
        let a = tok.encode("a", false).unwrap()[0];
        let mut detok = Detokenizer::new(false);
        assert_eq!(detok.step(&tok, a).unwrap(), "a");
        assert_eq!(detok.step(&tok, lead).unwrap(), "");
        assert_eq!(detok.step(&tok, cont1).unwrap(), "");
        assert!(detok.has_pending());
        assert_eq!(detok.step(&tok, cont2).unwrap(), "日");
        assert!(!detok.has_pending());
        assert_eq!(detok.finish(&tok).unwrap(), "");
    }

    #[test]
    fn common_prefix_fallback() {
        assert_eq!(text_after("abc", "ab"), "c");
        assert_eq!(text_after("a,b", "a ,"), ",b");
        assert_eq!(text_after("é", "x"), "é");
        assert_eq!(text_after("ab", "abc"), "");
    }
}
