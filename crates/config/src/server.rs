//! `[server]`: `toolgraph serve` — store, auth, limits, the backend of the academy admin.

use crate::{Check, ConfigError, Secret, is_http_url};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where conversations, pending actions and checkpoints are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In process memory (tests, benchmarks); lost on exit.
    Memory,
    /// One SQLite file in the data directory (the default).
    Sqlite,
    /// The backend that fronts the service (the academy admin's deployment), through HMAC-signed `/internal/chatbot/**` calls
    /// (`server.backend_url`, `server.backend_hmac_secret`); checkpoints stay in
    /// `database_url` or the data directory's SQLite file.
    Backend,
}

/// Where the frames runs stream are kept, for clients that resume a stream
/// (docs/service.md, "Replicas").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunEventsKind {
    /// `postgres` when `database_url` is set, else `process`.
    Auto,
    /// In this process: a stream resumes only on the instance that runs it.
    Process,
    /// The `run_events` table of `database_url`, with `LISTEN/NOTIFY`: a stream resumes on
    /// any replica.
    Postgres,
}

/// How a person's store of items (their long-term memory) is searched (docs/memory.md,
/// "Search by meaning").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemSearchKind {
    /// By the words a query and an item share.
    #[default]
    Keyword,
    /// By words and by meaning: items are embedded with `rag.embedding` when written, and a
    /// query's keyword list and dense list are fused as the knowledge bases' hybrid search
    /// fuses (`rag.fusion`).
    Hybrid,
}

/// How the chat service authenticates requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// An internal service behind a backend: no credentials.
    None,
    /// `Authorization: Bearer <key>`, keys per tenant in `server.api_keys`.
    ApiKey,
    /// `X-Timestamp`, `X-Nonce` and `X-Signature: v2=…` (HMAC-SHA256 with `server.hmac_secret`
    /// of the method, path, sorted query, tenant slug, timestamp, nonce and body digest;
    /// docs/service.md).
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
    /// The names clients reach the service by: a request whose `Host` (or, from a browser,
    /// whose `Origin`) names another gets 403 on every route but `/health` and `/ready`, so a
    /// web page cannot reach a local service by DNS rebinding. `name` or `name:port`; `"*"`
    /// accepts any (behind a proxy that checks `Host` itself). Default: `localhost`,
    /// `127.0.0.1`, `::1`.
    pub allowed_hosts: Vec<String>,
    /// Serve the playground (a chat page in the browser) at `/`. Default: false. Env:
    /// `TOOLGRAPH_SERVER_PLAYGROUND`.
    pub playground: bool,
    /// Request authentication. Default: `none`.
    pub auth: AuthKind,
    /// Shared secret of `auth = "hmac"`. Env: `TOOLGRAPH_SERVER_HMAC_SECRET`.
    pub hmac_secret: Option<Secret>,
    /// `auth = "api_key"`: tenant slug → hex SHA-256 of its key (never the key itself).
    pub api_keys: BTreeMap<String, String>,
    /// `auth = "api_key"`: tenant slug → its numeric tenant id. A key then opens that tenant id
    /// only (403 for another in a body, query or path); without it the ids are the client's word.
    pub api_key_tenants: BTreeMap<String, i64>,
    /// `auth = "api_key"`: start even though some keys have no `api_key_tenants` entry, so
    /// their requests' `tenantId` is the client's word (any key may then act on any numeric
    /// tenant). Without it, such a configuration is refused at start-up. Default: false.
    pub allow_unbound_api_keys: bool,
    /// Most runs one tenant may have in flight; more get 429 + `Retry-After` (0: no limit).
    /// Default: 64.
    pub max_runs_per_tenant: usize,
    /// `store = "backend"`: the backend's base URL (the Lumie worker's `LUMIE_BACKEND_URL`).
    /// Env: `TOOLGRAPH_SERVER_BACKEND_URL`.
    pub backend_url: Option<String>,
    /// `store = "backend"`: the secret the calls are signed with (the Lumie worker's
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
    /// Most connections open at once; more wait in the listen backlog until one closes.
    /// Default: 16384.
    pub max_connections: usize,
    /// Longest a response write may wait for the client to read, in milliseconds; a client
    /// that stops reading its stream is disconnected after it. Default: 60000.
    pub write_timeout_ms: u64,
    /// After SIGTERM (runs already cancelled), how long open responses may take to finish before
    /// their connections are closed and the stores close, in milliseconds. Default: 30000.
    pub shutdown_drain_ms: u64,
    /// This instance's name in the run leases of the store: a restarted instance frees the
    /// leases it held under this name (its turns died with it), so it must be stable across
    /// restarts and unique among replicas sharing a database. Default: `HOSTNAME:PORT`.
    /// Env: `TOOLGRAPH_SERVER_INSTANCE_ID`.
    pub instance_id: Option<String>,
    /// How long a run's lease on its conversation lasts without renewal, in milliseconds (it is
    /// renewed every third of it): the longest a conversation stays blocked after the instance
    /// running its turn died and did not come back. At least 1000. Default: 30000.
    pub turn_lease_ms: u64,
    /// How often `serve` looks for a changed graph file (an agent's `graph_file`), in
    /// milliseconds; a changed one is checked and, if it passes, serves the agent's new turns
    /// (docs/agents.md, "Changing a graph while serving"). `0` reloads only on SIGHUP, which
    /// always reloads; otherwise at least 100. Default: 2000.
    pub reload_poll_ms: u64,
    /// Where runs' frames are kept for resuming streams: `auto` (PostgreSQL when
    /// `database_url` is set), `process` or `postgres`. Default: `auto`.
    /// Env: `TOOLGRAPH_SERVER_RUN_EVENTS`.
    pub run_events: RunEventsKind,
    /// `store = "backend"`: write tools the backend runs after approval (the academy admin's
    /// `create_announcement`, `send_sms`, …), by name.
    pub backend_tools: BTreeMap<String, BackendToolSettings>,
    /// The tokens each tenant's turns may use per period (docs/service.md, "Tokens").
    /// Default: no budget.
    pub token_budget: TokenBudgetSettings,
    /// How a person's store of items — what agents remember, LangGraph's store — is
    /// searched: `keyword`, or `hybrid` (by meaning too, with `rag.embedding`; docs/memory.md).
    /// Default: `keyword`.
    pub item_search: ItemSearchKind,
    /// How long data is kept (docs/service.md, "Retention"). Default: everything is kept.
    pub retention: RetentionSettings,
}

/// The period a token budget runs over, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriodKind {
    /// A clock hour.
    Hour,
    /// A calendar day.
    Day,
    /// A calendar month.
    Month,
}

/// `[server.token_budget]`: the tokens (prompt and completion, as the model reported them) each
/// tenant's turns may use per period; past it a new turn, or a decision that resumes one,
/// gets 429 with `Retry-After` until the next period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenBudgetSettings {
    /// Every tenant's budget per period, unless `tenants` names it. `0`: none. Default: 0.
    pub tokens: u64,
    /// `hour`, `day` or `month` (UTC). Default: `month`.
    pub period: BudgetPeriodKind,
    /// Numeric tenant id → its budget per period, in place of `tokens` (`0`: none for it).
    pub tenants: BTreeMap<String, u64>,
}

impl Default for TokenBudgetSettings {
    fn default() -> Self {
        Self { tokens: 0, period: BudgetPeriodKind::Month, tenants: BTreeMap::new() }
    }
}

impl TokenBudgetSettings {
    /// Whether any tenant has a budget.
    pub fn is_set(&self) -> bool {
        self.tokens > 0 || self.tenants.values().any(|t| *t > 0)
    }

    /// The named tenants' budgets by numeric id (checked when the configuration loaded).
    pub fn tenant_budgets(&self) -> BTreeMap<i64, u64> {
        self.tenants.iter().filter_map(|(id, t)| Some((id.parse().ok()?, *t))).collect()
    }
}

/// `[server.retention]`: how long conversations and what hangs off them are kept, pruned in the
/// background (one replica a pass) and by `toolgraph gc`. Every `0` keeps that data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// A conversation with no turn for this many days is deleted, with its messages, pending
    /// actions, checkpoints, run frames and LangGraph thread; so is a LangGraph thread that
    /// never ran. `0`: kept. Default: 0.
    pub conversation_idle_days: u32,
    /// Token usage rows older than this many days are deleted, never those of the current
    /// token budget period. `0`: kept. Default: 0.
    pub usage_days: u32,
    /// A finished thread keeps its last this many checkpoints: the older ones are folded into
    /// the first of those (its state stays whole; what a client can go back to or fork from
    /// is the last this many). `0`: all kept. Default: 0.
    pub keep_checkpoints: u32,
    /// How often a replica looks for data to prune, in minutes (one replica does each pass).
    /// At least 1. Default: 60.
    pub every_minutes: u32,
    /// Numeric tenant id → its own `conversation_idle_days` and `keep_checkpoints` (before
    /// `agents`).
    pub tenants: BTreeMap<String, RetentionOverride>,
    /// Agent name → its own `conversation_idle_days` and `keep_checkpoints`.
    pub agents: BTreeMap<String, RetentionOverride>,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            conversation_idle_days: 0,
            usage_days: 0,
            keep_checkpoints: 0,
            every_minutes: 60,
            tenants: BTreeMap::new(),
            agents: BTreeMap::new(),
        }
    }
}

impl RetentionSettings {
    /// Whether anything is ever pruned.
    pub fn is_set(&self) -> bool {
        self.conversation_idle_days > 0
            || self.usage_days > 0
            || self.keep_checkpoints > 0
            || self
                .tenants
                .values()
                .chain(self.agents.values())
                .any(|o| o.conversation_idle_days.is_some_and(|d| d > 0) || o.keep_checkpoints.is_some_and(|k| k > 0))
    }

    /// The tenants' overrides by numeric id (checked when the configuration loaded).
    pub fn tenant_overrides(&self) -> BTreeMap<i64, &RetentionOverride> {
        self.tenants.iter().filter_map(|(id, o)| Some((id.parse().ok()?, o))).collect()
    }
}

/// `[server.retention.tenants.ID]` or `[server.retention.agents.NAME]`: what it leaves out
/// follows the next rule (an agent's, then the default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionOverride {
    /// Days without a turn after which its conversations are deleted; `0`: kept.
    pub conversation_idle_days: Option<u32>,
    /// The checkpoints its finished threads keep; `0`: all.
    pub keep_checkpoints: Option<u32>,
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
    /// The action as the person approving it reads it, filled from the arguments: `{name}`
    /// (a list of strings joined by ", ") and `{#name}` (how many items), e.g. `"Send an SMS to
    /// {#recipients} recipients: {message}"`. Default: the tool's name and its arguments as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe: Option<String>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1".into(),
            port: 8000,
            store: StoreKind::Sqlite,
            ops_bind: None,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            playground: false,
            auth: AuthKind::None,
            hmac_secret: None,
            api_keys: BTreeMap::new(),
            api_key_tenants: BTreeMap::new(),
            allow_unbound_api_keys: false,
            max_runs_per_tenant: 64,
            backend_url: None,
            backend_hmac_secret: None,
            backend_timeout_ms: 10_000,
            max_request_head_bytes: 8 * 1024,
            header_read_timeout_ms: 30_000,
            max_connections: 16_384,
            write_timeout_ms: 60_000,
            shutdown_drain_ms: 30_000,
            instance_id: None,
            turn_lease_ms: 30_000,
            reload_poll_ms: 2_000,
            run_events: RunEventsKind::Auto,
            backend_tools: BTreeMap::new(),
            token_budget: TokenBudgetSettings::default(),
            item_search: ItemSearchKind::Keyword,
            retention: RetentionSettings::default(),
        }
    }
}

impl ServerSettings {
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        // HMAC secrets (the service's own and the backend's): at least 16 bytes.
        let is_long_enough = |s: Option<&Secret>| s.is_some_and(|s| s.expose().len() >= 16);
        if !(8 * 1024..=1024 * 1024).contains(&self.max_request_head_bytes) {
            return Err(check.invalid(
                "server.max_request_head_bytes",
                format!("{} is outside 8192..=1048576", self.max_request_head_bytes),
            ));
        }
        if let Some(name) = self.backend_tools.keys().next()
            && self.store != StoreKind::Backend
        {
            return Err(
                check.invalid(&format!("server.backend_tools.{name}"), "backend tools need store = \"backend\"".into())
            );
        }
        if let Some((name, _)) = self.backend_tools.iter().find(|(_, t)| t.description.trim().is_empty()) {
            return Err(check
                .invalid(&format!("server.backend_tools.{name}.description"), "the model needs a description".into()));
        }
        if self.allowed_hosts.iter().all(|h| h.trim().is_empty()) {
            return Err(check.invalid(
                "server.allowed_hosts",
                "is empty: list the host names clients reach this service by (or \"*\" for any)".into(),
            ));
        }
        if self.header_read_timeout_ms == 0 {
            return Err(check.invalid("server.header_read_timeout_ms", "must be greater than 0".into()));
        }
        if self.max_connections == 0 {
            return Err(check.invalid("server.max_connections", "must be greater than 0".into()));
        }
        if self.write_timeout_ms == 0 {
            return Err(check.invalid("server.write_timeout_ms", "must be greater than 0".into()));
        }
        if self.shutdown_drain_ms == 0 {
            return Err(check.invalid("server.shutdown_drain_ms", "must be greater than 0".into()));
        }
        if (1..100).contains(&self.reload_poll_ms) {
            return Err(check.invalid(
                "server.reload_poll_ms",
                format!("{} is less than 100 (0 turns looking off)", self.reload_poll_ms),
            ));
        }
        if self.turn_lease_ms < 1000 {
            return Err(check.invalid("server.turn_lease_ms", format!("{} is less than 1000", self.turn_lease_ms)));
        }
        if self.instance_id.as_deref().is_some_and(|i| i.trim().is_empty()) {
            return Err(check.invalid("server.instance_id", "must not be empty".into()));
        }
        match self.auth {
            AuthKind::Hmac if !is_long_enough(self.hmac_secret.as_ref()) => {
                return Err(
                    check.invalid("server.hmac_secret", "auth = \"hmac\" needs a secret of at least 16 bytes".into())
                );
            }
            AuthKind::ApiKey if self.api_keys.is_empty() => {
                return Err(check.invalid("server.api_keys", "auth = \"api_key\" needs at least one tenant key".into()));
            }
            _ => {}
        }
        if self.store == StoreKind::Backend {
            if !is_http_url(self.backend_url.as_deref()) {
                return Err(check
                    .invalid("server.backend_url", "store = \"backend\" needs the backend's http(s) base URL".into()));
            }
            if !is_long_enough(self.backend_hmac_secret.as_ref()) {
                return Err(check.invalid(
                    "server.backend_hmac_secret",
                    "store = \"backend\" needs the shared secret of the signed calls (at least 16 bytes)".into(),
                ));
            }
            if self.backend_timeout_ms == 0 {
                return Err(check.invalid("server.backend_timeout_ms", "must be greater than 0".into()));
            }
        }
        self.check_budget_and_retention(check)?;
        for (slug, id) in &self.api_key_tenants {
            let key = format!("server.api_key_tenants.{slug}");
            if !self.api_keys.contains_key(slug) {
                return Err(check.invalid(&key, format!("tenant '{slug}' has no key in server.api_keys")));
            }
            if *id <= 0 {
                return Err(check.invalid(&key, format!("{id} is not a tenant id (ids are positive)")));
            }
        }
        for (slug, digest) in &self.api_keys {
            if digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(check.invalid(
                    &format!("server.api_keys.{slug}"),
                    "must be the hex SHA-256 of the key (64 hex digits), e.g. from `printf %s KEY | sha256sum`".into(),
                ));
            }
        }
        if self.auth == AuthKind::ApiKey && !self.allow_unbound_api_keys {
            let unbound: Vec<&str> =
                self.api_keys.keys().filter(|s| !self.api_key_tenants.contains_key(*s)).map(String::as_str).collect();
            if !unbound.is_empty() {
                return Err(check.invalid(
                    "server.api_key_tenants",
                    format!(
                        "the API keys of {} open no tenant id, so they could act on any tenant: bind each \
                         slug to its numeric tenant id here, or set server.allow_unbound_api_keys = true \
                         to accept that",
                        unbound.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
    /// `[server.token_budget]` and `[server.retention]`: tenant keys are numeric ids, and both
    /// need a store that keeps usage and conversations itself.
    fn check_budget_and_retention(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        let tenant_id = |key: &str, id: &str| match id.parse::<i64>() {
            Ok(n) if n > 0 => Ok(()),
            _ => Err(check.invalid(key, format!("'{id}' is not a tenant id (a positive number)"))),
        };
        for id in self.token_budget.tenants.keys() {
            tenant_id(&format!("server.token_budget.tenants.{id}"), id)?;
        }
        for id in self.retention.tenants.keys() {
            tenant_id(&format!("server.retention.tenants.{id}"), id)?;
        }
        if self.retention.every_minutes == 0 {
            return Err(check.invalid("server.retention.every_minutes", "must be at least 1".into()));
        }
        if self.store == StoreKind::Backend {
            if self.token_budget.is_set() {
                return Err(check.invalid(
                    "server.token_budget",
                    "needs a store that keeps token usage: store = \"sqlite\" (or PostgreSQL), not \"backend\"".into(),
                ));
            }
            if self.retention.is_set() {
                return Err(check.invalid(
                    "server.retention",
                    "the backend keeps the conversations with store = \"backend\": its retention is the backend's"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}
