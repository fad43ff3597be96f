//! Prometheus metrics: the chat contract's names and labels (docs/service.md), plus request, model and tool latency.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Most distinct tool names, and tenant ids, that become label values; later ones are counted
/// under [`OTHER_LABEL`]. Tool names are the model's choice and tenant ids the client's, so
/// unbounded they would grow the registry (and every scrape) without limit.
pub const MAX_LABEL_VALUES: usize = 256;

/// The label value of everything past [`MAX_LABEL_VALUES`].
pub const OTHER_LABEL: &str = "other";

/// The label values one label has taken, up to a bound.
#[derive(Default)]
struct LabelValues(Mutex<HashSet<String>>);

impl LabelValues {
    /// Whether `value` is a label value of its own (else it counts as [`OTHER_LABEL`]).
    fn admits(&self, value: &str) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(value) {
            return true;
        }
        // A long value is no name a registry would list; it would only bloat the scrape.
        if seen.len() >= MAX_LABEL_VALUES || value.len() > 64 {
            return false;
        }
        seen.insert(value.to_owned());
        true
    }
}

/// Every metric the service exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `chatbot_stream_duration_seconds{outcome}`: completed, interrupted or error.
    pub stream_duration: HistogramVec,
    /// `chatbot_sql_retries_total{tenant}`: failed read-tool rounds sent back for repair.
    pub sql_retries: IntCounterVec,
    /// `chatbot_hitl_total{confirmed}`.
    pub hitl: IntCounterVec,
    /// `chatbot_errors_total{error_type}`: recursion or exception.
    pub errors: IntCounterVec,
    /// `toolgraph_http_requests_total{route,status}`.
    pub requests: IntCounterVec,
    /// `toolgraph_llm_call_seconds{agent}`: one model call, whichever node makes it (the
    /// crisis screen's verdict as much as a ReAct step).
    pub llm_latency: HistogramVec,
    /// `toolgraph_tool_call_seconds{tool}`.
    pub tool_latency: HistogramVec,
    /// `toolgraph_llm_tokens_total{tenant,agent,model,kind}`: the tokens model calls used, as
    /// the model reported them; `kind` is `prompt`, `completion` or `cached_prompt` (the part
    /// of the prompt a cache held, also counted in `prompt`).
    pub tokens: IntCounterVec,
    tools: Arc<LabelValues>,
    models: Arc<LabelValues>,
    tenants: Arc<LabelValues>,
}

fn histogram(name: &str, help: &str, label: &str, buckets: Vec<f64>) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), &[label])
        .expect("static metric definition is valid") // invariant: literal names
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition is valid") // invariant: literal names
}

impl Default for Metrics {
    fn default() -> Self {
        let secs = vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
        let m = Self {
            registry: Registry::new(),
            stream_duration: histogram(
                "chatbot_stream_duration_seconds",
                "End-to-end duration of a stream run",
                "outcome",
                secs.clone(),
            ),
            sql_retries: counter("chatbot_sql_retries_total", "Read-query retry attempts", &["tenant"]),
            hitl: counter("chatbot_hitl_total", "Human confirmation decisions", &["confirmed"]),
            errors: counter("chatbot_errors_total", "Graph failures by type", &["error_type"]),
            requests: counter(
                "toolgraph_http_requests_total",
                "HTTP requests by route and status",
                &["route", "status"],
            ),
            llm_latency: histogram("toolgraph_llm_call_seconds", "Model call latency", "agent", secs.clone()),
            tool_latency: histogram("toolgraph_tool_call_seconds", "Tool call latency", "tool", secs),
            tokens: counter(
                "toolgraph_llm_tokens_total",
                "Tokens used by model calls, as the model reported them",
                &["tenant", "agent", "model", "kind"],
            ),
            tools: Arc::default(),
            models: Arc::default(),
            tenants: Arc::default(),
        };
        for c in [&m.sql_retries, &m.hitl, &m.errors, &m.requests, &m.tokens] {
            m.registry.register(Box::new(c.clone())).expect("each metric is registered once"); // invariant
        }
        for h in [&m.stream_duration, &m.llm_latency, &m.tool_latency] {
            m.registry.register(Box::new(h.clone())).expect("each metric is registered once"); // invariant
        }
        // Zero series so dashboards and tests see the names before the first event.
        for t in ["recursion", "exception"] {
            m.errors.with_label_values(&[t]);
        }
        m
    }
}

impl Metrics {
    /// The `tool` label of tool `name`: itself, or [`OTHER_LABEL`] past the bound.
    pub fn tool_label<'a>(&self, name: &'a str) -> &'a str {
        if self.tools.admits(name) { name } else { OTHER_LABEL }
    }

    /// Counts one model call's tokens for `tenant` and `agent` (agents are the configuration's,
    /// so bounded; models and tenants are bounded like tools).
    pub fn count_tokens(&self, tenant: i64, agent: &str, usage: &toolgraph_graph::TokenUsage) {
        let tenant = self.tenant_label(tenant);
        let model = if self.models.admits(&usage.model) { usage.model.as_str() } else { OTHER_LABEL };
        for (kind, n) in
            [("prompt", usage.prompt), ("completion", usage.completion), ("cached_prompt", usage.cached_prompt)]
        {
            self.tokens.with_label_values(&[tenant.as_str(), agent, model, kind]).inc_by(n);
        }
    }

    /// The `tenant` label of a tenant id: itself, or [`OTHER_LABEL`] past the bound.
    pub fn tenant_label(&self, tenant: i64) -> String {
        let id = tenant.to_string();
        if self.tenants.admits(&id) { id } else { OTHER_LABEL.to_owned() }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_bounded() {
        let m = Metrics::default();
        for i in 0..(MAX_LABEL_VALUES + 50) {
            let name = format!("tool_{i}");
            m.tool_latency.with_label_values(&[m.tool_label(&name)]).observe(0.1);
        }
        assert_eq!(m.tool_label("tool_0"), "tool_0", "a value seen early keeps its label");
        assert_eq!(m.tool_label("made_up_by_the_model"), OTHER_LABEL);
        assert_eq!(m.tool_label(&"x".repeat(65)), OTHER_LABEL);
        let series = m.render().lines().filter(|l| l.starts_with("toolgraph_tool_call_seconds_count")).count();
        assert_eq!(series, MAX_LABEL_VALUES + 1, "the bound plus one series for the rest");
        assert_eq!(m.tenant_label(7), "7");
    }
}
