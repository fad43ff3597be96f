//! Nodes: async functions over shared state and a run context, and the two virtual nodes
//! every graph has, [`START`] and [`END`].

use crate::error::NodeError;
use crate::event::{RunEvent, TokenUsage};
use crate::interrupt::{Decision, InterruptRequest};
use crate::state::State;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

/// The virtual node a run enters by.
pub const START: &str = "__start__";
/// The virtual node that ends a run.
pub const END: &str = "__end__";

/// What a node produced.
pub enum NodeOutput<S: State> {
    /// An update to apply; routing continues by the node's edge.
    Update(S::Update),
    /// Pause for people: `update` is the work done before the pause (checkpointed now and
    /// never redone), `requests` what must be decided, and `resume_at` the node that runs
    /// once every request is decided, with the decisions in [`RunContext::decisions`].
    Interrupt {
        /// Work done before the pause.
        update: S::Update,
        /// One request per decision needed.
        requests: Vec<InterruptRequest>,
        /// Node to continue at.
        resume_at: String,
    },
}

/// What a node may use besides the state: the injected dependencies (model, tools, stores —
/// dependencies a node is given, not tools a model chooses), the event stream, and on resume the
/// decisions keyed by the node's own request keys.
pub struct RunContext<C> {
    pub(crate) deps: Arc<C>,
    pub(crate) events: crate::event::EventSender,
    pub(crate) decisions: Arc<BTreeMap<String, Decision>>,
    pub(crate) run_id: Arc<str>,
    pub(crate) thread: Arc<str>,
    pub(crate) node: Arc<str>,
    pub(crate) step: u32,
}

impl<C> Clone for RunContext<C> {
    fn clone(&self) -> Self {
        Self {
            deps: Arc::clone(&self.deps),
            events: self.events.clone(),
            decisions: Arc::clone(&self.decisions),
            run_id: Arc::clone(&self.run_id),
            thread: Arc::clone(&self.thread),
            node: Arc::clone(&self.node),
            step: self.step,
        }
    }
}

impl<C> RunContext<C> {
    /// The injected dependencies.
    pub fn deps(&self) -> &C {
        &self.deps
    }

    /// This context with `deps` instead of the graph's: for a node that runs a step of another
    /// agent inside this graph (a sub-graph's node), which must use that agent's tools and
    /// settings, not its host's. Events, decisions and ids stay the run's.
    #[must_use]
    pub fn with_deps(&self, deps: Arc<C>) -> Self {
        Self { deps, ..self.clone() }
    }

    /// Decisions by request key; empty unless this node is a resume point.
    pub fn decisions(&self) -> &BTreeMap<String, Decision> {
        &self.decisions
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The thread's id.
    pub fn thread(&self) -> &str {
        &self.thread
    }

    /// The name of the node running.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Step number of this node within the run.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// Emits an event to the run's consumer. Waits while the bounded event queue is full;
    /// if nobody listens any more the event is dropped and the run goes on.
    pub async fn emit(&self, event: RunEvent) {
        let _ = self.events.send(event).await;
    }

    /// Streams `data` to the run's consumer as this node's own ([`RunEvent::Custom`]): what a
    /// LangGraph node writes with `get_stream_writer()`, served as the `custom` stream mode
    /// (docs/graph.md, "Streaming a node's own data"). Not part of the state: a consumer that
    /// does not listen loses nothing the run keeps.
    pub async fn write_custom(&self, data: Value) {
        self.emit(RunEvent::Custom { node: self.node.to_string(), data }).await;
    }

    /// Runs `call`, a model call this node makes, between [`RunEvent::ModelCallStarted`] and
    /// [`RunEvent::ModelCallFinished`], so a consumer times and traces every model call
    /// whichever node makes it; `ok` says whether its output counts as a success.
    pub async fn model_call<T>(&self, call: impl Future<Output = T>, ok: impl FnOnce(&T) -> bool) -> T {
        self.counted_model_call(call, |out| (ok(out), None)).await
    }

    /// As [`model_call`](Self::model_call), with the tokens the call used (`report` reads
    /// success and usage from its output), so a consumer counts them by agent and model.
    pub async fn counted_model_call<T>(
        &self,
        call: impl Future<Output = T>,
        report: impl FnOnce(&T) -> (bool, Option<TokenUsage>),
    ) -> T {
        self.emit(RunEvent::ModelCallStarted { node: self.node.to_string() }).await;
        let out = call.await;
        let (ok, usage) = report(&out);
        self.emit(RunEvent::ModelCallFinished { node: self.node.to_string(), ok, usage }).await;
        out
    }
}

/// A graph node.
#[async_trait]
pub trait Node<S: State, C>: Send + Sync + 'static {
    /// Runs the node on the current state.
    async fn run(&self, state: Arc<S>, ctx: RunContext<C>) -> Result<NodeOutput<S>, NodeError>;
}

#[async_trait]
impl<S, C, F, Fut> Node<S, C> for F
where
    S: State,
    C: Send + Sync + 'static,
    F: Fn(Arc<S>, RunContext<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<NodeOutput<S>, NodeError>> + Send + 'static,
{
    async fn run(&self, state: Arc<S>, ctx: RunContext<C>) -> Result<NodeOutput<S>, NodeError> {
        self(state, ctx).await
    }
}
