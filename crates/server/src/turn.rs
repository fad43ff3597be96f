//! Driving one detached run: its events become SSE frames in the run's log, and its results
//! are persisted (tool, assistant and pending-action messages) whether or not anyone is
//! still listening.

use crate::AppState;
use crate::runlog::RunLog;
use crate::wire::{Done, PendingActionDto};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Instant;
use toolgraph_graph::react::AgentState;
use toolgraph_graph::{GraphError, RunEvent, RunHandle, RunOutcome};

/// The reply of a seed-002 run that hit the recursion limit.
pub const RECURSION_FALLBACK: &str =
    "Sorry, I could not finish this request within the allowed number of steps. Please try rephrasing it.";

/// Who a turn belongs to.
#[derive(Debug, Clone)]
pub struct Turn {
    pub tenant: i64,
    pub conversation: i64,
    pub run_id: String,
    pub agent: String,
}

/// How a turn ended, for the confirm response.
#[derive(Debug, Default)]
pub struct TurnResult {
    /// The final assistant message (id, text).
    pub reply: Option<(i64, String)>,
    /// Write actions now awaiting decisions.
    pub pending: Vec<PendingActionDto>,
    /// A failure, as shown to the client.
    pub error: Option<String>,
}

fn public_error(e: &GraphError) -> String {
    match e {
        GraphError::Node { source, .. } if source.kind == "model" => {
            "the model endpoint failed; please try again later".into()
        }
        _ => "the request failed; please try again".into(),
    }
}

pub async fn drive(app: &AppState, turn: &Turn, mut run: RunHandle<AgentState>, log: &RunLog) -> TurnResult {
    let started = Instant::now();
    let store = &app.0.store;
    let m = &app.0.metrics;
    let mut result = TurnResult::default();
    let mut model_started: Option<Instant> = None;
    let mut tools: HashMap<String, Instant> = HashMap::new();
    while let Some(event) = run.next_event().await {
        match event {
            RunEvent::TextDelta { text } => log.push("token", json!({ "content": text }).to_string()),
            RunEvent::NodeStarted { node, .. } if node == "agent" => model_started = Some(Instant::now()),
            RunEvent::NodeFinished { node, .. } if node == "agent" => {
                if let Some(t) = model_started.take() {
                    m.llm_latency.with_label_values(&[&turn.agent]).observe(t.elapsed().as_secs_f64());
                }
            }
            RunEvent::ToolCall { call_id, .. } => {
                tools.insert(call_id, Instant::now());
            }
            RunEvent::ToolResult { call_id, name, outcome, ok } => {
                if let Some(t) = tools.remove(&call_id) {
                    m.tool_latency.with_label_values(&[&name]).observe(t.elapsed().as_secs_f64());
                }
                let denied = outcome.get("kind").and_then(Value::as_str) == Some("denied");
                if !ok && !denied {
                    m.sql_retries.with_label_values(&[&turn.tenant.to_string()]).inc();
                }
                let content = json!({ "tool": name, "call_id": call_id, "outcome": outcome }).to_string();
                if let Err(e) = store.add_message(turn.conversation, "tool", &content).await {
                    tracing::error!(error = %e, "cannot persist a tool message");
                }
            }
            RunEvent::Interrupted { pending } => {
                for p in pending {
                    let tool = p.payload.get("tool").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let description =
                        p.payload.get("description").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let arguments = p.payload.get("arguments").cloned().unwrap_or(Value::Null);
                    match store
                        .add_pending(turn.conversation, &turn.run_id, &p.id.0, &tool, &description, &arguments)
                        .await
                    {
                        Ok(message_id) => {
                            let dto = PendingActionDto { message_id, tool_name: tool, description, arguments };
                            log.push("pending", serde_json::to_string(&dto).unwrap_or_default());
                            result.pending.push(dto);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "cannot persist a pending action");
                            result.error = Some("cannot save the pending action".into());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let outcome = run.outcome().await;
    let (label, reply) = match &outcome {
        RunOutcome::Completed { state } => ("completed", Some(state.last_reply().unwrap_or_default().to_owned())),
        RunOutcome::Interrupted { .. } => ("interrupted", None),
        RunOutcome::RecursionLimit { .. } => {
            m.errors.with_label_values(&["recursion"]).inc();
            log.push("token", json!({ "content": RECURSION_FALLBACK }).to_string());
            ("error", Some(RECURSION_FALLBACK.to_owned()))
        }
        RunOutcome::Cancelled { .. } => {
            result.error = Some("the service is shutting down".into());
            ("error", None)
        }
        RunOutcome::Failed { error, .. } => {
            m.errors.with_label_values(&["exception"]).inc();
            tracing::warn!(run = %turn.run_id, %error, "run failed");
            result.error = Some(public_error(error));
            ("error", None)
        }
    };
    if let Some(text) = reply {
        match store.add_message(turn.conversation, "assistant", &text).await {
            Ok(id) => result.reply = Some((id, text)),
            Err(e) => {
                tracing::error!(error = %e, "cannot persist the assistant message");
                result.error = Some("cannot save the reply".into());
            }
        }
    }
    // Released before the last frame goes out: a client that confirms as soon as it sees
    // `done` must find the conversation free.
    if let Err(e) = store.end_turn(turn.conversation, &turn.run_id).await {
        tracing::error!(error = %e, "cannot release the conversation");
    }
    match (&result.error, &result.reply, result.pending.first()) {
        (Some(message), _, _) => {
            tracing::warn!(run = %turn.run_id, conversation = turn.conversation, %message, "turn ended with an error frame");
            log.push("error", json!({ "message": message }).to_string())
        }
        (None, Some((id, _)), _) => push_done(log, turn.conversation, *id),
        (None, None, Some(p)) => push_done(log, turn.conversation, p.message_id),
        (None, None, None) => {
            tracing::warn!(run = %turn.run_id, conversation = turn.conversation, "run ended without a reply");
            log.push("error", json!({ "message": "the run ended without a reply" }).to_string())
        }
    }
    m.stream_duration.with_label_values(&[label]).observe(started.elapsed().as_secs_f64());
    log.finish();
    result
}

fn push_done(log: &RunLog, conversation_id: i64, message_id: i64) {
    log.push("done", serde_json::to_string(&Done { conversation_id, message_id }).unwrap_or_default());
}
