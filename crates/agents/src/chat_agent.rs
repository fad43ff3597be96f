//! [`ChatAgent`]: the one interface the chat service runs every agent through, whatever the
//! state its graph keeps.
//!
//! The service starts and resumes runs, reads their events (the graph runtime's
//! [`RunEvent`]s) and how they ended ([`TurnEnd`]), and asks the agent how a
//! step reads as conversation messages and pending actions ([`ChatAgent::project`]) and how
//! its state looks at a checkpoint ([`StateView`]). It never sees the state type, the node
//! names or the interrupt payloads of an agent: those stay behind this trait, so an agent of
//! any shape is served the same way (docs/agents.md).
//!
//! [`GraphAgent`] implements the trait for any compiled graph whose state is a
//! [`ChatState`]: a state that can take a user's turn, say what the reply is, describe what a
//! pause asks a person, and project a checkpoint record into the conversation.

use async_trait::async_trait;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_conversations::{NewPending, Projection};
use toolgraph_graph::{
    CheckpointMeta, CheckpointRecord, Checkpointer, CompiledGraph, Decision, GraphError, GraphShape, InterruptId,
    PendingInterrupt, RecordedRun, ResumeResult, RunEvent, RunHandle, RunOptions, RunOutcome, State, ThreadId,
    ThreadState,
};

/// What a person's turn brings to a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnInput {
    /// What they wrote.
    pub message: String,
    /// Context values for the agent's tools (they replace the previous ones when given).
    pub context: Option<Map<String, Value>>,
    /// Who is asking, re-asserted on every turn over the context (tenant, user, conversation).
    pub identity: Map<String, Value>,
}

/// What a pause asks a person to decide, as people read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionRequest {
    /// The tool that waits.
    pub tool: String,
    /// The action in words.
    pub description: String,
    /// The arguments it would run with.
    pub arguments: Value,
}

/// What a question's pending action names where an approval names its tool (an agent's
/// question to a person, such as a declared `ask` node's): never a tool's name (those are
/// `[a-zA-Z0-9_-]`), so clients and the service tell the two apart by it. Its `description` is
/// the question and its `arguments` are `{"form": schema-or-null}`; it is answered with a
/// [`Decision::Answer`] that [`check_answer`] accepted.
pub const QUESTION: &str = "@ask";

/// The longest free-text answer to a question, in characters (a message's limit).
pub const MAX_ANSWER_CHARS: usize = 4000;

/// `answer` as a question with `form` takes it: free text is a non-blank string (trimmed) of
/// at most [`MAX_ANSWER_CHARS`]; a form's answer must match its JSON Schema. A choice among
/// strings (`{"enum": [...]}`) takes a person's spelling of one ("Web ", "WEB") as that choice.
///
/// # Errors
/// Why the answer does not do, in words a person can act on.
pub fn check_answer(form: Option<&Value>, answer: &Value) -> Result<Value, String> {
    let Some(schema) = form.filter(|f| !f.is_null()) else {
        return match answer.as_str().map(str::trim) {
            Some("") | None => Err("the answer is free text: a non-empty string".into()),
            Some(text) if text.chars().count() > MAX_ANSWER_CHARS => {
                Err(format!("the answer is longer than {MAX_ANSWER_CHARS} characters"))
            }
            Some(text) => Ok(Value::String(text.to_owned())),
        };
    };
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("the question's form is invalid: {e}"))?;
    let choice = answer.as_str().and_then(|typed| {
        let typed = typed.trim();
        schema.get("enum")?.as_array()?.iter().find(|c| c.as_str().is_some_and(|c| c.eq_ignore_ascii_case(typed)))
    });
    let answer = choice.unwrap_or(answer);
    let problems: Vec<String> = validator.iter_errors(answer).map(|e| e.to_string()).take(5).collect();
    if problems.is_empty() {
        Ok(answer.clone())
    } else {
        Err(format!("the answer does not fit the form: {}", problems.join("; ")))
    }
}

/// Whether `arguments` fit a tool's argument `schema` (a person's edit of a call).
///
/// # Errors
/// What does not fit, in words a person can act on.
pub fn check_arguments(schema: &Value, arguments: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("the tool's schema is invalid: {e}"))?;
    let problems: Vec<String> = validator.iter_errors(arguments).map(|e| e.to_string()).take(5).collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("the edited arguments do not fit the tool: {}", problems.join("; ")))
    }
}

/// How a run ended.
#[derive(Debug)]
pub enum TurnEnd {
    /// It finished; `reply` is the answer its state ends with, if any.
    Completed {
        /// The reply.
        reply: Option<String>,
    },
    /// It waits for decisions.
    Paused,
    /// It hit its recursion limit.
    RecursionLimit,
    /// It was cancelled.
    Cancelled,
    /// It failed.
    Failed(GraphError),
}

/// A run in progress: its events, then how it ended.
#[async_trait]
pub trait AgentRun: Send {
    /// The run's id.
    fn run_id(&self) -> &str;
    /// The next event; `None` once the run ended and every event was read. An
    /// [`RunEvent::Interrupted`]'s payloads are this agent's: [`ChatAgent::action_request`]
    /// reads them.
    async fn next_event(&mut self) -> Option<RunEvent>;
    /// Waits for the end, discarding unread events.
    async fn finish(self: Box<Self>) -> TurnEnd;
}

/// What a resume did.
pub enum Resumed {
    /// Every interrupt is decided; the run continues.
    Started(Box<dyn AgentRun>),
    /// Decisions recorded; others are still awaited.
    Waiting,
}

/// A thread's state at one checkpoint, for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct StateView {
    /// The checkpoint's sequence number.
    pub seq: u64,
    /// The node that runs next; `None` when idle.
    pub next: Option<String>,
    /// The pause's interrupts (decided or not).
    pub pending: Vec<PendingInterrupt>,
    /// Decisions recorded for them.
    pub decisions: BTreeMap<InterruptId, Decision>,
    /// The agent's state as JSON.
    pub state: Value,
}

impl StateView {
    /// Whether some interrupt of the pause still waits for a decision.
    pub fn undecided(&self) -> bool {
        self.pending.iter().any(|p| !self.decisions.contains_key(&p.id))
    }
}

/// A thread's state as a [`StateView`].
fn view<S: State + serde::Serialize>(head: ThreadState<S>) -> StateView {
    StateView {
        seq: head.version,
        next: head.next,
        pending: head.pending,
        decisions: head.decisions,
        state: serde_json::to_value(&*head.state).unwrap_or(Value::Null),
    }
}

/// Which version of its definition an agent runs: for a declared graph (the built-in ReAct and
/// legal graphs included), the declaration's digest, which every checkpoint records; `None`
/// for a graph built in code.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Revision {
    /// The version new turns run on.
    pub version: Option<String>,
    /// The last newer definition that failed its checks, still refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
}

/// A definition that failed its checks: the old version keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Refused {
    /// Its version (the digest of the refused text).
    pub version: String,
    /// Every problem found, each `file:line: field: message`.
    pub errors: Vec<String>,
}

/// An agent the chat service can run.
#[async_trait]
pub trait ChatAgent: Send + Sync + 'static {
    /// Its graph's nodes and edges, for drawing.
    fn shape(&self) -> GraphShape;
    /// Which version of its definition it runs (and a newer one that was refused, if any).
    fn revision(&self) -> Revision {
        Revision::default()
    }
    /// Where its checkpoints are kept.
    fn checkpointer(&self) -> &Arc<dyn Checkpointer>;
    /// Starts a turn on `thread`.
    ///
    /// # Errors
    /// [`GraphError::AwaitingDecision`] while a pause waits; [`GraphError::ConcurrentRun`]
    /// while another run holds the thread; a store failure.
    async fn start(
        &self,
        thread: &ThreadId,
        input: TurnInput,
        options: RunOptions,
    ) -> Result<Box<dyn AgentRun>, GraphError>;
    /// Records decisions on a pause of `thread`, and resumes it once all are in.
    ///
    /// # Errors
    /// An unknown interrupt, no pause, a store failure.
    async fn resume(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
        options: RunOptions,
    ) -> Result<Resumed, GraphError>;
    /// Records `decisions` for the thread's pause without continuing it, even when they are
    /// the last: a later [`ChatAgent::resume`] — with them or with the plain yes or no they
    /// cover — continues with them (how a person's edit outlives the request that made it).
    ///
    /// # Errors
    /// An unknown interrupt, a decision that contradicts a recorded one, no pause, a store
    /// failure.
    async fn record_decisions(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
    ) -> Result<(), GraphError>;
    /// Closes a turn its run left mid-way (its replica died); whether there was one.
    ///
    /// # Errors
    /// A store failure.
    async fn close_interrupted(&self, thread: &ThreadId) -> Result<bool, GraphError>;
    /// The thread's checkpoints, oldest first.
    ///
    /// # Errors
    /// A store failure.
    async fn history(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, GraphError>;
    /// The thread's state as checkpoint `seq` left it.
    ///
    /// # Errors
    /// [`GraphError::NotFound`] for a checkpoint the thread lacks; a store failure.
    async fn state_at(&self, thread: &ThreadId, seq: u64) -> Result<StateView, GraphError>;
    /// The thread's state as its last checkpoint left it (`None` before its first): read from
    /// the head this process knows and the records written since.
    ///
    /// # Errors
    /// A store failure.
    async fn current_state(&self, thread: &ThreadId) -> Result<Option<StateView>, GraphError>;
    /// The states checkpoints `seqs` left, in the same order, the thread read once.
    ///
    /// # Errors
    /// [`GraphError::NotFound`] when the thread lacks one of them; a store failure.
    async fn states_at(&self, thread: &ThreadId, seqs: &[u64]) -> Result<Vec<StateView>, GraphError>;
    /// The runs the thread's checkpoints record, oldest first (read from the records written
    /// since this process last asked).
    ///
    /// # Errors
    /// A store failure.
    async fn recorded_runs(&self, thread: &ThreadId) -> Result<Vec<RecordedRun>, GraphError>;
    /// Copies `from`'s checkpoints up to `seq` into `to`.
    ///
    /// # Errors
    /// A store failure.
    async fn fork(&self, from: &ThreadId, seq: u64, to: &ThreadId) -> Result<(), GraphError>;
    /// Writes `values` into `thread`'s state from outside a run, as node `as_node` had
    /// (LangGraph's `update_state`): a new checkpoint; the thread stays idle. Returns its number.
    ///
    /// # Errors
    /// [`GraphError::UnknownNode`], [`GraphError::InvalidUpdate`] (the state refuses the
    /// values: [`ChatState::update_from`], or [`GraphAgent::with_state_updates`]'s check),
    /// [`GraphError::AwaitingDecision`],
    /// [`GraphError::ConcurrentRun`], a store failure.
    async fn update_state(
        &self,
        thread: &ThreadId,
        values: &Map<String, Value>,
        as_node: Option<&str>,
    ) -> Result<u64, GraphError>;
    /// What one of its checkpoint records adds to conversation `conversation`.
    fn project(&self, conversation: i64, record: &CheckpointRecord) -> Projection;
    /// What an interrupt payload of this agent asks a person.
    fn action_request(&self, payload: &Value) -> ActionRequest;
    /// The channels a node's state `update` (its JSON, as its checkpoint stores it) wrote,
    /// each with the value written last — what the doors that stream each node's update tell
    /// besides its messages; `None` when it wrote none.
    fn channel_writes(&self, update: &str) -> Option<Map<String, Value>>;
}

/// A graph state that holds a conversation: what [`GraphAgent`] needs of it.
pub trait ChatState: State {
    /// The update that starts a person's turn.
    fn user_turn(input: TurnInput) -> Self::Update;
    /// The reply the state ends with, if it ends with one.
    fn reply(&self) -> Option<&str>;
    /// What an interrupt payload of this agent asks a person (blank for a foreign one, so it
    /// can still be decided).
    fn action_request(payload: &Value) -> ActionRequest;
    /// What a checkpoint record adds to conversation `conversation`.
    fn project(conversation: i64, record: &CheckpointRecord) -> Projection;
    /// The update that writes `values` (channel name → value) into this state from outside a
    /// run (a person's correction, a message added between turns), checked against the state
    /// as it is; a refusal says what does not fit. By default a state takes none.
    ///
    /// # Errors
    /// A channel the state lacks or does not let a client write, a value that does not fit.
    fn update_from(&self, values: &Map<String, Value>) -> Result<Self::Update, String> {
        let _ = values;
        Err("this agent's state takes no updates from outside a run".to_owned())
    }
    /// The channels a node's update (its JSON) wrote, each with the value written last
    /// ([`ChatAgent::channel_writes`]). By default a state has none to tell.
    fn channel_writes(update: &str) -> Option<Map<String, Value>> {
        let _ = update;
        None
    }
}

/// The pending actions a record's pause adds to conversation `conversation`, one per
/// interrupt, each described by `read` (the state's [`ChatState::action_request`]): what a
/// [`ChatState::project`] adds for a pause.
pub fn pending_actions(
    conversation: i64,
    record: &CheckpointRecord,
    read: impl Fn(&Value) -> ActionRequest,
) -> Vec<NewPending> {
    record
        .interrupts
        .iter()
        .map(|i| {
            let request = read(&i.payload);
            NewPending {
                conversation_id: conversation,
                run_id: record.run_id.clone(),
                interrupt_id: i.id.0.clone(),
                tool_name: request.tool,
                description: request.description,
                arguments: request.arguments,
            }
        })
        .collect()
}

/// How a state takes an update written from outside a run, when its graph says more than
/// the state's type does (see [`GraphAgent::with_state_updates`]).
pub type StateUpdates<S> = Arc<dyn Fn(&S, &Map<String, Value>) -> Result<<S as State>::Update, String> + Send + Sync>;

/// A [`ChatAgent`] over a compiled graph whose state is a [`ChatState`].
pub struct GraphAgent<S: ChatState, C> {
    graph: CompiledGraph<S, C>,
    /// Replaces [`ChatState::update_from`] when set.
    updates: Option<StateUpdates<S>>,
}

impl<S: ChatState, C: Send + Sync + 'static> GraphAgent<S, C> {
    /// The agent that runs `graph`.
    pub fn new(graph: CompiledGraph<S, C>) -> Self {
        Self { graph, updates: None }
    }

    /// The same agent, its state updates from outside a run made by `updates` instead of
    /// [`ChatState::update_from`]: for a state whose graph declares what it may take (a
    /// declared graph's channels and their reducers, which the state's type does not know).
    #[must_use]
    pub fn with_state_updates(mut self, updates: StateUpdates<S>) -> Self {
        self.updates = Some(updates);
        self
    }
}

/// A graph's run, read as turn events.
struct GraphRun<S: ChatState> {
    handle: RunHandle<S>,
}

#[async_trait]
impl<S: ChatState> AgentRun for GraphRun<S> {
    fn run_id(&self) -> &str {
        self.handle.run_id()
    }

    async fn next_event(&mut self) -> Option<RunEvent> {
        self.handle.next_event().await
    }

    async fn finish(self: Box<Self>) -> TurnEnd {
        match self.handle.outcome().await {
            RunOutcome::Completed { state } => TurnEnd::Completed { reply: state.reply().map(str::to_owned) },
            RunOutcome::Interrupted { .. } => TurnEnd::Paused,
            RunOutcome::RecursionLimit { .. } => TurnEnd::RecursionLimit,
            RunOutcome::Cancelled { .. } => TurnEnd::Cancelled,
            RunOutcome::Failed { error, .. } => TurnEnd::Failed(error),
        }
    }
}

#[async_trait]
impl<S: ChatState, C: Send + Sync + 'static> ChatAgent for GraphAgent<S, C> {
    fn shape(&self) -> GraphShape {
        self.graph.shape().clone()
    }

    fn revision(&self) -> Revision {
        Revision { version: self.graph.version().map(str::to_owned), refused: None }
    }

    fn checkpointer(&self) -> &Arc<dyn Checkpointer> {
        self.graph.checkpointer()
    }

    async fn start(
        &self,
        thread: &ThreadId,
        input: TurnInput,
        options: RunOptions,
    ) -> Result<Box<dyn AgentRun>, GraphError> {
        let handle = self.graph.start(thread, S::user_turn(input), options).await?;
        Ok(Box::new(GraphRun { handle }))
    }

    async fn resume(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
        options: RunOptions,
    ) -> Result<Resumed, GraphError> {
        Ok(match self.graph.resume(thread, decisions, options).await? {
            ResumeResult::Started(handle) => Resumed::Started(Box::new(GraphRun { handle })),
            ResumeResult::Waiting { .. } => Resumed::Waiting,
        })
    }

    async fn record_decisions(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
    ) -> Result<(), GraphError> {
        self.graph.record_decisions(thread, decisions).await.map(drop)
    }

    async fn close_interrupted(&self, thread: &ThreadId) -> Result<bool, GraphError> {
        self.graph.close_interrupted(thread).await
    }

    async fn history(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, GraphError> {
        self.graph.history(thread).await
    }

    async fn state_at(&self, thread: &ThreadId, seq: u64) -> Result<StateView, GraphError> {
        Ok(view(self.graph.state_at(thread, seq).await?))
    }

    async fn current_state(&self, thread: &ThreadId) -> Result<Option<StateView>, GraphError> {
        Ok(self.graph.thread_state(thread).await?.map(view))
    }

    async fn states_at(&self, thread: &ThreadId, seqs: &[u64]) -> Result<Vec<StateView>, GraphError> {
        Ok(self.graph.states_at(thread, seqs).await?.into_iter().map(view).collect())
    }

    async fn recorded_runs(&self, thread: &ThreadId) -> Result<Vec<RecordedRun>, GraphError> {
        self.graph.recorded_runs(thread).await
    }

    async fn fork(&self, from: &ThreadId, seq: u64, to: &ThreadId) -> Result<(), GraphError> {
        self.graph.fork(from, seq, to).await
    }

    async fn update_state(
        &self,
        thread: &ThreadId,
        values: &Map<String, Value>,
        as_node: Option<&str>,
    ) -> Result<u64, GraphError> {
        match &self.updates {
            Some(updates) => self.graph.update_state(thread, as_node, |state| updates(state, values)).await,
            None => self.graph.update_state(thread, as_node, |state| state.update_from(values)).await,
        }
    }

    fn project(&self, conversation: i64, record: &CheckpointRecord) -> Projection {
        S::project(conversation, record)
    }

    fn action_request(&self, payload: &Value) -> ActionRequest {
        S::action_request(payload)
    }

    fn channel_writes(&self, update: &str) -> Option<Map<String, Value>> {
        S::channel_writes(update)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_is_taken_as_its_question_takes_it() {
        let choice = json!({"enum": ["desktop", "mobile", "web"]});
        assert_eq!(check_answer(Some(&choice), &json!(" Web ")), Ok(json!("web")), "a person's spelling of a choice");
        assert!(check_answer(Some(&choice), &json!("the web one")).unwrap_err().contains("does not fit the form"));
        assert!(check_answer(Some(&json!({"enum": [1, 2]})), &json!(2)).is_ok());
        let form = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert_eq!(check_answer(Some(&form), &json!({"n": 3})), Ok(json!({"n": 3})));
        assert!(check_answer(Some(&form), &json!({"n": "three"})).is_err());
        assert_eq!(check_answer(None, &json!("  the web app ")), Ok(json!("the web app")), "free text, trimmed");
        assert!(check_answer(None, &json!("   ")).is_err() && check_answer(None, &json!(7)).is_err());
        assert!(check_answer(None, &json!("x".repeat(MAX_ANSWER_CHARS + 1))).unwrap_err().contains("longer than"));
    }
}
