//! The invariant checker of the fault scenarios: after a scenario it reads what the stores
//! hold — each conversation's messages and pending actions, its checkpoint thread — and what
//! the outside world saw (the writes a backend received, the frames clients got), and lists
//! every broken promise of docs/reliability.md:
//!
//! 1. a conversation ends at a complete checkpoint: idle, or paused for decisions — never a run
//!    stopped mid-way that nobody closed;
//! 2. no duplicated or half-written message: the conversation's messages and its checkpoints
//!    agree (they are written in one transaction), no call is answered twice or left without
//!    an answer (outside an open pause: model servers refuse such a history), no reply is
//!    empty;
//! 3. a write tool ran at most once per `(conversationId, callId)`;
//! 4. every approved action ran once, or is still confirmable, or its tool message says that
//!    its outcome is unknown (the run died while it ran) — never silently dropped;
//! 5. every turn that started has a persisted reply or its client saw an `error` event;
//! 6. every pending action a client was shown is still stored.
//!
//! It reads checkpoints as JSON (the agent's messages: `role`, `content`, `tool_calls`,
//! `tool_call_id`), so it depends on the stored format, not on the agent's types.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use toolgraph_conversations::{ConversationStore, ConversationThread, PendingLookup, Role};
use toolgraph_graph::{Checkpointer, RecordKind};

/// One conversation to check, with what its clients saw.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Tenant id.
    pub tenant: i64,
    /// User id.
    pub user: i64,
    /// Conversation id.
    pub conversation: i64,
    /// Turns of it whose client got an `error` event (or no stream at all: the request
    /// failed), which may lack a persisted reply.
    pub errors_seen: usize,
    /// Message ids of the pending actions its clients were shown.
    pub pending_seen: Vec<i64>,
}

/// What a backend received: `(conversationId, callId)` of each write call, in arrival order.
pub type WriteLedger = Vec<(i64, String)>;

/// The checker's verdict over a set of conversations.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Conversations checked.
    pub conversations: usize,
    /// Messages read.
    pub messages: usize,
    /// Every broken invariant, as `conversation N: what`.
    pub violations: Vec<String>,
}

impl Verdict {
    /// Whether every invariant holds.
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.holds() {
            write!(f, "all invariants hold ({} conversations, {} messages)", self.conversations, self.messages)
        } else {
            writeln!(f, "{} violation(s):", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  {v}")?;
            }
            Ok(())
        }
    }
}

/// Text the agent writes for a call whose run died while it ran (`kit::INTERRUPTED_CALL`):
/// matched on its start, which says the outcome was not recorded.
const UNKNOWN_OUTCOME: &str = "The turn was interrupted before this call's result was recorded";

/// Checks `conversations` against the stores; `writes` is what the write tools' backend
/// received (`None` when the scenario's write tools leave no ledger).
pub async fn check(
    store: &dyn ConversationStore,
    checkpoints: &dyn Checkpointer,
    conversations: &[Observed],
    writes: Option<&WriteLedger>,
) -> Verdict {
    let mut verdict = Verdict { conversations: conversations.len(), ..Verdict::default() };
    let mut ran: BTreeMap<(i64, &str), usize> = BTreeMap::new();
    for (conversation, call) in writes.into_iter().flatten() {
        *ran.entry((*conversation, call.as_str())).or_default() += 1;
    }
    for ((conversation, call), n) in &ran {
        if *n > 1 {
            verdict.violations.push(format!("conversation {conversation}: write call {call} ran {n} times"));
        }
    }
    for o in conversations {
        let mut v = Vec::new();
        check_one(store, checkpoints, o, writes.map(|_| &ran), &mut verdict.messages, &mut v).await;
        verdict.violations.extend(v.into_iter().map(|m| format!("conversation {}: {m}", o.conversation)));
    }
    verdict
}

async fn check_one(
    store: &dyn ConversationStore,
    checkpoints: &dyn Checkpointer,
    o: &Observed,
    ran: Option<&BTreeMap<(i64, &str), usize>>,
    messages_read: &mut usize,
    v: &mut Vec<String>,
) {
    let messages = match store.messages(o.conversation).await {
        Ok(m) => m,
        Err(e) => return v.push(format!("messages unreadable: {e}")),
    };
    *messages_read += messages.len();
    let thread = ConversationThread { tenant: o.tenant, conversation: o.conversation }.thread_id();
    let records = match checkpoints.load(&thread, None).await {
        Ok(r) => r,
        Err(e) => return v.push(format!("checkpoints unreadable: {e}")),
    };

    // 1. The thread's head is a complete checkpoint.
    let mut pending_calls: BTreeMap<String, String> = BTreeMap::new(); // interrupt id → call id
    let mut open: BTreeSet<String> = BTreeSet::new(); // interrupts of the current pause
    for r in &records {
        match r.kind {
            RecordKind::Interrupt => {
                open.clear();
                for i in &r.interrupts {
                    pending_calls.insert(i.id.0.clone(), i.key.clone());
                    open.insert(i.id.0.clone());
                }
            }
            RecordKind::Decision => {}
            _ => open.clear(),
        }
    }
    if let Some(last) = records.last() {
        let paused = matches!(last.kind, RecordKind::Interrupt | RecordKind::Decision) && !open.is_empty();
        if last.next.is_some() && !paused {
            v.push(format!(
                "the thread stops mid-run at checkpoint {} ({:?}, next {:?}) and nobody closed it",
                last.seq, last.kind, last.next
            ));
        }
    }

    // 2. Checkpoints and stored messages agree; no call answered twice; no empty reply.
    let mut users = 0usize;
    let mut replies = Vec::new();
    let mut tool_answers: BTreeMap<String, String> = BTreeMap::new(); // call id → content
    // Calls of the latest assistant message still without a result, in history order.
    let mut outstanding: Vec<String> = Vec::new();
    fn unanswered(outstanding: &mut Vec<String>, v: &mut Vec<String>, before: &str) {
        if !outstanding.is_empty() {
            v.push(format!("call(s) {outstanding:?} left without a result before {before}"));
            outstanding.clear();
        }
    }
    for r in &records {
        for u in &r.updates {
            let Ok(update) = serde_json::from_str::<Value>(u.get()) else {
                v.push(format!("checkpoint {} holds an update that is not JSON", r.seq));
                continue;
            };
            for m in update["messages"].as_array().into_iter().flatten() {
                let content = m["content"].as_str().unwrap_or_default();
                let calls: Vec<String> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["id"].as_str().map(str::to_owned))
                    .collect();
                match m["role"].as_str() {
                    Some("user") => {
                        unanswered(&mut outstanding, v, "the next user message");
                        users += 1;
                    }
                    Some("assistant") if calls.is_empty() => {
                        unanswered(&mut outstanding, v, "a reply");
                        if content.trim().is_empty() {
                            v.push(format!("checkpoint {} holds an empty reply", r.seq));
                        }
                        replies.push(content.to_owned());
                    }
                    Some("assistant") => {
                        unanswered(&mut outstanding, v, "the next model turn");
                        outstanding = calls;
                    }
                    Some("tool") => {
                        let id = m["tool_call_id"].as_str().unwrap_or_default().to_owned();
                        if !outstanding.contains(&id) {
                            v.push(format!("a result for call {id}, which the model turn before it did not make"));
                        }
                        outstanding.retain(|c| *c != id);
                        if tool_answers.insert(id.clone(), content.to_owned()).is_some() {
                            v.push(format!("call {id} is answered twice"));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    // Calls may wait for their results only in the open pause.
    let paused_calls: Vec<&String> = open.iter().filter_map(|id| pending_calls.get(id)).collect();
    outstanding.retain(|c| !paused_calls.contains(&c));
    unanswered(&mut outstanding, v, "the end of the thread (outside a pause)");
    let stored_users = messages.iter().filter(|m| m.role == Role::User).count();
    if stored_users != users {
        v.push(format!("{stored_users} user messages stored but {users} in the checkpoints"));
    }
    let stored_replies: Vec<&str> =
        messages.iter().filter(|m| m.role == Role::Assistant).map(|m| m.content.as_str()).collect();
    // The store may hold replies the graph never saw (a service-written fallback), never fewer.
    for reply in &replies {
        if !stored_replies.contains(&reply.as_str()) {
            v.push(format!("the reply {:?} is in the checkpoints but not stored", cut(reply)));
        }
    }
    let mut ids = messages.iter().map(|m| m.id);
    if let Some(first) = ids.next() {
        let _ = ids.try_fold(first, |prev, id| {
            if id <= prev {
                v.push(format!("message ids out of order ({prev} then {id})"));
            }
            Some(id)
        });
    }

    // 5. Every turn has a reply (an answer or a pending action), or its client saw an error.
    let mut unanswered = 0usize;
    let mut answered = true;
    for m in &messages {
        match m.role {
            Role::User => {
                unanswered += usize::from(!answered);
                answered = false;
            }
            Role::Assistant | Role::Pending => answered = true,
            Role::Tool => {}
        }
    }
    unanswered += usize::from(!answered && !messages.is_empty());
    if unanswered > o.errors_seen {
        v.push(format!(
            "{unanswered} turn(s) have no persisted reply but clients saw only {} error(s): a silent turn",
            o.errors_seen
        ));
    }

    // 4 and 6. Pending actions: still stored; approved ones ran, are confirmable, or say their
    // outcome is unknown.
    for m in messages.iter().filter(|m| m.role == Role::Pending) {
        let lookup =
            PendingLookup { tenant_id: o.tenant, user_id: o.user, conversation_id: o.conversation, message_id: m.id };
        let action = match store.pending(&lookup).await {
            Ok(Some(a)) => a,
            Ok(None) => {
                v.push(format!("pending message {} has no pending action", m.id));
                continue;
            }
            Err(e) => {
                v.push(format!("pending action {} unreadable: {e}", m.id));
                continue;
            }
        };
        if action.decision != Some(true) {
            continue;
        }
        let Some(call) = pending_calls.get(&action.action.interrupt_id) else {
            v.push(format!("approved action {} has no interrupt in the checkpoints", m.id));
            continue;
        };
        let confirmable = open.contains(&action.action.interrupt_id);
        let answer = tool_answers.get(call);
        let unknown = answer.is_some_and(|a| a.contains(UNKNOWN_OUTCOME));
        let executed = ran.map(|r| r.contains_key(&(o.conversation, call.as_str())));
        match (executed, answer) {
            // Confirming again would run it a second time.
            (Some(true), _) if confirmable => {
                v.push(format!("approved call {call} ran but is still confirmable"));
            }
            _ if confirmable => {}
            (Some(true), Some(_)) | (None, Some(_)) => {}
            (Some(true), None) => v.push(format!("approved call {call} ran but its result is not recorded")),
            (Some(false), Some(_)) if unknown => {}
            (Some(false), Some(a)) => {
                v.push(format!("approved call {call} never ran but its result says {:?}", cut(a)))
            }
            (_, None) => v.push(format!("approved call {call} neither ran nor is confirmable: dropped")),
        }
    }
    for id in &o.pending_seen {
        let lookup =
            PendingLookup { tenant_id: o.tenant, user_id: o.user, conversation_id: o.conversation, message_id: *id };
        if !matches!(store.pending(&lookup).await, Ok(Some(_))) {
            v.push(format!("pending action {id} was shown to a client but is not stored"));
        }
    }
}

fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}
