//! `http` plugins against real loopback servers (docs/plugins.md): a URL
//! placeholder in the path is one percent-encoded segment and never `.` or `..` (so a model
//! cannot climb the service's paths), and the plugin's headers — its secrets — never follow a
//! redirect to another origin.

mod common;
use common::call;

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::path::Path;
use std::sync::{Arc, Mutex};
use toolgraph_tools::{ToolErrorKind, ToolRegistry};

/// What a test server saw: each request's path and query, and its `X-Api-Key` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// How a test server answers a path.
type Answer = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// Starts a server on `ip` (port chosen by the system) that records every request in `seen` and
/// answers with `answer(path)`. Its base URL.
async fn server(ip: &str, seen: &Seen, answer: Answer) -> String {
    let seen = Arc::clone(seen);
    let app = axum::Router::new().fallback(move |req: Request| {
        let (seen, answer) = (Arc::clone(&seen), Arc::clone(&answer));
        async move {
            let target = req.uri().path_and_query().map_or_else(String::new, |pq| pq.as_str().to_owned());
            let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
            seen.lock().unwrap().push((target, key));
            answer(req.uri().path())
        }
    });
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn echo(path: &str) -> Response {
    axum::Json(json!({ "path": path })).into_response()
}

/// The tools of one plugin folder under `root` with `manifest`.
fn registry(root: &Path, manifest: &str) -> ToolRegistry {
    std::fs::create_dir_all(root.join("p")).unwrap();
    std::fs::write(root.join("p/plugin.toml"), manifest).unwrap();
    common::registry(&[root.to_path_buf()])
}

#[tokio::test]
async fn a_path_placeholder_is_one_segment_and_never_a_dot_segment() {
    let seen = Seen::default();
    let base = server("127.0.0.1", &seen, Arc::new(echo)).await;
    let root = tempfile::tempdir().unwrap();
    let manifest = format!(
        "name = \"profile\"\nversion = \"1.0.0\"\ndescription = \"A user's profile.\"\nkind = \"http\"\n\
         [parameters.id]\ntype = \"string\"\ndescription = \"User\"\nrequired = true\n\
         [parameters.view]\ntype = \"string\"\ndescription = \"View\"\nrequired = true\n\
         [http]\nmethod = \"GET\"\nurl = \"{base}/v1/users/{{id}}/profile?view={{view}}\"\n"
    );
    let reg = registry(root.path(), &manifest);
    let profile = |id: &str, view: &str| call(&reg, "profile", json!({"id": id, "view": view}));

    assert_eq!(profile("ana", "full").await.unwrap(), json!({"path": "/v1/users/ana/profile"}));
    // Slashes, spaces, `?` and `#` stay inside the one segment.
    let odd = profile("a/b?c#d e", "full").await.unwrap();
    assert_eq!(odd, json!({"path": "/v1/users/a%2Fb%3Fc%23d%20e/profile"}));
    // A dot segment, in any spelling, would climb out of /v1/users/: refused, nothing sent.
    let before = seen.lock().unwrap().len();
    for id in ["..", ".", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "%2e", "%252e%252e", ""] {
        let err = profile(id, "full").await.expect_err(id);
        assert_eq!(err.0, ToolErrorKind::InvalidArguments, "{id:?}: {err:?}");
        assert!(err.1.contains("'id'"), "the message names the argument: {err:?}");
    }
    let sent: Vec<String> = seen.lock().unwrap()[before..].iter().map(|(t, _)| t.clone()).collect();
    assert!(sent.is_empty(), "dot segments reached the service: {sent:?}");
    // In the query a dot is only text.
    assert_eq!(profile("ana", "..").await.unwrap(), json!({"path": "/v1/users/ana/profile"}));
    assert_eq!(seen.lock().unwrap().last().unwrap().0, "/v1/users/ana/profile?view=..");
}

#[tokio::test]
async fn the_plugins_headers_never_follow_a_redirect_to_another_origin() {
    let elsewhere_seen = Seen::default();
    // Another host (127.0.0.2, loopback too) and another port of the same host.
    let other_host = server("127.0.0.2", &elsewhere_seen, Arc::new(echo)).await;
    let other_port = server("127.0.0.1", &elsewhere_seen, Arc::new(echo)).await;
    let origin_seen = Seen::default();
    // The plugin's service redirects `/to/host` and `/to/port` there, and `/to/same` to its own
    // `/final`.
    let (host, port) = (format!("{other_host}/steal"), format!("{other_port}/steal"));
    let redirect: Answer = Arc::new(move |path: &str| {
        let location = match path {
            "/to/host" => host.clone(),
            "/to/port" => port.clone(),
            "/to/same" => "/final".to_owned(),
            _ => return echo(path),
        };
        (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
    });
    let origin = server("127.0.0.1", &origin_seen, redirect).await;
    let root = tempfile::tempdir().unwrap();
    let manifest = format!(
        "name = \"fetch\"\nversion = \"1.0.0\"\ndescription = \"Fetch a page.\"\nkind = \"http\"\n\
         env = [\"HOME\"]\n\
         [parameters.target]\ntype = \"string\"\ndescription = \"Where\"\nrequired = true\n\
         [http]\nmethod = \"GET\"\nurl = \"{origin}/to/{{target}}\"\n\
         headers = {{ \"X-Api-Key\" = \"secret-${{HOME}}\" }}\n"
    );
    let reg = registry(root.path(), &manifest);

    for target in ["host", "port"] {
        let err =
            call(&reg, "fetch", json!({ "target": target })).await.expect_err("a foreign redirect is not followed");
        assert_eq!(err.0, ToolErrorKind::Unavailable, "{err:?}");
        assert!(err.1.contains("redirect"), "{err:?}");
    }
    let leaked: Vec<_> = elsewhere_seen.lock().unwrap().iter().filter(|(_, key)| key.is_some()).cloned().collect();
    assert!(leaked.is_empty(), "the plugin's secret header went to another origin: {leaked:?}");
    assert!(elsewhere_seen.lock().unwrap().is_empty(), "{:?}", elsewhere_seen.lock().unwrap());

    // A redirect within the plugin's own origin is followed, with its headers.
    assert_eq!(call(&reg, "fetch", json!({ "target": "same" })).await.unwrap(), json!({"path": "/final"}));
    let last = origin_seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.0, "/final");
    assert!(last.1.is_some_and(|k| k.starts_with("secret-")), "same origin keeps the headers");
}
