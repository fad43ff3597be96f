//! Tokens used by model calls made where no run step counts them — a tool's own call (the
//! legal answer, the crisis screen's location, the course's test generator): the caller of
//! the tool collects what they report, and the run counts it as a model call of its step
//! (docs/service.md, "Tokens").

use crate::Usage;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// What was reported while a future ran: each model's identifier with the tokens it used.
type Reports = Arc<Mutex<Vec<(String, Usage)>>>;

tokio::task_local! {
    static REPORTS: Reports;
}

/// Runs `work`, collecting the usage the model calls inside it [`report`].
pub async fn collecting<F: Future>(work: F) -> (F::Output, Vec<(String, Usage)>) {
    let reports = Reports::default();
    let out = REPORTS.scope(Arc::clone(&reports), work).await;
    let taken = std::mem::take(&mut *reports.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    (out, taken)
}

/// Reports the tokens a call of `model` used, when the model reported them, to the
/// [`collecting`] that runs this; nothing outside one.
pub fn report(model: &str, usage: Option<Usage>) {
    let Some(usage) = usage else { return };
    let _ = REPORTS.try_with(|r| {
        r.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((model.to_owned(), usage));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(prompt: u32) -> Option<Usage> {
        Some(Usage { prompt_tokens: prompt, completion_tokens: 2, cached_prompt_tokens: 0 })
    }

    #[tokio::test]
    async fn what_a_call_reports_reaches_its_collector_only() {
        report("outside", used(1));
        let ((), got) = collecting(async {
            report("m", used(10));
            report("m", None);
            tokio::task::yield_now().await;
            report("n", used(20));
        })
        .await;
        assert_eq!(got.iter().map(|(m, u)| (m.as_str(), u.prompt_tokens)).collect::<Vec<_>>(), [("m", 10), ("n", 20)]);
        // Two at once keep theirs apart.
        let (a, b) =
            tokio::join!(collecting(async { report("a", used(1)) }), collecting(async { report("b", used(2)) }));
        assert_eq!((a.1[0].0.as_str(), b.1[0].0.as_str()), ("a", "b"));
        assert_eq!((a.1.len(), b.1.len()), (1, 1));
    }
}
