//! [`ToolRegistry`]: the named set of tools an agent may call, and the one place calls run.

use crate::context::ToolContext;
use crate::outcome::{ToolError, ToolOutcome};
use crate::set::ToolSet;
use crate::spec::ToolSpec;
use crate::tool::{Tool, cap_outcome, execute};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Misuse of a registry, caught when tools are registered or an agent is configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tools with one name: the second would silently shadow the first.
    #[error("a tool named '{name}' is already registered")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// An agent enables a tool that does not exist.
    #[error("unknown tool '{name}'; registered tools: {available}")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        available: String,
    },
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRequest {
    /// The provider's call id, echoed in the tool message.
    pub id: String,
    /// The tool name as the model wrote it.
    pub name: String,
    /// The arguments as parsed JSON.
    pub arguments: Value,
}

impl ToolCallRequest {
    /// Parses the raw argument text a model streamed. Empty text means no arguments.
    ///
    /// # Errors
    /// An `invalid_arguments` error naming the JSON problem, for the model to repair.
    pub fn parse_arguments(raw: &str) -> Result<Value, ToolError> {
        if raw.trim().is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_str(raw)
            .map_err(|e| ToolError::invalid_arguments(format!("arguments are not valid JSON ({e}): {raw}")))
    }
}

/// Tools by name. Cloning is cheap (tools are shared), so each agent can hold its own
/// enabled subset ([`ToolRegistry::subset`]).
///
/// Besides single tools it holds [`ToolSet`]s, whose members change while the process runs:
/// every lookup sees a set's members of the moment. A tool registered on its own wins over a
/// set member of the same name (a plugin never replaces a tool of toolgraph's), and an earlier
/// set over a later one.
///
/// No call's outcome is larger than [`ToolRegistry::max_outcome_bytes`] (docs/tools.md).
#[derive(Clone)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    sets: Vec<Arc<ToolSet>>,
    max_outcome_bytes: usize,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self { tools: BTreeMap::new(), sets: Vec::new(), max_outcome_bytes: Self::DEFAULT_MAX_OUTCOME_BYTES }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl ToolRegistry {
    /// The default largest outcome, in bytes of the text the model reads: about 16,000 tokens.
    /// The outcome is stored in the conversation and sent to the model again on every later
    /// step, so more would crowd out the rest of its context.
    pub const DEFAULT_MAX_OUTCOME_BYTES: usize = 64 * 1024;
    /// The smallest limit a registry takes: room for the failure that replaces a larger outcome.
    pub const MIN_OUTCOME_BYTES: usize = 1024;

    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest outcome a call returns, in bytes of its text for the model
    /// ([`ToolOutcome::to_model_text`]). A larger text is cut and marked, a larger failure
    /// message cut, and any larger value replaced by an `invalid_arguments` failure telling the
    /// model to ask for less.
    pub fn max_outcome_bytes(&self) -> usize {
        self.max_outcome_bytes
    }

    /// Sets [`ToolRegistry::max_outcome_bytes`] (default [`ToolRegistry::DEFAULT_MAX_OUTCOME_BYTES`],
    /// at least [`ToolRegistry::MIN_OUTCOME_BYTES`]); subsets taken afterwards keep it.
    pub fn set_max_outcome_bytes(&mut self, bytes: usize) {
        self.max_outcome_bytes = bytes.max(Self::MIN_OUTCOME_BYTES);
    }

    /// Adds a tool.
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] when the name is taken.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        if self.get(&name).is_some() || self.sets.iter().any(|s| s.name() == name) {
            return Err(RegistryError::Duplicate { name });
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    /// Adds a set whose members may change later.
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] when the set's name, or a present member's, is taken.
    pub fn register_set(&mut self, set: Arc<ToolSet>) -> Result<(), RegistryError> {
        let taken = |name: &str| self.get(name).is_some() || self.sets.iter().any(|s| s.name() == name);
        if taken(set.name()) {
            return Err(RegistryError::Duplicate { name: set.name().to_owned() });
        }
        if let Some(member) = set.members().iter().find(|t| taken(&t.spec().name)) {
            return Err(RegistryError::Duplicate { name: member.spec().name.clone() });
        }
        self.sets.push(set);
        Ok(())
    }

    /// The tool called `name` now.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        if let Some(tool) = self.tools.get(name) {
            return Some(Arc::clone(tool));
        }
        self.sets.iter().find_map(|s| s.members().iter().find(|t| t.spec().name == name).cloned())
    }

    /// Every tool now, ordered by name.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut all = self.tools.clone();
        for set in &self.sets {
            for tool in set.members().iter() {
                all.entry(tool.spec().name.clone()).or_insert_with(|| Arc::clone(tool));
            }
        }
        all.into_values().collect()
    }

    /// Specs of every tool now, ordered by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools().iter().map(|t| t.spec().clone()).collect()
    }

    /// Names of every tool now, ordered.
    pub fn names(&self) -> Vec<String> {
        if self.sets.is_empty() {
            return self.tools.keys().cloned().collect();
        }
        self.tools().iter().map(|t| t.spec().name.clone()).collect()
    }

    /// How many tools there are now.
    pub fn len(&self) -> usize {
        if self.sets.is_empty() { self.tools.len() } else { self.tools().len() }
    }

    /// Whether there is no tool now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes whenever a set's members change: compare it to know when what the tools look
    /// like (the definitions sent to a model) must be read again.
    pub fn generation(&self) -> u64 {
        self.sets.iter().fold(0u64, |sum, s| sum.wrapping_add(s.generation()))
    }

    /// The registry restricted to `names` (an agent's enabled tools): a tool's name enables
    /// that tool; a set's name enables the whole set, members that come later included.
    ///
    /// # Errors
    /// [`RegistryError::Unknown`] for the first name that is neither.
    pub fn subset<S: AsRef<str>>(&self, names: impl IntoIterator<Item = S>) -> Result<Self, RegistryError> {
        let mut out = Self { max_outcome_bytes: self.max_outcome_bytes, ..Self::new() };
        for name in names {
            let name = name.as_ref();
            if let Some(set) = self.sets.iter().find(|s| s.name() == name) {
                if !out.sets.iter().any(|s| Arc::ptr_eq(s, set)) {
                    out.sets.push(Arc::clone(set));
                }
                continue;
            }
            let tool = self.get(name).ok_or_else(|| {
                let mut available = self.names();
                available.extend(self.sets.iter().map(|s| format!("{} (all of it)", s.name())));
                RegistryError::Unknown { name: name.to_owned(), available: available.join(", ") }
            })?;
            out.tools.insert(name.to_owned(), tool);
        }
        Ok(out)
    }

    /// Calls tool `name`. An unknown name is an outcome the model can read, not an error of
    /// the run (as the academy admin's contract asks: the tool node records a tool message saying so).
    /// The outcome is at most [`ToolRegistry::max_outcome_bytes`] long.
    pub async fn call(&self, ctx: &ToolContext, name: &str, arguments: &Value) -> ToolOutcome {
        let outcome = match self.get(name) {
            Some(tool) => execute(tool.as_ref(), ctx, arguments).await,
            None => ToolOutcome::Failure(ToolError::not_found(format!(
                "unknown tool '{name}'; available tools: {}",
                self.names().join(", ")
            ))),
        };
        cap_outcome(name, outcome, self.max_outcome_bytes)
    }

    /// Runs several calls from one model turn concurrently; outcomes keep the calls' order.
    pub async fn call_many(&self, ctx: &ToolContext, calls: &[ToolCallRequest]) -> Vec<ToolOutcome> {
        futures::future::join_all(calls.iter().map(|c| self.call(ctx, &c.name, &c.arguments))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolBuilder;
    use crate::outcome::ToolErrorKind;
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[derive(Deserialize, JsonSchema)]
    struct Empty {}

    #[derive(Deserialize, JsonSchema)]
    struct GuiaArgs {
        /// Subject identifier (injected from state).
        asignatura: Option<String>,
        /// Dot path of a section, e.g. `competencias.generales`.
        key: Option<String>,
    }

    fn guia() -> Arc<dyn Tool> {
        ToolBuilder::<GuiaArgs>::new("get_guia", "Look up the teaching guide of the current subject")
            .inject("asignatura")
            .handler(|_ctx, a| async move { Ok(json!({ "asignatura": a.asignatura, "key": a.key })) })
            .unwrap()
    }

    #[tokio::test]
    async fn injected_argument_is_hidden_from_the_model_but_present_at_call_time() {
        let tool = guia();
        assert!(tool.spec().parameters["properties"].get("asignatura").is_none());
        assert_eq!(tool.spec().injected, vec!["asignatura".to_string()]);
        let mut reg = ToolRegistry::new();
        reg.register(tool).unwrap();
        let ctx = ToolContext::default().set("asignatura", json!("iv"));
        // The model tries to choose the subject itself: state wins.
        let out = reg.call(&ctx, "get_guia", &json!({"key": "competencias", "asignatura": "other"})).await;
        assert_eq!(out.to_json(), json!({"asignatura": "iv", "key": "competencias"}));
    }

    #[tokio::test]
    async fn unknown_tool_is_an_outcome_naming_the_alternatives() {
        let mut reg = ToolRegistry::new();
        reg.register(guia()).unwrap();
        let out = reg.call(&ToolContext::default(), "get_weather", &json!({})).await;
        let err = out.error().unwrap();
        assert_eq!(err.kind, ToolErrorKind::NotFound);
        assert!(err.message.contains("unknown tool 'get_weather'"), "{}", err.message);
        assert!(err.message.contains("get_guia"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_panicking_tool_becomes_an_internal_outcome() {
        let t = ToolBuilder::<Empty>::new("boom", "panics")
            .handler(|_c, _a| async move {
                if true {
                    panic!("index out of bounds");
                }
                Ok(json!(null))
            })
            .unwrap();
        let mut reg = ToolRegistry::new();
        reg.register(t).unwrap();
        let out = reg.call(&ToolContext::default(), "boom", &json!({})).await;
        let err = out.error().unwrap();
        assert_eq!(err.kind, ToolErrorKind::Internal);
        assert!(err.message.contains("index out of bounds"), "{}", err.message);
        // The registry still works afterwards.
        assert!(reg.call(&ToolContext::default(), "boom", &json!([])).await.error().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_tool_becomes_a_timeout_outcome() {
        let t = ToolBuilder::<Empty>::new("hang", "never returns")
            .timeout(Duration::from_secs(2))
            .handler(|_c, _a| async move {
                std::future::pending::<()>().await;
                Ok(json!(null))
            })
            .unwrap();
        let mut reg = ToolRegistry::new();
        reg.register(t).unwrap();
        let out = reg.call(&ToolContext::default(), "hang", &json!({})).await;
        let err = out.error().unwrap();
        assert_eq!(err.kind, ToolErrorKind::Timeout);
        assert_eq!(out.to_json()["ok"], json!(false));
        assert!(err.message.contains("2s"), "{}", err.message);
    }

    #[tokio::test]
    async fn calls_of_one_turn_run_concurrently_and_keep_their_order() {
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        #[derive(Deserialize, JsonSchema)]
        struct Wait {
            ms: u64,
        }
        let (r, p) = (running.clone(), peak.clone());
        let t = ToolBuilder::<Wait>::new("wait", "sleeps")
            .handler(move |_c, a| {
                let (r, p) = (r.clone(), p.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(a.ms)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(json!(a.ms))
                }
            })
            .unwrap();
        let mut reg = ToolRegistry::new();
        reg.register(t).unwrap();
        let calls: Vec<_> = [30u64, 10, 20]
            .iter()
            .enumerate()
            .map(|(i, ms)| ToolCallRequest { id: format!("c{i}"), name: "wait".into(), arguments: json!({"ms": ms}) })
            .collect();
        let outs = reg.call_many(&ToolContext::default(), &calls).await;
        assert_eq!(outs.iter().map(ToolOutcome::to_json).collect::<Vec<_>>(), vec![json!(30), json!(10), json!(20)]);
        assert_eq!(peak.load(Ordering::SeqCst), 3, "all three calls were in flight at once");
    }

    #[derive(Deserialize, JsonSchema)]
    struct Size {
        bytes: usize,
    }

    /// Tools whose results are `bytes` long: a JSON list, a text, and a failure message.
    fn oversized() -> ToolRegistry {
        let mut reg = ToolRegistry::new();
        let list = ToolBuilder::<Size>::new("list", "a long list")
            .handler(|_c, a: Size| async move { Ok(json!(vec![1u8; a.bytes / 2])) })
            .unwrap();
        let text = ToolBuilder::<Size>::new("text", "a long text")
            .handler(|_c, a: Size| async move { Ok(json!("é".repeat(a.bytes / 2))) })
            .unwrap();
        let fail = ToolBuilder::<Size>::new("fail", "a long failure")
            .handler(|_c, a: Size| async move { Err::<Value, _>(ToolError::unavailable("x".repeat(a.bytes))) })
            .unwrap();
        for tool in [list, text, fail] {
            reg.register(tool).unwrap();
        }
        reg
    }

    /// No outcome larger than the limit reaches the history or the model: a value is replaced
    /// by a failure saying so, a text and a failure's message are cut and marked.
    #[tokio::test]
    async fn an_outcome_over_the_size_limit_is_replaced_or_cut_and_says_so() {
        let reg = oversized();
        let ctx = ToolContext::default();
        let limit = 64 * 1024;
        let big = json!({"bytes": 10 * limit});
        let out = reg.call(&ctx, "list", &big).await;
        let err = out.error().expect("replaced by a failure");
        assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
        assert!(err.message.contains("too large") && err.message.contains("narrow"), "{}", err.message);
        let text = reg.call(&ctx, "text", &big).await.to_model_text();
        assert!(text.len() <= limit && text.starts_with("éé"), "{}", text.len());
        let marker = "[cut: the result was 655360 bytes, over the limit of 65536 bytes";
        assert!(text[text.len().saturating_sub(200)..].contains(marker), "{:.100}", &text[text.len() - 100..]);
        let out = reg.call(&ctx, "fail", &big).await;
        assert_eq!(out.error().unwrap().kind, ToolErrorKind::Unavailable);
        assert!(out.to_model_text().len() <= limit, "{}", out.to_model_text().len());
        // A smaller limit, kept by subsets; an unknown tool's long name is cut like any failure.
        let mut reg = reg;
        reg.set_max_outcome_bytes(10);
        assert_eq!(reg.max_outcome_bytes(), ToolRegistry::MIN_OUTCOME_BYTES, "raised to the least that works");
        reg.set_max_outcome_bytes(4000);
        let sub = reg.subset(["list", "text"]).unwrap();
        assert_eq!(sub.max_outcome_bytes(), 4000);
        assert!(sub.call(&ctx, "list", &json!({"bytes": 5000})).await.error().unwrap().message.contains("4000 bytes"));
        let out = sub.call(&ctx, &"x".repeat(10_000), &json!({})).await;
        assert_eq!(out.error().unwrap().kind, ToolErrorKind::NotFound);
        assert!(out.to_model_text().len() <= 4000, "{}", out.to_model_text().len());
        // Within the limit, nothing changes.
        let small = json!({"bytes": 1000});
        assert_eq!(reg.call(&ctx, "list", &small).await.to_json(), json!(vec![1u8; 500]));
        assert_eq!(reg.call(&ctx, "text", &small).await.to_json(), json!("é".repeat(500)));
    }

    #[test]
    fn duplicates_and_unknown_subsets_are_refused() {
        let mut reg = ToolRegistry::new();
        reg.register(guia()).unwrap();
        assert_eq!(reg.register(guia()), Err(RegistryError::Duplicate { name: "get_guia".into() }));
        let sub = reg.subset(["get_guia"]).unwrap();
        assert_eq!(sub.names(), vec!["get_guia"]);
        assert!(matches!(reg.subset(["nope"]), Err(RegistryError::Unknown { .. })));
    }

    #[test]
    fn raw_argument_text_is_parsed_or_explained() {
        assert_eq!(ToolCallRequest::parse_arguments("").unwrap(), json!({}));
        assert_eq!(ToolCallRequest::parse_arguments(r#"{"a":1}"#).unwrap(), json!({"a": 1}));
        let err = ToolCallRequest::parse_arguments(r#"{"a":"#).unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
        assert!(err.message.contains("not valid JSON"));
    }

    #[tokio::test]
    async fn non_object_arguments_are_explained() {
        let mut reg = ToolRegistry::new();
        reg.register(guia()).unwrap();
        let out = reg.call(&ToolContext::default(), "get_guia", &json!([1, 2])).await;
        assert!(out.error().unwrap().message.contains("must be a JSON object"));
    }

    fn named(name: &str) -> Arc<dyn Tool> {
        ToolBuilder::<Empty>::new(name, "A tool").handler(|_ctx, _a| async move { Ok(json!(null)) }).unwrap()
    }

    #[test]
    fn a_set_is_seen_as_it_is_now_and_never_replaces_a_single_tool() {
        let set = Arc::new(ToolSet::new("remote", vec![named("remote_a")]));
        let mut reg = ToolRegistry::new();
        reg.register(guia()).unwrap();
        reg.register_set(Arc::clone(&set)).unwrap();
        let by_name = reg.subset(["remote"]).unwrap();
        let by_member = reg.subset(["remote_a"]).unwrap();
        assert_eq!(reg.names(), ["get_guia", "remote_a"]);
        let generation = reg.generation();

        set.replace(vec![named("remote_b"), named("get_guia")]);
        assert_ne!(reg.generation(), generation);
        assert_eq!(reg.names(), ["get_guia", "remote_b"], "the single tool wins over a member of its name");
        assert!(Arc::ptr_eq(
            &reg.get("get_guia").unwrap(),
            &reg.subset(["get_guia"]).unwrap().get("get_guia").unwrap()
        ));
        assert_eq!(by_name.names(), ["get_guia", "remote_b"], "enabled by the set's name: its members now");
        assert_eq!(by_member.names(), ["remote_a"], "enabled by a member's name: that tool");

        // Names are unique across tools and sets.
        let clash = Arc::new(ToolSet::new("get_guia", Vec::new()));
        assert_eq!(reg.register_set(clash), Err(RegistryError::Duplicate { name: "get_guia".into() }));
        let clash = Arc::new(ToolSet::new("other", vec![named("remote_b")]));
        assert_eq!(reg.register_set(clash), Err(RegistryError::Duplicate { name: "remote_b".into() }));
        assert_eq!(reg.register(named("remote")), Err(RegistryError::Duplicate { name: "remote".into() }));
        let err = reg.subset(["nope"]).unwrap_err().to_string();
        assert!(err.contains("remote (all of it)"), "{err}");
    }
}
