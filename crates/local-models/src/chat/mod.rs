//! Local chat models from GGUF files: the prompt side ([`template`]) — the file's own chat
//! template with tools offered in its format, and the tokenizer rebuilt from its metadata — and
//! the decoder ([`qwen2`]) with a prefix-reusing KV cache — and [`LocalChatModel`], the
//! `ChatModel` around them (bounded queue, streaming, tool calls parsed from the text, and
//! decoded under the offered tools' names and parameters: [`call_guide`]; quoting replies
//! written sooner with drafts read from the prompt: [`draft`]).

mod call_guide;
pub mod draft;
pub mod kernels;
mod model;
pub mod qwen2;
mod stop;
pub mod template;

pub use model::{LocalChatModel, LocalChatOptions};
pub use template::{ChatTemplate, GgufChatAssets};

/// File name of the default chat model in the models cache (`scripts/fetch-models chat-0.5b`).
pub const QWEN_0_5B_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// The larger, more reliable tool caller (`scripts/fetch-models chat-1.5b`).
pub const QWEN_1_5B_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The cached file of a named chat model (`0.5b` or `1.5b`, as `scripts/fetch-models`
/// names them); `None` for any other name.
pub fn named_model(name: &str) -> Option<std::path::PathBuf> {
    let file = match name {
        "0.5b" => QWEN_0_5B_FILE,
        "1.5b" => QWEN_1_5B_FILE,
        _ => return None,
    };
    Some(crate::models_dir().join(file))
}

/// Read bandwidth from memory in GB/s, every core summing its share of a 1 GiB buffer (far
/// larger than the caches), best of 3: the ceiling for a decoder that streams its weights once
/// per token. Here (not in the binary) so it is optimised like the decoder in every build.
pub fn memory_read_gb_per_s() -> f64 {
    const BYTES: usize = 1 << 30;
    let words = vec![1u64; BYTES / 8];
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = words.len().div_ceil(threads);
    let bytes_per_s = best_rate_on_threads(threads, |i| {
        let part = words.chunks(chunk).nth(i).unwrap_or_default();
        // Keeps the sum alive so the reads cannot be optimised away.
        std::hint::black_box(part.iter().fold(0u64, |acc, w| acc.wrapping_add(*w)));
        (part.len() * 8) as u64
    });
    bytes_per_s / 1e9
}

/// The best of three runs of `work(i)` for each `i` in `0..threads`, all on their own threads
/// at once: what the calls return (the units of work they did), summed, per second. The
/// machine ceilings `bench chat` reports are measured this way.
pub(crate) fn best_rate_on_threads(threads: usize, work: impl Fn(usize) -> u64 + Sync) -> f64 {
    let mut best = 0f64;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let done: u64 = std::thread::scope(|s| {
            let work = &work;
            let handles: Vec<_> = (0..threads.max(1)).map(|i| s.spawn(move || work(i))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        best = best.max(done as f64 / t.elapsed().as_secs_f64().max(1e-9));
    }
    best
}
