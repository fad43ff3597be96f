//! Retention: conversations idle past their time, with everything hanging off them, token
//! usage past its time and expired memory items are deleted — in the background, one replica
//! a pass, and by `toolgraph gc` (docs/service.md, "Retention").
//!
//! A conversation is judged by one rule: its tenant's when the tenant has one, else its
//! agent's, else the default. The store deletes the idle conversations in one statement each
//! batch (a turn that begins meanwhile keeps its conversation); their checkpoints and run
//! frames go next, as when a person deletes a conversation.

use super::ChatService;
use crate::error::ChatError;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;
use toolgraph_conversations::{IdleRule, RunScope};

/// Idle conversations one store call deletes.
const BATCH: usize = 500;
/// Usage rows one store call deletes.
const USAGE_BATCH: usize = 5_000;
/// The periodic task's name in the store's passes.
const TASK: &str = "retention";

/// How long data is kept; `None` keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Conversations with no turn for this long, unless their tenant or agent says otherwise.
    pub conversation_idle: Option<Duration>,
    /// Tenants' own idle times (`None`: their conversations are kept).
    pub tenants: HashMap<i64, Option<Duration>>,
    /// Agents' own idle times, under the tenants'.
    pub agents: HashMap<String, Option<Duration>>,
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

impl Retention {
    /// The rules a pass at `now_ms` applies, disjoint: each conversation is judged by one.
    pub fn rules(&self, now_ms: i64) -> Vec<IdleRule> {
        let before = |d: Duration| now_ms.saturating_sub(ms(d));
        let mut tenants: Vec<i64> = self.tenants.keys().copied().collect();
        tenants.sort_unstable();
        let mut agents: Vec<String> = self.agents.keys().cloned().collect();
        agents.sort_unstable();
        let mut rules = Vec::new();
        for tenant in &tenants {
            if let Some(Some(d)) = self.tenants.get(tenant) {
                rules.push(IdleRule { idle_before_ms: before(*d), tenant: Some(*tenant), ..IdleRule::default() });
            }
        }
        for agent in &agents {
            if let Some(Some(d)) = self.agents.get(agent) {
                rules.push(IdleRule {
                    idle_before_ms: before(*d),
                    agent: Some(agent.clone()),
                    except_tenants: tenants.clone(),
                    ..IdleRule::default()
                });
            }
        }
        if let Some(d) = self.conversation_idle {
            rules.push(IdleRule {
                idle_before_ms: before(d),
                except_tenants: tenants,
                except_agents: agents,
                ..IdleRule::default()
            });
        }
        rules
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

    /// Runs [`prune`](Self::prune) every `every` until shutdown.
    pub(super) fn prune_periodically(&self, every: Duration) {
        self.every(every.max(Duration::from_secs(1)), |service| async move {
            match service.prune(toolgraph_conversations::now_ms(), false).await {
                Ok(p) if p.ran => tracing::info!(
                    conversations = p.conversations,
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
        let none = Retention { conversation_idle: None, tenants: HashMap::new(), agents: HashMap::new(), ..retention };
        assert!(none.rules(now).is_empty());
    }
}
