//! toolgraph as a library: the order desk of `examples/embed`, a program that adds what only
//! code can add — a tool of its own (`order_status`) and a node kind of its own
//! (`detect_language`) — to a graph declared in TOML (`shop.toml`), and serves it with the
//! same chat service and HTTP routes as `toolgraph serve` (docs/agents.md, "A node kind of your
//! own").
//!
//! ```text
//! cargo run -p embedded-agent -- --config examples/embed/toolgraph.toml --port 8080
//! ```
//! The model is the OpenAI-compatible server `TOOLGRAPH_LLM_BASE_URL` names; conversations and
//! checkpoints go to `<data dir>/embed.db` (SQLite).

use anyhow::Context;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use toolgraph_agents::assembly::{self, SharedParts};
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::conversation::project;
use toolgraph_agents::declared::{CustomKind, CustomNode, NodeKinds};
use toolgraph_agents::kit::{AgentDeps, AgentState, AgentUpdate, ChannelWrite};
use toolgraph_config::Config;
use toolgraph_conversations::{ProjectingCheckpointer, SqliteConversationStore};
use toolgraph_graph::{Checkpointer, Node, NodeError, NodeOutput, RunContext, SqliteCheckpointer};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use toolgraph_tools::{Tool, ToolBuilder, ToolError, ToolRegistry};

/// What `order_status` takes.
#[derive(Deserialize, JsonSchema)]
struct OrderQuery {
    /// The order's number, such as A-1001.
    order: String,
}

/// The shop's orders (a real program would ask its database).
const ORDERS: [(&str, &str, &str); 2] = [("A-1001", "shipped", "2026-11-27"), ("B-2002", "preparing", "")];

/// A read tool of the program's own: an order's status.
fn order_status() -> anyhow::Result<Arc<dyn Tool>> {
    let tool = ToolBuilder::<OrderQuery>::new(
        "order_status",
        "The status of an order of the Acme shop, by its number.",
    )
    .handler(|_ctx, q: OrderQuery| async move {
        let wanted = q.order.trim().to_uppercase();
        match ORDERS.iter().find(|(number, ..)| *number == wanted) {
            Some((number, status, shipped)) => Ok(
                json!({ "order": number, "status": status, "shipped_on": (!shipped.is_empty()).then_some(*shipped) }),
            ),
            None => Err(ToolError::not_found(format!("no order {wanted}: order numbers look like A-1001"))),
        }
    })?;
    Ok(tool)
}

/// Words that mark a language, by its code.
const MARKERS: [(&str, &[&str]); 3] = [
    ("en", &["the", "is", "my", "where", "what", "when", "order", "and", "thanks", "hello"]),
    ("es", &["el", "la", "es", "mi", "dónde", "donde", "qué", "cuándo", "pedido", "y", "gracias", "hola", "está"]),
    ("vi", &["của", "tôi", "là", "đâu", "không", "có", "đơn", "hàng", "cảm", "ơn"]),
];

/// A node kind of the program's own: writes the language of the person's last message (the
/// code among `with.languages` whose marker words it uses most; the first on a tie) into the
/// node's channel.
struct DetectLanguage;

impl DetectLanguage {
    fn languages(with: &Map<String, Value>) -> Result<Vec<String>, String> {
        let Some(list) = with.get("languages").and_then(Value::as_array) else {
            return Err("needs `languages`: a list of codes (en, es, vi)".into());
        };
        let mut codes = Vec::new();
        for code in list {
            match code.as_str() {
                Some(c) if MARKERS.iter().any(|(m, _)| *m == c) => codes.push(c.to_owned()),
                _ => return Err(format!("`{code}` is not a language it knows: en, es, vi")),
            }
        }
        if codes.is_empty() {
            return Err("`languages` is empty".into());
        }
        Ok(codes)
    }
}

impl CustomKind for DetectLanguage {
    fn check(&self, with: &Map<String, Value>) -> Result<(), String> {
        Self::languages(with).map(|_| ())
    }

    fn node(&self, decl: &CustomNode) -> Result<Arc<dyn Node<AgentState, AgentDeps>>, String> {
        let Some((channel, reducer)) = decl.channel.clone() else {
            return Err("needs `channel`: where the language goes".into());
        };
        let languages = Self::languages(&decl.with)?;
        let node = move |s: Arc<AgentState>, _ctx: RunContext<AgentDeps>| {
            let (languages, channel) = (languages.clone(), channel.clone());
            async move {
                let text = s.last_user_message().unwrap_or_default().to_lowercase();
                let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
                let score = |code: &str| {
                    let markers = MARKERS.iter().find(|(m, _)| *m == code).map_or(&[][..], |(_, w)| w);
                    words.iter().filter(|w| markers.contains(w)).count()
                };
                // The first language wins a tie (`max_by_key` keeps the last of equals).
                let best = languages.iter().rev().max_by_key(|code| score(code)).cloned().unwrap_or_default();
                let write = ChannelWrite { channel, reducer, value: Value::String(best) };
                Ok::<_, NodeError>(NodeOutput::Update(AgentUpdate { channels: vec![write], ..Default::default() }))
            }
        };
        Ok(Arc::new(node))
    }
}

/// `--config FILE`, `--port N` (0: any free port; the address is printed), `--data-dir DIR`.
struct Args {
    config: PathBuf,
    port: u16,
    data_dir: Option<PathBuf>,
}

fn args() -> anyhow::Result<Args> {
    let mut out = Args { config: PathBuf::from("examples/embed/toolgraph.toml"), port: 8080, data_dir: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--config" => out.config = value.into(),
            "--port" => out.port = value.parse().context("--port is a number")?,
            "--data-dir" => out.data_dir = Some(value.into()),
            other => anyhow::bail!("unknown option {other}; options: --config FILE, --port N, --data-dir DIR"),
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let mut cfg = Config::load(Some(&args.config)).with_context(|| format!("cannot load {}", args.config.display()))?;
    if let Some(dir) = args.data_dir {
        cfg.data_dir = dir;
    }
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("cannot create {}", cfg.data_dir.display()))?;

    // What only code can add: a tool and a node kind.
    let mut tools = ToolRegistry::new();
    tools.register(order_status()?)?;
    let mut kinds = NodeKinds::new();
    kinds.register("detect_language", DetectLanguage)?;
    let shared =
        SharedParts { tools, local_model: None, schema_prompt: None, kinds, memory_store: None, item_index: None };

    // The same stores and service as `toolgraph serve` on SQLite.
    let db = SqliteCheckpointer::open(&cfg.data_dir.join("embed.db")).await?;
    let conversations = Arc::new(SqliteConversationStore::new(db.database().clone()).await?);
    let checkpointer: Arc<dyn Checkpointer> = Arc::new(ProjectingCheckpointer::sqlite(db, project));
    let mut agents = BTreeMap::new();
    for name in cfg.effective_agents().keys() {
        // The declaration is checked here, custom kinds and tools included: a problem is an
        // error naming its file, line and field.
        let agent = assembly::build(&cfg, Some(name), Arc::clone(&checkpointer), &shared)?;
        agents.insert(agent.name.clone(), ServedAgent::new(GraphAgent::new(agent.graph), agent.settings));
    }
    let service =
        ChatService::new(agents, cfg.default_agent_name(), conversations, checkpointer, ServiceOptions::default());
    let app = AppState::new(service);
    app.chat().recover().await?;
    app.set_ready();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    eprintln!("embedded-agent: listening on http://{}", listener.local_addr()?);
    axum::serve(listener, toolgraph_server::router(app)).await?;
    Ok(())
}
