//! Argument schemas: generated from a Rust type, trimmed of injected arguments, compiled once
//! into a validator whose messages a model can act on.

use jsonschema::Validator;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::Value;

/// Why a tool's schema could not be built; a programming error caught at registration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The name breaks the providers' rules (1–64 of `[a-zA-Z0-9_-]`).
    #[error("tool name '{tool}' is invalid: use 1 to 64 letters, digits, '_' or '-'")]
    InvalidName {
        /// The name.
        tool: String,
    },
    /// Display text was given for a parameter the arguments type does not have.
    #[error("tool '{tool}' has display text for parameter '{argument}', which its arguments type does not have")]
    UnknownParameter {
        /// The tool.
        tool: String,
        /// The parameter.
        argument: String,
    },
    /// The generated schema is not an object schema with `properties`.
    #[error("the arguments of tool '{tool}' must be a struct (an object schema), got: {schema}")]
    NotAnObject {
        /// The tool.
        tool: String,
        /// The schema that was generated.
        schema: String,
    },
    /// A describe template names an argument the tool does not have.
    #[error("the describe text of tool '{tool}' uses {{{argument}}}, which is not one of its parameters")]
    UnknownPlaceholder {
        /// The tool.
        tool: String,
        /// The placeholder's argument name.
        argument: String,
    },
    /// An injected argument names no property of the arguments type.
    #[error("tool '{tool}' injects argument '{argument}', which its arguments type does not have")]
    UnknownInjected {
        /// The tool.
        tool: String,
        /// The missing property.
        argument: String,
    },
    /// An argument hidden from the model is not an optional property of the arguments type.
    #[error("tool '{tool}' hides argument '{argument}' from the model, which must then be an optional parameter")]
    HiddenNotOptional {
        /// The tool.
        tool: String,
        /// The argument.
        argument: String,
    },
    /// A tool the agent calls with no arguments (`runs_after`) has a required argument.
    #[error("tool '{tool}' runs with no arguments after another tool, so its argument '{argument}' must be optional")]
    RunsWithRequiredArgument {
        /// The tool.
        tool: String,
        /// The argument.
        argument: String,
    },
    /// The JSON Schema validator rejected the schema.
    #[error("the schema of tool '{tool}' does not compile: {reason}")]
    Compile {
        /// The tool.
        tool: String,
        /// What the validator said.
        reason: String,
    },
}

/// The schema a model sees for a tool's arguments, and its compiled validator.
pub struct ArgumentSchema {
    model_facing: Value,
    validator: Validator,
}

impl std::fmt::Debug for ArgumentSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgumentSchema").field("model_facing", &self.model_facing).finish()
    }
}

impl ArgumentSchema {
    /// Generates the schema of `A` (schemars, JSON Schema 2020-12), removes the `injected`
    /// properties, and compiles a validator for what remains.
    ///
    /// # Errors
    /// When `A` is not a struct, an injected name is not one of its fields, or the schema
    /// does not compile.
    pub fn of<A: JsonSchema>(tool: &str, injected: &[String]) -> Result<Self, SchemaError> {
        let schema = SchemaGenerator::default().into_root_schema_for::<A>();
        Self::from_value(tool, schema.to_value(), injected)
    }

    /// Same as [`ArgumentSchema::of`] from an already generated (or hand-written, for
    /// declarative plugins) schema value.
    ///
    /// # Errors
    /// See [`ArgumentSchema::of`].
    pub fn from_value(tool: &str, mut schema: Value, injected: &[String]) -> Result<Self, SchemaError> {
        let not_object =
            |schema: &Value| SchemaError::NotAnObject { tool: tool.to_owned(), schema: schema.to_string() };
        let obj = schema.as_object_mut().ok_or_else(|| not_object(&Value::Null))?;
        // A struct without fields has no `properties`; give it an empty set so the model
        // sees a well-formed object schema.
        if obj.get("type").and_then(Value::as_str) != Some("object") {
            let snapshot = Value::Object(obj.clone());
            return Err(not_object(&snapshot));
        }
        let props = obj.entry("properties").or_insert_with(|| Value::Object(Default::default()));
        let props = props.as_object_mut().ok_or_else(|| SchemaError::NotAnObject {
            tool: tool.to_owned(),
            schema: "properties is not an object".into(),
        })?;
        for name in injected {
            if props.remove(name).is_none() {
                return Err(SchemaError::UnknownInjected { tool: tool.to_owned(), argument: name.clone() });
            }
        }
        if let Some(Value::Array(required)) = obj.get_mut("required") {
            required.retain(|r| !injected.iter().any(|i| r.as_str() == Some(i.as_str())));
            if required.is_empty() {
                obj.remove("required");
            }
        }
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| SchemaError::Compile { tool: tool.to_owned(), reason: e.to_string() })?;
        Ok(Self { model_facing: schema, validator })
    }

    /// The same schema without the optional arguments `hidden` in what the model is shown;
    /// they are still checked when a caller passes them (a graph node that has them at hand,
    /// where a model would only copy them, garbled and slowly).
    ///
    /// # Errors
    /// A hidden name that is not an optional property.
    pub fn hiding(mut self, tool: &str, hidden: &[String]) -> Result<Self, SchemaError> {
        let required = self.model_facing.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
        for name in hidden {
            let removed =
                self.model_facing.get_mut("properties").and_then(Value::as_object_mut).and_then(|p| p.remove(name));
            if removed.is_none() || required.iter().any(|r| r.as_str() == Some(name.as_str())) {
                return Err(SchemaError::HiddenNotOptional { tool: tool.to_owned(), argument: name.clone() });
            }
        }
        Ok(self)
    }

    /// The schema shown to the model.
    pub fn model_facing(&self) -> &Value {
        &self.model_facing
    }

    /// Checks arguments from the model; on failure returns every violation as one readable
    /// line each, e.g. `99 is greater than the maximum of 10 at /num_questions`.
    pub fn check(&self, arguments: &Value) -> Result<(), String> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() { e.to_string() } else { format!("{e} at {path}") }
            })
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;

    /// The course tutor's `generate_test` input.
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct TestGenerationInput {
        /// Topic for questions.
        topic: String,
        /// Number of questions.
        #[schemars(range(min = 1, max = 10))]
        num_questions: Option<u8>,
        /// Difficulty.
        difficulty: Option<Difficulty>,
        /// Course code, e.g. "iv".
        #[schemars(regex(pattern = r"^[a-z0-9-]{1,40}$"))]
        asignatura: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Difficulty {
        Easy,
        Medium,
        Hard,
    }

    #[test]
    fn generated_schema_carries_ranges_enums_and_patterns() {
        let s = ArgumentSchema::of::<TestGenerationInput>("generate_test", &[]).unwrap();
        let text = s.model_facing().to_string();
        let nq = &s.model_facing()["properties"]["num_questions"];
        assert_eq!(nq["minimum"], json!(1), "{text}");
        assert_eq!(nq["maximum"], json!(10), "{text}");
        assert!(text.contains(r#""enum":["easy","medium","hard"]"#), "{text}");
        assert_eq!(s.model_facing()["properties"]["asignatura"]["pattern"], json!("^[a-z0-9-]{1,40}$"));
        assert_eq!(s.model_facing()["required"], json!(["topic"]));
    }

    #[test]
    fn violations_read_like_repair_instructions() {
        let s = ArgumentSchema::of::<TestGenerationInput>("generate_test", &[]).unwrap();
        let err = s.check(&json!({"topic": "Docker", "num_questions": 99})).unwrap_err();
        assert_eq!(err, "99 is greater than the maximum of 10 at /num_questions");
        let err = s.check(&json!({"topic": "Docker", "difficulty": "extreme"})).unwrap_err();
        assert!(err.contains("/difficulty"), "{err}");
        let err = s.check(&json!({})).unwrap_err();
        assert!(err.contains("\"topic\" is a required property"), "{err}");
        assert!(s.check(&json!({"topic": "Docker", "num_questions": 3})).is_ok());
    }

    #[test]
    fn injected_arguments_leave_the_model_schema() {
        let s = ArgumentSchema::of::<TestGenerationInput>("generate_test", &["asignatura".into()]).unwrap();
        assert!(s.model_facing()["properties"].get("asignatura").is_none());
        assert!(s.model_facing()["properties"].get("topic").is_some());
    }

    #[test]
    fn a_hidden_argument_leaves_the_model_schema_but_is_still_checked() {
        let s = ArgumentSchema::of::<TestGenerationInput>("generate_test", &[])
            .unwrap()
            .hiding("generate_test", &["num_questions".into()])
            .unwrap();
        assert!(s.model_facing()["properties"].get("num_questions").is_none());
        assert!(s.check(&json!({"topic": "t", "num_questions": 3})).is_ok());
        let problem = s.check(&json!({"topic": "t", "num_questions": 99})).unwrap_err();
        assert!(problem.contains("num_questions"), "{problem}");
        for name in ["topic", "no_such_field"] {
            let err = ArgumentSchema::of::<TestGenerationInput>("generate_test", &[])
                .unwrap()
                .hiding("generate_test", &[name.into()])
                .unwrap_err();
            assert!(matches!(err, SchemaError::HiddenNotOptional { .. }), "{name}: {err}");
        }
    }

    #[test]
    fn injecting_an_unknown_field_is_refused() {
        let err = ArgumentSchema::of::<TestGenerationInput>("generate_test", &["subject".into()]).unwrap_err();
        assert!(matches!(err, SchemaError::UnknownInjected { .. }), "{err}");
    }

    #[test]
    fn non_struct_arguments_are_refused() {
        let err = ArgumentSchema::of::<Vec<String>>("bad", &[]).unwrap_err();
        assert!(matches!(err, SchemaError::NotAnObject { .. }), "{err}");
    }
}
