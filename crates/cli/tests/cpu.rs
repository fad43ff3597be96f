//! The binary on a CPU older than it was built for (QEMU's user-mode emulator, from Debian's
//! `qemu-user`, installed by `scripts/system-deps`): it says which instructions are missing and
//! how to build for that CPU, instead of dying of SIGILL (`src/cpu.rs`).

use std::process::Command;

/// The emulator, or `None` (allowed only outside CI, said on stderr).
fn qemu() -> Option<&'static str> {
    let path = "/usr/bin/qemu-x86_64";
    if std::path::Path::new(path).exists() {
        return Some(path);
    }
    assert!(std::env::var_os("CI").is_none(), "{path} is missing: scripts/system-deps installs it (qemu-user)");
    eprintln!("skipped: {path} is missing (scripts/system-deps installs it; CI fails without it)");
    None
}

#[test]
fn a_cpu_without_the_instructions_of_the_build_gets_a_message_not_sigill() {
    if !cfg!(all(target_arch = "x86_64", target_feature = "avx2")) {
        eprintln!("skipped: this build does not use AVX2");
        return;
    }
    let Some(qemu) = qemu() else { return };
    // Westmere (2010): SSE4.2, no AVX.
    let out =
        Command::new(qemu).args(["-cpu", "Westmere", env!("CARGO_BIN_EXE_toolgraph"), "--version"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status (SIGILL is none): {:?}\n{stderr}", out.status);
    assert!(
        stderr.starts_with("toolgraph: this CPU lacks instructions this build of toolgraph uses: avx avx2 fma f16c"),
        "{stderr}"
    );
    assert!(stderr.contains("RUSTFLAGS=\"-C target-cpu=native\" cargo build --release"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", String::from_utf8_lossy(&out.stdout));
    // The same binary on an emulated CPU that has them runs as usual: the check passes it by.
    let out = Command::new(qemu).args(["-cpu", "max", env!("CARGO_BIN_EXE_toolgraph"), "--version"]).output().unwrap();
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("toolgraph "), "{out:?}");
}
