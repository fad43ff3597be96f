//! Turns that no longer fit an agent's history budget, summarised instead of dropped
//! (`older_turns = "summarise"`, docs/memory.md "Context that fits"): before a model call, the
//! whole turns that fell out of the window since the last summary are summarised by a model call,
//! together with that summary, into a new one. It is kept in the `history_summary` channel of the
//! state (checkpointed, shown with the state) as `{text, upto}` — `upto` is how many messages of
//! the log it covers — and the model reads it right after the system prompt.
//!
//! The window starts where a person's turn starts, so what is summarised is whole turns: a tool
//! call is never summarised apart from its result.

use super::spec::AgentDeps;
use super::state::{AgentState, ChannelWrite, Reducer};
use super::steps::call_report;
use serde::{Deserialize, Serialize};
use toolgraph_graph::RunContext;
use toolgraph_llm::{ChatRequest, Message};

/// The channel that keeps the summary.
pub const SUMMARY_CHANNEL: &str = "history_summary";

/// Most characters of the turns one summary call reads (the latest, when more fell out at once:
/// a summary made as turns fall out covers the earlier ones) — with the instruction and the
/// reply, within the in-process model's 4,096-token context even in scripts of a token or more
/// a character.
const MAX_TRANSCRIPT_CHARS: usize = 3_000;
/// Most tokens a summary may take, and most characters of one kept.
const MAX_SUMMARY_TOKENS: u32 = 320;
const MAX_SUMMARY_CHARS: usize = 1_500;
/// Most characters of one tool result or call in the transcript.
const MAX_TOOL_CHARS: usize = 600;

const INSTRUCTION: &str = "You keep the memory of a long conversation between a person and an assistant. \
Write a short summary of it for the assistant (at most 150 words), in the language the person writes in: \
who the person is, what they asked for, the facts, names, numbers and dates that were given, what was \
decided or done, and what is still pending. Only what the conversation says; no preamble.";

/// The summary as the state keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The summary.
    pub text: String,
    /// How many messages of the log, from the first, it covers.
    pub upto: usize,
}

/// The summary the next model call reads, and whether it is new (to be written to the state).
pub(crate) struct Summarised {
    pub(crate) summary: Summary,
    pub(crate) is_new: bool,
}

impl Summarised {
    /// The write that keeps a new summary.
    pub(crate) fn write(&self) -> ChannelWrite {
        ChannelWrite {
            channel: SUMMARY_CHANNEL.into(),
            reducer: Reducer::Replace,
            value: serde_json::to_value(&self.summary).unwrap_or_default(),
        }
    }
}

/// The summary of what lies before `s`'s history window, brought up to date with a model call
/// when whole turns fell out of the window since it was made; `None` when the agent drops older
/// turns, or nothing fell out yet. A failed call keeps the last summary's text and drops the
/// turns it missed (as `older_turns = "drop"` would), so a call that cannot succeed — a
/// transcript the model refuses — is not made again on every step. The window is a grounded
/// call's when `grounded` (earlier searches take no room in it).
pub(crate) async fn bring_up_to_date(
    s: &AgentState,
    ctx: &RunContext<AgentDeps>,
    deps: &AgentDeps,
    grounded: bool,
) -> Option<Summarised> {
    let spec = deps.spec();
    if !spec.summarise_history {
        return None;
    }
    let kept: Option<Summary> =
        s.channels.get(SUMMARY_CHANNEL).and_then(|v| serde_json::from_value(v.clone()).ok()).filter(|k: &Summary| {
            // A log shorter than what the summary covers is another log (a state rewritten by
            // hand): its summary does not describe it.
            k.upto <= s.messages.len()
        });
    // Where the model call's window starts.
    let start = s.messages.len() - super::grounded::model_window(&s.messages, spec.history_budget, grounded).len();
    let upto = kept.as_ref().map_or(0, |k| k.upto);
    if start <= upto {
        return kept.map(|summary| Summarised { summary, is_new: false });
    }
    let request = request(kept.as_ref().map(|k| k.text.as_str()), &s.messages[upto..start]);
    let mut text = String::new();
    let call = async {
        let response = deps.model().complete(request).await?;
        text = response.content;
        Ok::<_, toolgraph_llm::LlmError>(response.usage)
    };
    match ctx.counted_model_call(call, |r| call_report(deps.model().as_ref(), r)).await {
        Ok(_) if !text.trim().is_empty() => {
            tracing::debug!(agent = %spec.name, upto = start, "older turns summarised");
            let text = clip(text.trim(), MAX_SUMMARY_CHARS);
            Some(Summarised { summary: Summary { text, upto: start }, is_new: true })
        }
        outcome => {
            let error = outcome.err().map_or_else(|| "an empty summary".to_owned(), |e| e.to_string());
            tracing::warn!(agent = %spec.name, %error, "cannot summarise the older turns: they are left out");
            let text = kept.map(|k| k.text).unwrap_or_default();
            Some(Summarised { summary: Summary { text, upto: start }, is_new: true })
        }
    }
}

/// The model request that summarises `turns` after the summary `earlier`.
fn request(earlier: Option<&str>, turns: &[Message]) -> ChatRequest {
    let mut transcript = String::new();
    for m in turns {
        let line = match m {
            Message::User { content } => format!("Person: {content}"),
            Message::Assistant { content, tool_calls } => {
                let mut said = String::new();
                if !content.trim().is_empty() {
                    said = format!("Assistant: {content}");
                }
                for call in tool_calls {
                    if !said.is_empty() {
                        said.push('\n');
                    }
                    said.push_str(&format!(
                        "Assistant called {}: {}",
                        call.name,
                        clip(&call.arguments, MAX_TOOL_CHARS)
                    ));
                }
                said
            }
            Message::Tool { name, content, .. } => format!("{name} returned: {}", clip(content, MAX_TOOL_CHARS)),
            Message::System { .. } => continue,
        };
        if !line.is_empty() {
            transcript.push_str(&line);
            transcript.push('\n');
        }
    }
    if transcript.len() > MAX_TRANSCRIPT_CHARS {
        let mut cut = transcript.len() - MAX_TRANSCRIPT_CHARS;
        while !transcript.is_char_boundary(cut) {
            cut += 1;
        }
        transcript = format!("…{}", &transcript[cut..]);
    }
    let asked = match earlier {
        Some(earlier) => format!("The summary so far:\n{earlier}\n\nThe conversation after it:\n{transcript}"),
        None => format!("The conversation:\n{transcript}"),
    };
    let mut request = ChatRequest::new(vec![Message::system(INSTRUCTION.to_owned()), Message::user(asked)]);
    request.max_tokens = Some(MAX_SUMMARY_TOKENS);
    request.temperature = Some(0.2);
    request
}

fn clip(text: &str, most: usize) -> String {
    if text.chars().count() <= most {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(most).collect();
    clipped.push('…');
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgraph_llm::ToolCall;

    #[test]
    fn the_transcript_keeps_calls_with_their_results_and_the_earlier_summary() {
        let call = ToolCall { id: "c1".into(), name: "calculator".into(), arguments: r#"{"expression":"2+2"}"#.into() };
        let turns = vec![
            Message::system("not this"),
            Message::user("My exam is on 20 January."),
            Message::Assistant { content: String::new(), tool_calls: vec![call] },
            Message::tool("c1", "calculator", "4"),
            Message::Assistant { content: "Noted: 20 January.".into(), tool_calls: vec![] },
        ];
        let request = request(Some("The person is Ana."), &turns);
        let asked = request.messages[1].content();
        assert!(asked.starts_with("The summary so far:\nThe person is Ana."), "{asked}");
        assert!(
            asked.ends_with(
                "Person: My exam is on 20 January.\nAssistant called calculator: {\"expression\":\"2+2\"}\n\
                 calculator returned: 4\nAssistant: Noted: 20 January.\n"
            ),
            "{asked}"
        );
        assert!(!asked.contains("not this"));
        let long = "é".repeat(MAX_TRANSCRIPT_CHARS);
        let request = super::request(None, &[Message::user(long)]);
        assert!(request.messages[1].content().chars().count() <= MAX_TRANSCRIPT_CHARS + 40);
    }
}
