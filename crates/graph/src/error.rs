//! Errors of building and running graphs.

use crate::checkpoint::CheckpointError;
use crate::interrupt::InterruptId;

/// A graph that cannot be compiled; caught before anything runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphBuildError {
    /// Two nodes share a name, or a node uses a reserved name.
    #[error("node '{0}' is defined twice or uses a reserved name")]
    DuplicateNode(String),
    /// An edge names a node that does not exist.
    #[error("edge from '{from}' goes to unknown node '{to}'")]
    UnknownNode {
        /// Source.
        from: String,
        /// Missing target.
        to: String,
    },
    /// An edge starts at a node that does not exist.
    #[error("an edge starts at unknown node '{0}'")]
    UnknownSource(String),
    /// Nothing leaves START.
    #[error("the graph has no edge from START")]
    NoEntry,
    /// A node has no outgoing edge.
    #[error("node '{0}' has no outgoing edge (add one to END if it finishes the run)")]
    NoExit(String),
    /// A node has two outgoing edges.
    #[error("node '{0}' has more than one outgoing edge; use one conditional edge to branch")]
    TwoExits(String),
    /// A node cannot be reached from START.
    #[error("node '{0}' cannot be reached from START")]
    Unreachable(String),
    /// A conditional edge lists no targets.
    #[error("the conditional edge from '{0}' lists no targets")]
    EmptyRouter(String),
    /// An interrupt's resume node does not exist.
    #[error("node '{from}' resumes at unknown node '{to}'")]
    UnknownResume {
        /// Pausing node.
        from: String,
        /// Missing resume node.
        to: String,
    },
}

/// A node's failure. Ends the run with [`GraphError::Node`]; the last checkpoint stays.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    /// What went wrong, readable.
    pub message: String,
    /// A short machine-readable class (e.g. `model`, `panic`).
    pub kind: &'static str,
}

impl NodeError {
    /// A failure of class `kind`.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

/// Why a run could not start, resume or continue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// Another run is active on the thread (or wrote first): runs never interleave.
    #[error("another run is active on thread '{thread}'")]
    ConcurrentRun {
        /// The thread.
        thread: String,
    },
    /// The thread is paused for decisions (undecided, or decided and to be applied by
    /// resuming); resume it before starting a new turn.
    #[error("thread '{thread}' is paused for {pending} decision(s) to be applied")]
    AwaitingDecision {
        /// The thread.
        thread: String,
        /// How many.
        pending: usize,
    },
    /// Resume named an interrupt that is not pending on the thread.
    #[error("interrupt '{0}' is not pending on this thread")]
    UnknownInterrupt(InterruptId),
    /// A decision contradicts one already recorded.
    #[error("interrupt '{0}' was already decided the other way")]
    ConflictingDecision(InterruptId),
    /// Nothing to resume.
    #[error("thread '{0}' has nothing to resume")]
    NothingToResume(String),
    /// A state update named a node the graph does not have.
    #[error("the graph has no node '{0}'")]
    UnknownNode(String),
    /// A state update the state cannot take (a channel it lacks, a value that does not fit).
    #[error("the update does not fit the state: {0}")]
    InvalidUpdate(String),
    /// No such thread or checkpoint.
    #[error("thread '{thread}' has no checkpoint {seq:?}")]
    NotFound {
        /// Thread.
        thread: String,
        /// Checkpoint, if one was named.
        seq: Option<u64>,
    },
    /// A node failed.
    #[error("node '{node}' failed: {source}")]
    Node {
        /// Node name.
        node: String,
        /// The failure.
        #[source]
        source: NodeError,
    },
    /// A stored update or state could not be (de)serialised.
    #[error("cannot (de)serialise graph state: {0}")]
    Serde(#[from] serde_json::Error),
    /// The checkpoint store failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}
