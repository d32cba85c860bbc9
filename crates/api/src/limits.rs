//! The per-request limits (`--max-messages`, `--max-prompt-tokens`, `--max-tokens-cap`, `--max-n`,
//! `--max-top-logprobs`, `--max-stop-strings`) with their defaults, and the 400s that name the limit and
//! its flag. Parsing the fields themselves belongs to request.rs.

use crate::error::ApiError;

/// Default `--max-messages`.
pub const DEFAULT_MAX_MESSAGES: usize = 1024;
/// Default `--max-tokens-cap`.
pub const DEFAULT_MAX_TOKENS_CAP: usize = 32768;
/// Default `--max-n`.
pub const DEFAULT_MAX_N: usize = 16;
/// Default `--max-top-logprobs` (OpenAI's own limit).
pub const DEFAULT_MAX_TOP_LOGPROBS: usize = 20;
/// Default `--max-stop-strings`.
pub const DEFAULT_MAX_STOP_STRINGS: usize = 16;
/// Longest stop string in bytes (fixed: the stop matcher holds back this much text per choice).
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// Limits every request is checked against before it reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most chat messages in one request.
    pub max_messages: usize,
    /// Most prompt tokens; `None` means the context length (which always applies).
    pub max_prompt_tokens: Option<usize>,
    /// Largest `max_tokens` / `max_completion_tokens`; also caps the budget when neither is sent.
    pub max_tokens_cap: usize,
    /// Largest `n`.
    pub max_n: usize,
    /// Largest `top_logprobs` (chat) / `logprobs` (completions).
    pub max_top_logprobs: usize,
    /// Most stop strings.
    pub max_stop_strings: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_messages: DEFAULT_MAX_MESSAGES,
            max_prompt_tokens: None,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            max_n: DEFAULT_MAX_N,
            max_top_logprobs: DEFAULT_MAX_TOP_LOGPROBS,
            max_stop_strings: DEFAULT_MAX_STOP_STRINGS,
        }
    }
}

/// The 400 for `param` = `found` over `limit`, set by `flag`.
fn over(param: &str, what: &str, found: usize, limit: usize, flag: &str) -> ApiError {
    ApiError::over_limit(
        param,
        format!(
            "`{param}` has {found} {what}, more than this server's limit of {limit} (set by {flag})"
        ),
    )
}

impl RequestLimits {
    pub fn check_messages(&self, count: usize) -> Result<(), ApiError> {
        if count > self.max_messages {
            return Err(over(
                "messages",
                "messages",
                count,
                self.max_messages,
                "--max-messages",
            ));
        }
        Ok(())
    }

    /// `field` is `max_tokens` or `max_completion_tokens`.
    pub fn check_max_tokens(&self, field: &str, requested: usize) -> Result<(), ApiError> {
        if requested > self.max_tokens_cap {
            return Err(ApiError::over_limit(
                field,
                format!(
                    "`{field}` is {requested}, more than this server's limit of {} (set by --max-tokens-cap)",
                    self.max_tokens_cap
                ),
            ));
        }
        Ok(())
    }

    pub fn check_n(&self, n: usize) -> Result<(), ApiError> {
        if n > self.max_n {
            return Err(ApiError::over_limit(
                "n",
                format!(
                    "`n` is {n}, more than this server's limit of {} (set by --max-n)",
                    self.max_n
                ),
            ));
        }
        Ok(())
    }

    /// `field` is `top_logprobs` (chat) or `logprobs` (completions); negative values are the
    /// caller's type error.
    pub fn check_top_logprobs(&self, field: &str, k: usize) -> Result<(), ApiError> {
        if k > self.max_top_logprobs {
            return Err(ApiError::over_limit(
                field,
                format!(
                    "`{field}` is {k}, more than this server's limit of {} (set by --max-top-logprobs)",
                    self.max_top_logprobs
                ),
            ));
        }
        Ok(())
    }

    pub fn check_stop(&self, stop: &[String]) -> Result<(), ApiError> {
        if stop.len() > self.max_stop_strings {
            return Err(over(
                "stop",
                "strings",
                stop.len(),
                self.max_stop_strings,
                "--max-stop-strings",
            ));
        }
        if let Some((i, long)) = stop
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() > MAX_STOP_STRING_BYTES)
        {
            return Err(ApiError::over_limit(
                "stop",
                format!(
                    "`stop[{i}]` is {} bytes long, more than the limit of {MAX_STOP_STRING_BYTES} bytes per stop string",
                    long.len()
                ),
            ));
        }
        Ok(())
    }

    /// The prompt-length limit in effect: `--max-prompt-tokens` when set and below the context
    /// length, else `None` (the context-length check covers it).
    pub fn prompt_limit(&self, context_length: usize) -> Option<usize> {
        self.max_prompt_tokens
            .filter(|&limit| limit < context_length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_names_its_flag_and_numbers() {
        let limits = RequestLimits::default();
        let e = limits.check_messages(1025).unwrap_err();
        assert!(
            e.message.contains("1025")
                && e.message.contains("1024")
                && e.message.contains("--max-messages")
        );
        assert!(limits.check_messages(1024).is_ok());
        let e = limits.check_max_tokens("max_tokens", 32769).unwrap_err();
        assert!(e.message.contains("--max-tokens-cap") && e.message.contains("32768"));
        assert!(limits.check_max_tokens("max_tokens", 32768).is_ok());
        assert!(limits.check_n(17).unwrap_err().message.contains("--max-n"));
        assert!(limits.check_n(16).is_ok());
        let e = limits.check_top_logprobs("logprobs", 21).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        assert!(e.message.contains("--max-top-logprobs"));
        let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        assert!(limits
            .check_stop(&many)
            .unwrap_err()
            .message
            .contains("--max-stop-strings"));
        assert!(limits.check_stop(&many[..16]).is_ok());
        let long = vec!["x".repeat(257)];
        assert!(limits
            .check_stop(&long)
            .unwrap_err()
            .message
            .contains("256 bytes"));
        assert!(limits.check_stop(&["x".repeat(256)]).is_ok());
        assert_eq!(limits.prompt_limit(100), None);
        let set = RequestLimits {
            max_prompt_tokens: Some(50),
            ..limits
        };
        assert_eq!(
            (set.prompt_limit(100), set.prompt_limit(40)),
            (Some(50), None)
        );
    }
}
