//! Chat models for toolgraph.
//!
//! Owns: the provider-neutral conversation types ([`Message`], [`ToolCall`], [`ChatRequest`]),
//! the streaming [`ChatModel`] trait (text deltas, tool-call deltas assembled into complete
//! calls, finish reason, usage), per-provider normalisation of tool schemas
//! ([`normalize_schema`]), and [`OpenAiChatModel`], a client for any OpenAI-compatible
//! endpoint (OpenAI, Gemini's OpenAI endpoint, Ollama, vLLM, llama.cpp's server) with
//! timeouts and bounded retries that never repeat a reply already streamed to the caller.
//!
//! Does not own: running tools or deciding what to do with a reply (the graph layer).
//!
//! ```no_run
//! use futures::StreamExt;
//! use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, Message, OpenAiChatModel, OpenAiConfig};
//!
//! # async fn demo() -> Result<(), toolgraph_llm::LlmError> {
//! let model = OpenAiChatModel::new(OpenAiConfig::new("http://127.0.0.1:11434/v1", "qwen2.5:0.5b"))?;
//! let mut stream = model.stream(ChatRequest::new(vec![Message::user("Hola")])).await?;
//! while let Some(event) = stream.next().await {
//!     if let ChatEvent::TextDelta(t) = event? {
//!         print!("{t}");
//!     }
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod assemble;
mod error;
mod model;
mod openai;
mod schema;
pub mod text_tools;
mod types;
pub mod usage;

pub use assemble::ToolCallAssembler;
pub use error::{LlmError, error_chain};
pub use model::{ChatModel, ChatStream, collect_response};
pub use openai::{OpenAiChatModel, OpenAiConfig, RetryPolicy};
pub use schema::{Provider, SchemaDialect, normalize_schema};
pub use types::{
    ChatEvent, ChatRequest, ChatResponse, FinishReason, Message, ResponseFormat, ToolCall, ToolChoice, ToolDefinition,
    Usage,
};
