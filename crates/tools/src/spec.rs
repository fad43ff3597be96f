//! What a tool is, as models and UIs see it: name, description, class, schema, display text.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Whether a tool may run as soon as the model asks, or only after a human approved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Runs at once (lookups, searches, computations).
    Read,
    /// Changes the world; the graph pauses for human approval before it runs.
    Write,
}

/// Text for a UI: RAGFlow-style display fields (docs/tools.md). May hold i18n keys such as
/// `$t:bad_calculator.name`, which a front end resolves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ToolDisplay {
    /// Name shown to people; defaults to the tool name.
    #[serde(rename = "displayName", skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Description shown to people; defaults to the model-facing description.
    #[serde(rename = "displayDescription", skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Per-parameter display text, keyed by parameter name.
    #[serde(rename = "displayParameters", skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, ParamDisplay>,
}

/// Display text for one parameter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ParamDisplay {
    /// Description shown to people.
    #[serde(rename = "displayDescription")]
    pub description: String,
}

/// Everything needed to offer a tool to a model and show it in a UI.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// Unique name the model calls the tool by (`^[a-zA-Z0-9_-]{1,64}$`).
    pub name: String,
    /// What the tool does, written for the model.
    pub description: String,
    /// Read or write.
    pub class: ToolClass,
    /// JSON Schema of the arguments the *model* supplies (injected arguments removed).
    pub parameters: Value,
    /// Argument names filled from the call context instead of by the model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
    /// Tools one of which must have returned in the current turn before the model may call
    /// this one (empty: always): a tool whose arguments are another's results — citing the
    /// articles a search found — is not offered before there are any, so a model cannot make
    /// them up.
    #[serde(rename = "offeredAfter", skip_serializing_if = "Vec::is_empty")]
    pub offered_after: Vec<String>,
    /// Tools after whose result in the turn the model's next step is a call to this one, until
    /// it has been called (it is offered then too): a tool that finishes what another began
    /// (citing the answer written from the articles a search found), which a reply must not
    /// skip. A model told to call a tool cannot drift into prose that only describes it.
    #[serde(rename = "requiredAfter", skip_serializing_if = "Vec::is_empty")]
    pub required_after: Vec<String>,
    /// Tools after whose result in the turn the agent calls this one itself, with no
    /// arguments, until it has been called: a fixed step that needs nothing a model would
    /// write (its arguments default to what earlier tools of the turn returned), so no model
    /// call is spent on it and no model can copy its inputs wrong.
    #[serde(rename = "runsAfter", skip_serializing_if = "Vec::is_empty")]
    pub runs_after: Vec<String>,
    /// When set, a successful call whose result has this text field ends the turn with that
    /// text as the answer, without another model call (LangChain's `return_direct`): for a
    /// tool whose result is the finished answer — an answer with its citations — which a model
    /// could only restate, and a small one restates badly.
    #[serde(rename = "answerField", skip_serializing_if = "Option::is_none")]
    pub answer_field: Option<String>,
    /// When set, a result of this tool is a document a grounded reply may cite, by this label: a
    /// template over the call's arguments (`Guía docente › {key}`; an argument not given is
    /// left out). docs/retrieval.md, "Grounded answers".
    #[serde(rename = "citedAs", skip_serializing_if = "Option::is_none")]
    pub cited_as: Option<String>,
    /// UI text.
    #[serde(flatten)]
    pub display: ToolDisplay,
}

/// Whether `name` is acceptable as a tool name for every provider we talk to
/// (OpenAI's and Gemini's limits are the strictest: 1–64 of `[a-zA-Z0-9_-]`).
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
