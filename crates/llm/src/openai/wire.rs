//! Wire types of the OpenAI chat-completions API; the only place its JSON names live.

use crate::schema::{Provider, SchemaDialect, normalize_schema};
use crate::types::{ChatRequest, Message, ResponseFormat, ToolChoice};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Builds the request body for `provider`.
pub(crate) fn request_body(
    req: &ChatRequest,
    model: &str,
    provider: Provider,
    stream: bool,
    include_usage: bool,
    strict_tools: bool,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(req.messages.iter().map(message).collect()));
    body.insert("stream".into(), json!(stream));
    if stream && include_usage {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    // A narrowed choice is sent as the narrowed list itself, which every server understands.
    let offered = match &req.tool_choice {
        Some(ToolChoice::Allowed(_)) => req.callable_tools(),
        _ => req.tools.iter().collect(),
    };
    if !offered.is_empty() {
        let strict = strict_tools && provider == Provider::OpenAi;
        let dialect = if strict { SchemaDialect::OpenAiStrict } else { provider.tool_dialect() };
        let tools: Vec<Value> = offered
            .iter()
            .map(|t| {
                let mut f = json!({
                    "name": t.name,
                    "description": t.description,
                    "parameters": normalize_schema(&t.parameters, dialect),
                });
                if strict {
                    f["strict"] = json!(true);
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &req.tool_choice {
            None | Some(ToolChoice::Allowed(_)) => None,
            Some(ToolChoice::Auto) => Some(json!("auto")),
            Some(ToolChoice::None) => Some(json!("none")),
            Some(ToolChoice::Required) => Some(json!("required")),
            Some(ToolChoice::Tool(name)) => Some(json!({"type": "function", "function": {"name": name}})),
        };
        if let Some(choice) = choice {
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(format) = &req.response_format {
        let v = match format {
            ResponseFormat::Text => json!({"type": "text"}),
            ResponseFormat::JsonObject => json!({"type": "json_object"}),
            ResponseFormat::JsonSchema { name, schema, strict } => {
                let dialect = match provider {
                    Provider::Gemini => SchemaDialect::Gemini,
                    Provider::OpenAi if *strict => SchemaDialect::OpenAiStrict,
                    Provider::OpenAi => SchemaDialect::OpenAi,
                    _ => SchemaDialect::Generic,
                };
                json!({"type": "json_schema", "json_schema": {
                    "name": name, "schema": normalize_schema(schema, dialect), "strict": strict
                }})
            }
        };
        body.insert("response_format".into(), v);
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = req.max_tokens {
        // OpenAI's newer models only take the new name; everyone else knows the old one.
        let key = if provider == Provider::OpenAi { "max_completion_tokens" } else { "max_tokens" };
        body.insert(key.into(), json!(n));
    }
    if !req.stop.is_empty() {
        body.insert("stop".into(), json!(req.stop));
    }
    Value::Object(body)
}

fn message(m: &Message) -> Value {
    match m {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant { content, tool_calls } if tool_calls.is_empty() => {
            json!({"role": "assistant", "content": content})
        }
        Message::Assistant { content, tool_calls } => json!({
            "role": "assistant",
            // Several servers reject "" next to tool calls; null is universally accepted.
            "content": if content.is_empty() { Value::Null } else { json!(content) },
            "tool_calls": tool_calls.iter().map(|c| json!({
                "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": if c.arguments.is_empty() { "{}" } else { c.arguments.as_str() }}
            })).collect::<Vec<_>>(),
        }),
        Message::Tool { tool_call_id, name, content } => {
            json!({"role": "tool", "tool_call_id": tool_call_id, "name": name, "content": content})
        }
    }
}

/// One `data:` chunk of a streamed reply.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamChunk {
    #[serde(default)]
    pub choices: Vec<StreamChoice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    #[serde(default)]
    pub error: Option<WireError>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamChoice {
    #[serde(default)]
    pub delta: Option<Delta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ToolCallDelta {
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(default)]
    pub prompt_tokens_details: Option<WirePromptDetails>,
}

impl From<WireUsage> for crate::Usage {
    fn from(u: WireUsage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_prompt_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
        }
    }
}

/// `usage.prompt_tokens_details`: how many prompt tokens the server's cache held.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct WirePromptDetails {
    #[serde(default)]
    pub cached_tokens: u32,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireError {
    #[serde(default)]
    pub message: Option<String>,
}

/// A non-streamed reply.
#[derive(Debug, Deserialize)]
pub(crate) struct Completion {
    #[serde(default)]
    pub choices: Vec<CompletionChoice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CompletionChoice {
    pub message: CompletionMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CompletionMessage {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_reads_the_cached_prompt_tokens_when_the_server_reports_them() {
        let with: WireUsage = serde_json::from_str(
            r#"{"prompt_tokens": 1200, "completion_tokens": 80, "prompt_tokens_details": {"cached_tokens": 1024}}"#,
        )
        .unwrap();
        let u = crate::Usage::from(with);
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens), (1200, 80, 1024));
        let without: WireUsage = serde_json::from_str(r#"{"prompt_tokens": 5, "completion_tokens": 1}"#).unwrap();
        assert_eq!(crate::Usage::from(without).cached_prompt_tokens, 0);
    }
}
