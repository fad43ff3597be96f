//! `toolgraph serve` against hostile callers, as a process over loopback: a web page that
//! rebinds its name to 127.0.0.1, and configurations that would let one tenant's key act on
//! another (docs/reliability.md).

mod common;
use common::{check_invariants, free_port, rss_kb, serve_command, wait_ready};

use reqwest::Method;
use scripted_llm::{Reply, ScriptedModelServer};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A rebound name: every route but the probes answers 403, with the playground on and auth
/// `none` (the defaults a developer runs); the service's own names still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_host_or_a_foreign_origin_reaches_no_route() {
    let model = ScriptedModelServer::start(vec![Reply::text("hola")]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_SERVER_PLAYGROUND", "true")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let stream = r#"{"tenantSlug":"demo","tenantId":1,"userId":1,"message":"hola"}"#;
    let routes: [(Method, &str, &str); 7] = [
        (Method::GET, "/", ""),
        (Method::GET, "/api/chatbot/conversations?tenantId=1&userId=1", ""),
        (Method::POST, "/api/chatbot/stream", stream),
        (Method::DELETE, "/api/chatbot/tenants/1", ""),
        (Method::POST, "/search", r#"{"query":"x"}"#),
        (Method::GET, "/metrics", ""),
        (Method::GET, "/api/chatbot/agents/assistant/graph.svg", ""),
    ];
    let send = |method: Method, path: &str, body: &str, headers: &[(&str, &str)]| {
        let mut req = client
            .request(method, format!("{base}{path}"))
            .header("X-Tenant-Slug", "demo")
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let rebound = format!("rebound.example:{port}");
    let mut wrong = Vec::new();
    for (method, path, body) in &routes {
        let got = send(method.clone(), path, body, &[("Host", &rebound)]).await;
        if got != 403 {
            wrong.push(format!("Host {rebound}: {method} {path} answered {got}"));
        }
        let got = send(method.clone(), path, body, &[("Origin", "http://rebound.example")]).await;
        if got != 403 {
            wrong.push(format!("Origin http://rebound.example: {method} {path} answered {got}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The probes answer whatever name an orchestrator uses; the service's own names work.
    assert_eq!(send(Method::GET, "/health", "", &[("Host", &rebound)]).await, 200);
    assert_eq!(send(Method::GET, "/ready", "", &[("Host", &rebound)]).await, 200);
    assert_eq!(send(Method::GET, "/", "", &[("Host", &format!("localhost:{port}"))]).await, 200);
    let same_origin = format!("http://127.0.0.1:{port}");
    assert_eq!(send(Method::POST, "/api/chatbot/stream", stream, &[("Origin", &same_origin)]).await, 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// `api_key` with a key bound to no tenant id would let that key act on any tenant: `serve`
/// refuses to start and says how to bind it, unless the operator opted in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_api_keys_bound_to_no_tenant_unless_told_to() {
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgraph.toml");
    let digest = toolgraph_server::auth::hash_api_key("k-demo");
    std::fs::write(&config, format!("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{digest}\"\n")).unwrap();
    let port = free_port();
    let mut child =
        serve_command(dir.path(), &model, port).arg("--config").arg(&config).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(20) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve started with an API key that opens every tenant");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("server.api_key_tenants") && stderr.contains("allow_unbound_api_keys"), "{stderr}");
    // Opted in, it starts.
    std::fs::write(
        &config,
        format!(
            "[server]\nauth = \"api_key\"\nallow_unbound_api_keys = true\n[server.api_keys]\ndemo = \"{digest}\"\n"
        ),
    )
    .unwrap();
    let mut child =
        serve_command(dir.path(), &model, port).arg("--config").arg(&config).stderr(Stdio::null()).spawn().unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads what the service sent on `conn` until it closes or `limit` passes: the status code of
/// the first response line, if any.
async fn status_of(conn: &mut tokio::net::TcpStream, limit: Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + limit;
    while !buf.windows(2).any(|w| w == b"\r\n") {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, conn.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    let line = String::from_utf8_lossy(&buf);
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Hostile load on loopback: 2,000 connections that send a request head and a few bytes of
/// body then stall, and 2,000 that start a turn and never read its stream, while 200 ordinary
/// turns run. Every ordinary turn completes, every stalled body gets 408, the service's memory
/// stays bounded, and the invariant checker finds every conversation whole — the turns of the
/// clients that never read included. `HOSTILE_LOAD_CONNECTIONS` sets the 2,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_and_streams_nobody_reads_do_not_starve_ordinary_turns() {
    use tokio::io::AsyncWriteExt;
    let hostile: usize = std::env::var("HOSTILE_LOAD_CONNECTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let ordinary = 200;
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    model.set_responder(|_req: &serde_json::Value| {
        let mut steps: Vec<scripted_llm::Step> = (0..8)
            .flat_map(|i| {
                [scripted_llm::Step::Pause(Duration::from_millis(40)), scripted_llm::Step::Text(format!("w{i} "))]
            })
            .collect();
        steps.extend([scripted_llm::Step::Finish("stop".into()), scripted_llm::Step::Done]);
        Reply::Stream(steps)
    });
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_SERVER_MAX_RUNS_PER_TENANT", "0")
        .env("TOOLGRAPH_LOG", "error")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let pid = child.id();
    let sampling = tokio::spawn(async move {
        let mut peak = 0;
        loop {
            peak = peak.max(rss_kb(pid, "VmRSS:"));
            tokio::time::sleep(Duration::from_millis(100)).await;
            if rss_kb(pid, "VmRSS:") == 0 {
                return peak;
            }
        }
    });
    let head = |len: usize| {
        format!(
            "POST /api/chatbot/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Tenant-Slug: demo\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // The slow bodies: a head promising 1,000 bytes, then 10 of them, then nothing.
    let mut slow = Vec::with_capacity(hostile);
    for i in 0..hostile {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        conn.write_all(format!("{}{{\"tenantSl", head(1000)).as_bytes()).await.unwrap();
        slow.push(conn);
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // The streams nobody reads: a whole turn request, then silence (users 10,001…).
    let mut deaf = Vec::with_capacity(hostile);
    for i in 0..hostile {
        let body = format!(
            r#"{{"tenantSlug":"demo","tenantId":1,"userId":{},"conversationId":null,"message":"hola"}}"#,
            10_001 + i
        );
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        conn.write_all(format!("{}{body}", head(body.len())).as_bytes()).await.unwrap();
        deaf.push(conn);
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // The ordinary turns, all at once, while the others hold their connections.
    let started = Instant::now();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let turns: Vec<_> = (0..ordinary)
        .map(|user| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let body = serde_json::json!({"tenantSlug": "demo", "tenantId": 1, "userId": user + 1, "conversationId": null, "message": "hola"});
                let resp = client.post(format!("{base}/api/chatbot/stream")).header("X-Tenant-Slug", "demo").json(&body).send().await;
                match resp {
                    Ok(r) if r.status() == 200 => r.text().await.unwrap_or_default(),
                    Ok(r) => format!("status {}", r.status()),
                    Err(e) => format!("transport: {e}"),
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in turns {
        let text = t.await.unwrap();
        if !text.contains("event: done") {
            failed.push(text.chars().take(200).collect::<String>());
        }
    }
    let ordinary_wall = started.elapsed();
    // Each stalled body is answered 408 once its time is up (all read together, within 40 s).
    let answers = futures::future::join_all(slow.iter_mut().map(|conn| status_of(conn, Duration::from_secs(40)))).await;
    let mut statuses = std::collections::BTreeMap::<Option<u16>, usize>::new();
    for status in answers {
        *statuses.entry(status).or_default() += 1;
    }
    drop(deaf);
    drop(slow);
    // The deaf clients' turns ran to the end without them: wait for the last reply.
    let db = dir.path().join("toolgraph.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    let waited = Instant::now();
    let expected = hostile + ordinary;
    loop {
        let (replies,): (i64,) =
            sqlx::query_as("SELECT count(DISTINCT conversation_id) FROM messages WHERE role = 'assistant'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if replies as usize >= expected || waited.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pool.close().await;
    let peak_hwm = rss_kb(pid, "VmHWM:");
    let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    child.wait().unwrap();
    let peak_rss = sampling.await.unwrap().max(peak_hwm);
    // No client of these saw an error: every turn, read or not, must be whole.
    let (verdict, conversations) = check_invariants(dir.path(), |_| 0).await;
    println!(
        "hostile load: {hostile} slow bodies, {hostile} streams never read, {ordinary} ordinary turns in {:.1} s",
        ordinary_wall.as_secs_f64()
    );
    println!("  slow bodies answered: {statuses:?}");
    println!("  service peak RSS {} MB; {conversations} conversations; invariants: {verdict}", peak_rss / 1024);
    assert!(
        failed.is_empty(),
        "{} ordinary turns did not complete: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(statuses.get(&Some(408)), Some(&hostile), "every stalled body gets 408: {statuses:?}");
    assert_eq!(conversations, expected, "a conversation per started turn, none for a stalled body");
    assert!(verdict.holds(), "{verdict}");
    assert!(peak_rss < 600 * 1024, "the service grew to {} MB", peak_rss / 1024);
}
