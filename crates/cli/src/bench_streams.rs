//! `toolgraph bench streams`: many held streams across replicas, one of them killed midway
//! (docs/benchmarks.md, "Replicas under load").
//!
//! Each turn starts on one of the `--target` replicas in turn (the client balances, as a load
//! balancer would: a proxy in front would need two sockets per stream of its own). A turn whose
//! stream breaks comes back, as a browser's EventSource would, to the next replica with
//! `GET /api/chatbot/runs/{runId}/events` and `Last-Event-ID`, until it reads its `done` or
//! `error`. Every turn ends in one of: `done`, an `error` event, or lost (no end within the
//! time limit). With `--kill PID --kill-at-s S` the command SIGKILLs that replica at S seconds;
//! with `--pid`, it samples each process's resident memory.

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One SSE block's fields: (id, event, data).
fn parse_block(block: &str) -> Option<(String, String, String)> {
    let field = |name: &str| block.lines().find_map(|l| l.strip_prefix(name)).map(str::to_owned);
    Some((field("id: ").unwrap_or_default(), field("event: ")?, field("data: ").unwrap_or_default()))
}

/// Reads a stream until its end: `Some(ending)` on `done`/`error`, `None` when it broke
/// (`last_id` then names the last event read).
async fn read(response: reqwest::Response, last_id: &mut String) -> Option<Ending> {
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let Some((id, event, data)) = parse_block(&block) else { continue };
            if !id.is_empty() {
                *last_id = id;
            }
            match event.as_str() {
                "done" => return Some(Ending::Done),
                "error" => {
                    let message = serde_json::from_str::<serde_json::Value>(&data)
                        .ok()
                        .and_then(|v| v["message"].as_str().map(str::to_owned))
                        .unwrap_or(data);
                    return Some(Ending::Error(message));
                }
                _ => {}
            }
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
    let result =
        |ending, reconnects| TurnResult { ending, seconds: started.elapsed().as_secs_f64(), reconnects, target };
    let mut last_id = String::new();
    let first = http
        .post(format!("{}/api/chatbot/stream", targets[target]))
        .header("X-Tenant-Slug", "bench")
        .json(&body)
        .send()
        .await;
    match first {
        Ok(r) if r.status().is_success() => {
            if let Some(ending) = read(r, &mut last_id).await {
                return result(ending, 0);
            }
        }
        Ok(r) => return result(Ending::Error(format!("HTTP {}", r.status().as_u16())), 0),
        Err(e) => {
            // The turn never started as far as the client knows: nothing to come back to.
            return result(
                Ending::Lost(format!("cannot start: {}", if e.is_connect() { "connect" } else { "send" })),
                0,
            );
        }
    }
    // The stream broke: come back on the next replicas until the end arrives.
    let Some((run, _)) = last_id.rsplit_once(':').map(|(r, s)| (r.to_owned(), s.to_owned())) else {
        return result(Ending::Lost("broke before its first event".into()), 0);
    };
    let mut reconnects = 0;
    let mut next = target + 1;
    while Instant::now() < deadline {
        reconnects += 1;
        let base = &targets[next % targets.len()];
        next += 1;
        let resumed = http
            .get(format!("{base}/api/chatbot/runs/{run}/events?tenantId=1&userId={user}"))
            .header("Last-Event-ID", &last_id)
            .send()
            .await;
        match resumed {
            Ok(r) if r.status().is_success() => {
                if let Some(ending) = read(r, &mut last_id).await {
                    return result(ending, reconnects);
                }
            }
            // Unknown on that replica (404), or it is down: try the next after a pause.
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    result(Ending::Lost("no end within the time limit".into()), reconnects)
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
