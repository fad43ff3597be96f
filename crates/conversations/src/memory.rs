//! [`MemoryConversationStore`]: conversations in process memory, for tests and benchmarks
//! (the measured peer uses LangGraph's in-memory saver); lost on exit.

use crate::items::{ITEMS_READ, MemoryItem};
use crate::retention::IdleRule;
use crate::usage::TurnUsage;
use crate::{
    Conversation, ConversationStore, ConversationSummary, Decided, NewPending, PendingAction, PendingLookup,
    ReleasedTurn, Role, StoreError, StoredMessage, THREADS_READ, Thread, TurnClaim, Upload, now_ms, summary_title,
};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// An in-memory store.
#[derive(Debug, Default)]
pub struct MemoryConversationStore {
    inner: Mutex<MemoryInner>,
}

/// A stored conversation: tenant, user, facts, and the claim holding it with its expiry (ms).
type MemoryConversation = (i64, i64, Conversation, Option<(TurnClaim, i64)>);

#[derive(Debug, Default)]
struct MemoryInner {
    next_id: i64,
    conversations: HashMap<i64, MemoryConversation>,
    /// `(conversation, message)`, in id order.
    messages: Vec<(i64, StoredMessage)>,
    pending: Vec<PendingAction>,
    threads: Vec<Thread>,
    /// `(tenant, user, thread, conversation)`: the conversations each thread left.
    branches: Vec<(i64, i64, String, i64)>,
    /// By (tenant, user, namespace, key).
    items: BTreeMap<(i64, i64, Vec<String>, String), MemoryItem>,
    /// `(tenant, user, conversation, usage)`, in the order recorded.
    usage: Vec<(i64, i64, i64, TurnUsage)>,
    /// When each conversation's last turn began or ended (ms).
    last_active: HashMap<i64, i64>,
    /// Periodic task → when its last pass was claimed (ms).
    passes: HashMap<String, i64>,
    /// `(tenant, user, created at, upload)`.
    uploads: Vec<(i64, i64, i64, Upload)>,
}

impl MemoryConversationStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    fn lock(&self) -> MutexGuard<'_, MemoryInner> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MemoryInner {
    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }
    fn owned(&self, tenant: i64, user: i64, id: i64) -> bool {
        self.conversations.get(&id).is_some_and(|(t, u, _, _)| *t == tenant && *u == user)
    }
    fn push_message(&mut self, conversation: i64, role: Role, content: &str) -> i64 {
        let id = self.id();
        self.messages.push((conversation, StoredMessage { id, role, content: content.to_owned() }));
        id
    }
    /// Removes the conversations matching `gone(id, tenant, user)` with everything in them.
    fn remove_conversations(&mut self, gone: impl Fn(i64, i64, i64) -> bool) -> Vec<i64> {
        let gone: Vec<i64> =
            self.conversations.iter().filter(|(id, (t, u, _, _))| gone(**id, *t, *u)).map(|(id, _)| *id).collect();
        for id in &gone {
            self.conversations.remove(id);
            self.last_active.remove(id);
        }
        self.messages.retain(|(c, _)| !gone.contains(c));
        self.pending.retain(|p| !gone.contains(&p.action.conversation_id));
        self.threads.retain(|t| !t.conversation.is_some_and(|c| gone.contains(&c)));
        let threads = &self.threads;
        self.branches.retain(|(t, u, th, c)| {
            !gone.contains(c) && threads.iter().any(|x| x.tenant == *t && x.user == *u && x.id == *th)
        });
        gone
    }
}

#[async_trait]
impl ConversationStore for MemoryConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let mut g = self.lock();
        let id = g.id();
        g.conversations.insert(id, (tenant, user, Conversation { id, agent: agent.to_owned() }, None));
        g.last_active.insert(id, now_ms());
        Ok(id)
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        let g = self.lock();
        Ok(g.conversations.get(&id).filter(|(t, u, _, _)| *t == tenant && *u == user).map(|(_, _, c, _)| c.clone()))
    }

    async fn list_conversations(
        &self,
        tenant: i64,
        user: i64,
        limit: usize,
    ) -> Result<Vec<ConversationSummary>, StoreError> {
        let g = self.lock();
        let mut mine: Vec<&Conversation> =
            g.conversations.values().filter(|(t, u, _, _)| *t == tenant && *u == user).map(|(_, _, c, _)| c).collect();
        mine.sort_by_key(|c| std::cmp::Reverse(c.id));
        Ok(mine
            .into_iter()
            .take(limit)
            .map(|c| {
                let first = g.messages.iter().find(|(conv, m)| *conv == c.id && m.role == Role::User);
                let title = first.map(|(_, m)| summary_title(&m.content)).unwrap_or_default();
                ConversationSummary { id: c.id, agent: c.agent.clone(), title }
            })
            .collect())
    }

    async fn begin_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let mut g = self.lock();
        let now = now_ms();
        let Some(c) = g.conversations.get_mut(&conversation) else { return Ok(false) };
        match &c.3 {
            Some((_, until)) if *until >= now => Ok(false),
            _ => {
                c.3 = Some((claim.clone(), now + claim.lease_ms));
                g.last_active.insert(conversation, now);
                Ok(true)
            }
        }
    }

    async fn renew_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let mut g = self.lock();
        match g.conversations.get_mut(&conversation).and_then(|c| c.3.as_mut()) {
            Some((held, until)) if held.run_id == claim.run_id => {
                *until = now_ms() + claim.lease_ms;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let mut g = self.lock();
        if let Some(c) = g.conversations.get_mut(&conversation)
            && c.3.as_ref().is_some_and(|(held, _)| held.run_id == run_id)
        {
            c.3 = None;
            g.last_active.insert(conversation, now_ms());
        }
        Ok(())
    }

    async fn release_owner(&self, owner: &str) -> Result<Vec<ReleasedTurn>, StoreError> {
        let mut g = self.lock();
        let mut released = Vec::new();
        for (tenant, user, conversation, claim) in g.conversations.values_mut() {
            if let Some((held, _)) = claim.take_if(|(held, _)| held.owner == owner) {
                released.push(ReleasedTurn {
                    tenant_id: *tenant,
                    conversation_id: conversation.id,
                    agent: conversation.agent.clone(),
                    user_id: *user,
                    run_id: held.run_id,
                });
            }
        }
        Ok(released)
    }

    async fn take_over_expired(&self, claim: &TurnClaim, limit: usize) -> Result<Vec<ReleasedTurn>, StoreError> {
        let mut g = self.lock();
        let now = now_ms();
        let mut taken = Vec::new();
        let mut ids: Vec<i64> = g.conversations.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if taken.len() >= limit {
                break;
            }
            let Some((tenant, user, conversation, held)) = g.conversations.get_mut(&id) else { continue };
            if let Some((expired, _)) = held.take_if(|(_, until)| *until < now) {
                *held = Some((claim.clone(), now + claim.lease_ms));
                taken.push(ReleasedTurn {
                    tenant_id: *tenant,
                    conversation_id: conversation.id,
                    agent: conversation.agent.clone(),
                    user_id: *user,
                    run_id: expired.run_id,
                });
            }
        }
        Ok(taken)
    }

    async fn add_message(&self, conversation: i64, role: Role, content: &str) -> Result<i64, StoreError> {
        Ok(self.lock().push_message(conversation, role, content))
    }

    async fn add_pending(&self, pending: &NewPending) -> Result<i64, StoreError> {
        let mut g = self.lock();
        let id = g.push_message(pending.conversation_id, Role::Pending, &pending.description);
        g.pending.push(PendingAction { message_id: id, action: pending.clone(), decision: None, response: None });
        Ok(id)
    }

    async fn pending(&self, lookup: &PendingLookup) -> Result<Option<PendingAction>, StoreError> {
        let (g, l) = (self.lock(), lookup);
        if !g.owned(l.tenant_id, l.user_id, l.conversation_id) {
            return Ok(None);
        }
        Ok(g.pending
            .iter()
            .find(|p| p.message_id == l.message_id && p.action.conversation_id == l.conversation_id)
            .cloned())
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let g = self.lock();
        Ok(g.pending
            .iter()
            .filter(|p| p.action.conversation_id == conversation && p.action.run_id == run_id)
            .cloned()
            .collect())
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        let mut g = self.lock();
        let Some(p) = g.pending.iter_mut().find(|p| p.message_id == message_id) else {
            return Err(StoreError(format!("no pending action {message_id}")));
        };
        Ok(match p.decision {
            None => {
                p.decision = Some(approve);
                Decided::Recorded
            }
            Some(d) if d == approve => Decided::Same,
            Some(_) => Decided::Conflict,
        })
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        let mut g = self.lock();
        for p in g.pending.iter_mut().filter(|p| p.action.conversation_id == conversation && p.action.run_id == run_id)
        {
            p.response = Some(response.to_owned());
        }
        Ok(())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<StoredMessage>, StoreError> {
        let g = self.lock();
        Ok(g.messages.iter().filter(|(c, _)| *c == conversation).map(|(_, m)| m.clone()).collect())
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        Ok(self.lock().remove_conversations(|c, t, u| c == id && t == tenant && u == user).len() == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        let mut g = self.lock();
        g.threads.retain(|t| !(t.tenant == tenant && t.user == user));
        g.items.retain(|(t, u, _, _), _| !(*t == tenant && *u == user));
        g.usage.retain(|(t, u, _, _)| !(*t == tenant && *u == user));
        g.uploads.retain(|(t, u, _, _)| !(*t == tenant && *u == user));
        Ok(g.remove_conversations(|_, t, u| t == tenant && u == user))
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        let mut g = self.lock();
        g.threads.retain(|t| t.tenant != tenant);
        g.items.retain(|(t, _, _, _), _| *t != tenant);
        g.usage.retain(|(t, _, _, _)| *t != tenant);
        g.uploads.retain(|(t, _, _, _)| *t != tenant);
        Ok(g.remove_conversations(|_, t, _| t == tenant))
    }

    fn keeps_threads(&self) -> bool {
        true
    }

    async fn create_thread(&self, thread: &Thread) -> Result<bool, StoreError> {
        let mut g = self.lock();
        if g.threads.iter().any(|t| t.id == thread.id && t.tenant == thread.tenant && t.user == thread.user) {
            return Ok(false);
        }
        g.threads.push(thread.clone());
        Ok(true)
    }

    async fn thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        Ok(self.lock().threads.iter().find(|t| t.id == id && t.tenant == tenant && t.user == user).cloned())
    }

    async fn threads(&self, tenant: i64, user: i64) -> Result<Vec<Thread>, StoreError> {
        let mut theirs: Vec<Thread> =
            self.lock().threads.iter().filter(|t| t.tenant == tenant && t.user == user).cloned().collect();
        theirs.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then_with(|| b.id.cmp(&a.id)));
        theirs.truncate(THREADS_READ);
        Ok(theirs)
    }

    async fn update_thread(
        &self,
        tenant: i64,
        user: i64,
        id: &str,
        metadata: Option<&serde_json::Map<String, serde_json::Value>>,
        conversation: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut g = self.lock();
        let Some(t) = g.threads.iter_mut().find(|t| t.id == id && t.tenant == tenant && t.user == user) else {
            return Ok(false);
        };
        if let Some(m) = metadata {
            t.metadata = m.clone();
        }
        if t.conversation.is_none() {
            t.conversation = conversation;
        }
        t.updated_at_ms = now_ms().max(t.updated_at_ms + 1);
        Ok(true)
    }

    async fn rebind_thread(&self, tenant: i64, user: i64, id: &str, from: i64, to: i64) -> Result<bool, StoreError> {
        let mut g = self.lock();
        if !g.conversations.get(&to).is_some_and(|(t, u, _, _)| *t == tenant && *u == user) {
            return Ok(false);
        }
        let found = g.threads.iter_mut().find(|t| t.id == id && t.tenant == tenant && t.user == user);
        let Some(t) = found.filter(|t| t.conversation == Some(from)) else { return Ok(false) };
        t.conversation = Some(to);
        t.updated_at_ms = now_ms().max(t.updated_at_ms + 1);
        let branch = (tenant, user, id.to_owned(), from);
        if !g.branches.contains(&branch) {
            g.branches.push(branch);
        }
        g.branches.retain(|b| *b != (tenant, user, id.to_owned(), to));
        Ok(true)
    }

    async fn thread_branches(&self, tenant: i64, user: i64, id: &str) -> Result<Vec<i64>, StoreError> {
        let g = self.lock();
        let mut ids: Vec<i64> =
            g.branches.iter().filter(|(t, u, th, _)| *t == tenant && *u == user && th == id).map(|b| b.3).collect();
        ids.sort_unstable();
        Ok(ids)
    }

    async fn delete_thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        let mut g = self.lock();
        g.branches.retain(|(t, u, th, _)| !(*t == tenant && *u == user && th == id));
        let at = g.threads.iter().position(|t| t.id == id && t.tenant == tenant && t.user == user);
        Ok(at.map(|i| g.threads.remove(i)))
    }

    async fn put_item(&self, tenant: i64, user: i64, item: &MemoryItem) -> Result<(), StoreError> {
        let mut g = self.lock();
        let k = (tenant, user, item.namespace.clone(), item.key.clone());
        let mut new = item.clone();
        if let Some(old) = g.items.get(&k).filter(|old| old.expires_at_ms.is_none_or(|e| e > item.updated_at_ms)) {
            new.created_at_ms = old.created_at_ms;
        }
        g.items.insert(k, new);
        Ok(())
    }

    async fn delete_last_messages(&self, conversation: i64, n: usize) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let mut ids: Vec<i64> = g.messages.iter().filter(|(c, _)| *c == conversation).map(|(_, m)| m.id).collect();
        ids.sort_unstable();
        let gone: Vec<i64> = ids.into_iter().rev().take(n).collect();
        g.messages.retain(|(c, m)| !(*c == conversation && gone.contains(&m.id)));
        g.pending.retain(|p| !gone.contains(&p.message_id));
        Ok(gone.len() as u64)
    }

    async fn set_item_vectors(&self, tenant: i64, user: i64, items: &[MemoryItem]) -> Result<(), StoreError> {
        let mut g = self.lock();
        for item in items {
            let k = (tenant, user, item.namespace.clone(), item.key.clone());
            let same = |kept: &&mut MemoryItem| kept.updated_at_ms == item.updated_at_ms && kept.value == item.value;
            if let Some(kept) = g.items.get_mut(&k).filter(same) {
                kept.vector.clone_from(&item.vector);
            }
        }
        Ok(())
    }

    async fn item(
        &self,
        tenant: i64,
        user: i64,
        namespace: &[String],
        key: &str,
        now_ms: i64,
    ) -> Result<Option<MemoryItem>, StoreError> {
        let g = self.lock();
        let found = g.items.get(&(tenant, user, namespace.to_vec(), key.to_owned()));
        Ok(found.filter(|i| i.expires_at_ms.is_none_or(|e| e > now_ms)).cloned())
    }

    async fn items(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        let g = self.lock();
        let mut found: Vec<MemoryItem> = g
            .items
            .iter()
            .filter(|((t, u, ns, _), i)| {
                *t == tenant && *u == user && ns.starts_with(prefix) && i.expires_at_ms.is_none_or(|e| e > now_ms)
            })
            .map(|(_, i)| i.clone())
            .collect();
        // As the databases order them: the most recently written first, then by place.
        found.sort_by(|a, b| {
            b.updated_at_ms
                .cmp(&a.updated_at_ms)
                .then_with(|| a.namespace.cmp(&b.namespace))
                .then_with(|| a.key.cmp(&b.key))
        });
        found.truncate(ITEMS_READ);
        Ok(found)
    }

    async fn count_items(&self, tenant: i64, user: i64, now_ms: i64) -> Result<u64, StoreError> {
        let g = self.lock();
        let n = g
            .items
            .iter()
            .filter(|((t, u, _, _), i)| *t == tenant && *u == user && i.expires_at_ms.is_none_or(|e| e > now_ms))
            .count();
        Ok(n as u64)
    }

    async fn item_namespaces(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<Vec<String>>, StoreError> {
        let g = self.lock();
        let mut found: Vec<Vec<String>> = g
            .items
            .iter()
            .filter(|((t, u, ns, _), i)| {
                *t == tenant && *u == user && ns.starts_with(prefix) && i.expires_at_ms.is_none_or(|e| e > now_ms)
            })
            .map(|((_, _, ns, _), _)| ns.clone())
            .collect();
        found.dedup();
        found.truncate(ITEMS_READ);
        Ok(found)
    }

    async fn refresh_items(
        &self,
        tenant: i64,
        user: i64,
        items: &[(Vec<String>, String)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut g = self.lock();
        for (namespace, key) in items {
            if let Some(i) = g.items.get_mut(&(tenant, user, namespace.clone(), key.clone()))
                && let (Some(ttl), Some(expires)) = (i.ttl_ms, i.expires_at_ms)
                && expires > now_ms
            {
                i.expires_at_ms = Some(now_ms.saturating_add(ttl));
            }
        }
        Ok(())
    }

    async fn delete_item(&self, tenant: i64, user: i64, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        Ok(self.lock().items.remove(&(tenant, user, namespace.to_vec(), key.to_owned())).is_some())
    }

    async fn prune_items(&self, now_ms: i64) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let before = g.items.len();
        g.items.retain(|_, i| i.expires_at_ms.is_none_or(|e| e > now_ms));
        Ok((before - g.items.len()) as u64)
    }

    fn keeps_usage(&self) -> bool {
        true
    }

    async fn record_usage(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        usage: &[TurnUsage],
    ) -> Result<(), StoreError> {
        let capped = |n: u64| n.min(crate::usage::MAX_TOKENS_PER_ROW);
        self.lock().usage.extend(usage.iter().map(|u| {
            let u = TurnUsage {
                prompt: capped(u.prompt),
                completion: capped(u.completion),
                cached_prompt: capped(u.cached_prompt),
                ..u.clone()
            };
            (tenant, user, conversation, u)
        }));
        Ok(())
    }

    async fn conversation_usage(&self, conversation: i64) -> Result<Vec<TurnUsage>, StoreError> {
        Ok(self.lock().usage.iter().filter(|(_, _, c, _)| *c == conversation).map(|(_, _, _, u)| u.clone()).collect())
    }

    async fn tenant_tokens_since(&self, tenant: i64, since_ms: i64) -> Result<u64, StoreError> {
        Ok(self
            .lock()
            .usage
            .iter()
            .filter(|(t, _, _, u)| *t == tenant && u.at_ms >= since_ms)
            .fold(0u64, |sum, (_, _, _, u)| sum.saturating_add(u.tokens())))
    }

    async fn prune_usage(&self, before_ms: i64, limit: usize) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let mut left = limit;
        let before = g.usage.len();
        g.usage.retain(|(_, _, _, u)| {
            let gone = u.at_ms < before_ms && left > 0;
            left -= usize::from(gone);
            !gone
        });
        Ok((before - g.usage.len()) as u64)
    }

    async fn claim_pass(&self, task: &str, _holder: &str, now_ms: i64, every_ms: i64) -> Result<bool, StoreError> {
        let mut g = self.lock();
        match g.passes.get(task) {
            Some(last) if *last > now_ms - every_ms => Ok(false),
            _ => {
                g.passes.insert(task.to_owned(), now_ms);
                Ok(true)
            }
        }
    }

    async fn delete_idle_conversations(
        &self,
        rule: &IdleRule,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        let mut g = self.lock();
        let mut idle: Vec<(i64, i64, i64)> = g
            .conversations
            .iter()
            .filter(|(id, (t, _, c, held))| {
                rule.covers(*t, &c.agent)
                    && g.last_active.get(id).is_none_or(|at| *at < rule.idle_before_ms)
                    && held.as_ref().is_none_or(|(_, until)| *until < now_ms)
            })
            .map(|(id, (t, _, _, _))| (g.last_active.get(id).copied().unwrap_or(0), *t, *id))
            .collect();
        idle.sort_unstable();
        idle.truncate(limit);
        let ids: Vec<i64> = idle.iter().map(|(_, _, id)| *id).collect();
        g.remove_conversations(|id, _, _| ids.contains(&id));
        Ok(idle.into_iter().map(|(_, t, id)| (t, id)).collect())
    }

    async fn conversations_active_since(
        &self,
        since_ms: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>, StoreError> {
        let g = self.lock();
        let mut active: Vec<(i64, i64, String)> = g
            .conversations
            .iter()
            .filter(|(id, _)| **id > after && g.last_active.get(id).is_none_or(|at| *at >= since_ms))
            .map(|(id, (t, _, c, _))| (*t, *id, c.agent.clone()))
            .collect();
        active.sort_unstable_by_key(|(_, id, _)| *id);
        active.truncate(limit);
        Ok(active)
    }

    async fn put_upload(
        &self,
        tenant: i64,
        user: i64,
        id: &str,
        name: &str,
        bytes: &[u8],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut g = self.lock();
        if g.uploads.iter().any(|(_, _, _, u)| u.id == id) {
            return Err(StoreError(format!("upload {id} exists")));
        }
        g.uploads.push((tenant, user, now_ms, Upload { id: id.into(), name: name.into(), bytes: bytes.to_vec() }));
        Ok(())
    }

    async fn uploads(&self, tenant: i64, user: i64, ids: &[String], since_ms: i64) -> Result<Vec<Upload>, StoreError> {
        let g = self.lock();
        Ok(g.uploads
            .iter()
            .filter(|(t, u, at, up)| *t == tenant && *u == user && ids.contains(&up.id) && *at >= since_ms)
            .map(|(_, _, _, up)| up.clone())
            .collect())
    }

    async fn delete_uploads(&self, tenant: i64, user: i64, ids: &[String]) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let before = g.uploads.len();
        g.uploads.retain(|(t, u, _, up)| !(*t == tenant && *u == user && ids.contains(&up.id)));
        Ok((before - g.uploads.len()) as u64)
    }

    async fn prune_uploads(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let before = g.uploads.len();
        g.uploads.retain(|(_, _, at, _)| *at >= before_ms);
        Ok((before - g.uploads.len()) as u64)
    }

    async fn delete_idle_threads(&self, rule: &IdleRule) -> Result<u64, StoreError> {
        if rule.agent.is_some() {
            return Ok(0);
        }
        let mut g = self.lock();
        let before = g.threads.len();
        g.threads.retain(|t| {
            !(t.conversation.is_none()
                && t.updated_at_ms < rule.idle_before_ms
                && rule.tenant.is_none_or(|x| x == t.tenant)
                && !rule.except_tenants.contains(&t.tenant))
        });
        Ok((before - g.threads.len()) as u64)
    }
}
