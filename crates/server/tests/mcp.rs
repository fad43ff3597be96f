//! `/mcp`: the MCP export over streamable HTTP behind the service's authentication, each request
//! scoped to its caller's tenant — a real listener, real knowledge bases on disk, JSON-RPC over
//! HTTP. (The official Python SDK's client drives it in the CLI's tests.)

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, MemoryItem, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_plugins::mcp_server::McpExport;
use toolgraph_rag::{IngestOptions, KbStore, NoProgress, ingest};
use toolgraph_server::auth::{Auth, hash_api_key};
use toolgraph_server::{AppState, ChatService, McpEndpoint, MemoryResources, ServiceOptions, memory_uri};
use toolgraph_tools::ToolRegistry;

struct Service {
    base: String,
    _dir: tempfile::TempDir,
}

/// A service whose knowledge bases hold one document for tenant `ugr` and one for `academia`;
/// `mcp` says whether `/mcp` is enabled.
async fn start(auth: Auth, ready: bool, mcp: bool) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let kb = Arc::new(KbStore::new(dir.path().join("kb")));
    let write = |rel: &str, body: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, body).unwrap();
        p
    };
    let ugr = write("src/ugr/guia.md", "# Guía IV\n## Evaluación\nEl examen final de IV es en enero.\n");
    ingest(&kb, "ugr", "cursos", &[ugr], &IngestOptions::default(), &NoProgress).unwrap();
    let other = write("src/academia/secreto.md", "# Secreto\nEl examen final secreto de otra academia.\n");
    ingest(&kb, "academia", "cursos", &[other], &IngestOptions::default(), &NoProgress).unwrap();

    let mut tools = ToolRegistry::new();
    tools
        .register(toolgraph_agents::course::rag_search_tool(
            kb.clone(),
            Default::default(),
            "nobody".into(),
            "cursos".into(),
            None,
        ))
        .unwrap();
    let export =
        McpExport::new(tools, Arc::new(toolgraph_agents::mcp::KbResources::new(kb)), Vec::new(), "nobody".into());
    let store = Arc::new(MemoryConversationStore::new());
    // Ana (tenant 1, user 7) keeps two items; Ben (user 8) and Ana's namesake of tenant 2 one each.
    for (tenant, user, namespace, key, text) in [
        (1, 7, vec!["memories", "tutor"], "lang", "Prefers answers in Catalan"),
        (1, 7, vec!["memories", "tutor/es"], "pet name?", "Has a cat called Miso"),
        (1, 8, vec!["memories", "tutor"], "secret", "Ben's own note"),
        (2, 7, vec!["memories", "tutor"], "lang", "Another tenant's note"),
    ] {
        let value = json!({"text": text}).as_object().cloned().unwrap();
        let namespace = namespace.into_iter().map(str::to_owned).collect();
        let item = MemoryItem::new(namespace, key.into(), value, None, 1_000);
        store.put_item(tenant, user, &item).await.unwrap();
    }
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let options = ServiceOptions { auth, ..ServiceOptions::default() };
    let app = AppState::new(ChatService::new(BTreeMap::new(), "none".into(), store, ckpt, options));
    if mcp {
        let export = export.with_resources(Arc::new(MemoryResources::new(app.chat().clone())));
        app.enable_mcp(McpEndpoint::new(export, &["127.0.0.1".to_string()]));
    }
    if ready {
        app.set_ready();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, toolgraph_server::router(app)).await });
    Service { base, _dir: dir }
}

/// One JSON-RPC request to `/mcp` with `headers`; the status and the JSON answer (`Null` when the
/// body is not JSON).
async fn rpc(s: &Service, headers: &[(&str, &str)], method: &str, params: Value) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/mcp", s.base))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

fn uris(listed: &Value) -> Vec<String> {
    listed["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn each_tenant_sees_and_searches_its_own_knowledge_bases_only() {
    let s = start(Auth::None, true, true).await;
    let (status, ugr) = rpc(&s, &[("X-Tenant-Slug", "ugr")], "resources/list", json!({})).await;
    assert_eq!(status, 200, "{ugr}");
    assert_eq!(uris(&ugr), ["toolgraph://kb/cursos/guia.md"]);
    let (_, academia) = rpc(&s, &[("X-Tenant-Slug", "academia")], "resources/list", json!({})).await;
    assert_eq!(uris(&academia), ["toolgraph://kb/cursos/secreto.md"]);

    // Another tenant's document is not there for this one, even by its exact URI.
    let uri = json!({"uri": "toolgraph://kb/cursos/secreto.md"});
    let (_, read) = rpc(&s, &[("X-Tenant-Slug", "ugr")], "resources/read", uri.clone()).await;
    assert!(read["error"]["message"].as_str().unwrap().contains("no resource"), "{read}");
    let (_, read) = rpc(&s, &[("X-Tenant-Slug", "academia")], "resources/read", uri).await;
    assert!(read["result"]["contents"][0]["text"].as_str().unwrap().contains("secreto"), "{read}");

    let search = json!({"name": "rag_search", "arguments": {"query": "examen final"}});
    let (_, found) = rpc(&s, &[("X-Tenant-Slug", "ugr")], "tools/call", search.clone()).await;
    let hits = &found["result"]["structuredContent"]["results"];
    assert_eq!(hits.as_array().map(Vec::len), Some(1), "{found}");
    assert!(hits[0]["content"].as_str().unwrap().contains("IV"), "{found}");
    // Without a tenant, the export's default one (here with no knowledge base at all).
    let (_, none) = rpc(&s, &[], "tools/call", search).await;
    assert_eq!(none["result"]["isError"], true, "{none}");
    assert!(none["result"]["content"][0]["text"].as_str().unwrap().contains("tenant `nobody`"), "{none}");
}

#[tokio::test]
async fn api_key_mode_guards_mcp_and_scopes_it_to_the_keys_tenant() {
    let auth = Auth::api_keys(&BTreeMap::from([
        ("ugr".to_string(), hash_api_key("k-ugr")),
        ("academia".into(), hash_api_key("k-ac")),
    ]))
    .unwrap();
    let s = start(auth, true, true).await;
    let list = |headers: &'static [(&'static str, &'static str)]| rpc(&s, headers, "resources/list", json!({}));
    assert_eq!(list(&[]).await.0, 401, "no key");
    assert_eq!(list(&[("X-Tenant-Slug", "ugr")]).await.0, 401, "no key");
    assert_eq!(
        list(&[("X-Tenant-Slug", "ugr"), ("Authorization", "Bearer k-ac")]).await.0,
        401,
        "another tenant's key"
    );
    let (status, ugr) = list(&[("X-Tenant-Slug", "ugr"), ("Authorization", "Bearer k-ugr")]).await;
    assert_eq!((status, uris(&ugr)), (200, vec!["toolgraph://kb/cursos/guia.md".to_string()]));
}

/// The memory resources among a listing.
fn memories(listed: &Value) -> Vec<String> {
    uris(listed).into_iter().filter(|u| u.starts_with("toolgraph://memory/")).collect()
}

#[tokio::test]
async fn a_person_reads_their_own_items_as_resources_and_nobody_elses() {
    let s = start(Auth::None, true, true).await;
    let ana = [("X-Tenant-Slug", "ugr"), ("X-Tenant-Id", "1"), ("X-User-Id", "7")];
    let (status, listed) = rpc(&s, &ana, "resources/list", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    let lang = memory_uri(&["memories".into(), "tutor".into()], "lang");
    let pet = memory_uri(&["memories".into(), "tutor/es".into()], "pet name?");
    let mut mine = memories(&listed);
    mine.sort();
    let mut expected = [lang.clone(), pet.clone()];
    expected.sort();
    assert_eq!(mine, expected, "{listed}");
    assert!(uris(&listed).contains(&"toolgraph://kb/cursos/guia.md".to_string()), "the documents stay");
    let described = listed["result"]["resources"].to_string();
    assert!(described.contains("Prefers answers in Catalan") && described.contains("application/json"), "{listed}");

    // Read: the item as the store routes answer it, JSON.
    let (_, read) = rpc(&s, &ana, "resources/read", json!({"uri": pet})).await;
    let contents = &read["result"]["contents"][0];
    assert_eq!(contents["mimeType"], "application/json", "{read}");
    let item: Value = serde_json::from_str(contents["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        (&item["namespace"], &item["key"], &item["value"]["text"]),
        (&json!(["memories", "tutor/es"]), &json!("pet name?"), &json!("Has a cat called Miso"))
    );

    // Ben, Ana's namesake of another tenant, and a request naming nobody: none of Ana's, even
    // by their exact URI.
    let ben = [("X-Tenant-Slug", "ugr"), ("X-Tenant-Id", "1"), ("X-User-Id", "8")];
    let elsewhere = [("X-Tenant-Slug", "ugr"), ("X-Tenant-Id", "2"), ("X-User-Id", "7")];
    let nobody = [("X-Tenant-Slug", "ugr")];
    let not_numeric = [("X-Tenant-Slug", "ugr"), ("X-Tenant-Id", "1"), ("X-User-Id", "ana")];
    for who in [&ben[..], &elsewhere, &nobody, &not_numeric] {
        let (status, listed) = rpc(&s, who, "resources/list", json!({})).await;
        assert_eq!(status, 200, "{who:?}: {listed}");
        assert!(!listed.to_string().contains("Catalan"), "{who:?}: {listed}");
        // The URI names a place in the asker's own store: Ana's namesake has her own `lang`.
        let (_, read) = rpc(&s, who, "resources/read", json!({"uri": lang})).await;
        assert!(!read.to_string().contains("Catalan"), "{who:?}: {read}");
        let own = read["result"]["contents"][0]["text"].as_str().is_some_and(|t| t.contains("Another tenant's note"));
        let missing = read["error"]["message"].as_str().is_some_and(|m| m.contains("no resource"));
        assert!(if who == &elsewhere[..] { own } else { missing }, "{who:?}: {read}");
    }
    assert_eq!(memories(&rpc(&s, &ben, "resources/list", json!({})).await.1).len(), 1, "Ben's own");
    // A URI that names no item, or no namespace.
    for uri in [memory_uri(&["memories".into(), "tutor".into()], "nothing"), "toolgraph://memory/lang".into()] {
        let (_, read) = rpc(&s, &ana, "resources/read", json!({"uri": uri})).await;
        assert!(read["error"]["message"].as_str().unwrap().contains("no resource"), "{read}");
    }
}

#[tokio::test]
async fn a_bound_key_reads_its_tenants_people_only() {
    let keys = BTreeMap::from([("ugr".to_string(), hash_api_key("k-ugr"))]);
    let ids = BTreeMap::from([("ugr".to_string(), 1_i64)]);
    let auth = Auth::api_keys(&keys).unwrap().bind_tenant_ids(&ids).unwrap();
    let s = start(auth, true, true).await;
    // The key's tenant is Ana's: without X-Tenant-Id her items are listed.
    let ana = [("X-Tenant-Slug", "ugr"), ("Authorization", "Bearer k-ugr"), ("X-User-Id", "7")];
    assert_eq!(memories(&rpc(&s, &ana, "resources/list", json!({})).await.1).len(), 2);
    // Naming the other tenant's id with this key is refused outright.
    let across =
        [("X-Tenant-Slug", "ugr"), ("Authorization", "Bearer k-ugr"), ("X-Tenant-Id", "2"), ("X-User-Id", "7")];
    let (status, refused) = rpc(&s, &across, "resources/list", json!({})).await;
    assert_eq!(status, 403, "{refused}");
}

#[tokio::test]
async fn mcp_refuses_foreign_hosts_and_answers_only_when_enabled_and_ready() {
    let s = start(Auth::None, true, true).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/mcp", s.base))
        .header("Host", "evil.example")
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403, "DNS rebinding: a Host not on the list");
    let (status, malformed) = {
        let resp = reqwest::Client::new()
            .post(format!("{}/mcp", s.base))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body("{\"jsonrpc\": ")
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    };
    assert!((400..500).contains(&status), "malformed JSON-RPC is the client's error: {status} {malformed}");

    let disabled = start(Auth::None, true, false).await;
    assert_eq!(rpc(&disabled, &[], "resources/list", json!({})).await.0, 404);
    let starting = start(Auth::None, false, true).await;
    assert_eq!(rpc(&starting, &[], "resources/list", json!({})).await.0, 503);
}

/// toolgraph's MCP client (a `kind = "mcp"` plugin) on this service's `/mcp`, the tenant header
/// filled from each turn: each tenant's calls search that tenant's knowledge bases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_on_mcp_acts_for_the_turns_tenant() {
    let s = start(Auth::None, true, true).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("courses")).unwrap();
    std::fs::write(
        dir.path().join("courses/plugin.toml"),
        format!(
            "name = \"courses\"\nversion = \"1.0.0\"\ndescription = \"Another toolgraph's knowledge bases.\"\n\
             kind = \"mcp\"\n[mcp]\nurl = \"{}/mcp\"\nread_tools = [\"rag_search\"]\n\
             [mcp.headers]\nX-Tenant-Slug = \"{{ctx.tenant}}\"\n",
            s.base
        ),
    )
    .unwrap();
    let loaded = toolgraph_plugins::load_all(&[dir.path().to_path_buf()], "en").await;
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let mut reg = ToolRegistry::new();
    for t in &loaded.plugins[0].tools {
        reg.register(t.clone()).unwrap();
    }
    let search = |tenant: &'static str| {
        let ctx = toolgraph_tools::ToolContext::default().set("tenant", json!(tenant));
        let reg = reg.clone();
        async move { reg.call(&ctx, "courses_rag_search", &json!({"query": "examen final"})).await.to_json() }
    };
    let ugr = search("ugr").await;
    assert!(ugr.to_string().contains("IV es en enero") && !ugr.to_string().contains("secreto"), "{ugr}");
    let academia = search("academia").await;
    assert!(academia.to_string().contains("secreto") && !academia.to_string().contains("IV"), "{academia}");
}
