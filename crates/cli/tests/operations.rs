//! What an operator wires up, on the binary as built by default (no feature, no rebuild): the
//! log as JSON lines, spans exported to an OpenTelemetry collector named by the standard
//! `OTEL_*` variables (OTLP over HTTP with protobuf), and the tokens model calls used in
//! `/metrics` by tenant, agent and model.

mod common;
use common::{free_port, serve_command, turn, wait_ready};

use axum::http::HeaderMap;
use scripted_llm::{Reply, ScriptedModelServer};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the collector received: (path, content type, `x-collector-key`, body).
type Exports = Arc<Mutex<Vec<(String, String, String, Vec<u8>)>>>;

/// An OTLP/HTTP collector on a loopback port that keeps every export and answers 200.
async fn collector() -> (String, Exports) {
    let exports: Exports = Arc::default();
    let keep = exports.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: HeaderMap, body: axum::body::Bytes| {
        let keep = keep.clone();
        async move {
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            keep.lock().unwrap().push((
                uri.path().to_owned(),
                header("content-type"),
                header("x-collector-key"),
                body.to_vec(),
            ));
            // An empty ExportTraceServiceResponse.
            ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, exports)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The value of the series of `name` whose labels include every one of `labels`.
fn series(metrics: &str, name: &str, labels: &[&str]) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_spans_over_otlp_http_and_token_metrics_from_the_default_build() {
    let (collector_url, exports) = collector().await;
    // Each reply reports 10 prompt and 5 completion tokens.
    let model = ScriptedModelServer::start(vec![Reply::text("Hola."), Reply::text("Otra vez hola.")]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .args(["--log-format", "json", "-v"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector_url)
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=k-123")
        .env("OTEL_SERVICE_NAME", "tg-operations-test")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ops-check")
        .env_remove("OTEL_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    for message in ["hola", "otra vez"] {
        let text = turn(&base, None, message).await;
        assert!(text.contains("event: done"), "{text}");
    }

    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let tokens = |kind: &str| {
        let kind = format!("kind=\"{kind}\"");
        series(
            &metrics,
            "toolgraph_llm_tokens_total",
            &["tenant=\"1\"", "agent=\"assistant\"", "model=\"scripted\"", &kind],
        )
    };
    assert_eq!(tokens("prompt"), Some(20), "two calls of 10 prompt tokens:\n{metrics}");
    assert_eq!(tokens("completion"), Some(10), "two calls of 5 generated tokens");
    assert_eq!(tokens("cached_prompt"), Some(0), "the scripted model reports no cached tokens");

    // SIGTERM: the spans still queued are exported before the process exits.
    let (exit, stderr) = common::terminate(&mut child, Duration::from_secs(20)).await;
    assert!(exit.success(), "{stderr}");

    // Every line of stderr is one JSON object of the log's shape, the service's own notices included.
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert!(lines.iter().all(|l| l["timestamp"].is_string() && l["level"].is_string()), "{stderr}");
    let said = |text: &str| lines.iter().any(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains(text)));
    assert!(said("listening on http://") && said("shutting down"), "{stderr}");
    assert!(
        lines.iter().any(|l| l["target"].as_str().is_some_and(|t| t.starts_with("toolgraph::"))),
        "the crates' own events are in the log too:\n{stderr}"
    );

    let exports = exports.lock().unwrap().clone();
    assert!(!exports.is_empty(), "nothing reached the collector; stderr:\n{stderr}");
    for (path, content_type, key, _) in &exports {
        assert_eq!(path, "/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT is a base URL");
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(key, "k-123", "OTEL_EXPORTER_OTLP_HEADERS reach the collector");
    }
    let body: Vec<u8> = exports.iter().flat_map(|(_, _, _, b)| b.clone()).collect();
    for name in ["chat.turn", "llm.call", "http.request", "tg-operations-test", "ops-check", "assistant"] {
        assert!(contains(&body, name), "{name} was not exported");
    }
}

/// A setting the exporter cannot use stops `serve` at start with its name, instead of running
/// without the traces the operator asked for; any other command only warns (the variables are
/// often set machine-wide for other programs).
#[test]
fn bad_opentelemetry_settings_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (variable, value) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
    ] {
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_toolgraph"))
                .args(args)
                .arg("--data-dir")
                .arg(dir.path())
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
                .env(variable, value)
                .env_remove("OTEL_ENDPOINT")
                .output()
                .unwrap()
        };
        let out = run(&["serve", "--port", "1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{variable}={value}: {stderr}");
        assert!(stderr.contains(variable) && stderr.contains(value), "{variable}={value}: {stderr}");
        let out = run(&["config", "show"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{variable}={value}: {stderr}");
        assert!(stderr.contains("warning:") && stderr.contains(variable), "{variable}={value}: {stderr}");
    }
}
