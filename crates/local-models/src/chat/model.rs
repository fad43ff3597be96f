//! [`LocalChatModel`]: a GGUF chat model in process behind the [`ChatModel`] trait.
//!
//! One model instance serves every conversation: requests wait in a bounded queue for the one
//! worker thread that owns the weights and the KV cache (a full queue is a 429 with
//! `Retry-After`, like a busy server). The worker renders the file's chat template with the
//! offered tools, trims the oldest turns when the prompt would not fit, generates with the
//! request's temperature and stop sequences, and streams prose while tool calls written as
//! text are recognised and held back ([`ToolCallTextParser`]); a call's tool name and argument
//! keys are decoded under a constraint to the offered tools ([`ToolCallGuide`]).

use super::call_guide::{GuidedTool, ToolCallGuide};
use super::draft::{Lookahead, PromptLookup};
use super::qwen2::{Qwen2, argmax};
use super::stop::StopScanner;
use super::template::GgufChatAssets;
use crate::LocalModelError;
use async_trait::async_trait;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;
use tokio_stream::StreamExt;
use toolgraph_llm::text_tools::{TextEvent, ToolCallTextParser};
use toolgraph_llm::{
    ChatEvent, ChatModel, ChatRequest, ChatStream, FinishReason, LlmError, Message, SchemaDialect, ToolCall,
    ToolChoice, ToolDefinition, Usage, normalize_schema,
};

/// How the local model is run.
#[derive(Debug, Clone)]
pub struct LocalChatOptions {
    /// Requests that may wait while one runs; more are refused with 429.
    pub queue: usize,
    /// Context window allocated (prompt + reply), at most the model's own.
    pub max_context: usize,
    /// Reply length when the request sets none.
    pub default_max_tokens: usize,
    /// When tools are offered and the tokens that can open a tool call (`<tool_call>`, `{`, a
    /// code fence) together hold at least this probability at the first position of a reply to
    /// the user (not after a tool result), the reply starts with one of them even if a prose token is the single likeliest. Greedy
    /// decoding compares single tokens, and a call's probability is spread over several
    /// openers; 0.5 picks the likelier of the two kinds of reply. Above 1: never.
    pub call_threshold: f32,
    /// Where computed prompt prefixes are kept between processes (a file per prompt, named by
    /// the weights file and the prompt's tokens): [`ChatModel::prepare`] writes its prompt's
    /// state there, and a model started later loads the newest `cache_slots` of them, so its
    /// own `prepare` computes almost nothing. `None`: nothing is kept.
    pub prefix_dir: Option<std::path::PathBuf>,
    /// Token sequences the KV cache keeps at once ([`Qwen2::set_cache_slots`]): each agent's
    /// prompt, and the prompts of tools that ask the same model (the legal agent's answer
    /// writer), stay computed beside one another. Each holds up to `max_context` tokens of
    /// keys and values (the 1.5B: 57 kB a token).
    pub cache_slots: usize,
    /// Drafts read from the prompt for speculative decoding ([`PromptLookup`]): a reply that
    /// quotes its sources is written several tokens per pass, the same tokens as without.
    pub lookup: PromptLookup,
}

impl Default for LocalChatOptions {
    fn default() -> Self {
        Self {
            queue: 8,
            max_context: 4096,
            default_max_tokens: 512,
            call_threshold: 0.5,
            prefix_dir: None,
            cache_slots: 4,
            lookup: PromptLookup::default(),
        }
    }
}

/// The computed prompt prefixes of one weights file kept in a directory:
/// `{weights}-{size}-{state version}-{hash of the tokens}.safetensors`, at most `keep` of them
/// (the oldest are removed).
struct PrefixStore {
    dir: std::path::PathBuf,
    stem: String,
    keep: usize,
}

impl PrefixStore {
    /// This model's files, oldest first.
    fn files(&self) -> Vec<std::path::PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut files: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(&self.stem) && name.ends_with(".safetensors")
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        files.sort();
        files.into_iter().map(|(_, p)| p).collect()
    }

    /// The file of the prefix `tokens`.
    fn path(&self, tokens: &[u32]) -> std::path::PathBuf {
        use sha2::Digest;
        let mut hash = sha2::Sha256::new();
        tokens.iter().for_each(|t| hash.update(t.to_le_bytes()));
        let digest = hex::encode(hash.finalize());
        self.dir.join(format!("{}-{}.safetensors", self.stem, &digest[..16]))
    }

    /// Removes the oldest files past `keep`.
    fn prune(&self) {
        let files = self.files();
        for old in &files[..files.len().saturating_sub(self.keep)] {
            if let Err(e) = std::fs::remove_file(old) {
                tracing::warn!(error = %e, file = %old.display(), "cannot remove an old prompt prefix");
            }
        }
    }
}

struct Job {
    request: ChatRequest,
    work: Work,
}

/// What a [`Job`] asks of the worker.
enum Work {
    /// A reply, streamed as its events.
    Reply(tokio::sync::mpsc::Sender<Result<ChatEvent, LlmError>>),
    /// Compute the prompt and keep it ([`ChatModel::prepare`]) rather than answer.
    Prepare(tokio::sync::mpsc::Sender<Result<ChatEvent, LlmError>>),
    /// The log-probabilities of the last message's tail ([`ChatModel::tail_logprobs`]).
    Tail { tail: String, answer: tokio::sync::oneshot::Sender<Result<Option<Vec<f32>>, LlmError>> },
}

/// A local GGUF chat model.
pub struct LocalChatModel {
    jobs: SyncSender<Job>,
    id: String,
    queue: usize,
    drafts: Arc<DraftCounts>,
}

/// Tokens drafted from the prompt ([`LocalChatOptions::lookup`]) and taken by replies, since
/// the model was loaded.
#[derive(Debug, Default)]
struct DraftCounts {
    drafted: AtomicU64,
    taken: AtomicU64,
}

impl std::fmt::Debug for LocalChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalChatModel").field("id", &self.id).finish()
    }
}

impl LocalChatModel {
    /// Loads `path` and starts its worker thread (blocking: seconds).
    ///
    /// # Errors
    /// A missing file names `scripts/fetch-models`; malformed files and load failures.
    pub fn load(path: &Path, options: LocalChatOptions) -> Result<Self, LocalModelError> {
        let (assets, content) = GgufChatAssets::from_file(path)?;
        let mut reader = std::fs::File::open(path)
            .map_err(|e| LocalModelError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        let max_context = options.max_context.min(assets.context_length).max(256);
        let mut model = Qwen2::load(&content, &mut reader, max_context)?;
        model.set_cache_slots(options.cache_slots);
        let id = path.file_stem().and_then(|s| s.to_str()).unwrap_or("local").to_owned();
        // The weights file's name and size say which model a kept prefix was computed by, the
        // kernel set and its version with which numerics (a state of other numerics is computed
        // again, not mixed with this one's).
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let prefixes = options.prefix_dir.as_ref().map(|dir| PrefixStore {
            dir: dir.clone(),
            stem: format!("{id}-{size}-{}-{}", Qwen2::STATE_VERSION, model.kernels()),
            keep: model.cache_slots(),
        });
        if let Some(store) = &prefixes {
            let files = store.files();
            // The newest last, so it is the most recently used slot.
            for file in &files[files.len().saturating_sub(model.cache_slots())..] {
                match model.load_prefix(file) {
                    Ok(n) => tracing::info!(tokens = n, file = %file.display(), "loaded a computed prompt prefix"),
                    Err(e) => tracing::warn!(error = %e, "cannot use a kept prompt prefix; it is computed again"),
                }
            }
        }
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(options.queue);
        let drafts = Arc::new(DraftCounts::default());
        let mut worker = Worker {
            drafts: Arc::clone(&drafts),
            model,
            assets,
            max_context,
            default_max_tokens: options.default_max_tokens,
            id: id.clone(),
            vocab: Vec::new(),
            call_openers: Vec::new(),
            json_openers: Vec::new(),
            template_tag_tokens: Vec::new(),
            call_head: Vec::new(),
            call_threshold: options.call_threshold,
            prefixes,
            lookup: options.lookup,
        };
        std::thread::Builder::new()
            .name("toolgraph-local-chat".into())
            .spawn(move || {
                while let Ok(Job { request, work }) = queue.recv() {
                    match work {
                        Work::Reply(events) => {
                            if let Err(e) = worker.run(request, &events) {
                                let _ = events.blocking_send(Err(e));
                            }
                        }
                        Work::Prepare(events) => {
                            let done = worker.prepare(&request).map(|()| ChatEvent::Finished(FinishReason::Stop));
                            let _ = events.blocking_send(done);
                        }
                        // A caller that stopped waiting drops the answer.
                        Work::Tail { tail, answer } => drop(answer.send(worker.tail_logprobs(&request, &tail))),
                    }
                }
            })
            .map_err(|e| LocalModelError::Io { path: "worker thread".into(), reason: e.to_string() })?;
        Ok(Self { jobs, id, queue: options.queue, drafts })
    }

    /// Tokens drafted from prompts since the model was loaded, and how many of them replies
    /// took (each taken one a token that cost no pass of its own).
    pub fn draft_counts(&self) -> (u64, u64) {
        (self.drafts.drafted.load(Ordering::Relaxed), self.drafts.taken.load(Ordering::Relaxed))
    }
}

#[async_trait]
impl ChatModel for LocalChatModel {
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        self.submit(request, false)
    }

    /// Computes the prompt without generating and keeps its state in `prefix_dir`.
    async fn prepare(&self, request: ChatRequest) -> Result<(), LlmError> {
        let mut done = self.submit(request, true)?;
        while let Some(event) = done.next().await {
            event?;
        }
        Ok(())
    }

    /// Computes the prompt up to the tail and the tail's tokens after it, in one pass over
    /// them; the prompt's computed prefix stays cached, so the reply to the same conversation
    /// that follows reads only what differs.
    async fn tail_logprobs(&self, request: ChatRequest, tail: &str) -> Result<Option<Vec<f32>>, LlmError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.send(Job { request, work: Work::Tail { tail: tail.to_owned(), answer } })?;
        answered.await.unwrap_or_else(|_| Err(self.stopped()))
    }

    fn model_id(&self) -> &str {
        &self.id
    }
}

impl LocalChatModel {
    fn submit(&self, request: ChatRequest, prepare: bool) -> Result<ChatStream, LlmError> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let work = if prepare { Work::Prepare(tx) } else { Work::Reply(tx) };
        self.send(Job { request, work })?;
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    /// Queues `job` for the worker, or says why it cannot wait there.
    fn send(&self, job: Job) -> Result<(), LlmError> {
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(LlmError::Status {
                endpoint: format!("local:{}", self.id),
                status: 429,
                body: format!("the local model is busy ({} requests waiting)", self.queue),
                retry_after: Some(Duration::from_secs(2)),
            }),
            Err(TrySendError::Disconnected(_)) => Err(self.stopped()),
        }
    }

    fn stopped(&self) -> LlmError {
        LlmError::Provider { endpoint: format!("local:{}", self.id), message: "the model worker stopped".into() }
    }
}

struct Worker {
    model: Qwen2,
    assets: GgufChatAssets,
    max_context: usize,
    default_max_tokens: usize,
    id: String,
    /// Each token id's text, for constraining tool names; built when a prompt with tools is
    /// prepared (before the service is ready) or on the first request that offers tools.
    vocab: Vec<String>,
    /// For each token id: whether it can open a tool call written as text.
    call_openers: Vec<bool>,
    /// Per token id: whether it starts a bare JSON object or a code fence.
    json_openers: Vec<bool>,
    /// Tokens that hold a tag only the template writes ([`template_tag_tokens`]).
    template_tag_tokens: Vec<u32>,
    /// The tokens of a call's head as the template writes it ([`CALL_HEAD`]), as the tokenizer
    /// splits that text: a call written in them reads the same when the template renders it
    /// into the next prompt, so the tokens computed for it are reused there.
    call_head: Vec<u32>,
    call_threshold: f32,
    /// Where a warm-up's prompt state is kept ([`LocalChatOptions::prefix_dir`]).
    prefixes: Option<PrefixStore>,
    lookup: PromptLookup,
    drafts: Arc<DraftCounts>,
}

/// Whether a token can be the first of a tool call written as text: the tag, a JSON object or
/// a code fence (the forms `ToolCallTextParser` accepts).
fn opens_call(token: &str) -> bool {
    let t = token.trim_start();
    // Only the openings the call parser reads: a bare `{` (then `"name"`), a code fence or the
    // tag. `{{`, `{}` or `{%` start prose or templates; counted as openers, they let a reply begin
    // with a "call" that is printed as text.
    let bare_object = t.strip_prefix('{').is_some_and(|rest| {
        let rest = rest.trim_start();
        rest.is_empty() || "\"name\":".starts_with(rest) || rest.starts_with("\"name\":")
    });
    bare_object
        || t.starts_with("```")
        || (!t.is_empty() && ("<tool_call>".starts_with(t) || t.starts_with("<tool_call>")))
}

/// Most tokens [`Worker::tail_logprobs`] scores (past it, the model cannot tell): each takes a
/// row of the vocabulary's logits.
const MAX_TAIL_TOKENS: usize = 128;

/// The natural log-probability of `token` under `logits`.
fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|x| (x - max).exp()).sum();
    logits.get(token as usize).map_or(f32::NEG_INFINITY, |x| x - max - sum.ln())
}

/// Whether a token starts a JSON object or a code fence.
fn opens_json(token: &str) -> bool {
    let t = token.trim_start();
    t.starts_with('{') || t.starts_with("```")
}

impl Worker {
    fn err(&self, message: impl Into<String>) -> LlmError {
        LlmError::Provider { endpoint: format!("local:{}", self.id), message: message.into() }
    }

    fn encode(&self, messages: &[Message], tools: &[ToolDefinition]) -> Result<Vec<u32>, LlmError> {
        self.tokenize(&self.render(messages, tools)?)
    }

    fn render(&self, messages: &[Message], tools: &[ToolDefinition]) -> Result<String, LlmError> {
        self.assets.template.render(messages, tools).map_err(|e| LlmError::InvalidRequest(e.to_string()))
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(self.assets.tokenizer.encode(text, false).map_err(|e| self.err(e.to_string()))?.get_ids().to_vec())
    }

    /// At a reply's first token, opens a call when the call tokens hold at least `threshold`
    /// of the probability ([`prefer_call`]). A chosen call opens with the template's own tag:
    /// the template renders past calls that way, so the tokens computed for this one stay
    /// valid in the next prompt (the 1.5B otherwise writes a fenced block, and the prompt after
    /// the tool's result was computed again from the call on). Without the tag's token, any
    /// call opener but a bare JSON object.
    fn choose_call(&self, logits: &mut [f32], threshold: f32) {
        if prefer_call(logits, &self.call_openers, &self.json_openers, threshold) {
            forbid_bare_json(logits, &self.json_openers);
            only(logits, self.call_head.first().copied());
        }
    }

    /// The prompt `text` spelled, as far as it can be, in the tokens of a sequence the KV cache
    /// holds, then the rest tokenized: `None` when no cached sequence reads as more of it than
    /// `ids` (its own tokens) already share with one. A reply the model wrote comes back in
    /// the next prompt as text, and the tokenizer may split that text otherwise than the
    /// model's tokens did (`"}}` then `\n` written, `"}}\n` read back); the text being the
    /// same, the model's own tokens are as good a reading of it, and their keys and values
    /// are already computed.
    fn as_cached(&self, text: &str, ids: &[u32]) -> Result<Option<Vec<u32>>, LlmError> {
        let shared = self.model.cached_prefix(ids);
        // Only a sequence longer than what `ids` already share can read as more of the text.
        let best = self
            .model
            .cached_sequences()
            .filter(|cached| cached.len() > shared)
            .map(|cached| (text_prefix(&self.assets.tokenizer, cached, text), cached))
            .max_by_key(|&((tokens, _), _)| tokens);
        let Some(((tokens, bytes), cached)) = best.filter(|&((tokens, _), _)| tokens > shared) else {
            return Ok(None);
        };
        let mut spliced = cached[..tokens].to_vec();
        spliced.extend(self.tokenize(&text[bytes..])?);
        Ok(Some(spliced))
    }

    /// The prompt, dropping the oldest turns after the system messages until prompt and reply
    /// fit the context (the history budget of the agent usually keeps it far below).
    fn prompt(&self, request: &ChatRequest, tools: &[ToolDefinition], max_new: usize) -> Result<Vec<u32>, LlmError> {
        let mut messages = request.messages.clone();
        loop {
            let text = self.render(&messages, tools)?;
            let ids = self.tokenize(&text)?;
            if ids.len() + max_new <= self.max_context {
                return Ok(match self.as_cached(&text, &ids)? {
                    Some(spliced) if spliced.len() + max_new <= self.max_context => spliced,
                    _ => ids,
                });
            }
            // The system messages before the conversation (the prompt, what is remembered of
            // the person, the summary of older turns) stay.
            let first = messages.iter().take_while(|m| matches!(m, Message::System { .. })).count();
            // Keep at least the newest message.
            if messages.len() <= first + 1 {
                return Err(LlmError::InvalidRequest(format!(
                    "the prompt needs {} tokens and the reply {max_new}, more than the local model's {}-token context",
                    ids.len(),
                    self.max_context
                )));
            }
            messages.remove(first);
            // Never start on a tool result whose call was dropped.
            while matches!(messages.get(first), Some(Message::Tool { .. })) && messages.len() > first + 1 {
                messages.remove(first);
            }
        }
    }

    fn ensure_vocab(&mut self) {
        if !self.vocab.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let tokenizer = &self.assets.tokenizer;
        let size = tokenizer.get_vocab_size(true) as u32;
        self.vocab = (0..size).map(|id| tokenizer.decode(&[id], false).unwrap_or_default()).collect();
        self.call_openers = self.vocab.iter().map(|t| opens_call(t)).collect();
        self.json_openers = self.vocab.iter().map(|t| opens_json(t)).collect();
        self.template_tag_tokens = template_tag_tokens(&self.vocab);
        self.call_head = match self.assets.tokenizer.encode(CALL_HEAD, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot tokenize a call's head; calls are written freely");
                Vec::new()
            }
        };
        tracing::debug!(tokens = size, seconds = started.elapsed().as_secs_f64(), "the vocabulary's texts");
    }

    /// The request's tools as any local server would get them: no `$schema`, no type names as
    /// titles, no `$ref`s (a small model copies such words into its arguments). Once per
    /// request: the template and the call guide read the same ones.
    fn normalized_tools(request: &ChatRequest) -> Vec<ToolDefinition> {
        request
            .tools
            .iter()
            .map(|t| ToolDefinition {
                parameters: normalize_schema(&t.parameters, SchemaDialect::Generic),
                ..t.clone()
            })
            .collect()
    }

    /// The log-probability of each token of `tail`, the text `request`'s last message ends
    /// with, given the prompt before it ([`ChatModel::tail_logprobs`]): the prompt up to the
    /// tail and the tail's tokens computed in one pass, the tail dropped from the cache after
    /// (the prompt's prefix stays, for the reply that follows). A space before the tail is
    /// scored with it: the tokenizer joins a word to the space before it, so the two pieces
    /// read as the whole text does.
    fn tail_logprobs(&mut self, request: &ChatRequest, tail: &str) -> Result<Option<Vec<f32>>, LlmError> {
        let content = request.messages.last().map_or("", Message::content);
        if tail.is_empty() || !content.ends_with(tail) {
            return Err(LlmError::InvalidRequest("the tail to score is not the end of the last message".into()));
        }
        let text = self.render(&request.messages, &Self::normalized_tools(request))?;
        let end = text.rfind(content).map(|at| at + content.len()).ok_or_else(|| {
            LlmError::InvalidRequest("the chat template does not write the last message as it is".into())
        })?;
        let mut start = end - tail.len();
        if text[..start].ends_with(' ') {
            start -= 1;
        }
        // Spelled as a cached sequence reads it (an earlier reply in the model's own tokens), so
        // scoring reuses the conversation computed so far and leaves it for the reply.
        let ids = self.tokenize(&text[..start])?;
        let prompt = self.as_cached(&text[..start], &ids)?.unwrap_or(ids);
        let scored = self.tokenize(&text[start..end])?;
        // Too long a tail, or a prompt past the context: the model cannot tell (a reply would
        // drop the oldest turns; a judgement made on other turns than the reply's is no guide).
        if scored.len() > MAX_TAIL_TOKENS || prompt.len() + scored.len() > self.max_context {
            return Ok(None);
        }
        let (rows, _) = self.model.draft_logits(&prompt, &scored).map_err(|e| self.err(e.to_string()))?;
        self.model.settle_draft(&prompt);
        let vocab = self.model.vocab();
        Ok(Some(scored.iter().zip(rows.chunks_exact(vocab)).map(|(&token, row)| log_softmax_at(row, token)).collect()))
    }

    /// Computes `request`'s prompt into the KV cache, without generating, and keeps its state
    /// in the prefix directory when there is one (unless it is there already); with tools, the
    /// vocabulary's texts the call guide reads are built here too.
    fn prepare(&mut self, request: &ChatRequest) -> Result<(), LlmError> {
        // What the first reply with tools would otherwise build before its first token.
        if !request.tools.is_empty() {
            self.ensure_vocab();
        }
        let tools = Self::normalized_tools(request);
        let ids = self.prompt(request, &tools, 1)?;
        self.model.next_logits(&ids).map_err(|e| self.err(e.to_string()))?;
        if let Some(store) = &self.prefixes {
            let file = store.path(&ids);
            // The state is in memory already; keeping it for the next start is best effort.
            if file.exists() {
                // Marks it as recently used, so pruning keeps it.
                let touched = std::fs::File::options()
                    .append(true)
                    .open(&file)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                if let Err(e) = touched {
                    tracing::debug!(error = %e, "cannot mark a kept prompt prefix as used");
                }
            } else if let Err(e) = self.model.save_prefix(&file, ids.len()) {
                tracing::warn!(error = %e, "cannot keep the computed prompt prefix");
            }
            store.prune();
        }
        Ok(())
    }

    /// The prompt of the latest user message read alone — the system prompt, the tools and
    /// that message — when the request is a user turn after earlier ones; `None` otherwise.
    /// A small model that answered earlier turns in prose tends to keep to prose (a legal
    /// question after a greeting: 0.09 of the probability on a call, against 0.67 for the
    /// same question alone), so such a turn whose reply would not open a call is also asked
    /// this way, and a call it opens is opened in the real reply, written with the whole
    /// history. The system prompt and tools are the cached prefix: it costs the message's
    /// tokens and a copy of the cached rows after the prefix ([`Qwen2::probe_logits`]).
    fn latest_alone(&self, request: &ChatRequest, tools: &[ToolDefinition]) -> Result<Option<Vec<u32>>, LlmError> {
        let Some(last @ Message::User { .. }) = request.messages.last() else { return Ok(None) };
        let earlier = request.messages.iter().filter(|m| !matches!(m, Message::System { .. })).count() > 1;
        if !earlier {
            return Ok(None);
        }
        let mut alone: Vec<Message> =
            request.messages.first().filter(|m| matches!(m, Message::System { .. })).cloned().into_iter().collect();
        alone.push(last.clone());
        self.encode(&alone, tools).map(Some)
    }

    /// A draft of at most `limit` tokens to follow `ids` (a reply from `reply_start` on): the
    /// rest of the call's head while the reply writes it, else, unless `no_lookup`, the
    /// prompt's lookup. Inside a call the prompt is a poor guide: the tools' schemas hold
    /// `{"name": "` and parameter names followed by other text than the call's (in the demo's
    /// first call, 6 of 103 drafted tokens were taken); [`Worker::call_draft`] drafts there.
    fn draft<'a>(&'a self, ids: &'a [u32], reply_start: usize, limit: usize, no_lookup: bool) -> &'a [u32] {
        if self.lookup.max_tokens == 0 {
            return &[];
        }
        let reply = &ids[reply_start..];
        if !reply.is_empty() && self.call_head.len() > reply.len() && self.call_head.starts_with(reply) {
            let rest = &self.call_head[reply.len()..];
            return &rest[..rest.len().min(limit)];
        }
        if no_lookup { &[] } else { self.lookup.draft(ids, limit) }
    }

    /// A draft of at most `limit` tokens inside a call (`text`: the reply so far; `from_head`:
    /// the call was opened with [`CALL_HEAD`]): what the guide expects next
    /// ([`ToolCallGuide::expected`]: the rest of a name or key only one tool or parameter
    /// fits, the arguments' opening or closing), followed by the call's end where that closes
    /// the arguments; once they closed, the rest of the call's end. None inside values.
    fn call_draft(&self, guide: &ToolCallGuide, from_head: bool, text: &str, limit: usize) -> Vec<u32> {
        if self.lookup.max_tokens == 0 || limit == 0 {
            return Vec::new();
        }
        let guess = if guide.in_call() {
            let Some((mut guess, closes)) = guide.expected(text) else { return Vec::new() };
            if closes && from_head {
                guess.extend(call_tail(&format!("{text}{guess}")));
            }
            guess
        } else if from_head {
            call_tail(text).unwrap_or_default()
        } else {
            return Vec::new();
        };
        // A draft that cannot be tokenised is only a pass not saved.
        let mut draft = self.tokenize(&guess).unwrap_or_default();
        draft.truncate(limit.min(self.lookup.max_tokens));
        draft
    }

    fn run(
        &mut self,
        request: ChatRequest,
        events: &tokio::sync::mpsc::Sender<Result<ChatEvent, LlmError>>,
    ) -> Result<(), LlmError> {
        if !request.tools.is_empty() {
            self.ensure_vocab();
        }
        let tools = Self::normalized_tools(&request);
        // Every offered tool is in the prompt (its computed prefix stays valid); the guide
        // lets the model name only the ones it may call now.
        let callable: Vec<&str> = request.callable_tools().iter().map(|t| t.name.as_str()).collect();
        let mut guide = ToolCallGuide::new(
            tools
                .iter()
                .filter(|t| callable.contains(&t.name.as_str()))
                .map(|t| GuidedTool::from_schema(&t.name, &t.parameters))
                .collect(),
        );
        let max_new = request.max_tokens.map_or(self.default_max_tokens, |m| m as usize).max(1);
        let mut ids = self.prompt(&request, &tools, max_new)?;
        let prompt_tokens = ids.len();
        let reply_start = ids.len();
        // Whether the reply is a call written from [`CALL_HEAD`] whose end is still to come.
        let mut in_call = false;
        let temperature = request.temperature.unwrap_or(0.0);
        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ prompt_tokens as u64;
        let mut parser = ToolCallTextParser::new();
        let (mut generated, mut calls, mut finish) = (0usize, 0usize, FinishReason::Length);
        // Decodes token by token, holding bytes back until they form whole characters.
        let mut decoder = self.assets.tokenizer.decode_stream(false);
        let mut text = String::new();
        let mut stops = StopScanner::new(&request.stop);
        let send = |e: ChatEvent| events.blocking_send(Ok(e)).is_ok();
        let emit = |evs: Vec<TextEvent>, calls: &mut usize| -> bool {
            for e in evs {
                let ok = match e {
                    TextEvent::Text(t) => send(ChatEvent::TextDelta(t)),
                    TextEvent::ToolCall { name, arguments } => {
                        *calls += 1;
                        send(ChatEvent::ToolCall(ToolCall { id: format!("call_{}", *calls), name, arguments }))
                    }
                };
                if !ok {
                    return false;
                }
            }
            true
        };
        let started = std::time::Instant::now();
        // Prompt tokens not found in the KV cache: what this reply's prompt cost to read.
        let mut computed_prompt = None;
        // Logits computed ahead for a draft, and how many drafted tokens were computed and taken.
        let mut ahead = Lookahead::default();
        let (mut drafted, mut taken) = (0usize, 0usize);
        let vocab = self.model.vocab();
        // How many tokens of `ids` the last logits were for, and whether the caller went away.
        let (mut asked, mut gone) = (ids.len(), false);
        while generated < max_new {
            asked = ids.len();
            if ahead.row(&ids).is_some() {
                taken += 1;
            } else {
                // Each drafted token the reply takes is one more generated token.
                let limit = (max_new - generated - 1).min(self.max_context.saturating_sub(ids.len()));
                // Where the reply just left a draft it parts from the text it was
                // following: the next token is computed alone, not drafted again from there.
                let parted = ahead.taken(&ids) < ahead.drafted();
                let calling = in_call || guide.in_call();
                let draft = match generated {
                    0 => Vec::new(),
                    _ if calling => self.call_draft(&guide, in_call, &text, limit),
                    _ => self.draft(&ids, reply_start, limit, parted).to_vec(),
                };
                let (rows, computed) = self.model.draft_logits(&ids, &draft).map_err(|e| self.err(e.to_string()))?;
                computed_prompt.get_or_insert(computed);
                drafted += draft.len();
                ahead.set(ids.len(), &draft, rows, vocab);
            }
            // Masked and sampled in place: the row is not read again.
            let Some(logits) = ahead.row_mut(&ids) else {
                // Unreachable: the rows were found for `ids` or were just computed for them.
                return Err(self.err("no logits for the prompt"));
            };
            if guide.active() {
                guide.mask(&self.vocab, logits);
            }
            if !self.vocab.is_empty() {
                forbid_template_tags(&text, &self.vocab, &self.template_tag_tokens, logits);
                complete_call_tag(&text, &self.vocab, logits);
            }
            if generated == 0 && !callable.is_empty() {
                match request.messages.last() {
                    // A call was asked for: the reply opens the template's call tag (a bare
                    // JSON object after a tool result tends to echo the result), and the guide
                    // lets it name only the callable tools.
                    _ if request.call_required() => self.choose_call(logits, 0.0),
                    Some(Message::User { .. }) => {
                        let mut threshold = self.call_threshold;
                        if call_share(logits, &self.call_openers, &self.json_openers) < threshold
                            && let Some(alone) = self.latest_alone(&request, &tools)?
                        {
                            let probe = self.model.probe_logits(&alone).map_err(|e| self.err(e.to_string()))?;
                            let share = call_share(&probe, &self.call_openers, &self.json_openers);
                            tracing::debug!(call_probability = share, "the latest message alone");
                            if share >= threshold {
                                threshold = 0.0;
                            }
                        }
                        self.choose_call(logits, threshold);
                    }
                    // After a tool result a small model tends to echo the result's JSON: the
                    // reply is prose, or a further call in the template's own tag.
                    Some(Message::Tool { .. }) => {
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            let share = call_share(logits, &self.call_openers, &self.json_openers);
                            tracing::debug!(call_probability = share, "a reply's first token after a tool result");
                        }
                        forbid_bare_json(logits, &self.json_openers);
                    }
                    _ => {}
                }
            }
            // After the call decision, which weighs the call openers against every token's
            // probability, the stop tokens' included.
            if text.trim().is_empty() {
                let tag = self.call_head.first().copied().filter(|_| generated == 0 && request.tools.is_empty());
                forbid_at_first_token(logits, &self.assets.stop_tokens, tag);
            }
            // A call written from the head ends as the template ends it, once its arguments
            // closed (a model used to fences closes with "```" instead, and the call is lost).
            if in_call && !guide.in_call() && !self.vocab.is_empty() {
                match call_tail(&text) {
                    Some(rest) if !rest.is_empty() => continue_with(&rest, &self.vocab, logits),
                    _ => in_call = false,
                }
            }
            // A call opened with the head's first token goes on in the head's tokens.
            if generated > 0 && ids[reply_start..] == self.call_head[..generated.min(self.call_head.len())] {
                only(logits, self.call_head.get(generated).copied());
            }
            let next = if temperature <= 0.01 { argmax(logits) } else { sample(logits, temperature, &mut rng) };
            if self.assets.stop_tokens.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            ids.push(next);
            generated += 1;
            let Some(piece) = decoder.step(next).map_err(|e| self.err(e.to_string()))? else { continue };
            text.push_str(&piece);
            guide.observe(&text, &piece);
            in_call |= guide.in_call() && text.starts_with(CALL_HEAD);
            let released = stops.push(&piece);
            if !released.text.is_empty() && !emit(parser.push(&released.text), &mut calls) {
                gone = true; // the caller went away: stop generating
                break;
            }
            // A reply asked to call one named tool is that one call: a small model forced
            // into a call tends to repeat it until it runs out of tokens.
            if calls > 0 && matches!(request.tool_choice, Some(ToolChoice::Tool(_))) {
                break;
            }
            if released.stopped {
                finish = FinishReason::Stop;
                break;
            }
        }
        // The cache keeps what decoding without drafts would have left: the tokens the logits
        // were last asked for, not a draft's tokens the reply did not take (the next prompt is
        // spelled in the cached tokens where they read as its text).
        self.model.settle_draft(&ids[..asked]);
        if gone {
            return Ok(());
        }
        // Text held back as a possible stop sequence that generation ended before completing.
        let held = stops.finish();
        if !held.is_empty() && !emit(parser.push(&held), &mut calls) {
            return Ok(());
        }
        if !emit(parser.finish(), &mut calls) {
            return Ok(());
        }
        if calls > 0 {
            finish = FinishReason::ToolCalls;
        }
        self.drafts.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.drafts.taken.fetch_add(taken as u64, Ordering::Relaxed);
        tracing::debug!(
            prompt_tokens,
            computed_prompt_tokens = computed_prompt.unwrap_or(0),
            generated,
            drafted,
            drafted_taken = taken,
            seconds = started.elapsed().as_secs_f64(),
            "local model reply"
        );
        let usage = Usage {
            prompt_tokens: prompt_tokens as u32,
            completion_tokens: generated as u32,
            cached_prompt_tokens: prompt_tokens.saturating_sub(computed_prompt.unwrap_or(0)) as u32,
        };
        if send(ChatEvent::Usage(usage)) {
            send(ChatEvent::Finished(finish));
        }
        Ok(())
    }
}

/// At a reply's first token: if the tokens that start a call or a JSON object together have
/// at least `threshold` of the probability, keeps only the call openers the parser reads (see
/// [`LocalChatOptions::call_threshold`]); otherwise still drops the JSON-like tokens that are no
/// call opener (`{{`), which would print a would-be call as text. Returns whether it chose a call.
fn prefer_call(logits: &mut [f32], openers: &[bool], json_like: &[bool], threshold: f32) -> bool {
    let at = |mask: &[bool], i: usize| mask.get(i).copied().unwrap_or(false);
    let share = call_share(logits, openers, json_like);
    let call = share >= threshold;
    tracing::debug!(call_probability = share, call, "a reply's first token");
    for (i, l) in logits.iter_mut().enumerate() {
        let keep = if call { at(openers, i) } else { at(openers, i) || !at(json_like, i) };
        if !keep {
            *l = f32::NEG_INFINITY;
        }
    }
    call
}

/// The probability the tokens that open a call or a JSON object hold together.
fn call_share(logits: &[f32], openers: &[bool], json_like: &[bool]) -> f32 {
    let at = |mask: &[bool], i: usize| mask.get(i).copied().unwrap_or(false);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (mut total, mut calls) = (0f32, 0f32);
    for (i, l) in logits.iter().enumerate() {
        let p = (l - max).exp();
        total += p;
        if at(openers, i) || at(json_like, i) {
            calls += p;
        }
    }
    if total > 0.0 { calls / total } else { 0.0 }
}

/// What only the template writes: the tags around a tool's result, up to where they part from
/// `<tool_call>`. A small model that has seen results in its history may open its reply with
/// `<tool_response>` and make a result up; the GGUF's tokenizer spells the tag in several
/// tokens, so the text so far decides.
const TEMPLATE_ONLY: [&str; 2] = ["<tool_r", "</tool_r"];

/// The ids of the tokens that hold a [`TEMPLATE_ONLY`] tag whole.
fn template_tag_tokens(vocab: &[String]) -> Vec<u32> {
    (0..vocab.len() as u32).filter(|&i| TEMPLATE_ONLY.iter().any(|tag| vocab[i as usize].contains(tag))).collect()
}

/// Forbids the tokens that would make `text` go on into a [`TEMPLATE_ONLY`] tag: those that
/// hold one whole (`tag_tokens`), and while `text` ends inside such a tag's opening (`<`,
/// `<tool`, `</tool_`, …) the ones that continue it (the vocabulary is scanned only then).
fn forbid_template_tags(text: &str, vocab: &[String], tag_tokens: &[u32], logits: &mut [f32]) {
    for &id in tag_tokens {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    let Some(at) = text.rfind('<') else { return };
    let tail = &text[at..];
    for tag in TEMPLATE_ONLY {
        let Some(rest) = tag.strip_prefix(tail) else { continue };
        for (l, token) in logits.iter_mut().zip(vocab) {
            if token.starts_with(rest) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// How many of `cached`'s tokens read as the start of `text`, and how many bytes of `text`
/// they read as (a token that ends inside a character counts once the character is whole).
fn text_prefix(tokenizer: &tokenizers::Tokenizer, cached: &[u32], text: &str) -> (usize, usize) {
    let mut stream = tokenizer.decode_stream(false);
    let (mut best, mut at) = ((0, 0), 0);
    for (i, &id) in cached.iter().enumerate() {
        match stream.step(id) {
            Ok(Some(piece)) if text[at..].starts_with(piece.as_str()) => {
                at += piece.len();
                best = (i + 1, at);
            }
            Ok(None) => {} // bytes held back until they form a character
            _ => break,
        }
    }
    best
}

/// How the template writes a call's head; a call is written the same way.
const CALL_HEAD: &str = "<tool_call>\n{\"name\": \"";

/// Makes a reply that opens with a beginning of `<tool_call>` (`<`, `<tool`, …) write the
/// call's head as the template writes it, `<tool_call>\n{"name": "`: chosen as a call's opener,
/// `<` must not turn into a made-up tag such as `<tool Response>`, and after the tag comes the
/// JSON object the template showed (then the call guide takes over), not the XML a model may
/// have learned elsewhere (`<name>retrieve_laws</name>`) nor other keys (`{"function": …}`),
/// which no parser reads. Written the template's way, the call also reads the same when the
/// template renders it into the next prompt, so the tokens computed for it are reused.
fn complete_call_tag(text: &str, vocab: &[String], logits: &mut [f32]) {
    let start = text.trim_start();
    let Some(rest) = CALL_HEAD.strip_prefix(start).filter(|rest| !start.is_empty() && !rest.is_empty()) else {
        return;
    };
    for (l, token) in logits.iter_mut().zip(vocab) {
        if !(token.starts_with(rest) || (!token.is_empty() && rest.starts_with(token.as_str()))) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// What is left to write of a call that `text` holds from [`CALL_HEAD`] on and whose arguments
/// have closed: `}` and `\n</tool_call>`, or what of them has not been written; `None` when
/// the text went another way (then it is left alone).
fn call_tail(text: &str) -> Option<String> {
    const END: &str = "\n</tool_call>";
    let body = text.strip_prefix("<tool_call>")?;
    let mut objects = serde_json::Deserializer::from_str(body).into_iter::<serde::de::IgnoredAny>();
    match objects.next() {
        Some(Ok(_)) => END.strip_prefix(&body[objects.byte_offset()..]).map(str::to_owned),
        Some(Err(e)) if e.is_eof() => Some(format!("}}{END}")),
        _ => None,
    }
}

/// Keeps only the tokens that go on writing `rest`.
fn continue_with(rest: &str, vocab: &[String], logits: &mut [f32]) {
    for (l, token) in logits.iter_mut().zip(vocab) {
        if token.is_empty() || !rest.starts_with(token.as_str()) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Leaves `token` the only choice (`None`: leaves the logits as they are).
fn only(logits: &mut [f32], token: Option<u32>) {
    let Some(token) = token.filter(|&t| (t as usize) < logits.len()) else { return };
    for (i, l) in logits.iter_mut().enumerate() {
        if i != token as usize {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// What a reply may not begin with: a stop token while it is still blank (a small model offered
/// no tools after a tool result tends to stop at once, and an empty reply answers nothing), nor
/// `call_tag`, the call tag's token when no tools are offered (the call would name a tool from
/// the history, and nobody would run it; JSON stays allowed, a tool may ask for it).
fn forbid_at_first_token(logits: &mut [f32], stop_tokens: &[u32], call_tag: Option<u32>) {
    for &id in stop_tokens.iter().chain(&call_tag) {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Keeps a reply from starting as a JSON object or a code fence (the tag `<tool_call>` stays).
fn forbid_bare_json(logits: &mut [f32], json_openers: &[bool]) {
    for (l, &opens) in logits.iter_mut().zip(json_openers) {
        if opens {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Samples from `softmax(logits / temperature)`; turns `logits` into the (unnormalised)
/// weights in place, so the vocabulary is exponentiated once and nothing is allocated.
fn sample(logits: &mut [f32], temperature: f32, rng: &mut u64) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for l in logits.iter_mut() {
        *l = ((*l - max) / temperature).exp();
        total += *l;
    }
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let mut target = (*rng >> 40) as f32 / (1u64 << 24) as f32 * total;
    for (i, &w) in logits.iter().enumerate() {
        target -= w;
        if target <= 0.0 {
            return i as u32;
        }
    }
    // Rounding left some target: the heaviest token (weights order as the logits did).
    argmax(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_starts_neither_with_a_stop_nor_with_a_call_tag_when_no_tools_are_offered() {
        // Token 0: the stop token, the likeliest; 1: the call tag; 2: prose.
        let mut logits = vec![9.0, 8.0, 1.0];
        forbid_at_first_token(&mut logits, &[0], Some(1));
        assert_eq!(argmax(&logits), 2);
        // With tools offered, the call tag stays.
        let mut logits = vec![9.0, 8.0, 1.0];
        forbid_at_first_token(&mut logits, &[0], None);
        assert_eq!(argmax(&logits), 1);
        // Ids out of the vocabulary are ignored.
        forbid_at_first_token(&mut logits, &[7], Some(9));
    }

    #[test]
    fn a_cached_reply_reads_as_the_text_it_wrote_however_the_tokenizer_splits_it() {
        // Byte-level BPE as the GGUF models have it: "a" "b" merge, "\n" is "Ċ", "é" is the
        // two bytes "Ã" "©".
        let spec = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": {"a": 0, "b": 1, "c": 2, "Ċ": 3, "d": 4, "ab": 5, "Ã": 6, "©": 7, "!": 8},
                "merges": ["a b"]}
        });
        let tokenizer: tokenizers::Tokenizer = spec.to_string().parse().expect("a valid tokenizer");
        assert_eq!(tokenizer.encode("abc\nd", false).unwrap().get_ids(), [5, 2, 3, 4], "the canonical split");
        // The model wrote "a", "b", "c" apart: all three read as the text's start.
        assert_eq!(text_prefix(&tokenizer, &[0, 1, 2], "abc\nd"), (3, 3));
        assert_eq!(text_prefix(&tokenizer, &[0, 2], "abc"), (1, 1), "the text went another way");
        // A character spelled in two tokens counts once whole.
        assert_eq!(text_prefix(&tokenizer, &[6, 7, 8], "é!c"), (3, 3));
        assert_eq!(text_prefix(&tokenizer, &[6, 7], "ex"), (0, 0));
    }

    #[test]
    fn a_reply_cannot_write_the_tags_of_a_tool_result() {
        let vocab: Vec<String> =
            ["<", "tool", "_response", "_call", "_", "r", "response", ">", "hola", "/", "<tool_response>"]
                .map(str::to_owned)
                .to_vec();
        let banned = |text: &str| -> Vec<&str> {
            let mut logits = vec![0.0f32; vocab.len()];
            forbid_template_tags(text, &vocab, &template_tag_tokens(&vocab), &mut logits);
            vocab.iter().zip(&logits).filter(|(_, l)| l.is_infinite()).map(|(t, _)| t.as_str()).collect()
        };
        let whole = "<tool_response>";
        assert_eq!(banned(""), [whole], "a tag in one token, always");
        assert_eq!(banned("Hola"), [whole]);
        assert_eq!(banned("<tool"), ["_response", whole], "`_call` and `_` stay: `<tool_call>` is the model's own");
        assert_eq!(banned("<tool_"), ["r", "response", whole]);
        assert_eq!(banned("sí </tool_"), ["r", "response", whole]);
        assert_eq!(banned("<tool_call>"), [whole]);
        assert_eq!(banned("a < b"), [whole]);
    }

    #[test]
    fn a_reply_that_opens_a_tag_writes_the_call_tag() {
        let vocab: Vec<String> =
            ["<", "tool", " Response", "_call", "_", "call", ">", "\n", "hola", "_call>\n"].map(str::to_owned).to_vec();
        let allowed = |text: &str| -> Vec<&str> {
            let mut logits = vec![0.0f32; vocab.len()];
            complete_call_tag(text, &vocab, &mut logits);
            vocab.iter().zip(&logits).filter(|(_, l)| l.is_finite()).map(|(t, _)| t.as_str()).collect()
        };
        assert_eq!(allowed("").len(), vocab.len(), "an empty reply may start with anything");
        assert_eq!(allowed("<"), ["tool"]);
        assert_eq!(allowed("\n<tool"), ["_call", "_", "_call>\n"]);
        assert_eq!(allowed("<tool_call"), [">"]);
        assert_eq!(allowed("Hola <").len(), vocab.len(), "only the reply's opening is held to it");
        // After the tag: the object's head as the template writes it, not XML nor other keys
        // (then the call guide takes over, at the name).
        let vocab: Vec<String> = ["\n", "{", "\n{\"", "<", "\n<", " name", "{\"", "name", "function", ": \"", "\":"]
            .map(str::to_owned)
            .to_vec();
        let allowed = |text: &str| -> Vec<&str> {
            let mut logits = vec![0.0f32; vocab.len()];
            complete_call_tag(text, &vocab, &mut logits);
            vocab.iter().zip(&logits).filter(|(_, l)| l.is_finite()).map(|(t, _)| t.as_str()).collect()
        };
        assert_eq!(allowed("<tool_call>"), ["\n", "\n{\""]);
        assert_eq!(allowed("<tool_call>\n"), ["{", "{\""]);
        assert_eq!(allowed("<tool_call>\n{\""), ["name"]);
        assert_eq!(allowed("<tool_call>\n{\"name"), ["\":"]);
        assert_eq!(allowed("<tool_call>\n{\"name\""), [": \""]);
        assert_eq!(allowed("<tool_call>\n{\"name\": \"").len(), vocab.len(), "the name: the guide's turn");
    }

    #[test]
    fn a_call_whose_arguments_closed_ends_as_the_template_ends_it() {
        let head = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}";
        assert_eq!(call_tail(head).as_deref(), Some("}\n</tool_call>"));
        assert_eq!(call_tail(&format!("{head}}}")).as_deref(), Some("\n</tool_call>"));
        assert_eq!(call_tail(&format!("{head}}}\n</tool")).as_deref(), Some("_call>"));
        assert_eq!(call_tail(&format!("{head}}}\n</tool_call>")).as_deref(), Some(""));
        // A fence where the tag's end belongs: no longer a call to finish.
        assert_eq!(call_tail(&format!("{head}}}\n```")), None);
        let vocab: Vec<String> = ["}", "}\n", "```", "\n", "</", "tool_call>"].map(str::to_owned).to_vec();
        let mut logits = vec![0.0f32; vocab.len()];
        continue_with("}\n</tool_call>", &vocab, &mut logits);
        let kept: Vec<&str> =
            vocab.iter().zip(&logits).filter(|(_, l)| l.is_finite()).map(|(t, _)| t.as_str()).collect();
        assert_eq!(kept, ["}", "}\n"]);
    }

    #[test]
    fn call_openers_are_the_forms_the_parser_accepts() {
        for t in ["<tool_call>", "<", "<tool", " {\"", "{\n", "{", "```", "```json"] {
            assert!(opens_call(t), "{t:?}");
        }
        for t in [" {\"name", "{\"name\":"] {
            assert!(opens_call(t), "{t:?}");
        }
        for t in ["The", "¡", "3", " ", "", "<div", "[", "\"", "{{", " {{", "{}", "{%", "{\"topic"] {
            assert!(!opens_call(t), "{t:?}");
        }
    }

    #[test]
    fn a_reply_after_a_tool_result_cannot_open_with_json() {
        let vocab: Vec<String> = ["{\"", " {", "```", "<tool_call>", "El"].map(str::to_owned).to_vec();
        let mut logits = vec![5.0, 4.0, 3.0, 1.0, 2.0];
        let json_openers: Vec<bool> = vocab.iter().map(|t| opens_json(t)).collect();
        forbid_bare_json(&mut logits, &json_openers);
        assert_eq!(argmax(&logits), 4, "prose");
        assert!(logits[3].is_finite(), "a further call in the tag stays possible");
    }

    #[test]
    fn spread_call_mass_beats_a_single_prose_token() {
        // Probabilities 0.35 (prose "3"), then three openers at 0.25, 0.2, 0.2 (together 0.65).
        let probs: [f32; 4] = [0.35, 0.25, 0.2, 0.2];
        let mut logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let openers = [false, true, true, true];
        let json_like = [false, true, false, false];
        assert!(prefer_call(&mut logits, &openers, &json_like, 0.5));
        assert_eq!(argmax(&logits), 1, "the likeliest opener, not the likeliest token");
        // The same call mass under a stricter threshold leaves greedy decoding alone.
        let mut logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        assert!(!prefer_call(&mut logits, &openers, &json_like, 0.7));
        assert_eq!(argmax(&logits), 0);
        // A greeting: hardly any call mass.
        let mut logits: Vec<f32> = [0.9f32, 0.05, 0.03, 0.02].iter().map(|p| p.ln()).collect();
        assert!(!prefer_call(&mut logits, &openers, &json_like, 0.5));
    }

    #[test]
    fn a_reply_never_opens_with_json_the_parser_cannot_read() {
        // Tokens: "{{" (0.5, JSON-like but no opener), "{\"" (0.2), "Hola" (0.3).
        let vocab = ["{{", "{\"", "Hola"];
        let openers: Vec<bool> = vocab.iter().map(|t| opens_call(t)).collect();
        let json_like: Vec<bool> = vocab.iter().map(|t| opens_json(t)).collect();
        let probs = [0.5f32, 0.2, 0.3];
        // The would-be call's mass counts toward a call, which opens the way the parser reads.
        let mut logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        assert!(prefer_call(&mut logits, &openers, &json_like, 0.5));
        assert_eq!(argmax(&logits), 1);
        // Below the threshold, prose wins rather than "{{".
        let mut logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        assert!(!prefer_call(&mut logits, &openers, &json_like, 0.8));
        assert_eq!(argmax(&logits), 2);
    }
}
