//! Helpers shared by the plugin tests: load plugin folders into a registry, call a tool.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::Value;
use std::path::PathBuf;
use toolgraph_plugins::load;
use toolgraph_tools::{ToolContext, ToolErrorKind, ToolRegistry};

/// The tools of the plugins under `dirs`, which must all load.
pub fn registry(dirs: &[PathBuf]) -> ToolRegistry {
    let loaded = load(dirs, "en");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let mut reg = ToolRegistry::new();
    for tool in loaded.plugins.into_iter().flat_map(|p| p.tools) {
        reg.register(tool).unwrap();
    }
    reg
}

/// Calls `name` with no context: its value, or its failure's kind and message.
pub async fn call(reg: &ToolRegistry, name: &str, args: Value) -> Result<Value, (ToolErrorKind, String)> {
    let outcome = reg.call(&ToolContext::default(), name, &args).await;
    match outcome.error() {
        Some(e) => Err((e.kind, e.message.clone())),
        None => Ok(outcome.to_json()),
    }
}
