//! [`FaultProxy`]: a TCP proxy between the service and a server it depends on (the model
//! server, PostgreSQL) that injects network faults — latency, a stall, a reset or a clean cut
//! after so many bytes of the answer, a refused connection, a half-open one — chosen per
//! connection, and that can drop every open connection at once (a server restart as the
//! client sees it).
//!
//! It knows nothing of the protocol it carries: "after N bytes" counts bytes of the upstream's
//! answer, so a cut lands inside an SSE stream or a PostgreSQL result as the test chooses.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What happens to one proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passed through untouched.
    None,
    /// Every chunk of the answer is held this long first.
    Latency(Duration),
    /// The request reaches the upstream; its answer never comes back and the connection stays
    /// open (a hung server).
    Stall,
    /// The answer passes until this many bytes, then the client's connection is reset (RST)
    /// and the upstream's dropped.
    ResetAfter(usize),
    /// The answer passes until this many bytes, then the client's connection is closed (FIN,
    /// or RST if the client still had unread bytes in flight): the stream just ends.
    CutAfter(usize),
    /// Accepted and reset at once, before a byte: the client connects, then reads a reset
    /// (`ECONNRESET`, not `ECONNREFUSED`: a listener cannot refuse one connection and take the
    /// next).
    Refuse,
    /// Accepted and read from, never answered, never closed; the upstream is never reached.
    HalfOpen,
}

/// Chooses the fault of each connection from its number (0, 1, 2 … in accept order).
pub type FaultPlan = Arc<dyn Fn(u64) -> Fault + Send + Sync>;

/// A running proxy; stops (resetting its connections) when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    plan: Arc<Mutex<FaultPlan>>,
    /// Cancelled to reset every open connection; replaced by a fresh one after.
    live: Arc<Mutex<CancellationToken>>,
    accepted: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl FaultProxy {
    /// A proxy on an ephemeral loopback port forwarding to `upstream`, passing everything.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let plan: Arc<Mutex<FaultPlan>> = Arc::new(Mutex::new(Arc::new(|_| Fault::None)));
        let live = Arc::new(Mutex::new(CancellationToken::new()));
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (p, l, a, s) = (plan.clone(), live.clone(), accepted.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    _ = s.cancelled() => break,
                    conn = listener.accept() => conn,
                };
                let Ok((client, _)) = conn else {
                    // Out of descriptors, say: wait rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let n = a.fetch_add(1, Ordering::SeqCst);
                let fault = (lock(&p))(n);
                let reset = lock(&l).clone();
                let stop = s.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = proxy(client, upstream, fault) => {}
                        _ = reset.cancelled() => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(Self { addr, plan, live, accepted, stop })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (add the path the upstream's clients use, such as `/v1`).
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every new connection gets `fault`.
    pub fn set(&self, fault: Fault) {
        *lock(&self.plan) = Arc::new(move |_| fault);
    }

    /// New connections get what `plan` chooses for their number.
    pub fn set_plan(&self, plan: impl Fn(u64) -> Fault + Send + Sync + 'static) {
        *lock(&self.plan) = Arc::new(plan);
    }

    /// Drops every open connection now (the client sees its connection end, as when a server
    /// restarts); new ones are proxied as the plan says.
    pub fn cut_all(&self) {
        let old = std::mem::replace(&mut *lock(&self.live), CancellationToken::new());
        old.cancel();
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Resets `s` when dropped (RST instead of FIN).
fn arm_reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

async fn proxy(client: TcpStream, upstream: SocketAddr, fault: Fault) {
    let _ = client.set_nodelay(true);
    match fault {
        Fault::Refuse => return arm_reset(&client),
        Fault::HalfOpen => return drain_forever(client).await,
        _ => {}
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return arm_reset(&client);
    };
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // The request side always passes: faults are in the answer.
    let upload = async move {
        let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
        let _ = server_wr.shutdown().await;
        std::future::pending::<()>().await
    };
    let download = async move {
        let limit = match fault {
            Fault::ResetAfter(n) | Fault::CutAfter(n) => n,
            _ => usize::MAX,
        };
        let mut sent = 0usize;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if fault == Fault::Stall {
                std::future::pending::<()>().await;
            }
            let n = match server_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Fault::Latency(d) = fault {
                tokio::time::sleep(d).await;
            }
            let n = n.min(limit - sent);
            if client_wr.write_all(&buf[..n]).await.is_err() {
                break;
            }
            sent += n;
            if sent >= limit {
                break;
            }
        }
        let _ = client_wr.flush().await;
        if matches!(fault, Fault::ResetAfter(_)) {
            // Dropping a write half would send FIN first; forgotten, the socket closes with
            // the read half, and with no linger that close is a reset.
            arm_reset(client_wr.as_ref());
            client_wr.forget();
            return;
        }
        let _ = client_wr.shutdown().await;
    };
    tokio::select! {
        _ = upload => {}
        _ = download => {}
    }
}

/// Reads and discards whatever comes, forever (until the client goes or the proxy stops).
async fn drain_forever(mut client: TcpStream) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = client.read(&mut buf).await {
        if n == 0 {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that answers every connection with `answer` and closes.
    async fn upstream(answer: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    let _ = s.read(&mut b).await;
                    let _ = s.write_all(answer).await;
                });
            }
        });
        addr
    }

    async fn ask(addr: SocketAddr) -> (Vec<u8>, Option<std::io::ErrorKind>) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"hi").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_millis(500), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => return None,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => return Some(e.kind()),
                }
            }
        })
        .await;
        match read {
            Ok(err) => (got, err),
            Err(_) => (got, Some(std::io::ErrorKind::TimedOut)),
        }
    }

    #[tokio::test]
    async fn each_fault_does_what_it_says() {
        let up = upstream(b"0123456789").await;
        let proxy = FaultProxy::start(up).await.unwrap();
        assert_eq!(ask(proxy.addr()).await, (b"0123456789".to_vec(), None));
        proxy.set(Fault::CutAfter(4));
        assert_eq!(ask(proxy.addr()).await, (b"0123".to_vec(), None));
        proxy.set(Fault::ResetAfter(4));
        let (got, err) = ask(proxy.addr()).await;
        assert_eq!((got.as_slice(), err), (&b"0123"[..], Some(std::io::ErrorKind::ConnectionReset)));
        proxy.set(Fault::Refuse);
        assert_eq!(ask(proxy.addr()).await, (Vec::new(), Some(std::io::ErrorKind::ConnectionReset)));
        proxy.set(Fault::Stall);
        assert_eq!(ask(proxy.addr()).await, (Vec::new(), Some(std::io::ErrorKind::TimedOut)));
        proxy.set(Fault::HalfOpen);
        assert_eq!(ask(proxy.addr()).await, (Vec::new(), Some(std::io::ErrorKind::TimedOut)));
        // Every other connection cut: the plan sees the connection numbers in order.
        proxy.set_plan(|n| if n % 2 == 0 { Fault::CutAfter(2) } else { Fault::None });
        let before = proxy.accepted();
        let first = ask(proxy.addr()).await.0;
        let second = ask(proxy.addr()).await.0;
        let (cut, whole) = if before % 2 == 0 { (first, second) } else { (second, first) };
        assert_eq!((cut, whole), (b"01".to_vec(), b"0123456789".to_vec()));
    }

    #[tokio::test]
    async fn cut_all_cuts_open_connections_and_later_ones_pass() {
        let up = upstream(b"ok").await;
        let proxy = FaultProxy::start(up).await.unwrap();
        proxy.set(Fault::Stall);
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        held.write_all(b"hi").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.cut_all();
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(2), held.read(&mut buf)).await.unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "the held connection ends: {read:?}");
        proxy.set(Fault::None);
        assert_eq!(ask(proxy.addr()).await, (b"ok".to_vec(), None));
    }
}
