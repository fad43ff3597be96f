//! What turns cost: a conversation's token usage for its owner, and the per-tenant token
//! budget a turn is admitted against (docs/service.md, "Tokens").
//!
//! A budget is counted from the usage the store keeps with every turn, so replicas sharing a
//! database share one count. It is checked when a turn starts or resumes: a turn already
//! running when the budget runs out finishes. Each replica reads a tenant's spending at most
//! once a second ([`SPENT_FRESH`]), so a burst of turns can overrun a budget by what they use.

use super::ChatService;
use crate::auth::{AdmittedTenant, Principal};
use crate::error::ChatError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use toolgraph_conversations::TurnUsage;
use toolgraph_protocol::ConversationId;

/// How long a replica counts on a tenant's spending as read.
const SPENT_FRESH: Duration = Duration::from_secs(1);
/// Past this many tenants remembered, the spending read is forgotten and read again.
const SPENT_REMEMBERED: usize = 10_000;

/// The period a token budget runs over, in UTC; it renews when the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPeriod {
    /// A clock hour.
    Hour,
    /// A calendar day.
    Day,
    /// A calendar month.
    Month,
}

impl BudgetPeriod {
    /// The name people read ("this month").
    pub fn name(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Month => "month",
        }
    }

    /// Where the period holding `now_ms` starts and where the next starts, in ms since the
    /// Unix epoch.
    pub fn bounds(self, now_ms: i64) -> (i64, i64) {
        const HOUR: i64 = 3_600_000;
        const DAY: i64 = 24 * HOUR;
        match self {
            Self::Hour => {
                let start = now_ms - now_ms.rem_euclid(HOUR);
                (start, start + HOUR)
            }
            // Unix time has no leap seconds: every UTC day is 86,400 of its seconds.
            Self::Day => {
                let start = now_ms - now_ms.rem_euclid(DAY);
                (start, start + DAY)
            }
            Self::Month => {
                let day = now_ms.div_euclid(DAY);
                let date = time::Date::from_julian_day(UNIX_EPOCH_JULIAN_DAY.saturating_add(day as i32))
                    .unwrap_or(time::Date::MIN);
                let first = date.replace_day(1).unwrap_or(date);
                let next = match first.month() {
                    time::Month::December => time::Date::from_calendar_date(first.year() + 1, time::Month::January, 1),
                    month => time::Date::from_calendar_date(first.year(), month.next(), 1),
                }
                .unwrap_or(time::Date::MAX);
                let ms = |d: time::Date| i64::from(d.to_julian_day() - UNIX_EPOCH_JULIAN_DAY) * DAY;
                (ms(first), ms(next))
            }
        }
    }
}

/// The Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

/// `[server.token_budget]`: the tokens (prompt and completion) each tenant's turns may use
/// per period; past it, a new turn or a decision that resumes one gets 429 with
/// `Retry-After` until the next period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBudget {
    /// Every tenant's budget, unless `tenants` names it (0: none).
    pub tokens: u64,
    /// The period it runs over.
    pub period: BudgetPeriod,
    /// Budgets of named tenants (0: none for that tenant).
    pub tenants: HashMap<i64, u64>,
}

impl TokenBudget {
    /// `tenant`'s budget per period, `None` when it has none.
    pub fn of(&self, tenant: i64) -> Option<u64> {
        Some(self.tenants.get(&tenant).copied().unwrap_or(self.tokens)).filter(|t| *t > 0)
    }
}

/// Tenants' spending as last read by this replica: tenant → (period start, tokens, read at).
#[derive(Debug, Default)]
pub(super) struct SpentCache(Mutex<HashMap<i64, (i64, u64, Instant)>>);

/// A tenant's budget and what its turns used of it in the current period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetStatus {
    /// The period's tokens, `None` without a budget.
    pub budget: Option<u64>,
    /// The tokens the tenant's turns used in the period.
    pub used: u64,
    /// The period.
    pub period: BudgetPeriod,
    /// When the period started and when the next starts, ms since the Unix epoch.
    pub bounds: (i64, i64),
}

impl ChatService {
    /// What `who`'s conversation `id`'s turns used, one row per turn and model, oldest first.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store` when the store fails or keeps no usage.
    pub async fn conversation_usage(&self, who: &Principal, id: ConversationId) -> Result<Vec<TurnUsage>, ChatError> {
        let (tenant, user) = who.ids();
        self.0.store.conversation(tenant, user, id.0).await?.ok_or(ChatError::NotFound)?;
        self.keeps_usage()?;
        Ok(self.0.store.conversation_usage(id.0).await?)
    }

    /// `tenant`'s budget and its spending in the current period (read now, not from the
    /// cache). Without a configured budget the period is the month.
    ///
    /// # Errors
    /// `Store` when the store fails or keeps no usage.
    pub async fn tenant_usage(&self, tenant: &AdmittedTenant) -> Result<BudgetStatus, ChatError> {
        let tenant = tenant.id().0;
        self.keeps_usage()?;
        let (budget, period) = match &self.0.options.token_budget {
            Some(b) => (b.of(tenant), b.period),
            None => (None, BudgetPeriod::Month),
        };
        let bounds = period.bounds(toolgraph_conversations::now_ms());
        let used = self.0.store.tenant_tokens_since(tenant, bounds.0).await?;
        Ok(BudgetStatus { budget, used, period, bounds })
    }

    /// Refuses, clearly, on a store that keeps no usage (the backend's).
    fn keeps_usage(&self) -> Result<(), ChatError> {
        if self.0.store.keeps_usage() {
            return Ok(());
        }
        Err(ChatError::Unsupported("this service's store keeps no token usage (store = \"backend\")".into()))
    }

    /// Counts a turn's `tokens` into this replica's read of `tenant`'s spending, so its next
    /// turn here sees them without waiting for a new read.
    pub(super) fn count_spent(&self, tenant: i64, tokens: u64) {
        self.0.spent.add(tenant, tokens);
    }

    /// Refuses a turn of `tenant` once its turns used its budget for the period.
    ///
    /// # Errors
    /// `OverBudget`; `Store` when the spending cannot be read (the turn is not let through
    /// unchecked).
    pub(super) async fn check_budget(&self, tenant: i64) -> Result<(), ChatError> {
        let Some(budget) = &self.0.options.token_budget else { return Ok(()) };
        let Some(limit) = budget.of(tenant) else { return Ok(()) };
        let now = toolgraph_conversations::now_ms();
        let (start, next) = budget.period.bounds(now);
        let used = match self.0.spent.fresh(tenant, start) {
            Some(used) => used,
            None => {
                let used = self.0.store.tenant_tokens_since(tenant, start).await?;
                self.0.spent.keep(tenant, start, used);
                used
            }
        };
        if used < limit {
            return Ok(());
        }
        // Rounded up: a client that waits `Retry-After` seconds finds the new period.
        let retry_after = u64::try_from((next - now + 999) / 1000).unwrap_or(1).max(1);
        Err(ChatError::OverBudget { used, budget: limit, period: budget.period.name(), retry_after })
    }
}

impl SpentCache {
    /// The spending of `tenant` in the period starting at `start`, if read less than
    /// [`SPENT_FRESH`] ago.
    fn fresh(&self, tenant: i64, start: i64) -> Option<u64> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&tenant).filter(|(s, _, at)| *s == start && at.elapsed() < SPENT_FRESH).map(|(_, used, _)| *used)
    }

    fn add(&self, tenant: i64, tokens: u64) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, used, _)) = map.get_mut(&tenant) {
            *used = used.saturating_add(tokens);
        }
    }

    fn keep(&self, tenant: i64, start: i64, used: u64) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SPENT_REMEMBERED {
            map.retain(|_, (_, _, at)| at.elapsed() < SPENT_FRESH);
        }
        map.insert(tenant, (start, used, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-29T18:21:31.250Z.
    const NOW: i64 = 1_795_976_491_250;

    #[test]
    fn periods_start_and_end_on_utc_boundaries() {
        assert_eq!(BudgetPeriod::Hour.bounds(NOW), (1_795_975_200_000, 1_795_978_800_000));
        assert_eq!(BudgetPeriod::Day.bounds(NOW), (1_795_910_400_000, 1_795_996_800_000));
        // 2026-11-01T00:00Z to 2026-12-01T00:00Z.
        assert_eq!(BudgetPeriod::Month.bounds(NOW), (1_793_491_200_000, 1_796_083_200_000));
        // December rolls into January of the next year: 2026-12-31T23:59:59Z.
        assert_eq!(BudgetPeriod::Month.bounds(1_798_761_599_000), (1_796_083_200_000, 1_798_761_600_000));
        // The first instant of a month is in it.
        assert_eq!(BudgetPeriod::Month.bounds(1_796_083_200_000).0, 1_796_083_200_000);
        // Before 1970 too.
        assert_eq!(BudgetPeriod::Day.bounds(-1), (-86_400_000, 0));
    }

    #[test]
    fn a_named_tenants_budget_wins_and_zero_means_none() {
        let budget =
            TokenBudget { tokens: 1_000, period: BudgetPeriod::Day, tenants: HashMap::from([(7, 50_000), (9, 0)]) };
        assert_eq!(budget.of(7), Some(50_000));
        assert_eq!(budget.of(9), None, "exempt");
        assert_eq!(budget.of(8), Some(1_000), "the default");
        assert_eq!(TokenBudget { tokens: 0, ..budget }.of(8), None);
    }
}
