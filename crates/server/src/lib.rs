//! The toolgraph chat service: the chat contract (docs/service.md) over HTTP and SSE.
//!
//! Owns: the routes (`/health`, `/ready`, `/metrics`, `/api/chatbot/stream`,
//! `/api/chatbot/confirm`, `/api/chatbot/runs/{runId}/events`, the `DELETE` data endpoints,
//! `POST /search`, and the LangGraph, OpenAI, AG-UI and MCP doors) — thin layers that parse, call
//! the [`ChatService`] and answer, with errors naming the field, each described in the OpenAPI
//! document served at `/openapi.json` ([`openapi_document`], assembled by `routes` from the
//! handlers' descriptions and `openapi`'s shared parts); the [`ChatService`] itself (turns as detached runs whose frames are logged
//! for replay, decisions on pending actions, deletion), request authentication ([`auth`]),
//! metrics, the HTTP listener ([`HttpServer`]) and graceful shutdown; and the receiving side of
//! the backend callbacks ([`callback_router`]).
//!
//! Does not own: agents (the agents crate builds them), conversation storage (the
//! conversations crate), or configuration loading.
//!
//! [`router`] returns a plain axum `Router`, so tests can drive it with or without a socket.

mod agui;
pub mod auth;
mod callbacks;
mod error;
mod extract;
mod hosts;
mod langgraph;
mod listen;
mod mcp;
mod metrics;
mod openai;
mod openapi;
mod playground;
mod routes;
mod runlog;
mod service;
mod shared_runs;
mod sse;
mod wire;

pub use callbacks::{callback_router, require_signature};
pub use error::ChatError;
pub use hosts::{AllowedHosts, guard_hosts};
pub use listen::HttpServer;
pub use mcp::{McpEndpoint, MemoryResources, memory_uri};
pub use metrics::Metrics;
pub use playground::playground_router;
pub use routes::{api_router, openapi_document, ops_router, router};
pub use service::{
    AttachedDocument, Attachments, BudgetPeriod, BudgetStatus, ChatService, CheckpointView, Confirmed,
    INTERRUPTED_ERROR, MAX_ATTACHED_PER_TURN, MAX_UPLOAD_BYTES, NewTurn, Pruned, Retention, ServedAgent,
    ServiceOptions, TokenBudget, UploadReceipt,
};
pub use wire::{
    AnswerRequest, ConfirmRequest, ConfirmResponse, MAX_LISTED_CONVERSATIONS, MAX_MESSAGE_CHARS, PendingActionDto,
    StreamRequest,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Shared state of the HTTP layer: the chat service, readiness, and the search service.
/// Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    chat: ChatService,
    ready: AtomicBool,
    search: std::sync::OnceLock<SearchService>,
    mcp: std::sync::OnceLock<McpEndpoint>,
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

impl AppState {
    /// The HTTP layer over `chat`. It answers 503 on `/ready` and the chat routes until
    /// [`AppState::set_ready`].
    pub fn new(chat: ChatService) -> Self {
        Self(Arc::new(Inner {
            chat,
            ready: AtomicBool::new(false),
            search: std::sync::OnceLock::new(),
            mcp: std::sync::OnceLock::new(),
        }))
    }

    /// The chat service the routes call.
    pub fn chat(&self) -> &ChatService {
        &self.0.chat
    }

    /// Serves `POST /search` from `search` (without it, the route answers 404
    /// `{ok:false}`). Only the first call has an effect.
    pub fn enable_search(&self, search: SearchService) {
        let _ = self.0.search.set(search);
    }

    /// Serves MCP on `/mcp` from `endpoint` (without it, the route answers 404). Only the first
    /// call has an effect.
    pub fn enable_mcp(&self, endpoint: McpEndpoint) {
        let _ = self.0.mcp.set(endpoint);
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
        self.0.chat.metrics()
    }

    /// Shutdown, in the contract's order: `/ready` turns 503 and new turns are refused,
    /// in-flight runs are cancelled (each records why and releases its conversation), and the
    /// caller closes the stores after this returns.
    pub async fn shutdown(&self) {
        self.0.ready.store(false, Ordering::SeqCst);
        self.0.chat.shutdown().await;
    }
}
