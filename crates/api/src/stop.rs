//! Stop strings matched on detokenized text across token boundaries: text that could still become a
//! stop string is held back, and the matched stop string is never emitted. Pure text; aborting the
//! engine request on a match is the caller's job.

/// Result of feeding text to the matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text that can be emitted now (possibly empty while a partial match is held back).
    Emit(String),
    /// A stop string matched: the text before it, after which generation ends.
    Stopped(String),
}

/// Incremental stop-string matcher for one output.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty strings are ignored (the request validation refuses them anyway).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds the next piece of text. After `Stopped` every further call returns `Emit("")`.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Emit(String::new());
        }
        if self.stops.is_empty() {
            return StopOutcome::Emit(text.to_string());
        }
        // A stop string can only start inside the held-back tail or the new text, so searching the
        // concatenation finds every match, including one spread over many tokens.
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(pos) = first {
            self.stopped = true;
            let before = self.held[..pos].to_string();
            self.held.clear();
            return StopOutcome::Stopped(before);
        }
        let keep = self.partial_match_len();
        let emit_to = self.held.len() - keep;
        let emitted = self.held[..emit_to].to_string();
        self.held.drain(..emit_to);
        StopOutcome::Emit(emitted)
    }

    /// The held-back text at the end of the output (it never became a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Byte length of the longest tail of the held text that is a proper prefix of a stop string.
    fn partial_match_len(&self) -> usize {
        let text = &self.held;
        self.stops
            .iter()
            .map(|stop| {
                let longest = stop.len().saturating_sub(1).min(text.len());
                (1..=longest)
                    .rev()
                    .find(|&n| {
                        let start = text.len() - n;
                        text.is_char_boundary(start) && stop.starts_with(&text[start..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut matcher = StopMatcher::new(&stops);
        let mut out = String::new();
        for piece in pieces {
            match matcher.push(piece) {
                StopOutcome::Emit(text) => out.push_str(&text),
                StopOutcome::Stopped(text) => {
                    out.push_str(&text);
                    return (out, true);
                }
            }
        }
        out.push_str(&matcher.flush());
        (out, false)
    }

    #[test]
    fn stop_across_token_boundaries() {
        assert_eq!(
            run(&["STOP"], &["abc S", "T", "OP and more"]),
            ("abc ".to_string(), true)
        );
        assert_eq!(
            run(&["\n\n"], &["one\n", "\ntwo"]),
            ("one".to_string(), true)
        );
        assert_eq!(
            run(&["xyz", "b c"], &["a b", " c"]),
            ("a ".to_string(), true)
        );
    }

    #[test]
    fn partial_match_is_released_when_it_fails() {
        assert_eq!(run(&["STOP"], &["ST", "ART"]), ("START".to_string(), false));
        assert_eq!(run(&["STOP"], &["abc", "ST"]), ("abcST".to_string(), false));
    }

    #[test]
    fn held_text_never_leaks_before_the_decision() {
        let stops = vec!["</end>".to_string()];
        let mut matcher = StopMatcher::new(&stops);
        assert_eq!(matcher.push("text </e"), StopOutcome::Emit("text ".into()));
        assert_eq!(matcher.push("n"), StopOutcome::Emit(String::new()));
        assert_eq!(matcher.push("d> tail"), StopOutcome::Stopped(String::new()));
        assert!(matcher.is_stopped());
        assert_eq!(matcher.push("more"), StopOutcome::Emit(String::new()));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".to_string(), false));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".to_string(), true));
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }
}
