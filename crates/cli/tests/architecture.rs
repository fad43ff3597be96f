//! The crate layering, as `cargo metadata` sees it: every workspace crate depends only on the
//! workspace crates its row of the table in `docs/architecture.md` allows, and that table keeps
//! the rules the layering exists for (nothing depends on the binary, the bottom crates depend
//! on nothing, the graph runtime knows no model or tool, …).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each workspace crate's workspace dependencies: `(normal and build, dev)`.
type Dependencies = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

fn workspace_dependencies() -> Dependencies {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
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
    for bottom in ["toolgraph-tools", "toolgraph-llm", "toolgraph-embed"] {
        assert!(table.get(bottom).is_some_and(BTreeSet::is_empty), "{bottom} must depend on no workspace crate");
    }
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
