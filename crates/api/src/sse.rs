//! Wraps a stream of ready-made SSE event text into an HTTP response with the event-stream headers.
//! Dropping the response body (client gone) drops the stream, and with it the engine requests.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::{Stream, StreamExt};

use crate::response::sse_bytes;

pub fn sse_response(events: impl Stream<Item = String> + Send + 'static) -> Response {
    let mut response = Response::new(Body::from_stream(events.map(sse_bytes)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tells reverse proxies (nginx) not to buffer the stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
