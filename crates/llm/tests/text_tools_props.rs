//! Property tests of the streaming tool-call parser (`text_tools`): whatever a model writes, and
//! however the stream splits it, the parser does not panic, loses no prose, and finds the same
//! calls. Bounded case counts so they run under plain `cargo test`.

use proptest::prelude::*;
use serde_json::{Map, Value};
use toolgraph_llm::text_tools::{TextEvent, ToolCallTextParser};

/// Runs `text` through a parser in pieces cut at `cuts` (char offsets, any order); returns the
/// events with adjacent texts merged.
fn run(text: &str, cuts: &[usize]) -> Vec<TextEvent> {
    let chars: Vec<char> = text.chars().collect();
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
    at.push(0);
    at.push(chars.len());
    at.sort_unstable();
    at.dedup();
    let mut p = ToolCallTextParser::new();
    let mut events = Vec::new();
    for w in at.windows(2) {
        let piece: String = chars[w[0]..w[1]].iter().collect();
        events.extend(p.push(&piece));
    }
    events.extend(p.finish());
    merge(events)
}

fn merge(events: Vec<TextEvent>) -> Vec<TextEvent> {
    let mut out: Vec<TextEvent> = Vec::new();
    for e in events {
        match (out.last_mut(), e) {
            (Some(TextEvent::Text(prev)), TextEvent::Text(t)) => prev.push_str(&t),
            (_, TextEvent::Text(t)) if t.is_empty() => {}
            (_, e) => out.push(e),
        }
    }
    out
}

/// Text a model might write: prose with the characters that start calls and fences.
fn model_text() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "Hola",
        " ",
        "\n",
        "{",
        "}",
        "\"",
        ":",
        ",",
        "```",
        "```json",
        "<",
        ">",
        "<tool_call>",
        "</tool_call>",
        "name",
        "arguments",
        "\"name\"",
        "\"arguments\"",
        "x",
        "ñ",
        "한",
        "2+2",
        "[",
        "]",
    ]);
    prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
}

/// Prose that cannot start a call (no braces, angle brackets or backticks).
fn prose() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ,.!?¿¡áéíóúñ한국어\n]{0,60}"
}

fn arguments() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z_]{1,8}", "[a-zA-Z0-9 áñ{}\\[\\]\"<>]{0,12}", 0..4)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

proptest! {
    // A fixed seed keeps CI reproducible (PROPTEST_RNG_SEED explores others); no failure files
    // are written into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7001_6a9f),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any text, any chunking: no panic, and the result does not depend on the chunking.
    #[test]
    fn the_chunking_never_changes_what_is_found(text in model_text(), cuts in prop::collection::vec(0usize..400, 0..12)) {
        let whole = run(&text, &[]);
        prop_assert_eq!(run(&text, &cuts), whole);
    }

    /// Prose comes out exactly as it went in, however it was cut (a reply of nothing but
    /// whitespace is no text at all: it was waiting for a call that never came).
    #[test]
    fn prose_is_never_lost(text in prose(), cuts in prop::collection::vec(0usize..100, 0..12)) {
        let expected = if text.trim().is_empty() { vec![] } else { vec![TextEvent::Text(text.clone())] };
        prop_assert_eq!(run(&text, &cuts), expected);
    }

    /// A call in the template's tag, after any prose, is found with its arguments whole, and no
    /// part of it reaches the text.
    #[test]
    fn a_tagged_call_is_found_whatever_its_arguments(
        before in prose(),
        name in "[a-z_]{1,16}",
        args in arguments(),
        cuts in prop::collection::vec(0usize..300, 0..12),
    ) {
        let call = serde_json::json!({"name": name, "arguments": args});
        let text = format!("{before}<tool_call>\n{call}\n</tool_call>");
        let events = run(&text, &cuts);
        let calls: Vec<&TextEvent> = events.iter().filter(|e| matches!(e, TextEvent::ToolCall { .. })).collect();
        prop_assert_eq!(calls.len(), 1, "{:?}", events);
        let TextEvent::ToolCall { name: got, arguments } = calls[0] else { unreachable!() };
        prop_assert_eq!(got, &name);
        let parsed: Value = serde_json::from_str(arguments).unwrap();
        prop_assert_eq!(parsed, Value::Object(args));
        let shown: String = events.iter().filter_map(|e| match e { TextEvent::Text(t) => Some(t.as_str()), _ => None }).collect();
        prop_assert!(!shown.contains("tool_call") && !shown.contains(&format!("\"{name}\"")), "{:?}", events);
    }
}
