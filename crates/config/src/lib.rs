//! toolgraph's configuration: `toolgraph.toml` overridden by `TOOLGRAPH_*` variables.
//!
//! Owns: the typed settings ([`Config`] and its sections), loading them with figment,
//! rejecting unknown keys and bad values with the source (file or variable), the key and
//! the reason, and printing the effective configuration with secrets masked.
//!
//! Variables map onto keys by section: `TOOLGRAPH_DATA_DIR` → `data_dir`,
//! `TOOLGRAPH_LLM_BASE_URL` → `llm.base_url`; a double underscore also nests
//! (`TOOLGRAPH_LLM__MAX_RETRIES`).
//!
//! ```
//! use toolgraph_config::Config;
//! let cfg = Config::from_toml_str("[llm]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"qwen2.5\"\n").unwrap();
//! assert_eq!(cfg.llm.model, "qwen2.5");
//! assert!(Config::from_toml_str("[llm]\nbase_ulr = \"x\"\n").unwrap_err().to_string().contains("base_ulr"));
//! ```
#![warn(missing_docs)]

mod secret;

pub use secret::Secret;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toolgraph_llm::Provider;

/// `TOOLGRAPH_*` variables that are not configuration keys: the config file path, the log
/// filter, the model cache of `scripts/fetch-models` (read by the local models), and the
/// allocator (read by the binary before `main`).
const NOT_CONFIG_KEYS: &[&str] = &["config", "log", "models_dir", "allocator"];

/// Top-level sections; `TOOLGRAPH_<SECTION>_<KEY>` maps to `<section>.<key>`.
const SECTIONS: &[&str] = &["llm", "agents", "server", "tools", "rag"];

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file is missing, unreadable, not TOML, or has unknown keys or wrong types.
    #[error("{}", describe_figment(.0))]
    Load(Box<figment::Error>),
    /// A value parsed but is not acceptable.
    #[error("invalid value for `{key}` (from {origin}): {reason}")]
    Invalid {
        /// Dotted key, e.g. `llm.base_url`.
        key: String,
        /// Where the value came from: a file path or an environment variable.
        origin: String,
        /// Why it is refused.
        reason: String,
    },
}

fn describe_figment(e: &figment::Error) -> String {
    e.clone().into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
}

/// Everything toolgraph reads from `toolgraph.toml` and `TOOLGRAPH_*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where toolgraph keeps its files (SQLite, indexes, notes). Relative paths are relative
    /// to the working directory. Default: `./.toolgraph`. Env: `TOOLGRAPH_DATA_DIR`.
    pub data_dir: PathBuf,
    /// PostgreSQL URL for checkpoints and conversations; unset means SQLite in the data
    /// directory. Env: `TOOLGRAPH_DATABASE_URL`.
    pub database_url: Option<Secret>,
    /// Evaluation data directory. Default: `../shared/data`. Env: `TOOLGRAPH_EVAL_DATA`.
    pub eval_data: PathBuf,
    /// The model endpoint.
    pub llm: LlmSettings,
    /// The chat service (`toolgraph serve`).
    pub server: ServerSettings,
    /// Built-in tools that need settings.
    pub tools: ToolSettings,
    /// Knowledge bases (`toolgraph ingest`, `search`, `POST /search`, the `rag_search` tool).
    pub rag: RagSettings,
    /// The agent used when a request names none. Default: the only configured agent, or
    /// the built-in `assistant` when none is configured.
    pub default_agent: Option<String>,
    /// Agents by name (`[agents.NAME]`).
    pub agents: BTreeMap<String, AgentSettings>,
}

/// `[tools]`: settings of built-in tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSettings {
    /// SQLite database (a path, or `sqlite::memory:`) that the read-only `general_query`
    /// tool queries; unset: the tool is not offered. Env: `TOOLGRAPH_TOOLS_SQL_DATABASE`.
    pub sql_database: Option<String>,
}

/// `[rag]`: knowledge bases, kept under `<data_dir>/kb/<tenant>/<name>/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RagSettings {
    /// The knowledge base searched when a request or tool names none. Default: `docs`.
    /// Env: `TOOLGRAPH_RAG_DEFAULT_KB`.
    pub default_kb: String,
    /// The tenant the command line (`ingest`, `search`, `chat`) works for. The service always
    /// uses the request's tenant slug. Default: `default`. Env: `TOOLGRAPH_RAG_TENANT`.
    pub tenant: String,
    /// Where chunk and query embeddings come from: `local` (multilingual-e5-small in process,
    /// weights from `scripts/fetch-models embed`), `openai` (an OpenAI-compatible
    /// `/v1/embeddings` server: `embedding_base_url`, `embedding_model`, `embedding_dimension`)
    /// or `none` (keyword search only). A knowledge base keeps the model it was built with.
    /// Default: `local`. Env: `TOOLGRAPH_RAG_EMBEDDING`.
    pub embedding: EmbeddingProvider,
    /// `openai`: the server, e.g. `http://127.0.0.1:8080/v1`. Env: `TOOLGRAPH_RAG_EMBEDDING_BASE_URL`.
    pub embedding_base_url: Option<String>,
    /// `openai`: the model name. Env: `TOOLGRAPH_RAG_EMBEDDING_MODEL`.
    pub embedding_model: Option<String>,
    /// `openai`: the vector size the model returns. Env: `TOOLGRAPH_RAG_EMBEDDING_DIMENSION`.
    pub embedding_dimension: Option<usize>,
    /// `openai`: bearer token. Env: `TOOLGRAPH_RAG_EMBEDDING_API_KEY`.
    pub embedding_api_key: Option<Secret>,
    /// `openai`: prepended to queries / passages (e5-style models want `query: ` / `passage: `).
    pub embedding_query_prefix: String,
    /// See `embedding_query_prefix`.
    pub embedding_passage_prefix: String,
    /// A second model beside `embedding`: `minilm` (all-MiniLM-L6-v2 in process, English only,
    /// weights from `scripts/fetch-models minilm`) or `none`. A new knowledge base in one of
    /// `second_embedding_languages` stores both models' vectors and hybrid search fuses three
    /// lists (keyword, first model, second model); other knowledge bases get the first model
    /// alone, and an existing one keeps what it was built with. Default: `none`.
    /// Env: `TOOLGRAPH_RAG_SECOND_EMBEDDING`.
    pub second_embedding: SecondEmbedding,
    /// Knowledge-base languages (analyzer codes `en`, `es`, `vi`, `ko`) the second model is used
    /// for. Default: `["en"]`.
    pub second_embedding_languages: Vec<String>,
    /// Hybrid search: how the keyword and dense lists are combined: `rrf` (reciprocal-rank
    /// fusion: ranks, `fusion_k` and the weights) or `dbsf` (distribution-based score fusion:
    /// each list's scores mapped from mean ± 3σ onto [0, 1], weighted and summed). Default:
    /// `rrf`. Env: `TOOLGRAPH_RAG_FUSION`.
    pub fusion: FusionMethod,
    /// Hybrid search: the RRF rank constant. Default 60.
    pub fusion_k: f32,
    /// Hybrid search: weight of the keyword list. Default 1.
    pub bm25_weight: f32,
    /// Hybrid search: weight of the dense list. Default 1.
    pub dense_weight: f32,
    /// Knowledge bases with fewer vectors are searched exactly; larger ones through an HNSW
    /// graph. Default 20000.
    pub dense_exact_below: usize,
}

/// `rag.fusion`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FusionMethod {
    /// Reciprocal-rank fusion.
    #[default]
    Rrf,
    /// Distribution-based score fusion.
    Dbsf,
}

/// `rag.second_embedding`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecondEmbedding {
    /// One model only.
    #[default]
    None,
    /// all-MiniLM-L6-v2 in process (English).
    Minilm,
}

/// `rag.embedding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingProvider {
    /// multilingual-e5-small in process.
    Local,
    /// An OpenAI-compatible `/v1/embeddings` server.
    Openai,
    /// No embeddings: keyword search only.
    None,
}

impl Default for RagSettings {
    fn default() -> Self {
        Self {
            default_kb: "docs".into(),
            tenant: "default".into(),
            embedding: EmbeddingProvider::Local,
            embedding_base_url: None,
            embedding_model: None,
            embedding_dimension: None,
            embedding_api_key: None,
            embedding_query_prefix: String::new(),
            embedding_passage_prefix: String::new(),
            second_embedding: SecondEmbedding::None,
            second_embedding_languages: vec!["en".into()],
            fusion: FusionMethod::Rrf,
            fusion_k: 60.0,
            bm25_weight: 1.0,
            dense_weight: 1.0,
            dense_exact_below: 20_000,
        }
    }
}

/// Where conversations, pending actions and checkpoints are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In process memory (tests, benchmarks); lost on exit.
    Memory,
    /// One SQLite file in the data directory (the default).
    Sqlite,
    /// The backend of seed 002, through HMAC-signed `/internal/chatbot/**` calls
    /// (`server.backend_url`, `server.backend_hmac_secret`); checkpoints stay in
    /// `database_url` or the data directory's SQLite file.
    Backend,
}

/// How the chat service authenticates requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// An internal service behind a backend (seed 002): no credentials.
    None,
    /// `Authorization: Bearer <key>`, keys per tenant in `server.api_keys`.
    ApiKey,
    /// `X-Timestamp` + `X-Signature` (HMAC-SHA256 of `timestamp.body` with `server.hmac_secret`).
    Hmac,
}

/// `[server]`: `toolgraph serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address to listen on. Default: `127.0.0.1`. Env: `TOOLGRAPH_SERVER_BIND`.
    pub bind: String,
    /// Port. Default: 8000. Env: `TOOLGRAPH_SERVER_PORT` (the CLI also reads `PORT`).
    pub port: u16,
    /// Store for conversations and checkpoints. Default: `sqlite`.
    pub store: StoreKind,
    /// Serve `/health` and `/metrics` on this `host:port` instead of the main address
    /// (e.g. only reachable by the cluster's scraper). Default: unset (main address).
    pub ops_bind: Option<String>,
    /// Request authentication. Default: `none`.
    pub auth: AuthKind,
    /// Shared secret of `auth = "hmac"`. Env: `TOOLGRAPH_SERVER_HMAC_SECRET`.
    pub hmac_secret: Option<Secret>,
    /// `auth = "api_key"`: tenant slug → hex SHA-256 of its key (never the key itself).
    pub api_keys: BTreeMap<String, String>,
    /// `auth = "api_key"`: tenant slug → its numeric tenant id. A key then opens that tenant id
    /// only (403 for another in a body, query or path); without it the ids are the client's word.
    pub api_key_tenants: BTreeMap<String, i64>,
    /// Most runs one tenant may have in flight; more get 429 + `Retry-After` (0: no limit).
    /// Default: 64.
    pub max_runs_per_tenant: usize,
    /// `store = "backend"`: the backend's base URL (seed: `LUMIE_BACKEND_URL`).
    /// Env: `TOOLGRAPH_SERVER_BACKEND_URL`.
    pub backend_url: Option<String>,
    /// `store = "backend"`: the secret the calls are signed with (seed:
    /// `LUMIE_INTERNAL_HMAC_SECRET`). Env: `TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET`.
    pub backend_hmac_secret: Option<Secret>,
    /// `store = "backend"`: limit of one call in milliseconds. Default: 10000.
    pub backend_timeout_ms: u64,
    /// Largest request head (request line and headers) in bytes; larger ones get 431.
    /// 8,192 to 1,048,576. Default: 8192. Also the most an open connection's read buffer grows to.
    pub max_request_head_bytes: usize,
    /// Time a client has to send a request head, in milliseconds; also the longest a keep-alive
    /// connection may sit idle between requests. Default: 30000.
    pub header_read_timeout_ms: u64,
    /// After SIGTERM (runs already cancelled), how long open responses may take to finish before
    /// their connections are closed and the stores close, in milliseconds. Default: 30000.
    pub shutdown_drain_ms: u64,
    /// `store = "backend"`: write tools the backend runs after approval (seed 002's
    /// `create_announcement`, `send_sms`, …), by name.
    pub backend_tools: BTreeMap<String, BackendToolSettings>,
}

/// `[server.backend_tools.NAME]`: a write tool run by the backend
/// (`POST /internal/chatbot/tools/NAME`) once a person approved the call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendToolSettings {
    /// What the tool does, written for the model.
    pub description: String,
    /// JSON Schema (an object schema) of the arguments the model supplies.
    pub parameters: serde_json::Value,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1".into(),
            port: 8000,
            store: StoreKind::Sqlite,
            ops_bind: None,
            auth: AuthKind::None,
            hmac_secret: None,
            api_keys: BTreeMap::new(),
            api_key_tenants: BTreeMap::new(),
            max_runs_per_tenant: 64,
            backend_url: None,
            backend_hmac_secret: None,
            backend_timeout_ms: 10_000,
            max_request_head_bytes: 8 * 1024,
            header_read_timeout_ms: 30_000,
            shutdown_drain_ms: 30_000,
            backend_tools: BTreeMap::new(),
        }
    }
}

/// `[agents.NAME]`: a prebuilt ReAct agent (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// System prompt. Default: a short generic assistant prompt.
    pub system_prompt: String,
    /// Model name, overriding `llm.model` for this agent.
    pub model: Option<String>,
    /// Names of the tools the agent may call. Default: every built-in tool.
    pub tools: Option<Vec<String>>,
    /// State keys a request may set in its `context` (for state-injected tool arguments).
    pub state_keys: Vec<String>,
    /// Approximate token budget of the history the model sees (0: no limit). Default: 6000.
    pub history_budget: usize,
    /// Rounds of failing read tools per turn before giving up. Default: 3.
    pub max_tool_retries: u32,
    /// Most graph steps per run. Default: 10.
    pub recursion_limit: u32,
    /// Sampling temperature. Default: the model server's.
    pub temperature: Option<f32>,
    /// Most tokens the model may generate per call (sent as `max_tokens`). Default: the model
    /// server's (512 for the in-process model).
    pub max_tokens: Option<u32>,
    /// When a turn's answer used search results (tool results with `metadata.citation`) but
    /// cites none of them, append their citations to it (`citation::sources_footer` of the
    /// retrieval crate). Default: true.
    pub cite_sources: bool,
}

/// The system prompt of agents that set none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant. Use the tools when they help; \
say plainly when you do not know. Tools that change something ask the user for approval first.";

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            model: None,
            tools: None,
            state_keys: Vec::new(),
            history_budget: 6000,
            max_tool_retries: 3,
            recursion_limit: 10,
            temperature: None,
            max_tokens: None,
            cite_sources: true,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./.toolgraph"),
            database_url: None,
            eval_data: PathBuf::from("../shared/data"),
            llm: LlmSettings::default(),
            server: ServerSettings::default(),
            tools: ToolSettings::default(),
            rag: RagSettings::default(),
            default_agent: None,
            agents: BTreeMap::new(),
        }
    }
}

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
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (if given; it must exist), then `TOOLGRAPH_*` variables.
    ///
    /// # Errors
    /// See [`ConfigError`]; the message names the file or variable, the key and the reason.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::Invalid {
                    key: "--config".into(),
                    origin: "the command line".into(),
                    reason: format!("{} does not exist or is not a file", path.display()),
                });
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        Self::extract(fig.merge(env_provider()))
    }

    /// Parses TOML text alone (no environment); for tests and embedding.
    ///
    /// # Errors
    /// See [`ConfigError`].
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::extract(Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(text)))
    }

    fn extract(fig: Figment) -> Result<Self, ConfigError> {
        let cfg: Config = fig.extract().map_err(|e| ConfigError::Load(Box::new(e)))?;
        cfg.validate(&fig)?;
        Ok(cfg)
    }

    fn validate(&self, fig: &Figment) -> Result<(), ConfigError> {
        let is_http_url = |v: Option<&str>| {
            v.and_then(|v| url::Url::parse(v).ok()).is_some_and(|u| matches!(u.scheme(), "http" | "https"))
        };
        // HMAC secrets (the service's own and the backend's): at least 16 bytes.
        let is_long_enough = |s: Option<&Secret>| s.is_some_and(|s| s.expose().len() >= 16);
        let invalid =
            |key: &str, reason: String| ConfigError::Invalid { key: key.to_owned(), origin: origin(fig, key), reason };
        if let Some(base) = &self.llm.base_url {
            match url::Url::parse(base) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(u) => {
                    return Err(invalid("llm.base_url", format!("scheme '{}' is not http or https", u.scheme())));
                }
                Err(e) => {
                    return Err(invalid("llm.base_url", format!("'{base}' is not a URL: {e}")));
                }
            }
            if self.llm.model.trim().is_empty() {
                return Err(invalid("llm.model", "a model name is required when llm.base_url is set".into()));
            }
        }
        if self.rag.embedding == EmbeddingProvider::Openai {
            if !is_http_url(self.rag.embedding_base_url.as_deref()) {
                return Err(invalid(
                    "rag.embedding_base_url",
                    "an http(s) URL of the /v1 API is required when rag.embedding = \"openai\"".into(),
                ));
            }
            if self.rag.embedding_model.as_deref().is_none_or(|m| m.trim().is_empty()) {
                return Err(invalid("rag.embedding_model", "required when rag.embedding = \"openai\"".into()));
            }
            if self.rag.embedding_dimension.is_none_or(|d| d == 0) {
                return Err(invalid(
                    "rag.embedding_dimension",
                    "the model's vector size is required when rag.embedding = \"openai\"".into(),
                ));
            }
        }
        if self.rag.second_embedding != SecondEmbedding::None {
            if self.rag.embedding == EmbeddingProvider::None {
                return Err(invalid(
                    "rag.second_embedding",
                    "a second model needs a first one: rag.embedding is \"none\"".into(),
                ));
            }
            if let Some(bad) =
                self.rag.second_embedding_languages.iter().find(|l| !matches!(l.as_str(), "en" | "es" | "vi" | "ko"))
            {
                return Err(invalid(
                    "rag.second_embedding_languages",
                    format!("unknown language '{bad}' (use en, es, vi or ko)"),
                ));
            }
        }
        if !(self.rag.fusion_k >= 0.0 && self.rag.bm25_weight >= 0.0 && self.rag.dense_weight >= 0.0) {
            return Err(invalid("rag.fusion_k", "fusion_k, bm25_weight and dense_weight must be ≥ 0".into()));
        }
        for (key, v) in [
            ("llm.connect_timeout_ms", self.llm.connect_timeout_ms),
            ("llm.first_byte_timeout_ms", self.llm.first_byte_timeout_ms),
            ("llm.idle_timeout_ms", self.llm.idle_timeout_ms),
            ("llm.request_timeout_ms", self.llm.request_timeout_ms),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be greater than 0".into()));
            }
        }
        if self.llm.max_retries > 10 {
            return Err(invalid("llm.max_retries", format!("{} is more than the allowed 10", self.llm.max_retries)));
        }
        for (name, agent) in &self.agents {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(invalid(&format!("agents.{name}"), "agent names use letters, digits, '_' and '-'".into()));
            }
            if agent.recursion_limit == 0 {
                return Err(invalid(&format!("agents.{name}.recursion_limit"), "must be greater than 0".into()));
            }
            if agent.max_tokens == Some(0) {
                return Err(invalid(&format!("agents.{name}.max_tokens"), "must be greater than 0".into()));
            }
        }
        if !(8 * 1024..=1024 * 1024).contains(&self.server.max_request_head_bytes) {
            return Err(invalid(
                "server.max_request_head_bytes",
                format!("{} is outside 8192..=1048576", self.server.max_request_head_bytes),
            ));
        }
        if let Some(name) = self.server.backend_tools.keys().next()
            && self.server.store != StoreKind::Backend
        {
            return Err(invalid(
                &format!("server.backend_tools.{name}"),
                "backend tools need store = \"backend\"".into(),
            ));
        }
        if let Some((name, _)) = self.server.backend_tools.iter().find(|(_, t)| t.description.trim().is_empty()) {
            return Err(invalid(
                &format!("server.backend_tools.{name}.description"),
                "the model needs a description".into(),
            ));
        }
        if self.server.header_read_timeout_ms == 0 {
            return Err(invalid("server.header_read_timeout_ms", "must be greater than 0".into()));
        }
        if self.server.shutdown_drain_ms == 0 {
            return Err(invalid("server.shutdown_drain_ms", "must be greater than 0".into()));
        }
        match self.server.auth {
            AuthKind::Hmac if !is_long_enough(self.server.hmac_secret.as_ref()) => {
                return Err(invalid(
                    "server.hmac_secret",
                    "auth = \"hmac\" needs a secret of at least 16 bytes".into(),
                ));
            }
            AuthKind::ApiKey if self.server.api_keys.is_empty() => {
                return Err(invalid("server.api_keys", "auth = \"api_key\" needs at least one tenant key".into()));
            }
            _ => {}
        }
        if self.server.store == StoreKind::Backend {
            if !is_http_url(self.server.backend_url.as_deref()) {
                return Err(invalid(
                    "server.backend_url",
                    "store = \"backend\" needs the backend's http(s) base URL".into(),
                ));
            }
            if !is_long_enough(self.server.backend_hmac_secret.as_ref()) {
                return Err(invalid(
                    "server.backend_hmac_secret",
                    "store = \"backend\" needs the shared secret of the signed calls (at least 16 bytes)".into(),
                ));
            }
            if self.server.backend_timeout_ms == 0 {
                return Err(invalid("server.backend_timeout_ms", "must be greater than 0".into()));
            }
        }
        for (slug, id) in &self.server.api_key_tenants {
            let key = format!("server.api_key_tenants.{slug}");
            if !self.server.api_keys.contains_key(slug) {
                return Err(invalid(&key, format!("tenant '{slug}' has no key in server.api_keys")));
            }
            if *id <= 0 {
                return Err(invalid(&key, format!("{id} is not a tenant id (ids are positive)")));
            }
        }
        for (slug, digest) in &self.server.api_keys {
            if digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(invalid(
                    &format!("server.api_keys.{slug}"),
                    "must be the hex SHA-256 of the key (64 hex digits), e.g. from `printf %s KEY | sha256sum`".into(),
                ));
            }
        }
        if let Some(d) = &self.default_agent
            && !self.agents.contains_key(d)
        {
            return Err(invalid("default_agent", format!("no agent named '{d}' is configured")));
        }
        if let Some(db) = &self.database_url
            && !(db.expose().starts_with("postgres://") || db.expose().starts_with("postgresql://"))
        {
            return Err(invalid("database_url", "must be a postgres:// or postgresql:// URL".into()));
        }
        Ok(())
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

/// `TOOLGRAPH_*` → keys: the first `_` after a section name nests, `__` nests anywhere.
fn env_provider() -> Env {
    Env::prefixed("TOOLGRAPH_")
        .filter(|k| !NOT_CONFIG_KEYS.iter().any(|n| k.as_str().eq_ignore_ascii_case(n)))
        .map(|k| {
            let lower = k.as_str().to_ascii_lowercase().replace("__", ".");
            for s in SECTIONS {
                if let Some(rest) = lower.strip_prefix(&format!("{s}_")) {
                    return format!("{s}.{rest}").into();
                }
            }
            lower.into()
        })
        .split(".")
}

/// Where the value at `key` came from, for error messages.
fn origin(fig: &Figment, key: &str) -> String {
    match fig.find_metadata(key) {
        Some(md) => match &md.source {
            Some(figment::Source::File(p)) => p.display().to_string(),
            _ => md.name.to_string(),
        },
        None => "defaults".into(),
    }
}

impl Config {
    /// The agents in effect: the configured ones, or the built-in `assistant` when none is.
    pub fn effective_agents(&self) -> BTreeMap<String, AgentSettings> {
        if self.agents.is_empty() {
            BTreeMap::from([("assistant".to_owned(), AgentSettings::default())])
        } else {
            self.agents.clone()
        }
    }

    /// The name of the agent used when none is named.
    pub fn default_agent_name(&self) -> String {
        self.default_agent
            .clone()
            .unwrap_or_else(|| self.effective_agents().keys().next().cloned().unwrap_or_else(|| "assistant".into()))
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
}

#[cfg(test)]
// figment::Jail's closures return figment::Error; its size is not ours to choose.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_are_sane() {
        let c = Config::default();
        assert_eq!(c.data_dir, PathBuf::from("./.toolgraph"));
        assert_eq!(c.llm.max_retries, 3);
        assert!(c.llm.base_url.is_none());
    }

    #[test]
    fn file_then_environment_override() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "toolgraph.toml",
                "data_dir = \"/tmp/tg\"\n[llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"from-file\"\nmax_retries = 1\n",
            )?;
            jail.set_env("TOOLGRAPH_LLM_MODEL", "from-env");
            jail.set_env("TOOLGRAPH_LLM_API_KEY", "sk-secret-123");
            jail.set_env("TOOLGRAPH_LLM__IDLE_TIMEOUT_MS", "1234");
            let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.data_dir, PathBuf::from("/tmp/tg"));
            assert_eq!(c.llm.model, "from-env");
            assert_eq!(c.llm.max_retries, 1);
            assert_eq!(c.llm.idle_timeout_ms, 1234);
            assert_eq!(c.llm.api_key.as_ref().map(Secret::expose), Some("sk-secret-123"));
            let shown = c.to_masked_toml();
            assert!(!shown.contains("sk-secret-123"), "{shown}");
            assert!(shown.contains("api_key = \"********\""), "{shown}");
            Ok(())
        });
    }

    #[test]
    fn the_documented_environment_names_reach_their_keys() {
        Jail::expect_with(|jail| {
            jail.create_file("toolgraph.toml", "[agents.tutor]\nsystem_prompt = \"x\"\n")?;
            jail.set_env("TOOLGRAPH_AGENTS__TUTOR__MODEL", "qwen2.5");
            jail.set_env("TOOLGRAPH_SERVER_OPS_BIND", "127.0.0.1:9100");
            jail.set_env("TOOLGRAPH_SERVER_MAX_RUNS_PER_TENANT", "5");
            jail.set_env("TOOLGRAPH_SERVER_MAX_REQUEST_HEAD_BYTES", "16384");
            jail.set_env("TOOLGRAPH_SERVER_HEADER_READ_TIMEOUT_MS", "2500");
            jail.set_env("TOOLGRAPH_SERVER_SHUTDOWN_DRAIN_MS", "1500");
            jail.set_env("TOOLGRAPH_SERVER__API_KEYS__DEMO", "ab".repeat(32));
            jail.set_env("TOOLGRAPH_SERVER__API_KEY_TENANTS__DEMO", "7");
            jail.set_env("TOOLGRAPH_TOOLS_SQL_DATABASE", "sqlite::memory:");
            jail.set_env("TOOLGRAPH_RAG_DEFAULT_KB", "cursos");
            jail.set_env("TOOLGRAPH_RAG_TENANT", "ugr");
            jail.set_env("TOOLGRAPH_RAG_FUSION", "dbsf");
            let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
            assert_eq!((c.rag.default_kb.as_str(), c.rag.tenant.as_str()), ("cursos", "ugr"));
            assert_eq!(c.rag.fusion, FusionMethod::Dbsf);
            jail.set_env("TOOLGRAPH_RAG_SECOND_EMBEDDING", "minilm");
            let with_second = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(with_second.rag.second_embedding, SecondEmbedding::Minilm);
            assert_eq!(with_second.rag.second_embedding_languages, ["en"]);
            jail.set_env("TOOLGRAPH_RAG_SECOND_EMBEDDING", "none");
            jail.set_env("TOOLGRAPH_RAG_FUSION", "borda");
            let err = Config::load(Some(Path::new("toolgraph.toml"))).unwrap_err().to_string();
            assert!(err.contains("borda") && err.contains("rrf") && err.contains("dbsf"), "{err}");
            assert_eq!(c.agents["tutor"].model.as_deref(), Some("qwen2.5"));
            assert_eq!(c.server.ops_bind.as_deref(), Some("127.0.0.1:9100"));
            assert_eq!(c.server.max_runs_per_tenant, 5);
            assert_eq!((c.server.max_request_head_bytes, c.server.header_read_timeout_ms), (16384, 2500));
            assert_eq!(c.server.shutdown_drain_ms, 1500);
            assert_eq!(c.server.api_keys["demo"], "ab".repeat(32));
            assert_eq!(c.server.api_key_tenants["demo"], 7);
            assert_eq!(c.tools.sql_database.as_deref(), Some("sqlite::memory:"));
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_name_the_file_and_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("toolgraph.toml", "[llm]\nmodle = \"x\"\n")?;
            let err = Config::load(Some(Path::new("toolgraph.toml"))).unwrap_err().to_string();
            assert!(err.contains("modle"), "{err}");
            assert!(err.contains("toolgraph.toml"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_environment_keys_are_refused() {
        Jail::expect_with(|jail| {
            jail.set_env("TOOLGRAPH_LLM_BASEURL", "http://x");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("baseurl"), "{err}");
            assert!(err.to_lowercase().contains("environment"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn wrong_types_name_the_key() {
        let err = Config::from_toml_str("[llm]\nmax_retries = \"many\"\n").unwrap_err().to_string();
        assert!(err.contains("max_retries"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key_the_origin_and_the_reason() {
        Jail::expect_with(|jail| {
            jail.set_env("TOOLGRAPH_LLM_BASE_URL", "ftp://example.org");
            jail.set_env("TOOLGRAPH_LLM_MODEL", "m");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("`llm.base_url`"), "{err}");
            assert!(err.contains("TOOLGRAPH_"), "{err}");
            assert!(err.contains("not http or https"), "{err}");
            Ok(())
        });
        let err = Config::from_toml_str("[llm]\nbase_url = \"http://h/v1\"\n").unwrap_err().to_string();
        assert!(err.contains("`llm.model`") && err.contains("required"), "{err}");
        let err = Config::from_toml_str("[llm]\nidle_timeout_ms = 0\n").unwrap_err().to_string();
        assert!(err.contains("greater than 0"), "{err}");
        let err = Config::from_toml_str("database_url = \"mysql://x\"\n").unwrap_err().to_string();
        assert!(err.contains("postgres://"), "{err}");
        let err = Config::from_toml_str("[server]\nmax_request_head_bytes = 4096\n").unwrap_err().to_string();
        assert!(err.contains("`server.max_request_head_bytes`") && err.contains("8192..=1048576"), "{err}");
        let err = Config::from_toml_str("[server]\nheader_read_timeout_ms = 0\n").unwrap_err().to_string();
        assert!(err.contains("`server.header_read_timeout_ms`") && err.contains("greater than 0"), "{err}");
        let err = Config::from_toml_str("[server]\nshutdown_drain_ms = 0\n").unwrap_err().to_string();
        assert!(err.contains("`server.shutdown_drain_ms`") && err.contains("greater than 0"), "{err}");
        let err = Config::from_toml_str("[rag]\nembedding = \"none\"\nsecond_embedding = \"minilm\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rag.second_embedding`") && err.contains("needs a first one"), "{err}");
        let err =
            Config::from_toml_str("[rag]\nsecond_embedding = \"minilm\"\nsecond_embedding_languages = [\"fr\"]\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("`rag.second_embedding_languages`") && err.contains("'fr'"), "{err}");
        let err = Config::from_toml_str("[agents.a]\nmax_tokens = 0\n").unwrap_err().to_string();
        assert!(err.contains("`agents.a.max_tokens`") && err.contains("greater than 0"), "{err}");
        let c = Config::from_toml_str("[agents.a]\nmax_tokens = 300\n").unwrap();
        assert_eq!(c.agents["a"].max_tokens, Some(300));
    }

    #[test]
    fn backend_tools_are_declared_with_a_description_and_a_schema() {
        let backend = "[server]\nstore = \"backend\"\nbackend_url = \"http://b:8080\"\nbackend_hmac_secret = \"0123456789abcdef\"\n";
        let tool = "[server.backend_tools.send_sms]\ndescription = \"Send an SMS.\"\nparameters = { type = \"object\", properties = { text = { type = \"string\" } }, required = [\"text\"] }\n";
        let c = Config::from_toml_str(&format!("{backend}{tool}")).unwrap();
        let sms = &c.server.backend_tools["send_sms"];
        assert_eq!(sms.parameters["properties"]["text"]["type"], "string");
        assert_eq!(sms.parameters["required"][0], "text");
        let err = Config::from_toml_str(tool).unwrap_err().to_string();
        assert!(err.contains("server.backend_tools.send_sms") && err.contains("store = \"backend\""), "{err}");
        let blank = tool.replace("Send an SMS.", " ");
        let err = Config::from_toml_str(&format!("{backend}{blank}")).unwrap_err().to_string();
        assert!(err.contains("server.backend_tools.send_sms.description"), "{err}");
    }

    #[test]
    fn the_backend_store_needs_its_url_and_secret() {
        let err = Config::from_toml_str("[server]\nstore = \"backend\"\n").unwrap_err().to_string();
        assert!(err.contains("`server.backend_url`"), "{err}");
        let err = Config::from_toml_str("[server]\nstore = \"backend\"\nbackend_url = \"http://backend:8080\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`server.backend_hmac_secret`") && err.contains("16 bytes"), "{err}");
        Jail::expect_with(|jail| {
            jail.set_env("TOOLGRAPH_SERVER_STORE", "backend");
            jail.set_env("TOOLGRAPH_SERVER_BACKEND_URL", "http://backend:8080");
            jail.set_env("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET", "0123456789abcdef");
            let c = Config::load(None).unwrap();
            assert_eq!(c.server.store, StoreKind::Backend);
            assert_eq!(c.server.backend_url.as_deref(), Some("http://backend:8080"));
            assert_eq!(c.server.backend_hmac_secret.as_ref().map(|s| s.expose()), Some("0123456789abcdef"));
            assert!(!c.to_masked_toml().contains("0123456789abcdef"), "the secret is masked");
            Ok(())
        });
        // Without the backend store, its settings are not required.
        assert!(Config::from_toml_str("[server]\nstore = \"memory\"\n").is_ok());
    }

    #[test]
    fn a_missing_config_file_is_an_error() {
        let err = Config::load(Some(Path::new("/nonexistent/toolgraph.toml"))).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/toolgraph.toml") && err.contains("does not exist"), "{err}");
    }

    #[test]
    fn agents_are_declared_in_tables() {
        let c = Config::from_toml_str(
            "default_agent = \"tutor\"\n[agents.tutor]\nsystem_prompt = \"Eres un tutor.\"\ntools = [\"calculator\"]\nstate_keys = [\"asignatura\"]\nhistory_budget = 2000\n",
        )
        .unwrap();
        let t = &c.agents["tutor"];
        assert_eq!(t.tools.as_deref(), Some(&["calculator".to_string()][..]));
        assert_eq!(t.history_budget, 2000);
        assert_eq!(t.max_tool_retries, 3, "defaults fill the rest");
        assert_eq!(c.default_agent_name(), "tutor");
        let err = Config::from_toml_str("default_agent = \"nope\"\n").unwrap_err().to_string();
        assert!(err.contains("no agent named 'nope'"), "{err}");
        let err = Config::from_toml_str("[agents.a]\nsytem_prompt = \"x\"\n").unwrap_err().to_string();
        assert!(err.contains("sytem_prompt"), "{err}");
        assert_eq!(Config::default().default_agent_name(), "assistant");
    }

    #[test]
    fn auth_modes_need_their_credentials() {
        let err = Config::from_toml_str("[server]\nauth = \"hmac\"\n").unwrap_err().to_string();
        assert!(err.contains("server.hmac_secret"), "{err}");
        let err = Config::from_toml_str("[server]\nauth = \"api_key\"\n").unwrap_err().to_string();
        assert!(err.contains("server.api_keys"), "{err}");
        let err = Config::from_toml_str("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"plaintext-key\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.api_keys.demo") && err.contains("SHA-256"), "{err}");
        let bound = format!("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{}\"\n", "ab".repeat(32));
        let c = Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\ndemo = 7\n")).unwrap();
        assert_eq!(c.server.api_key_tenants["demo"], 7);
        let err =
            Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\nacme = 7\n")).unwrap_err().to_string();
        assert!(err.contains("server.api_key_tenants.acme") && err.contains("no key"), "{err}");
        let err =
            Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\ndemo = 0\n")).unwrap_err().to_string();
        assert!(err.contains("server.api_key_tenants.demo") && err.contains("positive"), "{err}");
        let ok = format!("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{}\"\n", "ab".repeat(32));
        assert_eq!(Config::from_toml_str(&ok).unwrap().server.auth, AuthKind::ApiKey);
    }

    #[test]
    fn provider_names_are_kebab_case() {
        let c = Config::from_toml_str("[llm]\nprovider = \"llama-cpp\"\n").unwrap();
        assert_eq!(c.llm.provider, Some(Provider::LlamaCpp));
        assert!(Config::from_toml_str("[llm]\nprovider = \"anthropic\"\n").is_err());
    }
}
