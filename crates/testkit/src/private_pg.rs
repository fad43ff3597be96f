//! [`PrivatePostgres`]: a PostgreSQL server of a test's own (`initdb` + `pg_ctl` in a temporary
//! directory, on a free loopback port), so the test can crash it (`pg_ctl stop -m immediate`:
//! no shutdown checkpoint) and start it again mid-run. The binaries come from
//! `TOOLGRAPH_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`. As root (PostgreSQL
//! refuses to run as root) the server runs as the `postgres` user.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A running private server; stopped and removed when dropped.
pub struct PrivatePostgres {
    bin: PathBuf,
    data: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Initialises and starts a server; `None` (with a printed reason) only when the binaries
    /// are absent and `CI` is unset.
    ///
    /// # Panics
    /// Under `CI` without the binaries, or when `initdb` or the start fails.
    pub fn start() -> Option<Self> {
        let Some(bin) = bindir() else {
            if std::env::var_os("CI").is_some() {
                panic!("PostgreSQL's server binaries (initdb, pg_ctl) are required under CI");
            }
            eprintln!("SKIPPED: no PostgreSQL server binaries (set TOOLGRAPH_PG_BINDIR)");
            return None;
        };
        let as_postgres = is_root();
        let data = tempfile::tempdir().expect("tempdir");
        if as_postgres {
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(data.path()).status();
            assert!(ok.is_ok_and(|s| s.success()), "chown of the private data directory");
        }
        let port = crate::process_port();
        let pg = Self { bin, data, port, as_postgres };
        let out = pg
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "-D"])
            .arg(pg.pgdata())
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        pg.start_again();
        Some(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server as a crash would (`-m immediate`): its backends quit at once, without a
    /// shutdown checkpoint, so the next start runs crash recovery.
    ///
    /// # Panics
    /// When `pg_ctl` fails.
    pub fn crash(&self) {
        let out = self.command("pg_ctl").args(["stop", "-m", "immediate", "-w", "-D"]).arg(self.pgdata()).output();
        let out = out.expect("run pg_ctl stop");
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts the (stopped) server again on the same port and data, waiting until it accepts
    /// connections.
    ///
    /// # Panics
    /// When the server does not start.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c fsync=off -c full_page_writes=off",
            self.port,
            self.data.path().display()
        );
        let log = self.data.path().join("server.log");
        let out = self
            .command("pg_ctl")
            .args(["start", "-w", "-t", "60", "-o", &options, "-l"])
            .arg(&log)
            .arg("-D")
            .arg(self.pgdata())
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn pgdata(&self) -> PathBuf {
        self.data.path().join("pgdata")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.command("pg_ctl").args(["stop", "-m", "immediate", "-D"]).arg(self.pgdata()).output();
    }
}

fn bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TOOLGRAPH_PG_BINDIR") {
        return Some(PathBuf::from(dir)).filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .collect();
    // The newest major version: the directories are named by it.
    found.sort_by_key(|d| d.parent().and_then(Path::file_name).and_then(|n| n.to_str()?.parse::<u32>().ok()));
    found.pop()
}

pub(crate) fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
