//! Helpers for finding tags in streamed text: where the earliest of several tags starts, and how much of a
//! chunk's tail might be the beginning of a tag and must be held back. Text search only, no parser state.

/// The earliest complete occurrence of any of `tags` in `text`: (byte offset, index into `tags`).
pub(crate) fn find_first(text: &str, tags: &[&str]) -> Option<(usize, usize)> {
    tags.iter()
        .enumerate()
        .filter_map(|(i, tag)| text.find(tag).map(|pos| (pos, i)))
        .min()
}

/// Byte length of the longest tail of `text` that is a proper, non-empty prefix of one of `tags`, i.e. the
/// part that could still turn into a tag when more text arrives.
pub(crate) fn partial_tag_len(text: &str, tags: &[&str]) -> usize {
    tags.iter()
        .map(|tag| {
            let longest = tag.len().saturating_sub(1).min(text.len());
            (1..=longest)
                .rev()
                .find(|&n| {
                    text.is_char_boundary(text.len() - n)
                        && tag.starts_with(&text[text.len() - n..])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// Byte length of the whitespace at the end of `text`.
pub(crate) fn trailing_whitespace_len(text: &str) -> usize {
    text.len() - text.trim_end().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_tags() {
        let tags = ["</think>", "<tool_call>"];
        assert_eq!(partial_tag_len("abc</th", &tags), 4);
        assert_eq!(partial_tag_len("abc<", &tags), 1);
        assert_eq!(partial_tag_len("abc<tool_", &tags), 6);
        assert_eq!(partial_tag_len("abc</think>", &tags), 0);
        assert_eq!(partial_tag_len("abc", &tags), 0);
        assert_eq!(partial_tag_len("é<", &tags), 1);
        assert_eq!(partial_tag_len("", &tags), 0);
    }

    #[test]
    fn first_tag() {
        let tags = ["</think>", "<tool_call>"];
        assert_eq!(find_first("a<tool_call>b</think>", &tags), Some((1, 1)));
        assert_eq!(find_first("a</think><tool_call>", &tags), Some((1, 0)));
        assert_eq!(find_first("none", &tags), None);
        assert_eq!(trailing_whitespace_len("ab \n\t"), 3);
    }
}
