//! `general_query` against statements that try to take the process down (docs/reliability.md):
//! each must end within the tool's time limit with an error the model can act on, the
//! process's resident memory must stay under 300 MB, and the next ordinary query must work.
//!
//! A test binary of its own, its tests one at a time: the resident-memory peak (`VmHWM`) is
//! the process's, so no other test's memory is counted, and no case's in another's.

use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use toolgraph_agents::academy::sql::general_query_with_timeout;
use toolgraph_tools::{ToolContext, ToolRegistry};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The tool's time limit here (15 s by default).
const LIMIT: Duration = Duration::from_secs(2);
/// What a call may take beyond its limit before the test calls it a hang.
const GRACE: Duration = Duration::from_secs(2);
const RSS_CEILING_KB: u64 = 300 * 1024;

const ENDLESS: &str = "with recursive c(x) as (select 1 union all select x + 1 from c)";

async fn academy_db(dir: &Path) -> PathBuf {
    let path = dir.join("academy.db");
    let pool =
        SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path).create_if_missing(true)).await.unwrap();
    sqlx::query("CREATE TABLE students (name TEXT, age INTEGER, gpa REAL)").execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO students VALUES ('Ana', 20, 3.5), ('Minh', 22, NULL)").execute(&pool).await.unwrap();
    pool.close().await;
    path
}

async fn registry(path: &Path) -> ToolRegistry {
    let mut reg = ToolRegistry::new();
    reg.register(general_query_with_timeout(path.to_str().unwrap(), LIMIT).await.unwrap()).unwrap();
    reg
}

/// Runs `sql`, failing the test if the call does not end within the limit and its grace.
async fn run(reg: &ToolRegistry, sql: &str) -> Value {
    let started = Instant::now();
    let (ctx, arguments) = (ToolContext::default(), json!({ "sql": sql }));
    let call = reg.call(&ctx, "general_query", &arguments);
    let out = tokio::time::timeout(LIMIT + GRACE + Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("hung: {sql:.80}"))
        .to_json();
    let took = started.elapsed();
    assert!(took <= LIMIT + GRACE, "took {took:?}: {sql:.80}");
    out
}

fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn assert_memory_bounded() {
    let peak = peak_rss_kb();
    eprintln!("peak resident memory so far: {} MB", peak / 1024);
    assert!(peak < RSS_CEILING_KB, "resident memory peaked at {} MB", peak / 1024);
}

/// The next ordinary query answers, on a connection still bounded as before.
async fn ordinary_query_works(reg: &ToolRegistry) {
    let out = run(reg, "select count(*), sum(age) from students").await;
    assert_eq!(out["rows"], json!([[2, 42]]), "{out}");
}

fn error_of(out: &Value) -> String {
    assert_eq!(out["ok"], false, "not an error: {:.300}", out.to_string());
    out["error"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_endless_count_ends_at_the_deadline_and_gives_its_connection_back() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let sql = format!("{ENDLESS} select count(*) from c");
    // As many at once as the tool has connections: each must come back for the next query.
    let outs = futures::future::join_all((0..4).map(|_| run(&reg, &sql))).await;
    ordinary_query_works(&reg).await;
    for out in &outs {
        let error = error_of(out);
        assert_eq!(out["kind"], "timeout", "{error}");
        assert!(error.contains("narrow"), "{error}");
    }
    assert_memory_bounded();
}

#[tokio::test]
async fn an_endless_order_by_ends_with_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let out = run(&reg, &format!("{ENDLESS} select x, hex(zeroblob(1000)) as pad from c order by x desc")).await;
    let error = error_of(&out);
    assert!(error.contains("memory") && error.contains("narrow"), "{error}");
    assert_memory_bounded();
    ordinary_query_works(&reg).await;
}

#[tokio::test]
async fn an_endless_distinct_ends_with_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let out = run(&reg, &format!("{ENDLESS} select count(distinct hex(zeroblob(1000)) || x) from c")).await;
    let error = error_of(&out);
    assert!(error.contains("memory") && error.contains("narrow"), "{error}");
    assert_memory_bounded();
    ordinary_query_works(&reg).await;
}

/// 1,000 columns of a 1 MB text over 200 rows: a gigabyte a row. (Written with a CTE: the
/// same statement spelled out column by column is longer than the 8,000 characters the
/// schema lets through.)
#[tokio::test]
async fn a_thousand_huge_columns_are_refused_before_they_run() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let columns = ["v"; 1000].join(",");
    let sql = format!(
        "with recursive c(x) as (select 1 union all select x + 1 from c limit 200), \
         h(v) as (select hex(zeroblob(500000))) select {columns} from c, h"
    );
    let error = error_of(&run(&reg, &sql).await);
    assert!(error.contains("1000 columns") && error.contains("at most 100"), "{error}");
    assert_memory_bounded();
    ordinary_query_works(&reg).await;
}

/// Rows are kept only while the answer stays small enough to send to a model.
#[tokio::test]
async fn a_large_result_is_cut_to_the_byte_budget() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let columns = ["hex(zeroblob(500))"; 10].join(",");
    let sql =
        format!("with recursive c(x) as (select 1 union all select x + 1 from c limit 200) select {columns} from c");
    let out = run(&reg, &sql).await;
    assert!(out.to_string().len() <= 64 * 1024, "{} bytes", out.to_string().len());
    assert_eq!(out["rowCount"], 200);
    let kept = out["rows"].as_array().unwrap().len();
    assert!((1..200).contains(&kept), "{kept}");
    let note = out["note"].as_str().unwrap_or_default();
    assert!(note.contains(&format!("first {kept} of 200 rows")), "{note}");

    // A single row larger than the whole budget: nothing to keep, say what to do instead.
    let error = error_of(&run(&reg, "select hex(zeroblob(500000)) as big").await);
    assert!(error.contains("substr(") && error.contains("length("), "{error}");
    // 100 columns of 1 MB: within the column cap, still refused without holding the rows.
    let columns = ["v"; 100].join(",");
    let sql = format!("with h(v) as (select hex(zeroblob(500000))) select {columns} from h");
    let error = error_of(&run(&reg, &sql).await);
    assert!(error.contains("substr("), "{error}");
    assert_memory_bounded();
    ordinary_query_works(&reg).await;
}

/// A call whose caller goes away (the run was cancelled) stops its statement at once rather
/// than at the deadline: its connection is back for the next query within moments.
#[tokio::test]
async fn a_dropped_call_stops_its_statement_at_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&academy_db(dir.path()).await).await;
    let sql = format!("{ENDLESS} select count(*) from c");
    let (ctx, arguments) = (ToolContext::default(), json!({ "sql": sql }));
    let calls =
        (0..4).map(|_| tokio::time::timeout(Duration::from_millis(100), reg.call(&ctx, "general_query", &arguments)));
    for dropped in futures::future::join_all(calls).await {
        assert!(dropped.is_err(), "the endless count answered: {dropped:?}");
    }
    let started = Instant::now();
    ordinary_query_works(&reg).await;
    assert!(started.elapsed() < LIMIT / 2, "waited {:?} for a connection", started.elapsed());
}
