//! `get_guia`: a section of the current subject's teaching guide, or its summary.
//!
//! The subject (`asignatura`) is injected from the conversation's state, never chosen by the
//! model; the model picks the section (`key`, a known section or a dot path into one such as
//! `competencias.generales`). The answers and messages are the course tutor's: the section's
//! JSON, the summary `{subject, asignatura, grado, curso, url, brief_description}`, `No guia
//! found for subject: X`, `Key 'k' not present`.

use super::guides::{Guide, GuideStore, SECTIONS, fold, navigate};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use toolgraph_tools::{Tool, ToolBuilder, ToolError};

/// Arguments of `get_guia`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct GuiaArgs {
    /// Subject identifier (from the conversation).
    #[serde(default)]
    pub asignatura: Option<String>,
    // The section to return; without it, the guide's summary. Described by `key_schema`: a doc
    // comment here would replace that description, which lists the sections.
    #[allow(missing_docs)]
    #[serde(default)]
    #[schemars(schema_with = "key_schema")]
    pub key: Option<String>,
}

/// A known section, or a dot path into one. The sections are listed in the description rather
/// than as a `pattern`: the handler checks them with accents and case folded (small models drop
/// the `í` of `bibliografía`), and its refusal names them for the model to repair.
fn key_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": format!(
            "The section of the guide to return: {}; or a dot path into one, e.g. competencias.generales. \
             Leave it out for the guide's summary.",
            SECTIONS.join(", ")
        ),
    })
}

/// Refuses a key whose first part names no known section, the way a schema violation is refused.
fn check_section(key: &str) -> Result<(), ToolError> {
    let first = key.split('.').next().unwrap_or_default();
    if SECTIONS.iter().any(|s| fold(s) == fold(first)) {
        Ok(())
    } else {
        Err(ToolError::invalid_arguments(format!(
            "key: '{first}' is not a section of the guide; use one of {}",
            SECTIONS.join(", ")
        )))
    }
}

/// The `get_guia` read tool over `store`, for the conversation's tenant (else `default_tenant`).
pub fn get_guia_tool(store: Arc<GuideStore>, default_tenant: String) -> Arc<dyn Tool> {
    ToolBuilder::<GuiaArgs>::new(
        "get_guia",
        "Look up a section of the current subject's teaching guide (syllabus, guía docente, đề cương): the \
         competences it develops (competencias), objectives (objetivos), contents, teaching methods, how the \
         subject is assessed and graded (sistema_de_evaluación), bibliography, teachers (profesorado). Without a \
         key it returns the summary.",
    )
    .inject("asignatura")
    .display_name("Teaching guide")
    .cited_as("Guía docente › {key}")
    .handler(move |ctx, args: GuiaArgs| {
        let store = Arc::clone(&store);
        let tenant = ctx.get_str("tenant").unwrap_or(&default_tenant).to_owned();
        async move {
            let Some(subject) = args.asignatura.as_deref().map(str::trim).filter(|s| !s.is_empty()) else {
                return Ok(Value::String("No guia found for subject".into()));
            };
            let doc = store
                .get(&tenant, subject)
                .await
                .map_err(|e| ToolError::unavailable(format!("the teaching guides cannot be read: {e}")))?;
            let Some(doc) = doc else {
                return Ok(Value::String(format!("No guia found for subject: {subject}")));
            };
            if let Some(key) = args.key.as_deref() {
                check_section(key)?;
            }
            Ok(match args.key.as_deref() {
                Some(key) => navigate(&doc, key).cloned().unwrap_or_else(|| format!("Key '{key}' not present").into()),
                None => Guide::summary(&doc),
            })
        }
    })
    // The builder's only failure is a schema or name error, fixed at compile time here.
    .expect("get_guia's schema is valid")
}

#[cfg(test)]
mod tests {
    use super::check_section;

    #[test]
    fn sections_are_checked_without_accents_or_case() {
        assert!(check_section("bibliografía_fundamental").is_ok());
        assert!(check_section("bibliografia_fundamental").is_ok());
        assert!(check_section("Sistema_de_Evaluacion.ordinaria").is_ok());
        let refused = check_section("horario.lunes").unwrap_err();
        assert!(refused.message.contains("'horario'"), "{refused:?}");
        assert!(refused.message.contains("competencias"), "{refused:?}");
    }
}
