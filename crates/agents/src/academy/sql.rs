//! `general_query` over a local SQLite database: the academy admin's read-only SQL tool when the
//! service itself holds the data (`tools.sql_database`; with a backend, the backend runs it).
//!
//! Two guards: the statement must be one `SELECT` (or `WITH … SELECT`) — anything else is an
//! `invalid_arguments` outcome the model can repair — and the connection itself is
//! read-only (`PRAGMA query_only`), so the database refuses writes whatever the text says.

use futures::TryStreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Column, Row, TypeInfo, ValueRef};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_tools::{Tool, ToolBuilder, ToolError};

/// Most rows returned to the model.
const MAX_ROWS: usize = 200;
/// Most rows counted for `rowCount`; a query with more stops there (`truncated: true`).
const MAX_COUNTED: usize = 100_000;
/// Largest string or blob a query may make (SQLite's `SQLITE_LIMIT_LENGTH`, 1 GB by default):
/// `randomblob(1e9)` or a `replace(zeroblob(…))` would otherwise allocate that much.
const MAX_VALUE_BYTES: i32 = 1 << 20;

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

fn cell(row: &sqlx::sqlite::SqliteRow, i: usize) -> Value {
    let Ok(raw) = row.try_get_raw(i) else { return Value::Null };
    if raw.is_null() {
        return Value::Null;
    }
    match raw.type_info().name() {
        "INTEGER" | "BOOLEAN" => row.try_get::<i64, _>(i).map_or(Value::Null, Value::from),
        "REAL" => row.try_get::<f64, _>(i).map_or(Value::Null, Value::from),
        "BLOB" => row.try_get::<Vec<u8>, _>(i).map_or(Value::Null, |b| json!(format!("<{} bytes>", b.len()))),
        _ => row.try_get::<String, _>(i).map_or(Value::Null, Value::from),
    }
}

/// The `general_query` read tool over `database` (a path or `sqlite::memory:`).
///
/// # Errors
/// When the database cannot be opened.
pub async fn general_query(database: &str) -> Result<Arc<dyn Tool>, SqlError> {
    let err = |reason: String| SqlError { database: database.to_owned(), reason };
    let url = if database.starts_with("sqlite:") { database.to_owned() } else { format!("sqlite://{database}") };
    let options = SqliteConnectOptions::from_str(&url).map_err(|e| err(e.to_string()))?.pragma("query_only", "ON");
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(|conn, _| {
            Box::pin(async move {
                let mut handle = conn.lock_handle().await?;
                let db = handle.as_raw_handle().as_ptr();
                // SAFETY: `db` is this connection's open handle, held locked for the call;
                // sqlite3_limit only reads and sets a per-connection limit.
                unsafe { rusqlite::ffi::sqlite3_limit(db, rusqlite::ffi::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES) };
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| err(e.to_string()))?;
    let tool = ToolBuilder::<QueryArgs>::new(
        "general_query",
        "Run one read-only SQL SELECT against the database and get the rows back as JSON.",
    )
    .display_name("SQL query")
    .param_display("sql", "SQL")
    .timeout(Duration::from_secs(15))
    .handler(move |_ctx, a: QueryArgs| {
        let pool = pool.clone();
        async move {
            check_read_only_select(&a.sql).map_err(ToolError::invalid_arguments)?;
            let refused = |e: sqlx::Error| match e {
                sqlx::Error::Database(d) => {
                    ToolError::invalid_arguments(format!("the database refused the query: {}", d.message()))
                }
                other => ToolError::unavailable(format!("the database is unavailable: {other}")),
            };
            // Rows are read as a stream: the first MAX_ROWS are kept, the rest only counted, up
            // to MAX_COUNTED — a query without end (a recursive CTE) holds no memory.
            let mut stream = sqlx::query(&a.sql).fetch(&pool);
            let (mut columns, mut data, mut count, mut truncated) = (Vec::new(), Vec::new(), 0usize, false);
            while let Some(row) = stream.try_next().await.map_err(refused)? {
                if count == 0 {
                    columns = row.columns().iter().map(|c| c.name().to_owned()).collect();
                }
                if count < MAX_ROWS {
                    data.push((0..row.columns().len()).map(|i| cell(&row, i)).collect::<Vec<Value>>());
                }
                count += 1;
                if count >= MAX_COUNTED {
                    truncated = true;
                    break;
                }
            }
            let mut out = json!({ "columns": columns, "rows": data, "rowCount": count, "sql": a.sql });
            if truncated {
                out["truncated"] = json!(true);
            }
            Ok(out)
        }
    })
    .map_err(|e| err(e.to_string()))?;
    Ok(tool)
}

#[cfg(test)]
mod tests {
    use super::*;
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
    }
}
