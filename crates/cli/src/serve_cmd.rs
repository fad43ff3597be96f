//! `toolgraph serve`: the chat service on the configured store, until SIGTERM or Ctrl-C.

use crate::agent;
use crate::reload::{DeclaredAgent, Reloader};
use anyhow::Context;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_agents::assembly::KeptVersions;
use toolgraph_agents::assembly::{self, SharedParts};
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentDeps;
use toolgraph_agents::sources::GraphSources;
use toolgraph_agents::versions::VersionedAgent;
use toolgraph_config::{AgentGraph, AuthKind, BudgetPeriodKind, Config, RunEventsKind, StoreKind};
use toolgraph_conversations::backend::BackendConversationStore;
use toolgraph_conversations::{
    ConversationStore, MemoryConversationStore, PostgresConversationStore, PostgresRunEvents, ProjectingCheckpointer,
    RunEventStore, SqliteConversationStore,
};
use toolgraph_graph::{
    Checkpointer, MemoryCheckpointer, PgDatabase, PostgresCheckpointer, SqliteCheckpointer, SqliteDatabase,
};
use toolgraph_server::auth::{Auth, HmacVerifier, PostgresReplayStore};
use toolgraph_server::{AllowedHosts, HttpServer};
use toolgraph_server::{
    AppState, Attachments, BudgetPeriod, ChatService, McpEndpoint, MemoryResources, Retention, SearchService,
    ServedAgent, ServiceOptions, TokenBudget,
};

/// The pool to close once every run has finished.
enum StoreCloser {
    None,
    Sqlite(SqliteDatabase),
    Postgres(sqlx::PgPool),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (overrides `server.bind`).
    #[arg(long, value_name = "ADDR")]
    bind: Option<String>,
    /// Port (overrides `server.port`; `PORT` is read too, as benchmark harnesses set it).
    #[arg(long, env = "PORT")]
    port: Option<u16>,
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the service");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The service's own database: PostgreSQL when `database_url` is set, else the data
/// directory's SQLite file.
enum Database {
    Postgres(PostgresCheckpointer),
    Sqlite(SqliteCheckpointer),
}

impl Database {
    /// What closes it when `serve` ends.
    fn closer(&self) -> StoreCloser {
        match self {
            Self::Postgres(c) => StoreCloser::Postgres(c.pool().clone()),
            Self::Sqlite(c) => StoreCloser::Sqlite(c.database().clone()),
        }
    }
}

async fn open_database(cfg: &Config) -> anyhow::Result<Database> {
    Ok(match crate::agent::postgres_checkpointer(cfg).await? {
        Some(checkpointer) => Database::Postgres(checkpointer),
        None => {
            let path = cfg.data_dir.join("toolgraph.db");
            Database::Sqlite(
                SqliteCheckpointer::open(&path).await.with_context(|| format!("cannot open {}", path.display()))?,
            )
        }
    })
}

/// What `serve` keeps its state in.
struct Stores {
    checkpointer: Arc<dyn Checkpointer>,
    conversations: Arc<dyn ConversationStore>,
    closer: StoreCloser,
    /// The PostgreSQL database, when the checkpoints are there (replicas share it).
    postgres: Option<PgDatabase>,
    /// For the start-up line.
    name: &'static str,
}

async fn open_stores(cfg: &Config, backend: Option<&BackendConversationStore>) -> anyhow::Result<Stores> {
    let stores = |checkpointer: ProjectingCheckpointer, conversations, closer, postgres, name| Stores {
        checkpointer: Arc::new(checkpointer),
        conversations,
        closer,
        postgres,
        name,
    };
    if cfg.server.store == StoreKind::Memory && cfg.database_url.is_none() {
        let store: Arc<dyn ConversationStore> = Arc::new(MemoryConversationStore::new());
        let ckpt = ProjectingCheckpointer::forwarding(MemoryCheckpointer::new(), Arc::clone(&store), project);
        return Ok(stores(ckpt, store, StoreCloser::None, None, "memory"));
    }
    let db = open_database(cfg).await?;
    let postgres = match &db {
        Database::Postgres(c) => Some(c.database().clone()),
        Database::Sqlite(_) => None,
    };
    if let Some(backend) = backend {
        // The backend keeps the conversation; the checkpoints stay with the service.
        let store: Arc<dyn ConversationStore> = Arc::new(backend.clone());
        let closer = db.closer();
        let ckpt = match db {
            Database::Postgres(c) => ProjectingCheckpointer::forwarding(c, Arc::clone(&store), project),
            Database::Sqlite(c) => ProjectingCheckpointer::forwarding(c, Arc::clone(&store), project),
        };
        return Ok(stores(ckpt, store, closer, postgres, "backend callbacks"));
    }
    let prepared = "cannot prepare the conversation store";
    let closer = db.closer();
    Ok(match db {
        Database::Postgres(c) => {
            let store = PostgresConversationStore::open(c.database().clone()).await.context(prepared)?;
            stores(ProjectingCheckpointer::postgres(c, project), Arc::new(store), closer, postgres, "postgres")
        }
        Database::Sqlite(c) => {
            let store = SqliteConversationStore::new(c.database().clone()).await.context(prepared)?;
            stores(ProjectingCheckpointer::sqlite(c, project), Arc::new(store), closer, None, "sqlite")
        }
    })
}

/// Where runs' frames are shared with other replicas (`server.run_events`): PostgreSQL's
/// `run_events` table, listened to over a direct connection (`database_migration_url` when
/// the pool goes through a transaction pooler, which cannot keep a `LISTEN`).
async fn run_events(cfg: &Config, db: Option<&PgDatabase>) -> anyhow::Result<Option<Arc<dyn RunEventStore>>> {
    use std::str::FromStr;
    let db = match (cfg.server.run_events, db) {
        (RunEventsKind::Process, _) | (RunEventsKind::Auto, None) => return Ok(None),
        (_, Some(db)) => db.clone(),
        (RunEventsKind::Postgres, None) => anyhow::bail!("server.run_events = \"postgres\" needs database_url"),
    };
    let url = cfg.database_migration_url.as_ref().or(cfg.database_url.as_ref()).context("database_url is not set")?;
    let listen = sqlx::postgres::PgConnectOptions::from_str(url.expose())
        .with_context(|| format!("{} is not a valid URL", url.redacted_url()))?;
    let events = PostgresRunEvents::open(db, listen)
        .await
        .context("cannot share run events through PostgreSQL (server.run_events)")?;
    Ok(Some(Arc::new(events)))
}

/// Whether documents may be attached: uploads wait in the conversation store, which the
/// backend's is not; the memory store's conversation ids start again with every process, and
/// would meet older attachments.
fn keeps_uploads(cfg: &Config) -> bool {
    cfg.server.store == StoreKind::Sqlite
}

/// `[server.token_budget]` as the service takes it; `None` when no tenant has a budget.
fn token_budget(cfg: &Config) -> Option<TokenBudget> {
    let b = &cfg.server.token_budget;
    b.is_set().then(|| TokenBudget {
        tokens: b.tokens,
        period: match b.period {
            BudgetPeriodKind::Hour => BudgetPeriod::Hour,
            BudgetPeriodKind::Day => BudgetPeriod::Day,
            BudgetPeriodKind::Month => BudgetPeriod::Month,
        },
        tenants: b.tenant_budgets().into_iter().collect(),
    })
}

/// `[server.retention]` as the service takes it; `None` when everything is kept.
fn retention(cfg: &Config) -> Option<Retention> {
    const DAY: Duration = Duration::from_secs(86_400);
    let r = &cfg.server.retention;
    let days = |d: u32| (d > 0).then(|| DAY * d);
    let keep = |k: u32| (k > 0).then_some(u64::from(k));
    let tenants = r.tenant_overrides();
    r.is_set().then(|| Retention {
        conversation_idle: days(r.conversation_idle_days),
        tenants: tenants.iter().filter_map(|(t, o)| Some((*t, days(o.conversation_idle_days?)))).collect(),
        agents: r.agents.iter().filter_map(|(a, o)| Some((a.clone(), days(o.conversation_idle_days?)))).collect(),
        keep_checkpoints: keep(r.keep_checkpoints),
        tenants_keep: tenants.iter().filter_map(|(t, o)| Some((*t, keep(o.keep_checkpoints?)))).collect(),
        agents_keep: r.agents.iter().filter_map(|(a, o)| Some((a.clone(), keep(o.keep_checkpoints?)))).collect(),
        usage: days(r.usage_days),
        every: Duration::from_secs(60 * u64::from(r.every_minutes)),
        background: true,
    })
}

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Print what was deleted as JSON.
    #[arg(long)]
    json: bool,
}

/// What searches people's items by meaning too: the knowledge bases' retriever (its model,
/// loaded once, and its fusion), with `server.item_search = "hybrid"`.
fn item_index(cfg: &Config, retriever: &toolgraph_rag::Retriever) -> Option<toolgraph_rag::Retriever> {
    (cfg.server.item_search == toolgraph_config::ItemSearchKind::Hybrid).then(|| retriever.clone())
}

/// `toolgraph gc`: one retention pass now, on the configured store, whether or not a replica
/// ran one lately (docs/service.md, "Retention").
pub async fn gc(args: GcArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let backend = assembly::backend(cfg)?;
    let Stores { checkpointer, conversations: store, closer, postgres, .. } =
        open_stores(cfg, backend.as_ref()).await?;
    let options = ServiceOptions {
        instance_id: cfg.server.instance_id.clone().unwrap_or_else(|| "toolgraph-gc".into()),
        run_events: run_events(cfg, postgres.as_ref()).await?,
        // This pass only: no timer of its own (a server's pass is not delayed by it).
        retention: retention(cfg).map(|r| Retention { background: false, ..r }),
        token_budget: token_budget(cfg),
        attachments: keeps_uploads(cfg).then(|| Attachments {
            store: crate::retrieval::attachment_store(cfg),
            retriever: crate::retrieval::retriever(cfg),
        }),
        ..ServiceOptions::default()
    };
    // No agents: a pass deletes data, it runs nothing.
    let service = ChatService::new(BTreeMap::new(), String::new(), store, checkpointer, options);
    let pruned = service.prune(toolgraph_conversations::now_ms(), true).await;
    service.shutdown().await;
    match closer {
        StoreCloser::Sqlite(db) => db.close().await,
        StoreCloser::Postgres(pool) => pool.close().await,
        StoreCloser::None => {}
    }
    let p = pruned.map_err(|e| anyhow::anyhow!("the retention pass failed: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        if !cfg.server.retention.is_set() {
            println!("server.retention keeps everything: only expired memory items were looked for");
        }
        println!(
            "deleted {} idle conversations (with their messages, checkpoints and run frames), {} threads that \
             never ran, {} checkpoints of finished threads (folded into later ones), {} token usage rows, {} \
             expired memory items",
            p.conversations, p.threads, p.checkpoints, p.usage_rows, p.memory_items
        );
        if p.leftovers > 0 {
            println!(
                "{} deleted conversations' checkpoints or run frames could not be deleted (see the log)",
                p.leftovers
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// This machine's name, for the default instance id; `localhost` when it cannot be read.
async fn hostname() -> String {
    tokio::fs::read_to_string("/proc/sys/kernel/hostname")
        .await
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub async fn run(args: ServeArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    match crate::limits::raise_open_files() {
        Some((before, after)) if after > before => {
            tracing::info!(before, after, "raised the open-files limit (two sockets per open stream)")
        }
        Some((_, after)) => tracing::debug!(limit = after, "open-files limit"),
        None => tracing::debug!("the open-files limit is the system's"),
    }
    let backend = assembly::backend(cfg)?;
    let Stores { checkpointer, conversations: store, closer, postgres, name: store_name } =
        open_stores(cfg, backend.as_ref()).await?;
    let run_events = run_events(cfg, postgres.as_ref()).await?;
    let shares_runs = run_events.is_some();
    let kb = crate::retrieval::kb_store(cfg);
    // The local embedding model loads on the first search that needs it, on a blocking thread.
    let retriever = crate::retrieval::retriever(cfg);
    let attachments = keeps_uploads(cfg).then(|| crate::retrieval::attachment_store(cfg));
    let local_model = agent::local_model(cfg).await?;
    let tool_model = agent::tool_model(cfg, local_model.as_ref());
    let shared = Arc::new(SharedParts {
        tools: assembly::all_tools(
            cfg,
            Arc::clone(&kb),
            retriever.clone(),
            backend.as_ref(),
            tool_model,
            attachments.clone(),
        )
        .await?,
        local_model,
        schema_prompt: assembly::schema_prompt(cfg, backend.as_ref()),
        kinds: Default::default(),
        memory_store: Some(Arc::clone(&store)),
        item_index: item_index(cfg, &retriever),
    });
    let served_cfg = Arc::new(cfg.clone());
    // With the in-process model, each ReAct agent's prompt is computed before the service is
    // ready, so no first turn pays for it; the model's KV cache keeps several side by side
    // (docs/models.md). The default agent goes last: the most recently used stays longest.
    let default_agent = cfg.default_agent_name();
    let mut warm: Vec<(String, Arc<AgentDeps>)> = Vec::new();
    let mut agents = BTreeMap::new();
    let mut declared = Vec::new();
    for name in cfg.effective_agents().keys() {
        let sources = GraphSources::read(cfg, name)?;
        let a = assembly::build_from(cfg, name, &sources, Arc::clone(&checkpointer), &shared)?;
        if shared.local_model.is_some() && a.settings.graph == AgentGraph::React {
            warm.push((a.name.clone(), Arc::clone(a.graph.deps())));
        }
        // The version's sources are kept with the checkpoints: a run paused on it resumes on it
        // after a restart, an upgrade or a change of its file, and on any replica.
        let kept = KeptVersions {
            cfg: Arc::clone(&served_cfg),
            shared: Arc::clone(&shared),
            checkpointer: Arc::clone(&checkpointer),
            name: a.name.clone(),
        };
        if let Some(version) = a.graph.version() {
            kept.keep(version, &sources)
                .await
                .with_context(|| format!("cannot keep the definition of agent {}'s graph", a.name))?;
        }
        let agent = VersionedAgent::rebuilding(Arc::new(assembly::chat_agent(a.graph, &a.channels)), Arc::new(kept));
        if let Some(file) = a.settings.graph_file.clone() {
            // Its file may change while serving: new turns take the new version.
            declared.push(DeclaredAgent { name: a.name.clone(), file, agent: agent.clone() });
        }
        agents.insert(a.name.clone(), ServedAgent::new(agent, a.settings));
    }
    let auth = match cfg.server.auth {
        AuthKind::None => Auth::None,
        AuthKind::Hmac => {
            let secret = cfg.server.hmac_secret.as_ref().context("server.hmac_secret is required")?;
            let verifier = HmacVerifier::new(secret.expose().as_bytes().to_vec());
            // Replicas on one database share the accepted nonces: a signed request is accepted
            // once by all of them, and still after a restart (docs/service.md, "Signed requests").
            Auth::Hmac(match &postgres {
                Some(db) => verifier.with_replay_store(Arc::new(
                    PostgresReplayStore::open(db.clone()).await.context("cannot prepare the signature nonces table")?,
                )),
                None => verifier,
            })
        }
        AuthKind::ApiKey => {
            let auth = Auth::api_keys(&cfg.server.api_keys)
                .and_then(|a| a.bind_tenant_ids(&cfg.server.api_key_tenants))
                .map_err(|e| anyhow::anyhow!("server.api_keys: {e}"))?;
            // The configuration refused unbound keys unless allow_unbound_api_keys opted in.
            let unbound = auth.unbound_slugs();
            if !unbound.is_empty() {
                tracing::warn!(
                    tenants = %unbound.join(", "),
                    "server.allow_unbound_api_keys: these keys' requests may name any tenantId"
                );
            }
            auth
        }
    };
    let bind = args.bind.unwrap_or_else(|| cfg.server.bind.clone());
    let port = args.port.unwrap_or(cfg.server.port);
    let listener = tokio::net::TcpListener::bind((bind.as_str(), port))
        .await
        .with_context(|| format!("cannot listen on {bind}:{port}"))?;
    let addr = listener.local_addr()?;
    let instance_id = match &cfg.server.instance_id {
        Some(id) => id.clone(),
        None => format!("{}:{}", hostname().await, addr.port()),
    };
    let options = ServiceOptions {
        auth,
        max_runs_per_tenant: cfg.server.max_runs_per_tenant,
        instance_id,
        turn_lease: std::time::Duration::from_millis(cfg.server.turn_lease_ms),
        run_events,
        // Other processes share the store: one that died leaves its turns to be taken over.
        takeover_every: (postgres.is_some() || cfg.server.store == StoreKind::Backend)
            .then(|| std::time::Duration::from_millis(cfg.server.turn_lease_ms / 3)),
        token_budget: token_budget(cfg),
        retention: retention(cfg),
        attachments: attachments.map(|store| Attachments { store, retriever: retriever.clone() }),
        item_index: item_index(cfg, &retriever),
    };
    warm.sort_by_key(|(name, _)| *name == default_agent);
    let app = AppState::new(ChatService::new(agents, default_agent, store, Arc::clone(&checkpointer), options));
    if cfg.mcp.http {
        let mut export =
            toolgraph_agents::mcp::export(cfg, shared.tools.clone(), Arc::clone(&kb)).map_err(anyhow::Error::msg)?;
        // A backend's store keeps no items.
        if app.chat().keeps_threads() {
            export = export.with_resources(Arc::new(MemoryResources::new(app.chat().clone())));
        }
        tracing::info!(tools = %export.tool_names().join(", "), "serving MCP on /mcp");
        app.enable_mcp(McpEndpoint::new(export, &cfg.server.allowed_hosts));
    }
    // The query embedder of the default knowledge base is loaded before the service is ready
    // too (else the first search pays for it); a model that cannot load is reported by the
    // searches that need it.
    let embedder_ahead = {
        let (r, kb, tenant, name) =
            (retriever.clone(), Arc::clone(&kb), cfg.rag.tenant.clone(), cfg.rag.default_kb.clone());
        tokio::task::spawn_blocking(move || match kb.open(&tenant, &name) {
            Ok(base) if base.manifest().embedding.is_some() => r.embedder().map(|_| ()),
            _ => Ok(()),
        })
    };
    app.enable_search(SearchService { store: kb, default_kb: cfg.rag.default_kb.clone(), retriever });
    // Turns this instance was running when it last stopped are closed before it serves.
    app.chat().recover().await.context("cannot release this instance's earlier runs")?;
    if cfg.llm.base_url.is_none() && cfg.llm.local_model.is_some() && !crate::allocator::CommandAllocator::from_env() {
        tracing::warn!(
            "the in-process chat model runs on jemalloc, serve's default allocator for many open streams; \
             TOOLGRAPH_ALLOCATOR=mimalloc favours model work instead (embedding ran 1.8x faster on it, \
             docs/configuration.md)"
        );
    }
    if let Ok(Err(e)) = embedder_ahead.await {
        tracing::warn!(error = %e, "cannot load the query embedding model ahead; the first search will try");
    }
    for (name, deps) in warm {
        let started = std::time::Instant::now();
        match toolgraph_agents::kit::warm_up(&deps).await {
            Ok(()) => crate::notice::serve(format_args!(
                "the {name} agent's prompt computed ahead in {:.1} s",
                started.elapsed().as_secs_f64()
            )),
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "cannot compute the agent's prompt ahead; its first turn will")
            }
        }
    }
    let poll = (cfg.server.reload_poll_ms > 0).then(|| std::time::Duration::from_millis(cfg.server.reload_poll_ms));
    let reloader = Reloader { cfg: served_cfg, shared, checkpointer: Arc::clone(&checkpointer), agents: declared };
    reloader.spawn(poll);
    app.set_ready();
    crate::notice::serve(format_args!(
        "listening on http://{addr} (store: {store_name}, run events: {}, agents: {}, allocator: {})",
        if shares_runs { "postgres" } else { "process" },
        cfg.effective_agents().keys().cloned().collect::<Vec<_>>().join(", "),
        crate::allocator::CommandAllocator::name()
    ));
    let http = HttpServer {
        max_head_bytes: cfg.server.max_request_head_bytes,
        header_read_timeout: std::time::Duration::from_millis(cfg.server.header_read_timeout_ms),
        drain_timeout: std::time::Duration::from_millis(cfg.server.shutdown_drain_ms),
        max_connections: cfg.server.max_connections,
        write_timeout: std::time::Duration::from_millis(cfg.server.write_timeout_ms),
    };
    let router = match &cfg.server.ops_bind {
        None => toolgraph_server::router(app.clone()),
        Some(ops) => {
            let ops_listener = tokio::net::TcpListener::bind(ops.as_str())
                .await
                .with_context(|| format!("cannot listen on server.ops_bind {ops}"))?;
            crate::notice::serve(format_args!("/health and /metrics on http://{}", ops_listener.local_addr()?));
            let ops_router = toolgraph_server::ops_router(app.clone());
            let ops_http = http.clone();
            tokio::spawn(async move {
                let serving = ops_http.serve(ops_listener, ops_router, std::future::pending()).await;
                if let Err(e) = serving {
                    tracing::error!(error = %e, "the ops listener failed");
                }
            });
            toolgraph_server::api_router(app.clone())
        }
    };
    let router = if cfg.server.playground {
        let agents: Vec<String> = cfg.effective_agents().keys().cloned().collect();
        crate::notice::serve(format_args!("the playground is at http://{addr}/"));
        router.merge(toolgraph_server::playground_router(&agents, &cfg.default_agent_name(), &cfg.rag.tenant))
    } else {
        router
    };
    // Every route of the main address answers only the names the operator listed (DNS
    // rebinding); a separate ops address is for a scraper on a private network.
    let router = toolgraph_server::guard_hosts(router, AllowedHosts::new(&cfg.server.allowed_hosts));
    let stopping = app.clone();
    http.serve(listener, router, async move {
        shutdown_signal().await;
        crate::notice::serve("shutting down");
        // Ready turns 503 and runs are cancelled first, so open streams end.
        stopping.shutdown().await;
    })
    .await
    .context("the server failed")?;
    app.shutdown().await;
    // The stores close last, after every run wrote its final checkpoint.
    match closer {
        StoreCloser::Sqlite(db) => db.close().await,
        StoreCloser::Postgres(pool) => pool.close().await,
        StoreCloser::None => {}
    }
    Ok(ExitCode::SUCCESS)
}
