//! The backend-callback store of seed 002: conversations, messages and pending actions live
//! in the backend that fronts the service, reached through HMAC-signed calls to its
//! `/internal/chatbot/**` endpoints.
//!
//! - [`BackendConversationStore`] (the calling side) implements [`ConversationStore`] over
//!   those calls.
//! - [`callback_router`] (the receiving side) serves the same surface over any
//!   [`ConversationStore`], verifying every call with [`HmacVerifier`]: a backend written in
//!   Rust mounts it as is; one written in another language reads it as the executable
//!   contract (the end-to-end suite runs the whole service through it).
//!
//! - [`backend_general_query`] and [`BackendWriteTool`] are seed 002's tools run by the
//!   backend (`query`, `tools/{toolName}`), for a service that never opens a tenant data
//!   connection; [`tenant_schema_prompt`] puts the tenant's schema (`schema`) in the system
//!   prompt.
//!
//! The seed names `conversations`, `save-message`, `pending-action`, `history`, `query`, `tools/{toolName}` and `schema`; the rest of
//! the surface (turn claims, decisions, lookups, deletion) is where the seed was silent,
//! because there the backend, not the worker, kept those rules. Every body is JSON in camel
//! case and carries a random `nonce`, so two identical calls within a second still have
//! different signatures (a verifier accepts each signature once).
//!
//! [`ConversationStore`]: crate::store::ConversationStore
//! [`HmacVerifier`]: crate::auth::HmacVerifier

mod client;
mod receiver;
mod schema;
mod tools;
pub mod wire;

pub use client::{BackendConversationStore, BackendOptions};
pub use receiver::callback_router;
pub use schema::{SCHEMA_TTL, tenant_schema_prompt};
pub use tools::{BackendWriteTool, backend_general_query};
