//! Node kinds a program adds to declared graphs (docs/agents.md, "A node kind of your own"):
//! what only code can do — a [`CustomKind`] registered under a name in [`NodeKinds`], used in a
//! declaration as `kind = "NAME"` with its settings in `with = { … }`, checked when the
//! declaration loads (errors with file, line and field, like every other check) and run as a
//! node of the same graph, over the same state.

use crate::kit::{AgentDeps, AgentState, Reducer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_graph::{Node, NodeError, NodeOutput, RunContext};

/// A node kind of a program's own.
pub trait CustomKind: Send + Sync + 'static {
    /// Checks a node's `with` table when the declaration loads; `Err` says what is wrong (the
    /// error is shown with the node's file, line and field).
    ///
    /// # Errors
    /// Settings the kind cannot run with.
    fn check(&self, with: &Map<String, Value>) -> Result<(), String> {
        let _ = with;
        Ok(())
    }

    /// The node for `decl`, a declared node of this kind that passed [`CustomKind::check`].
    ///
    /// # Errors
    /// Settings the kind cannot run with after all.
    fn node(&self, decl: &CustomNode) -> Result<Arc<dyn Node<AgentState, AgentDeps>>, String>;
}

/// A declared node of a custom kind, as its [`CustomKind::node`] gets it.
#[derive(Debug, Clone)]
pub struct CustomNode {
    /// Its name in the graph.
    pub name: String,
    /// Its `with` table.
    pub with: Map<String, Value>,
    /// Its `channel`, if it names one, and that channel's reducer: a write of the node's own
    /// goes there as a [`ChannelWrite`](crate::kit::ChannelWrite) with this reducer.
    pub channel: Option<(String, Reducer)>,
}

/// The node kinds a program registered, by name.
#[derive(Clone, Default)]
pub struct NodeKinds {
    kinds: BTreeMap<String, Arc<dyn CustomKind>>,
}

impl std::fmt::Debug for NodeKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

/// Why a kind cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// The name is a built-in kind's, or one registered already.
    #[error("a node kind named `{0}` exists already")]
    Taken(String),
    /// The name is not letters, digits, `_` and `-`.
    #[error("`{0}` is not a node kind name: use letters, digits, '_' and '-'")]
    InvalidName(String),
}

impl NodeKinds {
    /// No custom kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `kind` as `name`.
    ///
    /// # Errors
    /// A built-in kind's name, one registered already, or a name that is not one.
    pub fn register(&mut self, name: impl Into<String>, kind: impl CustomKind) -> Result<&mut Self, KindError> {
        let name = name.into();
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(KindError::InvalidName(name));
        }
        if super::format::NodeKind::BUILT_IN.contains(&name.as_str()) || self.kinds.contains_key(&name) {
            return Err(KindError::Taken(name));
        }
        self.kinds.insert(name, Arc::new(kind));
        Ok(self)
    }

    /// The kind registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn CustomKind>> {
        self.kinds.get(name)
    }

    /// The names registered, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }
}

/// A custom node in the graph (the runtime takes nodes by value).
pub(crate) struct Custom(pub Arc<dyn Node<AgentState, AgentDeps>>);

#[async_trait::async_trait]
impl Node<AgentState, AgentDeps> for Custom {
    async fn run(&self, s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
        self.0.run(s, ctx).await
    }
}
