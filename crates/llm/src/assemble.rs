//! Assembles streamed tool-call fragments into complete [`ToolCall`]s.
//!
//! Providers differ: OpenAI sends an `index` on every fragment and the id and name only on the
//! first; Gemini's OpenAI endpoint may omit `index` and send each call whole; some local
//! servers send no id at all. The assembler accepts all three.

use crate::types::ToolCall;

#[derive(Debug, Default)]
struct Partial {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Collects tool-call fragments by position.
#[derive(Debug, Default)]
pub struct ToolCallAssembler {
    calls: Vec<Partial>,
}

impl ToolCallAssembler {
    /// A new, empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one fragment and returns the position it was filed under. Without an `index`,
    /// a fragment carrying an id starts a new call and one without continues the last.
    pub fn push(&mut self, index: Option<usize>, id: Option<&str>, name: Option<&str>, arguments: &str) -> usize {
        let index = match index {
            Some(i) => i,
            None if id.is_some() || self.calls.is_empty() => self.calls.len(),
            None => self.calls.len() - 1,
        };
        if self.calls.len() <= index {
            self.calls.resize_with(index + 1, Partial::default);
        }
        let call = &mut self.calls[index];
        if let Some(id) = id.filter(|s| !s.is_empty()) {
            call.id.get_or_insert_with(|| id.to_owned());
        }
        if let Some(name) = name {
            // Most providers send the name once; a few repeat it on every fragment.
            if call.name != name {
                call.name.push_str(name);
            }
        }
        call.arguments.push_str(arguments);
        index
    }

    /// Whether any fragment arrived.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The complete calls in order; calls without a provider id get `call_<n>`.
    pub fn finish(self) -> Vec<ToolCall> {
        self.calls
            .into_iter()
            .enumerate()
            .filter(|(_, c)| !c.name.is_empty())
            .map(|(i, c)| ToolCall {
                id: c.id.unwrap_or_else(|| format!("call_{i}")),
                name: c.name,
                arguments: c.arguments,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_style_fragments_interleaved_across_two_calls() {
        let mut a = ToolCallAssembler::new();
        a.push(Some(0), Some("call_a"), Some("rag_search"), "");
        a.push(Some(1), Some("call_b"), Some("calculator"), "{\"expr");
        a.push(Some(0), None, None, "{\"query\":");
        a.push(Some(1), None, None, "ession\":\"1+1\"}");
        a.push(Some(0), None, None, "\"docker\"}");
        let calls = a.finish();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0],
            ToolCall { id: "call_a".into(), name: "rag_search".into(), arguments: "{\"query\":\"docker\"}".into() }
        );
        assert_eq!(calls[1].arguments, "{\"expression\":\"1+1\"}");
    }

    #[test]
    fn gemini_style_whole_calls_without_index_or_id() {
        let mut a = ToolCallAssembler::new();
        a.push(None, Some(""), Some("get_guia"), "{}");
        a.push(None, Some("x2"), Some("calculator"), "{\"expression\":\"2\"}");
        let calls = a.finish();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_0");
        assert_eq!(calls[1].id, "x2");
    }

    #[test]
    fn repeated_names_are_not_doubled() {
        let mut a = ToolCallAssembler::new();
        a.push(Some(0), Some("c"), Some("calculator"), "{");
        a.push(Some(0), None, Some("calculator"), "}");
        assert_eq!(a.finish()[0].name, "calculator");
    }
}
