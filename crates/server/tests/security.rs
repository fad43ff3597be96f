//! The security of the service's surfaces as a table (docs/reliability.md): every endpoint that
//! reads or changes a tenant's data, tried with another user's and another tenant's ids in each
//! auth mode, and — where the mode has credentials — with the owner's ids but the wrong
//! credentials. Each cell is the status the service answered; afterwards the owner's
//! conversation, its pending action and its run are checked untouched.
//!
//! `cargo test -p toolgraph-server --test security -- --nocapture` prints the table.

mod common;
use common::parse_sse;
use toolgraph_agents::chat_agent::GraphAgent;

use reqwest::Method;
use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::backend::signing::{HmacVerifier, SignedRequest, signature_headers};
use toolgraph_conversations::{
    ConversationStore, PendingLookup, ProjectingCheckpointer, SqliteConversationStore, StoredMessage, Thread,
};
use toolgraph_graph::SqliteCheckpointer;
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig};
use toolgraph_server::auth::{Auth, hash_api_key};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use toolgraph_tools::ToolBuilder;

const OWNER_TENANT: i64 = 7;
const OWNER_USER: i64 = 101;
const HMAC_SECRET: &[u8] = b"the-backend-signing-secret-0123";

#[derive(Deserialize, JsonSchema)]
struct SmsArgs {
    /// Recipient.
    to: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    None,
    ApiKey,
    Hmac,
}

/// Who asks: the slug header, the ids they name, and their credentials.
#[derive(Clone, Copy)]
struct Caller {
    label: &'static str,
    slug: &'static str,
    tenant: i64,
    user: i64,
    /// The API key sent (`api_key` mode).
    key: Option<&'static str>,
    /// Signed by the backend (`hmac` mode).
    signed: bool,
}

struct Owned {
    conversation: i64,
    pending: i64,
    run: String,
}

/// The owner's LangGraph thread, bound to the owner's conversation.
const OWNERS_THREAD: &str = "owners-thread";

/// The key of the owner's item in their store (namespace `notes`).
const OWNERS_ITEM: &str = "owners-item";

async fn service(mode: Mode) -> (String, Arc<dyn ConversationStore>, tempfile::TempDir, ScriptedModelServer) {
    let dir = tempfile::tempdir().unwrap();
    let model =
        ScriptedModelServer::start(vec![Reply::tool_calls(&[("c1", "send_sms", json!({"to": "ana"}))])]).await.unwrap();
    let llm = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let mut tools = toolgraph_tools::ToolRegistry::new();
    tools
        .register(
            ToolBuilder::<SmsArgs>::new("send_sms", "Sends a text.")
                .write(|a| format!("send_sms to {}", a.to))
                .handler(|_c, _a| async { Ok(json!({"sent": true})) })
                .unwrap(),
        )
        .unwrap();
    let ckpt = SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
    let store: Arc<dyn ConversationStore> =
        Arc::new(SqliteConversationStore::new(ckpt.database().clone()).await.unwrap());
    let ckpt = Arc::new(ProjectingCheckpointer::sqlite(ckpt, project));
    let graph = react::build(AgentSpec::new("lumie", "You are Lumie.", tools), llm, ckpt.clone()).unwrap();
    let agents =
        BTreeMap::from([("lumie".to_string(), ServedAgent::new(GraphAgent::new(graph), AgentSettings::default()))]);
    let auth = match mode {
        Mode::None => Auth::None,
        Mode::ApiKey => Auth::api_keys([
            (&"demo".to_string(), &hash_api_key("demo-key")),
            (&"acme".to_string(), &hash_api_key("acme-key")),
        ])
        .unwrap()
        .bind_tenant_ids([(&"demo".to_string(), &7), (&"acme".to_string(), &8)])
        .unwrap(),
        Mode::Hmac => Auth::Hmac(HmacVerifier::new(HMAC_SECRET.to_vec())),
    };
    let options = ServiceOptions { auth, ..ServiceOptions::default() };
    let app = AppState::new(ChatService::new(agents, "lumie".into(), store.clone(), ckpt, options));
    app.set_ready();
    let base = common::serve(app).await;
    (base, store, dir, model)
}

async fn send(base: &str, c: &Caller, method: Method, target: &str, body: Option<Value>) -> (u16, String) {
    send_bytes(base, c, method, target, body.map(|b| b.to_string()).unwrap_or_default()).await
}

/// [`send`] with the body as given, well-formed JSON or not.
async fn send_bytes(base: &str, c: &Caller, method: Method, target: &str, bytes: String) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .request(method.clone(), format!("{base}{target}"))
        .header("X-Tenant-Slug", c.slug)
        // What the OpenAI door reads for the ids a body gives elsewhere.
        .header("X-Tenant-Id", c.tenant)
        .header("X-User-Id", c.user)
        .header("Content-Type", "application/json")
        .timeout(Duration::from_secs(20))
        .body(bytes.clone());
    if let Some(key) = c.key {
        req = req.header("Authorization", format!("Bearer {key}"));
    }
    if c.signed {
        let signed =
            SignedRequest { method: method.as_str(), target, tenant_slug: Some(c.slug), body: bytes.as_bytes() };
        for (name, value) in signature_headers(HMAC_SECRET, &signed) {
            req = req.header(name, value);
        }
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// The owner of the data under attack, with the credentials of `mode`.
fn owner(mode: Mode) -> Caller {
    Caller {
        label: "owner",
        slug: "demo",
        tenant: OWNER_TENANT,
        user: OWNER_USER,
        key: (mode == Mode::ApiKey).then_some("demo-key"),
        signed: mode == Mode::Hmac,
    }
}

/// The owner's conversation still holds `before`, and its pending action is undecided.
async fn assert_untouched(store: &dyn ConversationStore, owned: &Owned, before: &[StoredMessage], mode: Mode) {
    assert_eq!(store.messages(owned.conversation).await.unwrap(), before, "{mode:?}: the owner's messages");
    let lookup = PendingLookup {
        tenant_id: OWNER_TENANT,
        user_id: OWNER_USER,
        conversation_id: owned.conversation,
        message_id: owned.pending,
    };
    let pending = store.pending(&lookup).await.unwrap().expect("the pending action stays");
    assert_eq!(pending.decision, None, "{mode:?}: nobody decided it");
}

/// The owner's turn: a conversation paused on a write action.
async fn owners_data(base: &str, owner: &Caller) -> Owned {
    let body = json!({"tenantSlug": owner.slug, "tenantId": owner.tenant, "userId": owner.user, "conversationId": null, "message": "escribe a ana"});
    let (status, text) = send(base, owner, Method::POST, "/api/chatbot/stream", Some(body)).await;
    assert_eq!(status, 200, "{text}");
    let events = parse_sse(&text);
    let pending = events.iter().find(|e| e.event == "pending").expect("a pending action");
    let done = events.iter().find(|e| e.event == "done").expect("done");
    Owned {
        conversation: done.data["conversationId"].as_i64().unwrap(),
        pending: pending.data["messageId"].as_i64().unwrap(),
        run: done.id.rsplit_once(':').unwrap().0.to_owned(),
    }
}

/// One endpoint tried by `c`: the status.
async fn attempt(base: &str, endpoint: &str, c: &Caller, o: &Owned) -> u16 {
    let ids = format!("tenantId={}&userId={}", c.tenant, c.user);
    let (method, target, body) = match endpoint {
        "stream" => (
            Method::POST,
            "/api/chatbot/stream".to_owned(),
            Some(
                json!({"tenantSlug": c.slug, "tenantId": c.tenant, "userId": c.user, "conversationId": o.conversation, "message": "hola"}),
            ),
        ),
        "openai chat" => (
            Method::POST,
            "/v1/chat/completions".to_owned(),
            Some(
                json!({"model": "lumie", "messages": [{"role": "user", "content": "hola"}], "conversation_id": o.conversation}),
            ),
        ),
        "ag-ui run" => (
            Method::POST,
            "/ag-ui/lumie".to_owned(),
            Some(
                json!({"threadId": o.conversation.to_string(), "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "hola"}]}),
            ),
        ),
        "ag-ui resume" => (
            Method::POST,
            "/ag-ui/lumie".to_owned(),
            Some(json!({
                "threadId": o.conversation.to_string(),
                "runId": "r2",
                "messages": [{"id": "m1", "role": "user", "content": "escribe a ana"}],
                "resume": [{"interruptId": format!("approval-{}", o.pending), "status": "resolved", "payload": {"approved": true}}],
            })),
        ),
        "thread state" => (Method::GET, format!("/threads/{OWNERS_THREAD}/state"), None),
        "thread run" => (
            Method::POST,
            format!("/threads/{OWNERS_THREAD}/runs/wait"),
            Some(json!({"assistant_id": "lumie", "input": {"messages": [{"role": "user", "content": "hola"}]}})),
        ),
        "thread resume" => (
            Method::POST,
            format!("/threads/{OWNERS_THREAD}/runs/wait"),
            Some(json!({"assistant_id": "lumie", "command": {"resume": {"decisions": [{"type": "approve"}]}}})),
        ),
        "thread join" => (Method::GET, format!("/threads/{OWNERS_THREAD}/runs/{}/stream", o.run), None),
        "thread run status" => (Method::GET, format!("/threads/{OWNERS_THREAD}/runs/{}", o.run), None),
        "thread run cancel" => (Method::POST, format!("/threads/{OWNERS_THREAD}/runs/{}/cancel", o.run), None),
        "store item" => (Method::GET, format!("/store/items?namespace=notes&key={OWNERS_ITEM}"), None),
        "confirm" => (
            Method::POST,
            "/api/chatbot/confirm".to_owned(),
            Some(
                json!({"tenantSlug": c.slug, "tenantId": c.tenant, "userId": c.user, "conversationId": o.conversation, "messageId": o.pending, "confirmed": true}),
            ),
        ),
        "run events" => (Method::GET, format!("/api/chatbot/runs/{}/events?{ids}", o.run), None),
        "checkpoints" => {
            (Method::GET, format!("/api/chatbot/conversations/{}/checkpoints?{ids}", o.conversation), None)
        }
        "checkpoint state" => {
            (Method::GET, format!("/api/chatbot/conversations/{}/checkpoints/1?{ids}", o.conversation), None)
        }
        "usage" => (Method::GET, format!("/api/chatbot/conversations/{}/usage?{ids}", o.conversation), None),
        "documents" => (Method::GET, format!("/api/chatbot/conversations/{}/documents?{ids}", o.conversation), None),
        "fork" => (
            Method::POST,
            format!("/api/chatbot/conversations/{}/fork", o.conversation),
            Some(json!({"tenantSlug": c.slug, "tenantId": c.tenant, "userId": c.user, "seq": 1})),
        ),
        "delete conversation" => (Method::DELETE, format!("/api/chatbot/conversations/{}?{ids}", o.conversation), None),
        "delete user" => (Method::DELETE, format!("/api/chatbot/users/{OWNER_USER}?tenantId={}", c.tenant), None),
        "tenant usage" => (Method::GET, format!("/api/chatbot/tenants/{OWNER_TENANT}/usage"), None),
        "delete tenant" => (Method::DELETE, format!("/api/chatbot/tenants/{OWNER_TENANT}"), None),
        other => panic!("no endpoint {other}"),
    };
    send(base, c, method, &target, body).await.0
}

const ENDPOINTS: [&str; 22] = [
    "stream",
    "openai chat",
    "ag-ui run",
    "ag-ui resume",
    "thread state",
    "thread run",
    "thread resume",
    "thread join",
    "thread run status",
    "thread run cancel",
    "store item",
    "confirm",
    "run events",
    "checkpoints",
    "checkpoint state",
    "usage",
    "documents",
    "fork",
    "delete conversation",
    "delete user",
    "tenant usage",
    "delete tenant",
];

/// What [`ENDPOINTS`] must answer: `conversation` for each of those that name the owner's
/// conversation, then `deletes` for deleting the user and for the tenant's own calls (its
/// usage, its deletion).
fn expected(conversation: Option<u16>, deletes: [Option<u16>; 2]) -> [Option<u16>; ENDPOINTS.len()] {
    let mut all = [conversation; ENDPOINTS.len()];
    all[ENDPOINTS.len() - 3..].copy_from_slice(&[deletes[0], deletes[1], deletes[1]]);
    all
}

/// The callers each mode is tried with, and what each endpoint must answer them (`None`: not
/// tried — the mode trusts the caller's word for it by design).
fn callers(mode: Mode) -> Vec<(Caller, [Option<u16>; ENDPOINTS.len()])> {
    let base = Caller { label: "", slug: "demo", tenant: OWNER_TENANT, user: 102, key: None, signed: false };
    // Another user of the owner's tenant, another tenant naming its own id.
    let other_user = Caller { label: "another user", ..base };
    let other_tenant = Caller { label: "another tenant", slug: "acme", tenant: 8, user: OWNER_USER, ..base };
    // Deleting a user's or a tenant's data is the tenant's own admin call: the owner's tenant
    // may; another tenant naming its own id deletes nothing of the owner's (200, 0 deleted).
    // Every endpoint that names the owner's conversation answers 404 (never telling another's
    // from a missing one); the last two delete a user's and a tenant's data.
    let scoped = expected(Some(404), [None, None]);
    let other = expected(Some(404), [Some(200), None]);
    match mode {
        Mode::None => vec![(other_user, scoped), (other_tenant, other)],
        Mode::ApiKey => {
            let k = |c: Caller, key| Caller { key: Some(key), ..c };
            let claims = Caller {
                label: "another tenant's key, the owner's ids",
                slug: "acme",
                tenant: OWNER_TENANT,
                user: OWNER_USER,
                key: Some("acme-key"),
                signed: false,
            };
            let no_key = Caller { label: "the owner's ids, no key", tenant: OWNER_TENANT, user: OWNER_USER, ..base };
            vec![
                (k(other_user, "demo-key"), scoped),
                (k(other_tenant, "acme-key"), expected(Some(404), [Some(200), Some(403)])),
                (claims, [Some(403); ENDPOINTS.len()]),
                (no_key, [Some(401); ENDPOINTS.len()]),
            ]
        }
        Mode::Hmac => {
            let s = |c: Caller| Caller { signed: true, ..c };
            let unsigned =
                Caller { label: "the owner's ids, unsigned", tenant: OWNER_TENANT, user: OWNER_USER, ..base };
            // The doors that read who is asking from headers, which the signature does not
            // cover, are closed under hmac, to everyone.
            let closed = |mut row: [Option<u16>; ENDPOINTS.len()]| {
                for (want, endpoint) in row.iter_mut().zip(ENDPOINTS) {
                    if endpoint.starts_with("thread")
                        || ["openai chat", "ag-ui run", "ag-ui resume", "store item"].contains(&endpoint)
                    {
                        *want = Some(403);
                    }
                }
                row
            };
            vec![
                (s(other_user), closed(scoped)),
                (s(other_tenant), closed(other)),
                (unsigned, closed([Some(401); ENDPOINTS.len()])),
            ]
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_other_users_and_tenants_in_every_auth_mode() {
    let mut table = String::from(
        "| auth mode | caller | stream | openai chat | ag-ui run | ag-ui resume | thread state | thread run | thread resume | thread join | thread run status | thread run cancel | store item | confirm | run events | checkpoints | checkpoint state | usage | documents | fork | delete conversation | delete user | tenant usage | delete tenant |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut wrong = Vec::new();
    for mode in [Mode::None, Mode::ApiKey, Mode::Hmac] {
        let (base, store, _dir, _model) = service(mode).await;
        let owner = owner(mode);
        let owned = owners_data(&base, &owner).await;
        let thread = Thread {
            id: OWNERS_THREAD.into(),
            tenant: OWNER_TENANT,
            user: OWNER_USER,
            conversation: Some(owned.conversation),
            metadata: Default::default(),
            created_at_ms: 1,
            updated_at_ms: 1,
        };
        assert!(store.create_thread(&thread).await.unwrap());
        let value = json!({"text": "the owner's own"}).as_object().cloned().unwrap_or_default();
        let item = toolgraph_conversations::MemoryItem::new(vec!["notes".into()], OWNERS_ITEM.into(), value, None, 1);
        store.put_item(OWNER_TENANT, OWNER_USER, &item).await.unwrap();
        let before = store.messages(owned.conversation).await.unwrap();
        for (caller, expected) in callers(mode) {
            let mut row = format!("| {mode:?} | {} |", caller.label);
            for (endpoint, want) in ENDPOINTS.iter().zip(expected) {
                let Some(want) = want else {
                    row.push_str(" (by design) |");
                    continue;
                };
                let got = attempt(&base, endpoint, &caller, &owned).await;
                row.push_str(&format!(" {got} |"));
                if got != want {
                    wrong.push(format!("{mode:?} / {} / {endpoint}: {got}, expected {want}", caller.label));
                }
            }
            table.push_str(&row);
            table.push('\n');
        }
        // Nothing of the owner's moved.
        assert_untouched(store.as_ref(), &owned, &before, mode).await;
        let events = attempt(&base, "run events", &owner, &owned).await;
        assert_eq!(events, 200, "{mode:?}: the owner still reads the run");
        if mode != Mode::Hmac {
            // Through the thread too (closed under hmac, as above).
            assert_eq!(attempt(&base, "thread join", &owner, &owned).await, 200, "{mode:?}: the owner joins the run");
            assert_eq!(attempt(&base, "thread run status", &owner, &owned).await, 200, "{mode:?}");
            // The owner's run has ended (paused): cancelling it changes nothing.
            assert_eq!(attempt(&base, "thread run cancel", &owner, &owned).await, 204, "{mode:?}");
            // And their own store item (the others got 404 for it above).
            assert_eq!(attempt(&base, "store item", &owner, &owned).await, 200, "{mode:?}: the owner reads the item");
        }
        // The owner reads the conversation's checkpoints and the state at the pause.
        let ids = format!("tenantId={OWNER_TENANT}&userId={OWNER_USER}");
        let list = format!("/api/chatbot/conversations/{}/checkpoints?{ids}", owned.conversation);
        let (status, body) = send(&base, &owner, Method::GET, &list, None).await;
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        let kinds: Vec<&str> =
            list["checkpoints"].as_array().unwrap().iter().filter_map(|c| c["kind"].as_str()).collect();
        assert_eq!(kinds, ["input", "step", "interrupt"], "{mode:?}: {list}");
        let at = format!("/api/chatbot/conversations/{}/checkpoints/3?{ids}", owned.conversation);
        let (status, body) = send(&base, &owner, Method::GET, &at, None).await;
        let state: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!((status, &state["next"]), (200, &json!("approved")), "{mode:?}: {body}");
        assert_eq!(state["pending"][0]["payload"]["tool"], "send_sms", "{state}");
        assert_eq!(state["state"]["messages"][0]["content"], "escribe a ana", "{state}");
        let beyond = format!("/api/chatbot/conversations/{}/checkpoints/99?{ids}", owned.conversation);
        assert_eq!(send(&base, &owner, Method::GET, &beyond, None).await.0, 404, "{mode:?}: no such checkpoint");
    }
    println!("{table}");
    assert!(wrong.is_empty(), "{wrong:#?}\n{table}");
}

/// The POST routes whose bodies name a tenant, and `/search` (whose tenant is the header's).
const POST_ENDPOINTS: [&str; 4] = ["stream", "confirm", "fork", "search"];

/// `c`'s well-formed body for a POST `endpoint` against `o`'s data, as its fields in the order
/// the service's request types declare them (the order serde fills a struct from an array in).
fn post_fields(endpoint: &str, c: &Caller, o: &Owned) -> (String, Vec<(&'static str, Value)>) {
    let ids = [("tenantSlug", json!(c.slug)), ("tenantId", json!(c.tenant)), ("userId", json!(c.user))];
    let (target, rest) = match endpoint {
        "stream" => (
            "/api/chatbot/stream".to_owned(),
            vec![("conversationId", json!(o.conversation)), ("message", json!("hola"))],
        ),
        "confirm" => (
            "/api/chatbot/confirm".to_owned(),
            vec![
                ("conversationId", json!(o.conversation)),
                ("messageId", json!(o.pending)),
                ("confirmed", json!(true)),
            ],
        ),
        "fork" => (format!("/api/chatbot/conversations/{}/fork", o.conversation), vec![("seq", json!(1))]),
        "search" => return ("/search".to_owned(), vec![("query", json!("examen"))]),
        other => panic!("no POST endpoint {other}"),
    };
    (target, ids.into_iter().chain(rest).collect())
}

/// Bodies that are not one plain JSON object, or not of the request's types, built from
/// `fields`: each is a way a body can say one thing to a check that reads it loosely and
/// another to the handler.
fn malformed(fields: &[(&'static str, Value)], own_tenant: i64) -> Vec<(&'static str, String)> {
    let object = |fields: &[(&str, Value)]| {
        let inner: Vec<String> = fields.iter().map(|(k, v)| format!("{}:{v}", json!(k))).collect();
        format!("{{{}}}", inner.join(","))
    };
    let well_formed = object(fields);
    let values: Vec<&Value> = fields.iter().map(|(_, v)| v).collect();
    let retyped: Vec<(&str, Value)> =
        fields.iter().map(|(k, v)| (*k, if v.is_i64() { json!(v.to_string()) } else { v.clone() })).collect();
    // The key's own tenant named first, the claimed one after it (and the other way round).
    let mut twice = vec![("tenantId", json!(own_tenant))];
    twice.extend(fields.iter().cloned());
    let mut twice_after = fields.to_vec();
    twice_after.push(("tenantId", json!(own_tenant)));
    let form: Vec<String> =
        fields.iter().map(|(k, v)| format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_owned))).collect();
    vec![
        ("array", serde_json::to_string(&values).unwrap()),
        ("trailing bytes", format!("{well_formed} x")),
        ("trailing object", format!("{well_formed}{{\"tenantId\":{own_tenant}}}")),
        ("duplicate keys", object(&twice)),
        ("duplicate keys, own last", object(&twice_after)),
        ("wrong types", object(&retyped)),
        ("not JSON", form.join("&")),
        ("a JSON string", json!(well_formed).to_string()),
        ("null", "null".to_owned()),
        ("byte order mark", format!("\u{feff}{well_formed}")),
    ]
}

/// Malformed bodies × every POST route × every auth mode: a body that is not exactly one JSON
/// object of the request's types is refused (4xx, never acted on) — with the owner's
/// credentials and with another tenant's alike — and the owner's data stays as it was. A
/// caller without credentials is refused as with a well-formed body (401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_refused_on_every_post_route_in_every_auth_mode() {
    let mut table = String::from(
        "| auth mode | caller | body | stream | confirm | fork | search |\n|---|---|---|---|---|---|---|\n",
    );
    let mut wrong = Vec::new();
    for mode in [Mode::None, Mode::ApiKey, Mode::Hmac] {
        let (base, store, _dir, _model) = service(mode).await;
        let owner = owner(mode);
        let owned = owners_data(&base, &owner).await;
        let before = store.messages(owned.conversation).await.unwrap();
        let conversations_before = store.list_conversations(OWNER_TENANT, OWNER_USER, 100).await.unwrap().len();
        let mut tried = vec![(owner, false)];
        tried.extend(callers(mode).into_iter().map(|(c, expected)| (c, expected[0] == Some(401))));
        for (caller, unauthenticated) in tried {
            // The variants of one body, one row each.
            let own_tenant = if caller.slug == "acme" { 8 } else { OWNER_TENANT };
            let variants: Vec<Vec<(&str, String, String)>> = POST_ENDPOINTS
                .iter()
                .map(|endpoint| {
                    let (target, fields) = post_fields(endpoint, &caller, &owned);
                    malformed(&fields, own_tenant)
                        .into_iter()
                        .map(|(name, body)| (name, target.clone(), body))
                        .collect()
                })
                .collect();
            for row in 0..variants[0].len() {
                let mut line = format!("| {mode:?} | {} | {} |", caller.label, variants[0][row].0);
                for (endpoint, variants) in POST_ENDPOINTS.iter().zip(&variants) {
                    let (name, target, body) = &variants[row];
                    let (got, text) = send_bytes(&base, &caller, Method::POST, target, body.clone()).await;
                    line.push_str(&format!(" {got} |"));
                    let refused = if unauthenticated { got == 401 } else { (400..500).contains(&got) };
                    if !refused {
                        wrong.push(format!("{mode:?} / {} / {endpoint} / {name}: {got} {text}", caller.label));
                    }
                }
                table.push_str(&line);
                table.push('\n');
            }
        }
        assert_untouched(store.as_ref(), &owned, &before, mode).await;
        let conversations = store.list_conversations(OWNER_TENANT, OWNER_USER, 100).await.unwrap().len();
        assert_eq!(conversations, conversations_before, "{mode:?}: no fork of the owner's conversation");
    }
    println!("{table}");
    assert!(wrong.is_empty(), "{wrong:#?}\n{table}");
}
