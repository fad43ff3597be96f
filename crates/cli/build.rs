//! Compiles the CPU check (`src/cpu_check.c`, run before `main` by `src/cpu.rs`) for the
//! baseline x86-64, telling it which instruction sets the Rust code of this build uses.

fn main() {
    println!("cargo:rerun-if-changed=src/cpu_check.c");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch != "x86_64" || os != "linux" {
        return;
    }
    let enabled = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let enabled: Vec<&str> = enabled.split(',').collect();
    let mut build = cc::Build::new();
    build.file("src/cpu_check.c").warnings(true);
    // The check must run on any x86-64: none of the instructions it looks for.
    for flag in ["-march=x86-64", "-mno-avx", "-mno-avx2", "-mno-fma", "-mno-f16c", "-mno-bmi", "-mno-bmi2"] {
        build.flag_if_supported(flag);
    }
    for feature in ["avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe"] {
        let needed = if enabled.contains(&feature) { "1" } else { "0" };
        build.define(&format!("NEED_{}", feature.to_uppercase()), needed);
    }
    build.compile("toolgraph_cpu_check");
}
