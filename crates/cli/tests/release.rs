//! The release archive on a bare Debian: `scripts/release` packages the binary, and on a root
//! made with `debootstrap --variant=minbase` (no Rust, no compiler, no Python: what
//! `scripts/system-deps` makes once) the archive unpacks with the root's own `tar`, `serve`
//! starts and answers a turn on a scripted model over loopback, and asked for the local model
//! without its weights it says how to get them.
//!
//! It runs the binary this build made (a dev-profile build; `scripts/release` without
//! `--binary` makes the release-profile one): what it proves — the archive's layout, and that
//! the binary needs nothing the bare root lacks — is the same for both.

mod common;
use common::{free_port, sse_events, turn, wait_ready};

use scripted_llm::{Reply, ScriptedModelServer};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where `scripts/system-deps` makes the bare root.
fn debian_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("toolgraph/debian-root")
}

/// Whether this test can run here; under `CI` it must.
fn can_run(root: &Path) -> bool {
    let why = if !root.join("usr/bin/tar").is_file() {
        Some(format!("no bare Debian root at {} (scripts/system-deps makes it)", root.display()))
    } else if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n")) {
        Some("chroot needs root".to_owned())
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var_os("CI").is_some() => panic!("the release test cannot run under CI: {why}"),
        Some(why) => {
            eprintln!("SKIP: {why}");
            false
        }
    }
}

/// Runs `args` in `root` with an environment of only `env`.
fn in_root(root: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.arg(root).arg("/usr/bin/env").arg("-i").args(["HOME=/root", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
    cmd.args(env.iter().map(|(k, v)| format!("{k}={v}"))).args(args);
    cmd
}

/// A process started in the root, killed when dropped (a failed assertion included).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory inside the root, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_archive_serves_on_a_bare_debian() {
    let root = debian_root();
    if !can_run(&root) {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let made = Command::new(repo.join("scripts/release"))
        .args(["--binary", env!("CARGO_BIN_EXE_toolgraph"), "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "scripts/release: {}", String::from_utf8_lossy(&made.stderr));
    let archive = PathBuf::from(String::from_utf8_lossy(&made.stdout).trim());
    let name = archive.file_name().unwrap().to_string_lossy().trim_end_matches(".tar.gz").to_owned();
    assert!(name.starts_with("toolgraph-") && name.ends_with("-x86_64-linux-gnu"), "{name}");

    // Nothing to build with in the root: what runs there runs on the archive alone.
    for tool in ["cargo", "rustc", "cc", "gcc", "python3"] {
        let found = in_root(&root, &[], &["sh", "-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(!found.status.success(), "the bare root has {tool}: {}", String::from_utf8_lossy(&found.stdout));
    }

    let scratch = Scratch(root.join(format!("tmp/release-test-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    std::fs::copy(&archive, scratch.0.join("toolgraph.tar.gz")).unwrap();
    let inside = format!("/tmp/release-test-{}", std::process::id());
    let unpacked =
        in_root(&root, &[], &["tar", "-C", &inside, "-xzf", &format!("{inside}/toolgraph.tar.gz")]).output().unwrap();
    assert!(unpacked.status.success(), "the root's tar: {}", String::from_utf8_lossy(&unpacked.stderr));
    let top = scratch.0.join(&name);
    for part in
        ["bin/toolgraph", "LICENSE", "README.md", "CHANGELOG.md", "docs/configuration.md", "scripts/fetch-models"]
    {
        assert!(top.join(part).exists(), "the archive has no {part}");
    }
    assert!(top.join("examples/helpdesk/toolgraph.toml").is_file(), "the examples' configurations are in it");
    assert!(!top.join("examples/embed/src").exists(), "the examples' Rust is not");
    let binary = format!("{inside}/{name}/bin/toolgraph");

    // `serve` on the scripted model, over loopback (the root shares the host's network).
    let model = ScriptedModelServer::start(vec![Reply::text("Hola desde un Debian sin Rust.")]).await.unwrap();
    let port = free_port().to_string();
    let base_url = model.base_url();
    let data = format!("{inside}/data");
    let env = [("TOOLGRAPH_LLM_BASE_URL", base_url.as_str()), ("TOOLGRAPH_LLM_MODEL", "scripted")];
    // Its log goes to a file: a pipe nobody reads would block it once full.
    let log = scratch.0.join("serve.log");
    let child = in_root(&root, &env, &[&binary, "serve", "--port", &port, "--data-dir", &data])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut serve = Running(child);
    let base = format!("http://127.0.0.1:{port}");
    let ready = tokio::time::timeout(std::time::Duration::from_secs(30), wait_ready(&base)).await;
    if ready.is_err() || serve.0.try_wait().unwrap().is_some() {
        panic!("serve did not become ready in the bare root: {}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    let body = turn(&base, None, "hola").await;
    drop(serve);
    let reply: String = sse_events(&body)
        .iter()
        .filter(|(event, _)| event == "token")
        .filter_map(|(_, data)| data["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(reply, "Hola desde un Debian sin Rust.", "{body}");
    assert!(body.contains("event: done"), "{body}");
    assert!(scratch.0.join("data/toolgraph.db").is_file(), "the SQLite store is in the data directory");

    // The local model without its weights: a clear error that says how to get them.
    let chat = format!("echo hola | {binary} chat --data-dir {inside}/data2");
    let no_weights = in_root(&root, &[("TOOLGRAPH_LLM_LOCAL_MODEL", "1.5b")], &["sh", "-c", &chat]).output().unwrap();
    let err = String::from_utf8_lossy(&no_weights.stderr);
    assert!(!no_weights.status.success(), "it ran without weights: {err}");
    assert!(err.contains("scripts/fetch-models chat-1.5b"), "no word on how to get the weights: {err}");
}
