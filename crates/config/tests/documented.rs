//! The documentation against the loader: every configuration key and `TOOLGRAPH_*` variable
//! that `docs/`, the README and the examples' READMEs name, every `toolgraph.toml` snippet they
//! show, and the defaults the key table states, checked by the loader itself — a typo in the
//! docs fails here, not at a user's start-up.

use serde_json::Value;
use std::path::{Path, PathBuf};
use toolgraph_config::{Config, ConfigError, variable_key};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages a user reads: `docs/*.md`, the README, and each example's README.
fn pages() -> Vec<(String, String)> {
    let root = repo();
    let mut files: Vec<PathBuf> = vec![root.join("README.md")];
    for dir in [root.join("docs"), root.join("examples")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { panic!("cannot list {}", dir.display()) };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            } else if path.join("README.md").is_file() {
                files.push(path.join("README.md"));
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f.strip_prefix(&root).unwrap_or(&f).display().to_string(), text)
        })
        .collect()
}

/// Placeholders the docs write for names a user picks (`agents.NAME.kb`, `server.api_keys.SLUG`).
fn placeholder(segment: &str) -> bool {
    matches!(segment, "NAME" | "name" | "SLUG" | "slug" | "<name>" | "<slug>" | "DESK" | "desk" | "ID")
}

/// A key with a string where it names a table, unknown to the loader, is refused as unknown:
/// the sentinel's type may be wrong for the key (an error too, but one about its value).
fn unknown_key(dotted: &str) -> Option<String> {
    let segments: Vec<String> =
        dotted.split('.').map(|s| if placeholder(s) { "x".to_owned() } else { s.to_owned() }).collect();
    let (last, tables) = segments.split_last()?;
    let text = if tables.is_empty() {
        format!("{last} = \"\u{a7}\"\n")
    } else {
        format!("[{}]\n{last} = \"\u{a7}\"\n", tables.join("."))
    };
    match Config::from_toml_str(&text) {
        Err(ConfigError::Load(e)) => {
            let message = e.to_string();
            (message.contains("unknown field") || message.contains("invalid type: map")).then_some(message)
        }
        _ => None,
    }
}

/// Words in backticks: `` `llm.provider` `` or `` `rag.fusion = "rrf"` ``.
fn backticked(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

const SECTIONS: [&str; 7] = ["llm", "server", "tools", "agents", "rag", "plugins", "mcp"];

/// Dotted names in the docs that are not configuration keys: a tracing span's name.
const NOT_KEYS: [&str; 1] = ["llm.call"];

/// Variables the docs name that are not toolgraph's: those of an experiment's patch
/// (docs/retrieval.md, "Dense pseudo-relevance feedback"), which the docs say to apply first.
const PATCH_ONLY: [&str; 3] =
    ["TOOLGRAPH_RAG_FEEDBACK_DOCS", "TOOLGRAPH_RAG_FEEDBACK_QUERY_WEIGHT", "TOOLGRAPH_RAG_FEEDBACK_DOCS_WEIGHT"];

#[test]
fn every_documented_variable_sets_a_key_the_loader_knows() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in pages() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("TOOLGRAPH_") {
            let tail = &rest[at..];
            let end =
                tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
            let variable = tail[..end].trim_end_matches('_');
            rest = &tail[end..];
            // `TOOLGRAPH_AGENTS__NAME__KEY`: any key of an agent, listed beside it.
            if variable.ends_with("__KEY") || variable == "TOOLGRAPH" || PATCH_ONLY.contains(&variable) {
                continue;
            }
            let Some(key) = variable_key(variable) else { continue };
            checked += 1;
            if let Some(why) = unknown_key(&key) {
                wrong.push(format!("{file}: {variable} (key `{key}`): {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "documented variables the loader refuses:\n{}", wrong.join("\n"));
    assert!(checked > 100, "only {checked} variables found: is the scan still reading the docs?");
}

#[test]
fn every_documented_key_is_one_the_loader_knows_and_takes_the_value_shown() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in pages() {
        for code in backticked(&text) {
            let (key, value) = match code.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (code.trim(), None),
            };
            let Some((section, _)) = key.split_once('.') else { continue };
            let is_key = SECTIONS.contains(&section)
                && key.split('.').all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                && !key.ends_with(".md")
                && !key.contains(".rs")
                && !NOT_KEYS.contains(&key);
            if !is_key {
                continue;
            }
            checked += 1;
            if let Some(why) = unknown_key(key) {
                wrong.push(format!("{file}: `{code}`: {why}"));
                continue;
            }
            // `key = value` as a user would copy it into toolgraph.toml (`a | b`: either).
            let Some(value) = value.filter(|v| !v.is_empty() && !v.contains('…') && !v.contains("...")) else {
                continue;
            };
            for value in value.split(" | ") {
                let segments: Vec<&str> = key.split('.').map(|s| if placeholder(s) { "x" } else { s }).collect();
                let (last, tables) = segments.split_last().expect("a dotted key has segments");
                let doc = format!("[{}]\n{last} = {}\n", tables.join("."), value.trim());
                if let Err(ConfigError::Load(e)) = Config::from_toml_str(&doc) {
                    wrong.push(format!("{file}: `{code}` does not load: {e}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "documented keys the loader refuses:\n{}", wrong.join("\n"));
    assert!(checked > 100, "only {checked} keys found: is the scan still reading the docs?");
}

/// The top-level keys a `toolgraph.toml` may have, as the loader writes them.
fn top_level_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        other => panic!("the defaults are not a table: {other:?}"),
    }
}

/// The TOML blocks of a page whose top-level keys are all configuration keys (a graph file, a
/// plugin manifest or a Cargo.toml shown beside them is not a `toolgraph.toml`).
fn config_blocks(text: &str, keys: &[String]) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim_start().trim_start_matches('`').trim() != "toml" || !line.trim_start().starts_with("```") {
            continue;
        }
        let body: Vec<&str> =
            lines.by_ref().map(|(_, l)| l).take_while(|l| !l.trim_start().starts_with("```")).collect();
        let body = body.join("\n");
        let Ok(table) = body.parse::<toml::Table>() else {
            blocks.push((n + 1, body));
            continue;
        };
        if !table.is_empty() && table.keys().all(|k| keys.contains(k)) {
            blocks.push((n + 1, body));
        }
    }
    blocks
}

#[test]
fn every_toolgraph_toml_the_docs_show_loads() {
    let keys = top_level_keys();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in pages() {
        for (line, block) in config_blocks(&text, &keys) {
            checked += 1;
            match Config::from_toml_str(&block) {
                Ok(_) => {}
                // A snippet shows a part: what another part must also set is not its error;
                // nor is a value it leaves for the reader to fill in (`"<hex SHA-256 …>"`).
                Err(ConfigError::Invalid { key, reason, .. })
                    if reason.contains("need")
                        || reason.contains("no agent named")
                        || placeholder_value(&block, &key) => {}
                Err(e) => wrong.push(format!("{file}:{line}: {e}")),
            }
        }
    }
    assert!(wrong.is_empty(), "documented toolgraph.toml snippets the loader refuses:\n{}", wrong.join("\n"));
    assert!(checked >= 10, "only {checked} snippets found: is the scan still reading the docs?");
}

/// Whether `block` gives `key` a value for the reader to fill in: `name = "<…>"`.
fn placeholder_value(block: &str, key: &str) -> bool {
    let name = key.rsplit('.').next().unwrap_or(key);
    block.lines().any(|l| {
        let l = l.trim();
        l.strip_prefix(name).is_some_and(|rest| rest.trim_start().starts_with('=') && rest.contains("\"<"))
    })
}

/// `docs/configuration.md`'s table: each key with its variable, and the default it states when
/// that is a plain value.
#[test]
fn the_key_tables_variables_and_defaults_are_the_loaders() {
    let text = std::fs::read_to_string(repo().join("docs/configuration.md")).expect("docs/configuration.md");
    let defaults = serde_json::to_value(Config::default()).expect("the defaults serialize");
    let mut rows = 0;
    let mut wrong = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, keys, variables, default, ..] = cells.as_slice() else { continue };
        // A row may give several keys and their variables (`…` for the rest).
        let keys: Vec<&str> = backticked(keys).filter(|k| !k.contains('…')).collect();
        let variables: Vec<&str> =
            backticked(variables).filter(|v| v.starts_with("TOOLGRAPH_") && !v.contains('…')).collect();
        let Some(&key) = keys.first() else { continue };
        if key.ends_with(".*") || variables.is_empty() {
            continue;
        }
        rows += 1;
        let lowered = |key: &str| {
            key.split('.')
                .map(|s| if placeholder(s) { s.to_ascii_lowercase() } else { s.to_owned() })
                .collect::<Vec<_>>()
                .join(".")
        };
        for variable in &variables {
            match variable_key(variable) {
                Some(k) if keys.iter().any(|key| lowered(key) == k) => {}
                other => wrong.push(format!("`{key}`: its variable {variable} sets {other:?}")),
            }
        }
        if let Some(why) = unknown_key(key) {
            wrong.push(format!("`{key}`: {why}"));
        }
        // A stated default that is a plain value must be the loader's.
        let stated = default.trim_matches('`');
        let Some(actual) = key.split('.').try_fold(&defaults, |v, s| v.get(s)) else { continue };
        let plain = default.starts_with('`') && default.ends_with('`') && !stated.contains('`')
            || stated.parse::<f64>().is_ok()
            || matches!(stated, "true" | "false");
        if !plain {
            continue;
        }
        let agrees = match (actual, serde_json::from_str::<Value>(stated)) {
            (Value::String(s), _) => s == stated || s.trim_start_matches("./") == stated.trim_start_matches("./"),
            (Value::Number(n), _) => stated.parse::<f64>().ok() == n.as_f64(),
            (actual, Ok(parsed)) => *actual == parsed,
            _ => true,
        };
        if !agrees {
            wrong.push(format!("`{key}`: the table says the default is {default}, the loader's is {actual}"));
        }
    }
    assert!(wrong.is_empty(), "docs/configuration.md disagrees with the loader:\n{}", wrong.join("\n"));
    assert!(rows > 50, "only {rows} rows read: is the table still there?");
}
