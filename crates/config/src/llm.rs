//! `[llm]`: the model endpoint, or the in-process model.

use crate::{Check, ConfigError, Secret};
use serde::{Deserialize, Serialize};
use toolgraph_llm::Provider;

/// `[llm]`: an OpenAI-compatible endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    /// Base URL ending in the API version (`…/v1`). Unset: no remote model is configured.
    /// Env: `TOOLGRAPH_LLM_BASE_URL`.
    pub base_url: Option<String>,
    /// Model name. Default: empty (required with `base_url`). Env: `TOOLGRAPH_LLM_MODEL`.
    pub model: String,
    /// Bearer token; local servers need none. Env: `TOOLGRAPH_LLM_API_KEY`.
    pub api_key: Option<Secret>,
    /// Server family (`openai`, `gemini`, `ollama`, `vllm`, `llama-cpp`, `generic`); decides
    /// how tool schemas are normalised. Default: detected from `base_url`.
    pub provider: Option<Provider>,
    /// Connect timeout in milliseconds. Default: 5000.
    pub connect_timeout_ms: u64,
    /// Time allowed until the first byte of a reply, in milliseconds. Default: 60000.
    pub first_byte_timeout_ms: u64,
    /// Silence allowed between streamed chunks, in milliseconds. Default: 30000.
    pub idle_timeout_ms: u64,
    /// Limit on a whole non-streamed call, in milliseconds. Default: 120000.
    pub request_timeout_ms: u64,
    /// Retries after a failed attempt (connect errors, 429, 5xx). Default: 3.
    pub max_retries: u32,
    /// Send tool schemas in OpenAI strict mode. Default: false.
    pub strict_tools: bool,
    /// A GGUF chat model run in process when no `base_url` is set: `0.5b` or `1.5b` (the
    /// Qwen2.5-Coder files of `scripts/fetch-models`) or a path to a GGUF file. Unset: none.
    /// Env: `TOOLGRAPH_LLM_LOCAL_MODEL`.
    pub local_model: Option<String>,
    /// Prompts the in-process model keeps computed at once (its KV cache's slots: each agent's
    /// prompt, and those of tools that ask the same model); each holds up to 4,096 tokens of
    /// keys and values (the 1.5B: 57 kB a token). Default: 4. Env:
    /// `TOOLGRAPH_LLM_LOCAL_CACHE_SLOTS`.
    pub local_cache_slots: usize,
    /// Most tokens the in-process model drafts ahead from the prompt (speculative decoding by
    /// prompt lookup): a reply that quotes a passage or the user's words is written several
    /// tokens per pass over the weights, the same tokens as without; 0: off. Default: 15. Env:
    /// `TOOLGRAPH_LLM_LOCAL_DRAFT_TOKENS`.
    pub local_draft_tokens: usize,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            base_url: None,
            model: String::new(),
            api_key: None,
            provider: None,
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 60_000,
            idle_timeout_ms: 30_000,
            request_timeout_ms: 120_000,
            max_retries: 3,
            strict_tools: false,
            local_model: None,
            local_cache_slots: 4,
            local_draft_tokens: 15,
        }
    }
}

impl LlmSettings {
    /// The client settings for the configured endpoint, or `None` when no `base_url` is set.
    pub fn openai_config(&self) -> Option<toolgraph_llm::OpenAiConfig> {
        let base = self.base_url.as_ref()?;
        let mut c = toolgraph_llm::OpenAiConfig::new(base.clone(), self.model.clone());
        if let Some(p) = self.provider {
            c.provider = p;
        }
        c.api_key = self.api_key.as_ref().map(|s| s.expose().to_owned());
        c.connect_timeout = std::time::Duration::from_millis(self.connect_timeout_ms);
        c.first_byte_timeout = std::time::Duration::from_millis(self.first_byte_timeout_ms);
        c.idle_timeout = std::time::Duration::from_millis(self.idle_timeout_ms);
        c.request_timeout = std::time::Duration::from_millis(self.request_timeout_ms);
        c.retry.max_retries = self.max_retries;
        c.strict_tools = self.strict_tools;
        Some(c)
    }

    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        if let Some(base) = &self.base_url {
            match url::Url::parse(base) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(u) => {
                    return Err(check.invalid("llm.base_url", format!("scheme '{}' is not http or https", u.scheme())));
                }
                Err(e) => {
                    return Err(check.invalid("llm.base_url", format!("'{base}' is not a URL: {e}")));
                }
            }
            if self.model.trim().is_empty() {
                return Err(check.invalid("llm.model", "a model name is required when llm.base_url is set".into()));
            }
        }
        for (key, v) in [
            ("llm.connect_timeout_ms", self.connect_timeout_ms),
            ("llm.first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("llm.idle_timeout_ms", self.idle_timeout_ms),
            ("llm.request_timeout_ms", self.request_timeout_ms),
        ] {
            if v == 0 {
                return Err(check.invalid(key, "must be greater than 0".into()));
            }
        }
        if self.max_retries > 10 {
            return Err(check.invalid("llm.max_retries", format!("{} is more than the allowed 10", self.max_retries)));
        }
        if !(1..=64).contains(&self.local_cache_slots) {
            return Err(check.invalid("llm.local_cache_slots", format!("{} is not 1-64", self.local_cache_slots)));
        }
        if self.local_draft_tokens > 32 {
            return Err(check.invalid("llm.local_draft_tokens", format!("{} is not 0-32", self.local_draft_tokens)));
        }
        Ok(())
    }
}
