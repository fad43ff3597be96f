//! [`VersionedAgent`]: one agent whose definition can change while it serves (docs/agents.md,
//! "Changing a graph while serving").
//!
//! New turns run on the version installed last; a run paused or cut short on an older version
//! is resumed or closed by that version, read from the `graph_version` its thread's last
//! checkpoint records, so a paused approval still finds the nodes it paused in. Older versions
//! stay loaded (the last [`KEPT_VERSIONS`]) for as long as the process runs. A thread whose
//! version this process never loaded (it paused before a restart, or on another replica) is
//! resumed on its version built again by the agent's [`VersionBuilder`] (from the sources the
//! checkpoint store kept of it: `assembly::KeptVersions`), and on the current one when it
//! cannot be (nothing kept, or what was kept does not build with today's configuration: said in
//! the log, not tried again until the next install). A definition that failed its checks is
//! remembered as [`Refused`] until one passes.

use crate::chat_agent::{AgentRun, ChatAgent, Refused, Resumed, Revision, StateView, TurnInput};
use async_trait::async_trait;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};
use toolgraph_conversations::Projection;
use toolgraph_graph::{
    CheckpointMeta, CheckpointRecord, Checkpointer, Decision, GraphError, GraphShape, InterruptId, RecordedRun,
    RunOptions, ThreadId,
};

/// How many versions older than the current one stay loaded for the runs paused on them.
pub const KEPT_VERSIONS: usize = 16;

/// An agent served on its latest definition, older runs finishing on theirs. Cheap to clone:
/// clones share the versions (the reloader keeps one, the service another).
#[derive(Clone)]
pub struct VersionedAgent {
    shared: Arc<Shared>,
}

struct Shared {
    checkpointer: Arc<dyn Checkpointer>,
    versions: RwLock<Versions>,
    builder: Option<Arc<dyn VersionBuilder>>,
}

/// Builds an agent again at a version the process has not loaded.
#[async_trait]
pub trait VersionBuilder: Send + Sync + 'static {
    /// The agent at `version`, or `None` when nothing was kept of that version.
    ///
    /// # Errors
    /// Why what was kept could not be built (said in the log; the current version resumes).
    async fn build(&self, version: &str) -> Result<Option<Arc<dyn ChatAgent>>, String>;
}

struct Versions {
    current: Arc<dyn ChatAgent>,
    version: Option<String>,
    older: VecDeque<(String, Arc<dyn ChatAgent>)>,
    refused: Option<Refused>,
    /// Versions the builder could not build, not tried again until the next install.
    unbuildable: std::collections::HashSet<String>,
}

/// What [`VersionedAgent::install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The version was already the current one.
    Unchanged,
    /// New turns now run on it; `previous` was current before.
    Replaced {
        /// The version it replaced.
        previous: Option<String>,
    },
}

impl VersionedAgent {
    /// Serves `agent` (its [`Revision::version`] names it).
    pub fn new(agent: Arc<dyn ChatAgent>) -> Self {
        Self::with_builder(agent, None)
    }

    /// Serves `agent`; threads paused on a version the process has not loaded resume on the
    /// one `builder` builds.
    pub fn rebuilding(agent: Arc<dyn ChatAgent>, builder: Arc<dyn VersionBuilder>) -> Self {
        Self::with_builder(agent, Some(builder))
    }

    fn with_builder(agent: Arc<dyn ChatAgent>, builder: Option<Arc<dyn VersionBuilder>>) -> Self {
        let checkpointer = Arc::clone(agent.checkpointer());
        let version = agent.revision().version;
        let versions = Versions {
            current: agent,
            version,
            older: VecDeque::new(),
            refused: None,
            unbuildable: Default::default(),
        };
        Self { shared: Arc::new(Shared { checkpointer, versions: RwLock::new(versions), builder }) }
    }

    /// Makes `agent` the version new turns run on; the current one stays loaded for the runs
    /// paused on it. A refusal on record is cleared.
    pub fn install(&self, agent: Arc<dyn ChatAgent>) -> Installed {
        let version = agent.revision().version;
        let mut v = self.write();
        v.refused = None;
        v.unbuildable.clear();
        if version.is_some() && version == v.version {
            return Installed::Unchanged;
        }
        let previous = v.version.take();
        let old = std::mem::replace(&mut v.current, agent);
        v.version = version.clone();
        if let Some(p) = &previous {
            v.older.retain(|(name, _)| Some(name) != version.as_ref() && name != p);
            v.older.push_front((p.clone(), old));
            v.older.truncate(KEPT_VERSIONS);
        }
        Installed::Replaced { previous }
    }

    /// Records that a newer definition (`version`) failed its checks with `errors`; the
    /// current one keeps serving.
    pub fn refuse(&self, version: String, errors: Vec<String>) {
        self.write().refused = Some(Refused { version, errors });
    }

    /// Forgets a refusal on record (the file is back to the version that serves).
    pub fn clear_refusal(&self) {
        if self.read().refused.is_some() {
            self.write().refused = None;
        }
    }

    /// The version new turns run on.
    pub fn version(&self) -> Option<String> {
        self.read().version.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Versions> {
        // A panic while holding the lock leaves plain data in a consistent state: every
        // write above replaces whole fields.
        self.shared.versions.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Versions> {
        self.shared.versions.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn current(&self) -> Arc<dyn ChatAgent> {
        Arc::clone(&self.read().current)
    }

    /// The version that wrote `thread`'s last checkpoint: loaded, or built again from what
    /// was kept of it; the current one when neither.
    async fn of_thread(&self, thread: &ThreadId) -> Result<Arc<dyn ChatAgent>, GraphError> {
        let store = &self.shared.checkpointer;
        let Some((seq, _)) = store.head(thread).await? else { return Ok(self.current()) };
        let recorded = store.load_from(thread, seq).await?.pop().and_then(|r| r.graph_version);
        let Some(recorded) = recorded else { return Ok(self.current()) };
        if let Some(agent) = self.loaded(&recorded) {
            return Ok(agent);
        }
        let tried = self.read().unbuildable.contains(&*recorded);
        let why = match &self.shared.builder {
            None => "nothing builds older versions".to_owned(),
            Some(_) if tried => "it could not be built before".to_owned(),
            Some(builder) => match builder.build(&recorded).await {
                Ok(Some(agent)) if agent.revision().version.as_deref() == Some(&*recorded) => {
                    tracing::info!(%thread, version = %recorded, "built again the version this thread paused on");
                    return Ok(self.keep_older(recorded.to_string(), agent));
                }
                Ok(Some(agent)) => {
                    format!("what was kept builds version {}", agent.revision().version.as_deref().unwrap_or("-"))
                }
                Ok(None) => "nothing was kept of it".to_owned(),
                Err(e) => e,
            },
        };
        if !tried {
            self.write().unbuildable.insert(recorded.to_string());
        }
        tracing::warn!(
            %thread,
            recorded = %recorded,
            current = self.version().as_deref().unwrap_or("-"),
            why = %why,
            "the version this thread paused on cannot be loaded; the current one resumes it"
        );
        Ok(self.current())
    }

    /// Version `version`, when loaded.
    fn loaded(&self, version: &str) -> Option<Arc<dyn ChatAgent>> {
        let v = self.read();
        if v.version.as_deref() == Some(version) {
            return Some(Arc::clone(&v.current));
        }
        v.older.iter().find(|(name, _)| name == version).map(|(_, agent)| Arc::clone(agent))
    }

    /// Keeps `agent`, built again at `version`, among the older versions (the one already
    /// there when another resume built it first); returns the one kept.
    fn keep_older(&self, version: String, agent: Arc<dyn ChatAgent>) -> Arc<dyn ChatAgent> {
        let mut v = self.write();
        if let Some((_, kept)) = v.older.iter().find(|(name, _)| *name == version) {
            return Arc::clone(kept);
        }
        if v.older.len() >= KEPT_VERSIONS {
            v.older.pop_back();
        }
        v.older.push_back((version, Arc::clone(&agent)));
        agent
    }
}

#[async_trait]
impl ChatAgent for VersionedAgent {
    fn shape(&self) -> GraphShape {
        self.read().current.shape()
    }

    fn revision(&self) -> Revision {
        let v = self.read();
        Revision { version: v.version.clone(), refused: v.refused.clone() }
    }

    fn checkpointer(&self) -> &Arc<dyn Checkpointer> {
        &self.shared.checkpointer
    }

    async fn start(
        &self,
        thread: &ThreadId,
        input: TurnInput,
        options: RunOptions,
    ) -> Result<Box<dyn AgentRun>, GraphError> {
        self.current().start(thread, input, options).await
    }

    async fn resume(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
        options: RunOptions,
    ) -> Result<Resumed, GraphError> {
        self.of_thread(thread).await?.resume(thread, decisions, options).await
    }

    async fn record_decisions(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
    ) -> Result<(), GraphError> {
        self.of_thread(thread).await?.record_decisions(thread, decisions).await
    }

    async fn close_interrupted(&self, thread: &ThreadId) -> Result<bool, GraphError> {
        self.of_thread(thread).await?.close_interrupted(thread).await
    }

    async fn history(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, GraphError> {
        self.current().history(thread).await
    }

    async fn state_at(&self, thread: &ThreadId, seq: u64) -> Result<StateView, GraphError> {
        self.current().state_at(thread, seq).await
    }

    async fn current_state(&self, thread: &ThreadId) -> Result<Option<StateView>, GraphError> {
        self.current().current_state(thread).await
    }

    async fn states_at(&self, thread: &ThreadId, seqs: &[u64]) -> Result<Vec<StateView>, GraphError> {
        self.current().states_at(thread, seqs).await
    }

    async fn recorded_runs(&self, thread: &ThreadId) -> Result<Vec<RecordedRun>, GraphError> {
        self.current().recorded_runs(thread).await
    }

    async fn fork(&self, from: &ThreadId, seq: u64, to: &ThreadId) -> Result<(), GraphError> {
        self.current().fork(from, seq, to).await
    }

    async fn update_state(
        &self,
        thread: &ThreadId,
        values: &serde_json::Map<String, serde_json::Value>,
        as_node: Option<&str>,
    ) -> Result<u64, GraphError> {
        // Only an idle thread takes an update, and its next turn runs the current version.
        self.current().update_state(thread, values, as_node).await
    }

    fn project(&self, conversation: i64, record: &CheckpointRecord) -> Projection {
        self.read().current.project(conversation, record)
    }

    fn action_request(&self, payload: &serde_json::Value) -> crate::chat_agent::ActionRequest {
        self.read().current.action_request(payload)
    }

    fn channel_writes(&self, update: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
        // Every version's state is the same type: its updates read alike.
        self.read().current.channel_writes(update)
    }
}
