//! Retention: conversations idle past their time, with everything hanging off them, the
//! checkpoints of finished threads beyond their last N, token usage past its time and expired
//! memory items are deleted — in the background, one replica a pass, and by `toolgraph gc`
//! (docs/service.md, "Retention").
//!
//! A conversation is judged by one rule: its tenant's when the tenant has one, else its
//! agent's, else the default. The store deletes the idle conversations in one statement each
//! batch (a turn that begins meanwhile keeps its conversation); their checkpoints and run
//! frames go next, as when a person deletes a conversation. The threads of conversations
//! active since the pass before are then compacted by the checkpointer, which leaves a thread
//! that runs or waits for a decision alone.

use super::ChatService;
use crate::error::ChatError;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;
use toolgraph_conversations::{ConversationThread, IdleRule, RunScope};

/// Idle conversations one store call deletes.
const BATCH: usize = 500;
/// Usage rows one store call deletes.
const USAGE_BATCH: usize = 5_000;
/// The periodic task's name in the store's passes.
const TASK: &str = "retention";

/// How long data is kept; `None` keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Conversations with no turn for this long, unless their tenant or agent says otherwise.
    pub conversation_idle: Option<Duration>,
    /// Tenants' own idle times (`None`: their conversations are kept).
    pub tenants: HashMap<i64, Option<Duration>>,
    /// Agents' own idle times, under the tenants'.
    pub agents: HashMap<String, Option<Duration>>,
    /// The checkpoints a finished thread keeps, unless its tenant or agent says otherwise
    /// (`None`: all).
    pub keep_checkpoints: Option<u64>,
    /// Tenants' own checkpoints kept (`None`: all).
    pub tenants_keep: HashMap<i64, Option<u64>>,
    /// Agents' own checkpoints kept, under the tenants'.
    pub agents_keep: HashMap<String, Option<u64>>,
    /// Token usage rows older than this.
    pub usage: Option<Duration>,
    /// How often a replica looks; one replica runs each pass.
    pub every: Duration,
    /// Whether the service looks every `every` itself (`serve`), or only when asked
    /// ([`ChatService::prune`]; `toolgraph gc`).
    pub background: bool,
}

/// What one pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Whether this replica ran the pass (another ran it less than a period ago).
    pub ran: bool,
    /// Idle conversations deleted, with their messages, checkpoints and run frames.
    pub conversations: u64,
    /// Checkpoints of finished threads folded into a later one and deleted.
    pub checkpoints: u64,
    /// LangGraph threads that never ran, deleted.
    pub threads: u64,
    /// Token usage rows deleted.
    pub usage_rows: u64,
    /// Expired memory items deleted.
    pub memory_items: u64,
    /// Deleted conversations whose checkpoints or run frames could not be deleted (logged
    /// with their ids; nothing will look for them again).
    pub leftovers: u64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Disjoint scopes, each with its value: each tenant of `tenants`; each agent of `agents`,
/// but not those tenants; and the rest, with `default`.
fn scopes<T: Copy>(tenants: &HashMap<i64, T>, agents: &HashMap<String, T>, default: T) -> Vec<(IdleRule, T)> {
    let mut tenant_ids: Vec<i64> = tenants.keys().copied().collect();
    tenant_ids.sort_unstable();
    let mut agent_names: Vec<String> = agents.keys().cloned().collect();
    agent_names.sort_unstable();
    let mut out = Vec::new();
    for tenant in &tenant_ids {
        out.push((IdleRule { tenant: Some(*tenant), ..IdleRule::default() }, tenants[tenant]));
    }
    for agent in &agent_names {
        let rule = IdleRule { agent: Some(agent.clone()), except_tenants: tenant_ids.clone(), ..IdleRule::default() };
        out.push((rule, agents[agent]));
    }
    out.push((IdleRule { except_tenants: tenant_ids, except_agents: agent_names, ..IdleRule::default() }, default));
    out
}

impl Retention {
    /// The rules a pass at `now_ms` applies, disjoint: each conversation is judged by one.
    pub fn rules(&self, now_ms: i64) -> Vec<IdleRule> {
        scopes(&self.tenants, &self.agents, self.conversation_idle)
            .into_iter()
            .filter_map(|(rule, idle)| Some(IdleRule { idle_before_ms: now_ms.saturating_sub(ms(idle?)), ..rule }))
            .collect()
    }

    /// The checkpoints a finished thread of `tenant` and `agent` keeps (`None`: all).
    pub fn checkpoints_kept(&self, tenant: i64, agent: &str) -> Option<u64> {
        if let Some(keep) = self.tenants_keep.get(&tenant) {
            return *keep;
        }
        self.agents_keep.get(agent).copied().unwrap_or(self.keep_checkpoints)
    }

    /// Whether any thread keeps fewer than all its checkpoints.
    fn compacts(&self) -> bool {
        self.keep_checkpoints.is_some()
            || self.tenants_keep.values().chain(self.agents_keep.values()).any(Option::is_some)
    }
}

impl ChatService {
    /// Runs a retention pass as of `now_ms`: unless `forced`, only when no replica ran one
    /// less than a period before. Without retention settings it deletes expired memory items
    /// only.
    ///
    /// # Errors
    /// `Store` when the store fails (what was deleted before stays deleted; the next pass
    /// goes on); `Internal` when checkpoints cannot be deleted.
    pub async fn prune(&self, now_ms: i64, forced: bool) -> Result<Pruned, ChatError> {
        let store = &self.0.store;
        let mut pruned = Pruned { ran: true, ..Pruned::default() };
        if self.0.options.attachments.is_some() {
            store.prune_uploads(now_ms - super::attachments::UPLOAD_KEPT_MS).await?;
        }
        let Some(retention) = &self.0.options.retention else {
            pruned.memory_items = store.prune_items(now_ms).await?;
            return Ok(pruned);
        };
        // A tenth of the period's slack: a replica whose timer fires a little early, or whose
        // last pass began a little late, does not skip a period.
        let gap = ms(retention.every) - ms(retention.every) / 10;
        if !forced && !store.claim_pass(TASK, &self.0.options.instance_id, now_ms, gap).await? {
            return Ok(Pruned::default());
        }
        for rule in retention.rules(now_ms) {
            loop {
                if self.0.shutdown.is_cancelled() {
                    return Ok(pruned);
                }
                let gone = store.delete_idle_conversations(&rule, now_ms, BATCH).await?;
                for &(tenant, conversation) in &gone {
                    // Their rows are gone: a failure here is not retried by any later pass,
                    // so the rest of the batch goes on and the leftover is logged.
                    let checkpoints = self.delete_checkpoints(tenant, &[conversation]).await;
                    let frames = self.delete_runs(RunScope::Conversation { tenant, conversation }).await;
                    let attached = self.delete_attachments(tenant, vec![conversation]).await;
                    if let Some(e) = checkpoints.err().or(frames.err()).or(attached.err()) {
                        tracing::error!(tenant, conversation, error = %e, "a pruned conversation's checkpoints or run frames are left behind");
                        pruned.leftovers += 1;
                    }
                }
                pruned.conversations += gone.len() as u64;
                if gone.len() < BATCH {
                    break;
                }
            }
            pruned.threads += store.delete_idle_threads(&rule).await?;
        }
        if retention.compacts() {
            // A pass looks at what was active since the pass before (with a period to spare);
            // `toolgraph gc` at every conversation.
            let since = if forced { i64::MIN } else { now_ms.saturating_sub(ms(retention.every).saturating_mul(2)) };
            pruned.checkpoints += self.compact_threads(retention, since).await?;
        }
        if let Some(d) = retention.usage {
            // Never a row the current budget period counts.
            let mut before = now_ms.saturating_sub(ms(d));
            if let Some(budget) = &self.0.options.token_budget {
                before = before.min(budget.period.bounds(now_ms).0);
            }
            loop {
                let n = store.prune_usage(before, USAGE_BATCH).await?;
                pruned.usage_rows += n;
                if n < USAGE_BATCH as u64 || self.0.shutdown.is_cancelled() {
                    break;
                }
            }
        }
        pruned.memory_items = store.prune_items(now_ms).await?;
        Ok(pruned)
    }

    /// Compacts the threads of the conversations active since `since_ms` to the checkpoints
    /// their rule keeps; how many checkpoints went. A thread that cannot be compacted is
    /// logged and left to the next pass.
    async fn compact_threads(&self, retention: &Retention, since_ms: i64) -> Result<u64, ChatError> {
        let mut deleted = 0;
        let mut after = 0;
        loop {
            if self.0.shutdown.is_cancelled() {
                return Ok(deleted);
            }
            let active = self.0.store.conversations_active_since(since_ms, after, BATCH).await?;
            for (tenant, conversation, agent) in &active {
                let Some(keep) = retention.checkpoints_kept(*tenant, agent) else { continue };
                let thread = ConversationThread { tenant: *tenant, conversation: *conversation }.thread_id();
                match self.0.checkpointer.compact_thread(&thread, keep).await {
                    Ok(n) => deleted += n,
                    Err(e) => tracing::warn!(tenant, conversation, error = %e, "cannot compact a thread's checkpoints"),
                }
            }
            match active.last() {
                Some((_, id, _)) if active.len() == BATCH => after = *id,
                _ => return Ok(deleted),
            }
        }
    }

    /// Runs [`prune`](Self::prune) every `every` until shutdown.
    pub(super) fn prune_periodically(&self, every: Duration) {
        self.every(every.max(Duration::from_secs(1)), |service| async move {
            match service.prune(toolgraph_conversations::now_ms(), false).await {
                Ok(p) if p.ran => tracing::info!(
                    conversations = p.conversations,
                    checkpoints = p.checkpoints,
                    threads = p.threads,
                    usage_rows = p.usage_rows,
                    memory_items = p.memory_items,
                    leftovers = p.leftovers,
                    "retention pass"
                ),
                Ok(_) => tracing::debug!("another replica ran this retention pass"),
                Err(e) => tracing::warn!(error = %e, "the retention pass failed; the next one goes on"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_tenants_rule_wins_over_an_agents_and_an_agents_over_the_default() {
        let retention = Retention {
            conversation_idle: Some(DAY * 90),
            tenants: HashMap::from([(7, Some(DAY * 7)), (8, None)]),
            agents: HashMap::from([("legal".to_owned(), Some(DAY * 30)), ("crisis".to_owned(), None)]),
            keep_checkpoints: Some(10),
            tenants_keep: HashMap::from([(7, Some(3)), (8, None)]),
            agents_keep: HashMap::from([("legal".to_owned(), Some(50))]),
            usage: None,
            every: Duration::from_secs(3600),
            background: true,
        };
        let now = 1_000 * DAY.as_millis() as i64;
        let rules = retention.rules(now);
        let judged = |tenant: i64, agent: &str| -> Vec<i64> {
            rules.iter().filter(|r| r.covers(tenant, agent)).map(|r| (now - r.idle_before_ms) / 86_400_000).collect()
        };
        assert_eq!(judged(7, "legal"), vec![7], "the tenant's, over the agent's");
        assert_eq!(judged(8, "tutor"), Vec::<i64>::new(), "tenant 8 keeps everything");
        assert_eq!(judged(9, "legal"), vec![30]);
        assert_eq!(judged(9, "crisis"), Vec::<i64>::new(), "the crisis agent's are kept");
        assert_eq!(judged(9, "tutor"), vec![90]);
        // The checkpoints kept, by the same precedence.
        assert_eq!(retention.checkpoints_kept(7, "legal"), Some(3), "the tenant's, over the agent's");
        assert_eq!(retention.checkpoints_kept(8, "legal"), None, "tenant 8 keeps all");
        assert_eq!(retention.checkpoints_kept(9, "legal"), Some(50));
        assert_eq!(retention.checkpoints_kept(9, "tutor"), Some(10));
        assert!(retention.compacts());
        let none = Retention { conversation_idle: None, tenants: HashMap::new(), agents: HashMap::new(), ..retention };
        assert!(none.rules(now).is_empty());
        assert!(!Retention::default().compacts());
    }
}
