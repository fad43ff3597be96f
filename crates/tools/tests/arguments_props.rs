//! Property tests of tool-argument handling (docs/reliability.md): the model's raw argument
//! text and values of any shape never panic the parser or the validator; arguments that fit a
//! schema pass, and breaking one field of them fails with that field's path in the message.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolgraph_tools::{ArgumentSchema, ToolCallRequest};

fn schema() -> ArgumentSchema {
    ArgumentSchema::from_value(
        "make_test",
        json!({
            "type": "object",
            "properties": {
                "topic": {"type": "string", "minLength": 1},
                "num_questions": {"type": "integer", "minimum": 1, "maximum": 10},
                "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "strict": {"type": "boolean"}
            },
            "required": ["topic", "num_questions"]
        }),
        &[],
    )
    .expect("a valid schema")
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,12}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Arguments that fit [`schema`].
fn fitting() -> impl Strategy<Value = Map<String, Value>> {
    (
        ".{1,30}",
        1i64..=10,
        prop::option::of(prop::sample::select(vec!["easy", "medium", "hard"])),
        prop::option::of(prop::collection::vec(".{0,10}", 0..4)),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(topic, n, difficulty, tags, strict)| {
            let mut m = Map::new();
            m.insert("topic".into(), topic.into());
            m.insert("num_questions".into(), n.into());
            if let Some(d) = difficulty {
                m.insert("difficulty".into(), d.into());
            }
            if let Some(t) = tags {
                m.insert("tags".into(), t.into());
            }
            if let Some(s) = strict {
                m.insert("strict".into(), s.into());
            }
            m
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn raw_argument_text_never_panics(raw in ".{0,200}") {
        let _ = ToolCallRequest::parse_arguments(&raw);
    }

    #[test]
    fn any_value_is_judged_without_panicking(v in any_json()) {
        let s = schema();
        if let Err(e) = s.check(&v) {
            prop_assert!(!e.is_empty());
        }
    }

    #[test]
    fn fitting_arguments_pass_and_one_broken_field_is_named(
        args in fitting(),
        field in prop::sample::select(vec!["topic", "num_questions", "difficulty", "tags", "strict"]),
        wrong in prop_oneof![Just(json!(null)), Just(json!({"x": 1})), Just(json!(99)), Just(json!("nope")), Just(json!([1]))],
    ) {
        let s = schema();
        prop_assert!(s.check(&Value::Object(args.clone())).is_ok(), "{:?}", args);
        // Text through the model's channel: the same arguments parsed back.
        let text = serde_json::to_string(&args).unwrap();
        prop_assert_eq!(ToolCallRequest::parse_arguments(&text).unwrap(), Value::Object(args.clone()));
        let mut broken = args;
        broken.insert(field.to_owned(), wrong.clone());
        match s.check(&Value::Object(broken)) {
            Err(e) => prop_assert!(e.contains(&format!("/{field}")), "{} = {}: {}", field, wrong, e),
            // Only a value the field's rule accepts passes (a string topic).
            Ok(()) => prop_assert!(field == "topic" && wrong.is_string(), "{} = {} passed", field, wrong),
        }
    }
}
