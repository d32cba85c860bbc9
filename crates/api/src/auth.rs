//! Bearer-token authentication (`--api-key` / `DELTASERVE_API_KEY`): the redacted key type, the
//! constant-time comparison and the middleware that answers 401 before any handler runs. Which routes
//! stay open is decided here; what the routes do is not.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// The API key clients must send as `Authorization: Bearer KEY`. Its `Debug` never shows the key, and
/// equality is constant-time.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// Whether `presented` is this key, in time that depends only on the lengths.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl PartialEq for ApiKey {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl FromStr for ApiKey {
    type Err = std::convert::Infallible;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(key))
    }
}

/// Compares every byte of the longer input whatever the content, so the time taken does not reveal
/// how long a matching prefix is.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut difference = u64::from(expected.len() != presented.len());
    for i in 0..expected.len().max(presented.len()) {
        let a = expected.get(i).copied().unwrap_or(0);
        let b = presented.get(i).copied().unwrap_or(0);
        difference |= u64::from(a ^ b);
    }
    std::hint::black_box(difference) == 0
}

/// Routes answered without a key: load balancers and orchestrators probe /health unauthenticated.
fn is_open(path: &str, metrics_no_auth: bool) -> bool {
    matches!(path, "/health" | "/health_generate") || (metrics_no_auth && path == "/metrics")
}

/// The 401 with OpenAI's `invalid_api_key` error object and a `WWW-Authenticate: Bearer` challenge.
fn unauthorized(message: &str) -> Response {
    let mut response = ApiError::unauthorized(message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The bearer token of an `Authorization` header value (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

/// Middleware: with `--api-key` set, every route but the open ones needs the right bearer token.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    if is_open(request.uri().path(), state.config.metrics_no_auth) {
        return next.run(request).await;
    }
    let Some(header) = request.headers().get(header::AUTHORIZATION) else {
        return unauthorized(
            "Missing API key: this server was started with --api-key (or DELTASERVE_API_KEY); send \
             `Authorization: Bearer <key>`",
        );
    };
    let Some(token) = bearer_token(header.as_bytes()) else {
        return unauthorized(
            "The Authorization header must be `Bearer <key>` (this server was started with --api-key)",
        );
    };
    if !key.matches(token) {
        return unauthorized("Incorrect API key provided");
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_needs_every_byte_and_the_length() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b""));
        assert!(!constant_time_eq(b"a\0", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn debug_redacts_the_key() {
        let key = ApiKey::new("sk-very-secret");
        assert!(!format!("{key:?}").contains("very-secret"));
        assert!(key.matches(b"sk-very-secret"));
    }

    #[test]
    fn bearer_scheme_is_parsed() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert!(is_open("/health", false) && is_open("/health_generate", false));
        assert!(!is_open("/metrics", false) && is_open("/metrics", true));
        assert!(!is_open("/v1/models", true));
    }
}
