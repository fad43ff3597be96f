//! [`ToolSet`]: a named group of tools whose members change while the process runs — an MCP
//! server's, which adds and removes tools and says so (`tools/list_changed`). A registry holds
//! the set, not a copy of its members, so an agent that enables the set by its name sees the
//! members of the moment at its next model call.

use crate::tool::Tool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A named group of tools, replaced as a whole when its source changes.
pub struct ToolSet {
    name: String,
    members: RwLock<Arc<[Arc<dyn Tool>]>>,
    generation: AtomicU64,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.members().iter().map(|t| t.spec().name.clone()).collect();
        f.debug_struct("ToolSet").field("name", &self.name).field("members", &names).finish()
    }
}

impl ToolSet {
    /// The set `name` of `members`.
    pub fn new(name: impl Into<String>, members: Vec<Arc<dyn Tool>>) -> Self {
        Self { name: name.into(), members: RwLock::new(members.into()), generation: AtomicU64::new(0) }
    }

    /// Its name, by which an agent enables every member, present and future.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The members now.
    pub fn members(&self) -> Arc<[Arc<dyn Tool>]> {
        // A poisoned lock still holds a whole list (it is replaced in one assignment).
        Arc::clone(&self.members.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Replaces the members; calls already running keep the tool they started with.
    pub fn replace(&self, members: Vec<Arc<dyn Tool>>) {
        *self.members.write().unwrap_or_else(std::sync::PoisonError::into_inner) = members.into();
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Changes with every [`ToolSet::replace`]: whoever caches what the members look like (the
    /// definitions sent to a model) compares it to know when to look again.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}
