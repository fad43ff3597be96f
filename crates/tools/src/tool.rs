//! The [`Tool`] trait every tool implements, and [`ToolBuilder`], the typed way to write one
//! from an async Rust function whose arguments are a `#[derive(Deserialize, JsonSchema)]`
//! struct — the schema the model sees is generated from that struct, never hand-written.

use crate::context::ToolContext;
use crate::outcome::{ToolError, ToolOutcome};
use crate::schema::{ArgumentSchema, SchemaError};
use crate::spec::{ParamDisplay, ToolClass, ToolDisplay, ToolSpec, valid_tool_name};
use async_trait::async_trait;
use futures::FutureExt;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Time limit of a tool call unless the tool sets its own.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// A capability a model can call.
///
/// Implementors only run already-checked arguments ([`Tool::invoke`]); schema validation,
/// argument injection, the time limit and panic isolation are applied around it by
/// [`ToolRegistry`](crate::ToolRegistry), so every tool behaves the same on bad input.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Name, description, class, model-facing schema and display text.
    fn spec(&self) -> &ToolSpec;

    /// The compiled argument schema the model's arguments are checked against.
    fn arguments(&self) -> &ArgumentSchema;

    /// How long one call may take before it becomes a `timeout` outcome.
    fn timeout(&self) -> Duration {
        DEFAULT_TOOL_TIMEOUT
    }

    /// The human-readable action a pending approval shows (docs/tools.md); meaningful for write
    /// tools, a generic sentence for read tools. `arguments` already carry injected values.
    fn describe(&self, arguments: &Value) -> String {
        format!("Run {} with {}", self.spec().name, arguments)
    }

    /// Runs the tool. `arguments` passed schema validation and carry injected values.
    async fn invoke(&self, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError>;
}

/// Builds the arguments the tool runs with: the model's own (injected names stripped, so a
/// model cannot override state), checked against the schema, plus the injected values
/// from the context. Returns the readable violation on failure.
pub(crate) fn prepare_arguments(tool: &dyn Tool, ctx: &ToolContext, model_args: &Value) -> Result<Value, ToolError> {
    let mut args = match model_args {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(ToolError::invalid_arguments(format!("arguments must be a JSON object, got {other}")));
        }
    };
    let injected = &tool.spec().injected;
    for name in injected {
        args.remove(name);
    }
    let mut args = Value::Object(args);
    tool.arguments().check(&args).map_err(ToolError::invalid_arguments)?;
    if let Value::Object(m) = &mut args {
        for name in injected {
            if let Some(v) = ctx.get(name) {
                m.insert(name.clone(), v.clone());
            }
        }
    }
    Ok(args)
}

/// Runs one call of `tool` to completion, whatever the tool does: bad arguments, a panic
/// and a hang all end in a failure outcome, never in an error of the caller's run.
pub(crate) async fn execute(tool: &dyn Tool, ctx: &ToolContext, model_args: &Value) -> ToolOutcome {
    let name = &tool.spec().name;
    let args = match prepare_arguments(tool, ctx, model_args) {
        Ok(a) => a,
        Err(e) => return ToolOutcome::Failure(e),
    };
    let limit = tool.timeout();
    let call = AssertUnwindSafe(tool.invoke(ctx, args)).catch_unwind();
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(result)) => result.into(),
        Ok(Err(panic)) => {
            let what = panic_message(panic.as_ref());
            tracing::error!(tool = %name, panic = %what, "tool panicked");
            ToolOutcome::Failure(ToolError::internal(format!("tool '{name}' failed unexpectedly: {what}")))
        }
        Err(_) => {
            tracing::warn!(tool = %name, timeout_ms = limit.as_millis() as u64, "tool timed out");
            ToolOutcome::Failure(ToolError::timeout(format!("tool '{name}' did not finish within {limit:?}")))
        }
    }
}

/// `outcome`, or when its text for the model ([`ToolOutcome::to_model_text`]) is longer than
/// `max` bytes, an outcome that fits and says so: a text is cut and marked, a failure's message
/// cut, and any other value — which cut anywhere would not be JSON — replaced by a failure
/// telling the model to ask for less. An outcome is stored in the conversation and sent to the
/// model again on every later step, so one oversized result would cost on each of them.
pub(crate) fn cap_outcome(name: &str, outcome: ToolOutcome, max: usize) -> ToolOutcome {
    match outcome {
        ToolOutcome::Success(Value::String(text)) if text.len() > max => {
            tracing::warn!(tool = %name, bytes = text.len(), limit = max, "tool result cut to the size limit");
            let marker = format!(
                "\n[cut: the result was {} bytes, over the limit of {max} bytes; ask for less to see the rest]",
                text.len()
            );
            let keep = char_floor(&text, max.saturating_sub(marker.len()));
            ToolOutcome::Success(Value::String(format!("{}{marker}", &text[..keep])))
        }
        ToolOutcome::Success(value) if !fits(&value, max) => {
            tracing::warn!(tool = %name, limit = max, "tool result over the size limit dropped");
            ToolOutcome::Failure(ToolError::invalid_arguments(format!(
                "the result of '{name}' was larger than {max} bytes, too large to keep or to send to the model, \
                 and was dropped: ask for less — narrow the query, select fewer fields or rows, or page through \
                 the results"
            )))
        }
        ToolOutcome::Failure(mut error) if !fits(&error.message, max.saturating_sub(FAILURE_FRAME)) => {
            tracing::warn!(tool = %name, bytes = error.message.len(), limit = max, "tool failure message cut");
            let marker = format!(" [cut: the message was {} bytes]", error.message.len());
            let mut room = max.saturating_sub(FAILURE_FRAME + marker.len());
            // Escaping can make the JSON of a text up to six times its length: halve until it fits.
            let mut keep = char_floor(&error.message, room);
            while keep > 0 && !fits(&error.message[..keep], room) {
                room /= 2;
                keep = char_floor(&error.message, room);
            }
            error.message.truncate(keep);
            error.message.push_str(&marker);
            ToolOutcome::Failure(error)
        }
        other => other,
    }
}

/// A failure outcome's JSON around its message: `{"ok":false,"error":…,"kind":"invalid_arguments"}`.
const FAILURE_FRAME: usize = 64;

/// The largest char boundary of `text` at or below `at`.
fn char_floor(text: &str, at: usize) -> usize {
    // Index 0 is always a boundary, so the search ends there at the latest.
    (0..=at.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0)
}

/// Whether `value`'s compact JSON is at most `max` bytes; serializing stops once it is over, so
/// an enormous value costs no copy.
fn fits<T: Serialize + ?Sized>(value: &T, max: usize) -> bool {
    struct Budget(usize);
    impl std::io::Write for Budget {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.checked_sub(buf.len()).ok_or_else(|| std::io::Error::other("over the limit"))?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Budget(max), value).is_ok()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".to_owned()
    }
}

type DescribeFn<A> = Arc<dyn Fn(&A) -> String + Send + Sync>;

/// Typed construction of a tool from an async function.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use toolgraph_tools::{ToolBuilder, ToolClass};
///
/// /// Send an SMS.
/// #[derive(Deserialize, JsonSchema)]
/// struct SmsArgs {
///     /// Phone number in E.164 form.
///     #[schemars(regex(pattern = r"^\+[1-9][0-9]{6,14}$"))]
///     to: String,
///     /// Message text.
///     #[schemars(length(min = 1, max = 160))]
///     text: String,
/// }
///
/// let tool = ToolBuilder::<SmsArgs>::new("send_sms", "Send a text message")
///     .write(|a| format!("Send an SMS to {}: \"{}\"", a.to, a.text))
///     .display_name("$t:send_sms.name")
///     .param_display("to", "Recipient")
///     .handler(|_ctx, _args| async move { Ok(serde_json::json!({"sent": true})) })
///     .unwrap();
/// assert_eq!(tool.spec().class, ToolClass::Write);
/// assert_eq!(tool.spec().parameters["properties"]["text"]["maxLength"], 160);
/// ```
#[must_use]
pub struct ToolBuilder<A> {
    name: String,
    description: String,
    class: ToolClass,
    describe: Option<DescribeFn<A>>,
    injected: Vec<String>,
    hidden: Vec<String>,
    offered_after: Vec<String>,
    required_after: Vec<String>,
    runs_after: Vec<String>,
    answer_field: Option<String>,
    cited_as: Option<String>,
    display: ToolDisplay,
    timeout: Duration,
    _args: PhantomData<fn() -> A>,
}

impl<A> ToolBuilder<A>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
{
    /// A read tool named `name`; `description` is what the model reads to decide when to call it.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            class: ToolClass::Read,
            describe: None,
            injected: Vec::new(),
            hidden: Vec::new(),
            offered_after: Vec::new(),
            required_after: Vec::new(),
            runs_after: Vec::new(),
            answer_field: None,
            cited_as: None,
            display: ToolDisplay::default(),
            timeout: DEFAULT_TOOL_TIMEOUT,
            _args: PhantomData,
        }
    }

    /// Makes this a write tool: it needs human approval, and `describe` renders the action
    /// text the approval shows.
    pub fn write(mut self, describe: impl Fn(&A) -> String + Send + Sync + 'static) -> Self {
        self.class = ToolClass::Write;
        self.describe = Some(Arc::new(describe));
        self
    }

    /// Fills argument `name` from the call context instead of letting the model choose it;
    /// it disappears from the schema the model sees.
    pub fn inject(mut self, name: impl Into<String>) -> Self {
        self.injected.push(name.into());
        self
    }

    /// Leaves the optional argument `name` out of the schema the model sees: the tool fills it
    /// itself when it is missing (from what another tool returned earlier in the turn), and a
    /// caller that has it at hand (a graph node) may still pass it, checked as usual.
    pub fn hide(mut self, name: impl Into<String>) -> Self {
        self.hidden.push(name.into());
        self
    }

    /// Makes each result a document a grounded reply may cite as `template` over the call's
    /// arguments ([`ToolSpec::cited_as`]).
    pub fn cited_as(mut self, template: impl Into<String>) -> Self {
        self.cited_as = Some(template.into());
        self
    }

    /// Offers the tool only once one of `tools` has returned in the current turn
    /// ([`ToolSpec::offered_after`]).
    pub fn offered_after<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        self.offered_after.extend(tools.into_iter().map(Into::into));
        self
    }

    /// Once one of `tools` has returned in the current turn, offers the tool and makes it the
    /// model's next call ([`ToolSpec::required_after`]).
    pub fn required_after<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        let tools: Vec<String> = tools.into_iter().map(Into::into).collect();
        self.required_after.extend(tools.iter().cloned());
        self.offered_after(tools)
    }

    /// Once one of `tools` has returned in the current turn, the agent calls this tool itself
    /// with no arguments ([`ToolSpec::runs_after`]); every argument must then be optional.
    pub fn runs_after<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        let tools: Vec<String> = tools.into_iter().map(Into::into).collect();
        self.runs_after.extend(tools.iter().cloned());
        self.offered_after(tools)
    }

    /// A successful call's result field `field` is the turn's answer ([`ToolSpec::answer_field`]).
    pub fn answers_with(mut self, field: impl Into<String>) -> Self {
        self.answer_field = Some(field.into());
        self
    }

    /// Per-call time limit. Default: [`DEFAULT_TOOL_TIMEOUT`].
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    /// Name shown in UIs.
    pub fn display_name(mut self, text: impl Into<String>) -> Self {
        self.display.name = Some(text.into());
        self
    }

    /// Description shown in UIs.
    pub fn display_description(mut self, text: impl Into<String>) -> Self {
        self.display.description = Some(text.into());
        self
    }

    /// Display text of one parameter.
    pub fn param_display(mut self, param: impl Into<String>, text: impl Into<String>) -> Self {
        self.display.parameters.insert(param.into(), ParamDisplay { description: text.into() });
        self
    }

    /// Finishes the tool with its implementation.
    ///
    /// # Errors
    /// An invalid name, an injected or displayed parameter the arguments type lacks, a
    /// required argument of a tool that `runs_after` others, or a schema that does not compile.
    pub fn handler<F, Fut, O>(self, f: F) -> Result<Arc<dyn Tool>, SchemaError>
    where
        F: Fn(ToolContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
        O: Serialize + 'static,
    {
        if !valid_tool_name(&self.name) {
            return Err(SchemaError::InvalidName { tool: self.name });
        }
        let schema = ArgumentSchema::of::<A>(&self.name, &self.injected)?.hiding(&self.name, &self.hidden)?;
        if !self.runs_after.is_empty()
            && let Some(required) = schema.model_facing()["required"].as_array().and_then(|r| r.first())
        {
            let argument = required.as_str().unwrap_or_default().to_owned();
            return Err(SchemaError::RunsWithRequiredArgument { tool: self.name, argument });
        }
        let full_props = SchemaPropertyNames::of::<A>();
        if let Some(unknown) = self.display.parameters.keys().find(|p| !full_props.contains(p)) {
            return Err(SchemaError::UnknownParameter { tool: self.name.clone(), argument: unknown.clone() });
        }
        let spec = ToolSpec {
            name: self.name,
            description: self.description,
            class: self.class,
            parameters: schema.model_facing().clone(),
            injected: self.injected,
            offered_after: self.offered_after,
            required_after: self.required_after,
            runs_after: self.runs_after,
            answer_field: self.answer_field,
            cited_as: self.cited_as,
            display: self.display,
        };
        Ok(Arc::new(FnTool { spec, schema, describe: self.describe, timeout: self.timeout, f, _args: PhantomData }))
    }
}

/// Names of the top-level properties of `A`'s schema (injected ones included).
struct SchemaPropertyNames(Vec<String>);

impl SchemaPropertyNames {
    fn of<A: JsonSchema>() -> Self {
        let v = schemars::SchemaGenerator::default().into_root_schema_for::<A>().to_value();
        Self(v["properties"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default())
    }
    fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|p| p == name)
    }
}

struct FnTool<A, F> {
    spec: ToolSpec,
    schema: ArgumentSchema,
    describe: Option<DescribeFn<A>>,
    timeout: Duration,
    f: F,
    _args: PhantomData<fn() -> A>,
}

#[async_trait]
impl<A, F, Fut, O> Tool for FnTool<A, F>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(ToolContext, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    O: Serialize + 'static,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn arguments(&self) -> &ArgumentSchema {
        &self.schema
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn describe(&self, arguments: &Value) -> String {
        match (&self.describe, A::deserialize(arguments)) {
            (Some(describe), Ok(args)) => describe(&args),
            _ => format!("Run {} with {}", self.spec.name, arguments),
        }
    }

    async fn invoke(&self, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        // The schema already passed; this catches what JSON Schema cannot express
        // (e.g. a u8 field given 300 with no range on it).
        let args = A::deserialize(arguments).map_err(|e| ToolError::invalid_arguments(e.to_string()))?;
        let output = (self.f)(ctx.clone(), args).await?;
        serde_json::to_value(output).map_err(|e| {
            ToolError::internal(format!("tool '{}' produced output that is not JSON: {e}", self.spec.name))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, JsonSchema)]
    struct Cite {
        #[allow(dead_code)]
        answer: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    struct Ask {
        #[allow(dead_code)]
        question: String,
    }

    #[test]
    fn a_tool_the_agent_runs_after_another_takes_no_required_argument() {
        let tool = ToolBuilder::<Cite>::new("cite", "Cite the answer.")
            .runs_after(["answer"])
            .handler(|_, _: Cite| async { Ok::<_, ToolError>(1) })
            .unwrap();
        assert_eq!(tool.spec().runs_after, ["answer"]);
        assert_eq!(tool.spec().offered_after, ["answer"], "offered only then, too");
        let err = ToolBuilder::<Ask>::new("ask", "Ask.")
            .runs_after(["search"])
            .handler(|_, _: Ask| async { Ok::<_, ToolError>(1) })
            .err()
            .expect("a required argument is refused");
        assert!(
            matches!(&err, SchemaError::RunsWithRequiredArgument { argument, .. } if argument == "question"),
            "{err}"
        );
    }
}
