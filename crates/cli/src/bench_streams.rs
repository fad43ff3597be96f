//! `toolgraph bench streams`: many held streams across replicas, one of them killed midway
//! (docs/benchmarks.md, "Replicas under load").
//!
//! Each turn starts on one of the `--target` replicas in turn (the client balances, as a load
//! balancer would: a proxy in front would need two sockets per stream of its own). A turn whose
//! stream breaks comes back, as a browser's EventSource would, to the next replica with
//! `GET /api/chatbot/runs/{runId}/events` and `Last-Event-ID`, until it reads its `done` or
//! `error`. Every turn ends in one of: `done`, an `error` event, or lost (no end within the
//! time limit). Streams are read as typed frames through `toolgraph_protocol::sse`. With `--kill PID --kill-at-s S` the command SIGKILLs that replica at S seconds;
//! with `--pid`, it samples each process's resident memory.

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgraph_protocol::{Frame, is_terminal_event};

/// `bench streams` arguments.
#[derive(Debug, clap::Args)]
pub struct StreamsArgs {
    /// A replica's base URL (repeat for each).
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// Turns, all held open at once.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Seconds over which the turns start (evenly).
    #[arg(long, default_value_t = 10.0)]
    ramp_s: f64,
    /// SIGKILL this process (a replica) …
    #[arg(long, value_name = "PID")]
    kill: Option<i32>,
    /// … this many seconds after the first turn started.
    #[arg(long, default_value_t = 30.0)]
    kill_at_s: f64,
    /// Sample this process's resident memory (repeat for each replica).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<i32>,
    /// A turn without its end after this long is lost.
    #[arg(long, default_value_t = 400.0)]
    timeout_s: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// How one turn ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Done,
    Error(String),
    Lost(String),
}

#[derive(Debug)]
struct TurnResult {
    ending: Ending,
    /// `token` frames read, and the characters of the reply they carried.
    tokens: usize,
    reply_chars: usize,
    seconds: f64,
    /// Streams it had to come back on.
    reconnects: usize,
    /// The replica its first stream went to.
    target: usize,
}

/// What `bench streams --json` prints.
#[derive(Debug, Serialize)]
pub struct StreamsReport {
    streams: usize,
    targets: usize,
    done: usize,
    errors: BTreeMap<String, usize>,
    lost: BTreeMap<String, usize>,
    /// `token` frames read over every turn, and the characters they carried.
    tokens: usize,
    reply_chars: usize,
    /// Turns that came back on another replica at least once.
    resumed: usize,
    reconnects: usize,
    /// Turn time (start to its end) over every turn that ended, seconds.
    p50_s: f64,
    p99_s: f64,
    /// The same over the turns of replicas that were not killed.
    p99_unkilled_s: f64,
    /// Peak resident memory of each `--pid`, MB.
    peak_rss_mb: BTreeMap<i32, f64>,
    killed_at_s: Option<f64>,
    seconds: f64,
}

/// What a turn's client has read, over every stream it held.
#[derive(Debug, Default)]
struct Seen {
    /// The last event's id (`<runId>:<seq>`), to come back after.
    last_id: String,
    /// `token` frames.
    tokens: usize,
    /// The reply they carried.
    reply: String,
}

/// Reads a stream (an HTTP body) until its end: `Some(ending)` on `done`/`error`, `None` when
/// it broke (`seen.last_id` then names the last event read).
async fn read<S, B, E>(body: S, seen: &mut Seen) -> Option<Ending>
where
    S: futures::Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut events = std::pin::pin!(toolgraph_protocol::sse::frames(body));
    while let Some(Ok(event)) = events.next().await {
        if let Some(id) = &event.id {
            id.clone_into(&mut seen.last_id);
        }
        match event.frame() {
            Ok(Frame::Token { content }) => {
                seen.tokens += 1;
                seen.reply.push_str(&content);
            }
            Ok(Frame::Done { .. }) => return Some(Ending::Done),
            Ok(Frame::Error { message }) => return Some(Ending::Error(message)),
            Err(e) if is_terminal_event(&event.event) => return Some(Ending::Error(e.to_string())),
            _ => {}
        }
    }
    None
}

async fn turn(http: reqwest::Client, targets: Arc<Vec<String>>, i: usize, deadline: Instant) -> TurnResult {
    let started = Instant::now();
    let target = i % targets.len();
    let user = i as i64 + 1;
    let body = serde_json::json!({"tenantSlug": "bench", "tenantId": 1, "userId": user, "conversationId": null,
                                  "message": format!("How many orders did we get yesterday? #{i}")});
    let mut seen = Seen::default();
    let result = |ending, reconnects, seen: &Seen| TurnResult {
        ending,
        tokens: seen.tokens,
        reply_chars: seen.reply.chars().count(),
        seconds: started.elapsed().as_secs_f64(),
        reconnects,
        target,
    };
    let first = http
        .post(format!("{}/api/chatbot/stream", targets[target]))
        .header("X-Tenant-Slug", "bench")
        .json(&body)
        .send()
        .await;
    match first {
        Ok(r) if r.status().is_success() => {
            if let Some(ending) = read(r.bytes_stream(), &mut seen).await {
                return result(ending, 0, &seen);
            }
        }
        Ok(r) => return result(Ending::Error(format!("HTTP {}", r.status().as_u16())), 0, &seen),
        Err(e) => {
            // The turn never started as far as the client knows: nothing to come back to.
            return result(
                Ending::Lost(format!("cannot start: {}", if e.is_connect() { "connect" } else { "send" })),
                0,
                &seen,
            );
        }
    }
    // The stream broke: come back on the next replicas until the end arrives.
    let Some(run) = seen.last_id.rsplit_once(':').map(|(r, _)| r.to_owned()) else {
        return result(Ending::Lost("broke before its first event".into()), 0, &seen);
    };
    let mut reconnects = 0;
    let mut next = target + 1;
    while Instant::now() < deadline {
        reconnects += 1;
        let base = &targets[next % targets.len()];
        next += 1;
        let resumed = http
            .get(format!("{base}/api/chatbot/runs/{run}/events?tenantId=1&userId={user}"))
            .header("Last-Event-ID", &seen.last_id)
            .send()
            .await;
        match resumed {
            Ok(r) if r.status().is_success() => {
                if let Some(ending) = read(r.bytes_stream(), &mut seen).await {
                    return result(ending, reconnects, &seen);
                }
            }
            // Unknown on that replica (404), or it is down: try the next after a pause.
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    result(Ending::Lost("no end within the time limit".into()), reconnects, &seen)
}

/// Resident memory of `pid` in MB, if it runs.
fn rss_mb(pid: i32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb / 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
}

/// Runs the load and reports it.
///
/// # Errors
/// When the HTTP client cannot be built.
pub async fn run(args: StreamsArgs) -> anyhow::Result<StreamsReport> {
    let targets = Arc::new(args.targets.iter().map(|t| t.trim_end_matches('/').to_owned()).collect::<Vec<_>>());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.streams)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("cannot build the HTTP client")?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.timeout_s);
    let peaks: Arc<std::sync::Mutex<BTreeMap<i32, f64>>> = Arc::default();
    let sampler = {
        let (pids, peaks) = (args.pids.clone(), Arc::clone(&peaks));
        tokio::spawn(async move {
            loop {
                for &pid in &pids {
                    if let Some(mb) = rss_mb(pid) {
                        let mut p = peaks.lock().unwrap_or_else(|e| e.into_inner());
                        let peak = p.entry(pid).or_default();
                        *peak = peak.max(mb);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let killer = args.kill.map(|pid| {
        let at = Duration::from_secs_f64(args.kill_at_s);
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            // Through the `kill` command: no unsafe code for one signal.
            let _ = tokio::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().await;
            started.elapsed().as_secs_f64()
        })
    });
    let gap = Duration::from_secs_f64(args.ramp_s.max(0.0) / args.streams.max(1) as f64);
    let mut tasks = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        tasks.push(tokio::spawn(turn(http.clone(), Arc::clone(&targets), i, deadline)));
        if !gap.is_zero() {
            tokio::time::sleep_until((started + gap * i as u32).into()).await;
        }
    }
    let mut results = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await.context("a turn's task failed")?);
    }
    let killed_at_s = match killer {
        Some(k) => Some(k.await.context("the kill task failed")?),
        None => None,
    };
    sampler.abort();
    let killed_target = args.kill.and_then(|pid| args.pids.iter().position(|p| *p == pid));
    let mut report = StreamsReport {
        streams: args.streams,
        targets: targets.len(),
        done: 0,
        errors: BTreeMap::new(),
        lost: BTreeMap::new(),
        tokens: results.iter().map(|r| r.tokens).sum(),
        reply_chars: results.iter().map(|r| r.reply_chars).sum(),
        resumed: results.iter().filter(|r| r.reconnects > 0).count(),
        reconnects: results.iter().map(|r| r.reconnects).sum(),
        p50_s: 0.0,
        p99_s: 0.0,
        p99_unkilled_s: 0.0,
        peak_rss_mb: peaks.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        killed_at_s,
        seconds: started.elapsed().as_secs_f64(),
    };
    for r in &results {
        match &r.ending {
            Ending::Done => report.done += 1,
            Ending::Error(m) => *report.errors.entry(m.clone()).or_default() += 1,
            Ending::Lost(m) => *report.lost.entry(m.clone()).or_default() += 1,
        }
    }
    let mut times: Vec<f64> =
        results.iter().filter(|r| !matches!(r.ending, Ending::Lost(_))).map(|r| r.seconds).collect();
    times.sort_by(f64::total_cmp);
    let mut unkilled: Vec<f64> = results
        .iter()
        .filter(|r| !matches!(r.ending, Ending::Lost(_)) && Some(r.target) != killed_target)
        .map(|r| r.seconds)
        .collect();
    unkilled.sort_by(f64::total_cmp);
    (report.p50_s, report.p99_s, report.p99_unkilled_s) =
        (percentile(&times, 0.5), percentile(&times, 0.99), percentile(&unkilled, 0.99));
    Ok(report)
}

/// Prints a report.
pub fn print(r: &StreamsReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "{} turns on {} replicas in {:.0} s: {} done, {} error events, {} lost; {} resumed on another replica ({} reconnects)",
        r.streams,
        r.targets,
        r.seconds,
        r.done,
        r.errors.values().sum::<usize>(),
        r.lost.values().sum::<usize>(),
        r.resumed,
        r.reconnects
    );
    println!("read {} token frames, {} characters of replies", r.tokens, r.reply_chars);
    for (m, n) in &r.errors {
        println!("  error ×{n}: {m}");
    }
    for (m, n) in &r.lost {
        println!("  lost ×{n}: {m}");
    }
    println!(
        "turn time p50 {:.1} s · p99 {:.1} s · p99 on the replicas not killed {:.1} s",
        r.p50_s, r.p99_s, r.p99_unkilled_s
    );
    for (pid, mb) in &r.peak_rss_mb {
        println!("peak RSS of {pid}: {mb:.0} MB");
    }
    if let Some(at) = r.killed_at_s {
        println!("killed at {at:.1} s");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A turn's stream whose tokens and error carry characters of 2, 3 and 4 bytes.
    const BODY: &str = "id: r:1\nevent: token\ndata: {\"content\":\"café \"}\n\n\
                        id: r:2\nevent: token\ndata: {\"content\":\"tiếng 🎉\"}\n\n\
                        : keep-alive\n\n\
                        id: r:3\nevent: error\ndata: {\"message\":\"no se pudo: ệ\"}\n\n";

    /// Serves `BODY` once over HTTP/1.1 from a loopback port, written in pieces cut inside
    /// each multi-byte character, each piece flushed on its own.
    async fn serve_in_pieces() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.set_nodelay(true).unwrap();
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                if socket.read(&mut byte).await.unwrap() == 0 {
                    return;
                }
                request.push(byte[0]);
            }
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            let bytes = BODY.as_bytes();
            // One byte into `é`, two into `ế`, one into `🎉`, two into the last `ệ`.
            let cuts = [("é", 1), ("ế", 2), ("🎉", 1), ("ệ", 2)].map(|(c, into)| BODY.find(c).unwrap() + into);
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                socket.write_all(&bytes[from..cut]).await.unwrap();
                socket.flush().await.unwrap();
                from = cut;
                // Apart in time, so the client reads them as separate chunks.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        format!("http://{addr}/")
    }

    #[tokio::test]
    async fn multi_byte_characters_split_across_tcp_chunks_read_whole() {
        let url = serve_in_pieces().await;
        let response = reqwest::get(url).await.unwrap();
        let mut seen = Seen::default();
        let ending = read(response.bytes_stream(), &mut seen).await;
        assert_eq!(ending, Some(Ending::Error("no se pudo: ệ".into())));
        assert_eq!((seen.tokens, seen.reply.as_str(), seen.last_id.as_str()), (2, "café tiếng 🎉", "r:3"));
    }

    #[tokio::test]
    async fn every_cut_of_the_stream_reads_the_same() {
        let bytes = BODY.as_bytes();
        for cut in 1..bytes.len() {
            let chunks = [Ok::<_, std::convert::Infallible>(&bytes[..cut]), Ok(&bytes[cut..])];
            let mut seen = Seen::default();
            let ending = read(futures::stream::iter(chunks), &mut seen).await;
            assert_eq!(ending, Some(Ending::Error("no se pudo: ệ".into())), "cut at byte {cut}");
            assert_eq!(seen.reply, "café tiếng 🎉", "cut at byte {cut}");
        }
    }

    #[tokio::test]
    async fn a_stream_that_breaks_off_keeps_its_last_id() {
        let body = "id: r:1\nevent: token\ndata: {\"content\":\"a\"}\n\nid: r:2\nevent: tok";
        let mut seen = Seen::default();
        let ending = read(futures::stream::iter([Ok::<_, std::convert::Infallible>(body)]), &mut seen).await;
        assert_eq!((ending, seen.last_id.as_str(), seen.tokens), (None, "r:1", 1));
    }
}
