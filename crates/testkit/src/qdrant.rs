//! [`QdrantServer`]: a real Qdrant server started for one test from the binary built from the
//! official v1.18.3 source (`TOOLGRAPH_QDRANT_BIN`; its default place is in docs/retrieval.md,
//! "Knowledge bases on Qdrant"): a temporary storage directory, ports of its own, telemetry
//! off; killed when dropped.
//! Its absence fails under `CI=true` and skips with a message otherwise.
//!
//! Standard library only, so the retrieval crate's tests (which cannot depend on this crate)
//! include this same file.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A running Qdrant server.
pub struct QdrantServer {
    child: std::process::Child,
    /// REST base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    _dir: tempfile::TempDir,
}

/// Where the server binary is.
pub fn qdrant_bin() -> PathBuf {
    std::env::var("TOOLGRAPH_QDRANT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bin/qdrant"))
}

/// Whether `GET {port}/readyz` answers 200.
fn ready(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200")
}

impl QdrantServer {
    /// Starts a server and waits until it is ready (at most 30 s); `None` (with a printed
    /// reason) when the binary is absent and `CI` is unset.
    ///
    /// # Panics
    /// Under `CI` without the binary; when it does not start or become ready.
    pub fn start() -> Option<Self> {
        let bin = qdrant_bin();
        if !bin.is_file() {
            if std::env::var_os("CI").is_some() {
                panic!("the Qdrant server is not at {} (set TOOLGRAPH_QDRANT_BIN)", bin.display());
            }
            eprintln!("SKIPPED: the Qdrant server is not at {}; set TOOLGRAPH_QDRANT_BIN", bin.display());
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        // Two ports nothing listens on right now: bound, read, released; Qdrant binds them at
        // once, and a clash shows as a server that never becomes ready.
        let port = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port());
        let (http, grpc) = (port().expect("a free port"), port().expect("a free port"));
        let child = std::process::Command::new(&bin)
            .current_dir(dir.path())
            .env("QDRANT__SERVICE__HOST", "127.0.0.1")
            .env("QDRANT__SERVICE__HTTP_PORT", http.to_string())
            .env("QDRANT__SERVICE__GRPC_PORT", grpc.to_string())
            .env("QDRANT__STORAGE__STORAGE_PATH", dir.path().join("storage"))
            .env("QDRANT__STORAGE__SNAPSHOTS_PATH", dir.path().join("snapshots"))
            .env("QDRANT__TELEMETRY_DISABLED", "true")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("Qdrant starts");
        let mut server = Self { child, url: format!("http://127.0.0.1:{http}"), _dir: dir };
        let started = Instant::now();
        while !ready(http) {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("Qdrant exited at start: {status}");
            }
            assert!(started.elapsed() < Duration::from_secs(30), "Qdrant never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }
}

impl Drop for QdrantServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
