//! [`MemoryCheckpointer`]: checkpoints in process memory (tests, benchmarks, ephemeral runs).

use super::{
    CheckpointError, CheckpointRecord, Checkpointer, DerivedRows, FORMAT_VERSION, RecordKind, ThreadId, fold_point,
    folded,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Checkpoints in a map; lost when the process exits.
#[derive(Debug, Default)]
pub struct MemoryCheckpointer {
    threads: Mutex<HashMap<ThreadId, Vec<CheckpointRecord>>>,
    definitions: Mutex<HashMap<String, String>>,
}

impl MemoryCheckpointer {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ThreadId, Vec<CheckpointRecord>>> {
        // No code path panics while holding the lock; recover rather than cascade if one did.
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError> {
        let mut threads = self.lock();
        let log = threads.entry(thread.clone()).or_default();
        // By seq, not by place: a compacted thread starts after 1.
        if log.last().map_or(0, |r| r.seq) + 1 != record.seq {
            return Err(CheckpointError::Conflict { thread: thread.to_string(), seq: record.seq });
        }
        log.push(record.clone());
        Ok(DerivedRows::default())
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        let threads = self.lock();
        let Some(log) = threads.get(thread) else {
            return Ok(Vec::new());
        };
        let n = upto.map_or(log.len(), |u| log.partition_point(|r| r.seq <= u));
        // Same rule as the databases: a record from a newer build is refused, not misread.
        if let Some(r) = log[..n].iter().find(|r| r.format > FORMAT_VERSION) {
            return Err(CheckpointError::UnsupportedFormat {
                thread: thread.to_string(),
                seq: r.seq,
                format: r.format,
            });
        }
        Ok(log[..n].to_vec())
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        Ok(self.lock().get(thread).and_then(|l| l.last()).map(|r| (r.seq, r.run_id.clone())))
    }

    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        let threads = self.lock();
        let Some(log) = threads.get(thread) else { return Ok(None) };
        Ok(log.first().zip(log.last()).map(|(first, last)| (first.seq, last.seq, last.run_id.clone())))
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        let threads = self.lock();
        let Some(log) = threads.get(thread) else { return Ok(Vec::new()) };
        let tail = &log[log.partition_point(|r| r.seq < from)..];
        if let Some(r) = tail.iter().find(|r| r.format > FORMAT_VERSION) {
            return Err(CheckpointError::UnsupportedFormat {
                thread: thread.to_string(),
                seq: r.seq,
                format: r.format,
            });
        }
        Ok(tail.to_vec())
    }

    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        let mut threads = self.lock();
        let Some(log) = threads.get_mut(thread) else { return Ok(0) };
        if log.last().is_none_or(|head| head.next.is_some()) {
            return Ok(0);
        }
        let kinds: Vec<(u64, RecordKind)> = log.iter().map(|r| (r.seq, r.kind)).collect();
        let Some(first_kept) = fold_point(&kinds, keep) else { return Ok(0) };
        if let Some(r) = log.iter().find(|r| r.seq <= first_kept && r.format > FORMAT_VERSION) {
            return Err(CheckpointError::UnsupportedFormat {
                thread: thread.to_string(),
                seq: r.seq,
                format: r.format,
            });
        }
        let at = log.partition_point(|r| r.seq < first_kept);
        let older: Vec<CheckpointRecord> = log.drain(..at).collect();
        let deleted = older.len() as u64;
        let kept = log.remove(0);
        log.insert(0, folded(older, kept));
        Ok(deleted)
    }

    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError> {
        let mut threads = self.lock();
        let Some(log) = threads.get_mut(thread) else { return Ok(0) };
        let before = log.len();
        log.retain(|r| r.seq <= after);
        let gone = (before - log.len()) as u64;
        if log.is_empty() {
            threads.remove(thread);
        }
        Ok(gone)
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        let mut threads = self.lock();
        if threads.get(to).is_some_and(|l| !l.is_empty()) {
            return Err(CheckpointError::ThreadExists(to.to_string()));
        }
        let copied: Vec<_> =
            threads.get(from).map(|l| l.iter().filter(|r| r.seq <= at).cloned().collect()).unwrap_or_default();
        let n = copied.len() as u64;
        threads.insert(to.clone(), copied);
        Ok(n)
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        Ok(self.lock().remove(thread).map_or(0, |l| l.len() as u64))
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        let mut threads = self.lock();
        let mut removed = 0;
        threads.retain(|t, log| {
            let keep = t.namespace() != namespace;
            if !keep {
                removed += log.len() as u64;
            }
            keep
        });
        Ok(removed)
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        let threads = self.lock();
        Ok(threads.values().flatten().map(|r| serde_json::to_vec(r).map_or(0, |v| v.len() as u64)).sum())
    }

    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError> {
        let mut kept = self.definitions.lock().unwrap_or_else(|e| e.into_inner());
        kept.entry(version.to_owned()).or_insert_with(|| definition.to_owned());
        Ok(())
    }

    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError> {
        Ok(self.definitions.lock().unwrap_or_else(|e| e.into_inner()).get(version).cloned())
    }
}
