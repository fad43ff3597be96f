//! `general_query` over a local SQLite database: the academy admin's read-only SQL tool when the
//! service itself holds the data (`tools.sql_database`; with a backend, the backend runs it).
//!
//! Two guards: the statement must be one `SELECT` (or `WITH … SELECT`) — anything else is an
//! `invalid_arguments` outcome the model can repair — and the connection itself is
//! read-only (`PRAGMA query_only`), so the database refuses writes whatever the text says.

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
/// # Errors
/// A readable reason for the model.
pub fn check_read_only_select(sql: &str) -> Result<(), String> {
    let body = sql.trim().trim_end_matches(';').trim();
    let first = body.split_whitespace().next().unwrap_or_default().to_ascii_lowercase();
    if first != "select" && first != "with" {
        return Err(format!("only a single read-only SELECT statement is allowed, got '{}'", first.to_uppercase()));
    }
    // A `;` outside quotes means a second statement.
    let (mut single, mut double) = (false, false);
    for c in body.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ';' if !single && !double => return Err("only one statement is allowed".into()),
            _ => {}
        }
    }
    Ok(())
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
            let rows = sqlx::query(&a.sql).fetch_all(&pool).await.map_err(|e| match e {
                sqlx::Error::Database(d) => {
                    ToolError::invalid_arguments(format!("the database refused the query: {}", d.message()))
                }
                other => ToolError::unavailable(format!("the database is unavailable: {other}")),
            })?;
            let columns: Vec<String> =
                rows.first().map(|r| r.columns().iter().map(|c| c.name().to_owned()).collect()).unwrap_or_default();
            let data: Vec<Vec<Value>> =
                rows.iter().take(MAX_ROWS).map(|r| (0..r.columns().len()).map(|i| cell(r, i)).collect()).collect();
            Ok(json!({ "columns": columns, "rows": data, "rowCount": rows.len(), "sql": a.sql }))
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
