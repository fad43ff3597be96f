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

mod agents;
mod llm;
mod mcp;
mod plugins;
mod rag;
mod secret;
mod server;
#[cfg(test)]
mod tests;
mod tools;

pub use agents::{AgentGraph, AgentSettings, DEFAULT_SYSTEM_PROMPT, Grounding, MAX_RECALL, MemorySettings, OlderTurns};
pub use llm::LlmSettings;
pub use mcp::McpSettings;
pub use plugins::PluginSettings;
pub use rag::{EmbeddingProvider, KbBackend, RagSettings, SecondEmbedding};
pub use secret::Secret;
pub use server::{
    AuthKind, BackendToolSettings, BudgetPeriodKind, ItemSearchKind, RetentionOverride, RetentionSettings,
    RunEventsKind, ServerSettings, StoreKind, TokenBudgetSettings,
};
/// `rag.fusion`: the retrieval crate's own type, so the setting and the search agree.
pub use toolgraph_rag::FusionMethod;
pub use tools::{
    CourseToolSettings, CrisisToolSettings, LegalToolSettings, MAX_ANSWER_ARTICLES, SearchProvider, ToolSettings,
};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `TOOLGRAPH_*` variables that are not configuration keys: the config file path, the log
/// filter and format, the model cache of `scripts/fetch-models` (read by the local models), the
/// allocator (read by the binary before `main`), the local models' thread count and kernels,
/// `chat --url`'s key, the demo's port, and what the test suite reads (its database, the Qdrant
/// and PostgreSQL binaries, the MCP SDKs, the benchmark's PostgreSQL). Each would otherwise
/// stop every command with "unknown key" when set in the shell.
const NOT_CONFIG_KEYS: &[&str] = &[
    "config",
    "log",
    "log_format",
    "models_dir",
    "allocator",
    "threads",
    "kernels",
    "api_key",
    "demo_port",
    "test_database_url",
    "qdrant_bin",
    "pg_bindir",
    "mcp_python",
    "mcp_everything",
    "bench_pg",
];

/// Top-level sections; `TOOLGRAPH_<SECTION>_<KEY>` maps to `<section>.<key>`.
const SECTIONS: &[&str] = &["llm", "agents", "server", "tools", "rag", "plugins", "mcp"];

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
    e.clone().into_iter().map(|e| format!("{e}{}", did_you_mean(&e))).collect::<Vec<_>>().join("; ")
}

/// "; did you mean `llm.base_url`?" for an unknown key or value close to a known one (with the
/// variable to set when the unknown key came from one), else nothing.
fn did_you_mean(e: &figment::Error) -> String {
    use figment::error::Kind;
    let (found, expected, is_key) = match &e.kind {
        Kind::UnknownField(found, expected) => (found, *expected, true),
        Kind::UnknownVariant(found, expected) => (found, *expected, false),
        _ => return String::new(),
    };
    let Some(best) = closest(found, expected) else { return String::new() };
    if !is_key {
        return format!("; did you mean \"{best}\"?");
    }
    let mut path: Vec<&str> = e.path.iter().map(String::as_str).collect();
    if path.last() == Some(&found.as_str()) {
        path.pop();
    }
    path.push(best);
    let key = path.join(".");
    let from_env = e.metadata.as_ref().is_some_and(|m| m.name.contains("environment"));
    if from_env {
        format!("; did you mean `{key}` ({})?", key_variable(&key))
    } else {
        format!("; did you mean `{key}`?")
    }
}

/// The known name most like `found`: the same letters without `_`/`-`, or within a small
/// edit distance (a third of the name, at least 1).
fn closest<'a>(found: &str, known: &[&'a str]) -> Option<&'a str> {
    let squash = |s: &str| s.chars().filter(|c| *c != '_' && *c != '-').collect::<String>().to_ascii_lowercase();
    let found_squashed = squash(found);
    if let Some(same) = known.iter().find(|k| squash(k) == found_squashed) {
        return Some(same);
    }
    let limit = (found.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(found, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The `TOOLGRAPH_*` variable that sets dotted `key` (the inverse of [`variable_key`]): the
/// section and, in [`SUBSECTIONS`], its table join with `_`, deeper parts with `__`.
pub fn key_variable(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let mut name = String::from("TOOLGRAPH_");
    for (i, part) in parts.iter().enumerate() {
        let joined_by_one = match i {
            0 => "",
            1 => "_",
            2 if SUBSECTIONS.iter().any(|(s, tables)| *s == parts[0] && tables.contains(&parts[1])) => "_",
            _ => "__",
        };
        name.push_str(joined_by_one);
        name.push_str(&part.to_ascii_uppercase());
    }
    name
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
    /// How `database_url` reaches PostgreSQL: `session` (directly, or through a pooler in
    /// session mode; the default) or `transaction` (through a pooler such as PgBouncer with
    /// `pool_mode = transaction`: no named prepared statements, each operation in one
    /// transaction). Env: `TOOLGRAPH_DATABASE_POOLING`.
    pub database_pooling: DatabasePooling,
    /// A direct (or session-pooled) PostgreSQL URL the migrations run over at start: they hold
    /// a session-level lock, which a transaction pooler cannot keep. Required with
    /// `database_pooling = "transaction"`. Env: `TOOLGRAPH_DATABASE_MIGRATION_URL`.
    pub database_migration_url: Option<Secret>,
    /// The Qdrant server's REST URL (e.g. `http://qdrant:6333`) for `rag.backend = "qdrant"`.
    /// Env: `TOOLGRAPH_QDRANT_URL`.
    pub qdrant_url: Option<String>,
    /// The Qdrant server's API key, when it wants one. Env: `TOOLGRAPH_QDRANT_API_KEY`.
    pub qdrant_api_key: Option<Secret>,
    /// Evaluation data directory. Default: `../shared/data`. Env: `TOOLGRAPH_EVAL_DATA`.
    pub eval_data: PathBuf,
    /// The model endpoint.
    pub llm: LlmSettings,
    /// The chat service (`toolgraph serve`).
    pub server: ServerSettings,
    /// Built-in tools that need settings.
    pub tools: ToolSettings,
    /// Tools declared in plugin directories.
    pub plugins: PluginSettings,
    /// toolgraph as an MCP server.
    pub mcp: McpSettings,
    /// Knowledge bases (`toolgraph ingest`, `search`, `POST /search`, the `rag_search` tool).
    pub rag: RagSettings,
    /// The agent used when a request names none. Default: the only configured agent, or
    /// the built-in `assistant` when none is configured.
    pub default_agent: Option<String>,
    /// Agents by name (`[agents.NAME]`).
    pub agents: BTreeMap<String, AgentSettings>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./.toolgraph"),
            database_url: None,
            database_pooling: DatabasePooling::Session,
            database_migration_url: None,
            qdrant_url: None,
            qdrant_api_key: None,
            eval_data: PathBuf::from("../shared/data"),
            llm: LlmSettings::default(),
            server: ServerSettings::default(),
            tools: ToolSettings::default(),
            plugins: PluginSettings::default(),
            mcp: McpSettings::default(),
            rag: RagSettings::default(),
            default_agent: None,
            agents: BTreeMap::new(),
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
        let mut cfg = Self::extract(fig.merge(env_provider()))?;
        if let Some(dir) = file.and_then(Path::parent) {
            cfg.resolve_beside(dir);
        }
        Ok(cfg)
    }

    /// Relative `graph_file`s are read beside the configuration file that names them (a graph
    /// declaration travels with its configuration); other paths stay relative to the working
    /// directory.
    fn resolve_beside(&mut self, dir: &Path) {
        for agent in self.agents.values_mut() {
            if let Some(file) = agent.graph_file.as_mut().filter(|f| f.is_relative()) {
                *file = dir.join(&*file);
            }
        }
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
        let check = Check { fig };
        self.llm.validate(&check)?;
        self.rag.validate(&check)?;
        self.plugins.validate(&check)?;
        self.tools.validate(&check)?;
        for (name, agent) in &self.agents {
            agent.validate(name, &check)?;
        }
        self.server.validate(&check)?;
        self.mcp.validate(&check, self.server.auth)?;
        if let Some(d) = &self.default_agent
            && !self.agents.contains_key(d)
        {
            return Err(check.invalid("default_agent", format!("no agent named '{d}' is configured")));
        }
        let postgres =
            |url: &Secret| url.expose().starts_with("postgres://") || url.expose().starts_with("postgresql://");
        for (key, url) in
            [("database_url", &self.database_url), ("database_migration_url", &self.database_migration_url)]
        {
            if url.as_ref().is_some_and(|u| !postgres(u)) {
                return Err(check.invalid(key, "must be a postgres:// or postgresql:// URL".into()));
            }
        }
        let agents = self.effective_agents();
        if let Some(name) = self.server.retention.agents.keys().find(|n| !agents.contains_key(*n)) {
            return Err(check.invalid(&format!("server.retention.agents.{name}"), format!("no agent named '{name}'")));
        }
        if self.qdrant_url.is_some() && !is_http_url(self.qdrant_url.as_deref()) {
            return Err(check.invalid("qdrant_url", "must be an http(s) URL, e.g. http://qdrant:6333".into()));
        }
        if self.rag.backend == KbBackend::Qdrant && self.qdrant_url.is_none() {
            return Err(check.invalid("rag.backend", "\"qdrant\" needs qdrant_url (TOOLGRAPH_QDRANT_URL)".into()));
        }
        if self.server.item_search == ItemSearchKind::Hybrid && self.rag.embedding == EmbeddingProvider::None {
            return Err(check.invalid(
                "server.item_search",
                "\"hybrid\" embeds items with rag.embedding, which is \"none\": set it to \"local\" or \"openai\""
                    .into(),
            ));
        }
        if self.server.run_events == RunEventsKind::Postgres && self.database_url.is_none() {
            return Err(check.invalid("server.run_events", "\"postgres\" needs database_url".into()));
        }
        if self.database_pooling == DatabasePooling::Transaction {
            if self.database_url.is_none() {
                return Err(check.invalid("database_pooling", "\"transaction\" needs database_url".into()));
            }
            if self.database_migration_url.is_none() {
                return Err(check.invalid(
                    "database_migration_url",
                    "database_pooling = \"transaction\" needs a direct URL for the migrations (they hold a \
                     session lock a transaction pooler cannot keep)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

/// How `database_url` reaches PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatabasePooling {
    /// Directly, or through a pooler in session mode.
    #[default]
    Session,
    /// Through a pooler in transaction mode (PgBouncer `pool_mode = transaction`).
    Transaction,
}

/// What a section's validation needs: where each value came from, for the error.
pub(crate) struct Check<'a> {
    fig: &'a Figment,
}

impl Check<'_> {
    /// The error for the value at `key`, naming where it came from.
    pub(crate) fn invalid(&self, key: &str, reason: String) -> ConfigError {
        ConfigError::Invalid { key: key.to_owned(), origin: origin(self.fig, key), reason }
    }
}

/// Whether `v` is an http(s) URL.
pub(crate) fn is_http_url(v: Option<&str>) -> bool {
    v.and_then(|v| url::Url::parse(v).ok()).is_some_and(|u| matches!(u.scheme(), "http" | "https"))
}

/// Tables inside a section whose name's `_` nests too: `TOOLGRAPH_TOOLS_COURSE_BACKEND_URL`
/// is `tools.course.backend_url` (as is `TOOLGRAPH_TOOLS_COURSE__BACKEND_URL`).
const SUBSECTIONS: &[(&str, &[&str])] = &[("tools", &["course", "legal", "crisis"])];

/// `TOOLGRAPH_*` → keys: the first `_` after a section name nests (and after a table of
/// [`SUBSECTIONS`]), `__` nests anywhere.
fn env_provider() -> Env {
    Env::prefixed("TOOLGRAPH_")
        .filter(|k| !NOT_CONFIG_KEYS.iter().any(|n| k.as_str().eq_ignore_ascii_case(n)))
        .map(|k| env_key(k.as_str()).into())
        .split(".")
}

/// The dotted key a `TOOLGRAPH_*` variable sets (`TOOLGRAPH_LLM_BASE_URL` → `llm.base_url`),
/// or `None` for a variable that is not a configuration key (`TOOLGRAPH_LOG`,
/// `TOOLGRAPH_API_KEY`, …) or not a `TOOLGRAPH_` variable. Whether the key exists is the
/// loader's to say: [`Config::from_toml_str`] refuses one it does not know.
pub fn variable_key(variable: &str) -> Option<String> {
    let name = variable.strip_prefix("TOOLGRAPH_")?;
    if name.is_empty() || NOT_CONFIG_KEYS.iter().any(|n| name.eq_ignore_ascii_case(n)) {
        return None;
    }
    Some(env_key(name))
}

/// The key a `TOOLGRAPH_` variable (without the prefix) sets, with `.` between its parts.
fn env_key(variable: &str) -> String {
    let lower = variable.to_ascii_lowercase().replace("__", ".");
    for s in SECTIONS {
        let Some(rest) = lower.strip_prefix(s).and_then(|r| r.strip_prefix('_')) else { continue };
        let tables = SUBSECTIONS.iter().find(|(section, _)| section == s).map_or(&[][..], |(_, t)| *t);
        for t in tables {
            if let Some(key) = rest.strip_prefix(t).and_then(|r| r.strip_prefix('_')) {
                return format!("{s}.{t}.{key}");
            }
        }
        return format!("{s}.{rest}");
    }
    lower
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
