//! [`FaultyCheckpointer`]: a checkpoint store that fails or slows chosen writes of the store it
//! wraps — the disk full at the Nth write, a read-only disk, a slow disk — without touching
//! the file system. A failed write writes nothing (as a failed transaction), which is what a
//! store that hit `SQLITE_FULL` or lost its connection leaves behind. It also counts the
//! records it hands out, so a test can tell how much of a thread a read took.

use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use toolgraph_graph::{CheckpointError, CheckpointMeta, CheckpointRecord, Checkpointer, DerivedRows, ThreadId};

/// Which appends fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// None: every append reaches the store.
    None,
    /// Only the append with this number (1 = the first after the fault was set).
    Nth(u64),
    /// Every append from this number on (a disk that filled up and stays full).
    From(u64),
}

/// A checkpoint store that injects write faults into another.
pub struct FaultyCheckpointer {
    inner: Arc<dyn Checkpointer>,
    fault: std::sync::Mutex<WriteFault>,
    /// Appends seen since the fault was set.
    appends: AtomicU64,
    failed: AtomicU64,
    delay_ms: AtomicU64,
    /// Records handed out by `load` and `load_from`.
    read: AtomicU64,
}

impl FaultyCheckpointer {
    /// Wraps `inner`, passing everything through until a fault is set.
    pub fn new(inner: Arc<dyn Checkpointer>) -> Self {
        Self {
            inner,
            fault: std::sync::Mutex::new(WriteFault::None),
            appends: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
            read: AtomicU64::new(0),
        }
    }

    /// Sets the fault and restarts the append count.
    pub fn set(&self, fault: WriteFault) {
        *self.fault.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = fault;
        self.appends.store(0, Ordering::SeqCst);
    }

    /// Every append waits this long first (a slow disk); zero for none.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Appends attempted since the fault was set.
    pub fn appends(&self) -> u64 {
        self.appends.load(Ordering::SeqCst)
    }

    /// Appends refused so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }

    /// Records read (handed out by `load` and `load_from`) since the last call.
    pub fn take_records_read(&self) -> u64 {
        self.read.swap(0, Ordering::SeqCst)
    }

    fn counted(
        &self,
        read: Result<Vec<CheckpointRecord>, CheckpointError>,
    ) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        if let Ok(records) = &read {
            self.read.fetch_add(records.len() as u64, Ordering::SeqCst);
        }
        read
    }
}

#[async_trait]
impl Checkpointer for FaultyCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let n = self.appends.fetch_add(1, Ordering::SeqCst) + 1;
        let fault = *self.fault.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fails = match fault {
            WriteFault::None => false,
            WriteFault::Nth(k) => n == k,
            WriteFault::From(k) => n >= k,
        };
        if fails {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(CheckpointError::Backend {
                backend: "sqlite",
                message: "database or disk is full (injected)".into(),
            });
        }
        self.inner.append(thread, record).await
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.counted(self.inner.load(thread, upto).await)
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        self.inner.head(thread).await
    }

    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        self.inner.span(thread).await
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.counted(self.inner.load_from(thread, from).await)
    }

    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        self.inner.list(thread).await
    }

    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        self.inner.compact_thread(thread, keep).await
    }

    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError> {
        self.inner.truncate_thread(thread, after).await
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        self.inner.fork(from, at, to).await
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        self.inner.delete_thread(thread).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        self.inner.delete_namespace(namespace).await
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        self.inner.stored_bytes().await
    }

    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError> {
        self.inner.keep_definition(version, definition).await
    }

    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError> {
        self.inner.definition(version).await
    }
}
