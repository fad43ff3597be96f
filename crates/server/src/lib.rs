//! The toolgraph chat service: the Lumie worker contract (SPEC §4) over HTTP and SSE.
//!
//! Owns: the routes (`/health`, `/ready`, `/metrics`, `/api/chatbot/stream`,
//! `/api/chatbot/confirm`, `/api/chatbot/runs/{runId}/events`, the `DELETE` data endpoints),
//! request validation with errors naming the field, detached runs whose frames are logged for
//! replay, the conversation store ([`store`]), metrics and graceful shutdown.
//!
//! Does not own: agents (built by the caller from the graph crate) or configuration loading.
//!
//! [`router`] returns a plain axum `Router`, so tests can drive it with or without a socket.

mod error;
mod extract;
mod metrics;
mod routes;
mod runlog;
pub mod store;
mod turn;
mod wire;

pub use metrics::Metrics;
pub use routes::router;
pub use wire::{ConfirmResponse, MAX_MESSAGE_CHARS, PendingActionDto};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use store::ConversationStore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolgraph_config::AgentSettings;
use toolgraph_graph::react::{AgentDeps, AgentState};
use toolgraph_graph::{Checkpointer, CompiledGraph};

/// One agent the service can run.
pub struct ServedAgent {
    /// Its graph.
    pub graph: CompiledGraph<AgentState, AgentDeps>,
    /// Its settings (state keys, recursion limit).
    pub settings: AgentSettings,
}

/// Shared state of the service. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    agents: BTreeMap<String, ServedAgent>,
    default_agent: String,
    store: Arc<dyn ConversationStore>,
    checkpointer: Arc<dyn Checkpointer>,
    runs: runlog::RunLogs,
    metrics: Metrics,
    ready: AtomicBool,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// A run that has held a conversation longer than this without finishing is taken to have
/// died with its process, and the conversation is free again.
pub const STALE_TURN: Duration = Duration::from_secs(600);

impl AppState {
    /// The service over `agents` (by name), `store` and the checkpoint store the agents use.
    /// It answers 503 on `/ready` and the chat routes until [`AppState::set_ready`].
    pub fn new(
        agents: BTreeMap<String, ServedAgent>,
        default_agent: String,
        store: Arc<dyn ConversationStore>,
        checkpointer: Arc<dyn Checkpointer>,
    ) -> Self {
        Self(Arc::new(Inner {
            agents,
            default_agent,
            store,
            checkpointer,
            runs: runlog::RunLogs::default(),
            metrics: Metrics::default(),
            ready: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }))
    }

    /// Marks start-up finished.
    pub fn set_ready(&self) {
        self.0.ready.store(true, Ordering::SeqCst);
    }

    fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::SeqCst)
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// Shutdown, in the seed's order: `/ready` turns 503 and new turns are refused, in-flight
    /// runs are cancelled (each records why and releases its conversation), and the caller
    /// closes the stores after this returns.
    pub async fn shutdown(&self) {
        self.0.ready.store(false, Ordering::SeqCst);
        self.0.shutdown.cancel();
        self.0.tasks.close();
        self.0.tasks.wait().await;
    }
}
