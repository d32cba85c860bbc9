//! Shapes raw fuzz bytes into what a streaming parser sees: a flags byte, chunk lengths and a text, cut
//! into consecutive chunks at char boundaries the way an engine hands out deltas. Input shaping only;
//! it knows no parser.

use std::borrow::Cow;

/// Most chunk-length bytes one input may carry; they are cycled over the text.
const MAX_LENGTHS: usize = 64;

/// Fuzz input split into its parts (see [`shape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaped<'a> {
    pub flags: u8,
    pub lengths: &'a [u8],
    pub text: Cow<'a, str>,
}

/// Reads `[flags][n][n chunk-length bytes][text...]`; missing parts are zero or empty, `n` is taken
/// modulo 64 and the text is decoded lossily (invalid UTF-8 becomes U+FFFD).
pub fn shape(data: &[u8]) -> Shaped<'_> {
    let flags = data.first().copied().unwrap_or(0);
    let count = data.get(1).map_or(0, |&n| usize::from(n) % MAX_LENGTHS);
    let rest = data.get(2..).unwrap_or(&[]);
    let count = count.min(rest.len());
    let (lengths, text) = rest.split_at(count);
    Shaped {
        flags,
        lengths,
        text: String::from_utf8_lossy(text),
    }
}

/// The inverse of [`shape`], for writing seeds: at most 63 length bytes are kept.
pub fn unshape(flags: u8, lengths: &[u8], text: &str) -> Vec<u8> {
    let lengths = &lengths[..lengths.len().min(MAX_LENGTHS - 1)];
    let mut data = vec![flags, lengths.len() as u8];
    data.extend_from_slice(lengths);
    data.extend_from_slice(text.as_bytes());
    data
}

/// Chunk length in chars for one length byte: 1..=8 for bytes below 128 (small chunks find most
/// boundary bugs), 1..=128 above.
fn chunk_chars(byte: u8) -> usize {
    if byte < 128 {
        usize::from(byte % 8) + 1
    } else {
        usize::from(byte - 128) + 1
    }
}

/// Cuts `text` into consecutive non-empty chunks at char boundaries, their lengths taken from
/// `lengths` in turn (cycled); no lengths means one chunk. The chunks concatenate to `text`.
pub fn chunk_text<'a>(text: &'a str, lengths: &[u8]) -> Vec<&'a str> {
    if lengths.is_empty() || text.is_empty() {
        return vec![text];
    }
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut next = lengths.iter().cycle();
    while start < text.len() {
        // `cycle` over a non-empty slice never ends; 1 keeps the loop finite regardless.
        let chars = next.next().map_or(1, |&b| chunk_chars(b));
        let end = text[start..]
            .char_indices()
            .nth(chars)
            .map_or(text.len(), |(i, _)| start + i);
        chunks.push(&text[start..end]);
        start = end;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_round_trips_and_tolerates_short_input() {
        let data = unshape(5, &[1, 200], "日本 <think>");
        let shaped = shape(&data);
        assert_eq!(
            (shaped.flags, shaped.lengths, shaped.text.as_ref()),
            (5, &[1u8, 200][..], "日本 <think>")
        );
        assert_eq!(shape(&[]).text, "");
        assert_eq!(shape(&[7]).flags, 7);
        // More length bytes announced than present: all of the rest are lengths.
        assert_eq!(shape(&[0, 10, 1, 2]).lengths, &[1, 2]);
        assert_eq!(shape(&[0, 0, 0xff]).text, "\u{FFFD}");
    }

    #[test]
    fn chunks_cover_the_text_at_char_boundaries() {
        let text = "aé日😀bc";
        assert_eq!(chunk_text(text, &[]), vec![text]);
        assert_eq!(chunk_text(text, &[0]), vec!["a", "é", "日", "😀", "b", "c"]);
        assert_eq!(chunk_text(text, &[1, 129]), vec!["aé", "日😀", "bc"]);
        assert_eq!(chunk_text("", &[3]), vec![""]);
        for lengths in [&[0u8][..], &[7, 255], &[130, 0, 3]] {
            assert_eq!(chunk_text(text, lengths).concat(), text);
        }
    }
}
