//! The threads the decoder's products run on: the calling thread plus `threads − 1` helpers.
//!
//! A generated token is a few hundred short products, so handing out work must cost far less
//! than a microsecond-scale product: helpers spin on a generation counter for a while after each
//! job (the next one comes within microseconds while a token is computed) and only then sleep,
//! and the caller works too instead of waiting — on two cores, a waiting caller would be a third
//! thread competing with the two that compute.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it sleeps.
const SPIN: Duration = Duration::from_micros(300);

/// A job: `items` calls of `f`, handed out one at a time.
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    items: usize,
}

struct Shared {
    /// Bumped once per job; helpers compare it with the last one they ran.
    generation: AtomicUsize,
    /// The next item to hand out.
    next: AtomicUsize,
    /// Helpers that finished the current job.
    finished: AtomicUsize,
    /// The current job, written by the caller before `generation` is bumped.
    job: UnsafeCell<Job>,
    /// A helper's item panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
}

// SAFETY: `job` is written only by the caller holding `WorkerPool::call`, before it bumps
// `generation` (release), and read by helpers after they see the bump (acquire); the caller
// does not return (and so the closure it points at stays alive) until every helper reported
// `finished`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A buffer the pool's threads write disjoint parts of at once (a raw pointer: one `&mut`
/// slice cannot be handed to several threads).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(*mut f32);

// SAFETY: every user writes only the part its work item owns, and the pool's caller waits for
// all items (`for_each` returns) before it reads the buffer.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The buffer of `slice`, for a job's items to write their own parts of.
    pub(crate) fn new(slice: &mut [f32]) -> Self {
        Self(slice.as_mut_ptr())
    }

    /// The `len` elements from `start`. A method rather than the field, so closures capture
    /// the whole `SharedMut` (which is `Sync`) rather than its pointer.
    ///
    /// # Safety
    /// The range lies inside the buffer, the buffer outlives the returned slice, and no other
    /// thread touches the range meanwhile.
    pub(crate) unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// `i` lies inside the buffer and no other thread touches it meanwhile.
    pub(crate) unsafe fn write(self, i: usize, value: f32) {
        unsafe { *self.0.add(i) = value };
    }
}

/// A fixed set of threads that run one data-parallel job at a time.
pub struct WorkerPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Serialises callers: two models in one process take turns per product.
    call: Mutex<()>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerPool({} threads)", self.threads())
    }
}

impl WorkerPool {
    /// A pool of `threads` (at least 1; the caller is one of them).
    pub fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            job: UnsafeCell::new(Job { f: &|_| {}, items: 0 }),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let helpers = (1..threads.max(1))
            .filter_map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("toolgraph-decode-{i}"))
                    .spawn(move || helper(&shared))
                    .map_err(|e| tracing::warn!("cannot start decoder thread {i}: {e}; continuing with fewer"))
                    .ok()
            })
            .collect();
        Self { shared, helpers, call: Mutex::new(()) }
    }

    /// The process's pool: one thread per core (`TOOLGRAPH_THREADS` overrides).
    pub fn global() -> &'static WorkerPool {
        static POOL: std::sync::OnceLock<WorkerPool> = std::sync::OnceLock::new();
        POOL.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let threads = match std::env::var("TOOLGRAPH_THREADS") {
                Err(_) => cores,
                Ok(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        tracing::warn!(
                            "TOOLGRAPH_THREADS={v:?} is not a positive number; using {cores} (one per core)"
                        );
                        cores
                    }
                },
            };
            WorkerPool::new(threads)
        })
    }

    /// Threads that work on a job, the caller's included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Calls `f(i)` for every `i < items`, spread over the pool's threads; returns when all
    /// are done.
    ///
    /// # Panics
    /// When `f` panicked on any thread (the panic is re-raised here, after every thread
    /// stopped touching the job).
    pub fn for_each(&self, items: usize, f: &(dyn Fn(usize) + Sync)) {
        if items == 0 {
            return;
        }
        if self.helpers.is_empty() || items == 1 {
            (0..items).for_each(f);
            return;
        }
        // A poisoned lock only means another caller's job panicked; the pool itself is intact.
        let _turn = self.call.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = &*self.shared;
        // SAFETY: helpers read `job` only after the generation bump below, and every helper
        // finished the previous job before the previous call returned.
        unsafe {
            // Erasing the lifetime is sound because this call waits for every helper below.
            let f: *const (dyn Fn(usize) + Sync + '_) = f;
            let f =
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync + 'static)>(f);
            *s.job.get() = Job { f, items };
        }
        s.next.store(0, Ordering::Relaxed);
        s.finished.store(0, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        for h in &self.helpers {
            h.thread().unpark();
        }
        let caller = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_items(s, f, items)));
        while s.finished.load(Ordering::Acquire) < self.helpers.len() {
            std::hint::spin_loop();
        }
        if let Err(payload) = caller {
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a decoder thread panicked");
        }
    }
}

fn take_items(s: &Shared, f: &(dyn Fn(usize) + Sync), items: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= items {
            return;
        }
        f(i);
    }
}

fn helper(s: &Shared) {
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                // Woken by the caller's `unpark` (a token left before `park` returns at once),
                // or after the timeout at the latest, so a missed wake-up costs 1 ms, not a hang.
                std::thread::park_timeout(Duration::from_millis(1));
            } else {
                std::hint::spin_loop();
            }
        };
        seen = generation;
        // SAFETY: see `Shared`: the caller wrote the job before the bump we just saw and keeps
        // its closure alive until we report `finished`.
        let (f, items) = unsafe {
            let job = &*s.job.get();
            (&*job.f, job.items)
        };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_items(s, f, items))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.finished.fetch_add(1, Ordering::Release);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for h in self.helpers.drain(..) {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_across_many_jobs() {
        let pool = WorkerPool::new(3);
        for items in [1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(items, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{items} items");
        }
    }

    #[test]
    fn a_panicking_item_is_reported_and_the_pool_keeps_working() {
        let pool = WorkerPool::new(2);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.for_each(64, &|i| assert!(i != 40, "item 40"));
        }));
        assert!(result.is_err());
        let count = AtomicUsize::new(0);
        pool.for_each(64, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}
