//! Describe templates: the action a person approves, written by whoever declares a write tool
//! (a plugin's `describe`, a backend tool's `describe`) and filled from the call's arguments —
//! "Send an SMS to {#recipients} recipients: {message}" → "Send an SMS to 3 recipients: …".
//!
//! `{name}` is the argument: a string as it is, a list of strings joined by ", ", anything
//! else as JSON, nothing when absent. `{#name}` is how many items a list (or characters a
//! string) has.

use serde_json::Value;

/// The argument names a template's placeholders use (`{name}` and `{#name}` both give `name`),
/// for checking them against the tool's parameters when it is declared.
pub fn placeholders(template: &str) -> impl Iterator<Item = &str> {
    template
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.strip_prefix('#').unwrap_or(name)))
}

/// `template` with its placeholders filled from `arguments`.
pub fn fill_describe(template: &str, arguments: &Value) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else { break };
        out.push_str(&rest[..open]);
        let name = &rest[open + 1..close];
        match name.strip_prefix('#') {
            Some(name) => out.push_str(&count(arguments.get(name)).to_string()),
            None => out.push_str(&text(arguments.get(name))),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")
        }
        Some(other) => other.to_string(),
    }
}

fn count(value: Option<&Value>) -> usize {
    match value {
        Some(Value::Array(items)) => items.len(),
        Some(Value::String(s)) => s.chars().count(),
        Some(Value::Object(m)) => m.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_fill_from_the_arguments() {
        let args = json!({"recipients": ["Ana", "Luis", "Mai"], "message": "Clase a las 5", "n": 3, "o": {"a": 1}});
        assert_eq!(
            fill_describe("Send an SMS to {#recipients} recipients ({recipients}): {message}", &args),
            "Send an SMS to 3 recipients (Ana, Luis, Mai): Clase a las 5"
        );
        assert_eq!(fill_describe("{n} · {o} · {missing}|", &args), "3 · {\"a\":1} · |");
        assert_eq!(fill_describe("no placeholders", &args), "no placeholders");
        assert_eq!(fill_describe("an { unclosed", &args), "an { unclosed");
        assert_eq!(placeholders("{#recipients} to {message} {x").collect::<Vec<_>>(), ["recipients", "message"]);
    }
}
