//! Local chat models from GGUF files: the prompt side ([`template`]) — the file's own chat
//! template with tools offered in its format, and the tokenizer rebuilt from its metadata — and
//! the decoder ([`qwen2`]) with a prefix-reusing KV cache — and [`LocalChatModel`], the
//! `ChatModel` around them (bounded queue, streaming, tool calls parsed from the text).

mod model;
pub mod qwen2;
pub mod template;

pub use model::{LocalChatModel, LocalChatOptions};
pub use template::{ChatTemplate, GgufChatAssets};

/// File name of the default chat model in the models cache (`scripts/fetch-models chat-0.5b`).
pub const QWEN_0_5B_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// The larger, more reliable tool caller (`scripts/fetch-models chat-1.5b`).
pub const QWEN_1_5B_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
