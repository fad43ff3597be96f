//! Tool calls written as text, for models that do not return structured calls: local GGUF
//! models (Qwen2.5 writes `<tool_call>{…}</tool_call>`, or a fenced ```` ```json ```` block, or a
//! bare `{"name": …, "arguments": …}`) and servers that pass such text through.
//!
//! [`ToolCallTextParser`] consumes the reply as it streams and emits prose as soon as it is
//! clear it is prose, holding back anything that might still become a tool call — a tool call
//! must never reach the user as `token` events. A fenced or bare JSON block that turns out not
//! to be a call is released as the text it was.

use serde_json::Value;
use serde_json::value::RawValue;

const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";
const FENCE: &str = "```";

/// What the parser recognised.
#[derive(Debug, Clone, PartialEq)]
pub enum TextEvent {
    /// Prose, safe to show.
    Text(String),
    /// A complete tool call: its name and the arguments as JSON text.
    ToolCall {
        /// Tool name.
        name: String,
        /// Arguments, a JSON object as text.
        arguments: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet (since the start or the last call): a call may begin.
    Start,
    /// Showing prose; markers mid-text are still watched for.
    Prose,
    /// Inside `<tool_call>` … `</tool_call>`.
    Tagged,
    /// Inside a ```` ``` ```` fence that may hold a call.
    Fenced,
    /// Inside a bare JSON object that started the reply.
    Bare,
}

/// Streaming recogniser of tool calls in model text.
#[derive(Debug)]
pub struct ToolCallTextParser {
    mode: Mode,
    /// Text not yet decided on.
    pending: String,
}

impl Default for ToolCallTextParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolCallTextParser {
    /// A parser at the start of a reply.
    pub fn new() -> Self {
        Self { mode: Mode::Start, pending: String::new() }
    }

    /// Feeds the next piece of the reply; returns what is decided so far.
    pub fn push(&mut self, piece: &str) -> Vec<TextEvent> {
        self.pending.push_str(piece);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        merge_text(out)
    }

    /// The reply ended: decides everything still held.
    pub fn finish(&mut self) -> Vec<TextEvent> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            match self.mode {
                // An unterminated block: a call if its JSON is complete, else the text it was.
                Mode::Tagged => {
                    let body = rest.trim_start().strip_prefix(OPEN_TAG).unwrap_or(&rest);
                    match parse_call(body) {
                        Some(call) => out.push(call),
                        None => out.push(TextEvent::Text(rest)),
                    }
                }
                Mode::Fenced | Mode::Bare => match parse_call(strip_fence(&rest)) {
                    Some(call) => out.push(call),
                    None => out.push(TextEvent::Text(rest)),
                },
                Mode::Start => {
                    if !rest.trim().is_empty() {
                        out.push(TextEvent::Text(rest));
                    }
                }
                Mode::Prose => out.push(TextEvent::Text(rest)),
            }
        }
        self.mode = Mode::Start;
        merge_text(out)
    }

    /// One decision; `true` when another may follow.
    fn step(&mut self, out: &mut Vec<TextEvent>, at_end: bool) -> bool {
        match self.mode {
            Mode::Start => {
                let trimmed = self.pending.trim_start();
                if trimmed.is_empty() {
                    return false;
                }
                if trimmed.starts_with(OPEN_TAG) {
                    self.mode = Mode::Tagged;
                } else if trimmed.starts_with(FENCE) {
                    self.mode = Mode::Fenced;
                } else if trimmed.starts_with('{') {
                    self.mode = Mode::Bare;
                } else if !at_end && (OPEN_TAG.starts_with(trimmed) || FENCE.starts_with(trimmed)) {
                    return false; // could still become a marker
                } else {
                    self.mode = Mode::Prose;
                }
                true
            }
            Mode::Prose => {
                let marker = [OPEN_TAG, FENCE].iter().filter_map(|m| self.pending.find(m).map(|i| (i, *m))).min();
                if let Some((i, m)) = marker {
                    if i > 0 {
                        out.push(TextEvent::Text(self.pending[..i].to_owned()));
                        self.pending.drain(..i);
                    }
                    self.mode = if m == OPEN_TAG { Mode::Tagged } else { Mode::Fenced };
                    return true;
                }
                // Emit all but a tail that could be the start of a marker.
                let hold = if at_end { 0 } else { partial_marker_len(&self.pending) };
                let cut = self.pending.len() - hold;
                if cut > 0 {
                    out.push(TextEvent::Text(self.pending[..cut].to_owned()));
                    self.pending.drain(..cut);
                }
                false
            }
            Mode::Tagged => {
                let Some(open) = self.pending.find(OPEN_TAG) else { return false };
                let body_start = open + OPEN_TAG.len();
                let Some(close) = self.pending[body_start..].find(CLOSE_TAG) else { return false };
                let body = &self.pending[body_start..body_start + close];
                let end = body_start + close + CLOSE_TAG.len();
                match parse_call(body) {
                    Some(call) => out.push(call),
                    // A tag around something that is not a call: show it rather than lose it.
                    None => out.push(TextEvent::Text(self.pending[..end].to_owned())),
                }
                self.pending.drain(..end);
                self.mode = Mode::Start;
                true
            }
            Mode::Fenced => {
                let Some(open) = self.pending.find(FENCE) else { return false };
                let after = &self.pending[open + FENCE.len()..];
                let Some(newline) = after.find('\n') else { return false };
                let language = after[..newline].trim().to_ascii_lowercase();
                if !matches!(language.as_str(), "" | "json" | "tool_call" | "tool") {
                    // A code block in another language is prose.
                    self.mode = Mode::Prose;
                    let fence_end = open + FENCE.len() + newline + 1;
                    out.push(TextEvent::Text(self.pending[..fence_end].to_owned()));
                    self.pending.drain(..fence_end);
                    return true;
                }
                let body_start = open + FENCE.len() + newline + 1;
                let Some(close) = self.pending[body_start..].find(FENCE) else { return false };
                self.decide_block(body_start..body_start + close, body_start + close + FENCE.len(), out);
                true
            }
            Mode::Bare => {
                let start = self.pending.find('{').unwrap_or(0);
                let Some(len) = balanced_object_len(&self.pending[start..]) else { return false };
                self.decide_block(start..start + len, start + len, out);
                true
            }
        }
    }

    /// A complete fenced or bare block: a call if `body` is one (a new call may follow), else
    /// the block's text up to `end` as prose.
    fn decide_block(&mut self, body: std::ops::Range<usize>, end: usize, out: &mut Vec<TextEvent>) {
        match parse_call(&self.pending[body]) {
            Some(call) => {
                out.push(call);
                self.mode = Mode::Start;
            }
            None => {
                out.push(TextEvent::Text(self.pending[..end].to_owned()));
                self.mode = Mode::Prose;
            }
        }
        self.pending.drain(..end);
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of a marker.
fn partial_marker_len(text: &str) -> usize {
    let mut best = 0;
    for marker in [OPEN_TAG, FENCE] {
        for len in (1..marker.len()).rev() {
            if len <= best {
                break;
            }
            if text.ends_with(&marker[..len]) {
                best = len;
                break;
            }
        }
    }
    best
}

/// Byte length of the JSON object `text` starts with, once its braces balance.
fn balanced_object_len(text: &str) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix(FENCE) else { return t };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.trim_end().strip_suffix(FENCE).unwrap_or(rest)
}

/// `{"name": …, "arguments": {…} | "…json…"}` (or `parameters`) → a call.
///
/// An arguments object keeps the exact text the model wrote (its key order and spacing), so
/// the call rendered back into a later prompt reads as the model wrote it — what a local
/// model's cache of computed tokens can then reuse — and as OpenAI-compatible servers return
/// arguments, as text.
fn parse_call(body: &str) -> Option<TextEvent> {
    // Each member as written; a repeated key keeps its last value, as a parsed object would.
    let members: std::collections::HashMap<String, &RawValue> = serde_json::from_str(body.trim()).ok()?;
    let name: String = serde_json::from_str(members.get("name")?.get()).ok()?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match members.get("arguments").or_else(|| members.get("parameters")).map(|raw| raw.get()) {
        None | Some("null") => "{}".to_owned(),
        // A JSON object (the raw value is valid JSON), kept as written.
        Some(raw) if raw.starts_with('{') => raw.to_owned(),
        Some(raw) if raw.starts_with('"') => {
            let text: String = serde_json::from_str(raw).ok()?;
            match serde_json::from_str::<Value>(&text) {
                Ok(inner @ Value::Object(_)) => inner.to_string(),
                _ => return None,
            }
        }
        Some(_) => return None,
    };
    Some(TextEvent::ToolCall { name: name.to_owned(), arguments })
}

fn merge_text(events: Vec<TextEvent>) -> Vec<TextEvent> {
    let mut out: Vec<TextEvent> = Vec::with_capacity(events.len());
    for e in events {
        match (out.last_mut(), e) {
            (_, TextEvent::Text(t)) if t.is_empty() => {}
            (Some(TextEvent::Text(prev)), TextEvent::Text(t)) => prev.push_str(&t),
            (_, e) => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `size` bytes (on char boundaries) and collects everything.
    fn run(text: &str, size: usize) -> Vec<TextEvent> {
        let mut p = ToolCallTextParser::new();
        let mut out = Vec::new();
        let mut piece = String::new();
        for c in text.chars() {
            piece.push(c);
            if piece.len() >= size {
                out.extend(p.push(&piece));
                piece.clear();
            }
        }
        out.extend(p.push(&piece));
        out.extend(p.finish());
        merge_text(out)
    }

    fn call(name: &str, args: &str) -> TextEvent {
        TextEvent::ToolCall { name: name.into(), arguments: args.into() }
    }

    fn text(t: &str) -> TextEvent {
        TextEvent::Text(t.into())
    }

    #[test]
    fn every_call_form_is_recognised_whatever_the_chunking() {
        let cases = [
            "<tool_call>\n{\"name\": \"rag_search\", \"arguments\": {\"query\": \"examen\"}}\n</tool_call>",
            "```json\n{\"name\": \"rag_search\", \"arguments\": {\"query\": \"examen\"}}\n```",
            "```\n{\"name\": \"rag_search\", \"arguments\": {\"query\": \"examen\"}}\n```",
            "{\"name\": \"rag_search\", \"arguments\": {\"query\": \"examen\"}}",
            "  \n{\"name\": \"rag_search\", \"parameters\": \"{\\\"query\\\": \\\"examen\\\"}\"}",
        ];
        for case in cases {
            // An object keeps the text the model wrote; arguments given as a string of JSON
            // are read and written anew.
            let arguments = if case.contains(r#"": "{"#) { r#"{"query":"examen"}"# } else { r#"{"query": "examen"}"# };
            for size in [1, 2, 3, 7, 1000] {
                assert_eq!(run(case, size), [call("rag_search", arguments)], "{case:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn nothing_of_a_call_leaks_as_text_before_it_is_decided() {
        let reply = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call>";
        let mut p = ToolCallTextParser::new();
        for c in reply.chars() {
            let events = p.push(&c.to_string());
            assert!(events.iter().all(|e| matches!(e, TextEvent::ToolCall { .. })), "leaked {events:?}");
        }
        assert!(p.finish().is_empty());
    }

    #[test]
    fn prose_streams_promptly_and_a_call_after_prose_is_still_caught() {
        let mut p = ToolCallTextParser::new();
        assert_eq!(p.push("Hola, "), [text("Hola, ")]);
        // "<tool" could be the start of a tag: held back.
        assert_eq!(p.push("te ayudo. <tool"), [text("te ayudo. ")]);
        assert_eq!(p.push("_call>{\"name\": \"note_list\", \"arguments\": {}}</tool_call>"), [call("note_list", "{}")]);
        assert!(p.finish().is_empty());
        // A "<" that turns out to be prose is released.
        assert_eq!(run("a < b and x<y", 1), [text("a < b and x<y")]);
    }

    #[test]
    fn json_that_is_not_a_call_and_other_code_stay_text() {
        let code = "Here:\n```python\nprint('hi')\n```\nDone.";
        assert_eq!(run(code, 3), [text(code)]);
        let data = "```json\n{\"total\": 3}\n```";
        assert_eq!(run(data, 4), [text(data)]);
        let bare = "{\"total\": 3} is the answer";
        assert_eq!(run(bare, 5), [text(bare)]);
        assert_eq!(run("   ", 1), []);
    }

    #[test]
    fn several_calls_and_broken_endings() {
        let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>";
        assert_eq!(run(two, 6), [call("a", "{}"), call("b", r#"{"x": 1}"#)]);
        // The model stopped before the closing tag, JSON complete: still a call.
        assert_eq!(run("<tool_call>{\"name\": \"a\", \"arguments\": {}}", 4), [call("a", "{}")]);
        // Truncated JSON: shown as text, not lost and not executed.
        let cut = "<tool_call>{\"name\": \"a\", \"argu";
        assert_eq!(run(cut, 4), [text(cut)]);
        // A brace inside a string does not end the object early.
        assert_eq!(
            run("{\"name\": \"calculator\", \"arguments\": {\"expression\": \"{1}\"}}", 2),
            [call("calculator", r#"{"expression": "{1}"}"#)]
        );
    }

    #[test]
    fn arguments_keep_the_order_and_spacing_the_model_wrote() {
        let reply = "<tool_call>\n{\"name\": \"rag_search\", \"arguments\": {\"top_k\": 1, \"query\": \"l'examen\"}}\n</tool_call>";
        assert_eq!(run(reply, 3), [call("rag_search", r#"{"top_k": 1, "query": "l'examen"}"#)]);
        // A repeated key: the last one, as the parsed value has it.
        let twice = "{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"arguments\": {\"x\": 2}}";
        assert_eq!(run(twice, 1000), [call("a", r#"{"x": 2}"#)]);
    }
}
