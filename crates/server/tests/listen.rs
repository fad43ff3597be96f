//! The HTTP listener over real sockets: the request-head limit (431), the header read
//! timeout, graceful shutdown letting an in-flight streamed response finish, and the drain
//! deadline closing one that never would.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use futures::StreamExt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use toolgraph_server::HttpServer;

fn routes() -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                // Three chunks 150 ms apart: still streaming when the test asks for shutdown.
                let chunks = futures::stream::unfold(0u8, |i| async move {
                    if i == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    Some((Ok::<_, std::convert::Infallible>(format!("chunk{i};")), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
        .route(
            "/endless",
            get(|| async {
                // One chunk, then a body that never ends: only the drain deadline can close it.
                let first = futures::stream::once(async { Ok::<_, std::convert::Infallible>("first;".to_owned()) });
                Body::from_stream(first.chain(futures::stream::pending()))
            }),
        )
}

/// Serves [`routes`] until the returned sender fires; the handle resolves when `serve` returns.
async fn start(
    listener: HttpServer,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<std::io::Result<()>>) {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        listener
            .serve(tcp, routes(), async move {
                let _ = stopped.await;
            })
            .await
    });
    (addr, stop, serving)
}

#[tokio::test]
async fn a_request_head_over_the_limit_gets_431_and_the_listener_keeps_serving() {
    let (addr, _stop, _serving) = start(HttpServer::default()).await;
    let http = reqwest::Client::new();
    let big = "x".repeat(9 * 1024);
    let resp = http.get(format!("http://{addr}/ok")).header("x-big", &big).send().await.unwrap();
    assert_eq!(resp.status(), 431, "a 9 KB header is over the default 8 KB head limit");
    let resp = http.get(format!("http://{addr}/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "ok");

    // The limit is a setting: 16 KB lets the same header through.
    let (addr, _stop, _serving) = start(HttpServer { max_head_bytes: 16 * 1024, ..HttpServer::default() }).await;
    let resp = http.get(format!("http://{addr}/ok")).header("x-big", &big).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
    let limit = Duration::from_millis(300);
    let (addr, _stop, _serving) = start(HttpServer { header_read_timeout: limit, ..HttpServer::default() }).await;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 512];
    // The server closes the connection (no response to a head it never got); 0 bytes or a
    // reset both mean closed.
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await;
    let elapsed = started.elapsed();
    match read {
        Err(_) => panic!("the connection was still open after 10 s"),
        Ok(Ok(n)) => {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(!text.contains("200"), "the incomplete request was answered: {text}");
        }
        Ok(Err(_)) => {}
    }
    assert!(elapsed >= Duration::from_millis(200), "closed after {elapsed:?}, before the limit");
}

#[tokio::test]
async fn shutdown_lets_a_streaming_response_finish_then_refuses_new_connections() {
    let (addr, stop, serving) = start(HttpServer::default()).await;
    let resp = reqwest::get(format!("http://{addr}/slow")).await.unwrap();
    assert_eq!(resp.status(), 200);
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!serving.is_finished(), "serve returned while a response was still streaming");
    let body = resp.text().await.unwrap();
    assert_eq!(body, "chunk0;chunk1;chunk2;", "the in-flight response was cut");
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("serve returns once the last connection closed")
        .unwrap()
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the port still accepts connections");
}

#[tokio::test]
async fn a_response_that_never_ends_is_closed_at_the_drain_deadline() {
    let drain = Duration::from_millis(300);
    let (addr, stop, serving) = start(HttpServer { drain_timeout: drain, ..HttpServer::default() }).await;
    let mut resp = reqwest::get(format!("http://{addr}/endless")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.chunk().await.unwrap().as_deref(), Some(&b"first;"[..]));
    let started = Instant::now();
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!serving.is_finished(), "serve returned before the drain deadline");
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("serve returns at the drain deadline although the response never ends")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= drain, "serve returned after {:?}, before the deadline", started.elapsed());
    // The client sees its connection closed: the body ends with an error, not with more data.
    let rest = tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await.expect("the connection is still open");
    assert!(rest.is_err(), "the endless response ended cleanly or sent more: {rest:?}");
}
