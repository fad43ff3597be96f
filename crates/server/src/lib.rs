//! The toolgraph chat service: the Lumie worker contract (SPEC §4) over HTTP and SSE.
//!
//! Owns: the routes (`/health`, `/ready`, `/metrics`, `/api/chatbot/stream`,
//! `/api/chatbot/confirm`, `/api/chatbot/runs/{runId}/events`, the `DELETE` data endpoints),
//! request validation with errors naming the field, detached runs whose frames are logged for
//! replay, the conversation store ([`store`], or the backend's through [`backend`], which also
//! runs seed 002's delegated tools), metrics, the HTTP listener ([`HttpServer`]) and graceful
//! shutdown.
//!
//! Does not own: agents (built by the caller from the graph crate) or configuration loading.
//!
//! [`router`] returns a plain axum `Router`, so tests can drive it with or without a socket.

pub mod auth;
pub mod backend;
mod error;
mod extract;
mod listen;
mod metrics;
mod projection;
mod routes;
mod runlog;
pub mod store;
mod store_pg;
mod turn;
mod wire;

pub use listen::HttpServer;
pub use metrics::Metrics;
pub use projection::ProjectingCheckpointer;
pub use routes::{api_router, ops_router, router};
pub use store_pg::PostgresConversationStore;
pub use wire::{ConfirmRequest, ConfirmResponse, Done, MAX_MESSAGE_CHARS, PendingActionDto, StreamRequest};

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

/// Service-wide policies.
pub struct ServiceOptions {
    /// How requests are authenticated.
    pub auth: auth::Auth,
    /// Most runs one tenant may have in flight; more get 429 with `Retry-After` (0: no limit).
    pub max_runs_per_tenant: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self { auth: auth::Auth::None, max_runs_per_tenant: 0 }
    }
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
    options: ServiceOptions,
    tenant_slots: std::sync::Mutex<std::collections::HashMap<i64, Arc<tokio::sync::Semaphore>>>,
    search: std::sync::OnceLock<SearchService>,
}

/// The knowledge bases `POST /search` answers from.
#[derive(Clone, Debug)]
pub struct SearchService {
    /// Where the knowledge bases are.
    pub store: Arc<toolgraph_rag::KbStore>,
    /// The knowledge base a request that names none searches.
    pub default_kb: String,
    /// Picks the mode and embeds queries.
    pub retriever: toolgraph_rag::Retriever,
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
        options: ServiceOptions,
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
            options,
            tenant_slots: std::sync::Mutex::new(std::collections::HashMap::new()),
            search: std::sync::OnceLock::new(),
        }))
    }

    /// Serves `POST /search` from `search` (without it, the route answers 404
    /// `{ok:false}`). Only the first call has an effect.
    pub fn enable_search(&self, search: SearchService) {
        let _ = self.0.search.set(search);
    }

    /// Marks start-up finished.
    pub fn set_ready(&self) {
        self.0.ready.store(true, Ordering::SeqCst);
    }

    fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::SeqCst)
    }

    /// A run slot of `tenant`, held by the run until it ends; 429 when all are taken.
    fn admit(&self, tenant: i64) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, error::ApiError> {
        let limit = self.0.options.max_runs_per_tenant;
        if limit == 0 {
            return Ok(None);
        }
        let slots = {
            let mut map = self.0.tenant_slots.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(map.entry(tenant).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(limit))))
        };
        slots.try_acquire_owned().map(Some).map_err(|_| {
            let mut e = error::ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                format!("this tenant already has {limit} runs in flight"),
            );
            e.retry_after = Some(1);
            e
        })
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
