//! Tools in a turn: what the model is told and offered ([`tool_definitions`],
//! [`callable_tools`], [`tool_choice`]) and what runs without it ([`step_due`]); running a call
//! with the turn's context, and recording a call a node makes itself as a model's call is.

use super::{AgentDeps, AgentSpec, AgentState};
use serde_json::Value;
use std::sync::Arc;
use toolgraph_graph::{RunContext, RunEvent, TokenUsage};
use toolgraph_llm::{Message, ToolCall, ToolChoice, ToolDefinition};
use toolgraph_tools::{Tool, ToolCallRequest, ToolContext, ToolOutcome, ToolRegistry};

/// What the model is told about `tools`: name, description and argument schema of each.
pub fn tool_definitions(tools: &ToolRegistry) -> Vec<ToolDefinition> {
    tools
        .specs()
        .into_iter()
        .map(|s| ToolDefinition { name: s.name, description: s.description, parameters: s.parameters })
        .collect()
}

/// The messages of the current turn: those after the user's last message.
pub(crate) fn this_turn(history: &[Message]) -> &[Message] {
    let turn_start = history.iter().rposition(|m| matches!(m, Message::User { .. })).map_or(0, |i| i + 1);
    &history[turn_start..]
}

/// The tools the model may call at this point of the turn, when that is not all of them: a
/// tool with [`offered_after`](toolgraph_tools::ToolSpec::offered_after) only once one of
/// those tools has returned since the user's last message. `None`: every tool.
pub fn callable_tools(tools: &ToolRegistry, history: &[Message]) -> Option<Vec<String>> {
    callable_among(&tools.tools(), this_turn(history))
}

/// [`callable_tools`] over the registry's tools, read in place (asked before every model call).
fn callable_among(tools: &[Arc<dyn Tool>], turn: &[Message]) -> Option<Vec<String>> {
    if tools.iter().all(|t| t.spec().offered_after.is_empty()) {
        return None;
    }
    let returned: Vec<&str> = turn
        .iter()
        .filter_map(|m| match m {
            Message::Tool { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let callable: Vec<String> = tools
        .iter()
        .map(|t| t.spec())
        .filter(|s| s.offered_after.is_empty() || s.offered_after.iter().any(|t| returned.contains(&t.as_str())))
        .map(|s| s.name.clone())
        .collect();
    (callable.len() < tools.len()).then_some(callable)
}

/// The tool choice for the model's next step: the tool that must come next
/// ([`required_after`](toolgraph_tools::ToolSpec::required_after): one it follows has returned
/// in this turn without failing, and it has not been called since), else the
/// [callable tools](callable_tools) when that is not all of them; `None`: the model decides
/// among all.
pub fn tool_choice(tools: &ToolRegistry, history: &[Message]) -> Option<ToolChoice> {
    let (registered, turn) = (tools.tools(), this_turn(history));
    match registered.iter().map(|t| t.spec()).find(|spec| due(&spec.name, &spec.required_after, turn)) {
        Some(spec) => Some(ToolChoice::Tool(spec.name.clone())),
        None => callable_among(&registered, turn).map(ToolChoice::Allowed),
    }
}

/// The tool the agent calls itself now, with no arguments and no model call
/// ([`runs_after`](toolgraph_tools::ToolSpec::runs_after): one it follows has returned in this
/// turn without failing, and it has not been called since).
pub fn step_due(tools: &ToolRegistry, history: &[Message]) -> Option<String> {
    let turn = this_turn(history);
    tools.tools().iter().map(|t| t.spec()).find(|spec| due(&spec.name, &spec.runs_after, turn)).map(|s| s.name.clone())
}

/// Whether `tool` is due: one of `after` has [found something](found) in `turn`, and `tool`
/// has not returned since.
fn due(tool: &str, after: &[String], turn: &[Message]) -> bool {
    if after.is_empty() {
        return false;
    }
    let followed = turn.iter().rposition(|m| match m {
        Message::Tool { name, content, .. } => after.contains(name) && found(content),
        _ => false,
    });
    followed.is_some_and(|at| !turn[at..].iter().any(|m| matches!(m, Message::Tool { name, .. } if name == tool)))
}

/// Whether a tool message carries a result to go on with: neither a failure nor an empty list
/// (a search that found nothing leaves the model to say so).
fn found(content: &str) -> bool {
    !failed(content) && content.trim() != "[]"
}

/// Whether a tool message reports a failure (`{"ok": false, …}`, docs/tools.md).
pub(crate) fn failed(content: &str) -> bool {
    content.contains("\"ok\":false")
        && serde_json::from_str::<Value>(content).is_ok_and(|v| v.get("ok") == Some(&Value::Bool(false)))
}

/// Whether `call` asks again for what a call of this turn already returned: the same tool with
/// the same arguments (read as JSON, so spacing and key order do not matter), answered without
/// failing, and no write tool of `tools` has returned since (a list read again after a write
/// may read something new). Its result is in the history already; running it again only
/// feeds a loop.
pub(crate) fn returned_this_turn(history: &[Message], call: &ToolCall, tools: &ToolRegistry) -> bool {
    let turn = this_turn(history);
    let arguments = |text: &str| serde_json::from_str::<Value>(text).ok();
    // Parsed only when a call of the same tool with other text is found (rare, per step).
    let asked = std::cell::OnceCell::new();
    let same = |c: &ToolCall| {
        c.name == call.name
            && (c.arguments == call.arguments || {
                let asked = asked.get_or_init(|| arguments(&call.arguments));
                asked.is_some() && arguments(&c.arguments) == *asked
            })
    };
    let is_write = |name: &str| tools.get(name).is_some_and(|t| t.spec().class == toolgraph_tools::ToolClass::Write);
    // The result of call `id`, when it returned without failing and no write returned after it.
    let returned = |id: &str| {
        let at = turn.iter().position(
            |m| matches!(m, Message::Tool { tool_call_id, content, .. } if tool_call_id == id && !failed(content)),
        );
        at.is_some_and(|at| !turn[at + 1..].iter().any(|m| matches!(m, Message::Tool { name, .. } if is_write(name))))
    };
    turn.iter().any(|m| match m {
        Message::Assistant { tool_calls, .. } => tool_calls.iter().any(|c| same(c) && returned(&c.id)),
        _ => false,
    })
}

/// The outputs of the tools called since the last user message.
pub(crate) fn turn_tool_outputs(history: &[Message]) -> Vec<&str> {
    this_turn(history)
        .iter()
        .filter_map(|m| match m {
            Message::Tool { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

pub(crate) fn tool_message(call: &ToolCall, outcome: &ToolOutcome) -> Message {
    Message::tool(call.id.clone(), call.name.clone(), outcome.to_model_text())
}

/// Runs `call`; its tool sees the turn's context plus `toolCallId`, the model's id of the call
/// (stable across a resumed run, so a tool with side effects can pass it on as an idempotency
/// key).
pub(crate) async fn run_tool(ctx: &RunContext<AgentDeps>, tools: &ToolContext, call: &ToolCall) -> ToolOutcome {
    let tools = tools.clone().set("toolCallId", Value::String(call.id.clone()));
    let outcome = match ToolCallRequest::parse_arguments(&call.arguments) {
        Ok(args) => {
            // A tool that calls a model itself reports the tokens: they are this step's. Only
            // their count is reported (no start): the call's time is the tool's.
            let (outcome, used) =
                toolgraph_llm::usage::collecting(ctx.deps().spec().tools.call(&tools, &call.name, &args)).await;
            for (model, u) in used {
                let usage = TokenUsage {
                    model,
                    prompt: u.prompt_tokens.into(),
                    completion: u.completion_tokens.into(),
                    cached_prompt: u.cached_prompt_tokens.into(),
                };
                ctx.emit(RunEvent::ModelCallFinished { node: ctx.node().to_owned(), ok: true, usage: Some(usage) })
                    .await;
            }
            outcome
        }
        Err(e) => ToolOutcome::Failure(e),
    };
    ctx.emit(RunEvent::ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        outcome: outcome.to_json(),
        ok: outcome.is_success(),
    })
    .await;
    outcome
}

/// Calls `tool` with `arguments` on behalf of a node (not the model), recorded like a model's
/// call: the events of a tool call, and the update's messages — an assistant message with the
/// call and the tool message with its result — so clients, checkpoints and recovery see it as
/// any other call. Its id is unique within the conversation, and the same if the step runs again.
pub(crate) async fn recorded_call(
    s: &AgentState,
    ctx: &RunContext<AgentDeps>,
    tool: &str,
    arguments: Value,
) -> (ToolOutcome, Vec<Message>) {
    let call =
        ToolCall { id: format!("{tool}-{}", s.messages.len()), name: tool.into(), arguments: arguments.to_string() };
    ctx.emit(RunEvent::ToolCall { call_id: call.id.clone(), name: call.name.clone(), arguments }).await;
    let outcome = run_tool(ctx, &tool_context(s, ctx.deps().spec()), &call).await;
    let result = tool_message(&call, &outcome);
    (outcome, vec![Message::Assistant { content: String::new(), tool_calls: vec![call] }, result])
}

/// The context of this turn's tool calls: the state's, then the agent's own values over it,
/// and the results of the tools called so far in the turn.
pub(crate) fn tool_context(s: &AgentState, spec: &AgentSpec) -> ToolContext {
    let mut values = s.context.clone();
    values.extend(spec.tool_context.iter().map(|(k, v)| (k.clone(), v.clone())));
    let results = this_turn(&s.messages)
        .iter()
        .filter_map(|m| match m {
            Message::Tool { name, content, .. } => Some((name.clone(), content.clone())),
            _ => None,
        })
        .collect();
    ToolContext::with_state(values).with_turn_results(results)
}

#[cfg(test)]
mod footer_tests {
    use super::*;

    #[test]
    fn only_this_turns_tool_outputs_count() {
        let history = vec![
            Message::user("first"),
            Message::tool("c0", "rag_search", "old"),
            Message::assistant("answered"),
            Message::user("second"),
            Message::tool("c1", "rag_search", "a"),
            Message::tool("c2", "calculator", "b"),
        ];
        assert_eq!(turn_tool_outputs(&history), ["a", "b"]);
        assert!(turn_tool_outputs(&history[..4]).is_empty());
    }
}

#[cfg(test)]
mod offer_tests {
    use super::*;
    use toolgraph_tools::ToolBuilder;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NoArgs {}

    fn registry() -> ToolRegistry {
        let tool = |name: &str, after: &[&str]| {
            ToolBuilder::<NoArgs>::new(name, name)
                .offered_after(after.iter().copied())
                .handler(|_, _: NoArgs| async { Ok(Value::Null) })
                .expect("valid tool")
        };
        let mut r = ToolRegistry::new();
        for t in [tool("search", &[]), tool("cite", &["search"]), tool("answer", &["search", "lookup"])] {
            r.register(t).expect("distinct names");
        }
        r
    }

    fn sorted(v: Option<Vec<String>>) -> Option<Vec<String>> {
        v.map(|mut v| {
            v.sort();
            v
        })
    }

    #[test]
    fn a_tool_is_offered_once_one_it_follows_has_returned_in_the_turn() {
        let r = registry();
        let mut history = vec![Message::user("q")];
        assert_eq!(callable_tools(&r, &history), Some(vec!["search".to_owned()]));
        history.push(Message::tool("c1", "search", "[]"));
        assert_eq!(callable_tools(&r, &history), None, "everything once search returned");
        // A new turn starts over, whatever the last one returned.
        history.push(Message::assistant("a"));
        history.push(Message::user("again"));
        assert_eq!(callable_tools(&r, &history), Some(vec!["search".to_owned()]));
        // Any one of the listed tools suffices.
        history.push(Message::tool("c2", "lookup", "{}"));
        assert_eq!(sorted(callable_tools(&r, &history)), Some(vec!["answer".to_owned(), "search".to_owned()]));
        // Tools without prerequisites: no narrowing at all.
        assert_eq!(callable_tools(&r.subset(["search"]).unwrap(), &[Message::user("q")]), None);
    }
    #[test]
    fn a_required_tool_is_the_next_call_after_the_one_it_follows_until_it_is_called() {
        let mut r = registry();
        let cite = ToolBuilder::<NoArgs>::new("must_cite", "cite")
            .required_after(["search"])
            .handler(|_, _: NoArgs| async { Ok(Value::Null) })
            .expect("valid tool");
        r.register(cite).expect("distinct names");
        let mut history = vec![Message::user("q")];
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Allowed(vec!["search".to_owned()])));
        history.push(Message::tool("s1", "search", "[]"));
        assert_eq!(tool_choice(&r, &history), None, "an empty result asks for nothing");
        history.push(Message::tool("s1b", "search", r#"[{"text": "found"}]"#));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // Another tool's result in between does not lift it.
        history.push(Message::tool("c1", "cite", "{}"));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // Once called (even if it failed), the model decides again: no loop on a failing call.
        history.push(Message::tool("m1", "must_cite", r#"{"ok":false}"#));
        assert_eq!(tool_choice(&r, &history), None, "everything is callable now");
        // A search that fails asks for nothing; a second one that returns makes it due again.
        history.push(Message::tool("s2", "search", r#"{"error":"down","kind":"unavailable","ok":false}"#));
        assert_eq!(tool_choice(&r, &history), None);
        history.push(Message::tool("s3", "search", r#"[{"text": "found"}]"#));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // A new turn starts over.
        history.push(Message::user("again"));
        assert!(matches!(tool_choice(&r, &history), Some(ToolChoice::Allowed(_))));
    }

    #[test]
    fn a_step_the_agent_runs_is_due_after_the_one_it_follows_until_it_has_run() {
        let mut r = registry();
        let cite = ToolBuilder::<NoArgs>::new("cite_it", "cite")
            .runs_after(["search"])
            .handler(|_, _: NoArgs| async { Ok(Value::Null) })
            .expect("valid tool");
        r.register(cite).expect("distinct names");
        let mut history = vec![Message::user("q")];
        assert_eq!(step_due(&r, &history), None);
        history.push(Message::tool("s1", "search", r#"{"ok":false,"kind":"unavailable","error":"down"}"#));
        assert_eq!(step_due(&r, &history), None, "not after a failure");
        history.push(Message::tool("s2", "search", "[]"));
        assert_eq!(step_due(&r, &history), None, "not after an empty result");
        history.push(Message::tool("s3", "search", r#"[{"text": "found"}]"#));
        assert_eq!(step_due(&r, &history).as_deref(), Some("cite_it"));
        assert_eq!(tool_choice(&r, &history), None, "the model is not asked for it");
        history.push(Message::tool("c1", "cite_it", r#"{"ok":false}"#));
        assert_eq!(step_due(&r, &history), None, "once run, even if it failed: no loop");
        history.push(Message::user("again"));
        assert_eq!(step_due(&r, &history), None, "a new turn starts over");
    }
}
