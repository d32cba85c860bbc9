//! Splitting a finished text into pseudo-tokens (piece text plus a stable id) so a text without its
//! token ids can be fed to the streaming detector. Owns only the splitting; no tokenizer is loaded.

/// How a text is cut into pseudo-tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PseudoTokenizer {
    /// Close to a BPE pre-tokenizer: a word with its leading space, one digit, a run of punctuation
    /// (with its leading space), a run of whitespace (leaving the last space to the next word).
    WordPieces,
    /// Fixed chunks of this many characters (the last may be shorter); 0 is treated as 1.
    CharChunks(usize),
}

/// Longest punctuation run kept in one piece, as a BPE vocabulary would.
const MAX_PUNCT_RUN: usize = 16;

impl PseudoTokenizer {
    /// The pieces of `text`, in order; they concatenate back to `text`.
    pub fn pieces<'a>(&self, text: &'a str) -> Pieces<'a> {
        Pieces {
            rest: text,
            mode: *self,
        }
    }
}

/// A stable id for a piece (32-bit FNV-1a of its bytes): equal pieces get equal ids.
pub fn pseudo_token_id(piece: &str) -> u32 {
    let mut hash = 0x811C_9DC5u32;
    for &b in piece.as_bytes() {
        hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    // Keep ids below 2^31 like a real vocabulary.
    hash >> 1
}

/// Iterator over the pieces of a text.
#[derive(Debug, Clone)]
pub struct Pieces<'a> {
    rest: &'a str,
    mode: PseudoTokenizer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Letters,
    Digit,
    Space,
    Punct,
}

fn kind(c: char) -> Kind {
    if c.is_numeric() {
        Kind::Digit
    } else if c.is_alphabetic() || c == '_' {
        Kind::Letters
    } else if c.is_whitespace() {
        Kind::Space
    } else {
        Kind::Punct
    }
}

/// Byte length of the first word piece of `s` (non-empty).
fn word_piece_len(s: &str) -> usize {
    let mut chars = s.char_indices().peekable();
    let Some((_, first)) = chars.next() else {
        return 0;
    };
    let mut body_kind = kind(first);
    // A single space joins the word or punctuation run after it.
    if first == ' ' {
        if let Some(&(_, next)) = chars.peek() {
            let next_kind = kind(next);
            if matches!(next_kind, Kind::Letters | Kind::Punct) {
                chars.next();
                body_kind = next_kind;
            } else if next_kind == Kind::Digit {
                return 1;
            }
        }
    }
    match body_kind {
        Kind::Digit => first.len_utf8(),
        Kind::Letters => chars
            .find(|&(_, c)| kind(c) != Kind::Letters)
            .map_or(s.len(), |(i, _)| i),
        Kind::Punct => {
            let mut run = 1;
            chars
                .find(|&(_, c)| {
                    run += 1;
                    kind(c) != Kind::Punct || run > MAX_PUNCT_RUN
                })
                .map_or(s.len(), |(i, _)| i)
        }
        Kind::Space => {
            // Whitespace run; a final space before a word or punctuation goes with that.
            let end = chars
                .find(|&(_, c)| kind(c) != Kind::Space)
                .map_or(s.len(), |(i, _)| i);
            let run = &s[..end];
            if end < s.len() && run.len() > 1 && run.ends_with(' ') {
                let next_kind = s[end..].chars().next().map(kind);
                if matches!(next_kind, Some(Kind::Letters | Kind::Punct)) {
                    return end - 1;
                }
            }
            end
        }
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        let len = match self.mode {
            PseudoTokenizer::WordPieces => word_piece_len(self.rest),
            PseudoTokenizer::CharChunks(n) => self
                .rest
                .char_indices()
                .nth(n.max(1))
                .map_or(self.rest.len(), |(i, _)| i),
        };
        let (piece, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(mode: PseudoTokenizer, text: &str) -> Vec<&str> {
        mode.pieces(text).collect()
    }

    #[test]
    fn word_pieces_look_like_bpe_pre_tokens() {
        assert_eq!(
            pieces(PseudoTokenizer::WordPieces, "We are: 2 + 22 = 4.\n\n  x_1"),
            [
                "We", " are", ":", " ", "2", " +", " ", "2", "2", " =", " ", "4", ".", "\n\n ",
                " x_", "1"
            ]
        );
        assert_eq!(
            pieces(PseudoTokenizer::WordPieces, "prime prime 的的"),
            ["prime", " prime", " 的的"]
        );
    }

    #[test]
    fn pieces_concatenate_back() {
        let text = "Hello,   world!! 1234 ---- ok\n\t\ttabs 😂😂 end ";
        for mode in [
            PseudoTokenizer::WordPieces,
            PseudoTokenizer::CharChunks(1),
            PseudoTokenizer::CharChunks(3),
        ] {
            assert_eq!(pieces(mode, text).concat(), text);
            assert!(pieces(mode, text).iter().all(|p| !p.is_empty()));
        }
        assert_eq!(
            pieces(PseudoTokenizer::CharChunks(3), "abcdefg"),
            ["abc", "def", "g"]
        );
        assert_eq!(pieces(PseudoTokenizer::CharChunks(0), "ab"), ["a", "b"]);
    }

    #[test]
    fn equal_pieces_get_equal_ids() {
        assert_eq!(pseudo_token_id(" prime"), pseudo_token_id(" prime"));
        assert_ne!(pseudo_token_id(" prime"), pseudo_token_id("prime"));
        assert!(pseudo_token_id("x") < 1 << 31);
    }
}
