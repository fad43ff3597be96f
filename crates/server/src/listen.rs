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
//! - `TCP_NODELAY`, so small SSE frames are not held back by Nagle's algorithm;
//! - a cap on open connections (`max_connections`): past it the loop stops accepting, and the
//!   kernel's backlog holds newcomers until a connection closes, instead of the process running
//!   out of file descriptors;
//! - a limit on how long a write may wait for the client to read (`write_timeout`): a client
//!   that opens a stream and never reads would otherwise hold its connection, and the frames
//!   queued for it, for as long as it likes.
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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Sleep;

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
    /// Most connections open at once; more wait in the listen backlog. Default: 16,384 (the
    /// process may hold 20,000 files here, and the stores need some).
    pub max_connections: usize,
    /// Longest a response write may wait for the client to read before the connection is
    /// closed. SSE keep-alives write every 15 s, so a live client never gets near it.
    /// Default: 60 s.
    pub write_timeout: Duration,
}

impl Default for HttpServer {
    fn default() -> Self {
        Self {
            max_head_bytes: MIN_HEAD_BYTES,
            header_read_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            max_connections: 16_384,
            write_timeout: Duration::from_secs(60),
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
        let slots = Arc::new(Semaphore::new(self.max_connections.max(1)));
        loop {
            // A slot first: at the cap, newcomers wait in the kernel's backlog, not in memory.
            let slot = tokio::select! {
                () = &mut shutdown => break,
                Some(ended) = connections.join_next(), if !connections.is_empty() => {
                    reaped(ended);
                    continue;
                }
                slot = Arc::clone(&slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break, // never closed; a closed semaphore would mean no more connections
                },
            };
            let stream = tokio::select! {
                () = &mut shutdown => break,
                Some(ended) = connections.join_next(), if !connections.is_empty() => {
                    reaped(ended);
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
            let stream = WriteDeadline::new(stream, self.write_timeout);
            let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
            let conn = graceful.watch(conn);
            connections.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(slot);
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

/// A connection task that ended: a panic is logged (the task's connection is gone either way).
fn reaped(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        tracing::error!(error = %e, "a connection task panicked");
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

/// A connection whose writes fail with `TimedOut` once one has waited `limit` for the client to
/// make room: hyper then closes the connection, and the stream's task ends.
struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    /// Armed when a write first finds the socket full, disarmed by any progress.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    fn new(inner: T, limit: Duration) -> Self {
        Self { inner, limit, waiting: None }
    }

    /// `Pending` while the deadline has not passed, an error once it has.
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let sleep = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading"))
    }

    fn progressed<R>(&mut self, poll: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(r) => {
                self.waiting = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.stalled(cx).map(Err),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(poll, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(poll, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(poll, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A peer that never reads: writes fill the socket, then fail after the limit.
    #[tokio::test]
    async fn a_write_the_client_never_reads_fails_after_the_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut conn = WriteDeadline::new(server, Duration::from_millis(300));
        let chunk = vec![0u8; 64 * 1024];
        let started = std::time::Instant::now();
        let err = loop {
            if let Err(e) = conn.write_all(&chunk).await {
                break e;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "writes never stalled");
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
