//! Test support shared by toolgraph's crates (a dev-dependency only; nothing ships with it).
//!
//! Owns: a PostgreSQL schema of its own per test ([`PgSchema`], dropped afterwards) with the
//! suite's rule for a missing server (skip with a message locally, fail under `CI`), and the
//! checkpoint stores a suite is instantiated for ([`Backend`]), the other implementations
//! interoperability tests drive ([`interop`]), and what the fault scenarios use: a fault
//! proxy ([`fault_proxy`]), a checkpoint store that fails chosen writes ([`faulty_store`]), a
//! PostgreSQL server of a test's own to crash ([`private_pg`]) and the invariant checker
//! ([`invariants`]). The scripted model server is the `scripted-llm`
//! crate.

pub mod fault_proxy;
pub mod faulty_store;
pub mod interop;
pub mod invariants;
pub mod pgbouncer;
pub mod private_pg;
pub mod qdrant;

use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::sync::Arc;
use toolgraph_graph::{Checkpointer, MemoryCheckpointer, PostgresCheckpointer, SqliteCheckpointer};

/// The evaluation data: `TOOLGRAPH_EVAL_DATA`, else the configuration's default `eval_data`
/// taken from the repository root (docs/configuration.md) — when `probe` exists below it.
/// Absent: `None` with a printed reason, and a failure under `CI` (the suite must not pass by
/// skipping).
///
/// # Panics
/// Under `CI` when `probe` is not there.
pub fn eval_data(probe: &str) -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("TOOLGRAPH_EVAL_DATA") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(toolgraph_config::Config::default().eval_data),
    };
    if dir.join(probe).exists() {
        return Some(dir);
    }
    assert!(std::env::var_os("CI").is_none(), "{probe} not found under {} (set TOOLGRAPH_EVAL_DATA)", dir.display());
    eprintln!("SKIPPED: {probe} not found under {}; set TOOLGRAPH_EVAL_DATA", dir.display());
    None
}

/// A loopback port nothing listens on right now, for a server process a test starts.
///
/// Taken below the kernel's ephemeral range (32768 and up), from a sequence of this process's
/// own: a port of `bind(0)`, released for the process to bind, could be handed to a listener
/// another test opens meanwhile (a scripted model, another service) — a service loads its
/// model or migrates first — and the test would then talk to that one.
pub fn process_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97);
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 20_000 + (start.wrapping_add(n) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The PostgreSQL server the suite runs against (this machine's, as CI's):
/// `TOOLGRAPH_TEST_DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`.
pub fn pg_url() -> String {
    std::env::var("TOOLGRAPH_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema of its own per test, dropped (with everything in it) when the value is dropped.
pub struct PgSchema {
    /// The schema's name (`tg_test_<uuid>`).
    pub name: String,
}

/// A connection to the suite's server; `None` (with a printed reason) only when it is absent
/// and `CI` is unset.
///
/// # Panics
/// Under `CI` without a reachable server: the suite must not pass by skipping.
pub(crate) async fn connect_or_skip() -> Option<sqlx::PgConnection> {
    use sqlx::Connection;
    let connect = tokio::time::timeout(std::time::Duration::from_secs(3), sqlx::PgConnection::connect(&pg_url()));
    match connect.await.map_err(|_| sqlx::Error::PoolTimedOut).and_then(|r| r) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("PostgreSQL at {} is required under CI: {e}", pg_url());
            }
            eprintln!("SKIPPED: PostgreSQL at {} is not reachable ({e}); set CI=true to make this a failure", pg_url());
            None
        }
    }
}

/// Whether the suite's PostgreSQL server is reachable; `false` (with a printed reason) only
/// when it is absent and `CI` is unset.
///
/// # Panics
/// Under `CI` without a reachable server.
pub async fn pg_available() -> bool {
    use sqlx::Connection;
    match connect_or_skip().await {
        Some(c) => {
            let _ = c.close().await;
            true
        }
        None => false,
    }
}

impl PgSchema {
    /// A new schema; `None` (with a printed reason) only when the server is absent and `CI` is
    /// unset. Under `CI` a missing server panics: the suite must not pass by skipping.
    ///
    /// # Panics
    /// Under `CI` without a reachable server, or when the schema cannot be created.
    pub async fn create() -> Option<Self> {
        use sqlx::Connection;
        let mut admin = connect_or_skip().await?;
        let name = format!("tg_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE SCHEMA {name}")).execute(&mut admin).await.expect("create schema");
        let _ = admin.close().await;
        Some(Self { name })
    }

    /// Connection options whose `search_path` is this schema.
    ///
    /// # Panics
    /// When [`pg_url`] is not a valid URL.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(&pg_url()).expect("valid url").options([("search_path", self.name.as_str())])
    }

    /// A checkpoint store in this schema.
    ///
    /// # Panics
    /// When the connection or the migrations fail.
    pub async fn checkpointer(&self) -> PostgresCheckpointer {
        PostgresCheckpointer::connect_with(self.options()).await.expect("connect")
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        // Drop may run while the test's runtime is blocked right here, so nothing tied to
        // that runtime may be used: a fresh connection on a helper thread with its own runtime
        // does the cleanup.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut c) = sqlx::PgConnection::connect(&pg_url()).await {
                    // A leaked lock must not hang the suite: give up after 10 s and leave the schema.
                    let _ = sqlx::query("SET lock_timeout = '10s'").execute(&mut c).await;
                    if let Err(e) = sqlx::query(&sql).execute(&mut c).await {
                        eprintln!("could not drop a test schema: {e}");
                    }
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}

/// A checkpoint store kind a suite is instantiated for, holding its data between opens.
pub enum Backend {
    /// In memory: every open shares one store.
    Memory(Arc<MemoryCheckpointer>),
    /// A SQLite file in a temporary directory.
    Sqlite(tempfile::TempDir),
    /// A PostgreSQL schema of its own.
    Postgres(PgSchema),
}

impl Backend {
    /// `memory`, `sqlite` or `postgres`; `None` when PostgreSQL is absent locally (see
    /// [`PgSchema::create`]).
    ///
    /// # Panics
    /// On an unknown kind or when the temporary directory cannot be made.
    pub async fn new(kind: &str) -> Option<Self> {
        Some(match kind {
            "memory" => Self::Memory(Arc::new(MemoryCheckpointer::new())),
            "sqlite" => Self::Sqlite(tempfile::tempdir().expect("tempdir")),
            "postgres" => Self::Postgres(PgSchema::create().await?),
            other => panic!("unknown backend {other}"),
        })
    }

    /// A fresh store handle on the same data: what a new process would open.
    ///
    /// # Panics
    /// When the store cannot be opened.
    pub async fn open(&self) -> Arc<dyn Checkpointer> {
        match self {
            Self::Memory(m) => m.clone(),
            Self::Sqlite(dir) => {
                Arc::new(SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.expect("open sqlite"))
            }
            Self::Postgres(schema) => Arc::new(schema.checkpointer().await),
        }
    }
}
