//! [`SqliteDatabase`]: the embedded database file, served by one connection on a thread of its own.
//!
//! Owns: opening the file (WAL, foreign keys, busy timeout), running a layer's migrations on
//! it, and running callers' closures on its connection one at a time.
//!
//! Why not a pool of async connections: an async SQLite driver runs every statement on a
//! worker thread anyway and pays a thread hand-off per statement (sqlx also pings the
//! connection when it is taken from and given back to its pool); a chat turn issues about 17
//! statements, and on sqlx the SQLite store cost 2.8–4.1 ms of CPU per turn against the
//! memory store's 0.6–1.5 (docs/benchmarks.md). Here a caller sends one closure that may
//! run many statements — a step's checkpoint and its messages in one transaction — and pays
//! one hand-off for all of them (1.2–1.5 ms per turn). SQLite serialises writers anyway, and
//! the closures are short (no network, no waiting on anything but the file), so one
//! connection keeps up.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How many closures may wait for the connection; callers beyond that wait to enqueue.
const QUEUE: usize = 1024;
/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Prepared statements kept per connection (every statement the stores issue fits).
const STATEMENT_CACHE: usize = 64;

/// A failure of the database itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteError {
    /// SQLite answered an error.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// The database was closed (or its thread stopped) before the call ran.
    #[error("the database {0} is closed")]
    Closed(String),
    /// Opening or migrating failed.
    #[error("{0}")]
    Open(String),
}

type Job = Box<dyn FnOnce(&mut rusqlite::Connection) + Send>;

enum Command {
    Run(Job),
    Close(oneshot::Sender<()>),
}

/// One SQLite database file and the thread that owns its connection. Cheap to clone: every
/// clone talks to the same connection.
#[derive(Clone)]
pub struct SqliteDatabase {
    commands: mpsc::Sender<Command>,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDatabase").field("path", &self.path).finish()
    }
}

impl SqliteDatabase {
    /// Opens (creating if needed) the file at `path` and starts its connection's thread.
    ///
    /// # Errors
    /// When the directory cannot be created or the file cannot be opened.
    pub async fn open(path: &Path) -> Result<Self, SqliteError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| SqliteError::Open(format!("cannot create {}: {e}", dir.display())))?;
        }
        let owned = path.to_path_buf();
        let failed = |e: &dyn std::fmt::Display| SqliteError::Open(format!("cannot open {}: {e}", path.display()));
        let conn = tokio::task::spawn_blocking(move || {
            connect(&owned).map_err(|e| match why_not_writable(&owned) {
                // SQLite says only "unable to open database file"; the OS says why.
                Some(why) => format!("{e} ({why})"),
                None => e.to_string(),
            })
        })
        .await
        .map_err(|e| failed(&e))?
        .map_err(|e| failed(&e))?;
        let (commands, queue) = mpsc::channel(QUEUE);
        std::thread::Builder::new()
            .name("toolgraph-sqlite".into())
            .spawn(move || serve(conn, queue))
            .map_err(|e| SqliteError::Open(format!("cannot start the database thread: {e}")))?;
        Ok(Self { commands, path: Arc::new(path.to_path_buf()) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies a layer's migrations (layers share the migrations table, each ignoring the
    /// others' versions). Runs through sqlx's migrator so files migrated by earlier
    /// versions of toolgraph keep their history.
    ///
    /// # Errors
    /// When a migration fails.
    pub async fn migrate(&self, mut migrator: sqlx::migrate::Migrator) -> Result<(), SqliteError> {
        use sqlx::Connection;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(self.path.as_path())
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let failed = |e: &dyn std::fmt::Display| SqliteError::Open(format!("migration failed: {e}"));
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await.map_err(|e| failed(&e))?;
        migrator.set_ignore_missing(true);
        let result = migrator.run(&mut conn).await.map_err(|e| failed(&e));
        let _ = conn.close().await;
        result
    }

    /// Runs `f` on the connection and returns what it returned. Closures run one at a time,
    /// in the order they were sent; a transaction opened in `f` is rolled back if `f`
    /// returns without committing it.
    ///
    /// # Errors
    /// [`SqliteError::Closed`] when the database was closed, or `f` panicked.
    pub async fn call<R, F>(&self, f: F) -> Result<R, SqliteError>
    where
        F: FnOnce(&mut rusqlite::Connection) -> R + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = reply.send(f(conn));
        });
        self.commands.send(Command::Run(job)).await.map_err(|_| self.closed())?;
        answer.await.map_err(|_| self.closed())
    }

    /// Runs closures already sent, then closes the connection (folding the write-ahead log
    /// into the file). Later calls fail with [`SqliteError::Closed`].
    pub async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.commands.send(Command::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }

    fn closed(&self) -> SqliteError {
        SqliteError::Closed(self.path.display().to_string())
    }
}

fn connect(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    // In WAL mode NORMAL never corrupts; a power cut may lose the last commits only.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The connection's thread: runs closures until told to close or every handle is gone.
fn serve(mut conn: rusqlite::Connection, mut queue: mpsc::Receiver<Command>) {
    while let Some(command) = queue.blocking_recv() {
        match command {
            Command::Run(job) => {
                // A panicking closure loses its own answer (its caller sees `Closed`), not
                // the connection every other caller shares.
                if std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
                    tracing::error!("a database call panicked");
                }
                // A call must not leave its transaction to the next one (it would hold the
                // write lock and commit someone else's statements).
                if !conn.is_autocommit() {
                    tracing::error!("a database call left a transaction open; rolled back");
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            Command::Close(done) => {
                drop(conn);
                let _ = done.send(());
                return;
            }
        }
    }
}

/// Why the database file (or, before it exists, its directory) cannot be written — e.g. "Read-only
/// file system (os error 30)" — if it cannot.
fn why_not_writable(path: &Path) -> Option<String> {
    let probe = if path.exists() {
        std::fs::OpenOptions::new().append(true).open(path).err()
    } else {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        tempfile_probe(dir).err()
    };
    probe.map(|e| format!("cannot write there: {e}"))
}

/// Creates and removes a file in `dir`.
fn tempfile_probe(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".toolgraph-write-probe-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn database() -> (tempfile::TempDir, SqliteDatabase) {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDatabase::open(&dir.path().join("nested/t.db")).await.unwrap();
        db.call(|c| c.execute_batch("CREATE TABLE t (n INTEGER)")).await.unwrap().unwrap();
        (dir, db)
    }

    #[tokio::test]
    async fn the_file_is_in_wal_mode_with_foreign_keys_on() {
        let (_dir, db) = database().await;
        let (mode, fk) = db
            .call(|c| {
                let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
                let fk: i64 = c.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
                Ok::<_, rusqlite::Error>((mode, fk))
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!((mode.as_str(), fk), ("wal", 1));
    }

    #[tokio::test]
    async fn a_panicking_call_rolls_back_its_transaction_and_the_connection_lives_on() {
        let (_dir, db) = database().await;
        let err = db
            .call(|c| {
                c.execute_batch("BEGIN; INSERT INTO t VALUES (1);").unwrap();
                panic!("a bug in a caller");
            })
            .await
            .unwrap_err();
        assert!(matches!(err, SqliteError::Closed(_)), "{err}");
        let n: i64 = db.call(|c| c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))).await.unwrap().unwrap();
        assert_eq!(n, 0, "the panicked call's insert was rolled back");
        assert!(db.call(|c| c.is_autocommit()).await.unwrap(), "no transaction left open");
    }

    #[tokio::test]
    async fn concurrent_calls_all_run_and_closing_refuses_later_ones() {
        let (dir, db) = database().await;
        let calls = (0..200).map(|i| {
            let db = db.clone();
            tokio::spawn(async move { db.call(move |c| c.execute("INSERT INTO t VALUES (?1)", [i])).await })
        });
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().unwrap(), 1);
        }
        db.close().await;
        let err = db.call(|_| ()).await.unwrap_err();
        assert!(err.to_string().contains("is closed"), "{err}");
        // Everything written is in the file once closed.
        let reopened = SqliteDatabase::open(&dir.path().join("nested/t.db")).await.unwrap();
        let sum: i64 = reopened.call(|c| c.query_row("SELECT SUM(n) FROM t", [], |r| r.get(0))).await.unwrap().unwrap();
        assert_eq!(sum, (0..200).sum::<i64>());
    }
}
