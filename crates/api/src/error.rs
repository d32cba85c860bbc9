//! The OpenAI error object `{"error": {"message", "type", "param", "code"}}` with its HTTP status, and
//! the mapping of engine submit errors onto it. Which request field is wrong is decided by the callers.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use deltaserve_engine::SubmitError;
use serde_json::json;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error` (also 401), `rate_limit_error`, `service_unavailable`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .with_param(param)
            .with_code("invalid_value")
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 for a field this server understands but does not implement.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .with_param(param)
            .with_code("unsupported_value")
    }

    pub fn model_not_found(requested: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{requested}` does not exist; this server serves `{served}`"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 401 for a missing or wrong API key (OpenAI's `invalid_api_key`).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    /// 400 for a request over one of the server's request limits (`--max-*` flags).
    pub fn over_limit(param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .with_param(param)
            .with_code("limit_exceeded")
    }

    pub fn context_length(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .with_param("messages")
            .with_code("context_length_exceeded")
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "The request body is larger than this server's limit of {limit} bytes (set by \
                 --max-body-bytes)"
            ),
        )
        .with_code("request_too_large")
    }

    pub fn queue_full(message: impl Into<String>) -> Self {
        let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .with_code("queue_full");
        error.retry_after = Some(1);
        error
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        );
        error.retry_after = Some(5);
        error
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 504 when `--request-timeout` (`limit`) expired before the generation finished.
    pub fn request_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            format!(
                "The request did not finish within this server's limit of {} s (set by \
                 --request-timeout); its generation was aborted",
                limit.as_secs_f64()
            ),
        )
        .with_code("request_timeout")
    }

    /// 503 for a generation cut because the server's shutdown grace period ran out.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The server is shutting down and its grace period (--shutdown-grace-period) ran out before this \
             generation finished; it was aborted. Retry against a running server.",
        )
        .with_code("server_shutdown")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message).with_code("not_found")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not accept {method}"),
        )
        .with_code("method_not_allowed")
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body, also used inside an SSE stream when a request fails after streaming began.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// Maps an engine refusal; `param` names the field that set the token budget.
    pub fn from_submit(error: SubmitError) -> Self {
        let message = error.to_string();
        match error {
            SubmitError::EmptyPrompt => Self::invalid("prompt", message),
            SubmitError::TooLong { .. } => Self::context_length(message),
            SubmitError::BadToken { .. } => Self::invalid("prompt", message),
            SubmitError::QueueFull(_) => Self::queue_full(message),
            SubmitError::Stopped => Self::unavailable(message),
            SubmitError::ConstraintUnsupported => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
