//! The one result shape every tool call ends in (docs/tools.md).
//!
//! Success is the tool's own JSON value, untouched; failure is
//! `{"ok": false, "error": "<readable message>", "kind": "..."}` so a model can read it and
//! repair its call, and an API can show it without knowing the tool.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::fmt;

/// Why a tool call failed; serialized in snake case as the `kind` of a failure outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolErrorKind {
    /// The arguments did not match the tool's schema or could not be used.
    InvalidArguments,
    /// The tool did not finish within its time limit.
    Timeout,
    /// Something the tool depends on (a service, a file system) is unavailable.
    Unavailable,
    /// The tool, or the thing it looked for, does not exist.
    NotFound,
    /// The call was refused (rejected by a human, or not allowed).
    Denied,
    /// The tool failed in a way that is not the caller's fault (including a panic).
    Internal,
}

impl ToolErrorKind {
    /// The snake-case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArguments => "invalid_arguments",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::NotFound => "not_found",
            Self::Denied => "denied",
            Self::Internal => "internal",
        }
    }
}

impl fmt::Display for ToolErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call: what kind of failure, and a message written for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ToolError {
    /// The failure family.
    pub kind: ToolErrorKind,
    /// A readable message; it is shown to the model, so it says what to do differently.
    pub message: String,
}

impl ToolError {
    /// A failure of the given kind.
    pub fn new(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    /// Arguments that cannot be used.
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::InvalidArguments, message)
    }
    /// A dependency is down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Unavailable, message)
    }
    /// The thing asked for does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::NotFound, message)
    }
    /// The call is not allowed.
    pub fn denied(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Denied, message)
    }
    /// An internal failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Internal, message)
    }
    /// A time limit was hit.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::Timeout, message)
    }
}

/// The result of one tool call, as the model and the APIs see it.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// The tool's own JSON value.
    Success(Value),
    /// A readable failure.
    Failure(ToolError),
}

impl ToolOutcome {
    /// Whether the call succeeded. A tool with its own contract may report `{"ok": false}` inside a success
    /// value (its own shape); that is still a success here, because the tool ran.
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Success(_))
    }

    /// The failure, if any.
    pub fn error(&self) -> Option<&ToolError> {
        match self {
            Self::Failure(e) => Some(e),
            Self::Success(_) => None,
        }
    }

    /// The JSON value shown to the model (docs/tools.md).
    pub fn to_json(&self) -> Value {
        match self {
            Self::Success(v) => v.clone(),
            Self::Failure(e) => json!({ "ok": false, "error": e.message, "kind": e.kind }),
        }
    }

    /// The text of a tool message: strings are passed through, other values as compact JSON.
    pub fn to_model_text(&self) -> String {
        match self {
            Self::Success(Value::String(s)) => s.clone(),
            other => other.to_json().to_string(),
        }
    }
}

impl From<Result<Value, ToolError>> for ToolOutcome {
    fn from(r: Result<Value, ToolError>) -> Self {
        match r {
            Ok(v) => Self::Success(v),
            Err(e) => Self::Failure(e),
        }
    }
}

impl Serialize for ToolOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_serializes_to_the_spec_shape() {
        let o = ToolOutcome::Failure(ToolError::timeout("tool 'x' took longer than 1s"));
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            json!({"ok": false, "error": "tool 'x' took longer than 1s", "kind": "timeout"})
        );
    }

    #[test]
    fn success_is_the_tools_own_value() {
        let v = json!({"ok": true, "query": "q", "total_results": 0, "results": []});
        assert_eq!(ToolOutcome::Success(v.clone()).to_json(), v);
        assert_eq!(ToolOutcome::Success(json!("plain")).to_model_text(), "plain");
    }

    #[test]
    fn every_kind_has_its_wire_name() {
        for (k, s) in [
            (ToolErrorKind::InvalidArguments, "invalid_arguments"),
            (ToolErrorKind::Timeout, "timeout"),
            (ToolErrorKind::Unavailable, "unavailable"),
            (ToolErrorKind::NotFound, "not_found"),
            (ToolErrorKind::Denied, "denied"),
            (ToolErrorKind::Internal, "internal"),
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), json!(s));
            assert_eq!(k.as_str(), s);
        }
    }
}
