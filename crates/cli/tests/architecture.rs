//! The crate layering, as `cargo metadata` sees it: every workspace crate depends only on the
//! workspace crates its row of the table in `docs/architecture.md` allows, and that table keeps
//! the rules the layering exists for (nothing depends on the binary, the bottom crates depend
//! on nothing, the graph runtime knows no model or tool, …). And inside each crate, its
//! top-level modules import each other one way only: no circles of `crate::…` paths.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each workspace crate's workspace dependencies: `(normal and build, dev)`.
type Dependencies = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

/// `cargo metadata` of the workspace, without dependencies.
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn workspace_dependencies() -> Dependencies {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages.iter().filter_map(|p| p["name"].as_str()).map(str::to_owned).collect();
    let mut deps = Dependencies::new();
    for p in packages {
        let name = p["name"].as_str().expect("name").to_owned();
        let entry = deps.entry(name).or_default();
        for d in p["dependencies"].as_array().expect("dependencies") {
            let Some(dep) = d["name"].as_str().filter(|n| members.contains(*n)) else { continue };
            match d["kind"].as_str() {
                Some("dev") => entry.1.insert(dep.to_owned()),
                _ => entry.0.insert(dep.to_owned()),
            };
        }
    }
    deps
}

/// The "Allowed dependencies" table of docs/architecture.md: crate → the crates it may depend on.
fn allowed_table() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).expect("docs/architecture.md");
    let section = doc.split("## Allowed dependencies").nth(1).expect("an 'Allowed dependencies' section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let names = |cell: &str| -> BTreeSet<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    let mut table = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (krate, allowed) = (cells[1], cells[2]);
        let krate = krate.trim_matches('`').to_owned();
        let allowed =
            if allowed.starts_with("every crate above") { BTreeSet::from(["*".to_owned()]) } else { names(allowed) };
        table.insert(krate, allowed);
    }
    assert!(!table.is_empty(), "the table has rows");
    table
}

const TEST_SUPPORT: [&str; 2] = ["toolgraph-testkit", "scripted-llm"];
const BINARY: &str = "toolgraph";

/// What in `deps` the table does not allow, one line each.
fn violations(deps: &Dependencies, table: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (krate, (normal, dev)) in deps {
        let Some(allowed) = table.get(krate) else {
            wrong.push(format!("{krate} has no row in docs/architecture.md's table"));
            continue;
        };
        for dep in normal {
            let ok = if allowed.contains("*") { !TEST_SUPPORT.contains(&dep.as_str()) } else { allowed.contains(dep) };
            if !ok {
                wrong.push(format!("{krate} depends on {dep}, which its row does not allow"));
            }
        }
        if dev.contains(BINARY) {
            wrong.push(format!("{krate} has a dev-dependency on the binary"));
        }
    }
    for krate in table.keys() {
        if !deps.contains_key(krate) {
            wrong.push(format!("docs/architecture.md lists {krate}, which is not a workspace crate"));
        }
    }
    wrong
}

#[test]
fn every_crate_depends_only_on_what_the_architecture_allows() {
    let wrong = violations(&workspace_dependencies(), &allowed_table());
    assert!(wrong.is_empty(), "layering violations:\n{}", wrong.join("\n"));
}

#[test]
fn a_forbidden_dependency_is_reported() {
    let table = allowed_table();
    let mut deps = workspace_dependencies();
    deps.get_mut("toolgraph-graph").expect("graph").0.insert("toolgraph-llm".into());
    deps.get_mut("toolgraph-agents").expect("agents").0.insert("toolgraph-server".into());
    deps.get_mut("toolgraph-server").expect("server").1.insert(BINARY.into());
    let wrong = violations(&deps, &table);
    assert_eq!(
        wrong,
        [
            "toolgraph-agents depends on toolgraph-server, which its row does not allow",
            "toolgraph-graph depends on toolgraph-llm, which its row does not allow",
            "toolgraph-server has a dev-dependency on the binary",
        ]
    );
}

#[test]
fn the_table_keeps_the_layering_rules() {
    let table = allowed_table();
    let allows = |krate: &str, dep: &str| {
        table.get(krate).is_some_and(|a| a.contains(dep) || (a.contains("*") && krate == BINARY))
    };
    for bottom in ["toolgraph-tools", "toolgraph-embed", "toolgraph-protocol"] {
        assert!(table.get(bottom).is_some_and(BTreeSet::is_empty), "{bottom} must depend on no workspace crate");
    }
    // The model client reads its server's stream with the one SSE reader, and nothing else.
    let llm = table.get("toolgraph-llm").expect("the llm row");
    assert!(llm.iter().all(|d| d == "toolgraph-protocol"), "toolgraph-llm may depend on toolgraph-protocol only");
    for dep in ["toolgraph-llm", "toolgraph-tools"] {
        assert!(!allows("toolgraph-graph", dep), "the graph runtime must not depend on {dep}");
    }
    for dep in ["toolgraph-graph", "toolgraph-llm", "toolgraph-server", "toolgraph-agents", "toolgraph-conversations"] {
        assert!(!allows("toolgraph-rag", dep), "rag must not depend on {dep}");
    }
    assert!(!allows("toolgraph-agents", "toolgraph-server"), "agents must not depend on the server");
    for (krate, allowed) in &table {
        assert!(!allowed.contains(BINARY), "{krate} must not depend on the binary");
        if krate != BINARY {
            for support in TEST_SUPPORT {
                assert!(!allowed.contains(support), "{krate} may use {support} only as a dev-dependency");
            }
        }
    }
}

// Module circles: inside a crate, top-level modules import each other one way only.

/// Crates whose top-level modules still import each other in circles: they are being
/// untangled (issue 52). The test fails once one of them has no circle left, so this list
/// only shrinks.
const STILL_CIRCULAR: &[&str] = &[];

/// A crate's top-level modules: module → the modules it imports → where it first does
/// (`file:line`, the file relative to `src/`).
type ModuleGraph = BTreeMap<String, BTreeMap<String, String>>;

/// Every workspace crate: its name and its directory relative to the workspace root.
fn workspace_crates() -> Vec<(String, PathBuf)> {
    let meta = metadata();
    let root = PathBuf::from(meta["workspace_root"].as_str().expect("workspace_root"));
    let packages = meta["packages"].as_array().expect("packages");
    let mut crates: Vec<(String, PathBuf)> = packages
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest_path"));
            let dir = manifest.parent().expect("a manifest has a directory");
            (p["name"].as_str().expect("name").to_owned(), dir.strip_prefix(&root).unwrap_or(dir).to_owned())
        })
        .collect();
    crates.sort();
    crates
}

/// Every `.rs` file under `dir`: its path relative to `dir` (with `/`) and its text.
fn rust_files(dir: &Path) -> Vec<(String, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(base).expect("under base").components();
                let rel: Vec<String> = rel.map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((rel.join("/"), text));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `source` as characters with comments and string and char literals blanked out (newlines
/// kept, so an offset still gives its line).
fn code_only(source: &str) -> Vec<char> {
    let s: Vec<char> = source.chars().collect();
    let mut out = s.clone();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut i = 0;
    while i < s.len() {
        let start = i;
        match s[i] {
            '/' if at(i + 1) == '/' => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                while i < s.len() {
                    if s[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if s[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            '"' => {
                i += 1;
                while i < s.len() && s[i] != '"' {
                    i += if s[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            'r' | 'b' if i == 0 || !is_ident(s[i - 1]) => {
                // A raw string: `r"…"`, `r#"…"#`, `br"…"`; anything else is an identifier.
                let mut p = i + usize::from(s[i] == 'b');
                let hashes = if at(p) == 'r' {
                    p += 1;
                    let h = s[p.min(s.len())..].iter().take_while(|c| **c == '#').count();
                    p += h;
                    (at(p) == '"').then_some(h)
                } else {
                    None
                };
                let Some(hashes) = hashes else {
                    i += 1;
                    continue;
                };
                i = p + 1;
                while i < s.len() && !(s[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                    i += 1;
                }
                i += 1 + hashes;
            }
            '\'' if at(i + 1) == '\\' => {
                i += 3;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            '\'' if at(i + 2) == '\'' => i += 3,
            _ => {
                i += 1;
                continue;
            }
        }
        let end = i.min(s.len());
        for c in &mut out[start..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        i = end;
    }
    out
}

/// Where the item starting at `start` ends: after its `;`, or after its block (`mod x { … }`,
/// `fn …`, `impl …`), whichever closes it.
fn item_end(code: &[char], start: usize) -> usize {
    let head: String = code[start..code.len().min(start + 80)].iter().collect();
    let mut words = head.split(|c: char| !is_ident(c)).filter(|w| !w.is_empty() && *w != "pub" && *w != "crate");
    let kind = words.next().unwrap_or_default();
    let ends_with_semicolon =
        matches!(kind, "use" | "static" | "type" | "let") || (kind == "const" && words.next() != Some("fn"));
    let mut depth = 0i32;
    for (k, c) in code.iter().enumerate().skip(start) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth -= 1,
            '}' => {
                depth -= 1;
                if depth == 0 && !ends_with_semicolon {
                    return k + 1;
                }
            }
            ';' if depth == 0 => return k + 1,
            _ => {}
        }
    }
    code.len()
}

/// Blanks out every item under `#[cfg(test)]` in `code`. Returns the test modules declared
/// as files (`#[cfg(test)] mod tests;`) and whether the whole file is test-only
/// (`#![cfg(test)]`).
fn drop_test_items(code: &mut [char]) -> (Vec<String>, bool) {
    let mut file_modules = Vec::new();
    let skip_space = |code: &[char], mut k: usize| {
        while k < code.len() && code[k].is_whitespace() {
            k += 1;
        }
        k
    };
    // The attribute starting at `k` (a `#`): its end and its text without spaces.
    let attribute = |code: &[char], k: usize| -> Option<(usize, bool, String)> {
        let mut j = skip_space(code, k + 1);
        let inner = code.get(j) == Some(&'!');
        j = skip_space(code, j + usize::from(inner));
        if code.get(j) != Some(&'[') {
            return None;
        }
        let mut depth = 0;
        for (e, c) in code.iter().enumerate().skip(j) {
            depth += match c {
                '[' => 1,
                ']' => -1,
                _ => 0,
            };
            if depth == 0 {
                let text = code[j + 1..e].iter().filter(|c| !c.is_whitespace()).collect();
                return Some((e + 1, inner, text));
            }
        }
        None
    };
    let mut i = 0;
    while i < code.len() {
        let Some((after, inner, text)) = (code[i] == '#').then(|| attribute(code, i)).flatten() else {
            i += 1;
            continue;
        };
        if text != "cfg(test)" {
            i = after;
            continue;
        }
        if inner {
            return (file_modules, true);
        }
        let mut start = skip_space(code, after);
        while code.get(start) == Some(&'#') {
            match attribute(code, start) {
                Some((next, ..)) => start = skip_space(code, next),
                None => break,
            }
        }
        let end = item_end(code, start);
        let item: String = code[start..end].iter().collect();
        let words: Vec<&str> = item.split(|c: char| !is_ident(c)).filter(|w| !w.is_empty()).collect();
        if item.trim_end().ends_with(';')
            && let Some(m) = words.iter().position(|w| *w == "mod")
            && let Some(name) = words.get(m + 1)
        {
            file_modules.push((*name).to_owned());
        }
        for c in &mut code[i..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        i = end;
    }
    (file_modules, false)
}

/// The paths of a use tree, as segments: `a::{b, c::{d as e}}` gives `[a, b]` and `[a, c, e]`
/// (an alias replaces the name it renames).
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (k, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[from..]);
    let segments = |path: &str| -> Vec<String> {
        path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
    };
    let mut paths = Vec::new();
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        if let (Some(open), Some(close)) = (part.find('{'), part.rfind('}')) {
            let prefix = segments(&part[..open]);
            for rest in use_paths(&part[open + 1..close]) {
                paths.push(prefix.iter().cloned().chain(rest).collect());
            }
        } else {
            let (path, alias) = part.split_once(" as ").unwrap_or((part, ""));
            let mut path = segments(path);
            if let (Some(last), false) = (path.last_mut(), alias.trim().is_empty()) {
                *last = alias.trim().to_owned();
            }
            paths.push(path);
        }
    }
    paths
}

/// Every `crate::…` path in `code` (`$crate::…` too): its offset and the first segment of each
/// path it names (several for a group, `crate::{a, b::c}`).
fn crate_paths(code: &[char]) -> Vec<(usize, Vec<String>)> {
    let text: String = code.iter().collect();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut found = Vec::new();
    for (k, _) in text.match_indices("crate") {
        let at = chars.partition_point(|(b, _)| *b < k);
        let before = at.checked_sub(1).map(|p| chars[p].1);
        let rest = text[k + "crate".len()..].trim_start();
        if before.is_some_and(is_ident) || !rest.starts_with("::") {
            continue;
        }
        let rest = rest[2..].trim_start();
        let firsts = if rest.starts_with('{') {
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(rest.len(), |(e, _)| e);
            use_paths(&rest[1..end]).into_iter().filter_map(|p| p.into_iter().next()).collect()
        } else {
            vec![rest.chars().take_while(|c| is_ident(*c)).collect()]
        };
        found.push((at, firsts));
    }
    found
}

/// The import graph of a crate's top-level modules, from its `src/` files (`(path relative to
/// src, text)`). `foo.rs` and everything under `foo/` are module `foo`; `lib.rs` and
/// `main.rs` are the root, read only for what it re-exports (`pub use foo::Bar` makes
/// `crate::Bar` an import of `foo`); `bin/` holds other crate roots and is skipped. Comments,
/// literals and `#[cfg(test)]` items don't count. (`super::` paths out of a top-level module
/// are not followed.)
fn module_graph(files: &[(String, String)]) -> ModuleGraph {
    let module_of = |path: &str| -> Option<String> {
        let first = path.split('/').next().unwrap_or(path);
        let root = matches!(path, "lib.rs" | "main.rs") || (first == "bin" && path.contains('/'));
        (!root).then(|| first.trim_end_matches(".rs").to_owned())
    };
    let mut cleaned = Vec::new();
    let mut test_only: Vec<String> = Vec::new();
    for (path, text) in files {
        let mut code = code_only(text);
        let (test_modules, whole) = drop_test_items(&mut code);
        if whole {
            test_only.push(path.clone());
        }
        // Where `path`'s child modules live: beside a `mod.rs`/`lib.rs`/`main.rs`, else in a
        // folder named after the file.
        let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
        let children = match file {
            "mod.rs" | "lib.rs" | "main.rs" => dir.to_owned(),
            _ => [dir, file.trim_end_matches(".rs")]
                .iter()
                .filter(|p| !p.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join("/"),
        };
        for m in test_modules {
            let m = if children.is_empty() { m } else { format!("{children}/{m}") };
            test_only.push(format!("{m}.rs"));
            test_only.push(format!("{m}/"));
        }
        cleaned.push((path.as_str(), code));
    }
    let counted =
        |path: &str| !test_only.iter().any(|t| path == t || (t.ends_with('/') && path.starts_with(t.as_str())));
    let modules: BTreeSet<String> = files.iter().filter_map(|(p, _)| module_of(p)).collect();
    // What the root re-exports: name → the module it comes from.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    for (_, code) in cleaned.iter().filter(|(p, _)| counted(p) && module_of(p).is_none()) {
        let text: String = code.iter().collect();
        for (k, _) in text.match_indices("use") {
            let before = text[..k].chars().next_back();
            let after = text[k + 3..].chars().next();
            if before.is_some_and(is_ident) || !after.is_some_and(char::is_whitespace) {
                continue;
            }
            let tree = text[k + 3..].split(';').next().unwrap_or_default();
            for path in use_paths(tree) {
                let path: Vec<&String> = path.iter().skip_while(|s| *s == "crate" || *s == "self").collect();
                if let (Some(first), Some(leaf)) = (path.first(), path.last())
                    && path.len() > 1
                    && modules.contains(*first)
                    && !matches!(leaf.as_str(), "*" | "self")
                {
                    reexports.insert((*leaf).clone(), (*first).clone());
                }
            }
        }
    }
    let mut graph = ModuleGraph::new();
    for (path, code) in cleaned.iter().filter(|(p, _)| counted(p)) {
        let Some(module) = module_of(path) else { continue };
        let imports = graph.entry(module.clone()).or_default();
        for (at, names) in crate_paths(code) {
            let line = code[..at].iter().filter(|c| **c == '\n').count() + 1;
            for name in names {
                let target = if modules.contains(&name) { Some(&name) } else { reexports.get(&name) };
                if let Some(target) = target.filter(|t| **t != module) {
                    imports.entry(target.clone()).or_insert_with(|| format!("{path}:{line}"));
                }
            }
        }
    }
    graph
}

/// Each circle in `graph`, one line per group of modules that reach each other: the shortest
/// circle through the group's first module, with where each import is, and the whole group.
fn circles(graph: &ModuleGraph) -> Vec<String> {
    let reach = |from: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            for next in graph.get(m).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.as_str()) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|m| (m.as_str(), reach(m))).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut found = Vec::new();
    for (&first, from_first) in &reached {
        let group: BTreeSet<&str> = from_first
            .iter()
            .copied()
            .filter(|m| reached.get(m).is_some_and(|r| r.contains(first)))
            .chain([first])
            .collect();
        if group.len() < 2 || !done.insert(first) {
            continue;
        }
        done.extend(group.iter().copied());
        // Shortest way back to `first`, inside the group.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([first]);
        'search: while let Some(m) = queue.pop_front() {
            for next in graph[m].keys().map(String::as_str).filter(|n| group.contains(n)) {
                if next == first {
                    came_from.insert(first, m);
                    break 'search;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next, m);
                    queue.push_back(next);
                }
            }
        }
        let mut path = vec![first];
        let mut at = came_from[first];
        while at != first {
            path.push(at);
            at = came_from[at];
        }
        path.push(first);
        path.reverse();
        let wheres: Vec<&str> = path.windows(2).map(|w| graph[w[0]][w[1]].as_str()).collect();
        let all: Vec<&str> = group.into_iter().collect();
        found.push(format!("{} ({}); the circle holds {}", path.join(" → "), wheres.join(", "), all.join(", ")));
    }
    found
}

#[test]
fn module_imports_have_no_circles() {
    let root = workspace_root();
    let mut wrong = Vec::new();
    let crates = workspace_crates();
    for (name, dir) in &crates {
        let found = circles(&module_graph(&rust_files(&root.join(dir).join("src"))));
        let exempt = STILL_CIRCULAR.contains(&name.as_str());
        match (exempt, found.is_empty()) {
            (false, false) => wrong.extend(found.iter().map(|c| format!("{}: {c}", dir.display()))),
            (true, true) => wrong.push(format!(
                "{}: {name} has no module circle any more; take it out of STILL_CIRCULAR",
                dir.display()
            )),
            _ => {}
        }
    }
    for name in STILL_CIRCULAR {
        if !crates.iter().any(|(n, _)| n == name) {
            wrong.push(format!("STILL_CIRCULAR names {name}, which is not a workspace crate"));
        }
    }
    assert!(
        wrong.is_empty(),
        "top-level modules import each other in circles (move the shared type down, docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_module_circle_is_found_and_named() {
    let files: Vec<(String, String)> = [
        ("lib.rs", "mod a; mod b; mod c; mod d;\npub use c::{Z as Zed, inner::*};\n"),
        ("a.rs", "//! Uses crate::c only in docs.\nuse crate::b::X;\nconst S: &str = \"crate::c\";\n"),
        ("b/mod.rs", "mod inner;\n#[cfg(test)]\nmod tests;\n"),
        ("b/inner.rs", "use crate::{\n    a::{self, Y},\n    c::Z,\n};\nfn f<'a>(x: &'a str) -> char { '\"' }\n"),
        ("b/tests.rs", "use crate::d;\n"),
        ("c.rs", "/* crate::a /* nested */ crate::b */ pub struct Z;\nlet r = r#\"crate::d\"#;\n"),
        ("d.rs", "use crate::Zed;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n#[cfg(test)]\nuse crate::b;\n"),
    ]
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .to_vec();
    let graph = module_graph(&files);
    let edges: Vec<String> =
        graph.iter().flat_map(|(m, to)| to.iter().map(move |(t, at)| format!("{m} → {t} at {at}"))).collect();
    assert_eq!(edges, ["a → b at a.rs:2", "b → a at b/inner.rs:1", "b → c at b/inner.rs:1", "d → c at d.rs:1"]);
    assert_eq!(circles(&graph), ["a → b → a (a.rs:2, b/inner.rs:1); the circle holds a, b"]);
}

/// What belongs to one agent (the ReAct agent) and must stay behind the `ChatAgent` interface:
/// its module path and its types.
const AGENT_INTERNALS: [&str; 8] = [
    "toolgraph_agents::react",
    "toolgraph_agents::kit",
    "ReactNode",
    "ApprovalRequest",
    "AgentState",
    "AgentUpdate",
    "AgentDeps",
    "user_turn",
];

/// The crates that serve and store every agent alike.
const AGENT_NEUTRAL: [&str; 2] = ["toolgraph-server", "toolgraph-conversations"];

/// Where `code` (comments and literals blanked) names one of [`AGENT_INTERNALS`] as a whole
/// word: `(line, name)`.
fn agent_internals_named(code: &[char]) -> Vec<(usize, &'static str)> {
    let text: String = code.iter().collect();
    let mut found = Vec::new();
    for name in AGENT_INTERNALS {
        for (at, _) in text.match_indices(name) {
            let before = text[..at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
                continue;
            }
            found.push((text[..at].matches('\n').count() + 1, name));
        }
    }
    found.sort();
    found
}

#[test]
fn the_service_and_the_stores_know_no_agent_internals() {
    let root = workspace_root();
    let mut named = Vec::new();
    for (name, dir) in workspace_crates().into_iter().filter(|(n, _)| AGENT_NEUTRAL.contains(&n.as_str())) {
        let src = root.join(&dir).join("src");
        for (file, text) in rust_files(&src) {
            for (line, what) in agent_internals_named(&code_only(&text)) {
                named.push(format!("{name}: src/{file}:{line} names {what}"));
            }
        }
    }
    assert!(named.is_empty(), "the service and the stores run agents through ChatAgent only:\n{}", named.join("\n"));
}

#[test]
fn an_agent_internal_named_in_code_is_found_and_a_comment_is_not() {
    let code = code_only(
        "use toolgraph_agents::chat_agent::ChatAgent;\n// ReactNode in a comment\nfn f(s: &AgentState) {}\nlet ReactNodes = 1;\n",
    );
    assert_eq!(agent_internals_named(&code), vec![(3, "AgentState")]);
}
