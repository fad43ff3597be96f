//! `general_query` over a local SQLite database: the academy admin's read-only SQL tool when the
//! service itself holds the data (`tools.sql_database`; with a backend, the backend runs it).
//!
//! Two guards on what a statement may do: it must be one `SELECT` (or `WITH … SELECT`) —
//! anything else is an `invalid_arguments` outcome the model can repair — and the connection
//! itself is read-only (`PRAGMA query_only`), so the database refuses writes whatever the text
//! says.
//!
//! And bounds on what one statement may cost (docs/tools.md, "Built-in tools"), each ending in
//! an outcome that tells the model how to narrow its query, with the connection free for the
//! next call:
//! - time: a progress handler ends the statement at its deadline, on SQLite's own thread of
//!   work — dropping the caller's future alone would leave it running with its connection;
//! - memory and disk: temporary storage (`ORDER BY`, `DISTINCT`, `GROUP BY` over many rows) is
//!   kept in memory, never in temp files that could fill the disk, and the statement is ended
//!   once SQLite's heap has grown by [`MAX_HEAP_GROWTH`] since it began;
//! - size: at most [`MAX_COLUMNS`] columns, checked before the first row is computed, no value
//!   over 1 MiB, and rows are kept only while the answer fits in [`MAX_RESULT_BYTES`].
//!
//! Statements run on rusqlite connections on tokio's blocking threads rather than through sqlx:
//! rows are read in place (sqlx copies every value and reads up to 50 rows ahead, a gigabyte
//! each for a row of 1,000 one-megabyte columns), and the progress handler is installed per
//! statement on the raw handle.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, ffi};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use toolgraph_tools::{Tool, ToolBuilder, ToolError};

/// Most rows returned to the model.
const MAX_ROWS: usize = 200;
/// Most rows counted for `rowCount`; a query with more stops there (`truncated: true`).
const MAX_COUNTED: usize = 100_000;
/// Largest string or blob a query may make (SQLite's `SQLITE_LIMIT_LENGTH`, 1 GB by default):
/// `randomblob(1e9)` or a `replace(zeroblob(…))` would otherwise allocate that much.
const MAX_VALUE_BYTES: i32 = 1 << 20;
/// Most columns of a result. SQLite computes a whole row before it can be read, so a row can
/// hold this many values of up to 1 MiB each: the cap bounds that, and no table a model needs
/// to read is wider.
pub const MAX_COLUMNS: usize = 100;
/// Largest answer, in bytes of its JSON: within the registry's limit on any tool outcome
/// (64 KiB by default), with room left for the `sql` and the column names.
pub const MAX_RESULT_BYTES: usize = 48 * 1024;
/// How far SQLite's heap may grow while one statement runs. SQLite has no per-connection bound
/// on the memory a sort or a `DISTINCT` takes, and its heap limits are process-wide (they would
/// fail other connections' allocations), so the progress handler ends this statement instead.
/// The counter is the process's: another connection growing meanwhile counts too.
pub const MAX_HEAP_GROWTH: i64 = 64 << 20;
/// Time limit of a call unless [`general_query_with_timeout`] sets another.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(15);
/// Past the statement's own deadline, before the registry's time limit cuts the call: the
/// statement's error, which says what to change, comes first.
const TOOL_GRACE: Duration = Duration::from_secs(1);
/// Statements running at once (each on a blocking thread with a connection of its own).
const CONNECTIONS: usize = 4;
/// Longest wait for another process's write lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Virtual-machine steps between two checks of the deadline and the heap: a few microseconds,
/// and with temporary rows of up to 1 MiB, a few megabytes past the bound at most.
const PROGRESS_STEPS: c_int = 100;

/// Arguments of `general_query`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct QueryArgs {
    /// One read-only SQL SELECT statement.
    #[schemars(length(min = 1, max = 8000))]
    pub sql: String,
}

/// A database that cannot be opened for the tool.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the SQL database '{database}': {reason}")]
pub struct SqlError {
    /// The configured database.
    pub database: String,
    /// Why.
    pub reason: String,
}

/// Whether `sql` is exactly one SELECT (or WITH) statement; the error says why not.
///
/// The text is read as SQLite reads it — `'…'` strings, `"…"`, `` `…` `` and `[…]` names,
/// `--` and `/* */` comments — so a quote inside a comment cannot hide the `;` of a second
/// statement (such as `PRAGMA query_only = 0`, which would lift the connection's own guard).
///
/// # Errors
/// A readable reason for the model.
pub fn check_read_only_select(sql: &str) -> Result<(), String> {
    let (code, statements) = read_code(sql)?;
    let first = code.split_whitespace().next().unwrap_or_default().to_ascii_lowercase();
    let keyword: String = first.chars().take_while(char::is_ascii_alphabetic).collect();
    if keyword != "select" && keyword != "with" {
        return Err(format!("only a single read-only SELECT statement is allowed, got '{}'", first.to_uppercase()));
    }
    if statements > 1 {
        return Err("only one statement is allowed".into());
    }
    Ok(())
}

/// `sql` with its comments blanked, and how many statements it holds (text after a `;` outside
/// quotes and comments starts another; a final `;` does not). A doubled quote inside a quoted
/// string reads as two toggles, which leaves the state right.
fn read_code(sql: &str) -> Result<(String, usize), String> {
    let mut code = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let (mut quote, mut statements, mut ended) = (None::<char>, 0usize, true);
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            quote = (c != q).then_some(q);
            code.push(c);
            continue;
        }
        match c {
            '-' if chars.peek() == Some(&'-') => {
                chars.by_ref().find(|&c| c == '\n');
                code.push('\n');
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                if !chars.by_ref().any(|c| std::mem::replace(&mut last, c) == '*' && c == '/') {
                    return Err("a /* comment is not closed".into());
                }
                code.push(' ');
            }
            ';' => {
                ended = true;
                code.push(c);
            }
            c => {
                if ended && !c.is_whitespace() {
                    statements += 1;
                    ended = false;
                }
                if matches!(c, '\'' | '"' | '`' | '[') {
                    quote = Some(if c == '[' { ']' } else { c });
                }
                code.push(c);
            }
        }
    }
    if quote.is_some() {
        return Err("a quoted string or name is not closed".into());
    }
    Ok((code, statements))
}

/// The file (or URI) and flags the configured database names: a path, `sqlite::memory:`, or a
/// `sqlite:` URL whose parameters (`?mode=ro`) SQLite reads as a URI's, as sqlx read them.
fn target(database: &str) -> (String, OpenFlags) {
    static MEMORY: AtomicUsize = AtomicUsize::new(0);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let rest = database.strip_prefix("sqlite://").or_else(|| database.strip_prefix("sqlite:")).unwrap_or(database);
    if rest == ":memory:" {
        // One database for all the tool's connections, not an empty one each.
        let n = MEMORY.fetch_add(1, Ordering::Relaxed);
        (format!("file:toolgraph-general-query-{n}?mode=memory&cache=shared"), flags | OpenFlags::SQLITE_OPEN_URI)
    } else if let Some((path, params)) = rest.split_once('?') {
        (format!("file:{path}?{params}"), flags | OpenFlags::SQLITE_OPEN_URI)
    } else {
        (rest.to_owned(), flags)
    }
}

/// The tool's connections: opened when needed and kept for the next call, at most
/// [`CONNECTIONS`] in use at once.
struct Database {
    name: String,
    flags: OpenFlags,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl Database {
    fn open(&self) -> rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags(&self.name, self.flags)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Sorts and temporary b-trees in memory, where the heap bound covers them; in temp files
        // they would grow on disk without any bound.
        conn.execute_batch("PRAGMA temp_store = MEMORY; PRAGMA query_only = ON;")?;
        // SAFETY: the handle is this open connection's; sqlite3_limit sets a limit of this
        // connection only.
        unsafe { ffi::sqlite3_limit(conn.handle(), ffi::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES) };
        Ok(conn)
    }

    /// Runs `sql` on an idle connection (or a new one), blocking the calling thread. The
    /// connection goes back for the next call however the statement ended.
    fn run(&self, sql: &str, watch: &Watch) -> Result<Answer, ToolError> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open().map_err(|e| ToolError::unavailable(format!("the database is unavailable: {e}")))?,
        };
        let answer = query(&conn, sql, watch);
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        answer
    }
}

/// Why the progress handler ended a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Deadline,
    Memory,
    Cancelled,
}

/// What the progress handler checks; used only on the thread that steps the statement.
struct Watch {
    deadline: Instant,
    limit: Duration,
    /// Set when the caller's future is dropped (the run was cancelled): nobody waits any more.
    cancelled: Arc<AtomicBool>,
    heap_ceiling: Cell<i64>,
    stopped: Cell<Option<Stop>>,
}

impl Watch {
    fn stop_now(&self) -> bool {
        // SAFETY: reads SQLite's own counter, from any thread.
        let heap = unsafe { ffi::sqlite3_memory_used() };
        let stop = if self.cancelled.load(Ordering::Relaxed) {
            Some(Stop::Cancelled)
        } else if Instant::now() >= self.deadline {
            Some(Stop::Deadline)
        } else if heap > self.heap_ceiling.get() {
            Some(Stop::Memory)
        } else {
            None
        };
        if stop.is_some() {
            self.stopped.set(stop);
        }
        stop.is_some()
    }

    /// The outcome of a statement that failed: the bound it hit, or what SQLite said.
    fn failure(&self, e: rusqlite::Error) -> ToolError {
        match self.stopped.get() {
            Some(Stop::Deadline) => ToolError::timeout(format!(
                "the query was stopped after {:?}, the time a query may take: narrow it (a WHERE on an indexed \
                 column, a LIMIT, fewer joins) or ask for an aggregate",
                self.limit
            )),
            Some(Stop::Memory) => ToolError::invalid_arguments(format!(
                "the query was stopped: it needed more than {} MiB of memory, for long values or for sorting, \
                 grouping or DISTINCT over too many rows; narrow it: fewer or shorter columns (substr(col, 1, 200), \
                 length(col)), a WHERE, or a LIMIT in a subquery before it sorts",
                MAX_HEAP_GROWTH >> 20
            )),
            Some(Stop::Cancelled) => ToolError::timeout("the query was cancelled"),
            None => match e {
                rusqlite::Error::SqliteFailure(_, Some(msg)) | rusqlite::Error::SqlInputError { msg, .. } => {
                    ToolError::invalid_arguments(format!("the database refused the query: {msg}"))
                }
                rusqlite::Error::SqliteFailure(code, None) => {
                    ToolError::invalid_arguments(format!("the database refused the query: {code}"))
                }
                other => ToolError::unavailable(format!("the database is unavailable: {other}")),
            },
        }
    }
}

/// SQLite's progress callback: non-zero ends the running statement with `SQLITE_INTERRUPT`.
unsafe extern "C" fn check_progress(watch: *mut c_void) -> c_int {
    // SAFETY: the pointer is the `Watch` given to `Progress::install`, which outlives the
    // handler; SQLite calls it on the thread stepping the statement, the one using the watch.
    let watch = unsafe { &*watch.cast::<Watch>() };
    c_int::from(watch.stop_now())
}

/// The progress handler on a connection for one statement, removed on drop; it borrows the
/// connection and the watch, so it goes before either can.
struct Progress<'a> {
    db: *mut ffi::sqlite3,
    _borrows: PhantomData<(&'a Connection, &'a Watch)>,
}

impl<'a> Progress<'a> {
    fn install(conn: &'a Connection, watch: &'a Watch) -> Self {
        // SAFETY: the handle is the open connection's, and the watch outlives the handler (above).
        let db = unsafe { conn.handle() };
        let arg = std::ptr::from_ref(watch).cast_mut().cast::<c_void>();
        // SAFETY: as above.
        unsafe { ffi::sqlite3_progress_handler(db, PROGRESS_STEPS, Some(check_progress), arg) };
        Self { db, _borrows: PhantomData }
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        // SAFETY: the connection is still open: `Progress` borrows it.
        unsafe { ffi::sqlite3_progress_handler(self.db, 0, None, std::ptr::null_mut()) };
    }
}

/// Sets the flag when dropped: the caller's future went away (or finished).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a statement gave.
struct Answer {
    columns: Vec<String>,
    rows: Vec<Value>,
    count: usize,
    /// Counting stopped at [`MAX_COUNTED`].
    truncated: bool,
    /// Rows stopped being kept at [`MAX_RESULT_BYTES`].
    cut: bool,
}

impl Answer {
    fn into_json(self, sql: String) -> Value {
        let kept = self.rows.len();
        let mut out = json!({ "columns": self.columns, "rows": self.rows, "rowCount": self.count, "sql": sql });
        if self.truncated {
            out["truncated"] = json!(true);
        }
        if self.cut {
            out["note"] = json!(format!(
                "only the first {kept} of {} rows fit in the {MAX_RESULT_BYTES} bytes an answer may hold: narrow the \
                 query (fewer or shorter columns, a WHERE, or LIMIT/OFFSET to page) to see the rest",
                self.count
            ));
        }
        out
    }
}

/// Room an answer keeps for its `note`.
const NOTE_BYTES: usize = 300;

fn query(conn: &Connection, sql: &str, watch: &Watch) -> Result<Answer, ToolError> {
    // SAFETY: reads SQLite's own counter.
    watch.heap_ceiling.set(unsafe { ffi::sqlite3_memory_used() }.saturating_add(MAX_HEAP_GROWTH));
    let _progress = Progress::install(conn, watch);
    let mut statement = conn.prepare(sql).map_err(|e| watch.failure(e))?;
    let width = statement.column_count();
    if width > MAX_COLUMNS {
        return Err(ToolError::invalid_arguments(format!(
            "the query returns {width} columns; at most {MAX_COLUMNS} are allowed: select only the columns you need"
        )));
    }
    let columns: Vec<String> = statement.column_names().into_iter().map(str::to_owned).collect();
    let frame = json!({ "columns": columns, "rows": [], "rowCount": MAX_COUNTED, "sql": sql, "truncated": true });
    let mut room = MAX_RESULT_BYTES.saturating_sub(frame.to_string().len() + NOTE_BYTES);
    let mut rows = statement.raw_query();
    let (mut data, mut count, mut truncated, mut cut) = (Vec::new(), 0usize, false, false);
    // The first MAX_ROWS rows that fit are kept, the rest only counted, up to MAX_COUNTED: a
    // query without end (a recursive CTE) holds no memory.
    while let Some(row) = rows.next().map_err(|e| watch.failure(e))? {
        if data.len() < MAX_ROWS && !cut {
            match kept_row(row, width, room) {
                Some((values, size)) => {
                    room -= size;
                    data.push(values);
                }
                None if data.is_empty() => {
                    return Err(ToolError::invalid_arguments(format!(
                        "one row of the result is larger than the {MAX_RESULT_BYTES} bytes an answer may hold: \
                         select fewer or shorter columns, e.g. substr(col, 1, 200) or length(col) instead of a \
                         long text"
                    )));
                }
                None => cut = true,
            }
        }
        count += 1;
        if count >= MAX_COUNTED {
            truncated = true;
            break;
        }
    }
    Ok(Answer { columns, rows: data, count, truncated, cut })
}

/// The row as JSON and its size in the answer, if it fits in `room` bytes. Its values are
/// read in place, and copied only once their raw size fits.
fn kept_row(row: &rusqlite::Row<'_>, width: usize, room: usize) -> Option<(Value, usize)> {
    let raw: usize = (0..width).map(|i| row.get_ref(i).map_or(5, raw_size)).sum();
    if raw > room {
        return None;
    }
    let values = Value::Array((0..width).map(|i| row.get_ref(i).map_or(Value::Null, cell)).collect());
    // One more byte: the comma before the row.
    let size = values.to_string().len() + 1;
    (size <= room).then_some((values, size))
}

/// Fewest bytes the value takes in the answer, with its comma.
fn raw_size(value: ValueRef<'_>) -> usize {
    match value {
        ValueRef::Null => 5,
        ValueRef::Integer(_) | ValueRef::Real(_) => 2,
        ValueRef::Text(text) => text.len() + 3,
        ValueRef::Blob(_) => 12,
    }
}

fn cell(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => Value::from(f),
        ValueRef::Text(text) => Value::from(String::from_utf8_lossy(text)),
        ValueRef::Blob(bytes) => json!(format!("<{} bytes>", bytes.len())),
    }
}

/// The `general_query` read tool over `database` (a path or `sqlite::memory:`), with the
/// default time limit ([`QUERY_TIMEOUT`]).
///
/// # Errors
/// When the database cannot be opened.
pub async fn general_query(database: &str) -> Result<Arc<dyn Tool>, SqlError> {
    general_query_with_timeout(database, QUERY_TIMEOUT).await
}

/// [`general_query`] whose statements are stopped after `timeout`.
///
/// # Errors
/// When the database cannot be opened.
pub async fn general_query_with_timeout(database: &str, timeout: Duration) -> Result<Arc<dyn Tool>, SqlError> {
    let err = |reason: String| SqlError { database: database.to_owned(), reason };
    let (name, flags) = target(database);
    let db = Arc::new(Database {
        name,
        flags,
        idle: Mutex::new(Vec::new()),
        permits: Arc::new(Semaphore::new(CONNECTIONS)),
    });
    // Opened now: a wrong path fails at startup, not on the model's first call.
    let first = Arc::clone(&db);
    let conn = tokio::task::spawn_blocking(move || first.open())
        .await
        .map_err(|e| err(e.to_string()))?
        .map_err(|e| err(e.to_string()))?;
    db.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
    let tool = ToolBuilder::<QueryArgs>::new(
        "general_query",
        "Run one read-only SQL SELECT against the database and get the rows back as JSON.",
    )
    .display_name("SQL query")
    .param_display("sql", "SQL")
    .timeout(timeout + TOOL_GRACE)
    .handler(move |_ctx, a: QueryArgs| {
        let db = Arc::clone(&db);
        async move {
            check_read_only_select(&a.sql).map_err(ToolError::invalid_arguments)?;
            let deadline = Instant::now() + timeout;
            let permits = Arc::clone(&db.permits);
            let permit = tokio::time::timeout_at(deadline.into(), permits.acquire_owned())
                .await
                .map_err(|_| {
                    ToolError::timeout(format!("the database was busy with other queries for {timeout:?}; try again"))
                })?
                .map_err(|_| ToolError::unavailable("the database is closed"))?;
            let cancelled = Arc::new(AtomicBool::new(false));
            let _cancel = CancelOnDrop(Arc::clone(&cancelled));
            let sql = a.sql.clone();
            let answer = tokio::task::spawn_blocking(move || {
                // Held until the statement has ended, even when the caller is gone: no more
                // statements run than there are connections.
                let _permit = permit;
                let watch = Watch {
                    deadline,
                    limit: timeout,
                    cancelled,
                    heap_ceiling: Cell::new(i64::MAX),
                    stopped: Cell::new(None),
                };
                db.run(&sql, &watch)
            })
            .await
            .map_err(|e| ToolError::internal(format!("the query failed unexpectedly: {e}")))??;
            Ok(answer.into_json(a.sql))
        }
    })
    .map_err(|e| err(e.to_string()))?;
    Ok(tool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    use toolgraph_tools::{ToolContext, ToolErrorKind, ToolRegistry};

    #[test]
    fn only_one_select_passes_the_text_check() {
        assert!(check_read_only_select("select 1").is_ok());
        assert!(check_read_only_select("  WITH t AS (SELECT 1) SELECT * FROM t;").is_ok());
        assert!(check_read_only_select("select ';' as x").is_ok(), "a quoted ; is data");
        assert!(check_read_only_select("delete from t").unwrap_err().contains("DELETE"));
        assert!(check_read_only_select("select 1; drop table t").unwrap_err().contains("one statement"));
        assert!(check_read_only_select("select 1 -- a ';' here is a comment\n").is_ok());
        assert!(check_read_only_select("select 1 /* ; */ as x").is_ok());
        assert!(check_read_only_select("select 'it''s' as x").is_ok(), "a doubled quote stays inside");
        let hidden = "select 1 -- '\n; pragma query_only = 0";
        assert!(check_read_only_select(hidden).unwrap_err().contains("one statement"));
    }

    async fn academy_db(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("academy.db");
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path).create_if_missing(true))
            .await
            .unwrap();
        sqlx::query("CREATE TABLE students (name TEXT, age INTEGER, gpa REAL)").execute(&pool).await.unwrap();
        sqlx::query("INSERT INTO students VALUES ('Ana', 20, 3.5), ('Minh', 22, NULL)").execute(&pool).await.unwrap();
        pool.close().await;
        path
    }

    /// The committed list of hostile statements (`testdata/hostile-sql.txt`): each refused, and
    /// afterwards the database is as it was.
    #[tokio::test]
    async fn every_hostile_statement_is_refused_and_nothing_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = academy_db(dir.path()).await;
        let mut reg = ToolRegistry::new();
        reg.register(general_query(path.to_str().unwrap()).await.unwrap()).unwrap();
        let ctx = ToolContext::default();
        let list = include_str!("../../testdata/hostile-sql.txt");
        let hostile: Vec<String> = list
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| l.replace("\\n", "\n"))
            .collect();
        assert!(hostile.len() >= 40, "{}", hostile.len());
        for sql in &hostile {
            let out = reg.call(&ctx, "general_query", &json!({ "sql": sql })).await;
            assert!(out.error().is_some(), "not refused: {sql:?} → {:?}", out.to_json());
        }
        // The same data, the same schema, and the connection still read-only.
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select count(*), sum(age) from students"})).await;
        assert_eq!(out.to_json()["rows"], json!([[2, 42]]));
        let out =
            reg.call(&ctx, "general_query", &json!({"sql": "select name from sqlite_master order by name"})).await;
        assert_eq!(out.to_json()["rows"], json!([["students"]]));
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select * from pragma_query_only"})).await;
        assert_eq!(out.to_json()["rows"], json!([[1]]));
        assert!(!dir.path().join("stolen.db").exists() && !std::path::Path::new("stolen.db").exists());
    }

    /// Values beyond the limit are refused by the database, not allocated; values within it
    /// still work.
    #[tokio::test]
    async fn a_huge_value_is_refused_and_a_large_one_works() {
        let dir = tempfile::tempdir().unwrap();
        let path = academy_db(dir.path()).await;
        let mut reg = ToolRegistry::new();
        reg.register(general_query(path.to_str().unwrap()).await.unwrap()).unwrap();
        let ctx = ToolContext::default();
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select randomblob(1000000000)"})).await;
        let error = out.error().expect("refused").to_string();
        assert!(error.contains("too big"), "{error}");
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select length(randomblob(500000))"})).await;
        assert_eq!(out.to_json()["rows"], json!([[500000]]));
    }

    /// A query without end returns its first rows and stops counting at the bound.
    #[tokio::test]
    async fn an_endless_query_is_cut_off_with_bounded_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = academy_db(dir.path()).await;
        let mut reg = ToolRegistry::new();
        reg.register(general_query(path.to_str().unwrap()).await.unwrap()).unwrap();
        let sql = "with recursive c(x) as (select 1 union all select x + 1 from c) select x from c";
        let out = reg.call(&ToolContext::default(), "general_query", &json!({ "sql": sql })).await.to_json();
        assert_eq!(out["truncated"], true, "{}", out["rowCount"]);
        assert_eq!(out["rowCount"], MAX_COUNTED);
        assert_eq!(out["rows"].as_array().unwrap().len(), MAX_ROWS);
        assert_eq!(out["rows"][MAX_ROWS - 1], json!([MAX_ROWS]));
    }

    #[tokio::test]
    async fn queries_return_the_peer_shape_and_writes_are_refused_by_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("academy.db");
        {
            let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path).create_if_missing(true))
                .await
                .unwrap();
            sqlx::query("CREATE TABLE students (name TEXT, age INTEGER, gpa REAL)").execute(&pool).await.unwrap();
            sqlx::query("INSERT INTO students VALUES ('Ana', 20, 3.5), ('Minh', 22, NULL)")
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        let mut reg = ToolRegistry::new();
        reg.register(general_query(path.to_str().unwrap()).await.unwrap()).unwrap();
        let ctx = ToolContext::default();
        let out =
            reg.call(&ctx, "general_query", &json!({"sql": "select name, age, gpa from students order by name"})).await;
        assert_eq!(
            out.to_json(),
            json!({"columns": ["name", "age", "gpa"], "rows": [["Ana", 20, 3.5], ["Minh", 22, null]], "rowCount": 2,
                   "sql": "select name, age, gpa from students order by name"})
        );
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select * from nope"})).await;
        assert_eq!(out.error().unwrap().kind, ToolErrorKind::InvalidArguments);
        assert!(out.error().unwrap().message.contains("no such table"), "{:?}", out);
        // Even a write disguised as a SELECT-led statement is refused by the database itself.
        let out = reg
            .call(
                &ctx,
                "general_query",
                &json!({"sql": "with x as (select 1) insert into students values ('Eve', 1, 1)"}),
            )
            .await;
        assert!(out.error().is_some(), "{out:?}");
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select 1 as one"})).await;
        assert_eq!(out.to_json()["rows"], json!([[1]]));
        // Sorts and temporary tables stay in memory, under the heap bound, never in temp files.
        let out = reg.call(&ctx, "general_query", &json!({"sql": "select * from pragma_temp_store"})).await;
        assert_eq!(out.to_json()["rows"], json!([[2]]));
    }

    #[tokio::test]
    async fn an_in_memory_database_answers() {
        let mut reg = ToolRegistry::new();
        reg.register(general_query("sqlite::memory:").await.unwrap()).unwrap();
        let out = reg.call(&ToolContext::default(), "general_query", &json!({"sql": "select 1 + 1"})).await;
        assert_eq!(out.to_json()["rows"], json!([[2]]));
        let err = general_query(&std::env::temp_dir().join("no/such/dir/x.db").to_string_lossy()).await.err();
        assert!(err.expect("refused").to_string().contains("cannot open"));
    }
}
