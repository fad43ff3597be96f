//! [`MemoryRunEvents`]: run events in one process, for services that share it (tests).

use super::{NOTICE_BUFFER, RunEventAppend, RunEventNotice, RunEventRecord, RunEventStore, RunScope};
use crate::{StoreError, now_ms};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use tokio::sync::broadcast;
use toolgraph_protocol::is_terminal_event;

/// One stored frame: event, data, when it was stored.
type Stored = (String, String, i64);
/// Each run's owner, conversation and frames by position.
type Runs = HashMap<String, ((i64, i64), i64, BTreeMap<u64, Stored>)>;

/// Run events in memory.
#[derive(Debug)]
pub struct MemoryRunEvents {
    runs: Mutex<Runs>,
    notices: broadcast::Sender<RunEventNotice>,
}

impl Default for MemoryRunEvents {
    fn default() -> Self {
        Self { runs: Mutex::new(HashMap::new()), notices: broadcast::channel(NOTICE_BUFFER).0 }
    }
}

impl MemoryRunEvents {
    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl RunEventStore for MemoryRunEvents {
    async fn append(&self, batch: &[RunEventAppend]) -> Result<(), StoreError> {
        let now = now_ms();
        {
            let mut runs = self.lock();
            for run in batch {
                let (_, _, frames) =
                    runs.entry(run.run_id.clone()).or_insert_with(|| (run.owner, run.conversation, BTreeMap::new()));
                for f in &run.frames {
                    frames.entry(f.seq).or_insert_with(|| (f.event.clone(), f.data.clone(), now));
                }
            }
        }
        for run in batch {
            // No receiver is not an error: nobody follows a run right now.
            let _ = self.notices.send(RunEventNotice::Appended(run.run_id.clone()));
        }
        Ok(())
    }

    async fn read(
        &self,
        run_id: &str,
        owner: (i64, i64),
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<RunEventRecord>>, StoreError> {
        let runs = self.lock();
        let Some((_, _, frames)) = runs.get(run_id).filter(|(o, _, _)| *o == owner) else { return Ok(None) };
        Ok(Some(
            frames
                .range(after.saturating_add(1)..)
                .take(limit)
                .map(|(seq, (event, data, _))| RunEventRecord { seq: *seq, event: event.clone(), data: data.clone() })
                .collect(),
        ))
    }

    async fn conversation_of(&self, run_id: &str, owner: (i64, i64)) -> Result<Option<i64>, StoreError> {
        let runs = self.lock();
        Ok(runs.get(run_id).filter(|(o, _, _)| *o == owner).map(|(_, conversation, _)| *conversation))
    }

    async fn last(&self, run_id: &str) -> Result<Option<(u64, bool)>, StoreError> {
        let runs = self.lock();
        Ok(runs
            .get(run_id)
            .and_then(|(_, _, frames)| frames.last_key_value())
            .map(|(seq, (event, _, _))| (*seq, is_terminal_event(event))))
    }

    async fn sweep(&self, ended_before_ms: i64, any_before_ms: i64) -> Result<u64, StoreError> {
        let mut runs = self.lock();
        let mut gone = 0u64;
        runs.retain(|_, (_, _, frames)| {
            let ended = frames.values().any(|(event, _, at)| is_terminal_event(event) && *at < ended_before_ms);
            if ended {
                gone += frames.len() as u64;
                return false;
            }
            let before = frames.len();
            frames.retain(|_, (_, _, at)| *at >= any_before_ms);
            gone += (before - frames.len()) as u64;
            !frames.is_empty()
        });
        Ok(gone)
    }

    async fn delete_runs(&self, scope: RunScope) -> Result<u64, StoreError> {
        let mut runs = self.lock();
        let mut gone = 0u64;
        runs.retain(|_, (owner, conversation, frames)| {
            let keep = !scope.holds(*owner, *conversation);
            if !keep {
                gone += frames.len() as u64;
            }
            keep
        });
        Ok(gone)
    }

    fn subscribe(&self) -> broadcast::Receiver<RunEventNotice> {
        self.notices.subscribe()
    }
}
