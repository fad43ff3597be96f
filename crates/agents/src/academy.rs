//! The academy admin (the Lumie worker, docs/service.md): an assistant over a tenant's school
//! data that reads with SQL and writes (announcements, messages) only after a person approved.
//!
//! Its tools: `general_query` over a local SQLite database ([`sql`]) or run by the backend that
//! fronts the service ([`backend_general_query`]), the backend's write tools
//! ([`BackendWriteTool`]), and the tenant's schema in the system prompt
//! ([`tenant_schema_prompt`]).

mod backend_tools;
mod schema_prompt;
pub mod sql;

pub use backend_tools::{BackendWriteTool, backend_general_query};
pub use schema_prompt::{SCHEMA_TTL, tenant_schema_prompt};
