//! [`PgDatabase`]: a PostgreSQL pool that works the same directly and behind a connection
//! pooler in transaction mode (PgBouncer with `pool_mode = transaction`), for every store on
//! PostgreSQL (checkpoints, conversations, teaching guides); docs/service.md, "Behind PgBouncer".
//!
//! Behind such a pooler a client keeps a server connection only until its transaction ends,
//! so two things the driver does by default break: a named prepared statement lives on one
//! server connection (another client's statement of the same name collides, or the next
//! transaction's server lacks it), and the driver prepares a statement (`Parse`, `Sync`)
//! before binding it, which outside a transaction may reach another server. So in that mode
//! every statement is unnamed ([`PgDatabase::persistent`] is false) and every operation runs
//! inside a transaction ([`PgDatabase::session`]), which pins one server connection for it.
//! Migrations hold a session-level lock, so they run over a direct URL instead.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{Connection, Postgres, Transaction};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// How the service reaches PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PgPooling {
    /// Directly, or through a pooler in session mode: connections are the server's own.
    #[default]
    Session,
    /// Through a pooler in transaction mode: a server connection only for a transaction.
    Transaction,
}

/// A pool and how it reaches the server.
#[derive(Debug, Clone)]
pub struct PgDatabase {
    pool: PgPool,
    pooling: PgPooling,
    /// Where migrations run: the server directly (they hold a session-level lock). Boxed:
    /// the options are large and read once.
    migrations: Option<Arc<PgConnectOptions>>,
}

impl PgDatabase {
    /// A pool of direct (or session-pooled) connections; migrations run over it.
    pub fn direct(pool: PgPool) -> Self {
        Self { pool, pooling: PgPooling::Session, migrations: None }
    }

    /// A pool reached as `pooling` says, with migrations over `migrations` (a direct
    /// connection) when given, else over the pool.
    pub fn new(pool: PgPool, pooling: PgPooling, migrations: Option<PgConnectOptions>) -> Self {
        Self { pool, pooling, migrations: migrations.map(Arc::new) }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// How the pool reaches the server.
    pub fn pooling(&self) -> PgPooling {
        self.pooling
    }

    /// Whether statements may be prepared under a name and kept on the server connection
    /// (`sqlx::query(…).persistent(db.persistent())`).
    pub fn persistent(&self) -> bool {
        self.pooling == PgPooling::Session
    }

    /// A connection for one operation; in transaction mode, a transaction. End it with
    /// [`PgSession::finish`] (a session dropped unfinished rolls back).
    ///
    /// # Errors
    /// When no connection can be had, or the transaction cannot begin.
    pub async fn session(&self) -> Result<PgSession, sqlx::Error> {
        Ok(match self.pooling {
            PgPooling::Session => PgSession::Connection(self.pool.acquire().await?),
            PgPooling::Transaction => PgSession::Transaction(self.pool.begin().await?),
        })
    }

    /// Runs `migrator` over the migration connection when one is configured, else the pool.
    ///
    /// # Errors
    /// When the connection or a migration fails.
    pub async fn migrate(&self, migrator: &sqlx::migrate::Migrator) -> Result<(), sqlx::migrate::MigrateError> {
        match &self.migrations {
            Some(options) => {
                let connect = PgConnection::connect_with(options.as_ref());
                let mut conn =
                    tokio::time::timeout(std::time::Duration::from_secs(10), connect).await.map_err(|_| {
                        sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "connecting to database_migration_url took over 10 s",
                        ))
                    })??;
                let result = migrator.run(&mut conn).await;
                let _ = conn.close().await;
                result
            }
            None => migrator.run(&self.pool).await,
        }
    }
}

/// One operation's connection: pooled as it is, or inside a transaction.
pub enum PgSession {
    /// A connection of the pool.
    Connection(PoolConnection<Postgres>),
    /// A transaction on one.
    Transaction(Transaction<'static, Postgres>),
}

impl PgSession {
    /// Ends the operation: commits the transaction, if there is one.
    ///
    /// # Errors
    /// When the commit fails.
    pub async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Connection(_) => Ok(()),
            Self::Transaction(tx) => tx.commit().await,
        }
    }
}

impl Deref for PgSession {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Self::Connection(c) => c,
            Self::Transaction(t) => t,
        }
    }
}

impl DerefMut for PgSession {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Self::Connection(c) => c,
            Self::Transaction(t) => t,
        }
    }
}
