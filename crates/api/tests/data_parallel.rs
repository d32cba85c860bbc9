//! Data-parallel replicas (`--dp-size`) as the HTTP side sees them: /health is healthy only while
//! every replica is (each is probed, a failing one is named), a replica's own progress spares it
//! the probe, and /get_load has one entry per replica.

mod common;

use std::sync::Arc;

use common::{tokenizer, FakeEngine, Script, TestServer};
use deltaserve_api::{AppState, HealthStatus, ServerConfig};
use deltaserve_engine::{
    EngineHandle, EngineStats, EventReceiver, GenerationRequest, RequestId, SharedEngine,
    SubmitError,
};
use std::sync::atomic::{AtomicU64, Ordering};

/// Fake replicas behind one handle: submissions go to the first (the routes under test only
/// reach the replicas through `replicas()`).
struct FakeReplicas {
    replicas: Vec<Arc<FakeEngine>>,
    /// What `generated_tokens` of the second replica reports: its own progress.
    second_generated: Arc<AtomicU64>,
}

/// A replica whose generated-token count the test sets.
struct Progressing {
    inner: Arc<FakeEngine>,
    generated: Arc<AtomicU64>,
}

impl EngineHandle for Progressing {
    fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        self.inner.submit(request)
    }
    fn abort(&self, id: RequestId) {
        self.inner.abort(id)
    }
    fn stats(&self) -> EngineStats {
        self.inner.stats()
    }
    fn context_length(&self) -> usize {
        self.inner.context_length()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn generated_tokens(&self) -> u64 {
        self.generated.load(Ordering::SeqCst)
    }
}

impl EngineHandle for FakeReplicas {
    fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        self.replicas[0].submit(request)
    }
    fn abort(&self, id: RequestId) {
        self.replicas[0].abort(id)
    }
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn context_length(&self) -> usize {
        self.replicas[0].context_length()
    }
    fn vocab_size(&self) -> usize {
        self.replicas[0].vocab_size()
    }
    fn replicas(&self) -> Vec<SharedEngine> {
        vec![
            self.replicas[0].clone(),
            Arc::new(Progressing {
                inner: self.replicas[1].clone(),
                generated: self.second_generated.clone(),
            }),
        ]
    }
}

async fn server_of(
    first: Arc<FakeEngine>,
    second: Arc<FakeEngine>,
) -> (TestServer, Arc<AtomicU64>) {
    let mut config = ServerConfig::new("test-model");
    config.dp_size = 2;
    let state = Arc::new(AppState::new(config, tokenizer()));
    let second_generated = Arc::new(AtomicU64::new(0));
    state.attach_engine(Arc::new(FakeReplicas {
        replicas: vec![first.clone(), second],
        second_generated: second_generated.clone(),
    }));
    state.health.set(HealthStatus::Ready);
    (TestServer::serve(state, first).await, second_generated)
}

fn failing() -> Arc<FakeEngine> {
    FakeEngine::new(|_: &GenerationRequest| Script {
        error: Some("NaN in logits".into()),
        ..Script::default()
    })
}

#[tokio::test]
async fn health_probes_every_replica_and_names_a_failing_one() {
    let (first, second) = (FakeEngine::replying("Hi"), FakeEngine::replying("Hi"));
    let (server, _) = server_of(first.clone(), second.clone()).await;
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["probed"], true);
    assert_eq!(first.requests().len(), 1, "replica 0 probed");
    assert_eq!(second.requests().len(), 1, "replica 1 probed");
    // Both proved themselves within the interval: no probe now.
    let reply = server.get("/health").await;
    assert_eq!(reply.json()["probed"], false);
    assert_eq!(first.requests().len() + second.requests().len(), 2);

    let (server, _) = server_of(FakeEngine::replying("Hi"), failing()).await;
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.json()["status"], "unhealthy");
    let reason = reply.json()["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("replica 1 of 2") && reason.contains("NaN in logits"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_replica_that_generates_needs_no_probe_and_a_healthy_one_does_not_cover_it() {
    // Replica 1 fails every generation, but it is seen generating tokens: counted alive without
    // a probe (as a single engine is by its recent requests).
    let (first, second) = (FakeEngine::replying("Hi"), failing());
    let (server, second_generated) = server_of(first.clone(), second.clone()).await;
    second_generated.store(17, Ordering::SeqCst);
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(second.requests().len(), 0, "replica 1 was not probed");
    assert_eq!(first.requests().len(), 1, "replica 0 was probed");

    // Replica 0 answering requests says nothing of replica 1: without progress of its own it is
    // probed, and fails.
    let (first, second) = (FakeEngine::replying("Hi"), failing());
    let (server, _) = server_of(first.clone(), second.clone()).await;
    let chat = serde_json::json!({"messages": [{"role": "user", "content": "q"}]});
    assert_eq!(server.post("/v1/chat/completions", &chat).await.status, 200);
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(second.requests().len(), 1);
}

#[tokio::test]
async fn get_load_and_server_info_cover_every_replica() {
    let (first, second) = (FakeEngine::replying("Hi"), FakeEngine::replying("Hi"));
    *first.stats.lock().unwrap() = EngineStats {
        running: 2,
        queued: 1,
        ..EngineStats::default()
    };
    *second.stats.lock().unwrap() = EngineStats {
        running: 5,
        ..EngineStats::default()
    };
    let (server, _) = server_of(first, second).await;
    let load = server.get("/get_load").await.json();
    let entries = load.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{load}");
    assert_eq!(entries[0]["dp_rank"], 0);
    assert_eq!(entries[0]["num_reqs"], 3);
    assert_eq!(entries[0]["num_waiting_reqs"], 1);
    assert_eq!(entries[1]["dp_rank"], 1);
    assert_eq!(entries[1]["num_running_reqs"], 5);
    assert_eq!(server.get("/server_info").await.json()["dp_size"], 2);
}

#[tokio::test]
async fn get_load_while_loading_has_one_idle_entry_per_replica() {
    let mut config = ServerConfig::new("test-model");
    config.dp_size = 3;
    let state = Arc::new(AppState::new(config, tokenizer()));
    let server = TestServer::serve(state, FakeEngine::replying("Hi")).await;
    let load = server.get("/get_load").await.json();
    let ranks: Vec<u64> = load
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["num_reqs"], 0);
            e["dp_rank"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(ranks, [0, 1, 2]);
}
