//! `toolgraph chat --url`: the terminal conversation of `chat`, held with a running
//! `toolgraph serve` through its HTTP API (docs/service.md) instead of an in-process agent.
//!
//! Each line is a `POST /api/chatbot/stream` turn (with the `toolEvents` extension, so tool
//! calls and their outcomes can be shown), its stream read as typed frames through
//! `toolgraph_protocol::sse`; each `pending` action is put to the user and decided
//! through `POST /api/chatbot/confirm`. `--transcript` writes every event and confirm exchange
//! as JSON lines, for scripts that check a conversation's structure (`scripts/demo --check`).

use crate::terminal::{ask_approval, ask_question, show_tool_call, show_tool_result};
use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use std::io::Write;
use std::time::Duration;
use tokio::sync::mpsc;
use toolgraph_agents::chat_agent::QUESTION;
use toolgraph_protocol::{ConversationId, Frame, FrameError, PendingAction, TenantId, UserId};
use toolgraph_server::{AnswerRequest, ConfirmRequest, ConfirmResponse, StreamRequest};

/// Who the client speaks as, and where.
pub struct RemoteChat {
    client: reqwest::Client,
    base: String,
    /// Every turn's request but its message; `conversation_id` follows the conversation.
    request: StreamRequest,
    api_key: Option<String>,
    transcript: Option<std::io::BufWriter<std::fs::File>>,
    turn: u32,
}

/// The connection settings of [`RemoteChat::new`].
pub struct RemoteOptions {
    pub url: String,
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    pub agent: Option<String>,
    pub context: Option<Map<String, Value>>,
    pub api_key: Option<String>,
    pub conversation: Option<i64>,
    pub transcript: Option<std::path::PathBuf>,
}

/// No frame for this long means the server is gone: it sends a keep-alive every 15 s.
const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// A confirm answers when the resumed run ends: a local model may need minutes for it.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(600);

impl RemoteChat {
    pub fn new(opts: RemoteOptions) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(STREAM_READ_TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        let transcript = match &opts.transcript {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("cannot create the transcript {}", path.display()))?,
            )),
            None => None,
        };
        let request = StreamRequest {
            tenant_slug: opts.tenant_slug,
            tenant_id: TenantId(opts.tenant_id),
            user_id: UserId(opts.user_id),
            conversation_id: opts.conversation.map(ConversationId),
            message: String::new(),
            agent: opts.agent,
            context: opts.context,
            tool_events: true,
            attachments: Vec::new(),
        };
        Ok(Self {
            client,
            base: opts.url.trim_end_matches('/').to_owned(),
            request,
            api_key: opts.api_key,
            transcript,
            turn: 0,
        })
    }

    /// Fails with a readable message unless the server answers `/ready` with 200.
    pub async fn check_ready(&self) -> anyhow::Result<()> {
        let url = format!("{}/ready", self.base);
        let resp = self
            .client
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("no toolgraph service answers at {url} (start one with `toolgraph serve`)"))?;
        if !resp.status().is_success() {
            bail!("the service at {} is not ready ({})", self.base, resp.status());
        }
        Ok(())
    }

    pub fn conversation(&self) -> Option<ConversationId> {
        self.request.conversation_id
    }

    /// Appends one line; tokens stay buffered, anything else is flushed (a few per turn).
    fn record(&mut self, event: &str, data: &Value) {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            turn: u32,
            event: &'a str,
            data: &'a Value,
        }
        if let Some(file) = &mut self.transcript {
            let written = serde_json::to_writer(&mut *file, &Line { turn: self.turn, event, data })
                .map_err(std::io::Error::from)
                .and_then(|()| file.write_all(b"\n"))
                .and_then(|()| if event == "token" { Ok(()) } else { file.flush() });
            // The transcript is a by-product: a full disk must not end the conversation.
            if let Err(e) = written {
                tracing::warn!(error = %e, "cannot write the transcript");
            }
        }
    }

    fn post(&self, path: &str, body: &impl serde::Serialize) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("X-Tenant-Slug", &self.request.tenant_slug)
            .json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        req
    }

    /// Uploads the document at `path` (`POST /api/chatbot/uploads`); the next turn attaches it.
    pub async fn attach(&mut self, path: &std::path::Path) -> anyhow::Result<()> {
        let name = path.file_name().and_then(|n| n.to_str()).context("the document's path has no file name")?;
        let bytes = tokio::fs::read(path).await.with_context(|| format!("cannot read {}", path.display()))?;
        let mut req = self
            .client
            .post(format!("{}/api/chatbot/uploads", self.base))
            .query(&[
                ("tenantId", self.request.tenant_id.0.to_string()),
                ("userId", self.request.user_id.0.to_string()),
                ("name", name.to_owned()),
            ])
            .header("X-Tenant-Slug", &self.request.tenant_slug)
            .body(bytes);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.context("the upload failed")?;
        let status = resp.status();
        let data: Value = resp.json().await.unwrap_or(Value::Null);
        self.record("upload", &json!({ "status": status.as_u16(), "body": data }));
        anyhow::ensure!(
            status.is_success(),
            "cannot attach {name}: the service answered {status}: {}",
            error_text(&data)
        );
        let id = data["uploadId"].as_str().context("the upload's answer has no uploadId")?;
        eprintln!("attached {name} ({} passages): the next message carries it", data["chunks"]);
        self.request.attachments.push(id.to_owned());
        Ok(())
    }

    /// One user turn: streams the reply to stdout and tool activity to stderr, then settles
    /// any pending actions with answers read from `lines`. `Ok(false)` when the input ended
    /// while a decision was awaited.
    pub async fn turn(&mut self, message: &str, lines: &mut mpsc::Receiver<String>) -> anyhow::Result<bool> {
        self.turn += 1;
        let started = std::time::Instant::now();
        message.clone_into(&mut self.request.message);
        let resp = self.post("/api/chatbot/stream", &self.request).send().await.context("the stream request failed")?;
        let status = resp.status();
        if status.is_success() {
            // Attached by this turn: not sent again.
            self.request.attachments.clear();
        }
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            let data = serde_json::from_str::<Value>(&text).unwrap_or_else(|_| json!({ "error": text }));
            if data["field"] == "attachments" {
                // Refused for them: the next message goes without.
                self.request.attachments.clear();
            }
            self.record("http_error", &json!({ "status": status.as_u16(), "body": data }));
            eprintln!("error: the service answered {status}: {}", error_text(&data));
            return Ok(true);
        }
        let mut pending = Vec::new();
        let mut events = std::pin::pin!(toolgraph_protocol::sse::frames(resp.bytes_stream()));
        let mut stdout = std::io::stdout();
        while let Some(event) = events.next().await {
            let event = event.context("cannot read the turn's stream")?;
            self.record(&event.event, &serde_json::from_str(&event.data).unwrap_or(Value::Null));
            match event.frame() {
                Ok(Frame::Token { content }) => {
                    print!("{content}");
                    let _ = stdout.flush();
                }
                Ok(Frame::ToolCall { name, arguments, .. }) => show_tool_call(&name, &arguments),
                Ok(Frame::ToolResult { name, ok, outcome, .. }) => show_tool_result(&name, ok, &outcome),
                Ok(Frame::Pending(action)) => pending.push(action),
                Ok(Frame::Done { conversation_id, .. }) => self.request.conversation_id = Some(conversation_id),
                Ok(Frame::Error { message }) => eprintln!("\nerror: {message}"),
                // Frames this client does not show, and kinds newer than it.
                Ok(_) | Err(FrameError::UnknownEvent { .. }) => {}
                Err(e) => eprintln!("\nerror: {e}"),
            }
        }
        println!();
        eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
        // Several write actions of one turn are decided one by one; each confirm answers with
        // the next undecided one, or with the resumed run's reply (which may ask again).
        let mut next = pending.into_iter().next();
        while let Some(action) = next.take() {
            let started;
            let response = if action.tool_name == QUESTION {
                // A question: answered at /answer, or declined (an empty line) at /confirm.
                let form = action.arguments.get("form").filter(|f| !f.is_null());
                let Some(answer) = ask_question(&action.description, form, lines).await else { return Ok(false) };
                started = std::time::Instant::now();
                match answer {
                    Some(answer) => match self.answer(&action, answer).await {
                        Ok(r) => r,
                        Err(e) => {
                            eprintln!("{e:#}");
                            next = Some(action);
                            continue;
                        }
                    },
                    None => self.confirm(&action, false).await?,
                }
            } else {
                let Some(confirmed) = ask_approval(&action.description, lines).await else { return Ok(false) };
                started = std::time::Instant::now();
                self.confirm(&action, confirmed).await?
            };
            if !response.message.is_empty() {
                println!("{}", response.message);
            }
            eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
            next = response.pending_action;
        }
        Ok(true)
    }

    async fn answer(&mut self, action: &PendingAction, answer: Value) -> anyhow::Result<ConfirmResponse> {
        let conversation_id = self.conversation_of(action)?;
        let body = AnswerRequest {
            tenant_slug: self.request.tenant_slug.clone(),
            tenant_id: self.request.tenant_id,
            user_id: self.request.user_id,
            conversation_id,
            message_id: action.message_id,
            answer,
        };
        self.decide("/api/chatbot/answer", "answer", &body).await
    }

    async fn confirm(&mut self, action: &PendingAction, confirmed: bool) -> anyhow::Result<ConfirmResponse> {
        let conversation_id = self.conversation_of(action)?;
        let body = ConfirmRequest {
            tenant_slug: self.request.tenant_slug.clone(),
            tenant_id: self.request.tenant_id,
            user_id: self.request.user_id,
            conversation_id,
            message_id: action.message_id,
            confirmed,
        };
        self.decide("/api/chatbot/confirm", "confirm", &body).await
    }

    /// The conversation a pending action of this chat belongs to.
    fn conversation_of(&self, action: &PendingAction) -> anyhow::Result<ConversationId> {
        match self.request.conversation_id {
            Some(id) => Ok(id),
            None => bail!("pending action {} arrived without a conversation id", action.message_id),
        }
    }

    /// Posts a decision (`what`: `confirm` or `answer`) to `path` and reads the response,
    /// recording the exchange in the transcript.
    async fn decide(
        &mut self,
        path: &str,
        what: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<ConfirmResponse> {
        let resp = self
            .post(path, body)
            .timeout(CONFIRM_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("the {what} request failed"))?;
        let status = resp.status();
        let data: Value = resp.json().await.unwrap_or(Value::Null);
        self.record(what, &json!({ "request": body, "status": status.as_u16(), "response": data }));
        if !status.is_success() {
            bail!("the service refused the {what} ({status}): {}", error_text(&data));
        }
        serde_json::from_value(data).with_context(|| format!("the {what} response is not the contract's"))
    }
}

/// The message of an error body (`{"error": ...}` or `{"message": ...}`), else the body.
fn error_text(data: &Value) -> String {
    ["error", "message"]
        .iter()
        .find_map(|k| data.get(k).and_then(Value::as_str))
        .map_or_else(|| data.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_prefers_the_error_field() {
        assert_eq!(error_text(&json!({"error": "bad", "field": "message"})), "bad");
        assert_eq!(error_text(&json!({"message": "gone"})), "gone");
        assert_eq!(error_text(&json!([1])), "[1]");
    }
}
