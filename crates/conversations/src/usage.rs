//! Token usage kept with each turn: what the model reported for a turn's calls, one
//! [`TurnUsage`] per model the turn called, so a conversation's cost can be shown and a
//! tenant's spending in a period can be counted against its budget (docs/service.md, "Tokens").
//!
//! A usage row outlives its conversation (deleting a conversation must not give its tokens
//! back to the tenant's budget); it goes with its person's or tenant's data, and with
//! retention's `usage_days`.

use serde::{Deserialize, Serialize};

/// The tokens one turn's calls to one model used, as the model reported them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsage {
    /// The run (the turn, or the resumed part of it after a decision).
    pub run_id: String,
    /// The agent that ran it.
    pub agent: String,
    /// The model's identifier, as it reported it.
    pub model: String,
    /// Tokens of the prompts.
    pub prompt: u64,
    /// Tokens generated.
    pub completion: u64,
    /// Of the prompts' tokens, those a cache of computed prompts held.
    pub cached_prompt: u64,
    /// How many model calls reported these tokens.
    pub calls: u32,
    /// When the turn ended, in ms since the Unix epoch.
    pub at_ms: i64,
}

impl TurnUsage {
    /// The tokens a budget counts: the prompts' and the generated ones.
    pub fn tokens(&self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }
}

/// The most tokens one row keeps: a count a model server got wrong by orders of magnitude is
/// cut here, so that summing a tenant's rows cannot overflow (8 million rows at the cap).
pub const MAX_TOKENS_PER_ROW: u64 = 1 << 40;

/// A count as the databases keep it (a signed 64-bit integer), at most [`MAX_TOKENS_PER_ROW`].
pub(crate) fn to_db(n: u64) -> i64 {
    n.min(MAX_TOKENS_PER_ROW) as i64
}

/// A count read back from the database (a negative one, written by hand, reads as 0).
pub(crate) fn from_db(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The refusal of a store that keeps no usage (a backend's).
pub(crate) fn no_usage() -> crate::StoreError {
    crate::StoreError("this store keeps no token usage: use server.store = \"sqlite\" or \"postgres\"".into())
}
