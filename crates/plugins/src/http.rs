//! `http` plugins: one request built from the arguments — `{param}` in the URL replaced by
//! that argument (percent-encoded; in the path, as exactly one segment that is never `.` or
//! `..`), the other arguments as a JSON body for `POST`, `PUT` and `PATCH`, headers whose
//! `${NAME}` come from the environment at each call (so secrets live in the environment, never
//! in a manifest) — and the response, or the part a JSON pointer names, as the result. Statuses
//! become the outcome kinds a model can act on. Redirects are followed within the plugin's own
//! origin only, so its headers never reach another server (docs/plugins.md).

use crate::manifest::{HttpSpec, ManifestError, placeholders};
use crate::template::env_references;
use crate::tool::{Common, Runner};
use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Map, Value};
use std::time::Duration;
use toolgraph_tools::{ToolContext, ToolError};

/// Most of a response read.
const MAX_RESPONSE: usize = 1024 * 1024;

/// Most of an error response quoted to the model.
const QUOTED: usize = 300;

/// Most redirects followed within the plugin's origin.
const MAX_REDIRECTS: usize = 5;

/// The redirect policy of plugin requests: follow a redirect only to the origin (scheme, host
/// and port) the request started at, and at most [`MAX_REDIRECTS`] times. reqwest drops only the
/// standard credentials (`Authorization`, `Cookie`) on a redirect to another host, and a plugin's
/// secrets are often custom headers (`X-Api-Key`): a service that answers with a redirect
/// elsewhere — compromised, or echoing a URL it was given — would otherwise receive them. A
/// redirect not followed is the answer, and the model reads it as an unavailable service.
pub(crate) fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
        if same && attempt.previous().len() <= MAX_REDIRECTS { attempt.follow() } else { attempt.stop() }
    })
}

/// Whether `value`, as a path segment, is `.` or `..` (or empty) in any spelling a service may
/// decode it to: `%2e`, `%2E`, `%252e` decoded twice, …. Such a segment climbs the URL's path
/// (`/v1/users/../admin` is `/v1/admin`), here in the client or, decoded, in the service.
fn is_dot_segment(value: &str) -> bool {
    let mut value = value.to_owned();
    loop {
        if matches!(value.as_str(), "" | "." | "..") {
            return true;
        }
        let decoded = percent_encoding::percent_decode_str(&value).decode_utf8_lossy().into_owned();
        // Each decoding that changes the text shortens it, so this ends.
        if decoded == value {
            return false;
        }
        value = decoded;
    }
}

/// Runs a plugin's request.
pub struct HttpRunner {
    http: reqwest::Client,
    method: reqwest::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: bool,
    result: Option<String>,
}

impl HttpRunner {
    /// The runner of `spec`, whose calls last at most `limit`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built, or a header names an unset environment variable.
    pub fn new(limit: Duration, spec: &HttpSpec) -> Result<Self, ManifestError> {
        let fail = |field: &str, message: String| ManifestError {
            path: crate::manifest::MANIFEST.into(),
            line: None,
            field: Some(field.to_owned()),
            message,
        };
        for (header, value) in &spec.headers {
            for var in env_references(value) {
                if std::env::var_os(var).is_none() {
                    return Err(fail(
                        &format!("http.headers.{header}"),
                        format!("environment variable {var} is not set"),
                    ));
                }
            }
        }
        let method =
            reqwest::Method::from_bytes(spec.method.as_bytes()).map_err(|e| fail("http.method", e.to_string()))?;
        let body = spec.body.unwrap_or(matches!(spec.method.as_str(), "POST" | "PUT" | "PATCH"));
        let http = reqwest::Client::builder()
            .redirect(same_origin_redirects())
            .timeout(limit)
            .connect_timeout(limit.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| fail("http", e.to_string()))?;
        Ok(Self {
            http,
            method,
            url: spec.url.clone(),
            headers: spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            body,
            result: spec.result.clone(),
        })
    }

    /// The URL with its placeholders filled, and the arguments it did not use.
    fn url_and_rest(&self, arguments: &Value) -> Result<(String, Map<String, Value>), ToolError> {
        let mut rest = arguments.as_object().cloned().unwrap_or_default();
        let mut url = self.url.clone();
        // Placeholders before the query or the fragment are path segments.
        let path_end = self.url.find(['?', '#']).unwrap_or(self.url.len());
        let path = &self.url[..path_end];
        for name in placeholders(&self.url) {
            let value = match rest.remove(name) {
                Some(Value::String(s)) => s,
                Some(Value::Null) | None => {
                    return Err(ToolError::invalid_arguments(format!("'{name}' is needed to build the URL")));
                }
                Some(other) => other.to_string(),
            };
            if path.contains(&format!("{{{name}}}")) && is_dot_segment(&value) {
                return Err(ToolError::invalid_arguments(format!(
                    "'{name}' is one segment of the URL's path: it cannot be empty, '.' or '..' (encoded or not)"
                )));
            }
            // Percent-encoded whole (`/`, `?` and `#` too), so it stays one segment.
            let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
            url = url.replace(&format!("{{{name}}}"), &encoded.replace('+', "%20"));
        }
        Ok((url, rest))
    }
}

#[async_trait]
impl Runner for HttpRunner {
    async fn run(&self, common: &Common, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let name = common.name();
        let (url, rest) = self.url_and_rest(&arguments)?;
        let mut req = self.http.request(self.method.clone(), &url);
        for (header, value) in &self.headers {
            let value = crate::template::fill(value, ctx).map_err(|key| {
                ToolError::denied(format!("plugin '{name}' needs the turn's {key}, and this turn has none"))
            })?;
            req = req.header(header, value);
        }
        if self.body {
            req = req.json(&Value::Object(rest));
        }
        let response = req.send().await.map_err(|e| {
            if e.is_timeout() {
                ToolError::timeout(format!("plugin '{name}': the service did not answer in time"))
            } else {
                ToolError::unavailable(format!("plugin '{name}': the service cannot be reached"))
            }
        })?;
        let status = response.status();
        if status.is_redirection() {
            let location = response.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok());
            return Err(ToolError::unavailable(format!(
                "plugin '{name}': the service answered {status}, a redirect to {} that is not followed (only \
                 redirects within the plugin's own origin are, so its headers never leave it)",
                location.unwrap_or("nowhere")
            )));
        }
        let mut text = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| ToolError::unavailable(format!("plugin '{name}': {e}")))?;
            if text.len() + chunk.len() > MAX_RESPONSE {
                return Err(ToolError::unavailable(format!(
                    "plugin '{name}': the answer is over {MAX_RESPONSE} bytes"
                )));
            }
            text.extend_from_slice(&chunk);
        }
        let body: Value = serde_json::from_slice(&text)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&text).into_owned()));
        if !status.is_success() {
            let shown: String = match &body {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }
            .chars()
            .take(QUOTED)
            .collect();
            let message = format!("plugin '{name}': the service answered {status}: {shown}");
            return Err(match status.as_u16() {
                400 | 422 => ToolError::invalid_arguments(message),
                401 | 403 => ToolError::denied(message),
                404 => ToolError::not_found(message),
                408 | 504 => ToolError::timeout(message),
                _ => ToolError::unavailable(message),
            });
        }
        match &self.result {
            Some(pointer) => body
                .pointer(pointer)
                .cloned()
                .ok_or_else(|| ToolError::unavailable(format!("plugin '{name}': the answer has nothing at {pointer}"))),
            None => Ok(body),
        }
    }
}
