//! The prompt a local chat model sees: the GGUF file's own chat template (Jinja, rendered with
//! minijinja) over the conversation and the offered tools, and the tokenizer rebuilt from the
//! GGUF metadata (byte-level BPE with the Qwen2 split regex and the special tokens).
//!
//! Tools are offered in the template's own format (`tools: [{"type": "function", "function":
//! {…}}]`); earlier tool calls and results are rendered as the template expects, so a model
//! sees its own past calls the way it was trained to write them.

use crate::LocalModelError;
use candle_core::quantized::gguf_file;
use serde_json::{Value, json};
use toolgraph_llm::{Message, ToolDefinition};

/// A chat template from a GGUF file.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// Compiles a template source.
    ///
    /// # Errors
    /// [`LocalModelError::Format`] when the template does not compile.
    pub fn new(source: &str) -> Result<Self, LocalModelError> {
        let mut env = minijinja::Environment::new();
        // HF templates call Python string methods (`.strip()`, `.startswith()`, …).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| LocalModelError::Format(format!("chat template: {e}")))?;
        Ok(Self { env })
    }

    /// The prompt for `messages` with `tools` offered, ending where the assistant speaks next.
    ///
    /// # Errors
    /// [`LocalModelError::Input`] when the template rejects the conversation.
    pub fn render(&self, messages: &[Message], tools: &[ToolDefinition]) -> Result<String, LocalModelError> {
        let messages: Vec<minijinja::Value> = messages.iter().map(message_value).collect();
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            tools => if tools.is_empty() { minijinja::Value::UNDEFINED } else { minijinja::Value::from_serialize(&tools) },
            add_generation_prompt => true,
        };
        let template = self.env.get_template("chat").map_err(|e| LocalModelError::Format(e.to_string()))?;
        template.render(ctx).map_err(|e| LocalModelError::Input(format!("chat template: {e}")))
    }
}

/// A message as the template reads it.
fn message_value(m: &Message) -> minijinja::Value {
    use minijinja::Value as V;
    let map = |pairs: Vec<(&str, V)>| -> V { pairs.into_iter().collect() };
    match m {
        Message::System { content } => map(vec![("role", V::from("system")), ("content", V::from(content.as_str()))]),
        Message::User { content } => map(vec![("role", V::from("user")), ("content", V::from(content.as_str()))]),
        Message::Assistant { content, tool_calls } => {
            let calls: Vec<V> = tool_calls
                .iter()
                .map(|c| {
                    let function =
                        map(vec![("name", V::from(c.name.as_str())), ("arguments", arguments_value(&c.arguments))]);
                    map(vec![("id", V::from(c.id.as_str())), ("type", V::from("function")), ("function", function)])
                })
                .collect();
            let mut pairs = vec![("role", V::from("assistant")), ("content", V::from(content.as_str()))];
            if !calls.is_empty() {
                pairs.push(("tool_calls", V::from(calls)));
            }
            map(pairs)
        }
        Message::Tool { tool_call_id, name, content } => map(vec![
            ("role", V::from("tool")),
            ("tool_call_id", V::from(tool_call_id.as_str())),
            ("name", V::from(name.as_str())),
            ("content", V::from(content.as_str())),
        ]),
    }
}

/// A call's arguments for the template: a mapping (templates print it with `tojson`, or read
/// its keys) that `tojson` prints as the text the model wrote, so a past call reads in the
/// prompt exactly as the model wrote it and the tokens computed for it stay valid. Text that
/// is not a JSON object becomes `{}`.
fn arguments_value(text: &str) -> minijinja::Value {
    match serde_json::from_str::<Value>(text) {
        Ok(parsed @ Value::Object(_)) => minijinja::Value::from_object(WrittenArguments {
            text: text.trim().to_owned(),
            parsed: minijinja::Value::from_serialize(&parsed),
        }),
        _ => minijinja::Value::from_serialize(json!({})),
    }
}

/// A JSON object of arguments and the text it was written as.
#[derive(Debug)]
struct WrittenArguments {
    text: String,
    parsed: minijinja::Value,
}

impl minijinja::value::Object for WrittenArguments {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Map
    }

    fn get_value(self: &std::sync::Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.parsed.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &std::sync::Arc<Self>) -> minijinja::value::Enumerator {
        match self.parsed.try_iter() {
            Ok(keys) => minijinja::value::Enumerator::Values(keys.collect()),
            Err(_) => minijinja::value::Enumerator::Empty,
        }
    }
}

/// The `tojson` filter: minijinja's, except that written arguments print as they were written.
fn tojson(
    value: &minijinja::Value,
    indent: Option<minijinja::Value>,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<minijinja::Value>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let none = || minijinja::value::Kwargs::from_iter(std::iter::empty::<(&str, minijinja::Value)>());
    match value.downcast_object_ref::<WrittenArguments>() {
        Some(written) if indent.is_none() => Ok(minijinja::Value::from_safe_string(written.text.clone())),
        Some(written) => minijinja::filters::tojson(&written.parsed, indent, none()),
        None => minijinja::filters::tojson(value, indent, none()),
    }
}

/// What a GGUF chat model needs besides its weights.
#[derive(Debug)]
pub struct GgufChatAssets {
    /// The tokenizer from the metadata.
    pub tokenizer: tokenizers::Tokenizer,
    /// The chat template from the metadata.
    pub template: ChatTemplate,
    /// Tokens that end a reply (`<|im_end|>`, `<|endoftext|>`, the file's eos).
    pub stop_tokens: Vec<u32>,
    /// The context window the model was trained for.
    pub context_length: usize,
}

fn meta<'a>(ct: &'a gguf_file::Content, key: &str) -> Result<&'a gguf_file::Value, LocalModelError> {
    ct.metadata.get(key).ok_or_else(|| LocalModelError::Format(format!("GGUF metadata lacks {key}")))
}

impl GgufChatAssets {
    /// Reads the tokenizer and template from GGUF metadata.
    ///
    /// # Errors
    /// When a key is missing or malformed.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, LocalModelError> {
        let bad = |e: candle_core::Error| LocalModelError::Format(format!("GGUF metadata: {e}"));
        let tokens = meta(ct, "tokenizer.ggml.tokens")?.to_vec().map_err(bad)?;
        let types = meta(ct, "tokenizer.ggml.token_type")?.to_vec().map_err(bad)?;
        let merges = meta(ct, "tokenizer.ggml.merges")?.to_vec().map_err(bad)?;
        let mut vocab = serde_json::Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, token) in tokens.iter().enumerate() {
            let text = token.to_string().map_err(bad)?.clone();
            // GGUF token types: 3 = control, 4 = user-defined (both never split by BPE).
            let kind = types.get(id).map(|t| t.to_i32().unwrap_or(1)).unwrap_or(1);
            if kind == 3 || kind == 4 {
                added.push(json!({"id": id, "content": text, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": kind == 3}));
            }
            vocab.insert(text, json!(id));
        }
        let merges: Vec<String> =
            merges.iter().map(|m| m.to_string().cloned()).collect::<Result<_, _>>().map_err(bad)?;
        let split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges}
        });
        let tokenizer: tokenizers::Tokenizer = spec
            .to_string()
            .parse()
            .map_err(|e: tokenizers::Error| LocalModelError::Format(format!("GGUF tokenizer: {e}")))?;
        let template = ChatTemplate::new(meta(ct, "tokenizer.chat_template")?.to_string().map_err(bad)?)?;
        // `<|im_start|>` opens the next message: a reply that writes it has ended (printed, it
        // is a template marker in the answer).
        let mut stop_tokens: Vec<u32> =
            ["<|im_end|>", "<|endoftext|>", "<|im_start|>"].iter().filter_map(|t| tokenizer.token_to_id(t)).collect();
        if let Some(eos) = ct.metadata.get("tokenizer.ggml.eos_token_id").and_then(|v| v.to_u32().ok())
            && !stop_tokens.contains(&eos)
        {
            stop_tokens.push(eos);
        }
        let arch =
            ct.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        let context_length = ct
            .metadata
            .get(&format!("{arch}.context_length"))
            .and_then(|v| v.to_u32().ok())
            .map_or(4096, |n| n as usize);
        Ok(Self { tokenizer, template, stop_tokens, context_length })
    }

    /// Reads only the metadata of a GGUF file.
    ///
    /// # Errors
    /// When the file is missing (naming `scripts/fetch-models`) or not GGUF.
    pub fn from_file(path: &std::path::Path) -> Result<(Self, gguf_file::Content), LocalModelError> {
        let mut file = std::fs::File::open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                LocalModelError::Missing {
                    path: path.display().to_string(),
                    // The hint names the download that provides this file.
                    fetch: if path.ends_with(super::QWEN_1_5B_FILE) { "chat-1.5b" } else { "chat-0.5b" },
                    alternative: ", or point TOOLGRAPH_LLM_BASE_URL at any OpenAI-compatible server",
                }
            } else {
                LocalModelError::Io { path: path.display().to_string(), reason: e.to_string() }
            }
        })?;
        let content = gguf_file::Content::read(&mut file)
            .map_err(|e| LocalModelError::Format(format!("{}: not a GGUF file: {e}", path.display())))?;
        Ok((Self::from_gguf(&content)?, content))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgraph_llm::ToolCall;

    /// The tool-calling part of Qwen2.5's template, as shipped in its GGUF files.
    const QWEN_LIKE: &str = r#"{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

# Tools

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == "user" or (message.role == "system" and not tools) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{%- elif message.role == "assistant" %}
<|im_start|>assistant
{{ message.content }}
{%- for tool_call in message.tool_calls %}
<tool_call>
{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{%- elif message.role == "tool" %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{%- endif %}"#;

    #[test]
    fn tools_calls_and_results_render_in_the_templates_format() {
        let t = ChatTemplate::new(QWEN_LIKE).unwrap();
        let tools = [ToolDefinition {
            name: "rag_search".into(),
            description: "Search documents".into(),
            parameters: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        }];
        let messages = [
            Message::system("Eres un tutor."),
            Message::user("¿Cuándo es el examen?"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "rag_search".into(),
                    arguments: r#"{"query":"examen final"}"#.into(),
                }],
            },
            Message::Tool { tool_call_id: "c1".into(), name: "rag_search".into(), content: "20 de enero".into() },
        ];
        let prompt = t.render(&messages, &tools).unwrap();
        assert!(prompt.starts_with("<|im_start|>system\nEres un tutor."), "{prompt}");
        assert!(prompt.contains(r#"{"function":{"description":"Search documents","name":"rag_search""#), "{prompt}");
        assert!(
            prompt.contains("<tool_call>\n{\"name\": \"rag_search\", \"arguments\": {\"query\":\"examen final\"}}"),
            "{prompt}"
        );
        assert!(prompt.contains("<tool_response>\n20 de enero\n</tool_response>"));
        assert!(prompt.ends_with("<|im_start|>assistant"), "{prompt}");
        // Without tools the system message is an ordinary turn.
        let plain = t.render(&messages[..2], &[]).unwrap();
        assert!(!plain.contains("<tools>") && plain.contains("<|im_start|>system\nEres un tutor.<|im_end|>"));
    }

    #[test]
    fn a_past_call_reads_as_the_model_wrote_it() {
        let call = |arguments: &str| Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall { id: "c1".into(), name: "rag_search".into(), arguments: arguments.into() }],
        };
        let t = ChatTemplate::new(QWEN_LIKE).unwrap();
        // Key order, spacing and an apostrophe stay as written (minijinja's own `tojson`
        // would sort the keys, drop the spaces and escape the apostrophe).
        let written = r#"{"top_k": 1, "query": "l'examen final"}"#;
        let prompt = t.render(&[Message::user("?"), call(written)], &[]).unwrap();
        assert!(prompt.contains(&format!("\"arguments\": {written}}}")), "{prompt}");
        // Text that is no object renders as `{}`.
        let prompt = t.render(&[Message::user("?"), call("not json")], &[]).unwrap();
        assert!(prompt.contains("\"arguments\": {}}"), "{prompt}");
        // Templates that read the arguments' keys, or indent them, still can.
        let keys = ChatTemplate::new(
            "{% for m in messages %}{% for c in m.tool_calls %}{% for k in c.function.arguments %}{{ k }}={{ \
             c.function.arguments[k] }};{% endfor %}{{ c.function.arguments | tojson(indent=1) }}{% endfor %}{% endfor %}",
        )
        .unwrap();
        let out = keys.render(&[call(written)], &[]).unwrap();
        assert!(out.starts_with("query=l'examen final;top_k=1;"), "{out}");
        assert!(out.contains("{\n \"query\": \"l\\u0027examen final\",\n \"top_k\": 1\n}"), "{out}");
    }

    #[test]
    fn a_template_that_raises_is_an_input_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
        let err = t.render(&[Message::user("x")], &[]).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        assert!(ChatTemplate::new("{% if %}").is_err());
    }
}
