//! `toolgraph eval memory`: whether an agent uses what it remembers about a person
//! (docs/benchmarks.md, "Memory across conversations").
//!
//! `--cases FILE`: JSON lines `{"lang", "remembered": [facts…], "question", "expect":
//! [[alternatives…], …], "buried": bool}`. Each case is a new person: their facts are kept in
//! the agent's memory, as `remember` keeps them, then — with `buried` — more facts about other
//! things after them, so the ones that answer are not among the latest the prompt shows
//! (`recall`, 5 by default) and the agent has to call its `recall` tool. Then the question is
//! asked in a fresh conversation, as `chat` runs it. Right when every group of `expect` has one
//! alternative in the reply. The agent gets `[agents.NAME.memory]` with its defaults when its
//! configuration has none.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use toolgraph_agents::assembly::{self, SharedParts};
use toolgraph_agents::kit::user_turn;
use toolgraph_config::{Config, ItemSearchKind, MemorySettings};
use toolgraph_conversations::items::{IndexFields, PersonItems};
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, now_ms};
use toolgraph_graph::{MemoryCheckpointer, RunEvent, RunOptions, ThreadId};

#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// The cases (JSON lines), e.g. examples/eval/memory-cases.jsonl.
    #[arg(long, value_name = "FILE")]
    pub cases: PathBuf,
    /// The agent asked (default: the configured default).
    #[arg(long)]
    pub agent: Option<String>,
    /// Ask only the first N cases.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// How the person's items are searched: `keyword`, or `hybrid` (by meaning too, with
    /// `rag.embedding`). Default: the configuration's `server.item_search`.
    #[arg(long, value_name = "KIND", value_parser = ["keyword", "hybrid"])]
    pub item_search: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct Case {
    lang: String,
    remembered: Vec<String>,
    question: String,
    expect: Vec<Vec<String>>,
    #[serde(default)]
    buried: bool,
}

/// Facts about other things, kept after a buried case's own.
const FILLER: [&str; 6] = [
    "Likes to study in the library in the morning.",
    "Has a cat called Miso.",
    "Uses Linux on a ThinkPad.",
    "Plays volleyball on Thursdays.",
    "Prefers short answers.",
    "Takes the bus to the campus.",
];

#[derive(Debug, Serialize)]
struct Asked {
    lang: String,
    question: String,
    buried: bool,
    reply: String,
    right: bool,
    /// Whether the agent called its `recall` tool.
    called_recall: bool,
    seconds: f64,
    error: Option<String>,
}

pub async fn run(args: MemoryArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let text = tokio::fs::read_to_string(&args.cases)
        .await
        .with_context(|| format!("cannot read {}", args.cases.display()))?;
    let mut cases: Vec<Case> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", args.cases.display(), i + 1)))
        .collect::<anyhow::Result<_>>()?;
    cases.truncate(args.limit.unwrap_or(usize::MAX));
    if cases.is_empty() {
        bail!("{} holds no cases", args.cases.display());
    }
    let mut cfg = cfg.clone();
    let name = args.agent.clone().unwrap_or_else(|| cfg.default_agent_name());
    let mut agents = cfg.effective_agents();
    let settings = agents.get_mut(&name).with_context(|| format!("no agent named '{name}'"))?;
    if settings.memory.is_none() {
        settings.memory = Some(MemorySettings::default());
    }
    let namespace = settings
        .memory
        .as_ref()
        .and_then(|m| m.namespace.clone())
        .unwrap_or_else(|| vec!["memories".into(), name.clone()]);
    cfg.agents = agents;
    match args.item_search.as_deref() {
        Some("hybrid") => cfg.server.item_search = ItemSearchKind::Hybrid,
        Some(_) => cfg.server.item_search = ItemSearchKind::Keyword,
        None => {}
    }
    let index = (cfg.server.item_search == ItemSearchKind::Hybrid).then(|| crate::retrieval::retriever(&cfg));
    if index.is_some() && cfg.rag.embedding == toolgraph_config::EmbeddingProvider::None {
        bail!("item search \"hybrid\" embeds items with rag.embedding, which is \"none\"");
    }
    let store: Arc<dyn ConversationStore> = Arc::new(MemoryConversationStore::new());
    let local_model = crate::agent::local_model(&cfg).await?;
    let shared = SharedParts {
        tools: crate::agent::all_tools(&cfg, local_model.as_ref()).await?,
        local_model: local_model.clone(),
        schema_prompt: None,
        kinds: Default::default(),
        memory_store: Some(Arc::clone(&store)),
        item_index: index.clone(),
    };
    let agent = assembly::build(&cfg, Some(&name), Arc::new(MemoryCheckpointer::new()), &shared)?;
    let model_id = assembly::model(&cfg, &agent.settings, local_model.as_ref())?.model_id().to_owned();
    let mut results = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        let user = i as i64 + 1;
        let mut facts: Vec<&str> = case.remembered.iter().map(String::as_str).collect();
        if case.buried {
            facts.extend(FILLER);
        }
        let start = now_ms() - facts.len() as i64;
        // As `remember` keeps them: embedded when items are searched by meaning.
        let items = PersonItems::new(store.as_ref(), 1, user).indexed(index.as_ref());
        for (n, fact) in facts.iter().enumerate() {
            let mut value = Map::new();
            value.insert("text".into(), Value::String((*fact).to_owned()));
            items
                .put(namespace.clone(), format!("m{n}"), value, None, &IndexFields::Text, start + n as i64)
                .await
                .context("cannot keep a fact")?;
        }
        let asked = ask(&agent, user, case).await;
        if !args.json {
            println!(
                "{} [{}{}] {:?} → {:?}{}",
                if asked.right { "ok  " } else { "MISS" },
                asked.lang,
                if asked.buried { ", buried" } else { "" },
                asked.question,
                asked.reply.chars().take(160).collect::<String>(),
                asked.error.as_ref().map(|e| format!(" (error: {e})")).unwrap_or_default()
            );
        }
        results.push(asked);
    }
    let search = if index.is_some() { "hybrid" } else { "keyword" };
    report(&results, args.json, &model_id, search);
    Ok(ExitCode::SUCCESS)
}

/// Asks `case` of `user` (tenant 1) in a fresh conversation.
async fn ask(agent: &assembly::Agent, user: i64, case: &Case) -> Asked {
    let started = std::time::Instant::now();
    let thread = ThreadId::new("eval-memory", format!("u{user}"));
    let options =
        RunOptions { recursion_limit: agent.settings.recursion_limit, owns_thread: true, ..Default::default() };
    // Who is asking, as the service sets it on every turn.
    let context = json!({"tenant": "eval", "tenantId": 1, "userId": user}).as_object().cloned();
    let (mut reply, mut called_recall) = (String::new(), false);
    let started_run = agent.graph.start(&thread, user_turn(case.question.clone(), context), options).await;
    let error = crate::eval_answers::to_the_end(started_run, |event| match event {
        RunEvent::TextDelta { text } => reply.push_str(&text),
        RunEvent::ToolCall { name, .. } if name == "recall" => called_recall = true,
        _ => {}
    })
    .await;
    let reply = reply.trim().to_owned();
    let lowered = reply.to_lowercase();
    let right = case.expect.iter().all(|group| group.iter().any(|alt| lowered.contains(&alt.to_lowercase())));
    Asked {
        lang: case.lang.clone(),
        question: case.question.clone(),
        buried: case.buried,
        reply,
        right,
        called_recall,
        seconds: started.elapsed().as_secs_f64(),
        error,
    }
}

#[derive(Debug, Default, Serialize)]
struct Tally {
    cases: usize,
    right: usize,
    called_recall: usize,
}

fn report(results: &[Asked], json: bool, model: &str, item_search: &str) {
    let mut by: BTreeMap<String, Tally> = BTreeMap::new();
    for a in results {
        for key in [format!("lang {}", a.lang), (if a.buried { "buried" } else { "in the prompt" }).to_owned()] {
            let t = by.entry(key).or_default();
            t.cases += 1;
            t.right += usize::from(a.right);
            t.called_recall += usize::from(a.called_recall);
        }
    }
    let right = results.iter().filter(|a| a.right).count();
    let seconds: f64 = results.iter().map(|a| a.seconds).sum();
    if json {
        let all = json!({
            "model": model, "item_search": item_search, "cases": results.len(), "right": right, "by": by,
            "results": results,
        });
        println!("{all}");
        return;
    }
    println!(
        "{model}, items searched by {item_search}: {right} of {} right ({:.0} %), {:.1} s a question",
        results.len(),
        100.0 * right as f64 / results.len().max(1) as f64,
        seconds / results.len().max(1) as f64
    );
    for (key, t) in &by {
        println!("  {key}: {} of {} right, recall called in {}", t.right, t.cases, t.called_recall);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped cases read as cases: four languages, half of them buried, each expecting
    /// something its remembered facts hold.
    #[test]
    fn the_shipped_cases_parse_and_their_facts_hold_the_answers() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/eval/memory-cases.jsonl");
        let cases: Vec<Case> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        let langs: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.lang.as_str()).collect();
        assert_eq!(langs.into_iter().collect::<Vec<_>>(), ["en", "es", "ko", "vi"]);
        assert_eq!(cases.iter().filter(|c| c.buried).count() * 2, cases.len());
        for c in &cases {
            let facts = c.remembered.join(" ").to_lowercase();
            assert!(
                c.expect.iter().all(|g| g.iter().any(|alt| facts.contains(&alt.to_lowercase()))),
                "{}: the facts do not hold the answer",
                c.question
            );
        }
    }
}
