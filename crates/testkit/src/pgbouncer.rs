//! [`TransactionPooler`]: a database of a test's own on the suite's PostgreSQL server, and a
//! PgBouncer in transaction mode in front of it on a free loopback port — the pooler
//! deployments put between replicas and PostgreSQL. PgBouncer comes from Debian's package
//! (`scripts/test` installs it); as root it runs as the `postgres` user (it refuses root).

use crate::pg_url;
use crate::private_pg::is_root;
use sqlx::postgres::PgConnectOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A running pooler and its database; both removed when dropped.
pub struct TransactionPooler {
    child: Child,
    _dir: tempfile::TempDir,
    port: u16,
    database: String,
    server: (String, u16, String),
}

fn pgbouncer() -> Option<PathBuf> {
    let candidates = [PathBuf::from("/usr/sbin/pgbouncer"), PathBuf::from("/usr/bin/pgbouncer")];
    candidates.into_iter().find(|p| p.exists())
}

impl TransactionPooler {
    /// A new database and a pooler with `server_connections` server connections for it;
    /// `None` (with a printed reason) only when PgBouncer or the server is absent and `CI`
    /// is unset.
    ///
    /// # Panics
    /// Under `CI` without PgBouncer or the server, or when the pooler does not start.
    pub async fn start(server_connections: u32) -> Option<Self> {
        use sqlx::Connection;
        let Some(bin) = pgbouncer() else {
            assert!(std::env::var_os("CI").is_none(), "PgBouncer (Debian's pgbouncer) is required under CI");
            eprintln!("SKIPPED: PgBouncer is not installed (apt-get install pgbouncer)");
            return None;
        };
        let mut admin = crate::connect_or_skip().await?;
        let database = format!("tg_pooled_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {database}")).execute(&mut admin).await.expect("create database");
        let _ = admin.close().await;

        let options = PgConnectOptions::from_str(&pg_url()).expect("valid url");
        let server = (options.get_host().to_owned(), options.get_port(), options.get_username().to_owned());
        let dir = tempfile::tempdir().expect("tempdir");
        let port = crate::process_port();
        let config = format!(
            "[databases]\n{database} = host={} port={} dbname={database}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = transaction\n\
             default_pool_size = {server_connections}\nmax_client_conn = 200\n\
             ignore_startup_parameters = extra_float_digits\nlogfile = {dir}/pgbouncer.log\n",
            server.0,
            server.1,
            dir = dir.path().display(),
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), config).expect("write config");
        std::fs::write(dir.path().join("users.txt"), format!("\"{}\" \"\"\n", server.2)).expect("write users");
        let mut cmd = Command::new(bin);
        if is_root() {
            // It refuses to run as root; the files must be the user's it switches to.
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
            assert!(ok.is_ok_and(|s| s.success()), "chown of the pooler's directory");
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(dir.path().join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let pooler = Self { child, _dir: dir, port, database, server };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "pgbouncer did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(pooler)
    }

    /// The database through the pooler.
    pub fn pooled_url(&self) -> String {
        format!("postgres://{}@127.0.0.1:{}/{}", self.server.2, self.port, self.database)
    }

    /// The database on the server itself.
    pub fn direct_url(&self) -> String {
        format!("postgres://{}@{}:{}/{}", self.server.2, self.server.0, self.server.1, self.database)
    }
}

impl Drop for TransactionPooler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database);
        // As for a schema: a fresh connection on a helper thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut c) = sqlx::PgConnection::connect(&pg_url()).await {
                    if let Err(e) = sqlx::query(&sql).execute(&mut c).await {
                        eprintln!("could not drop a test database: {e}");
                    }
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}
