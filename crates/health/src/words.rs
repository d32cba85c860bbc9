//! Incremental segmentation of generated text into word units for the distinct-n measures: words and
//! numbers, single CJK characters, single symbols such as emoji. Independent of the tokenizer, so the
//! collapse measures see the same units however the model split the text. Owns no window or verdict.

/// One unit of text as the collapse measures see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordUnit {
    /// Hash of the unit's characters, ASCII letters folded to lower case.
    pub hash: u64,
    /// A real word: a letter and two or more characters, one character of a script written without
    /// spaces, or an emoji (used like a word in chat). Numbers, single letters and other symbols
    /// (check marks, arrows, box drawing) are not: they are what data, matrices and grids are made of.
    pub wordy: bool,
    /// Char offset of the unit's first character in the output.
    pub start_char: u64,
    /// Byte offset of the same character.
    pub start_byte: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CharClass {
    /// Part of a word or number.
    Word,
    /// A unit by itself: characters of scripts written without spaces.
    Standalone,
    /// A unit by itself that is not a word: emoji, check marks, arrows, box drawing.
    Symbol,
    /// Whitespace and ASCII punctuation: ends the current unit and is not one.
    Separator,
}

fn classify(c: char) -> CharClass {
    if c.is_ascii() {
        if c.is_ascii_alphanumeric() || c == '_' {
            CharClass::Word
        } else {
            CharClass::Separator
        }
    } else if is_written_without_spaces(c) {
        CharClass::Standalone
    } else if c.is_alphanumeric() {
        CharClass::Word
    } else if c.is_whitespace() || is_general_punctuation(c) {
        CharClass::Separator
    } else {
        CharClass::Symbol
    }
}

/// Han ideographs, kana, Thai, Lao, Khmer, Myanmar: scripts without spaces between words, where one
/// character is the nearest thing to a word we can find without a dictionary.
fn is_written_without_spaces(c: char) -> bool {
    matches!(c as u32,
        0x0E00..=0x0EFF       // Thai, Lao
        | 0x1000..=0x109F     // Myanmar
        | 0x1780..=0x17FF     // Khmer
        | 0x3040..=0x30FF     // Hiragana, Katakana
        | 0x3400..=0x4DBF     // CJK extension A
        | 0x4E00..=0x9FFF     // CJK unified ideographs
        | 0xF900..=0xFAFF     // CJK compatibility ideographs
        | 0x20000..=0x3134F   // CJK extensions B-G
    )
}

/// Emoji pictographs (faces, objects, animals), not marks such as check boxes or arrows.
pub(crate) fn is_pictograph(c: char) -> bool {
    matches!(c as u32, 0x1F300..=0x1FAFF)
}

/// Quotes, dashes, ellipses, CJK full stops and commas: punctuation outside ASCII.
fn is_general_punctuation(c: char) -> bool {
    matches!(c as u32,
        0x00A0..=0x00BF       // Latin-1 punctuation and signs
        | 0x2000..=0x206F     // General punctuation
        | 0x3000..=0x303F     // CJK symbols and punctuation
        | 0xFF00..=0xFF0F     // Fullwidth ASCII punctuation
        | 0xFF1A..=0xFF20
        | 0xFF3B..=0xFF40
        | 0xFF5B..=0xFF65
    )
}

const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;

fn fold(hash: u64, c: char) -> u64 {
    let c = c.to_ascii_lowercase() as u64;
    (hash ^ c).wrapping_mul(FNV_PRIME)
}

/// The unit being read.
#[derive(Debug, Clone, Default)]
pub(crate) struct WordSegmenter {
    open: bool,
    hash: u64,
    chars: u32,
    has_letter: bool,
    start_char: u64,
    start_byte: u64,
}

impl WordSegmenter {
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Reads character `c` at char offset `index` and byte offset `byte`; calls `emit` for each unit
    /// it completes.
    pub(crate) fn push(&mut self, c: char, index: u64, byte: u64, emit: &mut impl FnMut(WordUnit)) {
        match classify(c) {
            CharClass::Word => {
                if !self.open {
                    self.open = true;
                    self.hash = FNV_OFFSET;
                    self.chars = 0;
                    self.has_letter = false;
                    self.start_char = index;
                    self.start_byte = byte;
                }
                self.hash = fold(self.hash, c);
                self.chars += 1;
                self.has_letter |= c.is_alphabetic();
            }
            class => {
                self.flush(emit);
                if class != CharClass::Separator {
                    emit(WordUnit {
                        hash: fold(FNV_OFFSET, c),
                        wordy: match class {
                            CharClass::Standalone => c.is_alphabetic(),
                            _ => is_pictograph(c),
                        },
                        start_char: index,
                        start_byte: byte,
                    });
                }
            }
        }
    }

    /// Completes the unit being read, if any (end of stream).
    pub(crate) fn flush(&mut self, emit: &mut impl FnMut(WordUnit)) {
        if self.open {
            self.open = false;
            emit(WordUnit {
                hash: self.hash,
                wordy: self.has_letter && self.chars >= 2,
                start_char: self.start_char,
                start_byte: self.start_byte,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(text: &str) -> Vec<(String, bool)> {
        let mut segmenter = WordSegmenter::default();
        let mut out = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let mut emit = |u: WordUnit| out.push(u);
        for (i, &c) in chars.iter().enumerate() {
            segmenter.push(c, i as u64, 0, &mut emit);
        }
        segmenter.flush(&mut emit);
        out.iter()
            .map(|u| {
                let start = u.start_char as usize;
                let end = if classify(chars[start]) == CharClass::Word {
                    (start..chars.len())
                        .find(|&j| classify(chars[j]) != CharClass::Word)
                        .unwrap_or(chars.len())
                } else {
                    start + 1
                };
                (chars[start..end].iter().collect(), u.wordy)
            })
            .collect()
    }

    #[test]
    fn splits_words_numbers_cjk_and_symbols() {
        let got = units("Hello, x[12] = 2.5 的是 ✅😂 don't!");
        let expected = [
            ("Hello", true),
            ("x", false),
            ("12", false),
            ("2", false),
            ("5", false),
            ("的", true),
            ("是", true),
            ("✅", false),
            ("😂", true),
            ("don", true),
            ("t", false),
        ];
        let expected: Vec<(String, bool)> =
            expected.iter().map(|(s, w)| (s.to_string(), *w)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn case_folds_ascii_and_keeps_offsets() {
        let mut segmenter = WordSegmenter::default();
        let mut out = Vec::new();
        let mut emit = |u: WordUnit| out.push(u);
        for (i, c) in "Prime prime".chars().enumerate() {
            segmenter.push(c, i as u64, 2 * i as u64, &mut emit);
        }
        segmenter.flush(&mut emit);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].hash, out[1].hash);
        assert_eq!((out[0].start_char, out[1].start_char), (0, 6));
        assert_eq!(out[1].start_byte, 12);
    }
}
