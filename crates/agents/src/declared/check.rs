//! The checks a declared graph passes before it serves (docs/agents.md): every name it uses
//! exists (channels, tools, nodes), each node sets only the fields its kind uses, templates name
//! what the state holds, schemas compile, every node is reachable and has a way to the end.
//! Each error names the file, the line and the field. What passes becomes a [`Plan`], which
//! [`build`](super::build) turns into a graph.

use super::format::{ChannelDecl, GraphFile, History, Input, NodeDecl, NodeKind, Reducer, RouteDecl, ToolChoiceDecl};
use super::template::{BUILTINS, Template};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

/// The name a route or `next` uses for the end of the run.
pub const END_NAME: &str = "END";

/// One thing wrong with a declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclError {
    /// The file.
    pub file: String,
    /// Its line (1-based).
    pub line: usize,
    /// The field, as a dotted path (`nodes.agent.tools`); empty for the file as a whole.
    pub field: String,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl fmt::Display for DeclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        } else {
            write!(f, "{}:{}: {}: {}", self.file, self.line, self.field, self.message)
        }
    }
}

/// Everything wrong with a declaration, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DeclErrors(pub Vec<DeclError>);

impl fmt::Display for DeclErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// A checked declaration, ready to build.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where it was read from.
    pub file: String,
    /// Its description.
    pub description: Option<String>,
    /// The first node.
    pub start: String,
    /// Its channels.
    pub channels: BTreeMap<String, ChannelDecl>,
    /// Its nodes, the hidden ones a `tools` node brings included, in name order.
    pub nodes: Vec<PlannedNode>,
    /// The declaration's version: [`version_of`] its text. Every checkpoint of its graph
    /// records it.
    pub version: String,
}

impl Plan {
    /// The schemas the graph's own nodes hold a channel's value to, by channel: a model node's
    /// `output` schema, an `ask` node's form for the channel its answer goes to. A channel that
    /// any node writes without a schema (a draft, a tool's result, a search, a free-text answer,
    /// another agent's reply, a node kind of the program's) holds whatever they write: none.
    pub fn channel_schemas(&self) -> BTreeMap<String, Vec<Value>> {
        let mut schemas: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut free: BTreeSet<&str> = BTreeSet::new();
        let answered_by = |ask: &str| match self.nodes.iter().find(|n| n.name == ask).map(|n| &n.step) {
            Some(Step::Answered { channel }) => Some(channel.as_str()),
            _ => None,
        };
        for node in &self.nodes {
            match &node.step {
                Step::Model { output: Some(Output { channel, schema: Some(schema), .. }), .. } => {
                    schemas.entry(channel.clone()).or_default().push(schema.clone());
                }
                Step::Model { output: Some(Output { channel, schema: None, .. }), .. } => {
                    free.insert(channel);
                }
                Step::Ask { form, answered, .. } => match (form, answered_by(answered)) {
                    (Some(form), Some(channel)) => schemas.entry(channel.to_owned()).or_default().push(form.clone()),
                    (None, Some(channel)) => {
                        free.insert(channel);
                    }
                    _ => {}
                },
                Step::Retrieve { channel, .. } => {
                    free.insert(channel);
                }
                Step::Tool { channel: Some(channel), .. }
                | Step::Cite { channel: Some(channel), .. }
                | Step::Agent { channel: Some(channel), .. }
                | Step::Custom { channel: Some(channel), .. } => {
                    free.insert(channel);
                }
                _ => {}
            }
        }
        schemas.retain(|channel, _| !free.contains(channel.as_str()));
        schemas
    }
}

/// The version of a declaration whose text is `text`: the first 12 hex digits of its SHA-256,
/// so the same file gives the same version on every replica and after every restart.
pub fn version_of(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// A node of a [`Plan`].
#[derive(Debug, Clone)]
pub struct PlannedNode {
    /// Its name in the graph.
    pub name: String,
    /// What it does.
    pub step: Step,
    /// Where the run goes after it.
    pub exit: Exit,
}

/// What a planned node does.
#[derive(Debug, Clone)]
// A plan is built once when its file loads (tens of nodes): boxing the model node's fields
// would only add indirection.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// A model call.
    Model {
        /// The system prompt (`None`: the agent's).
        prompt: Option<Template>,
        /// The tools it may call (`None`: the agent's).
        tools: Option<Vec<String>>,
        /// A model name over the agent's.
        model: Option<String>,
        /// Temperature over the agent's.
        temperature: Option<f32>,
        /// Token limit over the agent's.
        max_tokens: Option<u32>,
        /// What it reads of the conversation.
        history: History,
        /// Its structured output.
        output: Option<Output>,
        /// Whether it must call a tool first.
        require_call: bool,
        /// Whether its reply is checked against the search results.
        cite: bool,
        /// Whether a reply before any tool result is stopped.
        reply_needs_tools: bool,
        /// The one message it sends instead of the conversation.
        message: Option<Template>,
        /// Its reply when the model fails or says nothing.
        fallback: Option<Template>,
        /// What its reply must mention (one placeholder), and what is appended when it does not.
        must_mention: Option<(Template, Template)>,
    },
    /// The tool calls of the last model message; pauses resume at `approved`.
    Tools {
        /// The tools the model nodes routing here are offered (`None`: the agent's); a call of
        /// another is refused.
        allowed: Option<Vec<String>>,
        /// The node that records the decisions (hidden).
        approved: String,
        /// The node that runs the approved calls (hidden).
        execute: String,
        /// Rounds of failing reads allowed (`None`: the agent's).
        max_failures: Option<u32>,
    },
    /// Records decisions on the pause of a `tools` node.
    Approved,
    /// Runs the approved calls of a `tools` node.
    Execute,
    /// The reply that ends a turn whose read tools kept failing.
    GiveUp,
    /// One tool, called by the node.
    Tool {
        /// The tool.
        tool: String,
        /// Its arguments; strings are templates.
        arguments: Map<String, Value>,
        /// Whether a failure is written and the graph goes on.
        never_fail: bool,
        /// Where the result goes.
        channel: Option<String>,
    },
    /// A search into a channel.
    Retrieve {
        /// The search tool.
        tool: String,
        /// The query.
        query: Template,
        /// How many passages.
        top_k: u32,
        /// Where they go.
        channel: String,
        /// Whether a greeting or thanks skips the search.
        skip_small_talk: bool,
    },
    /// A text checked against the passages found, replied with what stands.
    Cite {
        /// The text it checks.
        text: Template,
        /// The channel of passages (`None`: the conversation's search results).
        passages: Option<String>,
        /// Where its report goes.
        channel: Option<String>,
    },
    /// A fixed reply.
    Reply {
        /// Its text.
        text: Template,
    },
    /// Routes only.
    Route,
    /// Asks the person; the answer is recorded by `answered` (hidden), where the pause resumes.
    Ask {
        /// The question.
        question: Template,
        /// The schema of the answer (`None`: free text).
        form: Option<Value>,
        /// The node that records the answer.
        answered: String,
    },
    /// Records the answer to an `ask` node's question.
    Answered {
        /// Where the answer goes.
        channel: String,
    },
    /// Hands the turn to another declared agent: its nodes run as a sub-graph (named
    /// `<node>/<its node>`, its channels its own), and the run comes back by this node's exit.
    Agent {
        /// The agent (`[agents.NAME]`).
        agent: String,
        /// What it reads of the conversation.
        input: Input,
        /// Where its reply is also written.
        channel: Option<String>,
    },
    /// A node of a kind the program registered.
    Custom {
        /// The kind.
        kind: CustomStep,
        /// Its `with` table.
        with: Map<String, Value>,
        /// Its channel.
        channel: Option<String>,
    },
}

/// A registered kind, as a planned node holds it.
#[derive(Clone)]
pub struct CustomStep {
    /// Its name.
    pub name: String,
    /// The kind.
    pub kind: Arc<dyn super::CustomKind>,
}

impl std::fmt::Debug for CustomStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The hidden node an `ask` node named `name` brings: where its pause resumes with the answer.
pub fn answered_name(name: &str) -> String {
    format!("{name}_answered")
}

/// A model node's structured output.
#[derive(Debug, Clone)]
pub struct Output {
    /// The channel written.
    pub channel: String,
    /// The schema the answer must match (`None`: the reply's text, a draft).
    pub schema: Option<Value>,
    /// For a schema that is an enum of strings: the labels (a classifier).
    pub labels: Option<Vec<String>>,
    /// What is written when the call fails or the answer does not match.
    pub on_failure: Option<Value>,
}

/// Where the run goes after a node (node names, or the runtime's end).
#[derive(Debug, Clone)]
pub enum Exit {
    /// Always there.
    Next(String),
    /// Decided on the state.
    Route(Route),
    /// A `tools` node's: the reply it ended with → the end; too many failures → `give_up`;
    /// else `next`.
    Tools {
        /// Where to go otherwise.
        next: String,
        /// Where to go once reads kept failing.
        give_up: String,
    },
    /// An `approved` node's: approved calls → `execute`; all rejected → the end; else `next`.
    Approved {
        /// The execute node.
        execute: String,
        /// Where to go otherwise.
        next: String,
    },
}

/// A checked route.
#[derive(Debug, Clone)]
pub struct Route {
    /// See [`RouteDecl::replied`].
    pub replied: Option<String>,
    /// See [`RouteDecl::tool_calls`].
    pub tool_calls: Option<String>,
    /// See [`RouteDecl::mentioned`].
    pub mentioned: Option<String>,
    /// See [`RouteDecl::mentions`], lowercased.
    pub mentions: Vec<String>,
    /// See [`RouteDecl::on`].
    pub on: Option<String>,
    /// See [`RouteDecl::cases`].
    pub cases: BTreeMap<String, String>,
    /// See [`RouteDecl::otherwise`].
    pub otherwise: String,
}

impl Exit {
    /// Every node it may lead to.
    pub fn targets(&self) -> Vec<&str> {
        match self {
            Self::Next(n) => vec![n],
            Self::Route(r) => {
                let mut t: Vec<&str> =
                    r.replied.iter().chain(&r.tool_calls).chain(&r.mentioned).map(String::as_str).collect();
                t.extend(r.cases.values().map(String::as_str));
                t.push(&r.otherwise);
                t.sort_unstable();
                t.dedup();
                t
            }
            Self::Tools { next, give_up } => vec![next, give_up, END_NAME],
            Self::Approved { execute, next } => vec![execute, next, END_NAME],
        }
    }
}

/// The hidden nodes a `tools` node named `name` brings: its approval, its execution and its
/// give-up reply. A node named `tools` brings `approved`, `execute` and `give_up`, the names
/// of the ReAct agent's; another brings `<name>_approved` and so on.
pub fn hidden_names(name: &str) -> [String; 3] {
    if name == "tools" {
        ["approved".into(), "execute".into(), "give_up".into()]
    } else {
        [format!("{name}_approved"), format!("{name}_execute"), format!("{name}_give_up")]
    }
}

/// Where lines are: finds the line of a dotted field path in the file's text, whether it is
/// written as `key = …` under a `[table]` header or as a `[table.key]` header of its own.
struct Lines<'a> {
    /// (line number, the table header in force, the line's text trimmed).
    lines: Vec<(usize, String, &'a str)>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        let mut header = String::new();
        let mut lines = Vec::new();
        // Inside a multi-line string (a prompt), a line is text, not a key or a header.
        let mut open: Option<&str> = None;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            let was_open = open.is_some();
            for quote in ["\"\"\"", "'''"] {
                if open.is_none_or(|q| q == quote) && t.matches(quote).count() % 2 == 1 {
                    open = if open.is_some() { None } else { Some(quote) };
                }
            }
            if was_open {
                continue;
            }
            if t.starts_with('[') {
                let inside = t.trim_start_matches('[').split(']').next().unwrap_or("");
                header = inside.replace([' ', '"', '\''], "");
            }
            lines.push((i + 1, header.clone(), t));
        }
        Self { lines }
    }

    fn of(&self, path: &[&str]) -> usize {
        for split in (0..path.len()).rev() {
            let header = path[..split].join(".");
            let key = path[split];
            let found = self.lines.iter().find(|(_, h, t)| {
                *h == header
                    && !t.starts_with('[')
                    && t.trim_start_matches(['"', '\''])
                        .strip_prefix(key)
                        .is_some_and(|r| r.trim_start_matches(['"', '\'']).starts_with([' ', '=', '.', '\t']))
            });
            if let Some((n, ..)) = found {
                return *n;
            }
        }
        for depth in (1..=path.len()).rev() {
            let header = path[..depth].join(".");
            if let Some((n, ..)) = self.lines.iter().find(|(_, h, t)| *h == header && t.starts_with('[')) {
                return *n;
            }
        }
        1
    }
}

/// What a declaration is checked against: the tools the agent has, and the node kinds the
/// program registered.
#[derive(Default)]
pub struct Known<'a> {
    /// The agent's tool names.
    pub tools: &'a [String],
    /// Those of them that are write tools (they run only after a person's approval, so only
    /// a `tools` node may run them).
    pub writes: &'a [String],
    /// The program's own node kinds, if it has any.
    pub kinds: Option<&'a super::NodeKinds>,
    /// The agents of the configuration an `agent` node may hand a turn to.
    pub agents: &'a [String],
}

struct Checker<'a> {
    file: &'a str,
    lines: Lines<'a>,
    errors: Vec<DeclError>,
}

impl Checker<'_> {
    fn error(&mut self, path: &[&str], message: impl Into<String>) {
        let line = self.lines.of(path);
        self.errors.push(DeclError {
            file: self.file.to_owned(),
            line,
            field: path.join("."),
            message: message.into(),
        });
    }
}

fn valid_name(name: &str) -> bool {
    // `__start__` and `__end__` are the runtime's own.
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with("__")
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Parses and checks the declaration in `text`, read from `file`, against `known`.
///
/// # Errors
/// Every problem found, each with its file, line and field.
pub fn check(file: &str, text: &str, known: &Known<'_>) -> Result<Plan, DeclErrors> {
    let parsed: GraphFile = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map_or(1, |s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1);
        DeclErrors(vec![DeclError {
            file: file.to_owned(),
            line,
            field: String::new(),
            message: e.message().trim().to_owned(),
        }])
    })?;
    let mut c = Checker { file, lines: Lines::new(text), errors: Vec::new() };
    let mut plan = plan(&mut c, parsed, known);
    if c.errors.is_empty() {
        plan.version = version_of(text);
        Ok(plan)
    } else {
        c.errors.sort_by_key(|e| e.line);
        Err(DeclErrors(c.errors))
    }
}

fn plan(c: &mut Checker<'_>, g: GraphFile, known: &Known<'_>) -> Plan {
    for (name, channel) in &g.channels {
        if !valid_name(name) {
            c.error(&["channels", name], "channel names use letters, digits, '_' and '-'");
        } else if BUILTINS.contains(&name.as_str()) || name == "messages" || name == crate::kit::SUMMARY_CHANNEL {
            c.error(&["channels", name], format!("`{name}` is a name every graph has already; pick another"));
        }
        if channel.reducer == Reducer::Append && channel.default.as_ref().is_some_and(|d| !d.is_array()) {
            c.error(&["channels", name, "default"], "an `append` channel's default is a list");
        }
    }
    let mut names: BTreeSet<String> = BTreeSet::new();
    for name in g.nodes.keys() {
        if !valid_name(name) || name == END_NAME {
            c.error(&["nodes", name], "node names use letters, digits, '_' and '-' (and `END` is the end)");
        }
        names.insert(name.clone());
    }
    let mut hidden = Vec::new();
    for (name, node) in &g.nodes {
        if node.kind == NodeKind::Ask {
            let h = answered_name(name);
            if names.contains(&h) {
                c.error(&["nodes", &h], format!("the `ask` node `{name}` brings a node named `{h}`; rename this one"));
            }
            hidden.push(h);
        }
        if node.kind == NodeKind::Tools {
            // Its give-up reply comes only when it names no `give_up` node of its own.
            let [approved, execute, give_up] = hidden_names(name);
            let brought =
                if node.give_up.is_some() { vec![approved, execute] } else { vec![approved, execute, give_up] };
            for h in brought {
                if names.contains(&h) {
                    c.error(
                        &["nodes", &h],
                        format!("the `tools` node `{name}` brings a node named `{h}`; rename this one"),
                    );
                }
                hidden.push(h);
            }
        }
    }
    if g.nodes.is_empty() {
        c.error(&["nodes"], "a graph needs at least one node");
    }
    let channel_names: Vec<&str> = g.channels.keys().map(String::as_str).collect();
    let kinds: BTreeMap<&str, &NodeKind> = g.nodes.iter().map(|(n, d)| (n.as_str(), &d.kind)).collect();
    let mut planned = Vec::new();
    for (name, node) in &g.nodes {
        planned.extend(plan_node(c, name, node, &channel_names, &names, &kinds, known));
    }
    check_cases_against_labels(c, &g);
    if !names.contains(&g.start) {
        c.error(&["start"], format!("no node named `{}`; nodes: {}", g.start, list(&names)));
    }
    // What each `tools` node may run: what the model nodes that route to it were offered.
    for node in &mut planned {
        if let Step::Tools { allowed, .. } = &mut node.step {
            let callers: Vec<&NodeDecl> = g
                .nodes
                .values()
                .filter(|d| {
                    d.kind == NodeKind::Model
                        && d.route.as_ref().and_then(|r| r.tool_calls.as_deref()) == Some(node.name.as_str())
                })
                .collect();
            if callers.is_empty() {
                continue;
            }
            *allowed = callers.iter().map(|d| d.tools.clone()).collect::<Option<Vec<Vec<String>>>>().map(|sets| {
                let mut union: Vec<String> = sets.into_iter().flatten().collect();
                union.sort_unstable();
                union.dedup();
                union
            });
        }
    }
    planned.sort_by(|a, b| a.name.cmp(&b.name));
    let plan = Plan {
        file: c.file.to_owned(),
        description: g.description,
        start: g.start,
        channels: g.channels,
        nodes: planned,
        version: String::new(),
    };
    if c.errors.is_empty() {
        check_paths(c, &plan);
    }
    plan
}

fn list(names: &BTreeSet<String>) -> String {
    names.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// Which fields each kind uses.
fn used_fields(kind: &NodeKind) -> &'static [&'static str] {
    match kind {
        NodeKind::Model => &[
            "next",
            "route",
            "prompt",
            "tools",
            "tool_choice",
            "model",
            "temperature",
            "max_tokens",
            "history",
            "output",
            "cite",
            "reply_needs_tools",
            "message",
            "fallback",
            "must_mention",
        ],
        NodeKind::Tools => &["next", "give_up", "max_failures"],
        NodeKind::Tool => &["next", "route", "tool", "arguments", "never_fail", "channel"],
        NodeKind::Retrieve => &["next", "route", "tool", "channel", "query", "top_k", "skip_small_talk"],
        NodeKind::Reply => &["next", "route", "text"],
        NodeKind::Cite => &["next", "route", "text", "passages", "channel"],
        NodeKind::Route => &["route"],
        NodeKind::Ask => &["next", "route", "question", "form", "channel"],
        NodeKind::Agent => &["next", "route", "agent", "input", "channel"],
        NodeKind::Custom(_) => &["next", "route", "with", "channel"],
    }
}

fn set_fields(n: &NodeDecl) -> Vec<&'static str> {
    let fields = [
        ("next", n.next.is_some()),
        ("route", n.route.is_some()),
        ("prompt", n.prompt.is_some()),
        ("tools", n.tools.is_some()),
        ("tool_choice", n.tool_choice.is_some()),
        ("model", n.model.is_some()),
        ("temperature", n.temperature.is_some()),
        ("max_tokens", n.max_tokens.is_some()),
        ("history", n.history.is_some()),
        ("output", n.output.is_some()),
        ("cite", n.cite.is_some()),
        ("reply_needs_tools", n.reply_needs_tools.is_some()),
        ("message", n.message.is_some()),
        ("fallback", n.fallback.is_some()),
        ("must_mention", n.must_mention.is_some()),
        ("give_up", n.give_up.is_some()),
        ("max_failures", n.max_failures.is_some()),
        ("tool", n.tool.is_some()),
        ("arguments", n.arguments.is_some()),
        ("never_fail", n.never_fail.is_some()),
        ("channel", n.channel.is_some()),
        ("query", n.query.is_some()),
        ("top_k", n.top_k.is_some()),
        ("skip_small_talk", n.skip_small_talk.is_some()),
        ("text", n.text.is_some()),
        ("passages", n.passages.is_some()),
        ("question", n.question.is_some()),
        ("form", n.form.is_some()),
        ("with", n.with.is_some()),
        ("agent", n.agent.is_some()),
        ("input", n.input.is_some()),
    ];
    fields.into_iter().filter(|(_, set)| *set).map(|(f, _)| f).collect()
}

/// A node name a route or `next` may use: a node, or `END`.
fn target(c: &mut Checker<'_>, path: &[&str], to: &str, names: &BTreeSet<String>) -> String {
    if to != END_NAME && !names.contains(to) {
        c.error(path, format!("no node named `{to}`; nodes: {}, or END", list(names)));
    }
    to.to_owned()
}

fn template(c: &mut Checker<'_>, path: &[&str], text: &str, channels: &[&str]) -> Option<Template> {
    match Template::parse(text) {
        Ok(t) => {
            for name in t.names() {
                if !channels.contains(&name) && !BUILTINS.contains(&name) {
                    c.error(
                        path,
                        format!(
                            "the template reads `{name}`, which the state does not have: channels {}; always there: {}",
                            if channels.is_empty() { "none".to_owned() } else { channels.join(", ") },
                            BUILTINS.join(", ")
                        ),
                    );
                }
            }
            Some(t)
        }
        Err(e) => {
            c.error(path, e.0);
            None
        }
    }
}

fn known_tool(c: &mut Checker<'_>, path: &[&str], tool: &str, known: &Known<'_>) {
    if !known.tools.iter().any(|t| t == tool) {
        c.error(path, format!("the agent has no tool `{tool}`; its tools: {}", known.tools.join(", ")));
    }
}

/// A tool a node calls itself: it must exist and be a read tool (a write runs only after a
/// person approved it, which only a `tools` node asks).
fn node_called_tool(c: &mut Checker<'_>, path: &[&str], tool: &str, known: &Known<'_>) {
    known_tool(c, path, tool, known);
    if known.writes.iter().any(|w| w == tool) {
        c.error(
            path,
            format!(
                "`{tool}` is a write tool: a node may not run it unasked; let a `model` node call it and route \
                 its tool calls to a `tools` node, which asks the person"
            ),
        );
    }
}

fn channel(c: &mut Checker<'_>, path: &[&str], name: &str, channels: &[&str]) {
    if !channels.contains(&name) {
        let have = if channels.is_empty() { "none".to_owned() } else { channels.join(", ") };
        c.error(path, format!("no channel `{name}`: declare it under [channels] (channels: {have})"));
    }
}

fn arguments_templates(c: &mut Checker<'_>, path: &[&str], value: &Value, channels: &[&str]) {
    match value {
        Value::String(s) => {
            template(c, path, s, channels);
        }
        Value::Array(items) => items.iter().for_each(|v| arguments_templates(c, path, v, channels)),
        Value::Object(m) => m.values().for_each(|v| arguments_templates(c, path, v, channels)),
        _ => {}
    }
}

#[allow(clippy::too_many_lines)] // one arm per kind reads better than six helpers
fn plan_node(
    c: &mut Checker<'_>,
    name: &str,
    n: &NodeDecl,
    channels: &[&str],
    names: &BTreeSet<String>,
    kinds: &BTreeMap<&str, &NodeKind>,
    known: &Known<'_>,
) -> Vec<PlannedNode> {
    let kind = n.kind.as_str();
    // A kind nobody registered (a typo, most often) is one error, not one per field.
    let unknown = matches!(&n.kind, NodeKind::Custom(k) if known.kinds.and_then(|r| r.get(k)).is_none());
    for field in set_fields(n).into_iter().filter(|_| !unknown) {
        if !used_fields(&n.kind).contains(&field) {
            c.error(
                &["nodes", name, field],
                format!(
                    "{} `{kind}` node does not use `{field}`; it uses {}",
                    if kind.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" },
                    used_fields(&n.kind).join(", ")
                ),
            );
        }
    }
    let exit = match (&n.next, &n.route) {
        (Some(_), Some(_)) => {
            c.error(&["nodes", name, "route"], "set `next` or `route`, not both");
            Exit::Next(END_NAME.into())
        }
        (Some(next), None) => Exit::Next(target(c, &["nodes", name, "next"], next, names)),
        (None, Some(route)) => Exit::Route(plan_route(c, name, route, channels, names)),
        (None, None) if n.kind == NodeKind::Route => {
            c.error(&["nodes", name], "a `route` node needs `route = { … }`");
            Exit::Next(END_NAME.into())
        }
        (None, None) if n.kind == NodeKind::Tools => {
            c.error(
                &["nodes", name],
                "a `tools` node needs `next`: the node that reads the results (usually the model node)",
            );
            Exit::Next(END_NAME.into())
        }
        (None, None) => Exit::Next(END_NAME.into()),
    };
    let path = |field: &'static str| ["nodes", name, field];
    let step = match &n.kind {
        NodeKind::Model => {
            let prompt = n.prompt.as_deref().and_then(|p| template(c, &path("prompt"), p, channels));
            if let Some(tools) = &n.tools {
                for t in tools {
                    known_tool(c, &path("tools"), t, known);
                }
            }
            if n.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
                c.error(&path("temperature"), "between 0 and 2");
            }
            if n.max_tokens == Some(0) {
                c.error(&path("max_tokens"), "must be greater than 0");
            }
            let output = n.output.as_ref().map(|o| {
                channel(c, &["nodes", name, "output", "channel"], &o.channel, channels);
                if n.tools.as_ref().is_some_and(|t| !t.is_empty()) {
                    c.error(&path("tools"), "a node with `output` answers into its channel and calls no tools");
                }
                match (o.schema.as_ref().map(jsonschema::validator_for), &o.on_failure) {
                    (Some(Err(e)), _) => {
                        c.error(&["nodes", name, "output", "schema"], format!("not a valid JSON Schema: {e}"));
                    }
                    (Some(Ok(v)), Some(value)) if !v.is_valid(value) => {
                        c.error(&["nodes", name, "output", "on_failure"], "does not match the output's schema");
                    }
                    // A draft is text.
                    (None, Some(value)) if !value.is_string() => {
                        c.error(&["nodes", name, "output", "on_failure"], "a draft (no schema) is text: a string");
                    }
                    _ => {}
                }
                let labels =
                    o.schema.as_ref().and_then(|s| s.get("enum")).and_then(Value::as_array).and_then(|items| {
                        items.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>()
                    });
                Output {
                    channel: o.channel.clone(),
                    schema: o.schema.clone(),
                    labels,
                    on_failure: o.on_failure.clone(),
                }
            });
            let require_call = n.tool_choice == Some(ToolChoiceDecl::Required);
            let may_call = n.output.is_none() && n.tools.as_ref().map_or(!known.tools.is_empty(), |t| !t.is_empty());
            if require_call && !may_call {
                c.error(&path("tool_choice"), "`required` needs tools to call (and no `output`)");
            }
            let to_tools = n.route.as_ref().and_then(|r| r.tool_calls.as_ref()).and_then(|t| kinds.get(t.as_str()));
            if may_call && to_tools != Some(&&NodeKind::Tools) {
                c.error(
                    &["nodes", name, "route"],
                    "this node may call tools: route its calls to a `tools` node, e.g. route = { tool_calls = \"tools\", \
                     otherwise = \"END\" } (or set tools = [])",
                );
            }
            let cite = n.cite.unwrap_or(false);
            if cite && n.output.is_some() {
                c.error(&path("cite"), "a node with `output` answers into its channel: there is no reply to cite");
            }
            let reply_needs_tools = n.reply_needs_tools.unwrap_or(false);
            if reply_needs_tools && !may_call {
                c.error(&path("reply_needs_tools"), "needs tools to call (and no `output`)");
            }
            let message = n.message.as_deref().and_then(|m| template(c, &path("message"), m, channels));
            // A tool loop must see its results, which neither keeps.
            if may_call && (n.message.is_some() || n.history == Some(History::Spoken)) {
                c.error(
                    &path(if n.message.is_some() { "message" } else { "history" }),
                    "only on a node that calls no tools (tools = [], or `output`): its tool calls would not see their \
                     results",
                );
            }
            // A reply that must not fail, or must mention something, is one the node writes
            // itself: it calls no tools.
            for (field, set) in [("fallback", n.fallback.is_some()), ("must_mention", n.must_mention.is_some())] {
                if set && (n.output.is_some() || may_call) {
                    c.error(&path(field), "only on a node that replies and calls no tools (tools = [], no `output`)");
                }
                // The node writes that reply itself: no check against search results.
                if set && n.cite == Some(true) {
                    c.error(&path(field), "not with `cite = true` (a cited reply is checked as it streams)");
                }
            }
            let fallback = n.fallback.as_deref().and_then(|f| template(c, &path("fallback"), f, channels));
            let must_mention = n.must_mention.as_ref().and_then(|m| {
                let any = template(c, &["nodes", name, "must_mention", "any_of"], &m.any_of, channels)?;
                if any.names().count() != 1 || !m.any_of.trim().starts_with("{{") || !m.any_of.trim().ends_with("}}") {
                    c.error(
                        &["nodes", name, "must_mention", "any_of"],
                        "one placeholder whose value is a list of strings, e.g. \"{{resources.contacts}}\"",
                    );
                }
                let append = template(c, &["nodes", name, "must_mention", "or_append"], &m.or_append, channels)?;
                Some((any, append))
            });
            Step::Model {
                require_call,
                cite,
                reply_needs_tools,
                message,
                fallback,
                must_mention,
                prompt,
                // A node with a structured output calls no tools.
                tools: if output.is_some() { Some(Vec::new()) } else { n.tools.clone() },
                model: n.model.clone(),
                temperature: n.temperature,
                max_tokens: n.max_tokens,
                history: n.history.unwrap_or_default(),
                output,
            }
        }
        NodeKind::Tools => {
            let [approved, execute, give_up] = hidden_names(name);
            let next = match &exit {
                Exit::Next(next) => next.clone(),
                _ => END_NAME.into(),
            };
            let give_up_target = match &n.give_up {
                Some(g) => target(c, &path("give_up"), g, names),
                None => give_up.clone(),
            };
            let mut nodes = vec![
                PlannedNode {
                    name: name.to_owned(),
                    step: Step::Tools {
                        allowed: None,
                        approved: approved.clone(),
                        execute: execute.clone(),
                        max_failures: n.max_failures,
                    },
                    exit: Exit::Tools { next: next.clone(), give_up: give_up_target },
                },
                PlannedNode {
                    name: approved,
                    step: Step::Approved,
                    exit: Exit::Approved { execute: execute.clone(), next: next.clone() },
                },
                PlannedNode { name: execute, step: Step::Execute, exit: Exit::Next(next) },
            ];
            if n.give_up.is_none() {
                nodes.push(PlannedNode { name: give_up, step: Step::GiveUp, exit: Exit::Next(END_NAME.into()) });
            }
            return nodes;
        }
        NodeKind::Tool => {
            let tool = n.tool.clone().unwrap_or_default();
            if n.tool.is_none() {
                c.error(&["nodes", name], "a `tool` node needs `tool`: the tool it calls");
            } else {
                node_called_tool(c, &path("tool"), &tool, known);
            }
            let arguments = n.arguments.clone().unwrap_or_default();
            arguments_templates(c, &path("arguments"), &Value::Object(arguments.clone()), channels);
            if let Some(ch) = &n.channel {
                channel(c, &path("channel"), ch, channels);
            }
            Step::Tool { tool, arguments, never_fail: n.never_fail.unwrap_or(false), channel: n.channel.clone() }
        }
        NodeKind::Retrieve => {
            let tool = n.tool.clone().unwrap_or_else(|| "rag_search".into());
            node_called_tool(c, &path("tool"), &tool, known);
            let query = n.query.as_deref().unwrap_or("{{last_user_message}}");
            let query = template(c, &path("query"), query, channels);
            let top_k = n.top_k.unwrap_or(5);
            // `rag_search` returns at most 20 passages.
            if !(1..=20).contains(&top_k) {
                c.error(&path("top_k"), "between 1 and 20");
            }
            let ch = match &n.channel {
                Some(ch) => {
                    channel(c, &path("channel"), ch, channels);
                    ch.clone()
                }
                None => {
                    c.error(&["nodes", name], "a `retrieve` node needs `channel`: where the passages go");
                    String::new()
                }
            };
            Step::Retrieve {
                tool,
                query: query.unwrap_or_default(),
                top_k,
                channel: ch,
                skip_small_talk: n.skip_small_talk.unwrap_or(false),
            }
        }
        NodeKind::Reply => match &n.text {
            Some(text) => match template(c, &path("text"), text, channels) {
                Some(text) => Step::Reply { text },
                None => Step::Route,
            },
            None => {
                c.error(&["nodes", name], "a `reply` node needs `text`");
                Step::Route
            }
        },
        NodeKind::Cite => {
            let text = match &n.text {
                Some(text) => template(c, &path("text"), text, channels).unwrap_or_default(),
                None => {
                    c.error(
                        &["nodes", name],
                        "a `cite` node needs `text`: what it checks, e.g. a model node's draft \"{{draft}}\"",
                    );
                    Template::default()
                }
            };
            if let Some(ch) = &n.passages {
                channel(c, &path("passages"), ch, channels);
            }
            if let Some(ch) = &n.channel {
                channel(c, &path("channel"), ch, channels);
            }
            Step::Cite { text, passages: n.passages.clone(), channel: n.channel.clone() }
        }
        NodeKind::Route => Step::Route,
        NodeKind::Agent => {
            let agent = match &n.agent {
                Some(a) if known.agents.iter().any(|k| k == a) => a.clone(),
                Some(a) => {
                    let have = if known.agents.is_empty() { "none".to_owned() } else { known.agents.join(", ") };
                    c.error(
                        &path("agent"),
                        format!("no agent `{a}` to hand the turn to: declare it as [agents.{a}] (agents: {have})"),
                    );
                    a.clone()
                }
                None => {
                    c.error(&["nodes", name], "an `agent` node needs `agent`: the agent it hands the turn to");
                    String::new()
                }
            };
            if let Some(ch) = &n.channel {
                channel(c, &path("channel"), ch, channels);
            }
            Step::Agent { agent, input: n.input.unwrap_or_default(), channel: n.channel.clone() }
        }
        NodeKind::Custom(kind) => {
            let with = n.with.clone().unwrap_or_default();
            let channel = n.channel.as_ref().map(|ch| {
                channel(c, &path("channel"), ch, channels);
                ch.clone()
            });
            match known.kinds.and_then(|k| k.get(kind)) {
                Some(custom) => {
                    if let Err(e) = custom.check(&with) {
                        c.error(&path(if n.with.is_some() { "with" } else { "kind" }), e);
                    }
                    Step::Custom { kind: CustomStep { name: kind.clone(), kind: Arc::clone(custom) }, with, channel }
                }
                None => {
                    let mine: Vec<&str> = known.kinds.map(|k| k.names().collect()).unwrap_or_default();
                    c.error(
                        &path("kind"),
                        format!(
                            "no node kind `{kind}`: the kinds are {}{}",
                            NodeKind::BUILT_IN.join(", "),
                            if mine.is_empty() {
                                String::new()
                            } else {
                                format!(", and this program's {}", mine.join(", "))
                            }
                        ),
                    );
                    Step::Route
                }
            }
        }
        NodeKind::Ask => {
            let question = match &n.question {
                Some(q) => template(c, &path("question"), q, channels).unwrap_or_default(),
                None => {
                    c.error(&["nodes", name], "an `ask` node needs `question`: what it asks the person");
                    Template::default()
                }
            };
            if let Some(form) = &n.form
                && let Err(e) = jsonschema::validator_for(form)
            {
                c.error(&path("form"), format!("not a valid JSON Schema: {e}"));
            }
            let ch = match &n.channel {
                Some(ch) => {
                    channel(c, &path("channel"), ch, channels);
                    ch.clone()
                }
                None => {
                    c.error(&["nodes", name], "an `ask` node needs `channel`: where the answer goes");
                    String::new()
                }
            };
            // The pause resumes at the hidden node, which records the answer and leaves by the
            // declared `next` or `route`.
            let answered = answered_name(name);
            return vec![
                PlannedNode {
                    name: name.to_owned(),
                    step: Step::Ask { question, form: n.form.clone(), answered: answered.clone() },
                    exit: Exit::Next(answered.clone()),
                },
                PlannedNode { name: answered, step: Step::Answered { channel: ch }, exit },
            ];
        }
    };
    vec![PlannedNode { name: name.to_owned(), step, exit }]
}

fn plan_route(c: &mut Checker<'_>, name: &str, r: &RouteDecl, channels: &[&str], names: &BTreeSet<String>) -> Route {
    let p = |f: &'static str| ["nodes", name, "route", f];
    let replied = r.replied.as_ref().map(|t| target(c, &p("replied"), t, names));
    let tool_calls = r.tool_calls.as_ref().map(|t| target(c, &p("tool_calls"), t, names));
    let otherwise = target(c, &p("otherwise"), &r.otherwise, names);
    let mentioned = r.mentioned.as_ref().map(|t| target(c, &p("mentioned"), t, names));
    match (&mentioned, r.mentions.is_empty()) {
        (Some(_), true) => c.error(&p("mentioned"), "`mentioned` needs `mentions`: the words to look for"),
        (None, false) => c.error(&p("mentions"), "`mentions` needs `mentioned`: where to go when one is said"),
        _ => {}
    }
    if r.mentions.iter().any(|w| w.trim().is_empty()) {
        c.error(&p("mentions"), "a word to look for cannot be empty");
    }
    let mentions = r.mentions.iter().map(|w| w.to_lowercase()).collect();
    let mut cases = BTreeMap::new();
    for (value, to) in &r.cases {
        cases.insert(value.clone(), target(c, &["nodes", name, "route", "cases", value], to, names));
    }
    match (&r.on, r.cases.is_empty()) {
        // `on = "verdict.risk"`: a field of the channel's value.
        (Some(on), false) => channel(c, &p("on"), on.split('.').next().unwrap_or(on), channels),
        (Some(_), true) => c.error(&p("on"), "`on` needs `cases`: the channel's values and where each goes"),
        (None, false) => c.error(&p("cases"), "`cases` needs `on`: the channel whose value picks the case"),
        (None, true) => {}
    }
    Route { replied, tool_calls, mentioned, mentions, on: r.on.clone(), cases, otherwise }
}

/// A route on a classifier's channel: each case must be one of its labels (a typo would never
/// match).
fn check_cases_against_labels(c: &mut Checker<'_>, g: &GraphFile) {
    let mut labels: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for node in g.nodes.values() {
        let Some(output) = &node.output else { continue };
        let Some(items) = output.schema.as_ref().and_then(|s| s.get("enum")).and_then(Value::as_array) else {
            continue;
        };
        labels.entry(output.channel.as_str()).or_default().extend(items.iter().filter_map(Value::as_str));
    }
    for (name, node) in &g.nodes {
        let Some(route) = &node.route else { continue };
        let Some(known) = route.on.as_deref().and_then(|on| labels.get(on)) else { continue };
        for case in route.cases.keys().filter(|k| !known.contains(k.as_str())) {
            let all = known.iter().copied().collect::<Vec<_>>().join(", ");
            c.error(
                &["nodes", name, "route", "cases", case],
                format!("`{case}` is not a label the classifier writes: {all}"),
            );
        }
    }
}

/// Every node reachable from the start, and every node with a way to the end.
fn check_paths(c: &mut Checker<'_>, plan: &Plan) {
    let edges: BTreeMap<&str, Vec<&str>> = plan.nodes.iter().map(|n| (n.name.as_str(), n.exit.targets())).collect();
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut todo = vec![plan.start.as_str()];
    while let Some(n) = todo.pop() {
        if reached.insert(n) {
            todo.extend(edges.get(n).into_iter().flatten().copied());
        }
    }
    // Hidden nodes are reached through their `tools` node's pause.
    for n in &plan.nodes {
        if let Step::Tools { approved, .. } = &n.step
            && reached.contains(n.name.as_str())
        {
            let mut todo = vec![approved.as_str()];
            while let Some(n) = todo.pop() {
                if reached.insert(n) {
                    todo.extend(edges.get(n).into_iter().flatten().copied());
                }
            }
        }
    }
    let mut ends: BTreeSet<&str> = BTreeSet::from([END_NAME]);
    loop {
        let before = ends.len();
        for (n, to) in &edges {
            if to.iter().any(|t| ends.contains(t)) {
                ends.insert(n);
            }
        }
        if ends.len() == before {
            break;
        }
    }
    for n in &plan.nodes {
        let hidden = matches!(n.step, Step::Approved | Step::Execute | Step::GiveUp);
        if !reached.contains(n.name.as_str()) && !hidden {
            c.error(&["nodes", &n.name], format!("no path from `start` ({}) reaches this node", plan.start));
        } else if !ends.contains(n.name.as_str()) && !hidden {
            c.error(&["nodes", &n.name], "no way out: every path from this node loops without reaching END");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOOLS: [&str; 3] = ["rag_search", "create_ticket", "note_write"];

    fn errors(text: &str) -> Vec<String> {
        let tools: Vec<String> = TOOLS.map(str::to_owned).to_vec();
        let writes = ["create_ticket".to_owned(), "note_write".to_owned()];
        match check("desk.toml", text, &Known { tools: &tools, writes: &writes, kinds: None, agents: &[] }) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    /// A declaration that passes: a classifier routes to retrieval and a model with tools.
    const GOOD: &str = r#"start = "classify"

[channels]
category = {}
passages = { reducer = "replace" }

[nodes.classify]
kind = "model"
history = "last_message"
output = { channel = "category", schema = { enum = ["billing", "technical"] } }
route = { on = "category", cases = { billing = "search" }, otherwise = "agent" }

[nodes.search]
kind = "retrieve"
channel = "passages"
next = "agent"

[nodes.agent]
kind = "model"
prompt = "Answer from these passages: {{passages}}"
tools = ["create_ticket"]
route = { tool_calls = "tools", otherwise = "END" }

[nodes.tools]
kind = "tools"
next = "agent"
"#;

    #[test]
    fn a_sound_declaration_passes_and_brings_the_tools_nodes_own() {
        assert_eq!(errors(GOOD), Vec::<String>::new());
        let tools: Vec<String> = TOOLS.map(str::to_owned).to_vec();
        let plan = check("desk.toml", GOOD, &Known { tools: &tools, writes: &[], kinds: None, agents: &[] }).unwrap();
        let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["agent", "approved", "classify", "execute", "give_up", "search", "tools"]);
    }

    #[test]
    fn a_channel_is_held_to_its_writers_schemas_unless_one_writes_it_freely() {
        let tools: Vec<String> = TOOLS.map(str::to_owned).to_vec();
        let known = Known { tools: &tools, writes: &[], kinds: None, agents: &[] };
        let plan = check("desk.toml", GOOD, &known).unwrap();
        let schemas = plan.channel_schemas();
        assert_eq!(schemas.get("category"), Some(&vec![serde_json::json!({"enum": ["billing", "technical"]})]));
        assert!(!schemas.contains_key("passages"), "a search writes it: {schemas:?}");
        // A draft written into `category` too: it then holds whatever the draft says.
        let drafted = GOOD.replacen(
            "[nodes.search]",
            "[nodes.draft]\nkind = \"model\"\noutput = { channel = \"category\" }\nnext = \"agent\"\n\n[nodes.search]",
            1,
        );
        let drafted = drafted.replacen(
            "cases = { billing = \"search\" }",
            "cases = { billing = \"search\", technical = \"draft\" }",
            1,
        );
        let plan = check("desk.toml", &drafted, &known).unwrap();
        assert!(!plan.channel_schemas().contains_key("category"), "{drafted}");
    }

    /// `GOOD` with `from` replaced by `to`, and the errors that gives.
    fn broken(from: &str, to: &str) -> Vec<String> {
        assert!(GOOD.contains(from), "{from}");
        errors(&GOOD.replacen(from, to, 1))
    }

    #[test]
    fn each_unknown_name_is_an_error_at_its_line_and_field() {
        assert_eq!(
            broken(r#"tools = ["create_ticket"]"#, r#"tools = ["create_tickets"]"#),
            [
                "desk.toml:21: nodes.agent.tools: the agent has no tool `create_tickets`; its tools: rag_search, create_ticket, note_write"
            ]
        );
        assert_eq!(
            broken("{{passages}}", "{{pasages}}"),
            [
                "desk.toml:20: nodes.agent.prompt: the template reads `pasages`, which the state does not have: channels category, passages; always there: last_user_message, recent_user_messages, question_in_context, context, tool_failures, last_tool_error, agent, system_prompt"
            ]
        );
        assert_eq!(
            broken(r#"channel = "passages""#, r#"channel = "found""#),
            [
                "desk.toml:15: nodes.search.channel: no channel `found`: declare it under [channels] (channels: category, passages)"
            ]
        );
        assert_eq!(
            broken(r#"billing = "search""#, r#"billing = "serch""#),
            [
                "desk.toml:11: nodes.classify.route.cases.billing: no node named `serch`; nodes: agent, classify, search, tools, or END"
            ]
        );
        assert_eq!(
            broken(r#"start = "classify""#, r#"start = "clasify""#),
            ["desk.toml:1: start: no node named `clasify`; nodes: agent, classify, search, tools"]
        );
        let err = broken(r#"on = "category""#, r#"on = "categories""#);
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].starts_with("desk.toml:11: nodes.classify.route.on: no channel `categories`"), "{err:?}");
    }

    #[test]
    fn grounding_a_node_that_has_no_reply_or_no_tools_is_an_error() {
        assert_eq!(
            broken("history = \"last_message\"\n", "history = \"last_message\"\ncite = true\n"),
            [
                "desk.toml:10: nodes.classify.cite: a node with `output` answers into its channel: there is no reply to cite"
            ]
        );
        assert_eq!(
            broken("tools = [\"create_ticket\"]\n", "tools = []\nreply_needs_tools = true\n"),
            ["desk.toml:22: nodes.agent.reply_needs_tools: needs tools to call (and no `output`)"]
        );
        // On a node that replies and may call tools, both are sound.
        assert_eq!(
            broken(
                "tools = [\"create_ticket\"]\n",
                "tools = [\"create_ticket\"]\ncite = true\nreply_needs_tools = true\n"
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_field_its_kind_does_not_use_and_a_missing_one_are_errors() {
        assert_eq!(
            broken("kind = \"retrieve\"\n", "kind = \"retrieve\"\ntext = \"hi\"\n"),
            [
                "desk.toml:15: nodes.search.text: a `retrieve` node does not use `text`; it uses next, route, tool, channel, query, top_k, skip_small_talk"
            ]
        );
        assert_eq!(
            broken("kind = \"tools\"\nnext = \"agent\"\n", "kind = \"tools\"\n"),
            [
                "desk.toml:24: nodes.tools: a `tools` node needs `next`: the node that reads the results (usually the model node)"
            ]
        );
        assert_eq!(
            broken("history = \"last_message\"\n", "history = \"last_message\"\ntool_choice = \"required\"\n"),
            ["desk.toml:10: nodes.classify.tool_choice: `required` needs tools to call (and no `output`)"]
        );
        assert_eq!(
            broken("next = \"agent\"\n", "next = \"agent\"\nroute = { otherwise = \"END\" }\n"),
            ["desk.toml:17: nodes.search.route: set `next` or `route`, not both"]
        );
    }

    #[test]
    fn an_unreachable_node_and_one_with_no_way_out_are_errors() {
        let orphan = format!("{GOOD}\n[nodes.orphan]\nkind = \"reply\"\ntext = \"hi\"\n");
        assert_eq!(errors(&orphan), ["desk.toml:28: nodes.orphan: no path from `start` (classify) reaches this node"]);
        let looping = format!(
            "{}\n[nodes.ask]\nkind = \"reply\"\ntext = \"Which one?\"\nnext = \"recheck\"\n\n[nodes.recheck]\nkind = \"route\"\nroute = {{ otherwise = \"ask\" }}\n",
            GOOD.replace(r#"otherwise = "agent" }"#, r#"otherwise = "ask" }"#)
        );
        assert_eq!(
            errors(&looping),
            [
                "desk.toml:28: nodes.ask: no way out: every path from this node loops without reaching END",
                "desk.toml:33: nodes.recheck: no way out: every path from this node loops without reaching END",
            ]
        );
    }

    #[test]
    fn an_invalid_schema_a_bad_template_and_bad_toml_are_errors_with_their_line() {
        let err = broken(r#"schema = { enum = ["billing", "technical"] }"#, r#"schema = { type = "strin" }"#);
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].starts_with("desk.toml:10: nodes.classify.output.schema: not a valid JSON Schema"), "{err:?}");
        let err = broken("{{passages}}", "{{passages");
        assert!(err[0].starts_with("desk.toml:20: nodes.agent.prompt: `{{` without its `}}`"), "{err:?}");
        let err = broken("kind = \"retrieve\"", "kind = \"search\"");
        assert_eq!(err.len(), 1, "{err:?}");
        assert_eq!(
            err[0],
            "desk.toml:14: nodes.search.kind: no node kind `search`: the kinds are model, tools, tool, retrieve, cite, \
             reply, route, ask, agent"
        );
        let err = broken("[nodes.tools]", "[nodes.tools");
        assert!(err[0].starts_with("desk.toml:24: "), "{err:?}");
        let err = broken("category = {}", "category = { reducer = \"add\" }");
        assert!(err[0].starts_with("desk.toml:4: unknown variant `add`"), "{err:?}");
    }

    #[test]
    fn names_every_graph_has_cannot_be_declared_again() {
        let err = broken("category = {}", "category = {}\ncontext = {}");
        assert_eq!(err, ["desk.toml:5: channels.context: `context` is a name every graph has already; pick another"]);
        let err = errors(&format!("{GOOD}\n[nodes.approved]\nkind = \"route\"\nroute = {{ otherwise = \"END\" }}\n"));
        assert!(
            err.iter().any(|e| e.contains("desk.toml:28: nodes.approved: the `tools` node `tools` brings")),
            "{err:?}"
        );
    }

    #[test]
    fn writes_unasked_unrouted_calls_and_labels_no_classifier_writes_are_errors() {
        let with = |extra: &str| errors(&format!("{GOOD}\n{extra}"));
        // A node may not run a write tool itself: only a `tools` node asks the person.
        let err = broken("kind = \"retrieve\"\n", "kind = \"retrieve\"\ntool = \"note_write\"\n");
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].starts_with("desk.toml:15: nodes.search.tool: `note_write` is a write tool"), "{err:?}");
        // A model node that may call tools must send its calls to a `tools` node.
        let err = broken(r#"route = { tool_calls = "tools", otherwise = "END" }"#, r#"next = "END""#);
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].starts_with("desk.toml:18: nodes.agent.route: this node may call tools"), "{err:?}");
        // A case the classifier never writes.
        let err = broken(r#"billing = "search""#, r#"biling = "search""#);
        assert_eq!(
            err,
            [
                "desk.toml:11: nodes.classify.route.cases.biling: `biling` is not a label the classifier writes: billing, technical"
            ]
        );
        // The runtime's own names.
        let err = with("[nodes.__end__]\nkind = \"route\"\nroute = { otherwise = \"END\" }\n");
        assert!(err.iter().any(|e| e.starts_with("desk.toml:28: nodes.__end__: node names use")), "{err:?}");
    }

    #[test]
    fn lines_inside_a_multi_line_prompt_are_text_not_keys() {
        let text = GOOD.replace(
            "prompt = \"Answer from these passages: {{passages}}\"",
            "prompt = \"\"\"Answer from these passages.\n[1] cite like this\ntools are not yours: {{pasages}}\"\"\"",
        );
        let err = errors(&text);
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(err[0].starts_with("desk.toml:20: nodes.agent.prompt: the template reads `pasages`"), "{err:?}");
        let err = errors(&text.replace(r#"tools = ["create_ticket"]"#, r#"tools = ["create_tickets"]"#));
        assert!(err.iter().any(|e| e.starts_with("desk.toml:23: nodes.agent.tools: the agent has no tool")), "{err:?}");
    }
    #[test]
    fn an_ask_node_brings_the_node_its_answer_resumes_at_and_needs_its_question_and_channel() {
        // The classifier's `technical` case asks which app first.
        let text = GOOD
            .replace("category = {}", "category = {}\napp = {}")
            .replace(r#"otherwise = "agent" }"#, r#"otherwise = "which" }"#)
            + "\n[nodes.which]\nkind = \"ask\"\nquestion = \"Which app, {{context.user}}?\"\n\
               form = { enum = [\"web\", \"mobile\"] }\nchannel = \"app\"\n\
               route = { on = \"app\", cases = { web = \"agent\" }, otherwise = \"END\" }\n";
        assert_eq!(errors(&text), Vec::<String>::new());
        let tools: Vec<String> = TOOLS.map(str::to_owned).to_vec();
        let plan = check("desk.toml", &text, &Known { tools: &tools, writes: &[], kinds: None, agents: &[] }).unwrap();
        let which = plan.nodes.iter().find(|n| n.name == "which").unwrap();
        assert!(matches!(&which.step, Step::Ask { answered, .. } if answered == "which_answered"), "{which:?}");
        assert_eq!(which.exit.targets(), ["which_answered"], "the pause resumes there");
        let answered = plan.nodes.iter().find(|n| n.name == "which_answered").unwrap();
        assert!(matches!(&answered.step, Step::Answered { channel } if channel == "app"));
        assert_eq!(answered.exit.targets(), ["END", "agent"], "the declared route leaves from the answer");
        // Without its question or its channel, with a form that is no schema, or a node in the
        // way of the one it brings: each said where.
        let err = errors(&text.replace("question = \"Which app, {{context.user}}?\"\n", ""));
        assert_eq!(err, ["desk.toml:29: nodes.which: an `ask` node needs `question`: what it asks the person"]);
        let err = errors(&text.replace("channel = \"app\"\n", "channel = \"apps\"\n"));
        assert!(err[0].starts_with("desk.toml:33: nodes.which.channel: no channel `apps`"), "{err:?}");
        let err = errors(&text.replace(r#"form = { enum = ["web", "mobile"] }"#, r#"form = { type = "strin" }"#));
        assert!(err[0].starts_with("desk.toml:32: nodes.which.form: not a valid JSON Schema"), "{err:?}");
        let err = errors(&format!("{text}\n[nodes.which_answered]\nkind = \"reply\"\ntext = \"hi\"\n"));
        assert!(
            err.iter().any(|e| e.starts_with(
                "desk.toml:36: nodes.which_answered: the `ask` node `which` brings a node named `which_answered`"
            )),
            "{err:?}"
        );
        let err = errors(&text.replace("kind = \"ask\"\n", "kind = \"ask\"\ntools = []\n"));
        assert!(err[0].starts_with("desk.toml:31: nodes.which.tools: an `ask` node does not use `tools`"), "{err:?}");
    }

    #[test]
    fn a_route_may_read_a_field_of_its_channel() {
        let text = GOOD.replace(r#"on = "category", cases = { billing"#, r#"on = "category.label", cases = { billing"#);
        assert_eq!(errors(&text), Vec::<String>::new());
        let err = errors(&GOOD.replace(r#"on = "category", cases"#, r#"on = "categories.label", cases"#));
        assert!(err[0].starts_with("desk.toml:11: nodes.classify.route.on: no channel `categories`"), "{err:?}");
    }

    #[test]
    fn guarded_replies_keyword_routes_and_failure_values_are_checked() {
        let with = |from: &str, to: &str| broken(from, to).join("\n");
        // A fallback or a must-mention is for a reply the node writes itself: no tools.
        let err = with("tools = [\"create_ticket\"]\n", "tools = [\"create_ticket\"]\nfallback = \"Sorry.\"\n");
        assert!(
            err.contains("desk.toml:22: nodes.agent.fallback: only on a node that replies and calls no tools"),
            "{err}"
        );
        let guarded = "tools = []\nroute = { otherwise = \"END\" }\nfallback = \"Sorry: {{passages}}\"\n\
                       must_mention = { any_of = \"{{passages.contacts}}\", or_append = \"{{passages.lines}}\" }\n";
        let text = GOOD
            .replace("tools = [\"create_ticket\"]\nroute = { tool_calls = \"tools\", otherwise = \"END\" }\n", guarded)
            .replace("[nodes.tools]\nkind = \"tools\"\nnext = \"agent\"\n", "");
        assert_eq!(errors(&text), Vec::<String>::new());
        let err = errors(&text.replace("tools = []\n", "tools = []\ncite = true\n")).join("\n");
        assert!(err.contains("nodes.agent.fallback: not with `cite = true`"), "{err}");
        let err =
            errors(&text.replace("any_of = \"{{passages.contacts}}\"", "any_of = \"call {{passages.contacts}}\""))
                .join("\n");
        assert!(err.contains("nodes.agent.must_mention.any_of: one placeholder whose value is a list"), "{err}");
        // A tool loop must see its results: no `message` or spoken history on a node with tools.
        let err =
            with("tools = [\"create_ticket\"]\n", "tools = [\"create_ticket\"]\nmessage = \"{{last_user_message}}\"\n");
        assert!(err.contains("nodes.agent.message: only on a node that calls no tools"), "{err}");
        let err = with("tools = [\"create_ticket\"]\n", "tools = [\"create_ticket\"]\nhistory = \"spoken\"\n");
        assert!(err.contains("nodes.agent.history: only on a node that calls no tools"), "{err}");
        // A keyword rule needs its words and its target; a failure value must fit the schema.
        let err = with("otherwise = \"agent\" }", "mentioned = \"search\", otherwise = \"agent\" }");
        assert!(err.contains("nodes.classify.route.mentioned: `mentioned` needs `mentions`"), "{err}");
        let err = with("otherwise = \"agent\" }", "mentions = [\"refund\"], otherwise = \"agent\" }");
        assert!(err.contains("nodes.classify.route.mentions: `mentions` needs `mentioned`"), "{err}");
        assert_eq!(
            with("otherwise = \"agent\" }", "mentioned = \"search\", mentions = [\"Refund\"], otherwise = \"agent\" }"),
            ""
        );
        let err = with(
            "schema = { enum = [\"billing\", \"technical\"] } }",
            "schema = { enum = [\"billing\", \"technical\"] }, on_failure = \"other\" }",
        );
        assert!(err.contains("nodes.classify.output.on_failure: does not match the output's schema"), "{err}");
    }

    #[test]
    fn an_agent_node_hands_the_turn_to_an_agent_of_the_configuration() {
        // Billing goes to the billing agent, then on to the search.
        let text = GOOD.replace(r#"billing = "search" }"#, r#"billing = "billing" }"#)
            + "\n[nodes.billing]\nkind = \"agent\"\nagent = \"billing\"\ninput = \"last_message\"\n\
               channel = \"passages\"\nnext = \"search\"\n";
        let tools: Vec<String> = TOOLS.map(str::to_owned).to_vec();
        let agents = ["billing".to_owned(), "desk".to_owned()];
        let known = Known { tools: &tools, writes: &[], kinds: None, agents: &agents };
        let plan = check("desk.toml", &text, &known).unwrap();
        let billing = plan.nodes.iter().find(|n| n.name == "billing").unwrap();
        assert!(
            matches!(&billing.step, Step::Agent { agent, input: Input::LastMessage, channel: Some(c) } if agent == "billing" && c == "passages"),
            "{billing:?}"
        );
        // Without the configuration's agents, or naming one it lacks, or none: each an error.
        let err = errors(&text);
        assert!(
            err.iter().any(|e| e.starts_with("desk.toml:30: nodes.billing.agent: no agent `billing` to hand the turn to: declare it as [agents.billing] (agents: none)")),
            "{err:?}"
        );
        let err = check("desk.toml", &text.replace("agent = \"billing\"", "agent = \"biling\""), &known).unwrap_err();
        assert!(err.to_string().contains("nodes.billing.agent: no agent `biling` to hand the turn to: declare it as [agents.biling] (agents: billing, desk)"), "{err}");
        let err = check("desk.toml", &text.replace("agent = \"billing\"\n", ""), &known).unwrap_err();
        assert!(err.to_string().contains("nodes.billing: an `agent` node needs `agent`"), "{err}");
        let err =
            check("desk.toml", &text.replace("channel = \"passages\"\nnext", "channel = \"found\"\nnext"), &known)
                .unwrap_err();
        assert!(err.to_string().contains("nodes.billing.channel: no channel `found`"), "{err}");
        // `input` belongs to `agent` nodes only.
        let err = check("desk.toml", &text.replace("history = \"last_message\"", "input = \"last_message\""), &known)
            .unwrap_err();
        assert!(err.to_string().contains("nodes.classify.input: a `model` node does not use `input`"), "{err}");
    }
}
