//! Finds literal `<think>` and `</think>` in generated text, character by character, so a tag split
//! across token deltas is still seen. Owns only the matching; the reasoning budget is the detector's.

const OPEN: &[char] = &['<', 't', 'h', 'i', 'n', 'k', '>'];
const CLOSE: &[char] = &['<', '/', 't', 'h', 'i', 'n', 'k', '>'];

/// A completed tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThinkTag {
    Open,
    Close,
}

/// How much of each tag the latest characters spell.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThinkTagScanner {
    open_matched: usize,
    close_matched: usize,
}

/// Advances a match of `tag` by `c`. Restarting at `<` (or from nothing) is exact because `<` only
/// occurs as the first character of either tag.
fn advance(matched: usize, tag: &[char], c: char) -> usize {
    if tag[matched] == c {
        matched + 1
    } else if c == '<' {
        1
    } else {
        0
    }
}

impl ThinkTagScanner {
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Reads one character; returns the tag it completes, if any.
    pub(crate) fn push(&mut self, c: char) -> Option<ThinkTag> {
        self.open_matched = advance(self.open_matched, OPEN, c);
        self.close_matched = advance(self.close_matched, CLOSE, c);
        if self.open_matched == OPEN.len() {
            self.open_matched = 0;
            return Some(ThinkTag::Open);
        }
        if self.close_matched == CLOSE.len() {
            self.close_matched = 0;
            return Some(ThinkTag::Close);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pieces: &[&str]) -> Vec<ThinkTag> {
        let mut scanner = ThinkTagScanner::default();
        pieces
            .iter()
            .flat_map(|p| p.chars())
            .filter_map(|c| scanner.push(c))
            .collect()
    }

    #[test]
    fn finds_tags_split_across_deltas() {
        assert_eq!(
            tags(&["<th", "ink>\nhmm </t", "hink", ">\n\nanswer"]),
            [ThinkTag::Open, ThinkTag::Close]
        );
    }

    #[test]
    fn ignores_near_misses_and_restarts_on_angle_bracket() {
        assert_eq!(tags(&["<thin k> </thinks <<think>"]), [ThinkTag::Open]);
        assert_eq!(tags(&["a < b </</think>"]), [ThinkTag::Close]);
        assert!(tags(&["<thinking> no tags here"]).is_empty());
    }
}
