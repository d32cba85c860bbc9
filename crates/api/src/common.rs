//! Steps every generation route takes: reading the JSON body (400 invalid JSON, 413 too large), checking
//! the requested model (404), and accounting a finished choice in metrics, health and (when its output
//! degenerated) the log. Route-specific shaping stays in chat.rs and completions.rs.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiError;
use crate::generation::{ChoiceEnd, FinishKind};
use crate::metrics::GenerationRecord;
use crate::state::AppState;

/// The body as JSON, or the OpenAI error for an unreadable, oversized or invalid body.
pub fn read_json(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Value, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request(format!("Could not read the request body: {rejection}"))
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("The request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })
}

/// 404 unless `requested` is absent or the served model name.
pub fn check_model(state: &AppState, requested: Option<&str>) -> Result<(), ApiError> {
    match requested {
        Some(name) if !state.serves_model(name) => {
            Err(ApiError::model_not_found(name, &state.config.model_name))
        }
        _ => Ok(()),
    }
}

/// Counts a finished choice (choice `index` of response `response_id`); a choice that generated
/// tokens, ended normally and did not degenerate proves health. A degenerate one is counted by kind
/// and logged with its evidence and diagnosis.
pub fn account_choice(
    state: &AppState,
    end: &ChoiceEnd,
    finish_reason: &str,
    response_id: &str,
    index: usize,
) {
    state.metrics.record_generation(
        finish_reason,
        &GenerationRecord {
            prompt_tokens: end.usage.prompt_tokens,
            completion_tokens: end.usage.completion_tokens,
            reasoning_tokens: end.usage.reasoning_tokens,
            time_to_first_token: end.time_to_first_token,
            e2e: end.e2e,
        },
    );
    if let Some(report) = &end.degeneration {
        state.metrics.record_degeneration(report.verdict.kind);
        eprintln!("{}", report.log_line(response_id, index));
    } else if matches!(end.finish, FinishKind::Stop | FinishKind::Length)
        && end.usage.completion_tokens > 0
    {
        state.health.record_success();
    }
}

/// The first error among finished choices (500, or 504 for `--request-timeout`).
pub fn choice_error(ends: &[&ChoiceEnd]) -> Option<ApiError> {
    ends.iter().find_map(|end| finish_error(&end.finish))
}

/// The error a choice ended with, if it failed: sent as the response (non-streaming) or as an error
/// event (streaming).
pub fn finish_error(finish: &FinishKind) -> Option<ApiError> {
    match finish {
        FinishKind::Error(message) => {
            Some(ApiError::internal(format!("generation failed: {message}")))
        }
        FinishKind::TimedOut(limit) => Some(ApiError::request_timeout(*limit)),
        FinishKind::ShutDown => Some(ApiError::shutting_down()),
        FinishKind::Stop | FinishKind::Length | FinishKind::Abort => None,
    }
}
