//! Templates of declared graphs: text with `{{name}}` and `{{name.field}}` placeholders, filled
//! from the state — a channel, the turn's `context`, or one of the [`BUILTINS`]. Parsed once
//! when the graph loads, so a placeholder that names nothing is an error then, not an empty
//! string in a prompt later.

use serde_json::Value;

/// The names every template may use besides the graph's channels.
pub const BUILTINS: [&str; 8] = [
    "last_user_message",
    "recent_user_messages",
    "question_in_context",
    "context",
    "tool_failures",
    "last_tool_error",
    "agent",
    "system_prompt",
];

/// A parsed template.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    /// A path: the root name, then fields.
    Value(Vec<String>),
}

/// A template that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

impl Template {
    /// Parses `text`.
    ///
    /// # Errors
    /// An unclosed `{{`, or a placeholder that is not a dotted name.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(TemplateError(format!("`{{{{` without its `}}}}`: {}", snippet(&rest[open..]))));
            };
            let path: Vec<String> = after[..close].trim().split('.').map(str::to_owned).collect();
            let valid =
                |p: &String| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !path.iter().all(valid) {
                return Err(TemplateError(format!(
                    "`{{{{{}}}}}` is not a name: use {{{{channel}}}} or {{{{channel.field}}}}",
                    after[..close].trim()
                )));
            }
            parts.push(Part::Value(path));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self { parts })
    }

    /// The root names its placeholders read (`{{a.b}}` reads `a`).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Value(path) => path.first().map(String::as_str),
            Part::Text(_) => None,
        })
    }

    /// The text with each placeholder filled by `lookup` of its root name, then its fields: a
    /// string as it is, nothing for a missing value, anything else as JSON.
    pub fn render(&self, lookup: impl Fn(&str) -> Option<Value>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Value(path) => {
                    let Some((root, fields)) = path.split_first() else { continue };
                    let Some(value) = lookup(root) else { continue };
                    match fields.iter().try_fold(&value, |v, f| field(v, f)) {
                        None | Some(Value::Null) => {}
                        Some(Value::String(s)) => out.push_str(s),
                        Some(other) => out.push_str(&other.to_string()),
                    }
                }
            }
        }
        out
    }
}

impl Template {
    /// The value of a template that is exactly one placeholder (`"{{selected}}"`), as it is;
    /// `None` for any other template or a missing value.
    pub fn only_value(&self, lookup: impl Fn(&str) -> Option<Value>) -> Option<Value> {
        let [Part::Value(path)] = self.parts.as_slice() else { return None };
        let (root, fields) = path.split_first()?;
        let value = lookup(root)?;
        fields.iter().try_fold(&value, |v, f| field(v, f)).filter(|v| !v.is_null()).cloned()
    }
}

/// A field of an object, or an item of a list by its index (`{{passages.results.0.content}}`).
pub(crate) fn field<'a>(v: &'a Value, f: &str) -> Option<&'a Value> {
    match v {
        Value::Array(items) => items.get(f.parse::<usize>().ok()?),
        other => other.get(f),
    }
}

fn snippet(text: &str) -> String {
    text.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_fill_from_the_state_and_name_what_they_read() {
        let t = Template::parse("Hola {{ context.user }}: {{topic}} / {{n}} / {{missing}}.").unwrap();
        assert_eq!(t.names().collect::<Vec<_>>(), ["context", "topic", "n", "missing"]);
        let state = json!({"context": {"user": "Ana"}, "topic": "exam", "n": {"a": 1}});
        assert_eq!(t.render(|name| state.get(name).cloned()), "Hola Ana: exam / {\"a\":1} / .");
        let list = json!({"found": {"results": [{"content": "first"}, {"content": "second"}]}, "ids": [1, 2]});
        let t = Template::parse("{{found.results.1.content}}").unwrap();
        assert_eq!(t.render(|name| list.get(name).cloned()), "second");
        assert_eq!(t.only_value(|name| list.get(name).cloned()), Some(json!("second")));
        let ids = Template::parse("{{ids}}").unwrap();
        assert_eq!(
            ids.only_value(|name| list.get(name).cloned()),
            Some(json!([1, 2])),
            "one placeholder keeps its type"
        );
        assert_eq!(Template::parse("ids: {{ids}}").unwrap().only_value(|name| list.get(name).cloned()), None);
        // Single braces are text: prompts may hold JSON examples.
        let json_prompt = Template::parse("Answer as {\"label\": \"…\"}").unwrap();
        assert_eq!(json_prompt.render(|_| None), "Answer as {\"label\": \"…\"}");
    }

    #[test]
    fn a_broken_placeholder_is_an_error_that_shows_it() {
        let err = Template::parse("Hi {{name").unwrap_err().to_string();
        assert!(err.contains("without its") && err.contains("{{name"), "{err}");
        let err = Template::parse("Hi {{ two words }}").unwrap_err().to_string();
        assert!(err.contains("two words") && err.contains("not a name"), "{err}");
    }
}
