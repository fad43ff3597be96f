//! Declared graphs reloaded while `serve` runs (docs/agents.md, "Changing a graph while
//! serving"): on SIGHUP, and when a graph file's text changes (looked at every
//! `server.reload_poll_ms`), each declared agent is checked and built again from its file. One
//! that passes serves the agent's new turns while runs paused on older versions finish on
//! theirs ([`VersionedAgent`]); one that fails is refused with the same errors `serve` would
//! print at start, and the version before it keeps serving.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_agents::AgentError;
use toolgraph_agents::assembly::{self, SharedParts};
use toolgraph_agents::sources::GraphSources;
use toolgraph_agents::versions::{Installed, VersionedAgent};
use toolgraph_config::Config;
use toolgraph_graph::Checkpointer;

/// An agent whose graph a file declares.
pub struct DeclaredAgent {
    /// Its name.
    pub name: String,
    /// Its `graph_file`, resolved.
    pub file: PathBuf,
    /// What the service runs.
    pub agent: VersionedAgent,
}

/// What a reload needs to build an agent again: what `serve` built it from.
pub struct Reloader {
    pub cfg: Arc<Config>,
    pub shared: Arc<SharedParts>,
    pub checkpointer: Arc<dyn Checkpointer>,
    pub agents: Vec<DeclaredAgent>,
}

impl Reloader {
    /// Reloads on SIGHUP, and on a changed file every `poll` (never when `None`), for as long
    /// as the process runs.
    pub fn spawn(self, poll: Option<Duration>) {
        // Without declared agents there is nothing to look at, but SIGHUP is still taken (and
        // logged), so it never stops the server.
        let poll = poll.filter(|_| !self.agents.is_empty());
        tokio::spawn(async move {
            let mut hangup = hangups();
            let mut seen: Vec<Option<String>> = vec![None; self.agents.len()];
            let mut tick = poll.map(|every| {
                let mut t = tokio::time::interval(every);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            loop {
                let signalled = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let ticked = async {
                    match tick.as_mut() {
                        Some(t) => t.tick().await,
                        None => std::future::pending().await,
                    }
                };
                let forced = tokio::select! {
                    Some(()) = signalled => true,
                    _ = ticked => false,
                };
                if forced && self.agents.is_empty() {
                    tracing::info!("SIGHUP: no agent declares its graph in a file; nothing to reload");
                }
                for (agent, seen) in self.agents.iter().zip(&mut seen) {
                    self.reload(agent, forced, seen).await;
                }
            }
        });
    }

    /// Builds `declared` again when its file changed (or always when `forced`) and installs
    /// the result, or records why it was refused. A change found by looking is built once the
    /// file reads the same twice in a row (`seen` is the last look's version), so a file
    /// caught half-written is not refused for it.
    async fn reload(&self, declared: &DeclaredAgent, forced: bool, seen: &mut Option<String>) {
        // Its file's version, with those of the agents its `agent` nodes hand turns to (their
        // files change it too).
        let (cfg, name) = (Arc::clone(&self.cfg), declared.name.clone());
        let sources = match tokio::task::spawn_blocking(move || GraphSources::read(&cfg, &name)).await {
            Ok(read) => read,
            Err(e) => {
                tracing::error!(agent = %declared.name, error = %e, "the reload stopped; the current version keeps serving");
                return;
            }
        };
        let (version, sources) = match sources {
            Ok(sources) => (sources.version(&declared.name), sources),
            Err(e) => {
                // Said once per disappearance (and on every SIGHUP), not on every look.
                if forced || seen.replace(UNREADABLE.to_owned()).as_deref() != Some(UNREADABLE) {
                    tracing::error!(agent = %declared.name, error = %e, "cannot read a graph file it is built from; the current version keeps serving");
                }
                return;
            }
        };
        let revision = toolgraph_agents::chat_agent::ChatAgent::revision(&declared.agent);
        if revision.version.as_deref() == Some(&version) {
            // Back to the version that serves: a refusal of a later text no longer stands.
            declared.agent.clear_refusal();
        }
        let known = revision.version.as_deref() == Some(&version)
            || revision.refused.as_ref().is_some_and(|r| r.version == version);
        let settled = seen.replace(version.clone()).as_ref() == Some(&version);
        if !forced && (known || !settled) {
            return;
        }
        let (cfg, shared, store, name) =
            (Arc::clone(&self.cfg), Arc::clone(&self.shared), Arc::clone(&self.checkpointer), declared.name.clone());
        // Checking the declarations and building the graph are synchronous; the files were read
        // once, above, so the build is of the version computed there.
        let built = {
            let sources = sources.clone();
            tokio::task::spawn_blocking(move || assembly::build_from(&cfg, &name, &sources, store, &shared)).await
        };
        let built = match built {
            Ok(built) => built,
            Err(e) => {
                tracing::error!(agent = %declared.name, error = %e, "the reload stopped; the current version keeps serving");
                return;
            }
        };
        match built {
            Ok(a) => {
                let new = a.graph.version().map(str::to_owned);
                let kept =
                    self.checkpointer.keep_definition(new.as_deref().unwrap_or(&version), &sources.to_json()).await;
                if let Err(e) = kept {
                    // Kept only for runs that pause on it and outlive this process: it still serves.
                    tracing::error!(agent = %declared.name, error = %e, "cannot keep the new version's definition; a run paused on it resumes on it only while this process runs");
                }
                match declared.agent.install(Arc::new(assembly::chat_agent(a.graph, &a.channels))) {
                    Installed::Unchanged => {}
                    Installed::Replaced { previous } => {
                        tracing::info!(
                            agent = %declared.name,
                            file = %declared.file.display(),
                            version = new.as_deref().unwrap_or("-"),
                            previous = previous.as_deref().unwrap_or("-"),
                            "reloaded: new turns run on this version; paused runs finish on theirs"
                        );
                    }
                }
            }
            Err(e) => {
                let errors: Vec<String> = match &e {
                    AgentError::Declared(found) => found.0.iter().map(ToString::to_string).collect(),
                    other => vec![other.to_string()],
                };
                tracing::error!(
                    agent = %declared.name,
                    version = %version,
                    current = revision.version.as_deref().unwrap_or("-"),
                    "the changed graph file is refused; the current version keeps serving:\n{}",
                    errors.join("\n")
                );
                // Callers of the HTTP API see the files' names, not where they live on the server
                // (an error may be in the file of an agent this one hands turns to).
                let files: Vec<(String, String)> = self
                    .cfg
                    .effective_agents()
                    .into_values()
                    .filter_map(|a| a.graph_file)
                    .chain([declared.file.clone()])
                    .map(|f| {
                        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        (f.display().to_string(), name)
                    })
                    .collect();
                let public = |e: &String| files.iter().fold(e.clone(), |e, (path, name)| e.replace(path, name));
                declared.agent.refuse(version, errors.iter().map(public).collect());
            }
        }
    }
}

/// What `seen` holds while the file cannot be read.
const UNREADABLE: &str = "(unreadable)";

/// SIGHUPs as they arrive; `None` where they cannot be received.
#[cfg(unix)]
fn hangups() -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; graph files reload only when they change");
            None
        }
    }
}

/// No SIGHUP off Unix: graph files reload only when they change.
#[cfg(not(unix))]
fn hangups() -> Option<NoSignal> {
    None
}

#[cfg(not(unix))]
struct NoSignal;

#[cfg(not(unix))]
impl NoSignal {
    async fn recv(&mut self) -> Option<()> {
        None
    }
}
