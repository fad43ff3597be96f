//! [`OpenAiChatModel`]: a client for any OpenAI-compatible chat-completions endpoint.
//!
//! Failure policy: connect errors, timeouts before the first event, 408/409/429 and 5xx are
//! retried a bounded number of times with jittered exponential backoff (a `Retry-After`
//! from the server wins). Once an event has reached the caller nothing is retried, so a
//! reply is never streamed twice. Every error names the endpoint.

mod retry;
mod wire;

pub use retry::RetryPolicy;

use crate::assemble::ToolCallAssembler;
use crate::error::{LlmError, error_chain};
use crate::model::{ChatModel, ChatStream};
use crate::schema::Provider;
use crate::types::{ChatEvent, ChatRequest, ChatResponse, FinishReason, Usage};
use async_trait::async_trait;
use futures::StreamExt;
use std::time::Duration;
use wire::{Completion, StreamChunk};

/// Settings of an [`OpenAiChatModel`].
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL ending in the API version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Bearer token; local servers need none.
    pub api_key: Option<String>,
    /// Server family. Default: detected from the base URL.
    pub provider: Provider,
    /// Limit on establishing the connection. Default: 5 s.
    pub connect_timeout: Duration,
    /// Limit until the response headers and the first chunk arrive. Default: 60 s.
    pub first_byte_timeout: Duration,
    /// Limit on silence between chunks once a reply streams. Default: 30 s.
    pub idle_timeout: Duration,
    /// Limit on a whole non-streamed call. Default: 120 s.
    pub request_timeout: Duration,
    /// Retry behaviour.
    pub retry: RetryPolicy,
    /// Ask for usage in streams (`stream_options.include_usage`). Default: on.
    pub include_usage: bool,
    /// Send tools in OpenAI strict mode (only applied to [`Provider::OpenAi`]). Default: off.
    pub strict_tools: bool,
}

impl OpenAiConfig {
    /// Defaults for `base_url` and `model`.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        let base_url = base_url.into();
        Self {
            provider: Provider::detect(&base_url),
            base_url,
            model: model.into(),
            api_key: None,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
            include_usage: true,
            strict_tools: false,
        }
    }
}

/// A [`ChatModel`] over HTTP to an OpenAI-compatible server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct OpenAiChatModel {
    config: OpenAiConfig,
    endpoint: String,
    http: reqwest::Client,
}

impl OpenAiChatModel {
    /// A client for `config`.
    ///
    /// # Errors
    /// An unusable base URL or API key, or a TLS set-up failure.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        let base = url::Url::parse(&config.base_url)
            .map_err(|e| LlmError::InvalidRequest(format!("model base URL '{}' is not a URL: {e}", config.base_url)))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(LlmError::InvalidRequest(format!(
                "model base URL '{}' must be http or https",
                config.base_url
            )));
        }
        let endpoint = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = config.api_key.as_deref().filter(|k| !k.is_empty()) {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                LlmError::InvalidRequest("the API key contains characters not allowed in a header".into())
            })?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .default_headers(headers)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| LlmError::InvalidRequest(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { config, endpoint, http })
    }

    /// The chat-completions URL this client calls.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one attempt and returns the response if its status is a success.
    async fn send(&self, body: &bytes::Bytes) -> Result<reqwest::Response, LlmError> {
        let req = self
            .http
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send();
        let resp = match tokio::time::timeout(self.config.first_byte_timeout, req).await {
            Err(_) => {
                return Err(LlmError::FirstByteTimeout {
                    endpoint: self.endpoint.clone(),
                    after: self.config.first_byte_timeout,
                });
            }
            Ok(Err(e)) => return Err(self.transport_error(&e, true)),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry::parse_retry_after);
        let body = tokio::time::timeout(self.config.idle_timeout, resp.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        Err(LlmError::Status {
            endpoint: self.endpoint.clone(),
            status: status.as_u16(),
            body: truncate(&redact(&body, self.config.api_key.as_deref()), 500),
            retry_after,
        })
    }

    fn transport_error(&self, e: &reqwest::Error, before_response: bool) -> LlmError {
        let reason = error_chain(e);
        if before_response && (e.is_connect() || e.is_timeout()) {
            LlmError::Connect { endpoint: self.endpoint.clone(), reason }
        } else {
            LlmError::Transport { endpoint: self.endpoint.clone(), reason }
        }
    }

    /// The body of `request` as sent: streamed (usage asked for when configured) or not.
    fn encoded_body(&self, request: &ChatRequest, stream: bool) -> Result<bytes::Bytes, LlmError> {
        let c = &self.config;
        let body = wire::request_body(request, &c.model, c.provider, stream, stream && c.include_usage, c.strict_tools);
        serde_json::to_vec(&body)
            .map(bytes::Bytes::from)
            .map_err(|e| LlmError::InvalidRequest(format!("cannot encode the request: {e}")))
    }

    /// Waits before retry `attempt` if the policy allows one more; `Err` gives up.
    async fn backoff(&self, attempt: u32, err: LlmError) -> Result<(), LlmError> {
        if !err.is_retryable() || attempt > self.config.retry.max_retries {
            return Err(if attempt > 1 {
                LlmError::RetriesExhausted { attempts: attempt, last: Box::new(err) }
            } else {
                err
            });
        }
        let retry_after = match &err {
            LlmError::Status { retry_after, .. } => *retry_after,
            _ => None,
        };
        let delay = self.config.retry.delay(attempt, retry_after);
        tracing::warn!(endpoint = %self.endpoint, attempt, delay_ms = delay.as_millis() as u64, error = %err, "model call failed; retrying");
        tokio::time::sleep(delay).await;
        Ok(())
    }
}

/// `text` without `secret`: some servers quote the key they refused in their error body, and
/// that body goes into errors and logs.
fn redact(text: &str, secret: Option<&str>) -> String {
    match secret {
        // A very short "key" would redact ordinary words; real keys are long.
        Some(key) if key.len() >= 8 && text.contains(key) => text.replace(key, "[redacted]"),
        _ => text.to_owned(),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.trim().to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", s[..end].trim())
}

/// What one streamed attempt ended with.
enum AttemptEnd {
    /// The reply finished.
    Done,
    /// Failed before anything reached the caller: may be retried.
    FailedClean(LlmError),
}

#[async_trait]
impl ChatModel for OpenAiChatModel {
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        // Encoded once and the JSON tree dropped: a streamed reply can last minutes, and only
        // the encoded body is kept (for retries); the tree held ~8 KB per held stream.
        let body = self.encoded_body(&request, true)?;
        let this = self.clone();
        let stream = async_stream::stream! {
            let mut attempt = 1u32;
            loop {
                let resp = match this.send(&body).await {
                    Ok(r) => r,
                    Err(e) => {
                        if let Err(e) = this.backoff(attempt, e).await { yield Err(e); return; }
                        attempt += 1;
                        continue;
                    }
                };
                let mut events = std::pin::pin!(toolgraph_protocol::sse::frames(resp.bytes_stream()));
                let mut parser = ChunkParser::new(this.endpoint.clone()).redacting(this.config.api_key.clone());
                let mut yielded = false;
                // One timer for the whole reply, moved only when it fires: a reply streams an
                // event per token, and arming a timer per event cost more than reading it.
                let mut last_event = tokio::time::Instant::now();
                let deadline = tokio::time::sleep(this.config.first_byte_timeout);
                tokio::pin!(deadline);
                let end = loop {
                    let limit = if yielded || parser.saw_data { this.config.idle_timeout } else { this.config.first_byte_timeout };
                    let next = tokio::select! {
                        biased;
                        n = events.next() => Ok(n),
                        () = &mut deadline => {
                            if last_event + limit > tokio::time::Instant::now() {
                                deadline.as_mut().reset(last_event + limit);
                                continue;
                            }
                            Err(())
                        }
                    };
                    last_event = tokio::time::Instant::now();
                    let next = match next {
                        Ok(n) => n,
                        Err(()) => {
                            let e = if yielded || parser.saw_data {
                                LlmError::IdleTimeout { endpoint: this.endpoint.clone(), after: limit }
                            } else {
                                LlmError::FirstByteTimeout { endpoint: this.endpoint.clone(), after: limit }
                            };
                            if yielded { yield Err(e); return; }
                            break AttemptEnd::FailedClean(e);
                        }
                    };
                    let event = match next {
                        None => match parser.finish() {
                            Ok(tail) => {
                                for ev in tail { yield Ok(ev); }
                                break AttemptEnd::Done;
                            }
                            Err(e) => {
                                if yielded { yield Err(e); return; }
                                break AttemptEnd::FailedClean(e);
                            }
                        },
                        Some(Err(e)) => {
                            let e = LlmError::Transport { endpoint: this.endpoint.clone(), reason: e.to_string() };
                            if yielded { yield Err(e); return; }
                            break AttemptEnd::FailedClean(e);
                        }
                        Some(Ok(ev)) => ev,
                    };
                    match parser.feed(&event.data) {
                        Ok(Step::Events(evs)) => {
                            for ev in evs { yielded = true; yield Ok(ev); }
                        }
                        Ok(Step::Done(tail)) => {
                            for ev in tail { yield Ok(ev); }
                            break AttemptEnd::Done;
                        }
                        // A malformed chunk or a provider error is not a passing fault: no retry.
                        Err(e) => { yield Err(e); return; }
                    }
                };
                match end {
                    AttemptEnd::Done => return,
                    AttemptEnd::FailedClean(e) => {
                        if let Err(e) = this.backoff(attempt, e).await { yield Err(e); return; }
                        attempt += 1;
                    }
                }
            }
        };
        Ok(Box::pin(stream))
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = self.encoded_body(&request, false)?;
        let mut attempt = 1u32;
        let text = loop {
            let result = match self.send(&body).await {
                Ok(resp) => match tokio::time::timeout(self.config.request_timeout, resp.text()).await {
                    Ok(Ok(t)) => Ok(t),
                    Ok(Err(e)) => Err(self.transport_error(&e, false)),
                    Err(_) => Err(LlmError::IdleTimeout {
                        endpoint: self.endpoint.clone(),
                        after: self.config.request_timeout,
                    }),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(t) => break t,
                Err(e) => self.backoff(attempt, e).await?,
            }
            attempt += 1;
        };
        let malformed = |detail: String| LlmError::Malformed { endpoint: self.endpoint.clone(), detail };
        let parsed: Completion =
            serde_json::from_str(&text).map_err(|e| malformed(format!("{e} in {}", truncate(&text, 200))))?;
        let choice = parsed.choices.into_iter().next().ok_or_else(|| malformed("the reply has no choices".into()))?;
        let mut calls = ToolCallAssembler::new();
        for (i, c) in choice.message.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let f = c.function.unwrap_or(wire::FunctionDelta { name: None, arguments: None });
            calls.push(
                Some(c.index.unwrap_or(i)),
                c.id.as_deref(),
                f.name.as_deref(),
                f.arguments.as_deref().unwrap_or(""),
            );
        }
        let tool_calls = calls.finish();
        let finish_reason = match choice.finish_reason.as_deref() {
            Some(r) => FinishReason::from_wire(r),
            None if !tool_calls.is_empty() => FinishReason::ToolCalls,
            None => FinishReason::Stop,
        };
        Ok(ChatResponse {
            content: choice.message.content.unwrap_or_default(),
            tool_calls,
            finish_reason,
            usage: parsed.usage.map(Usage::from),
        })
    }

    fn model_id(&self) -> &str {
        &self.config.model
    }
}

/// What feeding one chunk produced.
enum Step {
    Events(Vec<ChatEvent>),
    Done(Vec<ChatEvent>),
}

/// Turns `data:` payloads into [`ChatEvent`]s, assembling tool calls along the way.
struct ChunkParser {
    endpoint: String,
    calls: ToolCallAssembler,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Any chunk arrived (even one with nothing for the caller, like a role-only delta).
    saw_data: bool,
    /// The API key, kept out of the errors a chunk's text goes into.
    secret: Option<String>,
}

impl ChunkParser {
    fn new(endpoint: String) -> Self {
        Self { endpoint, calls: ToolCallAssembler::new(), finish: None, usage: None, saw_data: false, secret: None }
    }

    fn redacting(mut self, secret: Option<String>) -> Self {
        self.secret = secret;
        self
    }

    fn feed(&mut self, data: &str) -> Result<Step, LlmError> {
        self.saw_data = true;
        let data = data.trim();
        if data == "[DONE]" {
            return self.finish().map(Step::Done);
        }
        if data.is_empty() {
            return Ok(Step::Events(Vec::new()));
        }
        let chunk: StreamChunk = serde_json::from_str(data).map_err(|e| LlmError::Malformed {
            endpoint: self.endpoint.clone(),
            detail: format!("{e} in chunk {}", truncate(&redact(data, self.secret.as_deref()), 200)),
        })?;
        if let Some(err) = chunk.error {
            let message = err.message.unwrap_or_else(|| "no message".into());
            return Err(LlmError::Provider {
                endpoint: self.endpoint.clone(),
                message: redact(&message, self.secret.as_deref()),
            });
        }
        let mut out = Vec::new();
        if let Some(u) = chunk.usage {
            self.usage = Some(Usage::from(u));
        }
        for choice in chunk.choices {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    out.push(ChatEvent::TextDelta(text));
                }
                for (pos, tc) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let (name, args) = match tc.function {
                        Some(f) => (f.name, f.arguments.unwrap_or_default()),
                        None => (None, String::new()),
                    };
                    // Without an index, a whole call per array slot (Gemini) is the safe reading.
                    let index = tc.index.or(if tc.id.is_some() { None } else { Some(pos) });
                    let index = self.calls.push(index, tc.id.as_deref(), name.as_deref(), &args);
                    out.push(ChatEvent::ToolCallDelta { index, id: tc.id, name, arguments: args });
                }
            }
            if let Some(r) = choice.finish_reason {
                self.finish = Some(FinishReason::from_wire(&r));
            }
        }
        Ok(Step::Events(out))
    }

    /// Events that close the reply: the assembled calls, usage, and `Finished`.
    fn finish(&mut self) -> Result<Vec<ChatEvent>, LlmError> {
        let Some(mut reason) = self.finish.take() else {
            return Err(LlmError::Transport {
                endpoint: self.endpoint.clone(),
                reason: "the stream ended without a finish reason".into(),
            });
        };
        let calls = std::mem::take(&mut self.calls).finish();
        // Some servers say "stop" even when they called tools; callers route on this.
        if !calls.is_empty() && reason == FinishReason::Stop {
            reason = FinishReason::ToolCalls;
        }
        let mut out: Vec<ChatEvent> = calls.into_iter().map(ChatEvent::ToolCall).collect();
        if let Some(u) = self.usage.take() {
            out.push(ChatEvent::Usage(u));
        }
        out.push(ChatEvent::Finished(reason));
        Ok(out)
    }
}

/// The model-stream parser under hostile and split input (docs/reliability.md): any `data:`
/// payload is an event, nothing, or an error — never a panic; a reply and a tool call cut into
/// fragments at any points come out whole.
#[cfg(test)]
mod chunk_props {
    use super::*;
    use crate::types::ToolCall;
    use proptest::prelude::*;
    use serde_json::json;

    /// `text` cut at the given points (as char boundaries).
    fn cut(text: &str, points: &[prop::sample::Index]) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut at: Vec<usize> = points.iter().map(|p| p.index(chars.len() + 1)).collect();
        at.extend([0, chars.len()]);
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| chars[w[0]..w[1]].iter().collect()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_key_never_reaches_an_error(prefix in ".{0,20}") {
            let key = "sk-test-0123456789";
            let mut p = ChunkParser::new("test".into()).redacting(Some(key.into()));
            let quoted = json!({"error": {"message": format!("{prefix}bad key {key}")}}).to_string();
            let Err(e) = p.feed(&quoted) else { panic!("an in-stream error is an error") };
            prop_assert!(!e.to_string().contains(key), "{}", e);
            let Err(e) = p.feed(&format!("{{not json {key}")) else { panic!("malformed") };
            prop_assert!(!e.to_string().contains(key), "{}", e);
        }

        #[test]
        fn any_payload_is_judged(data in prop::collection::vec(".{0,80}", 1..6)) {
            let mut p = ChunkParser::new("test".into());
            for d in &data {
                if let Ok(Step::Done(_)) | Err(_) = p.feed(d) {
                    break;
                }
            }
            let _ = p.finish();
        }

        #[test]
        fn split_text_and_tool_calls_come_out_whole(
            text in ".{0,60}",
            text_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            args in prop::collection::btree_map("[a-z]{1,6}", ".{0,12}", 0..4),
            arg_cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            indexed in any::<bool>(),
        ) {
            let mut p = ChunkParser::new("test".into());
            let mut got_text = String::new();
            let mut events = Vec::new();
            for piece in cut(&text, &text_cuts) {
                let chunk = json!({"choices": [{"delta": {"content": piece}}]});
                events.extend(match p.feed(&chunk.to_string()) { Ok(Step::Events(e)) => e, other => panic!("{:?}", other.is_ok()) });
            }
            let arguments = serde_json::to_string(&args).unwrap();
            for (i, piece) in cut(&arguments, &arg_cuts).into_iter().enumerate() {
                // OpenAI: index on every fragment, id and name on the first; some servers send
                // neither index nor id after the first.
                let mut call = json!({"function": {"arguments": piece}});
                if indexed {
                    call["index"] = json!(0);
                }
                if i == 0 {
                    call["id"] = json!("call-1");
                    call["function"]["name"] = json!("get_guia");
                }
                let chunk = json!({"choices": [{"delta": {"tool_calls": [call]}}]});
                events.extend(match p.feed(&chunk.to_string()) { Ok(Step::Events(e)) => e, other => panic!("{:?}", other.is_ok()) });
            }
            let finish = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
            prop_assert!(p.feed(&finish.to_string()).is_ok());
            let Ok(Step::Done(closing)) = p.feed("[DONE]") else { panic!("[DONE] closes the stream") };
            for e in &events {
                if let ChatEvent::TextDelta(t) = e {
                    got_text.push_str(t);
                }
            }
            prop_assert_eq!(got_text, text);
            let calls: Vec<&ToolCall> = closing.iter().filter_map(|e| if let ChatEvent::ToolCall(c) = e { Some(c) } else { None }).collect();
            prop_assert_eq!(calls.len(), 1);
            prop_assert_eq!(&calls[0].id, "call-1");
            prop_assert_eq!(&calls[0].name, "get_guia");
            prop_assert_eq!(&calls[0].arguments, &arguments);
        }
    }
}
