//! `toolgraph chat`: a terminal conversation with an agent, run in-process.
//!
//! Tokens stream to stdout; tool calls, results and approval prompts go to stderr, so the
//! reply text can be piped. Every write action is put to the user as a y/n question. The
//! conversation is checkpointed (SQLite in the data directory, or PostgreSQL), and
//! `--continue` picks the last one up again, in a new process. With `--url` the same
//! conversation is held with a running `toolgraph serve` over HTTP ([`crate::remote_chat`]).

use crate::agent;
use crate::terminal::{ask_approval, ask_question, show_tool_call, show_tool_result};
use anyhow::{Context, bail};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use tokio::sync::mpsc;
use toolgraph_agents::assembly::{self, Agent, SharedParts};
use toolgraph_agents::kit::{ApprovalRequest, Question, user_turn};
use toolgraph_config::Config;
use toolgraph_graph::{
    Decision, GraphError, PendingInterrupt, ResumeResult, RunEvent, RunHandle, RunOptions, RunOutcome, ThreadId,
};

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// Agent to talk to. Default: the configured default agent.
    #[arg(long)]
    agent: Option<String>,
    /// Continue the last conversation with this agent.
    #[arg(long = "continue", short = 'c', conflicts_with = "url")]
    resume_last: bool,
    /// A state value for injected tool arguments, e.g. `--context asignatura=iv` (repeatable;
    /// keys must be among the agent's `state_keys`).
    #[arg(long = "context", value_name = "KEY=VALUE")]
    context: Vec<String>,
    /// Talk to a running `toolgraph serve` at this address (e.g. http://127.0.0.1:8080)
    /// through its HTTP API instead of running the agent in this process.
    #[arg(long)]
    url: Option<String>,
    /// With --url: the tenant slug to speak as. Default: `rag.tenant` (the tenant `ingest`
    /// writes to), so the agent's searches find what was ingested.
    #[arg(long, requires = "url")]
    tenant_slug: Option<String>,
    /// With --url: the numeric tenant id.
    #[arg(long, default_value_t = 1, requires = "url")]
    tenant_id: i64,
    /// With --url: the numeric user id.
    #[arg(long, default_value_t = 1, requires = "url")]
    user_id: i64,
    /// With --url: continue this conversation instead of starting a new one.
    #[arg(long, requires = "url")]
    conversation_id: Option<i64>,
    /// With --url: the tenant's key when the service runs `auth = "api_key"`.
    #[arg(long, env = "TOOLGRAPH_API_KEY", hide_env_values = true, requires = "url")]
    api_key: Option<String>,
    /// With --url: write every event and confirm exchange to this file as JSON lines.
    #[arg(long, value_name = "FILE", requires = "url")]
    transcript: Option<std::path::PathBuf>,
    /// With --url: a document (md, txt, html, pdf, json) the first message attaches to the
    /// conversation, which the agent's search then reads (repeatable).
    #[arg(long, value_name = "FILE", requires = "url")]
    attach: Vec<std::path::PathBuf>,
}

/// Lines of stdin, read on a thread of their own (reading stdin blocks).
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `KEY=VALUE` pairs as a state object (values parsed as JSON when they are JSON).
pub(crate) fn context_pairs(pairs: &[String]) -> anyhow::Result<Option<Map<String, Value>>> {
    if pairs.is_empty() {
        return Ok(None);
    }
    let mut map = Map::new();
    for pair in pairs {
        let Some((k, v)) = pair.split_once('=') else { bail!("--context expects KEY=VALUE, got '{pair}'") };
        map.insert(k.to_owned(), serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned())));
    }
    Ok(Some(map))
}

/// The user's next non-empty line, after a `you>` prompt on a terminal; scripted input (a
/// pipe) is echoed instead, so the output reads as a dialogue. `None` at the end of input.
async fn next_message(lines: &mut mpsc::Receiver<String>, interactive: bool) -> Option<String> {
    loop {
        if interactive {
            eprint!("you> ");
            let _ = std::io::stderr().flush();
        }
        let line = lines.recv().await?;
        if line.trim().is_empty() {
            continue;
        }
        if !interactive {
            eprintln!("\nyou> {line}");
        }
        return Some(line);
    }
}

fn parse_context(agent: &Agent, pairs: &[String]) -> anyhow::Result<Option<Map<String, Value>>> {
    let map = context_pairs(pairs)?;
    if let Some(k) = map.iter().flat_map(|m| m.keys()).find(|k| !agent.settings.state_keys.contains(k)) {
        bail!("agent '{}' does not accept context key '{k}' (state_keys: {:?})", agent.name, agent.settings.state_keys);
    }
    Ok(map)
}

pub async fn run(args: ChatArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    if args.url.is_some() {
        return run_remote(args, cfg).await;
    }
    let store = agent::checkpointer(cfg).await?;
    // A terminal conversation has no tenant, so no tenant schema in its prompt.
    let local_model = agent::local_model(cfg).await?;
    let tools = agent::all_tools(cfg, local_model.as_ref()).await?;
    let shared = SharedParts {
        tools,
        local_model,
        schema_prompt: None,
        kinds: Default::default(),
        memory_store: None,
        item_index: None,
    };
    let agent = assembly::build(cfg, args.agent.as_deref(), store, &shared)?;
    // Who the turn acts for, over the given context as the service sets it over a request's.
    let mut context = parse_context(&agent, &args.context)?.unwrap_or_default();
    context.extend(crate::agent::local_identity(cfg));
    let context = Some(context);
    let last_file = cfg.data_dir.join("chat").join(format!("{}.last-thread", agent.name));
    let thread = if args.resume_last {
        let id = tokio::fs::read_to_string(&last_file)
            .await
            .with_context(|| format!("no earlier conversation with agent '{}' to continue", agent.name))?;
        ThreadId::new("cli", id.trim())
    } else {
        let id = uuid::Uuid::now_v7().simple().to_string();
        if let Some(dir) = last_file.parent() {
            tokio::fs::create_dir_all(dir).await.with_context(|| format!("cannot create {}", dir.display()))?;
        }
        tokio::fs::write(&last_file, &id).await.with_context(|| format!("cannot write {}", last_file.display()))?;
        ThreadId::new("cli", id)
    };
    let interactive = std::io::stdin().is_terminal();
    let mut lines = stdin_lines();
    eprintln!("toolgraph chat · agent '{}' · conversation {} · end with Ctrl-D", agent.name, thread);
    if args.resume_last
        && let Some(head) = agent.graph.thread_state(&thread).await?
    {
        eprintln!("(continuing: {} earlier messages)", head.state.messages.len());
        settle_pause(&agent, &thread, &mut lines).await?;
    }
    while let Some(line) = next_message(&mut lines, interactive).await {
        let turn = || agent.graph.start(&thread, user_turn(line.clone(), context.clone()), owned(&agent));
        let started = match turn().await {
            // A pause from before (undecided, or decided but not applied when the last run
            // stopped): settled first, then the message goes.
            Err(GraphError::AwaitingDecision { .. }) => {
                settle_pause(&agent, &thread, &mut lines).await?;
                turn().await
            }
            other => other,
        };
        match started {
            Ok(run) => drive(&agent, &thread, run, &mut lines).await?,
            Err(e @ GraphError::AwaitingDecision { .. }) => eprintln!("{e}"),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Run options of the terminal chat: the only process on its thread, so a run it finds
/// stopped mid-way is dead.
fn owned(agent: &Agent) -> RunOptions {
    RunOptions { recursion_limit: agent.settings.recursion_limit, owns_thread: true, ..RunOptions::default() }
}

/// Settles the thread's pause, if it has one: asks for the undecided actions (decisions made
/// earlier stand) and applies them, driving the run to its end.
async fn settle_pause(agent: &Agent, thread: &ThreadId, lines: &mut mpsc::Receiver<String>) -> anyhow::Result<()> {
    let Some(head) = agent.graph.thread_state(thread).await? else { return Ok(()) };
    if head.pending.is_empty() {
        return Ok(());
    }
    if let Some(run) = approve_and_resume(agent, thread, head.undecided(), lines).await? {
        drive(agent, thread, run, lines).await?;
    }
    Ok(())
}

/// `chat --url`: the conversation through a running service's HTTP API. The service checks
/// the agent and its context keys.
async fn run_remote(args: ChatArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    use crate::remote_chat::{RemoteChat, RemoteOptions};
    let Some(url) = args.url else { bail!("--url is required") };
    let mut chat = RemoteChat::new(RemoteOptions {
        url: url.clone(),
        tenant_slug: args.tenant_slug.unwrap_or_else(|| cfg.rag.tenant.clone()),
        tenant_id: args.tenant_id,
        user_id: args.user_id,
        agent: args.agent,
        context: context_pairs(&args.context)?,
        api_key: args.api_key,
        conversation: args.conversation_id,
        transcript: args.transcript,
    })?;
    chat.check_ready().await?;
    for path in &args.attach {
        chat.attach(path).await?;
    }
    let interactive = std::io::stdin().is_terminal();
    let mut lines = stdin_lines();
    eprintln!("toolgraph chat · {url} · end with Ctrl-D");
    while let Some(line) = next_message(&mut lines, interactive).await {
        if !chat.turn(&line, &mut lines).await? {
            break;
        }
    }
    if let Some(id) = chat.conversation() {
        eprintln!("(conversation {id}: continue it with --conversation-id {id})");
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a run's events, asks for approvals when it pauses, and follows it to its end.
async fn drive(
    agent: &Agent,
    thread: &ThreadId,
    mut run: RunHandle<toolgraph_agents::kit::AgentState>,
    lines: &mut mpsc::Receiver<String>,
) -> anyhow::Result<()> {
    loop {
        let mut stdout = std::io::stdout();
        while let Some(event) = run.next_event().await {
            match event {
                RunEvent::TextDelta { text } => {
                    print!("{text}");
                    let _ = stdout.flush();
                }
                RunEvent::ToolCall { name, arguments, .. } => show_tool_call(&name, &arguments),
                RunEvent::ToolResult { name, outcome, ok, .. } => show_tool_result(&name, ok, &outcome),
                _ => {}
            }
        }
        match run.outcome().await {
            RunOutcome::Completed { .. } => {
                println!();
                return Ok(());
            }
            RunOutcome::Interrupted { pending, .. } => {
                println!();
                match approve_and_resume(agent, thread, pending, lines).await? {
                    Some(next) => run = next,
                    None => return Ok(()),
                }
            }
            RunOutcome::RecursionLimit { limit, .. } => {
                println!("\n(stopped: the agent needed more than {limit} steps for this request)");
                return Ok(());
            }
            RunOutcome::Cancelled { .. } => return Ok(()),
            RunOutcome::Failed { error, .. } => {
                eprintln!("\nerror: {error}");
                return Ok(());
            }
        }
    }
}

/// Asks y/n for each pending action and resumes; `None` if the input ended first.
async fn approve_and_resume(
    agent: &Agent,
    thread: &ThreadId,
    pending: Vec<PendingInterrupt>,
    lines: &mut mpsc::Receiver<String>,
) -> anyhow::Result<Option<RunHandle<toolgraph_agents::kit::AgentState>>> {
    let mut decisions = BTreeMap::new();
    for p in &pending {
        if let Some(q) = Question::of(&p.payload) {
            let decision = loop {
                let Some(answer) = ask_question(&q.question, q.form.as_ref(), lines).await else { return Ok(None) };
                let Some(answer) = answer else { break Decision::Reject };
                match toolgraph_agents::chat_agent::check_answer(q.form.as_ref(), &answer) {
                    Ok(answer) => break Decision::Answer(answer),
                    Err(why) => eprintln!("{why}"),
                }
            };
            decisions.insert(p.id.clone(), decision);
            continue;
        }
        let Some(yes) = ask_approval(
            &ApprovalRequest::of(&p.payload).map_or_else(|| "(no description)".to_owned(), |r| r.description),
            lines,
        )
        .await
        else {
            return Ok(None);
        };
        decisions.insert(p.id.clone(), if yes { Decision::Approve } else { Decision::Reject });
    }
    match agent.graph.resume(thread, decisions, owned(agent)).await? {
        ResumeResult::Started(run) => Ok(Some(run)),
        ResumeResult::Waiting { undecided } => {
            eprintln!("still waiting for {} decision(s)", undecided.len());
            Ok(None)
        }
    }
}
