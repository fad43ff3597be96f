//! Values a tool call may draw on that the model does not choose.
//!
//! State-injected arguments (the course tutor's `asignatura` comes from graph state) are filled from
//! [`ToolContext::state`] at call time, after the model's own arguments were validated. The
//! results of the tools called earlier in the same turn ([`ToolContext::turn_result`]) let a tool
//! default an argument to what another returned (the articles a search found), so a model need
//! not copy them into its call.

use serde_json::{Map, Value};
use std::sync::Arc;

/// Per-call context handed to every tool: state values for injected arguments, and the results
/// of the tools called earlier in the turn.
///
/// Cheap to clone (both are shared).
#[derive(Debug, Clone, Default)]
pub struct ToolContext {
    state: Arc<Map<String, Value>>,
    /// Name and text of each earlier result, as the tool messages hold them; read as JSON only
    /// when a tool asks, so a turn whose tools never do parses nothing.
    turn: Arc<Vec<(String, String)>>,
}

impl ToolContext {
    /// A context with the given state values.
    pub fn with_state(state: Map<String, Value>) -> Self {
        Self { state: Arc::new(state), turn: Arc::default() }
    }

    /// The same context with `results`: the tools called earlier in this turn, oldest first,
    /// each by name with the text of its result as the model read it (a failure's
    /// `{"ok": false, …}` included).
    #[must_use]
    pub fn with_turn_results(mut self, results: Vec<(String, String)>) -> Self {
        self.turn = Arc::new(results);
        self
    }

    /// What `tool` returned the last time it was called in this turn, if it was: its JSON, or
    /// the text itself for a result that is not JSON.
    pub fn turn_result(&self, tool: &str) -> Option<Value> {
        let (_, text) = self.turn.iter().rev().find(|(name, _)| name == tool)?;
        Some(serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())))
    }

    /// Adds or replaces one state value.
    #[must_use]
    pub fn set(mut self, key: impl Into<String>, value: Value) -> Self {
        Arc::make_mut(&mut self.state).insert(key.into(), value);
        self
    }

    /// A state value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.state.get(key)
    }

    /// A state value that is a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.state.get(key).and_then(Value::as_str)
    }

    /// All state values.
    pub fn state(&self) -> &Map<String, Value> {
        &self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_latest_result_of_a_tool_in_the_turn_is_found() {
        let ctx = ToolContext::default().with_turn_results(vec![
            ("search".into(), "[1]".into()),
            ("calculator".into(), "4".into()),
            ("search".into(), "[2]".into()),
            ("notes".into(), "plain text".into()),
        ]);
        assert_eq!(ctx.turn_result("search"), Some(json!([2])));
        assert_eq!(ctx.turn_result("calculator"), Some(json!(4)));
        assert_eq!(ctx.turn_result("notes"), Some(json!("plain text")), "a text result is its text");
        assert_eq!(ctx.turn_result("weather"), None);
        let with_state = ctx.clone().set("k", json!("v"));
        assert_eq!(with_state.turn_result("search"), Some(json!([2])), "setting state keeps the results");
    }
}
