//! The router: every route, the request-counting and API-key middlewares, the body-size limit, and the
//! small routes (/v1/models, /health, /metrics). Generation routes live in chat.rs, completions.rs
//! and responses.rs.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::json;

use crate::auth::require_api_key;
use crate::chat::chat_completions;
use crate::completions::completions;
use crate::error::ApiError;
use crate::health::HealthReport;
use crate::responses::responses;
use crate::state::AppState;
use crate::worker_info::{flush_cache, get_load, model_info, server_info};

/// Route names used as the metrics label; anything else is counted as "other".
const ROUTES: [&str; 14] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/health_generate",
    "/metrics",
    "/v1/models/{model}",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/get_load",
    "/flush_cache",
];

/// The full HTTP API over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{model}", get(get_model))
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/metrics", get(metrics))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/flush_cache", post(flush_cache).get(flush_cache))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            refuse_declared_oversize,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_api_key,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            count_requests,
        ))
        .with_state(state)
}

/// Answers 413 as soon as a `Content-Length` over the limit arrives, before reading any of the body:
/// otherwise each such client could make the server buffer up to the limit first.
async fn refuse_declared_oversize(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.config.max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => ApiError::payload_too_large(limit).into_response(),
        _ => next.run(request).await,
    }
}

/// Counts every answered request by route and status, and the requests in flight.
async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let route = if path.starts_with("/v1/models/") {
        "/v1/models/{model}"
    } else {
        ROUTES
            .iter()
            .copied()
            .find(|r| *r == path)
            .unwrap_or("other")
    };
    state.metrics.enter();
    let guard = InFlight(Arc::clone(&state));
    let response = next.run(request).await;
    state
        .metrics
        .record_request(route, response.status().as_u16());
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return response;
    }
    // A stream is in flight until its body ends or the client goes: the guard travels with the body.
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// Counts a request as in flight until dropped.
struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.leave();
    }
}

async fn not_found(request: Request) -> Response {
    ApiError::not_found(format!(
        "There is no route {} {}",
        request.method(),
        request.uri().path()
    ))
    .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    ApiError::method_not_allowed(request.method().as_str(), request.uri().path()).into_response()
}

fn model_card(state: &AppState) -> serde_json::Value {
    let mut card = json!({
        "id": state.config.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "deltaserve",
        "root": state.config.model_name,
        "parent": null,
    });
    if let Ok(engine) = state.engine() {
        card["max_model_len"] = json!(engine.context_length());
    }
    card
}

async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&state)]})).into_response()
}

async fn get_model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(model): axum::extract::Path<String>,
) -> Response {
    if state.serves_model(&model) {
        axum::Json(model_card(&state)).into_response()
    } else {
        ApiError::model_not_found(&model, &state.config.model_name).into_response()
    }
}

/// Token ids of the probe prompt /health generates from.
fn probe_prompt(state: &AppState) -> Vec<u32> {
    match state.tokenizer.encode("Hello", false) {
        Ok(ids) if !ids.is_empty() => ids,
        // A tokenizer that cannot encode "Hello" still has id 0.
        _ => vec![0],
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let engine = state.engine().ok();
    let report = state
        .health
        .check(engine.as_deref(), &probe_prompt(&state))
        .await;
    let (status, body) = match report {
        HealthReport::Healthy { probed } => {
            if probed {
                state.metrics.record_health_probe("success");
            }
            (StatusCode::OK, json!({"status": "ok", "probed": probed}))
        }
        HealthReport::Loading(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading", "reason": reason}),
        ),
        HealthReport::Failed(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "failed", "reason": reason}),
        ),
        HealthReport::Unhealthy(reason) => {
            state.metrics.record_health_probe("failure");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "unhealthy", "reason": reason}),
            )
        }
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if !state.config.enable_metrics {
        return ApiError::not_found("Metrics are off; start the server with --enable-metrics")
            .into_response();
    }
    let mut text = state.metrics.render();
    let engine_text = state.engine_metrics_text();
    if !engine_text.is_empty() {
        text.push_str(&engine_text);
        if !engine_text.ends_with('\n') {
            text.push('\n');
        }
    }
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
