//! Driving one detached run: its events become SSE frames in the run's log, and its results
//! are persisted (tool, assistant and pending-action messages) whether or not anyone is
//! still listening.

use super::ChatService;
use crate::runlog::RunLog;
use crate::wire::PendingActionDto;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use toolgraph_agents::chat_agent::{AgentRun, ChatAgent, TurnEnd};
use toolgraph_conversations::{Role, TurnClaim, TurnUsage};
use toolgraph_graph::{DerivedRows, GraphError, RunEvent};
use toolgraph_protocol::Frame;

/// The reply of a run that hit the recursion limit (the academy-admin contract's text).
pub const RECURSION_FALLBACK: &str =
    "Sorry, I could not finish this request within the allowed number of steps. Please try rephrasing it.";

/// Ends a run's log if its task stops without ending it (a panic in the run): readers get an
/// `error` and the thread is no longer busy, instead of waiting for a log that never ends.
pub(crate) struct EndsLog(pub Arc<RunLog>);

impl Drop for EndsLog {
    fn drop(&mut self) {
        if !self.0.outcome().0 {
            self.0.push(&Frame::Error { message: "the run stopped unexpectedly".into() });
            self.0.finish();
        }
    }
}

/// Who a turn belongs to, and its hold on the conversation.
#[derive(Debug, Clone)]
pub struct Turn {
    pub tenant: i64,
    pub conversation: i64,
    pub agent: String,
    /// The turn's lease on its conversation (its `run_id` is the turn's); renewed while the run
    /// works.
    pub claim: TurnClaim,
    /// Cancels the run (it is the run's own token): used when the lease is lost.
    pub cancel: CancellationToken,
    /// Stream `tool_call` / `tool_result` events too (the request's `toolEvents`).
    pub tool_events: bool,
    /// Stream `node_started` / `node_finished` / `custom` events too ([`NewTurn::node_events`](crate::service::NewTurn::node_events)).
    pub node_events: bool,
}

impl Turn {
    fn run_id(&self) -> &str {
        &self.claim.run_id
    }
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

pub async fn drive(
    service: &ChatService,
    agent: &dyn ChatAgent,
    turn: &Turn,
    mut run: Box<dyn AgentRun>,
    log: &RunLog,
) -> TurnResult {
    let started = Instant::now();
    let store = service.store();
    let m = service.metrics();
    let mut result = TurnResult::default();
    // Spans of the turn, its model calls and its tool calls (exported when OTLP is on): each
    // lives from the event that opens it to the one that closes it.
    let turn_span = tracing::info_span!(
        "chat.turn",
        tenant.id = turn.tenant,
        conversation.id = turn.conversation,
        agent = %turn.agent,
        run.id = %turn.run_id(),
        outcome = tracing::field::Empty,
    );
    // Model calls by node: nodes of one step may call at once.
    let mut models: HashMap<String, (Instant, tracing::Span)> = HashMap::new();
    let mut tools: HashMap<String, (Instant, tracing::Span)> = HashMap::new();
    // The ids the store gave to what the latest step wrote (its messages, its pending actions),
    // handed over by the run: nothing is read back.
    let mut written = DerivedRows::default();
    // What the model calls reported, by model: kept with the turn once it ends.
    let mut spent: Vec<TurnUsage> = Vec::new();
    // The lease is renewed while the run works.
    let lease = Duration::from_millis(turn.claim.lease_ms.max(3) as u64);
    let mut renewal = renewals(&turn.claim);
    let mut renewed_at = Instant::now();
    loop {
        let event = tokio::select! {
            event = run.next_event() => event,
            _ = renewal.tick() => {
                if renew(service, turn, renewed_at.elapsed() >= lease).await {
                    renewed_at = Instant::now();
                }
                continue;
            }
        };
        let Some(event) = event else { break };
        match event {
            RunEvent::TextDelta { text } => log.push(&Frame::Token { content: text }),
            RunEvent::ModelCallStarted { node } => {
                let span = tracing::info_span!(parent: &turn_span, "llm.call", agent = %turn.agent, node = %node, llm.ok = tracing::field::Empty);
                models.insert(node, (Instant::now(), span));
            }
            RunEvent::ModelCallFinished { node, ok, usage } => {
                if let Some((t, span)) = models.remove(&node) {
                    span.record("llm.ok", ok);
                    m.llm_latency.with_label_values(&[&turn.agent]).observe(t.elapsed().as_secs_f64());
                }
                if let Some(usage) = &usage {
                    m.count_tokens(turn.tenant, &turn.agent, usage);
                    log.add_usage(usage);
                    add_call(&mut spent, turn, usage);
                }
            }
            RunEvent::NodeStarted { node, step, from } if turn.node_events => {
                log.push(&Frame::NodeStarted { node, step, from });
            }
            RunEvent::NodeFinished { node, step, checkpoint, next, derived, update } => {
                // A node that wrote no message (a route, or where another agent's run hands
                // the turn back) leaves the last one written as the reply.
                if !derived.is_empty() {
                    written = derived;
                }
                // What the frames of its tokens, calls and results do not tell: a declared
                // graph's channel writes, for the doors that stream each node's update.
                if turn.tool_events
                    && let Some(writes) = agent.channel_writes(&update)
                {
                    log.push(&Frame::StateUpdate { node: node.clone(), checkpoint, writes: Value::Object(writes) });
                }
                if turn.node_events {
                    log.push(&Frame::NodeFinished { node, step, checkpoint, next });
                }
            }
            RunEvent::Custom { node, data } if turn.node_events => log.push(&Frame::Custom { name: node, data }),
            RunEvent::ToolCall { call_id, name, arguments } => {
                let span = tracing::info_span!(parent: &turn_span, "tool.call", tool.name = %name, tool.ok = tracing::field::Empty);
                tools.insert(call_id.clone(), (Instant::now(), span));
                if turn.tool_events {
                    log.push(&Frame::ToolCall { call_id, name, arguments });
                }
            }
            RunEvent::ToolResult { call_id, name, outcome, ok } => {
                if let Some((t, span)) = tools.remove(&call_id) {
                    span.record("tool.ok", ok);
                    m.tool_latency.with_label_values(&[m.tool_label(&name)]).observe(t.elapsed().as_secs_f64());
                }
                let denied = outcome.get("kind").and_then(Value::as_str) == Some("denied");
                if !ok && !denied {
                    m.sql_retries.with_label_values(&[&m.tenant_label(turn.tenant)]).inc();
                }
                if turn.tool_events {
                    log.push(&Frame::ToolResult { call_id, name, ok, outcome });
                }
                // The tool message itself was committed with its checkpoint (see `projection`).
            }
            RunEvent::Interrupted { pending } => {
                // Each pending action was committed with the checkpoint that paused the run,
                // which reported its message id; listed in the order the run raised them.
                for p in pending {
                    let Some(message_id) = written.interrupt(&p.id) else {
                        tracing::warn!(run = %turn.run_id(), interrupt = %p.id, "a pending action was not stored");
                        continue;
                    };
                    let request = agent.action_request(&p.payload);
                    let dto = PendingActionDto {
                        message_id: toolgraph_protocol::MessageId(message_id),
                        tool_name: request.tool,
                        description: request.description,
                        arguments: request.arguments,
                    };
                    log.push(&Frame::Pending(dto.clone()));
                    result.pending.push(dto);
                }
            }
            _ => {}
        }
    }
    let outcome = run.finish().await;
    // Kept before the last frame goes out, so a client that reads the conversation's usage on
    // `done` finds this turn's; a failure to keep it does not fail the turn.
    if !spent.is_empty() {
        let at_ms = toolgraph_conversations::now_ms();
        spent.iter_mut().for_each(|u| u.at_ms = at_ms);
        let (tenant, user) = log.owner;
        match store.record_usage(tenant, user, turn.conversation, &spent).await {
            Ok(()) => service.count_spent(tenant, spent.iter().fold(0u64, |n, u| n.saturating_add(u.tokens()))),
            Err(e) => tracing::warn!(run = %turn.run_id(), error = %e, "cannot keep the turn's token usage"),
        }
    }
    // A completed run's reply was committed with its last checkpoint; a fallback reply (not
    // part of the graph state) is written here.
    let (label, reply, fallback) = match &outcome {
        TurnEnd::Completed { reply } => ("completed", Some(reply), None),
        TurnEnd::Paused => ("interrupted", None, None),
        TurnEnd::RecursionLimit => {
            m.errors.with_label_values(&["recursion"]).inc();
            log.push(&Frame::Token { content: RECURSION_FALLBACK.to_owned() });
            ("error", None, Some(RECURSION_FALLBACK))
        }
        TurnEnd::Cancelled => {
            let why = if log.cancelled() {
                "the run was cancelled"
            } else if service.shutting_down() {
                "the service is shutting down"
            } else {
                "the run was stopped before it finished"
            };
            result.error = Some(why.into());
            ("error", None, None)
        }
        TurnEnd::Failed(error) => {
            m.errors.with_label_values(&["exception"]).inc();
            tracing::warn!(run = %turn.run_id(), %error, "run failed");
            result.error = Some(public_error(error));
            ("error", None, None)
        }
    };
    if let Some(reply) = reply {
        // The reply is the last message the final step wrote.
        match (written.updates.last(), reply) {
            (Some(id), Some(text)) => result.reply = Some((*id, text.clone())),
            _ => result.error = Some("the reply was not saved".into()),
        }
    }
    if let Some(text) = fallback {
        match store.add_message(turn.conversation, Role::Assistant, text).await {
            Ok(id) => result.reply = Some((id, text.to_owned())),
            Err(e) => {
                tracing::error!(error = %e, "cannot persist the fallback message");
                result.error = Some("cannot save the reply".into());
            }
        }
    }
    // Released before the last frame goes out: a client that confirms as soon as it sees
    // `done` must find the conversation free.
    service.release(turn.conversation, turn.run_id()).await;
    match (&result.error, &result.reply, result.pending.first()) {
        (Some(message), _, _) => {
            tracing::warn!(run = %turn.run_id(), conversation = turn.conversation, %message, "turn ended with an error frame");
            log.push(&Frame::Error { message: message.clone() })
        }
        (None, Some((id, _)), _) => push_done(log, turn.conversation, toolgraph_protocol::MessageId(*id)),
        (None, None, Some(p)) => push_done(log, turn.conversation, p.message_id),
        (None, None, None) => {
            tracing::warn!(run = %turn.run_id(), conversation = turn.conversation, "run ended without a reply");
            log.push(&Frame::Error { message: "the run ended without a reply".into() })
        }
    }
    turn_span.record("outcome", label);
    m.stream_duration.with_label_values(&[label]).observe(started.elapsed().as_secs_f64());
    log.finish();
    result
}

/// Adds one model call's tokens to the turn's row of its model.
fn add_call(spent: &mut Vec<TurnUsage>, turn: &Turn, call: &toolgraph_graph::TokenUsage) {
    let row = match spent.iter().position(|u| u.model == call.model) {
        Some(i) => &mut spent[i],
        None => {
            spent.push(TurnUsage {
                run_id: turn.run_id().to_owned(),
                agent: turn.agent.clone(),
                model: call.model.clone(),
                prompt: 0,
                completion: 0,
                cached_prompt: 0,
                calls: 0,
                at_ms: 0,
            });
            let last = spent.len() - 1;
            &mut spent[last]
        }
    };
    row.prompt = row.prompt.saturating_add(call.prompt);
    row.completion = row.completion.saturating_add(call.completion);
    row.cached_prompt = row.cached_prompt.saturating_add(call.cached_prompt);
    row.calls = row.calls.saturating_add(1);
}

/// The ticks a claim is renewed at: three times per lease period, the first a third in, so
/// one slow renewal does not lose it.
pub(super) fn renewals(claim: &TurnClaim) -> tokio::time::Interval {
    let every = Duration::from_millis(claim.lease_ms.max(3) as u64) / 3;
    tokio::time::interval_at(tokio::time::Instant::now() + every, every)
}

/// Renews the turn's lease; whether it did. A run that lost it (it expired and another run
/// took the conversation) is cancelled, so two runs never work on one conversation; so is one
/// whose lease ran out (`expired`) while the store could not be reached, since another replica
/// may be taking its turn over right now.
async fn renew(service: &ChatService, turn: &Turn, expired: bool) -> bool {
    match service.store().renew_turn(turn.conversation, &turn.claim).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::error!(run = %turn.run_id(), conversation = turn.conversation, "lost the conversation's lease; cancelling the run");
            turn.cancel.cancel();
            false
        }
        Err(e) if expired => {
            tracing::error!(run = %turn.run_id(), error = %e, "the conversation's lease ran out unrenewed; cancelling the run");
            turn.cancel.cancel();
            false
        }
        // The store is unreachable: the run goes on, and the next renewal tries again.
        Err(e) => {
            tracing::warn!(run = %turn.run_id(), error = %e, "cannot renew the conversation's lease");
            false
        }
    }
}

fn push_done(log: &RunLog, conversation: i64, message_id: toolgraph_protocol::MessageId) {
    log.push(&Frame::Done { conversation_id: toolgraph_protocol::ConversationId(conversation), message_id });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::RunLogs;
    use toolgraph_protocol::{ConversationId, MessageId};

    #[test]
    fn a_run_whose_task_stops_early_still_ends_its_log() {
        let logs = RunLogs::default();
        let log = logs.create("r", (1, 1), ConversationId(1), "tutor", CancellationToken::new());
        drop(EndsLog(Arc::clone(&log)));
        assert_eq!(log.outcome(), (true, true), "ended, with an error");
        // A log the run ended is left as it was.
        let done = logs.create("d", (1, 1), ConversationId(1), "tutor", CancellationToken::new());
        done.push(&Frame::Done { conversation_id: ConversationId(1), message_id: MessageId(2) });
        done.finish();
        drop(EndsLog(Arc::clone(&done)));
        assert_eq!(done.outcome(), (true, false));
        assert_eq!(done.since(0).0.len(), 1, "nothing added");
    }
}
