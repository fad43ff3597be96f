//! The OTLP exporter end to end: spans of a turn reach a gRPC collector on a loopback port.
//!
//! The collector speaks gRPC at the wire level (HTTP/2, a length-prefixed protobuf message,
//! `grpc-status` trailers) and keeps what it received; protobuf strings are stored as raw
//! bytes, so the span names and attribute values are looked for in the message itself.
#![cfg(feature = "otlp")]

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgraph_telemetry::{LogFormat, OtlpOptions, OtlpProtocol, TelemetryOptions, install};

/// Export requests received: (path, message bytes).
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

async fn collector() -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let keep = received.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else { return };
                // `accept` drives the connection, so each request is answered on a task of its own.
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let keep = keep.clone();
                    tokio::spawn(async move {
                        let path = req.uri().path().to_owned();
                        let mut body = req.into_body();
                        let mut bytes = Vec::new();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                            bytes.extend_from_slice(&chunk);
                        }
                        keep.lock().unwrap().push((path, bytes));
                        let head =
                            http::Response::builder().header("content-type", "application/grpc").body(()).unwrap();
                        let Ok(mut send) = respond.send_response(head, false) else { return };
                        // An empty ExportTraceServiceResponse, then status OK.
                        let _ = send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), false);
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let _ = send.send_trailers(trailers);
                    });
                }
            });
        }
    });
    (endpoint, received)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_collector_with_their_attributes() {
    let (endpoint, received) = collector().await;
    let otlp = OtlpOptions {
        endpoint,
        protocol: OtlpProtocol::Grpc,
        service_name: "toolgraph-under-test".into(),
        timeout: Duration::from_secs(5),
    };
    let options =
        TelemetryOptions { log_filter: "warn".into(), ansi: false, format: LogFormat::Text, otlp: Some(otlp) };
    let guard = install(options).unwrap();
    assert!(guard.exporting());
    {
        let turn = tracing::info_span!(target: "toolgraph_server", "chat.turn", tenant.id = 7_i64, agent = "lumie");
        let llm = tracing::info_span!(target: "toolgraph_server", parent: &turn, "llm.call", agent = "lumie");
        drop(llm);
        let tool =
            tracing::info_span!(target: "toolgraph_server", parent: &turn, "tool.call", tool.name = "calculator");
        drop(tool);
        // Spans of other crates are not exported.
        drop(tracing::info_span!(target: "hyper::proto", "not.ours"));
    }
    tokio::task::spawn_blocking(move || guard.shutdown()).await.unwrap();
    let got = received.lock().unwrap().clone();
    assert!(!got.is_empty(), "the collector received nothing");
    assert!(got.iter().all(|(p, _)| p == "/opentelemetry.proto.collector.trace.v1.TraceService/Export"), "{got:?}");
    let all: Vec<u8> = got.into_iter().flat_map(|(_, b)| b).collect();
    for expected in
        ["chat.turn", "llm.call", "tool.call", "calculator", "lumie", "toolgraph-under-test", "service.name"]
    {
        assert!(contains(&all, expected), "'{expected}' is not in the exported spans");
    }
    assert!(!contains(&all, "not.ours"), "a span of another crate was exported");
}
