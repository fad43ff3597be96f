//! What retention asks of a store (docs/service.md, "Retention"): which conversations are idle
//! under one rule, and the periodic passes replicas take turns at.
//!
//! The service turns its settings (a default, tenants' and agents' own idle times) into
//! disjoint [`IdleRule`]s — a tenant's rule wins over an agent's, an agent's over the
//! default — so each conversation is judged by exactly one of them.

/// Conversations idle under one rule: no turn since `idle_before_ms`, in the rule's scope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdleRule {
    /// A conversation whose last turn started before this (ms since the Unix epoch) is idle.
    pub idle_before_ms: i64,
    /// Only this tenant's conversations.
    pub tenant: Option<i64>,
    /// Only this agent's conversations.
    pub agent: Option<String>,
    /// Not these tenants' (their own rules judge them).
    pub except_tenants: Vec<i64>,
    /// Not these agents' (their own rules judge them).
    pub except_agents: Vec<String>,
}

impl IdleRule {
    /// Whether the rule judges a conversation of `tenant` with `agent`.
    pub fn covers(&self, tenant: i64, agent: &str) -> bool {
        self.tenant.is_none_or(|t| t == tenant)
            && self.agent.as_deref().is_none_or(|a| a == agent)
            && !self.except_tenants.contains(&tenant)
            && !self.except_agents.iter().any(|a| a == agent)
    }

    /// `except_tenants` as a JSON array (SQLite reads the lists with `json_each`).
    pub(crate) fn tenants_json(&self) -> String {
        serde_json::Value::from(self.except_tenants.clone()).to_string()
    }

    /// `except_agents` as a JSON array.
    pub(crate) fn agents_json(&self) -> String {
        serde_json::Value::from(self.except_agents.clone()).to_string()
    }
}

/// The refusal of a store that keeps no conversations itself (a backend's).
pub(crate) fn no_retention() -> crate::StoreError {
    crate::StoreError("this store's conversations are kept by the backend: retention is the backend's".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_covers_its_scope_minus_its_exceptions() {
        let default = IdleRule { except_tenants: vec![7], except_agents: vec!["legal".into()], ..IdleRule::default() };
        assert!(default.covers(8, "tutor"));
        assert!(!default.covers(7, "tutor"), "tenant 7 has its own rule");
        assert!(!default.covers(8, "legal"), "the legal agent has its own rule");
        let legal = IdleRule { agent: Some("legal".into()), except_tenants: vec![7], ..IdleRule::default() };
        assert!(legal.covers(8, "legal") && !legal.covers(7, "legal") && !legal.covers(8, "tutor"));
        let seven = IdleRule { tenant: Some(7), ..IdleRule::default() };
        assert!(seven.covers(7, "legal") && !seven.covers(8, "legal"));
        assert_eq!(default.tenants_json(), "[7]");
        assert_eq!(default.agents_json(), "[\"legal\"]");
    }
}
