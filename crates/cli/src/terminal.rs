//! What a chat shows on the terminal and asks there, for both `chat` and `chat --url`: tool
//! calls and their outcomes on stderr (stdout stays the reply), and a person's approval of a
//! pending action.

use serde_json::Value;
use std::io::{IsTerminal, Write};
use tokio::sync::mpsc;

/// A tool call as the terminal shows it (stderr, so stdout stays the reply).
pub(crate) fn show_tool_call(name: &str, arguments: &Value) {
    eprintln!("  → {name} {arguments}");
}

/// A tool's outcome, shortened to 300 characters.
pub(crate) fn show_tool_result(name: &str, ok: bool, outcome: &Value) {
    let short: String = outcome.to_string().chars().take(300).collect();
    eprintln!("  ← {name} {}: {short}", if ok { "ok" } else { "failed" });
}

/// Puts a pending action's `description` to the user; `None` if the input ended first.
/// Scripted answers (a pipe) are echoed, so the output reads as a dialogue.
pub(crate) async fn ask_approval(description: &str, lines: &mut mpsc::Receiver<String>) -> Option<bool> {
    eprint!("approval needed: {description}\napprove? [y/N] ");
    let _ = std::io::stderr().flush();
    let answer = lines.recv().await?;
    if !std::io::stdin().is_terminal() {
        eprintln!("{answer}");
    }
    Some(is_yes(&answer))
}

/// Puts an agent's question to the person (with its choices, for an `enum` form) and reads
/// their answer: free text as a string; for a form, JSON when the line is JSON, else the text;
/// `None` if the input ended. An empty line declines the question.
pub(crate) async fn ask_question(
    question: &str,
    form: Option<&serde_json::Value>,
    lines: &mut mpsc::Receiver<String>,
) -> Option<Option<serde_json::Value>> {
    let choices = form.and_then(|f| f.get("enum")).and_then(serde_json::Value::as_array);
    match choices {
        Some(c) => {
            let named: Vec<String> =
                c.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect();
            eprint!(
                "the agent asks: {question}
[{}] (empty: skip) ",
                named.join(" / ")
            );
        }
        None => eprint!(
            "the agent asks: {question}
(empty: skip) "
        ),
    }
    let _ = std::io::stderr().flush();
    let line = lines.recv().await?;
    if !std::io::stdin().is_terminal() {
        eprintln!("{line}");
    }
    let line = line.trim();
    if line.is_empty() {
        return Some(None);
    }
    let text = serde_json::Value::String(line.to_owned());
    // A form takes the line as JSON when that fits it (`2`, `true`, `{"…": …}`), else as text.
    let json = form.filter(|f| !f.is_null()).and_then(|f| {
        serde_json::from_str(line).ok().filter(|v| toolgraph_agents::chat_agent::check_answer(Some(f), v).is_ok())
    });
    Some(Some(json.unwrap_or(text)))
}

/// A yes in English or Spanish; anything else is a no.
fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_lowercase().as_str(), "y" | "yes" | "s" | "si" | "sí")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clear_yeses_approve() {
        for yes in ["y", "Y", "yes", " sí ", "SI"] {
            assert!(is_yes(yes), "{yes}");
        }
        for no in ["", "n", "no", "yes please", "maybe"] {
            assert!(!is_yes(no), "{no}");
        }
    }
}
