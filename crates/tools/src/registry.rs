//! [`ToolRegistry`]: the named set of tools an agent may call, and the one place calls run.

use crate::context::ToolContext;
use crate::outcome::{ToolError, ToolOutcome};
use crate::spec::ToolSpec;
use crate::tool::{Tool, execute};
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
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool.
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] when the name is taken.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate { name });
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Specs of every tool, ordered by name.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|t| t.spec())
    }

    /// Names of every tool, ordered.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The registry restricted to `names` (an agent's enabled tools).
    ///
    /// # Errors
    /// [`RegistryError::Unknown`] for the first name that is not registered.
    pub fn subset<S: AsRef<str>>(&self, names: impl IntoIterator<Item = S>) -> Result<Self, RegistryError> {
        let mut out = Self::new();
        for name in names {
            let name = name.as_ref();
            let tool = self.tools.get(name).ok_or_else(|| RegistryError::Unknown {
                name: name.to_owned(),
                available: self.names().collect::<Vec<_>>().join(", "),
            })?;
            out.tools.insert(name.to_owned(), Arc::clone(tool));
        }
        Ok(out)
    }

    /// Calls tool `name`. An unknown name is an outcome the model can read, not an error of
    /// the run (as the academy admin's contract asks: the tool node records a tool message saying so).
    pub async fn call(&self, ctx: &ToolContext, name: &str, arguments: &Value) -> ToolOutcome {
        match self.tools.get(name) {
            Some(tool) => execute(tool.as_ref(), ctx, arguments).await,
            None => ToolOutcome::Failure(ToolError::not_found(format!(
                "unknown tool '{name}'; available tools: {}",
                self.names().collect::<Vec<_>>().join(", ")
            ))),
        }
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

    #[test]
    fn duplicates_and_unknown_subsets_are_refused() {
        let mut reg = ToolRegistry::new();
        reg.register(guia()).unwrap();
        assert_eq!(reg.register(guia()), Err(RegistryError::Duplicate { name: "get_guia".into() }));
        let sub = reg.subset(["get_guia"]).unwrap();
        assert_eq!(sub.names().collect::<Vec<_>>(), vec!["get_guia"]);
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
}
