//! Plugins as a user writes them: loading (good, broken, duplicate, two versions, display
//! text), `exec` plugins run as real processes (result, time limit with forked children,
//! failures, the environment) and `http` plugins against a real local server.

mod common;
use common::{call, registry};

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use toolgraph_plugins::{Kind, load};
use toolgraph_tools::{ToolClass, ToolContext, ToolErrorKind};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins")
}

/// Writes `plugin.toml` (and an executable `run.py` when `script` is given) in `root/dir`.
fn plugin(root: &Path, dir: &str, manifest: &str, script: Option<&str>) -> PathBuf {
    let d = root.join(dir);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("plugin.toml"), manifest).unwrap();
    if let Some(body) = script {
        let path = d.join("run.py");
        std::fs::write(&path, format!("#!/usr/bin/env python3\nimport json, os, sys, time, subprocess\n{body}\n"))
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d
}

fn exec_manifest(name: &str, version: &str, extra: &str) -> String {
    format!(
        "name = \"{name}\"\nversion = \"{version}\"\ndescription = \"A test plugin.\"\nkind = \"exec\"\nenv = [\"PATH\"]\n{extra}\n[parameters.x]\ntype = \"number\"\ndescription = \"A number.\"\n\n[exec]\ncommand = \"run.py\"\n"
    )
}

#[tokio::test]
async fn the_shipped_plugins_load_and_bad_calculator_adds_a_hundred() {
    let loaded = load(&[examples()], "es");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let names: Vec<&str> = loaded.plugins.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["bad_calculator", "datetime_now"]);
    let calc = &loaded.plugins[0];
    assert_eq!((calc.version.to_string().as_str(), calc.kind), ("1.0.0", Kind::Exec));
    let spec = calc.tools[0].spec();
    // Display text comes from the locale file; the model-facing text stays as written.
    assert_eq!(spec.display.name.as_deref(), Some("Calculadora errónea"));
    assert_eq!(spec.display.parameters["a"].description, "El primer número");
    assert!(spec.description.starts_with("A calculator that adds two numbers"));
    assert_eq!(spec.parameters["required"], json!(["a", "b"]));
    assert_eq!(spec.class, ToolClass::Read);
    let reg = registry(&[examples()]);
    assert_eq!(call(&reg, "bad_calculator", json!({"a": 1, "b": 2})).await.unwrap(), json!({"result": 103}));
    let err = call(&reg, "bad_calculator", json!({"a": "one", "b": 2})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::InvalidArguments, "the schema is checked before the program runs");
    let now = call(&reg, "datetime_now", json!({"timezone": "Asia/Ho_Chi_Minh"})).await.unwrap();
    assert_eq!(now["utc_offset"], "+0700", "{now}");
    let err = call(&reg, "datetime_now", json!({"timezone": "Mars/Olympus"})).await.unwrap_err();
    assert!(err.1.contains("unknown time zone 'Mars/Olympus'"), "{err:?}");
    // A directory given relative to the working directory (tests run in the crate's): the
    // program is still found, though it runs in its plugin's directory.
    let reg = registry(&[PathBuf::from("../../examples/plugins")]);
    assert_eq!(call(&reg, "bad_calculator", json!({"a": 0, "b": 0})).await.unwrap(), json!({"result": 100}));
    // Without a locale file for the language, a display key falls back to the key itself.
    let loaded = load(&[examples()], "vi");
    assert_eq!(loaded.plugins[0].tools[0].spec().display.name.as_deref(), Some("bad_calculator.name"));
}

#[test]
fn broken_duplicate_and_versioned_plugins_are_sorted_out_and_the_rest_load() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    plugin(r, "good", &exec_manifest("good", "1.0.0", ""), Some("print(1)"));
    plugin(r, "nested/deeper/also_good", &exec_manifest("also_good", "0.1.0", ""), Some("print(1)"));
    plugin(r, "no_version", &exec_manifest("no_version", "1.0.0", "").replace("version = \"1.0.0\"\n", ""), Some("x"));
    plugin(r, "typo", &exec_manifest("typo", "1.0.0", "timout_ms = 5"), Some("x"));
    plugin(r, "old", &exec_manifest("twice", "1.2.0", ""), Some("print('old')"));
    plugin(r, "new", &exec_manifest("twice", "1.10.0", ""), Some("print('new')"));
    plugin(r, "dup_a", &exec_manifest("dup", "2.0.0", ""), Some("x"));
    plugin(r, "dup_b", &exec_manifest("dup", "2.0.0", ""), Some("x"));
    plugin(r, "no_program", &exec_manifest("no_program", "1.0.0", ""), None);
    let loaded = load(&[r.to_path_buf()], "en");
    let names: Vec<&str> = loaded.plugins.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["also_good", "good", "twice"]);
    let twice = loaded.plugins.iter().find(|p| p.name == "twice").unwrap();
    assert_eq!(twice.version.to_string(), "1.10.0", "the newest version wins (semver, not text order)");
    assert_eq!(loaded.superseded.len(), 1);
    assert_eq!(loaded.superseded[0].version.to_string(), "1.2.0");
    let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
    let about = |dir: &str| {
        let path = r.join(dir).join("plugin.toml");
        loaded.errors.iter().filter(|e| e.path == path).map(ToString::to_string).collect::<Vec<_>>()
    };
    assert!(about("no_version")[0].contains("field `version`"), "{errors:?}");
    let typo = &about("typo")[0];
    assert!(typo.contains("plugin.toml:6") && typo.contains("field `timout_ms`"), "{typo}");
    assert_eq!(about("dup_a").len() + about("dup_b").len(), 2, "both copies of one version are refused: {errors:?}");
    assert!(about("no_program")[0].contains("field `exec.command`"), "{errors:?}");
    assert_eq!(errors.len(), 5, "{errors:?}");
}

#[tokio::test]
async fn exec_plugins_fail_clearly_and_never_outlive_their_time_limit() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let marker = r.join("grandchild.pid");
    plugin(r, "exits", &exec_manifest("exits", "1.0.0", ""), Some("sys.stderr.write('no such record'); sys.exit(3)"));
    plugin(r, "chatty", &exec_manifest("chatty", "1.0.0", ""), Some("print('hello, not json')"));
    plugin(
        r,
        "env",
        &exec_manifest("env", "1.0.0", ""),
        Some("json.load(sys.stdin); print(json.dumps(sorted(os.environ)))"),
    );
    // Forks a grandchild that would sleep for ten minutes, then hangs itself.
    let hang = format!(
        "p = subprocess.Popen(['sleep', '600']); open({:?}, 'w').write(str(p.pid)); time.sleep(600)",
        marker.display().to_string()
    );
    plugin(r, "hangs", &exec_manifest("hangs", "1.0.0", "timeout_ms = 700"), Some(&hang));
    // The program is a symlink (as a virtualenv's `python` is): it runs as the link, not its target.
    let linked = exec_manifest("linked", "1.0.0", "").replace("command = \"run.py\"", "command = \"launcher\"");
    let d = plugin(r, "linked", &linked, Some("print(json.dumps(os.path.basename(sys.argv[0])))"));
    std::os::unix::fs::symlink(d.join("run.py"), d.join("launcher")).unwrap();
    let reg = registry(&[r.to_path_buf()]);
    assert_eq!(call(&reg, "linked", json!({})).await.unwrap(), json!("launcher"));
    let err = call(&reg, "exits", json!({})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Internal);
    assert!(err.1.contains("exited with 3") && err.1.contains("no such record"), "{err:?}");
    let err = call(&reg, "chatty", json!({})).await.unwrap_err();
    assert!(err.1.contains("did not print JSON") && err.1.contains("hello, not json"), "{err:?}");
    let seen = call(&reg, "env", json!({"x": 1})).await.unwrap();
    let seen: Vec<&str> = seen.as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(seen.contains(&"PATH"), "the allow-listed variable reaches the program: {seen:?}");
    for ours in ["HOME", "CARGO_MANIFEST_DIR", "USER", "RUST_BACKTRACE"] {
        if std::env::var_os(ours).is_some() {
            assert!(!seen.contains(&ours), "{ours} leaked into the plugin's environment: {seen:?}");
        }
    }
    let started = Instant::now();
    let err = call(&reg, "hangs", json!({})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Timeout, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "stopped at its limit: {:?}", started.elapsed());
    let pid: u32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    // The grandchild went with the plugin's process group (allow a moment for the kill).
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !gone(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(pid), "the plugin's child {pid} outlived the time limit");
}

#[tokio::test]
async fn http_plugins_build_the_request_and_map_the_answer() {
    use axum::extract::{Json, Path as UrlPath};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/weather/{city}",
            get(|UrlPath(city): UrlPath<String>, headers: HeaderMap| async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                if city == "Atlantis" {
                    return (StatusCode::NOT_FOUND, Json(json!({"error": "no such city"})));
                }
                let (key, user) = (header("x-key"), header("x-user"));
                (StatusCode::OK, Json(json!({"data": {"city": city, "temp_c": 21.5, "key": key, "user": user}})))
            }),
        )
        .route("/notes", post(|Json(body): Json<Value>| async move { Json(json!({"stored": body})) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let root = tempfile::tempdir().unwrap();
    let weather = format!(
        "name = \"weather\"\nversion = \"1.0.0\"\ndescription = \"Weather.\"\nkind = \"http\"\nenv = [\"HOME\"]\n\
         [parameters.city]\ntype = \"string\"\ndescription = \"City\"\nrequired = true\n\
         [http]\nmethod = \"GET\"\nurl = \"{base}/weather/{{city}}\"\nheaders = {{ \"X-Key\" = \"k-${{HOME}}\", \"X-User\" = \"{{ctx.userId}}\" }}\nresult = \"/data\"\n"
    );
    plugin(root.path(), "weather", &weather, None);
    let note = format!(
        "name = \"save_note\"\nversion = \"1.0.0\"\ndescription = \"Save a note.\"\nkind = \"http\"\nclass = \"write\"\n\
         describe = \"Save the note \\\"{{text}}\\\"\"\n\
         [parameters.text]\ntype = \"string\"\ndescription = \"Text\"\nrequired = true\n\
         [http]\nurl = \"{base}/notes\"\n"
    );
    plugin(root.path(), "note", &note, None);
    let reg = registry(&[root.path().to_path_buf()]);
    let home = std::env::var("HOME").unwrap_or_default();
    // The turn's user fills `{ctx.userId}`; a turn without one is refused before any request.
    let turn = ToolContext::default().set("userId", json!(42));
    let out = reg.call(&turn, "weather", &json!({"city": "São Paulo"})).await.to_json();
    assert_eq!(out, json!({"city": "São Paulo", "temp_c": 21.5, "key": format!("k-{home}"), "user": "42"}));
    let err = call(&reg, "weather", json!({"city": "São Paulo"})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Denied, "{err:?}");
    let outcome = reg.call(&turn, "weather", &json!({"city": "Atlantis"})).await;
    let err = outcome.error().map(|e| (e.kind, e.message.clone())).unwrap();
    assert_eq!(err.0, ToolErrorKind::NotFound);
    assert!(err.1.contains("404") && err.1.contains("no such city"), "{err:?}");
    let save = reg.get("save_note").unwrap();
    assert_eq!(save.spec().class, ToolClass::Write, "a write plugin pauses for approval like every write tool");
    assert_eq!(save.describe(&json!({"text": "buy milk"})), "Save the note \"buy milk\"");
    let out = call(&reg, "save_note", json!({"text": "buy milk"})).await.unwrap();
    assert_eq!(out, json!({"stored": {"text": "buy milk"}}));
    // Nothing listens: the plugin is unavailable, and the call says so instead of failing the run.
    let dead = weather.replace(&base, "http://127.0.0.1:9");
    let dir = tempfile::tempdir().unwrap();
    plugin(dir.path(), "weather", &dead, None);
    let reg = registry(&[dir.path().to_path_buf()]);
    let outcome = reg.call(&turn, "weather", &json!({"city": "Lima"})).await;
    assert_eq!(outcome.error().map(|e| e.kind), Some(ToolErrorKind::Unavailable));
}
