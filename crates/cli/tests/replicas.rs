//! Replicas: several `toolgraph serve` processes on one PostgreSQL database, behind a real
//! load balancer (HAProxy, from Debian's packages), as docs/deploy.md lays them out. A stream
//! started on one replica resumes on another; a decision taken on a third runs its action
//! once; a replica killed mid-turn leaves its turn to the others, which end it with a
//! persisted outcome and an `error` for whoever follows it; and a replica whose connection to
//! PostgreSQL drops and comes back loses no event of the runs it relays.

mod common;
use common::{SmsBackend, free_port, serve_command, sms_data_dir, start_sms_backend, wait_ready};

use futures::StreamExt;
use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::{Value, json};
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use toolgraph_agents::kit::{INTERRUPTED_CALL, INTERRUPTED_REPLY};
use toolgraph_testkit::PgSchema;
use toolgraph_testkit::fault_proxy::{Fault, FaultProxy};
use toolgraph_testkit::invariants::{self, Observed};

/// Words of the counting reply, streamed 120 ms apart.
const COUNT: [&str; 12] =
    ["uno ", "dos ", "tres ", "cuatro ", "cinco ", "seis ", "siete ", "ocho ", "nueve ", "diez ", "once ", "doce"];

/// "escribe …" → `send_sms`; "cuenta" → the counting reply, word by word; "cuelga" → a word,
/// then nothing (the replica is killed meanwhile); a tool result → "Enviado."; else "De nada.".
fn responder(req: &Value) -> Reply {
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let turns = messages.iter().filter(|m| m["role"] == "user").count();
    let text = last["content"].as_str().unwrap_or_default();
    match last["role"].as_str() {
        Some("tool") => Reply::text("Enviado."),
        Some("user") if text.starts_with("escribe") => {
            Reply::tool_calls(&[(&format!("sms-{turns}"), "send_sms", json!({"to": "ana", "text": "hola"}))])
        }
        Some("user") if text.starts_with("cuenta") => {
            let mut steps = Vec::new();
            for w in COUNT {
                steps.push(Step::Text(w.into()));
                steps.push(Step::Pause(Duration::from_millis(120)));
            }
            steps.extend([Step::Finish("stop".into()), Step::Done]);
            Reply::Stream(steps)
        }
        Some("user") if text.starts_with("cuelga") => {
            Reply::Stream(vec![Step::Text("Empiezo".into()), Step::Pause(Duration::from_secs(3600)), Step::Done])
        }
        _ => Reply::text("De nada."),
    }
}

/// The URL of the test's schema on the server at `host:port`.
fn database_url(schema: &PgSchema, port: u16) -> String {
    let server = server_options();
    let (user, db) = (server.get_username(), server.get_database().unwrap_or("postgres"));
    format!("postgres://{user}@127.0.0.1:{port}/{db}?options=-c%20search_path%3D{}", schema.name)
}

/// The suite's PostgreSQL server.
fn server_options() -> sqlx::postgres::PgConnectOptions {
    use std::str::FromStr;
    sqlx::postgres::PgConnectOptions::from_str(&toolgraph_testkit::pg_url()).expect("a valid URL")
}

/// A running replica; killed (SIGKILL) when dropped.
struct Replica {
    child: Option<Child>,
    base: String,
    port: u16,
}

impl Replica {
    /// SIGKILL: no shutdown of any kind.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one test runs on: PostgreSQL in a schema of its own, the model, the backend, and the
/// replicas' shared data directory.
struct Cluster {
    schema: PgSchema,
    model: ScriptedModelServer,
    backend: SmsBackend,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Cluster {
    /// `None` when PostgreSQL is absent and `CI` is unset (the testkit prints why).
    async fn new() -> Option<Self> {
        let schema = PgSchema::create().await?;
        let model = ScriptedModelServer::start(vec![]).await.unwrap();
        model.set_responder(responder);
        let backend = SmsBackend::default();
        let (dir, config) = sms_data_dir(&start_sms_backend(backend.clone()).await);
        Some(Self { schema, model, backend, dir, config })
    }

    /// A replica on PostgreSQL at `pg_port` (the server's, or a proxy's), leases of `lease_ms`.
    async fn replica(&self, name: &str, pg_port: u16, lease_ms: u64) -> Replica {
        let port = free_port();
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        let child = serve_command(self.dir.path(), &self.model, port)
            .arg("--config")
            .arg(&self.config)
            .env("TOOLGRAPH_DATABASE_URL", database_url(&self.schema, pg_port))
            .env("TOOLGRAPH_SERVER_INSTANCE_ID", name)
            .env("TOOLGRAPH_SERVER_TURN_LEASE_MS", lease_ms.to_string())
            .env("TOOLGRAPH_ALLOCATOR", "system")
            .env("TOOLGRAPH_LOG", "info")
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        wait_ready(&base).await;
        Replica { child: Some(child), base, port }
    }

    fn pg_port(&self) -> u16 {
        server_options().get_port()
    }

    /// The stores, read directly, and the invariant checker's verdict over `observed`.
    async fn check(&self, observed: &[Observed]) {
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(2).connect_with(self.schema.options()).await.unwrap();
        let store = toolgraph_conversations::PostgresConversationStore::new(pool.clone()).await.unwrap();
        let ckpt = self.schema.checkpointer().await;
        let ledger = self.backend.ledger.lock().unwrap().clone();
        let verdict = invariants::check(&store, &ckpt, observed, Some(&ledger)).await;
        assert!(verdict.holds(), "{verdict}");
        pool.close().await;
    }

    async fn messages(&self, conversation: i64) -> Vec<(String, String)> {
        use toolgraph_conversations::ConversationStore;
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(1).connect_with(self.schema.options()).await.unwrap();
        let store = toolgraph_conversations::PostgresConversationStore::new(pool.clone()).await.unwrap();
        let m = store.messages(conversation).await.unwrap();
        pool.close().await;
        m.into_iter().map(|m| (m.role.as_str().to_owned(), m.content)).collect()
    }
}

/// HAProxy in front of the replicas, round robin, each checked on `/ready`; killed when
/// dropped. `None` when it is not installed and `CI` is unset.
struct Balancer {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Balancer {
    async fn start(replicas: &[&Replica]) -> Option<Self> {
        let haproxy = std::path::Path::new("/usr/sbin/haproxy");
        if !haproxy.exists() {
            assert!(std::env::var_os("CI").is_none(), "HAProxy is required under CI (scripts/system-deps installs it)");
            eprintln!("SKIPPED: /usr/sbin/haproxy is not installed (scripts/system-deps installs it)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| format!("  server r{i} 127.0.0.1:{} check inter 300 fall 1 rise 1\n", r.port))
            .collect();
        let cfg = format!(
            "global\n  maxconn 2000\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  timeout server 120s\n\
             frontend fe\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
             backend replicas\n  balance roundrobin\n  option httpchk GET /ready\n{servers}"
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let child = std::process::Command::new(haproxy)
            .arg("-f")
            .arg(&path)
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        // Every replica is ready already (HAProxy counts a server up until a check fails).
        wait_ready(&base).await;
        Some(Self { child, base, _dir: dir })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

fn stream_body(conversation: Option<i64>, message: &str, user: i64) -> Value {
    json!({"tenantSlug": "demo", "tenantId": 1, "userId": user, "conversationId": conversation, "message": message})
}

/// One SSE event as a client sees it: `(id, event, data)`.
type Seen = (String, String, Value);

/// Reads SSE events from `response` until `stop(events so far)` says so or the stream ends.
async fn read_events(response: reqwest::Response, stop: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let mut events = std::pin::pin!(toolgraph_protocol::sse::frames(response.bytes_stream()));
    let mut seen = Vec::new();
    while let Some(event) =
        tokio::time::timeout(Duration::from_secs(30), events.next()).await.expect("an event within 30 s")
    {
        let event = event.unwrap();
        let data = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        seen.push((event.id.unwrap_or_default(), event.event, data));
        if stop(&seen) {
            return seen;
        }
    }
    seen
}

/// Starts a turn on `base` and reads until `stop`.
async fn start_turn(base: &str, body: &Value, stop: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let response = client()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    read_events(response, stop).await
}

/// Follows run `run` on `base` from after `last_id`, to its end.
async fn resume(base: &str, run: &str, last_id: &str, user: i64) -> (u16, Vec<Seen>) {
    let response = client()
        .get(format!("{base}/api/chatbot/runs/{run}/events?tenantId=1&userId={user}"))
        .header("Last-Event-ID", last_id)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status != 200 {
        return (status, Vec::new());
    }
    (status, read_events(response, |_| false).await)
}

async fn confirm(base: &str, conversation: i64, message: i64) -> (u16, Value) {
    let b = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "messageId": message, "confirmed": true});
    match client().post(format!("{base}/api/chatbot/confirm")).header("X-Tenant-Slug", "demo").json(&b).send().await {
        Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
        Err(_) => (0, Value::Null),
    }
}

fn tokens(events: &[Seen]) -> String {
    events.iter().filter(|(_, e, _)| e == "token").map(|(_, _, d)| d["content"].as_str().unwrap_or_default()).collect()
}

/// The sequence numbers of events' ids (`<runId>:<seq>`) of run `run`.
fn seqs(events: &[Seen], run: &str) -> Vec<u64> {
    events
        .iter()
        .map(|(id, _, _)| {
            let (r, seq) = id.rsplit_once(':').unwrap_or_else(|| panic!("an id: {id}"));
            assert_eq!(r, run);
            seq.parse().unwrap()
        })
        .collect()
}

fn run_of(events: &[Seen]) -> String {
    events[0].0.rsplit_once(':').unwrap().0.to_owned()
}

/// Stream on A, resume on C; a write action asked on A, approved on B, approved again on C:
/// it runs once; the same through the balancer; another user cannot follow the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_moves_between_replicas_and_through_the_balancer() {
    let Some(cluster) = Cluster::new().await else { return };
    let pg = cluster.pg_port();
    let a = cluster.replica("a", pg, 30_000).await;
    let b = cluster.replica("b", pg, 30_000).await;
    let c = cluster.replica("c", pg, 30_000).await;

    // Streamed on A, cut after three words; the rest from C, each word once.
    let first = start_turn(&a.base, &stream_body(None, "cuenta hasta doce", 1), |s| s.len() == 3).await;
    let run = run_of(&first);
    assert_eq!(seqs(&first, &run), [1, 2, 3]);
    let (status, rest) = resume(&c.base, &run, &first[2].0, 1).await;
    assert_eq!(status, 200);
    assert_eq!(seqs(&rest, &run), (4..=13).collect::<Vec<u64>>(), "{rest:?}");
    assert_eq!(format!("{}{}", tokens(&first), tokens(&rest)), COUNT.concat(), "every word once, in order");
    let (_, last, done) = rest.last().unwrap().clone();
    assert_eq!(last, "done", "{rest:?}");
    let conversation = done["conversationId"].as_i64().unwrap();
    // Another user of the tenant, and an unknown run, get 404 on every replica.
    assert_eq!(resume(&b.base, &run, "", 2).await.0, 404);
    assert_eq!(resume(&b.base, "no-such-run", "", 1).await.0, 404);
    // The whole run again from B, from the start.
    let (_, again) = resume(&b.base, &run, "", 1).await;
    assert_eq!(tokens(&again), COUNT.concat());

    // A write action: asked on A, approved on B (it runs), the same approval on C (answered
    // the same, nothing runs again).
    let asked = start_turn(&a.base, &stream_body(Some(conversation), "escribe a ana", 1), |s| {
        s.last().is_some_and(|(_, e, _)| e == "done" || e == "error")
    })
    .await;
    let pending = asked.iter().find(|(_, e, _)| e == "pending").unwrap_or_else(|| panic!("{asked:?}"));
    let message = pending.2["messageId"].as_i64().unwrap();
    let (status, approved) = confirm(&b.base, conversation, message).await;
    assert_eq!((status, approved["message"].as_str()), (200, Some("Enviado.")), "{approved}");
    let (status, again) = confirm(&c.base, conversation, message).await;
    assert_eq!((status, &again), (200, &approved), "the same decision on another replica answers the same");
    assert_eq!(cluster.backend.ledger.lock().unwrap().clone(), [(conversation, "sms-2".to_owned())], "sent once");

    // Through the balancer (round robin): a turn cut after two words resumes on whichever
    // replica the balancer picks next, and turns of one conversation go on across replicas.
    let Some(lb) = Balancer::start(&[&a, &b, &c]).await else { return };
    let first = start_turn(&lb.base, &stream_body(Some(conversation), "cuenta otra vez", 1), |s| s.len() == 2).await;
    let run = run_of(&first);
    let (status, rest) = resume(&lb.base, &run, &first[1].0, 1).await;
    assert_eq!(status, 200);
    assert_eq!(format!("{}{}", tokens(&first), tokens(&rest)), COUNT.concat());
    for i in 0..4 {
        let events = start_turn(&lb.base, &stream_body(Some(conversation), &format!("gracias {i}"), 1), |s| {
            s.last().is_some_and(|(_, e, _)| e == "done" || e == "error")
        })
        .await;
        assert_eq!(events.last().map(|(_, e, _)| e.as_str()), Some("done"), "{events:?}");
    }
    let stored = cluster.messages(conversation).await;
    let users: Vec<&str> = stored.iter().filter(|(r, _)| r == "user").map(|(_, c)| c.as_str()).collect();
    assert_eq!(
        users,
        ["cuenta hasta doce", "escribe a ana", "cuenta otra vez", "gracias 0", "gracias 1", "gracias 2", "gracias 3"]
    );
    let observed = [Observed { tenant: 1, user: 1, conversation, errors_seen: 0, pending_seen: vec![message] }];
    cluster.check(&observed).await;
}

/// A replica SIGKILLed mid-reply: another takes the turn over once its lease expires, ends the
/// stream of whoever follows it with an `error`, persists the interrupted reply, and the
/// conversation goes on. A replica killed while an approved write runs: the write is never
/// sent again, its outcome is recorded as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_turns_are_taken_over_and_end_cleanly() {
    let Some(cluster) = Cluster::new().await else { return };
    let pg = cluster.pg_port();
    let lease = 1500;
    let mut a = cluster.replica("a", pg, lease).await;
    let b = cluster.replica("b", pg, lease).await;

    // Killed mid-reply.
    let first = start_turn(&a.base, &stream_body(None, "cuelga", 1), |s| s.len() == 1).await;
    assert_eq!(tokens(&first), "Empiezo");
    let run = run_of(&first);
    // Wait for the relay to publish the first word before the kill (it batches every few ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = client()
            .get(format!("{}/api/chatbot/runs/{run}/events?tenantId=1&userId=1", b.base))
            .header("Last-Event-ID", format!("{run}:1"))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "the run's first frame never reached the store");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = Instant::now();
    a.kill();
    let (status, rest) = resume(&b.base, &run, &first[0].0, 1).await;
    assert_eq!(status, 200);
    let ended = killed.elapsed();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0].1, "error");
    assert_eq!(rest[0].2["message"], toolgraph_server::INTERRUPTED_ERROR);
    assert!(ended < Duration::from_millis(lease * 4), "ended {ended:?} after the kill (lease {lease} ms)");
    eprintln!("the killed replica's turn ended {ended:?} after the kill (lease {lease} ms)");
    // The turn never said `done`, so its conversation's id is read from the store.
    let conversation = conversation_of_user(&cluster, 1).await;
    let stored = cluster.messages(conversation).await;
    assert_eq!(
        stored,
        [("user".to_owned(), "cuelga".to_owned()), ("assistant".to_owned(), INTERRUPTED_REPLY.to_owned())],
        "the interrupted turn is closed in the history"
    );
    let next = start_turn(&b.base, &stream_body(Some(conversation), "hola otra vez", 1), |s| {
        s.last().is_some_and(|(_, e, _)| e == "done" || e == "error")
    })
    .await;
    assert_eq!(next.last().map(|(_, e, _)| e.as_str()), Some("done"), "the conversation goes on: {next:?}");

    // Killed while an approved write runs.
    let a2 = cluster.replica("a2", pg, lease).await;
    let asked = start_turn(&a2.base, &stream_body(Some(conversation), "escribe a ana", 1), |s| {
        s.last().is_some_and(|(_, e, _)| e == "done" || e == "error")
    })
    .await;
    let message = asked.iter().find(|(_, e, _)| e == "pending").unwrap_or_else(|| panic!("{asked:?}")).2["messageId"]
        .as_i64()
        .unwrap();
    cluster.backend.hold.store(true, Ordering::SeqCst);
    let arrived = cluster.backend.arrived.notified();
    let approving = tokio::spawn({
        let base = a2.base.clone();
        async move { confirm(&base, conversation, message).await }
    });
    tokio::time::timeout(Duration::from_secs(20), arrived).await.expect("the write reached the backend");
    let mut a2 = a2;
    a2.kill();
    assert_eq!(approving.await.unwrap().0, 0, "the approval was cut by the kill");
    cluster.backend.hold.store(false, Ordering::SeqCst);
    // B takes the turn over and closes it; the conversation is free again.
    let deadline = Instant::now() + Duration::from_millis(lease * 6);
    let after_kill = loop {
        let response = client()
            .post(format!("{}/api/chatbot/stream", b.base))
            .header("X-Tenant-Slug", "demo")
            .json(&stream_body(Some(conversation), "gracias", 1))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break read_events(response, |_| false).await;
        }
        assert_eq!(response.status(), 409, "busy until taken over");
        assert!(Instant::now() < deadline, "the killed replica's turn was never taken over");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(after_kill.last().map(|(_, e, _)| e.as_str()), Some("done"), "{after_kill:?}");
    let seen = cluster.model.requests().last().unwrap()["messages"].to_string();
    assert!(seen.contains(INTERRUPTED_CALL), "the model learns the write's outcome is unknown: {seen}");
    let (status, body) = confirm(&b.base, conversation, message).await;
    assert_eq!(status, 409, "an action whose outcome is unknown is never run again: {body}");
    assert_eq!(cluster.backend.ledger.lock().unwrap().len(), 1, "sent once");
    let observed = [Observed { tenant: 1, user: 1, conversation, errors_seen: 2, pending_seen: vec![message] }];
    cluster.check(&observed).await;
}

/// The first conversation of `user` in the test's schema.
async fn conversation_of_user(cluster: &Cluster, user: i64) -> i64 {
    let pool =
        sqlx::postgres::PgPoolOptions::new().max_connections(1).connect_with(cluster.schema.options()).await.unwrap();
    let id: i64 = sqlx::query_scalar("SELECT id FROM conversations WHERE user_id = $1 ORDER BY id LIMIT 1")
        .bind(user)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    id
}

/// A replica that relays another's run loses its PostgreSQL connections (its listening one
/// included) for a while mid-run: its reader still gets every frame once, and the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_database_connection_loses_no_event() {
    let Some(cluster) = Cluster::new().await else { return };
    let pg = cluster.pg_port();
    let proxy = FaultProxy::start(format!("127.0.0.1:{pg}").parse().unwrap()).await.unwrap();
    let a = cluster.replica("a", pg, 30_000).await;
    let c = cluster.replica("c", proxy.addr().port(), 30_000).await;

    let first = start_turn(&a.base, &stream_body(None, "cuenta", 1), |s| s.len() == 1).await;
    let run = run_of(&first);
    let follow = tokio::spawn({
        let (base, run, id) = (c.base.clone(), run.clone(), first[0].0.clone());
        async move { resume(&base, &run, &id, 1).await }
    });
    // Two words in, every connection of C to PostgreSQL is cut, and new ones are refused for
    // a second (the database restarting, as C sees it); then it is back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Refuse);
    proxy.cut_all();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    proxy.set(Fault::None);
    let (status, rest) = follow.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(seqs(&rest, &run), (2..=13).collect::<Vec<u64>>(), "every frame once: {rest:?}");
    assert_eq!(format!("{}{}", tokens(&first), tokens(&rest)), COUNT.concat());
    assert_eq!(rest.last().map(|(_, e, _)| e.as_str()), Some("done"));
    // The listening connection itself comes back (it retries with backoff).
    let deadline = Instant::now() + Duration::from_secs(15);
    let log = loop {
        let log = std::fs::read_to_string(cluster.dir.path().join("c.log")).unwrap();
        if log.contains("listening for run events again") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(log.contains("the run-events listening connection"), "it was dropped: {log}");
    assert!(
        log.contains("listening for run events again"),
        "the listening connection was dropped and came back: {log}"
    );
}

/// A LangGraph thread rejoins only its own runs, on the replica that ran it and on another
/// (which reads the run from the shared store): another thread of the same person naming the
/// run gets 404 on both. While it runs, the other replica sees the thread `busy` and lists and
/// reads the run, running and then ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_joins_only_its_own_runs_on_any_replica() {
    let Some(cluster) = Cluster::new().await else { return };
    let pg = cluster.pg_port();
    let a = cluster.replica("a", pg, 30_000).await;
    let b = cluster.replica("b", pg, 30_000).await;
    let asks = |r: reqwest::RequestBuilder| {
        r.header("X-Tenant-Slug", "demo").header("X-Tenant-Id", "1").header("X-User-Id", "1")
    };
    let mut threads = Vec::new();
    for _ in 0..2 {
        let made: Value = asks(client().post(format!("{}/threads", a.base)))
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        threads.push(made["thread_id"].as_str().unwrap().to_owned());
    }
    let (own, other) = (&threads[0], &threads[1]);
    let body = json!({"assistant_id": "assistant", "stream_mode": "values",
                      "input": {"messages": [{"role": "user", "content": "cuenta hasta doce"}]}});
    let url = format!("{}/threads/{own}/runs/stream", a.base);
    let running = tokio::spawn(asks(client().post(url)).json(&body).send());
    // While replica a runs it (twelve words, 120 ms apart), replica b sees the thread busy, and
    // finds it by that status.
    let status_on_b = || async {
        let thread: Value =
            asks(client().get(format!("{}/threads/{own}", b.base))).send().await.unwrap().json().await.unwrap();
        thread["status"].as_str().unwrap_or_default().to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while status_on_b().await != "busy" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status_on_b().await, "busy", "a run of replica a, seen from b");
    let found: Value = asks(client().post(format!("{}/threads/search", b.base)))
        .json(&json!({"status": "busy"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = found.as_array().unwrap().iter().filter_map(|t| t["thread_id"].as_str()).collect();
    assert_eq!(ids, [own.as_str()], "{found}");
    // Replica b lists the run and reads it while a runs it, from the shared checkpoints.
    let runs_on = |base: &str, thread: &str| {
        let url = format!("{base}/threads/{thread}/runs");
        async move { asks(client().get(url)).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let listed = runs_on(&b.base, own).await;
    let fields = |run: &Value| (run["status"].clone(), run["assistant_id"].clone(), run["multitask_strategy"].clone());
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(fields(&listed[0]), (json!("running"), json!("assistant"), json!("reject")), "{listed}");
    let streamed = running.await.unwrap().unwrap().text().await.unwrap();
    assert_eq!(status_on_b().await, "idle", "once the run ended");
    let metadata =
        streamed.split("\n\n").find(|e| e.contains("event: metadata")).unwrap_or_else(|| panic!("{streamed}"));
    let data: Value = serde_json::from_str(metadata.lines().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap();
    let run = data["run_id"].as_str().unwrap().to_owned();
    let join = |base: &str, thread: &str| {
        asks(client().get(format!("{base}/threads/{thread}/runs/{run}/stream"))).timeout(Duration::from_secs(10)).send()
    };
    let listed = runs_on(&b.base, own).await;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!((&listed[0]["run_id"], fields(&listed[0]).0), (&json!(run), json!("success")), "{listed}");
    let got = |base: &str, thread: &str| asks(client().get(format!("{base}/threads/{thread}/runs/{run}"))).send();
    let on_b = got(&b.base, own).await.unwrap();
    assert_eq!(on_b.status(), 200);
    assert_eq!(on_b.json::<Value>().await.unwrap()["status"], "success");
    assert_eq!(got(&b.base, other).await.unwrap().status(), 404, "another thread's run, read on b");
    assert_eq!(runs_on(&b.base, other).await, json!([]));
    for replica in [&a, &b] {
        let joined = join(&replica.base, own).await.unwrap();
        assert_eq!(joined.status(), 200, "{}", replica.base);
        assert!(joined.text().await.unwrap().contains("event: values"));
        assert_eq!(
            join(&replica.base, other).await.unwrap().status(),
            404,
            "another thread's run, on {}",
            replica.base
        );
    }
}
