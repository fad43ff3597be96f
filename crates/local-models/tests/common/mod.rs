//! What the real-weights tests share: one rule for missing weights. They fail whenever `CI` is
//! set, and skip with the reason (naming `scripts/fetch-models`) only when it is unset.

use toolgraph_local_models::LocalModelError;

/// The loaded model, or `None` after printing why it is skipped.
///
/// # Panics
/// On a load error other than a missing file, and on a missing file under CI.
pub fn weights_or_skip<T>(what: &str, loaded: Result<T, LocalModelError>) -> Option<T> {
    match loaded {
        Ok(model) => Some(model),
        Err(e @ LocalModelError::Missing { .. }) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("{what} is required here: {e}"),
    }
}
