//! Property tests of the configuration loader (docs/reliability.md): documents built from real
//! keys with values of any type, and arbitrary text, load or fail with a message — never a
//! panic — and a refused document's message names a key it holds, or says the TOML is bad.

use proptest::prelude::*;
use toolgraph_config::Config;

/// Real keys of `toolgraph.toml`, by section ("" for the top level).
const KEYS: [(&str, &str); 16] = [
    ("", "data_dir"),
    ("", "default_agent"),
    ("llm", "model"),
    ("llm", "base_url"),
    ("llm", "temperature"),
    ("llm", "connect_timeout_ms"),
    ("llm", "idle_timeout_ms"),
    ("server", "port"),
    ("server", "max_runs_per_tenant"),
    ("server", "turn_lease_ms"),
    ("server", "instance_id"),
    ("server", "store"),
    ("rag", "default_kb"),
    ("tools", "sql_database"),
    ("plugins", "dirs"),
    ("agents.tutor", "system_prompt"),
];

/// A TOML value of any type, some of them valid for some keys.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (-1e6f64..1e6).prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-zA-Z0-9_:/. -]{0,24}".prop_map(|s| format!("{s:?}")),
        Just("[]".to_owned()),
        Just("[1, \"a\"]".to_owned()),
        Just("{ x = 1 }".to_owned()),
        Just("\"\"".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
    ]
}

fn document() -> impl Strategy<Value = (String, Vec<&'static str>)> {
    prop::collection::vec((prop::sample::select(&KEYS[..]), value()), 0..8).prop_map(|entries| {
        let mut by_section: std::collections::BTreeMap<&str, Vec<(&str, String)>> = Default::default();
        for ((section, key), v) in entries {
            by_section.entry(section).or_default().push((key, v));
        }
        let mut text = String::new();
        let mut keys = Vec::new();
        for (section, entries) in by_section {
            if !section.is_empty() {
                text.push_str(&format!("[{section}]\n"));
            }
            let mut seen = std::collections::BTreeSet::new();
            for (key, v) in entries {
                if seen.insert(key) {
                    text.push_str(&format!("{key} = {v}\n"));
                    keys.push(key);
                }
            }
        }
        (text, keys)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn real_keys_with_any_values((text, keys) in document()) {
        if let Err(e) = Config::from_toml_str(&text) {
            let message = e.to_string();
            prop_assert!(
                keys.iter().any(|k| message.contains(k)) || message.contains("TOML") || message.contains("llm.model"),
                "the error names no key of the document:\n{}\n{}", text, message
            );
        }
    }

    #[test]
    fn arbitrary_text(text in ".{0,300}") {
        if let Err(e) = Config::from_toml_str(&text) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}
