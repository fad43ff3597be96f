//! The binary's global allocator, chosen per command before the first allocation: jemalloc
//! for `serve`, mimalloc for every other command; `TOOLGRAPH_ALLOCATOR=mimalloc|jemalloc|system`
//! overrides the choice.
//!
//! The two defaults answer two different loads (docs/benchmarks.md, "10,000 concurrent held
//! streams", fourth session):
//! - `serve` holds one chat stream per client. jemalloc holds the least per open stream:
//!   10,000 held streams peak at 495 MB on it, 510 MB on glibc's and 729 MB on mimalloc, and a
//!   turn's CPU stays within the service's goals (`s8-hold-*.jsonl`, `s8-cpu-*.jsonl`).
//! - The model commands (`ingest`, `eval`, `bench embed`, `chat` with a local model)
//!   allocate and free large buffers per batch: mimalloc embeds ~1.8× faster than jemalloc
//!   (2,408–2,414 against 1,318–1,326 tokens/s, `s8-embed-*.jsonl`) and 1.3–1.5× faster than
//!   glibc's allocator even tuned to keep freed buffers (`s7-embed-allocators.jsonl`).
//!
//! `serve` with an in-process chat model logs a hint to choose mimalloc.
//!
//! The two cannot be mixed: memory must be freed by the allocator that gave it. The choice is
//! made once, in an `.init_array` constructor that glibc runs before any Rust code allocates,
//! and never changes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

const MIMALLOC: u8 = 0;
const SYSTEM: u8 = 1;
const JEMALLOC: u8 = 2;
/// The allocator of this process, set (once, before the first allocation).
static CHOSEN: AtomicU8 = AtomicU8::new(MIMALLOC);
/// Set (once, before the first allocation) when `TOOLGRAPH_ALLOCATOR` made the choice.
static FROM_ENV: AtomicBool = AtomicBool::new(false);
/// The binary's global options that take a value as the next word: the command is the first
/// word that is neither an option nor such a value. (A test checks this against the CLI.)
pub const GLOBAL_OPTIONS_WITH_VALUE: &[&str] = &["--config", "--data-dir", "--log-format"];
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

/// jemalloc, mimalloc or the system allocator, as chosen for the command at start-up.
pub struct CommandAllocator;

impl CommandAllocator {
    /// Whether `TOOLGRAPH_ALLOCATOR` chose the allocator (rather than the command's default).
    pub fn from_env() -> bool {
        FROM_ENV.load(Ordering::Relaxed)
    }

    /// The allocator in use, for the start-up log.
    pub fn name() -> &'static str {
        match CHOSEN.load(Ordering::Relaxed) {
            SYSTEM => "system",
            JEMALLOC => "jemalloc",
            _ => "mimalloc",
        }
    }
}

/// Calls `$method` on the allocator chosen at start-up.
macro_rules! forward {
    ($method:ident($($arg:expr),*)) => {
        match CHOSEN.load(Ordering::Relaxed) {
            SYSTEM => System.$method($($arg),*),
            JEMALLOC => tikv_jemallocator::Jemalloc.$method($($arg),*),
            _ => mimalloc::MiMalloc.$method($($arg),*),
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

/// The default allocator of the command in `args` (the words after the program name).
fn command_default<'a>(mut args: impl Iterator<Item = &'a [u8]>) -> u8 {
    while let Some(word) = args.next() {
        if GLOBAL_OPTIONS_WITH_VALUE.iter().any(|o| o.as_bytes() == word) {
            args.next();
        } else if !word.starts_with(b"-") {
            return if word == b"serve" { JEMALLOC } else { MIMALLOC };
        }
    }
    MIMALLOC
}

/// What `TOOLGRAPH_ALLOCATOR=<value>` asks for, `None` for nothing known.
fn requested(value: &[u8]) -> Option<u8> {
    match value {
        b"system" => Some(SYSTEM),
        b"jemalloc" => Some(JEMALLOC),
        b"mimalloc" => Some(MIMALLOC),
        _ => None,
    }
}

/// Fails when `TOOLGRAPH_ALLOCATOR` held a value that names no allocator (it was read before
/// `main`, where nothing can be reported).
pub fn check() -> Result<(), String> {
    if INVALID.load(Ordering::Relaxed) {
        return Err(format!(
            "{VARIABLE} must be 'mimalloc', 'jemalloc' or 'system' (unset: jemalloc for serve, mimalloc otherwise)"
        ));
    }
    Ok(())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod choose {
    use std::ffi::{CStr, c_char, c_int};

    /// The NUL-terminated strings of a null-terminated array, from index `from`.
    ///
    /// # Safety
    /// `list` is null or a null-terminated array of valid NUL-terminated strings that
    /// outlive the iterator (glibc passes `argv` and `envp` so).
    unsafe fn words(list: *const *const c_char, from: usize) -> impl Iterator<Item = &'static [u8]> {
        let mut i = from;
        std::iter::from_fn(move || {
            if list.is_null() {
                return None;
            }
            // SAFETY: the caller's contract; `i` never passes the terminating null, since
            // iteration stops there. Reading the strings allocates nothing.
            let entry = unsafe { *list.add(i) };
            if entry.is_null() {
                return None;
            }
            i += 1;
            // SAFETY: as above, a valid NUL-terminated string.
            Some(unsafe { CStr::from_ptr(entry) }.to_bytes())
        })
    }

    /// Run by glibc before `main`, with `main`'s arguments and environment.
    extern "C" fn choose(argc: c_int, argv: *const *const c_char, envp: *const *const c_char) {
        use std::sync::atomic::Ordering::Relaxed;
        // SAFETY: glibc passes both lists as `words` requires; argv[0] is the program.
        let (args, mut env) = unsafe { (words(argv, usize::from(argc > 0)), words(envp, 0)) };
        let chosen = match env.find_map(|entry| entry.strip_prefix(super::ASSIGNMENT)) {
            Some(value) => match super::requested(value) {
                Some(chosen) => {
                    super::FROM_ENV.store(true, Relaxed);
                    chosen
                }
                None => {
                    super::INVALID.store(true, Relaxed);
                    return;
                }
            },
            None => super::command_default(args),
        };
        if chosen == super::SYSTEM {
            use_system();
        }
        super::CHOSEN.store(chosen, Relaxed);
    }

    fn use_system() {
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
    use super::{JEMALLOC, MIMALLOC, SYSTEM, command_default, requested};

    #[test]
    fn the_variable_names_an_allocator_or_is_refused() {
        assert_eq!(requested(b"system"), Some(SYSTEM));
        assert_eq!(requested(b"mimalloc"), Some(MIMALLOC));
        assert_eq!(requested(b"jemalloc"), Some(JEMALLOC));
        assert_eq!(requested(b""), None);
        assert_eq!(requested(b"tcmalloc"), None);
        assert_eq!(requested(b"System"), None);
        assert_eq!(super::ASSIGNMENT, format!("{}=", super::VARIABLE).as_bytes());
    }

    #[test]
    fn serve_defaults_to_jemalloc_and_every_other_command_to_mimalloc() {
        let default = |line: &str| command_default(line.split_whitespace().map(str::as_bytes));
        assert_eq!(default("serve --port 8080"), JEMALLOC);
        assert_eq!(default("--config serve.toml -v serve"), JEMALLOC, "an option's value is not the command");
        assert_eq!(default("--data-dir serve eval retrieval"), MIMALLOC);
        assert_eq!(default("-vv --config=x.toml serve"), JEMALLOC);
        assert_eq!(default("eval retrieval --dataset serve"), MIMALLOC, "only the command word counts");
        assert_eq!(default("chat"), MIMALLOC);
        assert_eq!(default("--help"), MIMALLOC);
        assert_eq!(default(""), MIMALLOC);
    }
}
