//! The node kinds of declared graphs at run time: each planned [`Step`] as a graph node over
//! the [kit](crate::kit)'s state, and each [`Exit`] as the router after it. The model and tools
//! nodes are the ReAct agent's own steps (so approvals keep their exactly-once rules); the
//! others are small.

use super::check::{END_NAME, Exit, Output};
use super::format::{ChannelDecl, History};
use super::template::Template;
use crate::kit::{AgentDeps, AgentState, AgentUpdate, ChannelWrite, Question, Reducer, pending_calls, recorded_call};
use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_graph::{Decision, END, InterruptRequest, Node, NodeError, NodeOutput, RunContext, RunEvent};
use toolgraph_llm::{ChatEvent, ChatRequest, Message, ResponseFormat};
use toolgraph_tools::ToolOutcome;

/// What every node of one declared graph shares: the agent's name, the channels, and where
/// the graph sits in the one that runs it.
pub(crate) struct GraphInfo {
    pub agent: String,
    pub channels: BTreeMap<String, ChannelDecl>,
    /// Empty for an agent's own graph; `<node>/` for the graph of an agent an `agent` node
    /// hands the turn to: the prefix of its node and channel names in the graph that runs it
    /// (so its channels are its own), and `<node>/END` is where its run ends.
    pub prefix: String,
    /// The agent's own system prompt (`{{system_prompt}}`).
    pub system_prompt: String,
}

/// How long an output with `on_failure` waits for the model before writing it instead.
const ON_FAILURE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// How many of the person's latest messages `{{recent_user_messages}}` holds.
const RECENT_USER_MESSAGES: usize = 4;

impl GraphInfo {
    /// The runtime's name of the declared node `target` (or `END`) of this graph.
    pub fn node(&self, target: &str) -> String {
        match (target == END_NAME, self.prefix.is_empty()) {
            (true, true) => END.to_owned(),
            (true, false) => format!("{}{END_NAME}", self.prefix),
            (false, _) => format!("{}{target}", self.prefix),
        }
    }

    /// The state's key of the declared channel `name`.
    fn key<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if self.prefix.is_empty() { name.into() } else { format!("{}{name}", self.prefix).into() }
    }

    /// The value a template's `name` reads in `s`.
    pub fn lookup(&self, s: &AgentState, name: &str) -> Option<Value> {
        match name {
            "last_user_message" => s.last_user_message().map(|t| Value::String(t.to_owned())),
            "recent_user_messages" => Some(Value::String(s.recent_user_messages(RECENT_USER_MESSAGES).join("\n"))),
            "system_prompt" => Some(Value::String(self.system_prompt.clone())),
            "question_in_context" => crate::kit::question_in_context(&s.messages).map(Value::String),
            "context" => Some(Value::Object(s.context.clone())),
            "tool_failures" => Some(Value::from(s.tool_failures)),
            "last_tool_error" => s.last_tool_error().map(Value::String),
            "agent" => Some(Value::String(self.agent.clone())),
            channel => self.channel(s, channel).cloned(),
        }
    }

    /// A channel's value, or its declared default.
    pub fn channel<'a>(&'a self, s: &'a AgentState, name: &str) -> Option<&'a Value> {
        s.channels.get(self.key(name).as_ref()).or_else(|| self.channels.get(name)?.default.as_ref())
    }

    fn render(&self, t: &Template, s: &AgentState) -> String {
        t.render(|name| self.lookup(s, name))
    }

    /// The writes that put `value` into `channel` of `s` with the channel's reducer: a
    /// channel that holds nothing yet starts from its default, so `append` and `merge` add to it.
    fn writes(&self, s: &AgentState, channel: &str, value: Value) -> Vec<ChannelWrite> {
        let decl = self.channels.get(channel);
        let reducer = decl.map(|c| c.reducer).unwrap_or_default();
        let default = decl.and_then(|c| c.default.as_ref());
        ChannelWrite::of(&s.channels, self.key(channel).into_owned(), reducer, default, value)
    }
}

/// A `model` node.
pub(crate) struct ModelNode {
    pub info: Arc<GraphInfo>,
    pub prompt: Option<Template>,
    /// Its own model, tools and settings.
    pub deps: AgentDeps,
    pub history: History,
    /// Its output, with the schema's validator (none for a draft).
    pub output: Option<(Output, Option<jsonschema::Validator>)>,
    /// Whether it must call a tool before it may answer (`tool_choice = "required"`), and
    /// whether its reply is checked against the search results (`cite`).
    pub rules: crate::kit::StepRules,
    /// The one message it sends instead of the conversation.
    pub message: Option<Template>,
    /// Its reply when the model fails or says nothing.
    pub fallback: Option<Template>,
    /// What its reply must mention one of, and what is appended when it mentions none.
    pub must_mention: Option<(Template, Template)>,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for ModelNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let system = self.prompt.as_ref().map(|p| self.info.render(p, &s));
        if let Some((output, validator)) = &self.output {
            return match (&output.schema, validator) {
                (Some(schema), Some(validator)) => self.structured(&s, &ctx, system, output, schema, validator).await,
                _ => self.draft(&s, &ctx, system, output).await,
            };
        }
        if self.fallback.is_some() || self.must_mention.is_some() {
            return self.guarded(&s, &ctx, system).await;
        }
        let only = match (&self.message, self.history) {
            (None, History::Window) => None,
            // The person's last message and what this turn added since (the node's own tool
            // calls and their results), so a tool loop sees its results.
            (None, History::LastMessage) => {
                let start = s.messages.iter().rposition(|m| matches!(m, Message::User { .. })).unwrap_or(0);
                Some(s.messages[start..].to_vec())
            }
            // Words only (a node that calls no tools: checked when the graph loads).
            (Some(_), _) | (None, History::Spoken) => Some(self.words(&s, self.deps.spec())),
        };
        match only {
            None => crate::kit::model_step(&s, &ctx, &self.deps, system.as_deref(), self.rules).await,
            Some(messages) => {
                let only = AgentState { messages, context: s.context.clone(), ..AgentState::default() };
                crate::kit::model_step_on(&only, &ctx, &self.deps, system.as_deref(), self.rules).await
            }
        }
    }
}

impl ModelNode {
    /// What a node that calls no tools sends of the conversation: its `message`, or the
    /// person's last message, or the conversation's words that fit the budget.
    fn words(&self, s: &AgentState, spec: &crate::kit::AgentSpec) -> Vec<Message> {
        match (&self.message, self.history) {
            (Some(m), _) => vec![Message::user(self.info.render(m, s))],
            (None, History::LastMessage) => s.last_user_message().map(Message::user).into_iter().collect(),
            (None, History::Window | History::Spoken) => crate::kit::spoken_window(&s.messages, spec.history_budget),
        }
    }

    /// A reply that never fails the turn when the node has a `fallback`, and that gets the
    /// `must_mention` text appended when it mentions none of what it must: streamed as it comes.
    async fn guarded(
        &self,
        s: &AgentState,
        ctx: &RunContext<AgentDeps>,
        system: Option<String>,
    ) -> Result<NodeOutput<AgentState>, NodeError> {
        let system = system.unwrap_or_else(|| self.deps.spec().system_prompt.clone());
        let mut content = String::new();
        let streamed = self.text_into(ctx, self.request(s, system), true, &mut content).await;
        let addition = if streamed.is_err() || content.trim().is_empty() {
            match (&self.fallback, streamed) {
                (Some(fallback), streamed) => {
                    if let Err(e) = streamed {
                        tracing::warn!(node = %ctx.node(), error = %e, "the model failed; the node's fallback replies");
                    }
                    let text = self.info.render(fallback, s);
                    Some(if content.trim().is_empty() { text } else { format!("\n\n{text}") })
                }
                (None, Err(e)) => return Err(NodeError::new("model", e.to_string())),
                (None, Ok(())) => None,
            }
        } else {
            self.unmentioned(s, &content)
        };
        if let Some(text) = addition.filter(|t| !t.trim().is_empty()) {
            ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
            content.push_str(&text);
        }
        Ok(NodeOutput::Update(AgentUpdate { messages: vec![Message::assistant(content)], ..Default::default() }))
    }

    /// The request of a node that calls no tools: `system`, then what it reads of the
    /// conversation, with its settings.
    fn request(&self, s: &AgentState, system: String) -> ChatRequest {
        let spec = self.deps.spec();
        let mut messages = vec![Message::system(system)];
        messages.extend(self.words(s, spec));
        let mut request = ChatRequest::new(messages);
        request.temperature = spec.temperature;
        request.max_tokens = spec.max_tokens;
        request
    }

    /// The model's answer to `request`, as one timed model call, into `out` (and streamed to
    /// the run when `stream`).
    async fn text_into(
        &self,
        ctx: &RunContext<AgentDeps>,
        request: ChatRequest,
        stream: bool,
        out: &mut String,
    ) -> Result<(), toolgraph_llm::LlmError> {
        let call = async {
            let mut usage = None;
            let mut events = self.deps.model().stream(request).await?;
            while let Some(event) = events.next().await {
                match event? {
                    ChatEvent::TextDelta(t) => {
                        if stream {
                            ctx.emit(RunEvent::TextDelta { text: t.clone() }).await;
                        }
                        out.push_str(&t);
                    }
                    ChatEvent::Usage(u) => usage = Some(u),
                    _ => {}
                }
            }
            Ok(usage)
        };
        ctx.counted_model_call(call, |r| crate::kit::call_report(self.deps.model().as_ref(), r)).await.map(|_| ())
    }

    /// A draft: the model's reply, not streamed, written as text into the output's channel (a
    /// `cite` node checks it before anyone sees it). The model reads what a reply would — the
    /// conversation within the node's `history` — with this turn's search results written out
    /// before the question, as a grounded node without tools reads them.
    async fn draft(
        &self,
        s: &AgentState,
        ctx: &RunContext<AgentDeps>,
        system: Option<String>,
        output: &Output,
    ) -> Result<NodeOutput<AgentState>, NodeError> {
        let spec = self.deps.spec();
        let system = system.unwrap_or_else(|| spec.system_prompt.clone());
        let mut messages = Vec::with_capacity(s.messages.len() + 1);
        if !system.is_empty() {
            messages.push(Message::system(system));
        }
        match (&self.message, self.history) {
            (None, History::Window) => {
                // As a grounded node reads the turns before (docs/retrieval.md, "Grounded answers").
                messages.extend_from_slice(crate::kit::grounded_history_window(&s.messages, spec.history_budget));
                crate::kit::without_earlier_searches(&mut messages);
            }
            (None, History::LastMessage) => {
                let start = s.messages.iter().rposition(|m| matches!(m, Message::User { .. })).unwrap_or(0);
                messages.extend_from_slice(&s.messages[start..]);
            }
            (Some(_), _) | (None, History::Spoken) => messages.extend(self.words(s, spec)),
        }
        crate::kit::write_out_results(&mut messages, &spec.tools);
        let mut request = ChatRequest::new(messages);
        request.temperature = spec.temperature;
        request.max_tokens = spec.max_tokens;
        let mut text = String::new();
        let value = match (self.text_into(ctx, request, false, &mut text).await, &output.on_failure) {
            (Ok(()), _) => Value::String(text.trim().to_owned()),
            (Err(e), Some(instead)) => {
                tracing::warn!(node = %ctx.node(), error = %e, "the model failed; the draft's on_failure is written");
                instead.clone()
            }
            (Err(e), None) => return Err(NodeError::new("model", e.to_string())),
        };
        Ok(NodeOutput::Update(AgentUpdate {
            channels: self.info.writes(s, &output.channel, value),
            ..Default::default()
        }))
    }

    /// The `must_mention` text to append to `reply`, when it mentions none of what it must.
    fn unmentioned(&self, s: &AgentState, reply: &str) -> Option<String> {
        let (any_of, append) = self.must_mention.as_ref()?;
        let wanted: Vec<String> = match any_of.only_value(|name| self.info.lookup(s, name)) {
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            Some(Value::String(one)) => vec![one],
            _ => Vec::new(),
        };
        let mentioned = wanted.iter().any(|w| !w.trim().is_empty() && reply.contains(w.as_str()));
        (!mentioned).then(|| self.info.render(append, s))
    }

    /// A model call whose answer goes into a channel: not streamed, not a message.
    async fn structured(
        &self,
        s: &AgentState,
        ctx: &RunContext<AgentDeps>,
        system: Option<String>,
        output: &Output,
        schema: &Value,
        validator: &jsonschema::Validator,
    ) -> Result<NodeOutput<AgentState>, NodeError> {
        let spec = self.deps.spec();
        let mut system = system.unwrap_or_else(|| spec.system_prompt.clone());
        let format = match &output.labels {
            Some(labels) => {
                system.push_str(&format!("\n\nAnswer with exactly one of: {}. Nothing else.", labels.join(", ")));
                None
            }
            None => {
                system.push_str(&format!(
                    "\n\nAnswer only with JSON that matches this JSON Schema, nothing else: {schema}"
                ));
                Some(ResponseFormat::JsonSchema {
                    name: output.channel.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(64).collect(),
                    schema: schema.clone(),
                    strict: false,
                })
            }
        };
        let mut request = self.request(s, system);
        request.response_format = format;
        let mut text = String::new();
        let call = self.text_into(ctx, request, false, &mut text);
        // A node that must not fail must not hang either: its `on_failure` stands in after a
        // while (the model client's own limits are for replies, which may take minutes).
        let called: Result<(), String> = match &output.on_failure {
            Some(_) => match tokio::time::timeout(ON_FAILURE_AFTER, call).await {
                Ok(called) => called.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {} s", ON_FAILURE_AFTER.as_secs())),
            },
            None => call.await.map_err(|e| e.to_string()),
        };
        let value = match (called, &output.on_failure) {
            (Err(e), None) => return Err(NodeError::new("model", e)),
            (Err(e), Some(_)) => {
                tracing::warn!(node = %ctx.node(), error = %e, "the model failed; the output's on_failure is written");
                None
            }
            (Ok(()), _) => match &output.labels {
                Some(labels) => first_label(&text, labels).map(Value::String),
                None => json_in(&text).filter(|v| validator.is_valid(v)),
            },
        };
        let value = value.or_else(|| output.on_failure.clone());
        let reducer = self.info.channels.get(&output.channel).map(|c| c.reducer).unwrap_or_default();
        let channels = match value {
            Some(v) => self.info.writes(s, &output.channel, v),
            None => {
                tracing::warn!(channel = %output.channel, answer = %text, "the model's answer does not match the schema");
                // A stale label must not decide this turn's route; a list or an object
                // gathered over turns is kept.
                if reducer == Reducer::Replace {
                    vec![ChannelWrite {
                        channel: self.info.key(&output.channel).into_owned(),
                        reducer,
                        value: Value::Null,
                    }]
                } else {
                    Vec::new()
                }
            }
        };
        Ok(NodeOutput::Update(AgentUpdate { channels, ..Default::default() }))
    }
}

/// The label `text` is (case, quotes and punctuation aside), else the one it names first as a
/// whole word ("other" is not in "another"; a longer label wins where two start together).
fn first_label(text: &str, labels: &[String]) -> Option<String> {
    let lower = text.to_lowercase();
    let bare = lower.trim().trim_matches(|c: char| !c.is_alphanumeric());
    if let Some(exact) = labels.iter().find(|l| l.to_lowercase() == bare) {
        return Some(exact.clone());
    }
    let word_at = |label: &str| {
        lower.match_indices(label).map(|(at, _)| at).find(|&at| {
            let before = lower[..at].chars().next_back().is_none_or(|c| !c.is_alphanumeric());
            let after = lower[at + label.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric());
            before && after
        })
    };
    labels
        .iter()
        .filter_map(|l| word_at(&l.to_lowercase()).map(|at| (at, std::cmp::Reverse(l.len()), l)))
        .min()
        .map(|(_, _, l)| l.clone())
}

/// The JSON value in `text`: all of it, or the outermost object or list inside it (models
/// wrap JSON in prose and code fences).
fn json_in(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    [('{', '}'), ('[', ']')].iter().find_map(|(open, close)| {
        let (a, b) = (t.find(*open)?, t.rfind(*close)?);
        (a < b).then(|| serde_json::from_str(&t[a..=b]).ok()).flatten()
    })
}

/// A `tools` node: the ReAct agent's, pausing writes to resume at `approved`.
pub(crate) struct ToolsNode {
    pub approved: String,
    /// The tools the model nodes that route here were offered (`None`: the agent's).
    pub allowed: Option<Vec<String>>,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for ToolsNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        crate::kit::tools_step(&s, &ctx, &self.approved, self.allowed.as_deref()).await
    }
}

/// A `tool` node.
pub(crate) struct ToolNode {
    pub info: Arc<GraphInfo>,
    pub tool: String,
    pub arguments: Map<String, Value>,
    pub never_fail: bool,
    pub channel: Option<String>,
}

fn render_value(info: &GraphInfo, s: &AgentState, v: &Value) -> Value {
    match v {
        // Checked when the graph loaded. A string that is one placeholder alone passes its
        // value as it is (a list stays a list, a number a number).
        Value::String(t) => match Template::parse(t) {
            Ok(t) => t.only_value(|name| info.lookup(s, name)).unwrap_or_else(|| Value::String(info.render(&t, s))),
            Err(_) => Value::String(t.clone()),
        },
        Value::Array(items) => Value::Array(items.iter().map(|v| render_value(info, s, v)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), render_value(info, s, v))).collect()),
        other => other.clone(),
    }
}

#[async_trait]
impl Node<AgentState, AgentDeps> for ToolNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let arguments =
            Value::Object(self.arguments.iter().map(|(k, v)| (k.clone(), render_value(&self.info, &s, v))).collect());
        let (outcome, messages) = recorded_call(&s, &ctx, &self.tool, arguments).await;
        let value = match outcome {
            ToolOutcome::Success(v) => v,
            failure if self.never_fail => failure.to_json(),
            failure => {
                return Err(NodeError::new("tool", format!("{} failed: {}", self.tool, failure.to_model_text())));
            }
        };
        let channels = self.channel.iter().flat_map(|c| self.info.writes(&s, c, value.clone())).collect();
        Ok(NodeOutput::Update(AgentUpdate { messages, channels, ..Default::default() }))
    }
}

/// A `retrieve` node: a search, recorded as a call, its result in a channel (a failed search
/// writes null: the reply can say nothing was found).
pub(crate) struct RetrieveNode {
    pub info: Arc<GraphInfo>,
    pub tool: String,
    pub query: Template,
    pub top_k: u32,
    pub channel: String,
    pub skip_small_talk: bool,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for RetrieveNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        if self.skip_small_talk && s.last_user_message().is_some_and(toolgraph_rag::search::grounding::is_small_talk) {
            // Nothing searched this turn: the channel says so, rather than hold the last
            // turn's passages for a `cite` node to cite (a list gathered over turns is kept).
            let reducer = self.info.channels.get(&self.channel).map(|c| c.reducer).unwrap_or_default();
            let channels = match reducer {
                Reducer::Replace => self.info.writes(&s, &self.channel, Value::Null),
                _ => Vec::new(),
            };
            return Ok(NodeOutput::Update(AgentUpdate { channels, ..Default::default() }));
        }
        let query = self.info.render(&self.query, &s);
        let arguments = serde_json::json!({ "query": query, "top_k": self.top_k });
        let (outcome, messages) = recorded_call(&s, &ctx, &self.tool, arguments).await;
        let value = match outcome {
            ToolOutcome::Success(v) => v,
            ToolOutcome::Failure(_) => Value::Null,
        };
        let channels = self.info.writes(&s, &self.channel, value);
        Ok(NodeOutput::Update(AgentUpdate { messages, channels, ..Default::default() }))
    }
}

/// A `cite` node: checks its text against the passages found — each sentence cited to the
/// passage that holds it, a sentence stating what none holds dropped, a text that stands on
/// nothing after a search replaced by "cannot find it in the documents" in the person's
/// language — and replies with what stands, as one piece (docs/agents.md, "cite").
pub(crate) struct CiteNode {
    pub info: Arc<GraphInfo>,
    pub text: Template,
    /// The channel of passages; `None`: the conversation's search results.
    pub passages: Option<String>,
    /// Where its report goes.
    pub channel: Option<String>,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for CiteNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let text = self.info.render(&self.text, &s);
        let given = self.passages.as_ref().map(|ch| passages_of(self.info.lookup(&s, ch)));
        let mut checker =
            crate::kit::checker_over(&s.messages, &self.info.system_prompt, &ctx.deps().spec().tools, given);
        checker.reply.push(&text);
        if checker.required {
            crate::kit::judge_in_documents_language(&ctx, ctx.deps().model().as_ref(), &mut checker).await;
        }
        let (_, checked, report) = checker.reply.finish(checker.abstention, checker.required);
        if report.abstained || !report.dropped.is_empty() {
            tracing::info!(
                node = %ctx.node(),
                abstained = report.abstained,
                dropped = ?report.dropped,
                "the text was checked against the passages"
            );
        }
        ctx.emit(RunEvent::TextDelta { text: checked.clone() }).await;
        let value = crate::kit::report_json(&report);
        ctx.write_custom(serde_json::json!({ "grounding": value.clone() })).await;
        let channels = match &self.channel {
            Some(ch) => self.info.writes(&s, ch, value),
            None => Vec::new(),
        };
        Ok(NodeOutput::Update(AgentUpdate {
            messages: vec![Message::assistant(checked)],
            channels,
            ..Default::default()
        }))
    }
}

/// The passages a channel holds: a search result (`{results: [...]}`), a list of them, or a
/// list of its result items.
fn passages_of(value: Option<Value>) -> Vec<toolgraph_rag::search::grounding::Passage> {
    use toolgraph_rag::search::grounding::passages_in;
    match value {
        Some(Value::Array(items)) => {
            let direct = passages_in(&serde_json::json!({ "results": items }));
            if direct.is_empty() { items.iter().flat_map(passages_in).collect() } else { direct }
        }
        Some(v) => passages_in(&v),
        None => Vec::new(),
    }
}

/// A `reply` node.
pub(crate) struct ReplyNode {
    pub info: Arc<GraphInfo>,
    pub text: Template,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for ReplyNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let text = self.info.render(&self.text, &s);
        ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
        Ok(NodeOutput::Update(AgentUpdate { messages: vec![Message::assistant(text)], ..Default::default() }))
    }
}

/// An `ask` node: says its question (streamed, and kept in the conversation) and pauses for
/// the person's answer; the pause resumes at its `answered` node.
pub(crate) struct AskNode {
    pub info: Arc<GraphInfo>,
    pub question: Template,
    pub form: Option<Value>,
    pub answered: String,
}

/// The key of an `ask` node's one interrupt: its `answered` node reads the decision by it.
const ANSWER_KEY: &str = "answer";

#[async_trait]
impl Node<AgentState, AgentDeps> for AskNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let question = self.info.render(&self.question, &s);
        ctx.emit(RunEvent::TextDelta { text: question.clone() }).await;
        let payload = Question { question: question.clone(), form: self.form.clone() };
        let request = InterruptRequest {
            key: ANSWER_KEY.to_owned(),
            payload: serde_json::to_value(&payload).unwrap_or(Value::Null),
        };
        let update = AgentUpdate { messages: vec![Message::assistant(question)], ..Default::default() };
        Ok(NodeOutput::Interrupt { update, requests: vec![request], resume_at: self.answered.clone() })
    }
}

/// Where an `ask` node's pause resumes: the answer joins the conversation as the person's
/// message and is written into the channel; a question declined (or approved instead of
/// answered) writes null, so a route can tell.
pub(crate) struct AnsweredNode {
    pub info: Arc<GraphInfo>,
    pub channel: String,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for AnsweredNode {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let (messages, value) = match ctx.decisions().get(ANSWER_KEY) {
            Some(Decision::Answer(value)) => {
                let text = match value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                (vec![Message::user(text)], value.clone())
            }
            _ => (Vec::new(), Value::Null),
        };
        let channels = self.info.writes(&s, &self.channel, value);
        Ok(NodeOutput::Update(AgentUpdate { messages, channels, ..Default::default() }))
    }
}

/// Where the run of an agent an `agent` node handed the turn to ends: its reply (the
/// conversation's last message, when the agent replied) is also written to the handing node's
/// `channel`, and the run goes on by that node's exit.
pub(crate) struct HandedBack {
    /// The graph of the `agent` node.
    pub info: Arc<GraphInfo>,
    pub channel: Option<String>,
}

#[async_trait]
impl Node<AgentState, AgentDeps> for HandedBack {
    async fn run(&self, s: Arc<AgentState>, _: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        let channels = match (&self.channel, s.last_reply()) {
            (Some(channel), Some(reply)) => self.info.writes(&s, channel, Value::String(reply.to_owned())),
            _ => Vec::new(),
        };
        Ok(NodeOutput::Update(AgentUpdate { channels, ..Default::default() }))
    }
}

/// A node of another agent, run inside this graph with that agent's dependencies (its tools,
/// tool context and settings): the nodes of an agent an `agent` node hands the turn to.
pub(crate) struct WithDeps<N> {
    pub deps: Arc<AgentDeps>,
    pub node: N,
}

#[async_trait]
impl<N: Node<AgentState, AgentDeps>> Node<AgentState, AgentDeps> for WithDeps<N> {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        self.node.run(s, ctx.with_deps(Arc::clone(&self.deps))).await
    }
}

/// A `route` node: nothing to do; its exit routes.
pub(crate) struct RouteNode;

#[async_trait]
impl Node<AgentState, AgentDeps> for RouteNode {
    async fn run(&self, _: Arc<AgentState>, _: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        Ok(NodeOutput::Update(AgentUpdate::default()))
    }
}

/// Where a conditional exit goes from a state.
pub(crate) type Router = Box<dyn Fn(&AgentState) -> String + Send + Sync>;

/// The router of a conditional exit, or `None` for a plain edge (`Exit::Next`).
pub(crate) fn router(info: &Arc<GraphInfo>, exit: &Exit, max_failures: u32) -> Option<Router> {
    match exit {
        Exit::Next(_) => None,
        Exit::Route(r) => {
            let r = r.clone();
            let info = Arc::clone(info);
            Some(Box::new(move |s: &AgentState| {
                let to = if let Some(to) = r.replied.as_ref().filter(|_| s.last_reply().is_some()) {
                    to
                } else if let Some(to) = r.tool_calls.as_ref().filter(|_| !pending_calls(s).is_empty()) {
                    to
                } else if let Some(to) = r.mentioned.as_ref().filter(|_| {
                    let said = s.last_user_message().unwrap_or_default().to_lowercase();
                    r.mentions.iter().any(|w| said.contains(w.as_str()))
                }) {
                    to
                } else {
                    let value = r.on.as_deref().and_then(|on| {
                        let mut path = on.split('.');
                        let root = info.channel(s, path.next()?)?;
                        path.try_fold(root, |v, f| super::template::field(v, f))
                    });
                    let key = match value {
                        Some(Value::String(v)) => Some(v.clone()),
                        Some(Value::Null) | None => None,
                        Some(other) => Some(other.to_string()),
                    };
                    key.and_then(|k| r.cases.get(&k)).unwrap_or(&r.otherwise)
                };
                info.node(to)
            }))
        }
        Exit::Tools { next, give_up } => {
            let (next, give_up, end) = (info.node(next), info.node(give_up), info.node(END_NAME));
            Some(Box::new(move |s: &AgentState| {
                if s.last_reply().is_some() {
                    end.clone()
                } else if s.tool_failures > max_failures {
                    give_up.clone()
                } else {
                    next.clone()
                }
            }))
        }
        Exit::Approved { execute, next } => {
            let (execute, next, end) = (info.node(execute), info.node(next), info.node(END_NAME));
            Some(Box::new(move |s: &AgentState| {
                if !s.approved.is_empty() {
                    execute.clone()
                } else if s.last_reply().is_some() {
                    end.clone()
                } else {
                    next.clone()
                }
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_classifier_takes_the_first_label_named_and_json_is_found_in_prose() {
        let labels = ["billing".to_owned(), "technical".to_owned(), "other".to_owned()];
        assert_eq!(first_label("Category: Technical (not billing)", &labels).as_deref(), Some("technical"));
        assert_eq!(first_label("  \"Billing.\" ", &labels).as_deref(), Some("billing"));
        assert_eq!(first_label("another thing", &labels), None, "a label inside a word is not named");
        assert_eq!(first_label("no idea", &labels), None);
        assert_eq!(json_in("Sure! ```json\n{\"order\": 42}\n```"), Some(json!({"order": 42})));
        assert_eq!(json_in("[1, 2]"), Some(json!([1, 2])));
        assert_eq!(json_in("nothing here"), None);
    }
}
