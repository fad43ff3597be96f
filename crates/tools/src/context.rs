//! Values a tool call may draw on that the model does not choose.
//!
//! State-injected arguments (the course tutor's `asignatura` comes from graph state) are filled from
//! [`ToolContext::state`] at call time, after the model's own arguments were validated.

use serde_json::{Map, Value};
use std::sync::Arc;

/// Per-call context handed to every tool: state values for injected arguments.
///
/// Cheap to clone (the state is shared).
#[derive(Debug, Clone, Default)]
pub struct ToolContext {
    state: Arc<Map<String, Value>>,
}

impl ToolContext {
    /// A context with the given state values.
    pub fn with_state(state: Map<String, Value>) -> Self {
        Self { state: Arc::new(state) }
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
