//! The CPU check. An x86-64 build of toolgraph is compiled for x86-64-v3 (AVX, AVX2, FMA, F16C,
//! BMI1/2, LZCNT, MOVBE: `.cargo/config.toml`; the embedding models' kernels pick their SIMD
//! paths at compile time), so on an older CPU it would die of SIGILL at its first such
//! instruction, with no word of why. `toolgraph_cpu_check` (`src/cpu_check.c`, compiled for the
//! baseline x86-64 by `build.rs`, since Rust code of this build may use those instructions
//! anywhere) runs before `main` from the ELF `.init_array` and says instead which instructions
//! are missing and how to build for this CPU (docs/deploy.md, "CPU"); `tests/cpu.rs` runs the
//! binary on an emulated CPU without them.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe extern "C" {
    /// Returns when the CPU has every instruction set the build uses; else says which it lacks
    /// on stderr and exits with status 1.
    fn toolgraph_cpu_check();
}

/// [`toolgraph_cpu_check`], run by the loader before `main` (and before anything else of ours).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[used]
#[unsafe(link_section = ".init_array")]
static CHECK_BEFORE_MAIN: unsafe extern "C" fn() = toolgraph_cpu_check;
