//! [`PluginTool`]: what every plugin is as a tool, whatever runs it — its spec and schema from
//! the manifest, its time limit, its approval text — over a [`Runner`] that does the work
//! (a program for `exec`, a request for `http`).

use async_trait::async_trait;
use serde_json::Value;
use std::time::Duration;
use toolgraph_tools::{ArgumentSchema, Tool, ToolContext, ToolError, ToolSpec};

/// What every plugin tool has, whatever runs it.
pub struct Common {
    /// Name, description, class, schema, display text.
    pub spec: ToolSpec,
    /// The compiled argument schema.
    pub schema: ArgumentSchema,
    /// The write action's text, `{param}` filled.
    pub describe: Option<String>,
    /// The plugin's time limit.
    pub timeout_ms: u64,
}

impl Common {
    /// The plugin's own time limit.
    pub fn limit(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }
}

/// Runs one call of a plugin whose arguments passed the schema.
#[async_trait]
pub trait Runner: Send + Sync + 'static {
    /// The call's result, or the failure the model reads; `ctx` is the turn's context.
    async fn run(&self, common: &Common, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError>;
}

/// A plugin as a tool.
pub struct PluginTool<R> {
    common: Common,
    runner: R,
}

impl<R: Runner> PluginTool<R> {
    /// The tool of `common`, run by `runner`.
    pub fn new(common: Common, runner: R) -> Self {
        Self { common, runner }
    }
}

#[async_trait]
impl<R: Runner> Tool for PluginTool<R> {
    fn spec(&self) -> &ToolSpec {
        &self.common.spec
    }

    fn arguments(&self) -> &ArgumentSchema {
        &self.common.schema
    }

    /// The plugin's limit plus a second: the plugin's own limit answers first, with its
    /// cause, after its processes are gone; this one is the backstop.
    fn timeout(&self) -> Duration {
        self.common.limit() + Duration::from_secs(1)
    }

    fn describe(&self, arguments: &Value) -> String {
        match &self.common.describe {
            Some(template) => toolgraph_tools::describe::fill_describe(template, arguments),
            None => format!("Run {} with {}", self.common.spec.name, arguments),
        }
    }

    async fn invoke(&self, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        self.runner.run(&self.common, ctx, arguments).await
    }
}
