//! The head cache: thread heads of recent runs kept in memory, so a new turn reads only the
//! records it has not seen. Bounded (oldest evicted first); every entry is checked against
//! the store before use, so other replicas' writes and deletions are never missed.

use crate::checkpoint::ThreadId;
use crate::runner::ThreadState;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

struct Heads<S> {
    map: HashMap<ThreadId, ThreadState<S>>,
    /// Insertion order for eviction; may hold names already taken out of `map`.
    order: VecDeque<ThreadId>,
}

pub(crate) struct HeadCache<S> {
    inner: Mutex<Heads<S>>,
    capacity: usize,
}

impl<S: Clone> HeadCache<S> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { inner: Mutex::new(Heads { map: HashMap::new(), order: VecDeque::new() }), capacity }
    }

    fn lock(&self) -> MutexGuard<'_, Heads<S>> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes and returns a head: the run that takes it owns it until it puts it back.
    pub(crate) fn take(&self, thread: &ThreadId) -> Option<ThreadState<S>> {
        self.lock().map.remove(thread)
    }

    /// A copy of a head (cheap: the state is shared).
    pub(crate) fn peek(&self, thread: &ThreadId) -> Option<ThreadState<S>> {
        self.lock().map.get(thread).cloned()
    }

    pub(crate) fn put(&self, thread: ThreadId, head: ThreadState<S>) {
        let mut g = self.lock();
        if g.map.insert(thread.clone(), head).is_none() {
            g.order.push_back(thread);
        }
        while g.map.len() > self.capacity {
            match g.order.pop_front() {
                Some(old) => {
                    g.map.remove(&old);
                }
                None => break,
            }
        }
        if g.order.len() > self.capacity * 2 {
            let Heads { map, order } = &mut *g;
            order.retain(|t| map.contains_key(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_evicts_the_oldest() {
        let cache: HeadCache<u32> = HeadCache::new(2);
        let head = |v| {
            let mut h = ThreadState::<u32>::empty();
            h.version = v;
            h
        };
        for (i, t) in ["a", "b", "c"].iter().enumerate() {
            cache.put(ThreadId::new("t", t), head(i as u64));
        }
        assert!(cache.peek(&ThreadId::new("t", "a")).is_none(), "oldest evicted");
        assert_eq!(cache.take(&ThreadId::new("t", "c")).map(|h| h.version), Some(2));
        assert!(cache.take(&ThreadId::new("t", "c")).is_none(), "taken heads are gone");
        assert_eq!(cache.peek(&ThreadId::new("t", "b")).map(|h| h.version), Some(1));
    }
}
