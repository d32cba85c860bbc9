//! Fuzz target: arbitrary token ids (in and out of the vocabulary) through the incremental detokenizer
//! with the demo tokenizer. Input: a flags byte, then ids as 2-byte little-endian words. The pieces must
//! concatenate to the one-shot decode, as the detokenizer promises for byte-level tokenizers.

use deltaserve_text::{Detokenizer, Tokenizer};

use crate::demo::demo;

/// Flag bit: decode with `skip_special_tokens`.
const SKIP_SPECIAL: u8 = 1;
/// Flag bit: the first ids are left context (`Detokenizer::with_context`), the count in bits 2..=4.
const WITH_CONTEXT: u8 = 2;
/// Words at or above this map to ids far outside any vocabulary.
const FAR_IDS_FROM: u16 = 0xFF00;
/// Ids just past the vocabulary that words may also map to.
const PAST_VOCAB: usize = 8;
/// Most ids one input decodes: far more than the detokenizer's 64-id window, few enough that every
/// input runs fast (each step decodes its window).
const MAX_IDS: usize = 512;

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let tokenizer = &demo().tokenizer;
    let ids = ids_of(rest, demo().vocab_size);
    let skip_special = flags & SKIP_SPECIAL != 0;

    if flags & WITH_CONTEXT != 0 {
        let context_len = usize::from((flags >> 2) & 7).min(ids.len());
        let (context, generated) = ids.split_at(context_len);
        check_with_context(tokenizer, skip_special, context, generated);
    } else {
        let mut detokenizer = Detokenizer::new(skip_special);
        let streamed = stream(tokenizer, &mut detokenizer, &ids);
        let Ok(whole) = tokenizer.decode(&ids, skip_special) else {
            return;
        };
        if long_silent_run(tokenizer, &ids, skip_special) {
            // Not promised: the detokenizer holds at most 64 ids (`MAX_WINDOW` in detokenizer.rs), so a
            // character whose bytes are spread around more ids that decode to nothing (skipped special
            // tokens, ids outside the vocabulary) is released as U+FFFD pieces where the one-shot
            // decode joins its bytes. The server never steps skipped ids (generation.rs hides them and
            // decodes with skip off); only ids outside the tokenizer's vocabulary could do it there.
            return;
        }
        assert_eq!(
            streamed.as_deref(),
            Ok(whole.as_str()),
            "streamed text differs from the one-shot decode of {ids:?} (skip_special_tokens \
             {skip_special})"
        );
    }
}

/// Ids from 2-byte words: most fall in the vocabulary (plus a few ids just past it), the top 256 words
/// map to ids near `u32::MAX`.
fn ids_of(bytes: &[u8], vocab_size: usize) -> Vec<u32> {
    let span = vocab_size + PAST_VOCAB;
    bytes
        .chunks_exact(2)
        .take(MAX_IDS)
        .map(|pair| {
            let word = u16::from_le_bytes([pair[0], pair[1]]);
            if word >= FAR_IDS_FROM {
                u32::MAX - u32::from(word - FAR_IDS_FROM)
            } else {
                // `span` is a few thousand, so the remainder fits in u32.
                (usize::from(word) % span) as u32
            }
        })
        .collect()
}

/// Ids the detokenizer holds at most while a character is open (`MAX_WINDOW` in detokenizer.rs), plus
/// the id that overflows it.
const WINDOW: usize = 65;
/// Silent ids among [`WINDOW`] consecutive ones from which that window may overflow: a held stretch is
/// one character's at most 4 byte ids, everything else in it decodes to nothing (skipped special
/// tokens, ids outside the vocabulary). Slightly below 61 to stay on the safe side.
const SILENT_IN_WINDOW: usize = 60;

/// Whether some [`WINDOW`] consecutive ids hold at least [`SILENT_IN_WINDOW`] that decode to no text
/// on their own, the only way the detokenizer's window can overflow.
fn long_silent_run(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> bool {
    let silent: Vec<bool> = ids
        .iter()
        .map(|&id| {
            tokenizer
                .decode(&[id], skip_special)
                .is_ok_and(|text| text.is_empty())
        })
        .collect();
    let mut in_window = 0;
    for (i, &quiet) in silent.iter().enumerate() {
        in_window += usize::from(quiet);
        if i >= WINDOW {
            in_window -= usize::from(silent[i - WINDOW]);
        }
        if in_window >= SILENT_IN_WINDOW {
            return true;
        }
    }
    false
}

/// All pieces of `ids` and the final flush, concatenated; a decode error is returned as text.
fn stream(
    tokenizer: &Tokenizer,
    detokenizer: &mut Detokenizer,
    ids: &[u32],
) -> Result<String, String> {
    let mut text = String::new();
    for &id in ids {
        text.push_str(&detokenizer.step(tokenizer, id).map_err(|e| e.to_string())?);
    }
    text.push_str(&detokenizer.finish(tokenizer).map_err(|e| e.to_string())?);
    assert!(!detokenizer.has_pending(), "ids still held after finish");
    Ok(text)
}

/// After left context, the pieces are the decode of context + generated minus the context's text,
/// whenever the context's text is a prefix of that decode (a context ending inside a character is
/// completed by the generated ids and has no stable text of its own).
fn check_with_context(
    tokenizer: &Tokenizer,
    skip_special: bool,
    context: &[u32],
    generated: &[u32],
) {
    let Ok(mut detokenizer) = Detokenizer::with_context(tokenizer, skip_special, context) else {
        return;
    };
    let streamed = stream(tokenizer, &mut detokenizer, generated);
    let all: Vec<u32> = context.iter().chain(generated).copied().collect();
    let (Ok(context_text), Ok(whole)) = (
        tokenizer.decode(context, skip_special),
        tokenizer.decode(&all, skip_special),
    ) else {
        return;
    };
    if long_silent_run(tokenizer, &all, skip_special) {
        return; // not promised, see `run`
    }
    if let Some(expected) = whole.strip_prefix(&context_text) {
        assert_eq!(
            streamed.as_deref(),
            Ok(expected),
            "streamed text after context {context:?} differs from the decode of {generated:?} \
             (skip_special_tokens {skip_special})"
        );
    }
}
