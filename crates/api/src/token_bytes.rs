//! The raw bytes and display string of one token, for OpenAI logprobs (`token`, `bytes`). Byte-level BPE
//! tokens (GPT-2 alphabet, as in Qwen) are mapped back to their bytes, so a token holding half of a UTF-8
//! character still reports its exact bytes. It does not decode sequences (the detokenizer does).

use deltaserve_text::Tokenizer;

/// The byte of a GPT-2 byte-level alphabet character, `None` for characters outside that alphabet.
///
/// The alphabet maps the printable bytes `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ` to themselves and the other 68
/// bytes, in increasing order, to U+0100..U+0143.
fn byte_level_byte(c: char) -> Option<u8> {
    let code = u32::from(c);
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    let index = code.checked_sub(0x100)?;
    // The index-th byte (in increasing order) that is not printable.
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(index as usize)
        .map(|b| b as u8)
}

/// The bytes of token `id`: byte-level tokens mapped back to bytes, special and other tokens as their
/// decoded text.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    if !tokenizer.is_special(id) {
        if let Some(piece) = tokenizer.id_to_token(id) {
            let bytes: Option<Vec<u8>> = piece.chars().map(byte_level_byte).collect();
            if let Some(bytes) = bytes.filter(|b| !b.is_empty()) {
                return bytes;
            }
        }
    }
    tokenizer
        .decode(&[id], false)
        .map(String::into_bytes)
        .unwrap_or_default()
}

/// OpenAI's display string of a token: its text, or `bytes:\xNN...` when the bytes are not valid UTF-8.
pub fn token_display(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => {
            let mut out = String::from("bytes:");
            for b in bytes {
                out.push_str(&format!("\\x{b:02x}"));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('ĉ'), Some(b'\t'));
        assert_eq!(byte_level_byte('Ā'), Some(0));
        assert_eq!(byte_level_byte('Ń'), Some(0xAD));
        assert_eq!(byte_level_byte('ń'), None);
        assert_eq!(byte_level_byte('é'), Some(0xE9));
        assert_eq!(byte_level_byte(' '), None);
    }

    #[test]
    fn display_of_partial_utf8() {
        assert_eq!(token_display(b"hi"), "hi");
        assert_eq!(token_display(&[0xE2, 0x80]), "bytes:\\xe2\\x80");
    }
}
