//! The HTTP/1.1 listener: accepts TCP connections and serves a router on each, with the
//! buffer sizes and time limits of a service that holds thousands of SSE streams open.
//!
//! `axum::serve` fixes hyper's connection settings; this loop sets them ([`HttpServer`]):
//! - a cap on a request head (`max_head_bytes`), which also stops hyper's read buffer from
//!   doubling to 16 KB on a connection that only waits for its response to stream (held for
//!   the whole turn, ×10,000 held streams); hyper applies the same limit to the response
//!   bytes it queues before flushing, which only means more, smaller writes for big bodies;
//! - a limit on the time a client may take to send a request head (slow-header clients would
//!   otherwise hold a connection and its buffers forever); hyper also applies it between
//!   requests, so an idle keep-alive connection closes after it;
//! - `TCP_NODELAY`, so small SSE frames are not held back by Nagle's algorithm.
//!
//! Shutdown is graceful, within a deadline: once the signal resolves, nothing new is accepted,
//! idle connections close, and in-flight responses may finish for `drain_timeout`; a
//! connection still open then (a client that stopped reading, so its response cannot end) is
//! closed, so the stores behind the service can close and the process exit.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Connection settings of [`HttpServer::serve`].
#[derive(Debug, Clone)]
pub struct HttpServer {
    /// Largest request head (request line and headers) accepted; a larger one is refused with
    /// 431 and the connection closed. At least 8,192 (hyper's floor). Default: 8,192 — the
    /// request heads of the chat contract (docs/service.md) are a few hundred bytes, and nginx's default is the same.
    pub max_head_bytes: usize,
    /// Time a client has to send a whole request head, also the longest a keep-alive
    /// connection may sit idle between requests. Default: 30 s.
    pub header_read_timeout: Duration,
    /// After the shutdown signal, how long in-flight responses may take to finish before their
    /// connections are closed. Default: 30 s. Under an orchestrator, set it below the kill
    /// timeout (Kubernetes: 30 s) so the stores still close before the process is killed.
    pub drain_timeout: Duration,
}

impl Default for HttpServer {
    fn default() -> Self {
        Self {
            max_head_bytes: MIN_HEAD_BYTES,
            header_read_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// hyper refuses (panics on) a smaller read-buffer limit.
const MIN_HEAD_BYTES: usize = 8 * 1024;

impl HttpServer {
    /// Serves `router` on connections accepted from `listener` until `shutdown` resolves, then
    /// stops accepting, waits up to [`HttpServer::drain_timeout`] for the open connections to
    /// finish their responses, and closes those still open.
    ///
    /// # Errors
    /// None today: accept failures (a connection reset before it was accepted, the process out
    /// of file descriptors) are logged and the loop goes on; the `Result` leaves room for a
    /// listener that can fail for good.
    pub async fn serve(
        &self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_buf_size(self.max_head_bytes.max(MIN_HEAD_BYTES));
        let graceful = GracefulShutdown::new();
        // The connection tasks, so the drain deadline can drop the ones still open; finished
        // ones are reaped as they end, so the set holds only live connections.
        let mut connections = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => break,
                Some(ended) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(e) = ended
                        && e.is_panic()
                    {
                        tracing::error!(error = %e, "a connection task panicked");
                    }
                    continue;
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = accept_failed(&e) => continue,
                        }
                    }
                },
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::warn!(error = %e, "cannot set TCP_NODELAY");
            }
            let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
            let conn = graceful.watch(conn);
            connections.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        if tokio::time::timeout(self.drain_timeout, graceful.shutdown()).await.is_err() {
            tracing::warn!(
                drain_ms = self.drain_timeout.as_millis() as u64,
                "responses still in flight at the end of the shutdown drain: closing their connections"
            );
            // Aborting a task drops its connection, which closes the socket.
            connections.shutdown().await;
        }
        Ok(())
    }
}

/// Errors of one pending connection are that connection's; anything else (out of file
/// descriptors, most often) would fail again at once, so the loop waits a second first, as
/// axum's and hyper's own loops do.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::error!(error = %e, "cannot accept a connection; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
