//! The binary's global allocator: mimalloc, or the system allocator when
//! `TOOLGRAPH_ALLOCATOR=system`, chosen before the first allocation.
//!
//! mimalloc is the default: the model commands allocate and free large buffers per batch and
//! embed 1.3–1.5× faster on it than on glibc's allocator even tuned to keep freed buffers
//! (1,811–2,178 against 1,373–1,457 tokens/s, `bench embed` on 256 SciFact documents,
//! docs/bench-results/s7-embed-allocators.jsonl), and a
//! chat turn costs less CPU on it (SQLite store, one turn at a time: 1.3–1.5 ms against
//! 1.6–1.9). glibc's allocator holds less memory per open chat stream (10,000 held streams:
//! 555 MB against 783 MB): a service holding thousands of long streams may trade that CPU for
//! memory (docs/benchmarks.md, held streams).
//!
//! The two cannot be mixed: memory must be freed by the allocator that gave it. The choice is
//! made once, in an `.init_array` constructor that glibc runs before any Rust code allocates,
//! and never changes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set (once, before the first allocation) when this process uses the system allocator.
static SYSTEM: AtomicBool = AtomicBool::new(false);
/// Set (once, before the first allocation) when `TOOLGRAPH_ALLOCATOR` names no allocator.
static INVALID: AtomicBool = AtomicBool::new(false);

/// The name both constants below are built from.
macro_rules! variable {
    () => {
        "TOOLGRAPH_ALLOCATOR"
    };
}
/// The environment variable that chooses the allocator.
pub const VARIABLE: &str = variable!();
/// How its entry in the environment starts (matched without allocating).
const ASSIGNMENT: &[u8] = concat!(variable!(), "=").as_bytes();

/// mimalloc or the system allocator, as chosen for the command at start-up.
pub struct CommandAllocator;

impl CommandAllocator {
    /// The allocator in use, for the start-up log.
    pub fn name() -> &'static str {
        if SYSTEM.load(Ordering::Relaxed) { "system" } else { "mimalloc" }
    }
}

/// Calls `$method` on the allocator chosen at start-up.
macro_rules! forward {
    ($method:ident($($arg:expr),*)) => {
        if SYSTEM.load(Ordering::Relaxed) {
            System.$method($($arg),*)
        } else {
            mimalloc::MiMalloc.$method($($arg),*)
        }
    };
}

// SAFETY: every method forwards, with its arguments unchanged, to the same allocator for the
// life of the process (the flag is written before the first allocation and never again), so
// memory is always freed or resized by the allocator that gave it, under the contract the
// caller upholds for `GlobalAlloc`.
unsafe impl GlobalAlloc for CommandAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { forward!(alloc(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { forward!(alloc_zeroed(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: see the impl.
        unsafe { forward!(dealloc(ptr, layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { forward!(realloc(ptr, layout, new_size)) }
    }
}

/// What `TOOLGRAPH_ALLOCATOR=<value>` asks for: `Some(true)` the system allocator,
/// `Some(false)` mimalloc, `None` nothing known.
pub fn system_requested(value: &[u8]) -> Option<bool> {
    match value {
        b"system" => Some(true),
        b"mimalloc" | b"" => Some(false),
        _ => None,
    }
}

/// Fails when `TOOLGRAPH_ALLOCATOR` held a value that names no allocator (it was read before
/// `main`, where nothing can be reported).
pub fn check() -> Result<(), String> {
    if INVALID.load(Ordering::Relaxed) {
        return Err(format!("{VARIABLE} must be 'mimalloc' (the default) or 'system'"));
    }
    Ok(())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod choose {
    use std::ffi::{CStr, c_char, c_int};

    /// Run by glibc before `main`, with `main`'s arguments and environment.
    extern "C" fn choose(_argc: c_int, _argv: *const *const c_char, envp: *const *const c_char) {
        if envp.is_null() {
            return;
        }
        let mut i = 0;
        loop {
            // SAFETY: glibc passes the environment as a null-terminated array of
            // NUL-terminated strings. Reading them allocates nothing.
            let entry = unsafe { *envp.add(i) };
            if entry.is_null() {
                return;
            }
            // SAFETY: as above, a valid NUL-terminated string.
            let entry = unsafe { CStr::from_ptr(entry) }.to_bytes();
            if let Some(value) = entry.strip_prefix(super::ASSIGNMENT) {
                match super::system_requested(value) {
                    Some(true) => use_system(),
                    Some(false) => {}
                    None => super::INVALID.store(true, std::sync::atomic::Ordering::Relaxed),
                }
                return;
            }
            i += 1;
        }
    }

    fn use_system() {
        super::SYSTEM.store(true, std::sync::atomic::Ordering::Relaxed);
        // Keep freed large buffers in the heap (a local model): glibc otherwise maps each one
        // afresh and the page faults cost ~20% of throughput.
        // SAFETY: mallopt only sets allocator parameters; nothing has allocated through Rust
        // yet. 32 MiB is the largest mmap threshold glibc accepts on 64-bit targets.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }

    #[used]
    #[unsafe(link_section = ".init_array")]
    static CHOOSE: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = choose;
}

#[cfg(test)]
mod tests {
    use super::system_requested;

    #[test]
    fn the_variable_names_an_allocator_or_is_refused() {
        assert_eq!(system_requested(b"system"), Some(true));
        assert_eq!(system_requested(b"mimalloc"), Some(false));
        assert_eq!(system_requested(b""), Some(false), "set but empty: the default");
        assert_eq!(system_requested(b"jemalloc"), None);
        assert_eq!(system_requested(b"System"), None);
        assert_eq!(super::ASSIGNMENT, format!("{}=", super::VARIABLE).as_bytes());
    }
}
