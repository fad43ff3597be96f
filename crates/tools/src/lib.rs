//! Typed tools for toolgraph agents.
//!
//! Owns: describing a tool to a model ([`ToolSpec`], its JSON Schema generated from a Rust
//! type), validating the model's arguments against that schema, running the tool with a
//! timeout and panic isolation, and turning every result into one [`ToolOutcome`] shape
//! (docs/tools.md). Also owns the [`ToolRegistry`] an agent's tools are looked up in, and the
//! built-in tools.
//!
//! Does not own: deciding *whether* a write tool may run (human approval lives in the graph
//! layer), nor talking to a model (the `llm` crate).
//!
//! ```
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use serde_json::json;
//! use toolgraph_tools::{ToolBuilder, ToolContext, ToolRegistry};
//!
//! /// Add two numbers.
//! #[derive(Deserialize, JsonSchema)]
//! struct AddArgs {
//!     /// The first number.
//!     a: f64,
//!     /// The second number.
//!     b: f64,
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let add = ToolBuilder::<AddArgs>::new("add", "Add two numbers")
//!     .handler(|_ctx, args| async move { Ok(json!({ "sum": args.a + args.b })) })
//!     .unwrap();
//! let mut registry = ToolRegistry::new();
//! registry.register(add).unwrap();
//!
//! let outcome = registry.call(&ToolContext::default(), "add", &json!({"a": 2, "b": 40})).await;
//! assert_eq!(outcome.to_json(), json!({ "sum": 42.0 }));
//!
//! // Arguments that break the schema come back as an outcome the model can read and repair.
//! let outcome = registry.call(&ToolContext::default(), "add", &json!({"a": "two"})).await;
//! assert_eq!(outcome.to_json()["kind"], "invalid_arguments");
//! # });
//! ```
#![warn(missing_docs)]

pub mod builtin;
mod context;
pub mod describe;
mod outcome;
mod registry;
mod schema;
mod set;
mod spec;
mod tool;

pub use context::ToolContext;
pub use outcome::{ToolError, ToolErrorKind, ToolOutcome};
pub use registry::{RegistryError, ToolCallRequest, ToolRegistry};
pub use schema::{ArgumentSchema, SchemaError};
pub use set::ToolSet;
pub use spec::{ParamDisplay, ToolClass, ToolDisplay, ToolSpec, valid_tool_name};
pub use tool::{DEFAULT_TOOL_TIMEOUT, Tool, ToolBuilder};
