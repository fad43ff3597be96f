//! The backend-callback store: conversations, messages and pending actions live in the backend
//! that fronts the service (the academy-admin deployment, docs/service.md), reached through
//! HMAC-signed calls to its `/internal/chatbot/**` endpoints.
//!
//! - [`BackendConversationStore`] (the calling side) implements [`ConversationStore`] over
//!   those calls; its [`post_for_tenant`](BackendConversationStore::post_for_tenant) and
//!   [`get_for_tenant`](BackendConversationStore::get_for_tenant) also carry the backend's data
//!   calls (`query`, `tools/{toolName}`, `schema`), which the agents crate turns into tools.
//! - [`wire`] holds every body and path, shared with the receiving side (the server crate's
//!   `callback_router`), so the two cannot drift apart.
//! - [`signing`] is the HMAC scheme both sides use (v2: method, path, query, tenant slug, body
//!   digest and nonce), and [`replay`] where a verifier records the nonces it accepted (in
//!   process, or in PostgreSQL shared by replicas).
//!
//! The contract names `conversations`, `save-message`, `pending-action`, `history`, `query`,
//! `tools/{toolName}` and `schema`; the rest of the surface (turn claims, decisions, lookups,
//! deletion) is where it was silent, because there the backend, not the worker, kept those
//! rules. Every body is JSON in camel case and carries a random `nonce`; each call's signature
//! has its own (`X-Nonce`), which a verifier accepts once.
//!
//! [`ConversationStore`]: crate::ConversationStore

mod client;
pub mod replay;
pub mod signing;
pub mod wire;

pub use client::{BackendConversationStore, BackendOptions, CallFailure, error_reason};
