//! An agent that is not ours, served as ours are: a graph over a state of its own (no ReAct
//! type in it), wrapped in `GraphAgent` through `ChatState`, streamed, paused for a person's
//! decision, confirmed, stored, inspected and forked over HTTP.

mod common;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_agents::chat_agent::{ActionRequest, ChatState, GraphAgent, TurnInput, pending_actions};
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer, Projection, Role};
use toolgraph_graph::{
    CheckpointRecord, Decision, END, InterruptRequest, MemoryCheckpointer, NodeError, NodeOutput, RunContext, RunEvent,
    START, State, StateGraph,
};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};

/// A tally keeper: counts what a person says, and resets the count once they approve it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Tally {
    said: Vec<String>,
    replies: Vec<String>,
    count: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TallyUpdate {
    #[serde(default)]
    said: Option<String>,
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    count: Option<u32>,
}

impl State for Tally {
    type Update = TallyUpdate;
    fn apply(&mut self, u: TallyUpdate) {
        self.said.extend(u.said);
        self.replies.extend(u.reply);
        if let Some(c) = u.count {
            self.count = c;
        }
    }
}

/// The payload of the tally's one kind of pause.
#[derive(Serialize, Deserialize)]
struct ResetRequest {
    from: u32,
}

impl ChatState for Tally {
    fn user_turn(input: TurnInput) -> TallyUpdate {
        TallyUpdate { said: Some(input.message), ..TallyUpdate::default() }
    }
    fn reply(&self) -> Option<&str> {
        self.replies.last().map(String::as_str)
    }
    fn action_request(payload: &Value) -> ActionRequest {
        let from = serde_json::from_value::<ResetRequest>(payload.clone()).map_or(0, |r| r.from);
        ActionRequest { tool: "reset".into(), description: format!("Reset the tally of {from}"), arguments: json!({}) }
    }
    fn project(conversation: i64, record: &CheckpointRecord) -> Projection {
        let mut p = Projection::default();
        for raw in &record.updates {
            let Ok(u) = serde_json::from_str::<TallyUpdate>(raw.get()) else { continue };
            p.messages.extend(u.said.map(|s| (Role::User, s)));
            p.messages.extend(u.reply.map(|r| (Role::Assistant, r)));
        }
        p.pending = pending_actions(conversation, record, Self::action_request);
        p
    }
}

async fn count(s: Arc<Tally>, ctx: RunContext<()>) -> Result<NodeOutput<Tally>, NodeError> {
    let said = s.said.last().cloned().unwrap_or_default();
    if said.contains("reset") {
        let requests = vec![InterruptRequest { key: "reset".into(), payload: json!({ "from": s.count }) }];
        return Ok(NodeOutput::Interrupt { update: TallyUpdate::default(), requests, resume_at: "reset".into() });
    }
    let n = s.count + 1;
    let reply = format!("That makes {n}.");
    for piece in ["That makes ", &format!("{n}.")] {
        ctx.emit(RunEvent::TextDelta { text: piece.to_owned() }).await;
    }
    Ok(NodeOutput::Update(TallyUpdate { count: Some(n), reply: Some(reply), ..TallyUpdate::default() }))
}

/// Whether a reset asked for "slowly" has taken its time already (the first one does).
static SLOWED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn reset(s: Arc<Tally>, ctx: RunContext<()>) -> Result<NodeOutput<Tally>, NodeError> {
    let slowly = s.said.last().is_some_and(|said| said.contains("slowly"));
    if slowly && !SLOWED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        // Long enough for the test to cancel the run before this, its first step, ends.
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    let approved = ctx.decisions().get("reset") == Some(&Decision::Approve);
    let (count, reply) = if approved { (Some(0), "Back to zero.") } else { (None, "Kept as it was.") };
    ctx.emit(RunEvent::TextDelta { text: reply.to_owned() }).await;
    Ok(NodeOutput::Update(TallyUpdate { count, reply: Some(reply.to_owned()), ..TallyUpdate::default() }))
}

/// A second agent with a state of another shape: it repeats what it hears.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Echo {
    heard: Vec<String>,
    echoes: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct EchoUpdate {
    #[serde(default)]
    heard: Option<String>,
    #[serde(default)]
    echo: Option<String>,
}

impl State for Echo {
    type Update = EchoUpdate;
    fn apply(&mut self, u: EchoUpdate) {
        self.heard.extend(u.heard);
        self.echoes.extend(u.echo);
    }
}

impl ChatState for Echo {
    fn user_turn(input: TurnInput) -> EchoUpdate {
        EchoUpdate { heard: Some(input.message), echo: None }
    }
    fn reply(&self) -> Option<&str> {
        self.echoes.last().map(String::as_str)
    }
    fn action_request(_payload: &Value) -> ActionRequest {
        ActionRequest::default()
    }
    fn project(_conversation: i64, record: &CheckpointRecord) -> Projection {
        let mut p = Projection::default();
        for raw in &record.updates {
            let Ok(u) = serde_json::from_str::<EchoUpdate>(raw.get()) else { continue };
            p.messages.extend(u.heard.map(|s| (Role::User, s)));
            p.messages.extend(u.echo.map(|r| (Role::Assistant, r)));
        }
        p
    }
}

async fn echo(s: Arc<Echo>, ctx: RunContext<()>) -> Result<NodeOutput<Echo>, NodeError> {
    let reply = format!("You said {}.", s.heard.last().map_or("nothing", String::as_str));
    ctx.emit(RunEvent::TextDelta { text: reply.clone() }).await;
    Ok(NodeOutput::Update(EchoUpdate { heard: None, echo: Some(reply) }))
}

async fn start() -> (String, Arc<MemoryConversationStore>) {
    let store = Arc::new(MemoryConversationStore::new());
    // One store for both agents; each graph writes through a view with its own state's projector.
    let ckpt =
        ProjectingCheckpointer::forwarding(MemoryCheckpointer::new(), store.clone(), <Tally as ChatState>::project);
    let echo_ckpt = Arc::new(ckpt.projecting(<Echo as ChatState>::project));
    let ckpt = Arc::new(ckpt);
    let mut g = StateGraph::<Tally, ()>::new();
    g.add_node("count", count);
    g.add_node("reset", reset);
    g.add_edge(START, "count");
    g.add_edge("count", END);
    g.add_edge("reset", END);
    g.add_resume("count", "reset");
    let graph = g.compile((), ckpt.clone()).unwrap();
    let mut e = StateGraph::<Echo, ()>::new();
    e.add_node("echo", echo);
    e.add_edge(START, "echo");
    e.add_edge("echo", END);
    let echo_graph = e.compile((), echo_ckpt).unwrap();
    let agents = BTreeMap::from([
        ("tally".to_string(), ServedAgent::new(GraphAgent::new(graph), AgentSettings::default())),
        ("echo".to_string(), ServedAgent::new(GraphAgent::new(echo_graph), AgentSettings::default())),
    ]);
    let app = AppState::new(ChatService::new(agents, "tally".into(), store.clone(), ckpt, ServiceOptions::default()));
    app.set_ready();
    (common::serve(app).await, store)
}

async fn turn(base: &str, conversation: Option<i64>, message: &str) -> Vec<common::SseEvent> {
    let body =
        json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "conversationId": conversation, "message": message});
    common::parse_sse(&common::stream_text(base, "t", &body).await)
}

fn tokens(events: &[common::SseEvent]) -> String {
    events.iter().filter(|e| e.event == "token").map(|e| e.data["content"].as_str().unwrap_or_default()).collect()
}

#[tokio::test]
async fn an_agent_of_its_own_state_is_streamed_paused_confirmed_inspected_and_forked() {
    let (base, store) = start().await;
    let http = reqwest::Client::new();

    let first = turn(&base, None, "apples").await;
    assert_eq!(tokens(&first), "That makes 1.");
    let done = &first.last().unwrap().data;
    let conv = done["conversationId"].as_i64().unwrap();
    let second = turn(&base, Some(conv), "pears").await;
    assert_eq!(tokens(&second), "That makes 2.");

    // A pause of this agent reads as its own action, through ChatState::action_request.
    let paused = turn(&base, Some(conv), "please reset").await;
    let pending: Vec<_> = paused.iter().filter(|e| e.event == "pending").collect();
    assert_eq!(pending.len(), 1, "{paused:?}");
    assert_eq!(pending[0].data["toolName"], "reset");
    assert_eq!(pending[0].data["description"], "Reset the tally of 2");
    let message_id = pending[0].data["messageId"].as_i64().unwrap();
    assert_eq!(paused.last().unwrap().event, "done");

    let confirm = json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "conversationId": conv,
                         "messageId": message_id, "confirmed": true});
    let resp = http.post(format!("{base}/api/chatbot/confirm")).header("X-Tenant-Slug", "t").json(&confirm);
    let answer: Value = resp.send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["message"], "Back to zero.", "{answer}");
    assert_eq!(tokens(&turn(&base, Some(conv), "plums").await), "That makes 1.");

    // What people read was projected by the agent's own projector.
    let stored: Vec<(Role, String)> =
        store.messages(conv).await.unwrap().into_iter().map(|m| (m.role, m.content)).collect();
    let said: Vec<&str> = stored.iter().filter(|(r, _)| *r == Role::User).map(|(_, c)| c.as_str()).collect();
    assert_eq!(said, ["apples", "pears", "please reset", "plums"]);
    assert_eq!(stored.last().unwrap(), &(Role::Assistant, "That makes 1.".to_owned()));

    // The inspector shows the agent's state as it is.
    let path = |p: &str| format!("{base}/api/chatbot/conversations/{conv}{p}?tenantId=1&userId=2");
    let get = |url: String| http.get(url).header("X-Tenant-Slug", "t").send();
    let listed: Value = get(path("/checkpoints")).await.unwrap().json().await.unwrap();
    let checkpoints = listed["checkpoints"].as_array().unwrap();
    let seqs: Vec<u64> = checkpoints.iter().filter_map(|c| c["seq"].as_u64()).collect();
    let last = *seqs.last().unwrap();
    let state: Value = get(path(&format!("/checkpoints/{last}"))).await.unwrap().json().await.unwrap();
    assert_eq!(state["state"]["count"], 1, "{state}");
    assert_eq!(state["state"]["said"].as_array().unwrap().len(), 4);

    // A fork at the second turn's end carries its messages, and counts on from there.
    let second_end = checkpoints.iter().filter(|c| c["kind"] == "step").nth(1).unwrap()["seq"].as_u64().unwrap();
    let fork = json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "seq": second_end});
    let url = format!("{base}/api/chatbot/conversations/{conv}/fork");
    let resp = http.post(url).header("X-Tenant-Slug", "t").json(&fork).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let forked = resp.json::<Value>().await.unwrap()["conversationId"].as_i64().unwrap();
    let copied: Vec<String> = store.messages(forked).await.unwrap().into_iter().map(|m| m.content).collect();
    assert_eq!(copied, ["apples", "That makes 1.", "pears", "That makes 2."]);
    assert_eq!(tokens(&turn(&base, Some(forked), "figs").await), "That makes 3.");
}

#[tokio::test]
async fn agents_of_different_states_share_one_store_each_projecting_its_own_records() {
    let (base, store) = start().await;
    let body = json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "agent": "echo", "message": "hello there"});
    let heard = common::parse_sse(&common::stream_text(&base, "t", &body).await);
    assert_eq!(tokens(&heard), "You said hello there.");
    let echo_conv = heard.last().unwrap().data["conversationId"].as_i64().unwrap();
    let counted = turn(&base, None, "apples").await;
    let tally_conv = counted.last().unwrap().data["conversationId"].as_i64().unwrap();
    assert_eq!(tokens(&counted), "That makes 1.");

    // Read with the tally's projector, the echo's records would add nothing to its conversation.
    let messages = |conv| {
        let store = Arc::clone(&store);
        async move { store.messages(conv).await.unwrap().into_iter().map(|m| (m.role, m.content)).collect::<Vec<_>>() }
    };
    assert_eq!(
        messages(echo_conv).await,
        [(Role::User, "hello there".to_owned()), (Role::Assistant, "You said hello there.".to_owned())]
    );
    assert_eq!(
        messages(tally_conv).await,
        [(Role::User, "apples".to_owned()), (Role::Assistant, "That makes 1.".to_owned())]
    );
    // And a second turn of each continues its own conversation on its own agent.
    let body = json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "conversationId": echo_conv, "message": "again"});
    assert_eq!(tokens(&common::parse_sse(&common::stream_text(&base, "t", &body).await)), "You said again.");
    assert_eq!(messages(echo_conv).await.len(), 4);
}

/// A resume cancelled before its first step ends (the node it resumes at is slow): the run is
/// `interrupted` and the thread waits on its pause again, with the same action (it read `busy`
/// for good before, and hid the action); another decision is refused, the same one resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_cancelled_before_its_first_step_leaves_the_pause_waiting_for_the_same_decisions() {
    let (base, _store) = start().await;
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30)).build().unwrap();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut request = http
            .request(method, format!("{base}{path}"))
            .header("X-Tenant-Slug", "t")
            .header("X-Tenant-Id", "1")
            .header("X-User-Id", "2");
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (post, get) = (reqwest::Method::POST, reqwest::Method::GET);
    let (_, thread) = call(post.clone(), "/threads".into(), Some(json!({}))).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let asked =
        json!({"assistant_id": "tally", "input": {"messages": [{"role": "user", "content": "please reset slowly"}]}});
    let (status, paused) = call(post.clone(), format!("/threads/{thread}/runs/wait"), Some(asked)).await;
    assert_eq!(status, 200, "{paused}");
    let waiting = paused["__interrupt__"][0]["id"].clone();
    assert!(waiting.is_string(), "{paused}");
    let decide = |kind: &str| json!({"assistant_id": "tally", "command": {"resume": {"decisions": [{"type": kind}]}}});
    let (status, resumed) = call(post.clone(), format!("/threads/{thread}/runs"), Some(decide("approve"))).await;
    assert_eq!(status, 200, "{resumed}");
    let run = resumed["run_id"].as_str().unwrap().to_owned();
    // The resumed node is taking its time: the thread is busy.
    let (_, busy) = call(get.clone(), format!("/threads/{thread}"), None).await;
    assert_eq!(busy["status"], "busy", "{busy}");
    let (status, body) =
        call(post.clone(), format!("/threads/{thread}/runs/{run}/cancel?wait=1&action=interrupt"), None).await;
    assert_eq!(status, 204, "{body}");

    let (_, got) = call(get.clone(), format!("/threads/{thread}/runs/{run}"), None).await;
    assert_eq!(got["status"], "interrupted", "{got}");
    let (_, shown) = call(get.clone(), format!("/threads/{thread}"), None).await;
    assert_eq!(shown["status"], "interrupted", "waiting on its pause, not busy: {shown}");
    let waits = shown["interrupts"].as_object().and_then(|m| m.values().next().cloned()).unwrap_or_default();
    assert_eq!(waits[0]["id"], waiting, "the same action: {shown}");
    let (_, found) = call(post.clone(), "/threads/search".into(), Some(json!({"status": "interrupted"}))).await;
    assert!(found.to_string().contains(&thread), "{found}");
    // Its pending action is the original's: a copy is refused, as of any thread waiting on a pause.
    let (status, refused) = call(post.clone(), format!("/threads/{thread}/copy"), None).await;
    assert_eq!(status, 409, "{refused}");
    // A new message waits for the decision first.
    let more = json!({"assistant_id": "tally", "input": {"messages": [{"role": "user", "content": "apples"}]}});
    let (status, refused) = call(post.clone(), format!("/threads/{thread}/runs/wait"), Some(more)).await;
    assert_eq!(status, 409, "{refused}");

    // Another decision than the one recorded is refused; the same one resumes, once.
    let (status, refused) = call(post.clone(), format!("/threads/{thread}/runs/wait"), Some(decide("reject"))).await;
    assert_eq!(status, 409, "{refused}");
    let (status, done) = call(post.clone(), format!("/threads/{thread}/runs/wait"), Some(decide("approve"))).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["replies"], json!(["Back to zero."]), "{done}");
    let (_, shown) = call(get.clone(), format!("/threads/{thread}"), None).await;
    assert_eq!((&shown["status"], &shown["interrupts"]), (&json!("idle"), &json!({})), "{shown}");
    let (_, runs) = call(get.clone(), format!("/threads/{thread}/runs"), None).await;
    let statuses: Vec<&str> = runs.as_array().unwrap().iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses, ["success", "interrupted", "success"], "newest first: {runs}");
}
