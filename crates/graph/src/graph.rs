//! [`StateGraph`] (building and validating a graph) and [`CompiledGraph`] (a runnable one).

use crate::checkpoint::Checkpointer;
use crate::error::GraphBuildError;
use crate::node::{END, Node, START};
use crate::shape::{EdgeKind, GraphShape, ShapeEdge};
use crate::state::State;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Threads whose heads a compiled graph keeps in memory.
const HEAD_CACHE_CAPACITY: usize = 4096;

/// Threads whose recorded runs a compiled graph keeps folded (a few hundred bytes a run).
const RUNS_CACHE_CAPACITY: usize = 1024;

pub(crate) type Router<S> = Arc<dyn Fn(&S) -> String + Send + Sync>;

pub(crate) enum Edge<S> {
    To(String),
    Branch { router: Router<S>, targets: Vec<String> },
}

impl<S> Edge<S> {
    fn targets(&self) -> Vec<&str> {
        match self {
            Self::To(t) => vec![t.as_str()],
            Self::Branch { targets, .. } => targets.iter().map(String::as_str).collect(),
        }
    }
}

/// A graph under construction.
///
/// ```
/// # use serde::{Deserialize, Serialize};
/// # use toolgraph_graph::*;
/// # #[derive(Clone, Default, Serialize, Deserialize)] struct S { n: u32 }
/// # impl State for S { type Update = u32; fn apply(&mut self, u: u32) { self.n += u } }
/// let mut g = StateGraph::<S, ()>::new();
/// g.add_node("count", |_s: std::sync::Arc<S>, _c: RunContext<()>| async { Ok(NodeOutput::Update(1)) });
/// g.add_edge(START, "count");
/// g.add_conditional_edges("count", |s: &S| if s.n < 3 { "count".into() } else { END.into() }, ["count", END]);
/// let graph = g.compile((), std::sync::Arc::new(MemoryCheckpointer::new())).unwrap();
/// assert!(graph.to_mermaid().contains("count -.-> __end__"));
/// ```
pub struct StateGraph<S: State, C> {
    nodes: Vec<(String, Arc<dyn Node<S, C>>)>,
    edges: Vec<(String, Edge<S>)>,
    resumes: Vec<(String, String)>,
    recovery: Option<Recovery<S>>,
    version: Option<Arc<str>>,
}

impl<S: State, C: Send + Sync + 'static> Default for StateGraph<S, C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: State, C: Send + Sync + 'static> StateGraph<S, C> {
    /// An empty graph.
    pub fn new() -> Self {
        Self { nodes: Vec::new(), edges: Vec::new(), resumes: Vec::new(), recovery: None, version: None }
    }

    /// Adds a node.
    pub fn add_node(&mut self, name: impl Into<String>, node: impl Node<S, C>) -> &mut Self {
        self.nodes.push((name.into(), Arc::new(node)));
        self
    }

    /// An unconditional edge.
    pub fn add_edge(&mut self, from: impl Into<String>, to: impl Into<String>) -> &mut Self {
        self.edges.push((from.into(), Edge::To(to.into())));
        self
    }

    /// A branch: `router` picks one of `targets` from the state after `from` ran.
    pub fn add_conditional_edges<I, T>(
        &mut self,
        from: impl Into<String>,
        router: impl Fn(&S) -> String + Send + Sync + 'static,
        targets: I,
    ) -> &mut Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let targets = targets.into_iter().map(Into::into).collect();
        self.edges.push((from.into(), Edge::Branch { router: Arc::new(router), targets }));
        self
    }

    /// What to add to the stored state of a run that stopped mid-way, so the state is whole
    /// again before anything else runs — e.g. results for calls that were never answered, and
    /// a reply saying the turn was cut short. Called with [`StopCause::Died`] when the thread
    /// is next used after its process died (see [`CompiledGraph::close_interrupted`]) or when
    /// the run is cancelled (shutdown, a lost lease, a client's cancel), and with [`StopCause::Failed`] when the
    /// run fails or hits the recursion limit. A resumed run that stops before its first
    /// checkpoint is not closed at all: its pause and decisions stand. Without it such a run
    /// is closed with no state change. (A fork taken mid-run is closed without it.)
    pub fn set_recovery(&mut self, recovery: fn(&S, StopCause) -> Option<S::Update>) -> &mut Self {
        self.recovery = Some(recovery);
        self
    }

    /// Names this graph's version (a declaration's digest): every checkpoint it writes records
    /// it, so whoever serves several versions side by side resumes a paused run on the one
    /// that paused it.
    pub fn set_version(&mut self, version: impl Into<Arc<str>>) -> &mut Self {
        self.version = Some(version.into());
        self
    }

    /// Declares that `node` may pause and resume at `resume_at` (validated, and drawn).
    pub fn add_resume(&mut self, node: impl Into<String>, resume_at: impl Into<String>) -> &mut Self {
        self.resumes.push((node.into(), resume_at.into()));
        self
    }

    /// Validates the graph and binds it to its dependencies and checkpoint store.
    ///
    /// # Errors
    /// A duplicate or reserved node name, an edge from or to an unknown node, no entry, a
    /// node without exactly one outgoing edge, an empty branch, an unreachable node.
    pub fn compile(self, deps: C, checkpointer: Arc<dyn Checkpointer>) -> Result<CompiledGraph<S, C>, GraphBuildError> {
        let mut nodes = HashMap::new();
        for (name, node) in self.nodes {
            let named = (Arc::from(name.as_str()), node);
            if name == START || name == END || name.is_empty() || nodes.insert(name.clone(), named).is_some() {
                return Err(GraphBuildError::DuplicateNode(name));
            }
        }
        let mut edges: HashMap<String, Edge<S>> = HashMap::new();
        let mut entry = None;
        for (from, edge) in self.edges {
            if let Edge::Branch { targets, .. } = &edge
                && targets.is_empty()
            {
                return Err(GraphBuildError::EmptyRouter(from));
            }
            for t in edge.targets() {
                if t != END && !nodes.contains_key(t) {
                    return Err(GraphBuildError::UnknownNode { from: from.clone(), to: t.to_owned() });
                }
            }
            if from == START {
                if entry.replace(edge).is_some() {
                    return Err(GraphBuildError::TwoExits(START.into()));
                }
                continue;
            }
            if !nodes.contains_key(&from) {
                return Err(GraphBuildError::UnknownSource(from));
            }
            if edges.insert(from.clone(), edge).is_some() {
                return Err(GraphBuildError::TwoExits(from));
            }
        }
        let entry = entry.ok_or(GraphBuildError::NoEntry)?;
        for (from, to) in &self.resumes {
            if !nodes.contains_key(from) {
                return Err(GraphBuildError::UnknownSource(from.clone()));
            }
            if !nodes.contains_key(to) {
                return Err(GraphBuildError::UnknownResume { from: from.clone(), to: to.clone() });
            }
        }
        let mut names: Vec<&String> = nodes.keys().collect();
        names.sort();
        if let Some(n) = names.iter().find(|n| !edges.contains_key(n.as_str())) {
            return Err(GraphBuildError::NoExit((*n).clone()));
        }
        // Reachability from START over edges and resume links.
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<String> = entry.targets().into_iter().map(str::to_owned).collect();
        while let Some(n) = queue.pop_front() {
            if n == END || !seen.insert(n.clone()) {
                continue;
            }
            if let Some(e) = edges.get(&n) {
                queue.extend(e.targets().into_iter().map(str::to_owned));
            }
            queue.extend(self.resumes.iter().filter(|(f, _)| *f == n).map(|(_, t)| t.clone()));
        }
        if let Some(n) = names.iter().find(|n| !seen.contains(n.as_str())) {
            return Err(GraphBuildError::Unreachable((*n).clone()));
        }
        let mermaid = mermaid(&names, &entry, &edges, &self.resumes);
        let shape = shape(&names, &entry, &edges, &self.resumes);
        Ok(CompiledGraph {
            inner: Arc::new(Inner {
                nodes,
                edges,
                entry,
                deps: Arc::new(deps),
                checkpointer,
                heads: crate::heads::HeadCache::new(HEAD_CACHE_CAPACITY),
                runs: crate::heads::RunsCache::new(RUNS_CACHE_CAPACITY),
                recovery: self.recovery,
                version: self.version,
                mermaid,
                shape,
            }),
        })
    }
}

fn shape<S>(
    names: &[&String],
    entry: &Edge<S>,
    edges: &HashMap<String, Edge<S>>,
    resumes: &[(String, String)],
) -> GraphShape {
    let mut out = Vec::new();
    let mut add = |from: &str, edge: &Edge<S>| {
        let kind = if matches!(edge, Edge::Branch { .. }) { EdgeKind::Branch } else { EdgeKind::Direct };
        out.extend(edge.targets().into_iter().map(|to| ShapeEdge { from: from.to_owned(), to: to.to_owned(), kind }));
    };
    add(START, entry);
    for n in names {
        if let Some(e) = edges.get(n.as_str()) {
            add(n, e);
        }
    }
    out.extend(resumes.iter().map(|(from, to)| ShapeEdge {
        from: from.clone(),
        to: to.clone(),
        kind: EdgeKind::Approval,
    }));
    let nodes = std::iter::once(START.to_owned()).chain(names.iter().map(|n| (*n).clone())).chain([END.to_owned()]);
    GraphShape { nodes: nodes.collect(), edges: out }
}

fn mermaid<S>(
    names: &[&String],
    entry: &Edge<S>,
    edges: &HashMap<String, Edge<S>>,
    resumes: &[(String, String)],
) -> String {
    let mut out = String::from("flowchart TD\n");
    out.push_str(&format!("    {START}([START])\n"));
    for n in names {
        let id = mermaid_id(n);
        if id == n.as_str() {
            out.push_str(&format!("    {n}[{n}]\n"));
        } else {
            out.push_str(&format!("    {id}[\"{n}\"]\n"));
        }
    }
    out.push_str(&format!("    {END}([END])\n"));
    let mut draw = |from: &str, edge: &Edge<S>| {
        for t in edge.targets() {
            let arrow = if matches!(edge, Edge::Branch { .. }) { "-.->" } else { "-->" };
            out.push_str(&format!("    {} {arrow} {}\n", mermaid_id(from), mermaid_id(t)));
        }
    };
    draw(START, entry);
    for n in names {
        if let Some(e) = edges.get(n.as_str()) {
            draw(n, e);
        }
    }
    for (from, to) in resumes {
        out.push_str(&format!("    {} == \"approval\" ==> {}\n", mermaid_id(from), mermaid_id(to)));
    }
    out
}

/// Node `name` as a Mermaid id: itself when Mermaid reads it as one, else with each other
/// character as `_` (a sub-graph's `billing/agent` is `billing_agent`, labelled with its name).
fn mermaid_id(name: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.chars().all(plain) {
        name.into()
    } else {
        name.chars().map(|c| if plain(c) { c } else { '_' }).collect::<String>().into()
    }
}

/// See [`StateGraph::set_recovery`].
pub(crate) type Recovery<S> = fn(&S, StopCause) -> Option<<S as State>::Update>;

/// Why [`StateGraph::set_recovery`]'s function is closing a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The run stopped without finishing its step: its process died (found when the thread
    /// is next used), or it was cancelled (the service is shutting down, or its lease on the
    /// thread was lost).
    Died,
    /// The run failed: a node returned an error, the store refused a checkpoint, or the
    /// recursion limit was reached.
    Failed,
}

/// A node with its name, shared: a run hands the name to every step's context.
pub(crate) type NamedNode<S, C> = (Arc<str>, Arc<dyn Node<S, C>>);

pub(crate) struct Inner<S: State, C> {
    pub(crate) nodes: HashMap<String, NamedNode<S, C>>,
    pub(crate) edges: HashMap<String, Edge<S>>,
    pub(crate) entry: Edge<S>,
    pub(crate) deps: Arc<C>,
    pub(crate) checkpointer: Arc<dyn Checkpointer>,
    pub(crate) heads: crate::heads::HeadCache<S>,
    pub(crate) runs: crate::heads::RunsCache,
    pub(crate) recovery: Option<Recovery<S>>,
    pub(crate) version: Option<Arc<str>>,
    mermaid: String,
    shape: GraphShape,
}

/// A validated graph bound to its dependencies and checkpoint store. Cheap to clone.
pub struct CompiledGraph<S: State, C> {
    pub(crate) inner: Arc<Inner<S, C>>,
}

impl<S: State, C> Clone for CompiledGraph<S, C> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<S: State, C: Send + Sync + 'static> CompiledGraph<S, C> {
    /// The graph as a Mermaid flowchart.
    pub fn to_mermaid(&self) -> String {
        self.inner.mermaid.clone()
    }

    /// The graph's nodes and edges, for drawing it ([`GraphShape::to_svg`]).
    pub fn shape(&self) -> &GraphShape {
        &self.inner.shape
    }

    /// Its version ([`StateGraph::set_version`]), if it has one.
    pub fn version(&self) -> Option<&str> {
        self.inner.version.as_deref()
    }

    /// The checkpoint store.
    pub fn checkpointer(&self) -> &Arc<dyn Checkpointer> {
        &self.inner.checkpointer
    }

    /// The injected dependencies.
    pub fn deps(&self) -> &Arc<C> {
        &self.inner.deps
    }

    /// Where `edge` leads from `state`; `Err` names a router target that was not declared.
    pub(crate) fn route(edge: &Edge<S>, state: &S) -> Result<String, String> {
        match edge {
            Edge::To(t) => Ok(t.clone()),
            Edge::Branch { router, targets } => {
                let t = router(state);
                if targets.contains(&t) {
                    Ok(t)
                } else {
                    Err(format!("router chose '{t}', which is not among its declared targets {targets:?}"))
                }
            }
        }
    }
}
