//! `agent` nodes (docs/agents.md, "Handing a turn to another agent"): a declared graph hands a
//! turn to another agent, whose nodes run inside the same run with that agent's own prompt,
//! tools, tool context and channels, pause for approvals like the host's, and come back by the
//! handing node's exit — against the scripted model server over real HTTP.

use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use toolgraph_agents::declared::{self, Known, Specialist};
use toolgraph_agents::kit::{AgentDeps, AgentSpec, AgentState, user_turn};
use toolgraph_graph::*;
use toolgraph_llm::{ChatModel, OpenAiChatModel, OpenAiConfig};
use toolgraph_tools::{ToolBuilder, ToolRegistry};

/// The host: a classifier hands billing questions to the `billing` agent, whose reply is also
/// written to `answer`; its own `notes` channel is a name the billing agent uses too.
const DESK: &str = r#"
start = "triage"

[channels]
category = {}
answer = {}
notes = { default = "the desk's own" }

[nodes.triage]
kind = "model"
history = "last_message"
prompt = "Sort the message: billing or other."
output = { channel = "category", schema = { enum = ["billing", "other"] } }
route = { on = "category", cases = { billing = "billing" }, otherwise = "chat" }

[nodes.billing]
kind = "agent"
agent = "billing"
channel = "answer"
next = "wrap_up"

[nodes.wrap_up]
kind = "reply"
text = "(The billing desk answered; the desk's notes: {{notes}}.)"

[nodes.chat]
kind = "model"
tools = []
"#;

/// The billing agent: its own prompt (the agent's, no `prompt`), its own tools, and a `notes`
/// channel of its own.
const BILLING: &str = r#"
start = "note"

[channels]
notes = {}

[nodes.note]
kind = "tool"
tool = "lookup_invoice"
arguments = { month = "march" }
channel = "notes"
next = "agent"

[nodes.agent]
kind = "model"
route = { tool_calls = "tools", otherwise = "END" }

[nodes.tools]
kind = "tools"
next = "agent"
"#;

#[derive(Deserialize, JsonSchema)]
struct InvoiceArgs {
    /// The month.
    month: String,
}

#[derive(Deserialize, JsonSchema)]
struct RefundArgs {
    /// The invoice.
    invoice: String,
}

/// The billing agent's tools: a read that says which knowledge base its context names (the
/// billing agent's `kb`, never the host's), and a write that counts its runs.
fn billing_tools(refunds: Arc<AtomicUsize>) -> ToolRegistry {
    let mut reg = ToolRegistry::new();
    reg.register(
        ToolBuilder::<InvoiceArgs>::new("lookup_invoice", "Find an invoice")
            .handler(|ctx, a| async move {
                let kb = ctx.get("kb").cloned().unwrap_or(Value::Null);
                Ok(json!({"invoice": format!("INV-{}", a.month), "kb": kb}))
            })
            .unwrap(),
    )
    .unwrap();
    reg.register(
        ToolBuilder::<RefundArgs>::new("refund", "Refund an invoice")
            .write(|a| format!("Refund {}", a.invoice))
            .handler(move |_ctx, a| {
                let refunds = refunds.clone();
                async move {
                    refunds.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"refunded": a.invoice}))
                }
            })
            .unwrap(),
    )
    .unwrap();
    reg
}

fn model(server: &ScriptedModelServer) -> Arc<dyn ChatModel> {
    Arc::new(OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap())
}

fn plan(file: &str, text: &str, tools: &ToolRegistry, writes: &[String], agents: &[String]) -> declared::Plan {
    let names = tools.names();
    declared::check(file, text, &Known { tools: &names, writes, kinds: None, agents }).unwrap()
}

/// The desk over `server`, handing turns to a billing agent declared by `billing` (or to
/// whatever `desk_text` names).
fn desk(
    server: &ScriptedModelServer,
    desk_text: &str,
    billing: &str,
    refunds: Arc<AtomicUsize>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, toolgraph_agents::AgentError> {
    let agents = ["billing".to_owned(), "desk".to_owned()];
    let desk_plan = plan("desk.toml", desk_text, &ToolRegistry::new(), &[], &agents);
    let billing_plan = plan("billing.toml", billing, &billing_tools(refunds.clone()), &["refund".into()], &agents);
    let m = model(server);
    let mut desk_spec = AgentSpec::new("desk", "You are the help desk.", ToolRegistry::new());
    desk_spec.tool_context.insert("kb".into(), "desk-kb".into());
    let specialists = {
        let (m, desk_plan) = (Arc::clone(&m), desk_plan.clone());
        move |name: &str| {
            let (plan, spec) = match name {
                "billing" => {
                    let mut spec =
                        AgentSpec::new("billing", "You are the billing desk.", billing_tools(refunds.clone()));
                    spec.tool_context.insert("kb".into(), "billing-kb".into());
                    (billing_plan.clone(), spec)
                }
                _ => (desk_plan.clone(), AgentSpec::new("desk", "You are the help desk.", ToolRegistry::new())),
            };
            Ok(Specialist {
                plan,
                spec,
                model: Arc::clone(&m),
                model_for: Box::new(|_| unreachable!("no model named")),
            })
        }
    };
    let store = Arc::new(MemoryCheckpointer::new());
    declared::build_with(&desk_plan, desk_spec, m, &|_| unreachable!("no model named"), &specialists, store)
}

fn t(n: u32) -> ThreadId {
    ThreadId::new(3, n)
}

fn system_prompt(request: &Value) -> &str {
    request["messages"][0]["content"].as_str().unwrap_or_default()
}

fn offered(request: &Value) -> Vec<&str> {
    request["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_handed_turn_runs_the_other_agents_nodes_with_its_own_tools_pauses_for_approval_and_comes_back() {
    let server = ScriptedModelServer::start(vec![
        Reply::text("billing"),
        Reply::tool_calls(&[("r1", "refund", json!({"invoice": "INV-march"}))]),
        Reply::text("Your March invoice is refunded."),
    ])
    .await
    .unwrap();
    let refunds = Arc::new(AtomicUsize::new(0));
    let graph = desk(&server, DESK, BILLING, refunds.clone()).unwrap();

    let turn = user_turn("I was charged twice in March, refund one please", None);
    let (events, out) = graph.start(&t(1), turn, RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Interrupted { pending, state } = out else { panic!("{out:?}") };
    // The billing agent's write pauses the host's run, as the host's own would.
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload["tool"], "refund");
    assert_eq!(pending[0].payload["description"], "Refund INV-march");
    assert_eq!(refunds.load(Ordering::SeqCst), 0, "nothing runs before the person approves");
    // Its channels are its own: its `notes` holds its tool's result, the desk's keeps its own.
    let note = &state.channels["billing/notes"];
    assert_eq!(note["invoice"], "INV-march");
    assert_eq!(note["kb"], "billing-kb", "the billing agent's tools get its own context, not the desk's");
    assert!(!state.channels.contains_key("notes"), "the desk's `notes` is untouched: {:?}", state.channels);
    let nodes: Vec<&str> = events
        .iter()
        .filter_map(|e| if let RunEvent::NodeStarted { node, .. } = e { Some(node.as_str()) } else { None })
        .collect();
    assert_eq!(nodes, ["triage", "billing", "billing/note", "billing/agent", "billing/tools"]);

    // The billing agent's model call had its prompt and its tools, not the desk's.
    let requests = server.requests();
    assert_eq!(system_prompt(&requests[0]).lines().next(), Some("Sort the message: billing or other."));
    assert!(system_prompt(&requests[1]).starts_with("You are the billing desk."), "{}", system_prompt(&requests[1]));
    let mut tools = offered(&requests[1]);
    tools.sort_unstable();
    assert_eq!(tools, ["lookup_invoice", "refund"]);

    let approve = BTreeMap::from([(pending[0].id.clone(), Decision::Approve)]);
    let r = graph.resume(&t(1), approve, RunOptions::default()).await.unwrap();
    let ResumeResult::Started(run) = r else { panic!("every interrupt was decided") };
    let (events, out) = run.collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(refunds.load(Ordering::SeqCst), 1, "the approved refund ran once, with the billing agent's tools");
    // Its reply is mapped out into the handing node's channel, and the run goes on by its exit.
    assert_eq!(state.channels["answer"], "Your March invoice is refunded.");
    assert_eq!(state.last_reply(), Some("(The billing desk answered; the desk's notes: the desk's own.)"));
    let nodes: Vec<&str> = events
        .iter()
        .filter_map(|e| if let RunEvent::NodeStarted { node, .. } = e { Some(node.as_str()) } else { None })
        .collect();
    assert_eq!(nodes, ["billing/approved", "billing/execute", "billing/agent", "billing/END", "wrap_up"]);
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn the_handed_agents_declaration_is_part_of_the_version_and_a_loop_is_refused() {
    let server = ScriptedModelServer::start(Vec::new()).await.unwrap();
    let refunds = Arc::new(AtomicUsize::new(0));
    let v1 = desk(&server, DESK, BILLING, refunds.clone()).unwrap().version().unwrap().to_owned();
    let changed = BILLING.replace("month = \"march\"", "month = \"april\"");
    let v2 = desk(&server, DESK, &changed, refunds.clone()).unwrap().version().unwrap().to_owned();
    assert_ne!(v1, v2, "changing the agent a turn is handed to makes a new version of the host");
    assert_eq!(v1, declared::combined_version(&declared::version_of(DESK), &[declared::version_of(BILLING)]));

    // The billing agent handing the turn back to the desk would loop.
    let back = format!(
        "{}\n[nodes.back]\nkind = \"agent\"\nagent = \"desk\"\n",
        BILLING.replace("otherwise = \"END\"", "otherwise = \"back\"")
    );
    let err = desk(&server, DESK, &back, refunds).err().expect("a loop is refused").to_string();
    assert!(err.contains("desk → billing → desk"), "{err}");
    assert_eq!(server.request_count(), 0);
}
