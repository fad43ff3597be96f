//! Helpers shared by the integration tests.

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
