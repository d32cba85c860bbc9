//! Running the HTTP server: an accept loop serving the router over HTTP/1.1, at most
//! `--max-concurrent-connections` at once, and graceful shutdown on SIGTERM/SIGINT (stop accepting,
//! finish in-flight requests within the grace period, then cut and abort the rest). Not model loading.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::routes::router;
use crate::state::AppState;

/// Errors of running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("the device is lost ({0}): the server stopped so that its supervisor can restart it")]
    DeviceLost(String),
}

/// How a server run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Every in-flight request finished within the grace period.
    Graceful,
    /// The grace period ran out; the remaining connections were cut.
    GracePeriodExpired,
}

/// Binds `addr` (port 0 picks a free port).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// After the grace period, how long cut generations get to send their final error to the client.
const FINAL_WORDS: Duration = Duration::from_secs(2);

/// Serves `state` on `listener` until `shutdown` completes, then drains within `state`'s grace period.
pub async fn serve_until(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Shutdown, ServeError> {
    let grace = state.config.grace_period;
    let state_cut = state.shutdown_cut.clone();
    let slots = Arc::new(Semaphore::new(state.config.max_connections.max(1)));
    let service = TowerToHyperService::new(router(state));
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    // A slot taken before accepting: at the limit nothing is accepted, and new clients wait in the
    // kernel's listen backlog until an open connection closes.
    let mut slot: Option<OwnedSemaphorePermit> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            acquired = Arc::clone(&slots).acquire_owned(), if slot.is_none() => {
                match acquired {
                    Ok(permit) => slot = Some(permit),
                    // The semaphore is never closed; stop serving rather than spin if it were.
                    Err(_) => break,
                }
            }
            accepted = listener.accept(), if slot.is_some() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let permit = slot.take();
                // Latency matters more than packet count for SSE tokens.
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let mut stopping = stopping_rx.clone();
                connections.spawn(async move {
                    // Held until the connection closes.
                    let _permit = permit;
                    let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(connection);
                    tokio::select! {
                        _ = connection.as_mut() => {}
                        _ = async { stopping.wait_for(|&s| s).await.is_ok() } => {
                            // Finish the request in flight, then close instead of keeping alive.
                            connection.as_mut().graceful_shutdown();
                            let _ = connection.await;
                        }
                    }
                });
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    match drained {
        Ok(()) => Ok(Shutdown::Graceful),
        Err(_) => {
            // End every running generation with an error (an SSE error event and [DONE], or an
            // error response), give those a moment to reach their clients, then cut what is left.
            state_cut.send_replace(true);
            let _ = tokio::time::timeout(FINAL_WORDS, async {
                while connections.join_next().await.is_some() {}
            })
            .await;
            connections.abort_all();
            while connections.join_next().await.is_some() {}
            Ok(Shutdown::GracePeriodExpired)
        }
    }
}

/// `serve_until`, also stopping (after the same drain) when the engine's device is lost: then the
/// result is `ServeError::DeviceLost`, so the process exits non-zero for its supervisor.
pub async fn serve_until_stopped_or_lost(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Shutdown, ServeError> {
    let (lost_tx, mut lost_rx) = tokio::sync::oneshot::channel();
    let watched = state.clone();
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            cause = device_loss(watched) => {
                eprintln!("deltaserve: the device is lost ({cause}); draining and stopping");
                let _ = lost_tx.send(cause);
            }
        }
    };
    let outcome = serve_until(listener, state, stop).await?;
    match lost_rx.try_recv() {
        Ok(cause) => Err(ServeError::DeviceLost(cause)),
        Err(_) => Ok(outcome),
    }
}

/// How often the server asks the engine whether its device is still there.
const DEVICE_LOSS_POLL: Duration = Duration::from_millis(250);

/// Resolves, with its cause, once the attached engine reports its device lost (it then fails every
/// request, so serving on would only hand out errors).
pub async fn device_loss(state: Arc<AppState>) -> String {
    loop {
        if let Some(cause) = state.engine().ok().and_then(|e| e.device_lost()) {
            return cause;
        }
        tokio::time::sleep(DEVICE_LOSS_POLL).await;
    }
}

/// Resolves when the process receives SIGTERM or SIGINT (Ctrl-C).
pub async fn termination_signal() {
    let ctrl_c = async {
        // If the handler cannot be installed, never resolve rather than shut down at once.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// The `deltaserve serve` entry point: serves on `listener` (from `bind`) until SIGTERM/SIGINT. The
/// caller may load the model meanwhile (spawn this first; /health answers 503 until the engine is
/// attached and ready), and says where it listens once it is ready.
pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> Result<Shutdown, ServeError> {
    let grace = state.config.grace_period;
    let outcome = serve_until_stopped_or_lost(listener, state, termination_signal()).await?;
    match outcome {
        Shutdown::Graceful => eprintln!("deltaserve: shut down; every in-flight request finished"),
        Shutdown::GracePeriodExpired => eprintln!(
            "deltaserve: shut down after the {} s grace period; unfinished requests were aborted",
            grace.as_secs()
        ),
    }
    Ok(outcome)
}
