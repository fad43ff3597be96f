//! Normalises generated JSON Schemas for what each provider accepts.
//!
//! schemars emits JSON Schema 2020-12: `$schema`, `$defs` with `$ref`, `type: ["string","null"]`,
//! numeric formats such as `uint8`, and `oneOf` of `const`s for documented enums. OpenAI's
//! strict mode, Gemini and some local servers reject parts of that. This module rewrites a
//! schema into the dialect a provider accepts, keeping every constraint it can express.

use serde_json::{Map, Value, json};

/// Which server family an endpoint belongs to; decides the schema dialect and a few
/// request details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// api.openai.com and Azure-style OpenAI deployments (`openai`; `open-ai` is read too).
    #[serde(rename = "openai", alias = "open-ai")]
    OpenAi,
    /// Google Gemini's OpenAI-compatible endpoint.
    Gemini,
    /// Ollama's `/v1`.
    Ollama,
    /// vLLM's OpenAI server.
    Vllm,
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// Anything else that speaks the format.
    Generic,
}

impl Provider {
    /// Guesses the provider from a base URL; unknown hosts are [`Provider::Generic`].
    pub fn detect(base_url: &str) -> Self {
        let u = base_url.to_ascii_lowercase();
        if u.contains("generativelanguage.googleapis.com") {
            Self::Gemini
        } else if u.contains("api.openai.com") || u.contains("openai.azure.com") {
            Self::OpenAi
        } else if u.contains(":11434") {
            Self::Ollama
        } else {
            Self::Generic
        }
    }

    /// The schema dialect for tool parameters sent to this provider.
    pub fn tool_dialect(self) -> SchemaDialect {
        match self {
            Self::Gemini => SchemaDialect::Gemini,
            Self::OpenAi => SchemaDialect::OpenAi,
            Self::Ollama | Self::Vllm | Self::LlamaCpp | Self::Generic => SchemaDialect::Generic,
        }
    }
}

/// A family of accepted schema subsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaDialect {
    /// Plain JSON Schema without references or non-standard formats (local servers).
    Generic,
    /// OpenAI function parameters (non-strict).
    OpenAi,
    /// OpenAI strict mode: every property required (optional ones nullable), no extra
    /// properties, no defaults.
    OpenAiStrict,
    /// Gemini's OpenAPI-3 subset: `nullable` instead of null types, a fixed keyword list.
    Gemini,
}

/// Formats every dialect understands; numeric ones like `uint8` or `double` are dropped
/// (their bounds are already in `minimum`/`maximum`).
const STRING_FORMATS: &[&str] =
    &["date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"];

/// Keywords Gemini's schema subset accepts.
const GEMINI_KEYS: &[&str] = &[
    "type",
    "format",
    "description",
    "nullable",
    "enum",
    "properties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "title",
    "propertyOrdering",
];

/// Deepest `$ref` chain inlined; deeper (recursive) references become an open schema.
const MAX_REF_DEPTH: usize = 8;

/// Rewrites `schema` for `dialect`. The input is not modified.
pub fn normalize_schema(schema: &Value, dialect: SchemaDialect) -> Value {
    let mut defs = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(d)) = schema.get(key) {
            defs.extend(d.clone());
        }
    }
    let mut out = inline_refs(schema, &defs, 0);
    if let Value::Object(root) = &mut out {
        root.remove("$schema");
        root.remove("title");
    }
    clean(&mut out, dialect);
    out
}

fn inline_refs(v: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                let name = r.rsplit('/').next().unwrap_or_default();
                let mut target = match defs.get(name) {
                    Some(t) if depth < MAX_REF_DEPTH => inline_refs(t, defs, depth + 1),
                    _ => json!({}),
                };
                // Siblings of `$ref` (usually a description) refine the referenced schema.
                if let Value::Object(t) = &mut target {
                    t.remove("title");
                    for (k, val) in m {
                        if k != "$ref" {
                            t.insert(k.clone(), inline_refs(val, defs, depth));
                        }
                    }
                }
                return target;
            }
            Value::Object(
                m.iter()
                    .filter(|(k, _)| k.as_str() != "$defs" && k.as_str() != "definitions")
                    .map(|(k, val)| (k.clone(), inline_refs(val, defs, depth)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline_refs(x, defs, depth)).collect()),
        other => other.clone(),
    }
}

/// `oneOf`/`anyOf` whose branches are all `const` (schemars' form of a documented enum)
/// becomes a plain `enum`, which every provider accepts and models read more easily.
fn consts_to_enum(m: &mut Map<String, Value>) {
    for key in ["oneOf", "anyOf"] {
        let Some(Value::Array(branches)) = m.get(key) else {
            continue;
        };
        let values: Option<Vec<Value>> = branches.iter().map(|b| b.get("const").cloned()).collect();
        if let Some(values) = values.filter(|v| !v.is_empty()) {
            let all_strings = values.iter().all(Value::is_string);
            m.remove(key);
            m.insert("enum".into(), Value::Array(values));
            if all_strings {
                m.entry("type").or_insert_with(|| json!("string"));
            }
        }
    }
    if let Some(c) = m.remove("const") {
        m.insert("enum".into(), json!([c]));
    }
}

/// Whether a schema only admits null.
fn is_null_schema(v: &Value) -> bool {
    v.get("type") == Some(&json!("null")) || v.get("const") == Some(&Value::Null)
}

fn clean(v: &mut Value, dialect: SchemaDialect) {
    match v {
        Value::Array(a) => a.iter_mut().for_each(|x| clean(x, dialect)),
        Value::Object(m) => {
            consts_to_enum(m);
            if let Some(Value::String(f)) = m.get("format")
                && (!STRING_FORMATS.contains(&f.as_str()) || (dialect == SchemaDialect::Gemini && f != "date-time"))
            {
                m.remove("format");
            }
            // Recurse first, so nested objects are finished before this one is reshaped.
            for (k, child) in m.iter_mut() {
                match k.as_str() {
                    "properties" => {
                        if let Value::Object(props) = child {
                            props.values_mut().for_each(|p| clean(p, dialect));
                        }
                    }
                    "items" | "anyOf" | "oneOf" | "allOf" | "additionalProperties" | "prefixItems" | "not" => {
                        clean(child, dialect)
                    }
                    _ => {}
                }
            }
            match dialect {
                SchemaDialect::Gemini => to_gemini(m),
                SchemaDialect::OpenAiStrict => to_openai_strict(m),
                SchemaDialect::OpenAi | SchemaDialect::Generic => {}
            }
        }
        _ => {}
    }
}

fn to_gemini(m: &mut Map<String, Value>) {
    // `type: [T, "null"]` → `type: T, nullable: true`.
    if let Some(Value::Array(types)) = m.get("type").cloned() {
        let non_null: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
        if non_null.len() < types.len() {
            m.insert("nullable".into(), json!(true));
        }
        if non_null.len() == 1 {
            m.insert("type".into(), non_null[0].clone());
        } else {
            m.remove("type");
        }
    }
    // `anyOf: [S, {type: null}]` → S with `nullable: true`.
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = m.get(key).cloned() {
            let non_null: Vec<Value> = branches.iter().filter(|b| !is_null_schema(b)).cloned().collect();
            if non_null.len() < branches.len() {
                m.insert("nullable".into(), json!(true));
            }
            m.remove(key);
            if non_null.len() == 1 {
                if let Value::Object(inner) = &non_null[0] {
                    for (k, val) in inner {
                        m.entry(k.clone()).or_insert_with(|| val.clone());
                    }
                }
            } else if !non_null.is_empty() {
                m.insert("anyOf".into(), Value::Array(non_null));
            }
        }
    }
    if let Some(Value::Array(values)) = m.get_mut("enum") {
        // Gemini enums are strings only; a null member is expressed as `nullable`.
        if values.iter().any(Value::is_null) {
            values.retain(|x| !x.is_null());
            m.insert("nullable".into(), json!(true));
        }
    }
    if let Some(Value::Number(n)) = m.remove("exclusiveMinimum") {
        m.entry("minimum").or_insert(Value::Number(n));
    }
    if let Some(Value::Number(n)) = m.remove("exclusiveMaximum") {
        m.entry("maximum").or_insert(Value::Number(n));
    }
    m.retain(|k, _| GEMINI_KEYS.contains(&k.as_str()));
}

fn to_openai_strict(m: &mut Map<String, Value>) {
    m.remove("default");
    let is_object = m.get("type") == Some(&json!("object")) || m.contains_key("properties");
    if !is_object {
        return;
    }
    let required: Vec<String> = m
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let mut all = Vec::new();
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        for (name, prop) in props.iter_mut() {
            all.push(Value::String(name.clone()));
            if !required.contains(name) {
                make_nullable(prop);
            }
        }
    }
    m.insert("required".into(), Value::Array(all));
    m.insert("additionalProperties".into(), json!(false));
    m.entry("type").or_insert_with(|| json!("object"));
}

/// Lets `null` through a schema: how strict mode expresses an optional property.
fn make_nullable(prop: &mut Value) {
    let Value::Object(p) = prop else { return };
    match p.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            p.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(types)) => {
            if !types.iter().any(|t| t.as_str() == Some("null")) {
                types.push(json!("null"));
            }
        }
        Some(_) => {}
        None => {
            if let Some(Value::Array(branches)) = p.get_mut("anyOf") {
                if !branches.iter().any(is_null_schema) {
                    branches.push(json!({"type": "null"}));
                }
            } else {
                let inner = Value::Object(std::mem::take(p));
                p.insert("anyOf".into(), json!([inner, {"type": "null"}]));
            }
        }
    }
    if let Some(Value::Array(values)) = p.get_mut("enum")
        && !values.iter().any(Value::is_null)
    {
        values.push(Value::Null);
    }
}
