//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

/// The evaluation data (`TOOLGRAPH_EVAL_DATA`, default `../shared/data`; docs/retrieval.md); its absence
/// fails under `CI=true` and skips with a message otherwise.
pub fn eval_data() -> Option<PathBuf> {
    let dir = std::env::var("TOOLGRAPH_EVAL_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"));
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("evaluation data not found at {} (set TOOLGRAPH_EVAL_DATA)", dir.display());
    }
    eprintln!("SKIPPED: evaluation data not found at {}; set TOOLGRAPH_EVAL_DATA", dir.display());
    None
}

/// The Qdrant server of the tests: the testkit's file, included (the testkit depends on this
/// crate through the configuration crate, so this crate's tests cannot depend on it).
#[path = "../../../testkit/src/qdrant.rs"]
mod qdrant_server;
pub use qdrant_server::QdrantServer;

impl QdrantServer {
    /// Options for this server.
    pub fn options(&self) -> toolgraph_rag::QdrantOptions {
        toolgraph_rag::QdrantOptions::new(self.url.clone())
    }
}

/// Instantiates the named backend-independent tests once per backend: `embedded::NAME` on the
/// embedded index, `qdrant::NAME` on a real Qdrant server. Each test takes the function that
/// makes its store at a directory.
#[allow(unused_macros)] // each test binary uses its own subset
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test] fn $name() { super::$name(&|dir| toolgraph_rag::KbStore::new(dir)) })*
        }
        mod qdrant {
            $(#[test] fn $name() {
                let Some(server) = super::common::QdrantServer::start() else { return };
                let options = server.options();
                super::$name(&move |dir| toolgraph_rag::KbStore::new(dir).with_qdrant(options.clone()))
            })*
        }
    };
}
