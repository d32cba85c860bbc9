//! Test support: a scripted fake `EngineHandle` that emits known token ids of the fixture tokenizer and
//! records submissions and aborts, a server started on an ephemeral port, and a small HTTP client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use deltaserve_api::{
    serve_until_stopped_or_lost, AppState, HealthStatus, ServeError, ServerConfig, Shutdown,
};
use deltaserve_engine::{
    EngineEvent, EngineHandle, EngineStats, EventReceiver, FinishReason, GenerationRequest,
    RequestId, SubmitError, TokenLogprob, Usage,
};
use deltaserve_text::Tokenizer;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::mpsc;

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

pub fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            Arc::new(Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads"))
        })
        .clone()
}

/// Token ids of `text` in the fixture tokenizer (special tokens such as `</think>` become their ids).
pub fn ids(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap()
}

pub const IM_END: u32 = 1493;

/// What the fake engine generates for one request.
#[derive(Clone, Debug, Default)]
pub struct Script {
    pub tokens: Vec<u32>,
    /// Pause before each token.
    pub delay: Duration,
    /// Cycle `tokens` forever (until max_new_tokens or abort).
    pub repeat: bool,
    /// Fail with this message after the tokens instead of finishing.
    pub error: Option<String>,
    /// Speculative counts reported in the final usage.
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
    /// When set, every token counts one draft, accepted when this says so for the token's index; the
    /// engine-wide counters of `prometheus_metrics` and the final usage follow (the fields above are
    /// then ignored).
    pub accept: Option<fn(usize) -> bool>,
}

impl Script {
    pub fn text(reply: &str) -> Self {
        Self {
            tokens: ids(reply),
            ..Self::default()
        }
    }
}

type ScriptFn = dyn Fn(&GenerationRequest) -> Script + Send + Sync;

/// A scripted engine: each request runs on its own thread, emitting the script's tokens.
pub struct FakeEngine {
    script: Box<ScriptFn>,
    next_id: AtomicU64,
    pub submitted: Mutex<Vec<(RequestId, GenerationRequest)>>,
    pub aborted: Mutex<Vec<RequestId>>,
    flags: Mutex<HashMap<RequestId, Arc<AtomicBool>>>,
    pub queue_full: AtomicBool,
    pub context: usize,
    /// Engine-wide speculative counters (drafted, accepted), as the real engine exports them.
    pub spec_counters: Arc<(AtomicU64, AtomicU64)>,
    /// What `stats()` reports.
    pub stats: Mutex<EngineStats>,
    /// What `device_lost()` reports.
    pub lost: Mutex<Option<String>>,
}

impl FakeEngine {
    pub fn new(script: impl Fn(&GenerationRequest) -> Script + Send + Sync + 'static) -> Arc<Self> {
        Self::with_context(script, 4096)
    }

    pub fn with_context(
        script: impl Fn(&GenerationRequest) -> Script + Send + Sync + 'static,
        context: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            script: Box::new(script),
            next_id: AtomicU64::new(1),
            submitted: Mutex::new(Vec::new()),
            aborted: Mutex::new(Vec::new()),
            flags: Mutex::new(HashMap::new()),
            queue_full: AtomicBool::new(false),
            context,
            spec_counters: Arc::new((AtomicU64::new(0), AtomicU64::new(0))),
            stats: Mutex::new(EngineStats::default()),
            lost: Mutex::new(None),
        })
    }

    /// Always answers `reply`.
    pub fn replying(reply: &str) -> Arc<Self> {
        let script = Script::text(reply);
        Self::new(move |_| script.clone())
    }

    pub fn requests(&self) -> Vec<GenerationRequest> {
        self.submitted
            .lock()
            .unwrap()
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    pub fn ids(&self) -> Vec<RequestId> {
        self.submitted
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn aborted(&self) -> Vec<RequestId> {
        self.aborted.lock().unwrap().clone()
    }

    /// Waits up to 3 s for `id` to be aborted.
    pub async fn wait_aborted(&self, id: RequestId) -> bool {
        for _ in 0..300 {
            if self.aborted().contains(&id) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

/// Fake log-probability of the i-th generated token and its alternatives.
pub fn fake_logprob(i: usize, id: u32, k: usize) -> TokenLogprob {
    TokenLogprob {
        logprob: -0.25 * (i as f32 + 1.0),
        top: (0..k)
            .map(|j| {
                (
                    if j == 0 { id } else { (id + j as u32) % 1000 },
                    -0.25 * (i as f32 + 1.0) - j as f32,
                )
            })
            .collect(),
    }
}

impl EngineHandle for FakeEngine {
    fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        if self.queue_full.load(Ordering::SeqCst) {
            return Err(SubmitError::QueueFull(64));
        }
        if request.prompt_ids.len() + request.max_new_tokens > self.context {
            return Err(SubmitError::TooLong {
                prompt: request.prompt_ids.len(),
                max_new: request.max_new_tokens,
                total: request.prompt_ids.len() + request.max_new_tokens,
                context: self.context,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let script = (self.script)(&request);
        self.submitted.lock().unwrap().push((id, request.clone()));
        let flag = Arc::new(AtomicBool::new(false));
        self.flags.lock().unwrap().insert(id, Arc::clone(&flag));
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::clone(&self.spec_counters);
        std::thread::spawn(move || {
            let usage = |completion: usize| match script.accept {
                Some(accept) => Usage {
                    prompt_tokens: request.prompt_ids.len(),
                    completion_tokens: completion,
                    draft_tokens: completion,
                    accepted_draft_tokens: (0..completion).filter(|&i| accept(i)).count(),
                    ..Usage::default()
                },
                None => Usage {
                    prompt_tokens: request.prompt_ids.len(),
                    completion_tokens: completion,
                    draft_tokens: script.draft_tokens,
                    accepted_draft_tokens: script.accepted_draft_tokens,
                    ..Usage::default()
                },
            };
            let mut sent = 0;
            let mut position = 0;
            loop {
                if flag.load(Ordering::SeqCst) {
                    let _ = tx.send(EngineEvent::Finished {
                        reason: FinishReason::Abort,
                        usage: usage(sent),
                    });
                    return;
                }
                if sent == request.max_new_tokens {
                    let _ = tx.send(EngineEvent::Finished {
                        reason: FinishReason::Length,
                        usage: usage(sent),
                    });
                    return;
                }
                if position == script.tokens.len() {
                    if script.repeat && !script.tokens.is_empty() {
                        position = 0;
                    } else {
                        let event = match &script.error {
                            Some(message) => EngineEvent::Error {
                                message: message.clone(),
                            },
                            None => EngineEvent::Finished {
                                reason: FinishReason::Stop,
                                usage: usage(sent),
                            },
                        };
                        let _ = tx.send(event);
                        return;
                    }
                }
                std::thread::sleep(script.delay);
                let token = script.tokens[position];
                let logprob = request
                    .sampling
                    .logprobs
                    .map(|k| fake_logprob(sent, token, k));
                if let Some(accept) = script.accept {
                    counters.0.fetch_add(1, Ordering::SeqCst);
                    counters.1.fetch_add(accept(sent) as u64, Ordering::SeqCst);
                }
                position += 1;
                sent += 1;
                if tx.send(EngineEvent::Token { id: token, logprob }).is_err() {
                    return;
                }
                if request.stop_token_ids.contains(&token) {
                    let _ = tx.send(EngineEvent::Finished {
                        reason: FinishReason::Stop,
                        usage: usage(sent),
                    });
                    return;
                }
            }
        });
        Ok((id, rx))
    }

    fn abort(&self, id: RequestId) {
        self.aborted.lock().unwrap().push(id);
        if let Some(flag) = self.flags.lock().unwrap().get(&id) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    fn device_lost(&self) -> Option<String> {
        self.lost.lock().unwrap().clone()
    }

    fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap().clone()
    }

    fn context_length(&self) -> usize {
        self.context
    }

    fn vocab_size(&self) -> usize {
        1500
    }

    fn prometheus_metrics(&self) -> String {
        format!(
            "deltaserve_spec_decode_num_draft_tokens_total {}\ndeltaserve_spec_decode_num_accepted_tokens_total {}\n",
            self.spec_counters.0.load(Ordering::SeqCst),
            self.spec_counters.1.load(Ordering::SeqCst)
        )
    }
}

/// A server on 127.0.0.1 with an ephemeral port.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    pub engine: Arc<FakeEngine>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub handle: Option<tokio::task::JoinHandle<Result<Shutdown, ServeError>>>,
}

impl TestServer {
    pub async fn start(engine: Arc<FakeEngine>) -> Self {
        Self::start_with(engine, |_| {}).await
    }

    pub async fn start_with(
        engine: Arc<FakeEngine>,
        configure: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let mut config = ServerConfig::new("test-model");
        configure(&mut config);
        let state = Arc::new(AppState::new(config, tokenizer()));
        state.attach_engine(engine.clone());
        state.health.set(HealthStatus::Ready);
        Self::serve(state, engine).await
    }

    /// Serves `state` as it is (engine attached or not).
    pub async fn serve(state: Arc<AppState>, engine: Arc<FakeEngine>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = tokio::spawn(serve_until_stopped_or_lost(
            listener,
            state.clone(),
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            state,
            engine,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// Signals shutdown and waits for the server to return.
    pub async fn stop(&mut self) -> Result<Shutdown, ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle.take().unwrap().await.unwrap()
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        request(self.addr, "POST", path, Some(body.to_string().into_bytes())).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> Reply {
        request(self.addr, "POST", path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        request(self.addr, "GET", path, None).await
    }

    /// GET with extra request headers (e.g. `authorization`).
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        request_with_headers(self.addr, "GET", path, None, headers).await
    }

    /// POST with extra request headers (e.g. `authorization`).
    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let body = Some(body.to_string().into_bytes());
        request_with_headers(self.addr, "POST", path, body, headers).await
    }
}

/// A whole HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` events of an SSE body; asserts the stream ends with `[DONE]`.
    pub fn events(&self) -> Vec<Value> {
        assert_eq!(
            self.headers.get("content-type").unwrap(),
            "text/event-stream",
            "{}",
            self.body
        );
        assert!(
            self.body.ends_with("data: [DONE]\n\n"),
            "stream must end with [DONE]: {}",
            self.body
        );
        self.body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|event| {
                let payload = event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"));
                payload
            })
            .filter(|p| *p != "[DONE]")
            .map(|p| serde_json::from_str(p).unwrap())
            .collect()
    }

    /// The events of a streamed /v1/responses reply: each an `event:` line naming its type and a
    /// `data:` line whose `type` is that name, numbered from 0 without gaps (there is no `[DONE]`).
    #[allow(dead_code)] // not every test binary streams responses
    pub fn named_events(&self) -> Vec<Value> {
        assert_eq!(self.status, 200, "{}", self.body);
        assert_eq!(
            self.headers.get("content-type").unwrap(),
            "text/event-stream"
        );
        let events: Vec<Value> = self
            .body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|event| {
                let (name, data) = event
                    .strip_prefix("event: ")
                    .and_then(|rest| rest.split_once("\ndata: "))
                    .unwrap_or_else(|| panic!("not a named SSE event: {event:?}"));
                let data: Value = serde_json::from_str(data).unwrap();
                assert_eq!(data["type"], name, "{event}");
                data
            })
            .collect();
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event["sequence_number"], i, "{}", self.body);
        }
        events
    }

    /// Asserts an OpenAI error object with exactly the four fields; returns it.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let body = self.json();
        let error = body["error"].clone();
        let keys: Vec<&str> = error
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["message", "type", "param", "code"], "{}", self.body);
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(error["type"].is_string());
        error
    }
}

pub async fn connect(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, task)
}

pub fn build(method: &str, path: &str, body: Option<Vec<u8>>) -> hyper::Request<Full<Bytes>> {
    hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap()
}

pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<Vec<u8>>) -> Reply {
    request_with_headers(addr, method, path, body, &[]).await
}

pub async fn request_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Reply {
    let (mut sender, _task) = connect(addr).await;
    let mut built = build(method, path, body);
    for (name, value) in headers {
        built.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            hyper::header::HeaderValue::from_str(value).unwrap(),
        );
    }
    let response = sender.send_request(built).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}
