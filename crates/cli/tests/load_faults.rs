//! Load with faults (docs/reliability.md): N concurrent streams on one `toolgraph serve`
//! (SQLite), every 20th model call faulted (an HTTP 500, a stream cut before its end, a
//! malformed chunk, a stall past the idle timeout). Reported: turns completed, errors by kind,
//! p50/p99 time to the last event, the service's peak RSS, and the invariant checker's verdict
//! over every conversation. Goals: no silent turn (each ends with `done` or `error`), every
//! invariant holds.
//!
//! `FAULT_LOAD_STREAMS` sets N (default 500, the suite's bounded run; `scripts/faults`
//! runs 5,000). Each stream holds two sockets in the service and two in this process (its
//! client's, and the model server's side), so 5,000 fit the 20,000 open files per process.

mod common;
use common::{check_invariants, free_port, rss_kb, serve_command, wait_ready};

use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use toolgraph_protocol::Frame;

/// Tokens of a reply, and the pause between them: a turn holds its stream about a second.
const TOKENS: usize = 10;
const TOKEN_GAP: Duration = Duration::from_millis(100);

/// Every 20th call is faulted, the kind rotating.
fn model_reply(call: usize) -> Reply {
    let words: Vec<Step> = (0..TOKENS).flat_map(|i| [Step::Pause(TOKEN_GAP), Step::Text(format!("w{i} "))]).collect();
    if call % 20 != 19 {
        let mut steps = words;
        steps.extend([Step::Finish("stop".into()), Step::Done]);
        return Reply::Stream(steps);
    }
    match (call / 20) % 4 {
        0 => Reply::status(500, "injected: internal error"),
        // Cut: half the words, then the body ends without a finish reason.
        1 => Reply::Stream(words[..TOKENS].to_vec()),
        2 => Reply::Stream(vec![Step::Text("w0 ".into()), Step::Raw("{injected malformed".into())]),
        // Stall past the idle timeout the service is given.
        _ => Reply::Stream(vec![Step::Text("w0 ".into()), Step::Pause(Duration::from_secs(30)), Step::Done]),
    }
}

/// How one client's stream ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Done,
    Error(String),
    Status(u16),
    Transport,
    /// 200, then the body ended with neither `done` nor `error`: the one thing that must
    /// never happen.
    Silent,
}

/// Streams open right now, and the most there were at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

async fn one_stream(client: reqwest::Client, base: String, user: i64, live: Arc<InFlight>) -> (Ending, Duration) {
    let n = live.now.fetch_add(1, Ordering::SeqCst) + 1;
    live.peak.fetch_max(n, Ordering::SeqCst);
    let result = stream_once(client, base, user).await;
    live.now.fetch_sub(1, Ordering::SeqCst);
    result
}

async fn stream_once(client: reqwest::Client, base: String, user: i64) -> (Ending, Duration) {
    let started = Instant::now();
    let body = json!({"tenantSlug": "demo", "tenantId": 1, "userId": user, "conversationId": null, "message": "hola"});
    let sent =
        client.post(format!("{base}/api/chatbot/stream")).header("X-Tenant-Slug", "demo").json(&body).send().await;
    let resp = match sent {
        Ok(r) => r,
        Err(_) => return (Ending::Transport, started.elapsed()),
    };
    if resp.status() != 200 {
        return (Ending::Status(resp.status().as_u16()), started.elapsed());
    }
    let Ok(text) = resp.text().await else { return (Ending::Transport, started.elapsed()) };
    let last = toolgraph_protocol::sse::parse_body(&text).pop().map(|f| f.frame());
    let ending = match last {
        Some(Ok(Frame::Done { .. })) => Ending::Done,
        Some(Ok(Frame::Error { message })) => Ending::Error(message),
        _ => Ending::Silent,
    };
    (ending, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_with_faulted_model_calls_end_loudly_and_lose_nothing() {
    let streams: usize = std::env::var("FAULT_LOAD_STREAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    model.set_responder(move |_req: &Value| model_reply(counter.fetch_add(1, Ordering::SeqCst)));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_LLM_IDLE_TIMEOUT_MS", "2000")
        .env("TOOLGRAPH_LLM_FIRST_BYTE_TIMEOUT_MS", "10000")
        // One tenant drives every stream; its default cap (64 runs) would answer 429.
        .env("TOOLGRAPH_SERVER_MAX_RUNS_PER_TENANT", "0")
        .env("TOOLGRAPH_LOG", "error")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;

    let client =
        reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(120)).build().unwrap();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(streams);
    let live = Arc::new(InFlight::default());
    for user in 0..streams {
        tasks.push(tokio::spawn(one_stream(client.clone(), base.clone(), user as i64 + 1, live.clone())));
        // Spread the connects over about a second: a burst of thousands overflows the
        // listen backlog, which only adds SYN retries to the figures.
        if user % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut peak_rss = 0;
    let mut results = Vec::with_capacity(streams);
    for t in tasks {
        peak_rss = peak_rss.max(rss_kb(child.id(), "VmRSS:"));
        results.push(t.await.unwrap());
    }
    let wall = started.elapsed();
    peak_rss = peak_rss.max(rss_kb(child.id(), "VmHWM:"));
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    child.wait().unwrap();

    // What the clients saw.
    let mut endings: BTreeMap<String, usize> = BTreeMap::new();
    for (e, _) in &results {
        let kind = match e {
            Ending::Error(m) => format!("error: {m}"),
            other => format!("{other:?}"),
        };
        *endings.entry(kind).or_default() += 1;
    }
    let mut times: Vec<Duration> = results.iter().map(|(_, t)| *t).collect();
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 * p).ceil() as usize).clamp(1, times.len()) - 1];
    let done = results.iter().filter(|(e, _)| *e == Ending::Done).count();
    let silent = results.iter().filter(|(e, _)| *e == Ending::Silent).count();
    let faulted = calls.load(Ordering::SeqCst) / 20;

    // What the stores hold: every conversation, with whether its client saw an error.
    let (verdict, conversations) =
        check_invariants(dir.path(), |user| usize::from(results[(user - 1) as usize].0 != Ending::Done)).await;

    let peak = live.peak.load(Ordering::SeqCst);
    println!(
        "load with faults: {streams} streams ({peak} open at once), {} model calls, {faulted} faulted",
        calls.load(Ordering::SeqCst)
    );
    println!(
        "  wall {:.1} s; p50 {:.2} s, p99 {:.2} s to the last event",
        wall.as_secs_f64(),
        pct(0.5).as_secs_f64(),
        pct(0.99).as_secs_f64()
    );
    println!("  service peak RSS {} MB", peak_rss / 1024);
    for (kind, n) in &endings {
        println!("  {n:>6}  {kind}");
    }
    println!("  invariants: {verdict}");
    assert_eq!(silent, 0, "turns ended in silence: {endings:?}");
    assert!(verdict.holds(), "{verdict}");
    assert_eq!(conversations, streams, "a conversation per stream");
    // A faulted call fails its turn at most; retried 500s may not.
    assert!(done >= streams - faulted, "{done} of {streams} completed with {faulted} faulted calls: {endings:?}");
}
