//! The playground: a chat page served at `/` when `[server] playground = true` — hand-written
//! HTML, CSS and one ES module, embedded in the binary (no build step, nothing fetched at run
//! time), that talk to this service's own API from the same origin. docs/playground.md.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

const INDEX: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

/// Only this origin's scripts, styles and API: the page runs nothing it did not ship.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`, `/playground/app.js` and `/playground/app.css`; the page offers `agents`, with
/// `default_agent` chosen, and speaks as `tenant` (its slug) until the user changes it.
pub fn playground_router<S: Clone + Send + Sync + 'static>(
    agents: &[String],
    default_agent: &str,
    tenant: &str,
) -> Router<S> {
    // A `<script type="application/json">` block ends at the first `</`: escape every `<`.
    let config = json!({ "agents": agents, "defaultAgent": default_agent, "tenantSlug": tenant })
        .to_string()
        .replace('<', "\\u003c");
    // Made once; each answer shares it (a clone of `Bytes` copies no text).
    let page = axum::body::Bytes::from(INDEX.replace("{{CONFIG}}", &config));
    Router::new()
        .route("/", get(move || std::future::ready(asset(page.clone(), "text/html; charset=utf-8"))))
        .route("/playground/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }))
        .route("/playground/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
}

fn asset(body: impl Into<axum::body::Body>, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body.into(),
    )
        .into_response()
}
