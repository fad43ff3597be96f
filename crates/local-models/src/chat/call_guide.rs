//! Constrained decoding of tool calls written as text. Once the model has opened a call and
//! written `"name": "`, only tokens that continue the name of an offered tool are allowed; in
//! the `"arguments"` object that follows, only that tool's parameter names may be keys, each
//! at most once, and the object must close once every parameter is used. A small model can
//! then neither call a tool that does not exist (`calculatorArgs`) nor copy schema words into
//! the arguments (`"type": "object"`) nor repeat keys until it runs out of tokens.
//!
//! Values are left free: the tools validate them, and a bad value comes back to the model as
//! a readable error it can correct.

use serde_json::Value;

/// A tool the model may call: its name and parameter names (empty: any keys), and which JSON
/// kinds each parameter's value may start as.
#[derive(Debug, Clone)]
pub struct GuidedTool {
    pub name: String,
    pub params: Vec<String>,
    kinds: Vec<Kinds>,
}

/// The JSON kinds a value may be, from its schema's `type` (all, when it names none).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Kinds {
    string: bool,
    number: bool,
    boolean: bool,
    null: bool,
    object: bool,
    array: bool,
}

impl Kinds {
    const ANY: Kinds = Kinds { string: true, number: true, boolean: true, null: true, object: true, array: true };
    const NONE: Kinds =
        Kinds { string: false, number: false, boolean: false, null: false, object: false, array: false };

    fn of(schema: &Value) -> Self {
        let names: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return Self::ANY,
        };
        let has = |n: &str| names.contains(&n);
        Kinds {
            string: has("string"),
            number: has("number") || has("integer"),
            boolean: has("boolean"),
            null: has("null"),
            object: has("object"),
            array: has("array"),
        }
    }

    /// Whether a value may start with `c`.
    fn starts(self, c: char) -> bool {
        match c {
            '"' => self.string,
            '{' => self.object,
            '[' => self.array,
            't' | 'f' => self.boolean,
            'n' => self.null,
            c => (c == '-' || c.is_ascii_digit()) && self.number,
        }
    }
}

impl GuidedTool {
    /// From a tool's name and JSON-schema `parameters`.
    pub fn from_schema(name: &str, parameters: &Value) -> Self {
        let props = parameters.get("properties").and_then(Value::as_object);
        let params: Vec<String> = props.map(|p| p.keys().cloned().collect()).unwrap_or_default();
        let kinds = props.map(|p| p.values().map(Kinds::of).collect()).unwrap_or_default();
        Self { name: name.to_owned(), params, kinds }
    }

    fn kinds(&self, key: &str) -> Kinds {
        self.params.iter().position(|p| p == key).and_then(|i| self.kinds.get(i).copied()).unwrap_or(Kinds::ANY)
    }
}

/// Where in a call the text is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Not in a call (or past the part that is constrained).
    Outside,
    /// Writing the tool name (the text so far).
    Name(String),
    /// After the name, waiting for `"arguments": {`; holds the tool index and what came so far.
    BeforeArgs(usize, String),
    /// Inside the arguments object.
    Args(usize, Vec<String>, Arg),
}

/// The state inside the arguments object.
#[derive(Debug, Clone, PartialEq)]
enum Arg {
    /// After `{` or `,`: a key or (after `{`) the end.
    KeyOrEnd { first: bool },
    /// Inside a key (its text so far).
    Key(String),
    /// After a key, before `:`.
    Colon,
    /// After `:`, before the value.
    Value,
    /// Inside a value: bracket depth (0: a top-level string, number or literal), inside a
    /// string, after a backslash.
    InValue { depth: u32, string: bool, escape: bool },
    /// After a value: `,` or `}`.
    AfterValue,
}

/// How a tool-call object starts, up to the opening quote of its name.
fn opens_name(text: &str) -> bool {
    let Some(before) = text.strip_suffix('"') else { return false };
    let Some(before) = before.trim_end().strip_suffix(':') else { return false };
    let Some(before) = before.trim_end().strip_suffix("\"name\"") else { return false };
    let Some(before) = before.trim_end().strip_suffix('{') else { return false };
    let before = before.trim_end();
    // Inside an open `<tool_call>` block, or a reply that is nothing but a JSON call so far
    // (bare or fenced): the forms the lenient parser accepts as calls.
    let open_tag = before.rfind("<tool_call>").is_some_and(|at| !before[at..].contains("</tool_call>"));
    let fence = before.strip_prefix("```json").or_else(|| before.strip_prefix("```")).map(str::trim);
    open_tag || before.is_empty() || fence == Some("")
}

/// Follows a reply and says which tokens may come next while it writes a tool call.
#[derive(Debug)]
pub struct ToolCallGuide {
    tools: Vec<GuidedTool>,
    phase: Phase,
}

impl ToolCallGuide {
    /// A guide for these tools (none: it never constrains).
    pub fn new(tools: Vec<GuidedTool>) -> Self {
        Self { tools, phase: Phase::Outside }
    }

    /// Whether the next token is constrained.
    pub fn active(&self) -> bool {
        matches!(self.phase, Phase::Name(_) | Phase::Args(..))
    }

    /// Whether the reply is inside a call the guide follows: its name, what comes before its
    /// arguments, or the arguments (until their object closes).
    pub fn in_call(&self) -> bool {
        self.phase != Phase::Outside
    }

    /// Follows the reply: `text` is everything generated so far, `piece` its newest part.
    pub fn observe(&mut self, text: &str, piece: &str) {
        if self.tools.is_empty() {
            return;
        }
        if self.phase == Phase::Outside {
            if opens_name(text) {
                self.phase = Phase::Name(String::new());
            }
            return;
        }
        self.phase = self.advance(self.phase.clone(), piece).unwrap_or(Phase::Outside);
    }

    /// The phase after `piece`, or `None` if the piece breaks the constraint (then the guide
    /// lets go: the lenient parser decides what the text was).
    fn advance(&self, mut phase: Phase, piece: &str) -> Option<Phase> {
        for c in piece.chars() {
            phase = self.step(phase, c)?;
        }
        Some(phase)
    }

    fn step(&self, phase: Phase, c: char) -> Option<Phase> {
        Some(match phase {
            Phase::Outside => Phase::Outside,
            Phase::Name(mut name) => {
                if c == '"' {
                    let i = self.tools.iter().position(|t| t.name == name)?;
                    Phase::BeforeArgs(i, String::new())
                } else {
                    name.push(c);
                    if !self.tools.iter().any(|t| t.name.starts_with(&name)) {
                        return None;
                    }
                    Phase::Name(name)
                }
            }
            Phase::BeforeArgs(i, mut seen) => {
                seen.push(c);
                let compact: String = seen.chars().filter(|c| !c.is_whitespace()).collect();
                if compact == ",\"arguments\":{" {
                    Phase::Args(i, Vec::new(), Arg::KeyOrEnd { first: true })
                } else if ",\"arguments\":{".starts_with(&compact) {
                    Phase::BeforeArgs(i, seen)
                } else {
                    // Some other shape (`"parameters"`, a closing brace): not constrained.
                    Phase::Outside
                }
            }
            Phase::Args(i, mut used, arg) => {
                let params = &self.tools[i].params;
                let free = params.is_empty();
                let next = match arg {
                    Arg::KeyOrEnd { first } => match c {
                        c if c.is_whitespace() => Arg::KeyOrEnd { first },
                        '"' => Arg::Key(String::new()),
                        '}' if first || free || used.len() == params.len() => return Some(Phase::Outside),
                        _ => return None,
                    },
                    Arg::Key(mut key) => {
                        if c == '"' {
                            if !free && (!params.contains(&key) || used.contains(&key)) {
                                return None;
                            }
                            used.push(key);
                            Arg::Colon
                        } else {
                            key.push(c);
                            if !free && !params.iter().any(|p| p.starts_with(&key) && !used.contains(p)) {
                                return None;
                            }
                            Arg::Key(key)
                        }
                    }
                    Arg::Colon => match c {
                        ':' => Arg::Value,
                        c if c.is_whitespace() => Arg::Colon,
                        _ => return None,
                    },
                    Arg::Value => match c {
                        c if c.is_whitespace() => Arg::Value,
                        // Not the kind the schema asks for (a schema copied as the value).
                        c if !self.tools[i].kinds(used.last().map_or("", String::as_str)).starts(c) => return None,
                        '"' => Arg::InValue { depth: 0, string: true, escape: false },
                        '{' | '[' => Arg::InValue { depth: 1, string: false, escape: false },
                        c if c == '-' || c.is_ascii_alphanumeric() => {
                            Arg::InValue { depth: 0, string: false, escape: false }
                        }
                        _ => return None,
                    },
                    Arg::InValue { depth, string: true, escape } => match c {
                        _ if escape => Arg::InValue { depth, string: true, escape: false },
                        '\\' => Arg::InValue { depth, string: true, escape: true },
                        '"' if depth == 0 => Arg::AfterValue,
                        '"' => Arg::InValue { depth, string: false, escape: false },
                        _ => Arg::InValue { depth, string: true, escape: false },
                    },
                    Arg::InValue { depth, string: false, .. } if depth > 0 => match c {
                        '"' => Arg::InValue { depth, string: true, escape: false },
                        '{' | '[' => Arg::InValue { depth: depth + 1, string: false, escape: false },
                        '}' | ']' if depth == 1 => Arg::AfterValue,
                        '}' | ']' => Arg::InValue { depth: depth - 1, string: false, escape: false },
                        _ => Arg::InValue { depth, string: false, escape: false },
                    },
                    // A number or literal runs until a separator.
                    Arg::InValue { .. } => match c {
                        c if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+') => {
                            Arg::InValue { depth: 0, string: false, escape: false }
                        }
                        c if c.is_whitespace() => Arg::AfterValue,
                        ',' | '}' => return self.step(Phase::Args(i, used, Arg::AfterValue), c),
                        _ => return None,
                    },
                    Arg::AfterValue => match c {
                        c if c.is_whitespace() => Arg::AfterValue,
                        // Another key only if one is left.
                        ',' if free || used.len() < params.len() => Arg::KeyOrEnd { first: false },
                        '}' => return Some(Phase::Outside),
                        _ => return None,
                    },
                };
                Phase::Args(i, used, next)
            }
        })
    }

    /// The text the call most likely goes on with, where the guide leaves one way to write it
    /// (spaced as the template writes calls): the rest of the only tool name the name so far
    /// begins, then `", "arguments": {`; the rest of the only unused parameter a key can be,
    /// then `":` (and ` "` for a string); the closing `}` once every parameter is used — each
    /// followed by the next such step. `None` inside values and wherever more than one way is
    /// open. The flag says whether the text closes the arguments object (the call's end
    /// follows).
    ///
    /// A guess, not a constraint: drafted after a reply, it is kept only where the model
    /// writes it ([`super::draft`]), and it spares a pass per token it guessed right.
    ///
    /// `written` is the reply so far: a key after a comma is guessed with the space the
    /// template puts there, unless it was written already.
    pub fn expected(&self, written: &str) -> Option<(String, bool)> {
        let mut phase = self.phase.clone();
        let mut text = String::new();
        if matches!(phase, Phase::Args(_, _, Arg::KeyOrEnd { first: false })) && written.ends_with(',') {
            text.push(' ');
        }
        // A few steps at most: name, arguments' opening, a key, the closing.
        for _ in 0..4 {
            let Some(step) = self.next_step(&phase) else { break };
            phase = self.advance(phase, &step)?;
            text.push_str(&step);
            if phase == Phase::Outside {
                break;
            }
        }
        (!text.trim().is_empty()).then(|| (text, phase == Phase::Outside))
    }

    /// One step of [`ToolCallGuide::expected`] from `phase`.
    fn next_step(&self, phase: &Phase) -> Option<String> {
        match phase {
            Phase::Outside => None,
            Phase::Name(name) => {
                let mut candidates = self.tools.iter().filter(|t| t.name.starts_with(name.as_str()));
                let tool = candidates.next().filter(|_| candidates.next().is_none())?;
                Some(format!("{}\"", &tool.name[name.len()..]))
            }
            Phase::BeforeArgs(_, seen) if seen.is_empty() => Some(", \"arguments\": {".to_owned()),
            Phase::BeforeArgs(..) => None,
            Phase::Args(i, used, arg) => {
                let tool = &self.tools[*i];
                let unused: Vec<&String> = tool.params.iter().filter(|p| !used.contains(p)).collect();
                let key_rest = |prefix: &str| -> Option<String> {
                    let mut fits = unused.iter().filter(|p| p.starts_with(prefix));
                    let key = fits.next().filter(|_| fits.next().is_none())?;
                    let string_only = tool.kinds(key) == Kinds { string: true, ..Kinds::NONE };
                    Some(format!("{}\":{}", &key[prefix.len()..], if string_only { " \"" } else { "" }))
                };
                match arg {
                    Arg::KeyOrEnd { first: true } if tool.params.is_empty() => Some("}".to_owned()),
                    Arg::KeyOrEnd { .. } if tool.params.is_empty() => None,
                    // A key opens even where several may come.
                    Arg::KeyOrEnd { .. } => {
                        Some(key_rest("").map_or_else(|| "\"".to_owned(), |rest| format!("\"{rest}")))
                    }
                    Arg::Key(prefix) if !tool.params.is_empty() => key_rest(prefix),
                    Arg::AfterValue if !tool.params.is_empty() && unused.is_empty() => Some("}".to_owned()),
                    _ => None,
                }
            }
        }
    }

    /// Sets the logits of every token that would break the call's constraint to −∞. `vocab`
    /// holds each token id's text. Leaves the logits alone if nothing would remain.
    pub fn mask(&self, vocab: &[String], logits: &mut [f32]) {
        if !self.active() {
            return;
        }
        if let Phase::Args(_, _, Arg::InValue { string: true, escape: false, .. }) = &self.phase {
            // Inside a string almost every token fits: only a quote or a backslash can end or
            // escape it, so only tokens holding one are simulated, and the rest keep their
            // logits in place (no copy of the vocabulary's logits per token).
            for (t, l) in vocab.iter().zip(logits.iter_mut()) {
                let plain = !t.is_empty() && !t.contains(['"', '\\']);
                if !plain && (t.is_empty() || self.advance(self.phase.clone(), t).is_none()) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return;
        }
        // Most tokens fail on their first character: decide that once per character before
        // simulating (and cloning the phase for) the rest of a token.
        let mut first_ok: std::collections::HashMap<char, bool> = std::collections::HashMap::new();
        let mut fits = |t: &str| {
            let Some(c) = t.chars().next() else { return false };
            *first_ok.entry(c).or_insert_with(|| self.step(self.phase.clone(), c).is_some())
                && self.advance(self.phase.clone(), t).is_some()
        };
        // Few tokens fit at any point: keep theirs, wipe the rest.
        let kept: Vec<(usize, f32)> = vocab
            .iter()
            .zip(logits.iter())
            .enumerate()
            .filter(|(_, (t, _))| fits(t))
            .map(|(i, (_, l))| (i, *l))
            .collect();
        if kept.is_empty() {
            return;
        }
        logits.fill(f32::NEG_INFINITY);
        for (i, l) in kept {
            logits[i] = l;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<GuidedTool> {
        vec![
            GuidedTool::from_schema(
                "calculator",
                &json!({"properties": {"expression": {"type": "string"}, "decimals": {"type": "integer"}}}),
            ),
            GuidedTool::from_schema("note_write", &json!({"properties": {"title": {}, "body": {}}})),
            GuidedTool::from_schema("note_list", &json!({"properties": {}})),
        ]
    }

    /// Decodes under the guide: after `prefix` (which opens the name) and `forced` (text the
    /// model wrote freely), each step lists the tokens the model would pick, likeliest first;
    /// the first one the guide allows is taken. Returns the text after `prefix` and the guide.
    fn decode(prefix: &str, forced: &str, steps: &[&[&str]]) -> (String, ToolCallGuide) {
        let vocab: Vec<String> = steps.iter().flat_map(|s| s.iter().map(|t| (*t).to_owned())).collect();
        let mut guide = ToolCallGuide::new(tools());
        let mut text = prefix.to_owned();
        guide.observe(&text, prefix);
        text.push_str(forced);
        guide.observe(&text, forced);
        for step in steps {
            let mut logits = vec![0.0f32; vocab.len()];
            guide.mask(&vocab, &mut logits);
            let pick = step
                .iter()
                .find(|t| logits[vocab.iter().position(|v| v == *t).unwrap()].is_finite())
                .unwrap_or_else(|| panic!("nothing allowed of {step:?} after {text:?}"));
            text.push_str(pick);
            guide.observe(&text, pick);
        }
        (text[prefix.len()..].to_owned(), guide)
    }

    const OPEN: &str = "<tool_call>\n{\"name\": \"";

    #[test]
    fn an_invented_name_is_steered_to_an_offered_one() {
        let (out, g) = decode(OPEN, "", &[&["calc"], &["ulatorArgs", "ulator"], &["\","]]);
        assert_eq!(out, "calculator\",");
        assert!(matches!(g.phase, Phase::BeforeArgs(0, _)), "{:?}", g.phase);
    }

    #[test]
    fn a_name_nobody_offered_cannot_be_started() {
        let (out, _) = decode(OPEN, "", &[&["hello", "x", "note"], &["_list"], &["\""]]);
        assert_eq!(out, "note_list\"");
    }

    #[test]
    fn arguments_take_only_the_tools_own_keys_once_then_close() {
        // The model would copy schema words, repeat a key and go on; the guide allows only
        // `expression` and `decimals`, each once, and then only the closing brace.
        let steps: &[&[&str]] = &[
            &["\""],
            &["type", "title", "expression"],
            &["\":"],
            &[" \""],
            &["2+3"],
            &["\","],
            &[" \""],
            &["expression", "decimals"],
            &["\":"],
            &[" 2"],
            &[",", "}"],
        ];
        let (out, g) = decode(OPEN, "calculator\", \"arguments\": {", steps);
        assert_eq!(out, "calculator\", \"arguments\": {\"expression\": \"2+3\", \"decimals\": 2}");
        assert_eq!(g.phase, Phase::Outside, "the guide lets go after the arguments");
        let call: Value = serde_json::from_str(&format!("{{\"name\": \"{out}}}")).unwrap();
        assert_eq!(call["arguments"], json!({"expression": "2+3", "decimals": 2}));
    }

    #[test]
    fn a_repeated_key_is_refused() {
        let g = ToolCallGuide::new(tools());
        let phase = Phase::Args(1, vec!["title".into()], Arg::KeyOrEnd { first: false });
        assert!(g.advance(phase.clone(), "\"title\"").is_none());
        assert!(g.advance(phase.clone(), "\"body\"").is_some());
        // Every key used: a comma is refused, the end is allowed.
        let done = Phase::Args(1, vec!["title".into(), "body".into()], Arg::AfterValue);
        assert!(g.advance(done.clone(), ",").is_none());
        assert_eq!(g.advance(done, " }"), Some(Phase::Outside));
    }

    #[test]
    fn a_value_must_be_of_the_kind_its_schema_names() {
        let tool = GuidedTool::from_schema(
            "note_list",
            &json!({"properties": {"contains": {"type": ["string", "null"]}, "n": {"type": "integer"}}}),
        );
        let g = ToolCallGuide::new(vec![tool]);
        let start = Phase::Args(0, Vec::new(), Arg::KeyOrEnd { first: true });
        assert!(g.advance(start.clone(), r#""contains": {"description""#).is_none(), "a copied schema");
        assert!(g.advance(start.clone(), r#""contains": "docker""#).is_some());
        assert!(g.advance(start.clone(), r#""contains": null"#).is_some());
        assert!(g.advance(start.clone(), r#""n": "5""#).is_none());
        assert!(g.advance(start, r#""n": 5}"#).is_some());
    }

    #[test]
    fn values_are_free_json() {
        let g = ToolCallGuide::new(tools());
        let start = Phase::Args(0, Vec::new(), Arg::KeyOrEnd { first: true });
        let after = g.advance(start, r#""expression": "a \"quoted\" {x}", "decimals": 3}"#);
        assert_eq!(after, Some(Phase::Outside));
        let free = Phase::Args(2, Vec::new(), Arg::KeyOrEnd { first: true });
        // A tool without declared parameters takes any keys (its own validation decides).
        assert_eq!(g.advance(free, r#""contains": [1, {"a": "]"}], "x": -2.5e3}"#), Some(Phase::Outside));
    }

    #[test]
    fn only_call_openings_activate_it() {
        for prefix in ["<tool_call>\n{\"name\": \"", "{\"name\":\"", "```json\n{ \"name\" : \"", "  {\"name\": \""] {
            let mut guide = ToolCallGuide::new(tools());
            guide.observe(prefix, prefix);
            assert!(guide.active(), "{prefix:?}");
        }
        for prefix in [
            "Here is JSON: {\"name\": \"",
            "<tool_call>{\"name\": \"calculator\"}</tool_call> then {\"name\": \"",
            "{\"title\": \"",
            "\"name\": \"",
        ] {
            let mut guide = ToolCallGuide::new(tools());
            guide.observe(prefix, prefix);
            assert!(!guide.active(), "{prefix:?}");
        }
        let mut none = ToolCallGuide::new(Vec::new());
        none.observe("<tool_call>{\"name\": \"", "\"");
        assert!(!none.active(), "no tools offered: never constrains");
    }

    #[test]
    fn inside_a_string_value_only_tokens_that_end_or_escape_it_are_checked() {
        let mut g = ToolCallGuide::new(tools());
        let (open, rest) = ("<tool_call>{\"name\": \"", "calculator\", \"arguments\": {\"expression\": \"0.6");
        g.observe(open, open);
        g.observe(&format!("{open}{rest}"), rest);
        assert!(matches!(g.phase, Phase::Args(0, _, Arg::InValue { string: true, .. })), "{:?}", g.phase);
        let vocab: Vec<String> = [" * 8", "\\n", "\"}", "\", \"decimals\": 2}", "\"x", ""].map(str::to_owned).to_vec();
        let mut logits = vec![1.0; vocab.len()];
        g.mask(&vocab, &mut logits);
        let allowed: Vec<&str> =
            vocab.iter().zip(&logits).filter(|(_, l)| l.is_finite()).map(|(t, _)| t.as_str()).collect();
        // Text and escapes stay; a quote must be followed by what may follow a value (`"x`
        // may not); an empty token is never part of a call.
        assert_eq!(allowed, [" * 8", "\\n", "\"}", "\", \"decimals\": 2}"]);
    }

    #[test]
    fn the_expected_text_is_what_only_one_tool_or_parameter_fits() {
        let mut g = ToolCallGuide::new(tools());
        let at = |g: &mut ToolCallGuide, text: &str| {
            *g = ToolCallGuide::new(tools());
            g.observe(OPEN, OPEN);
            let full = format!("{OPEN}{text}");
            g.observe(&full, text);
            g.expected(&full)
        };
        // Two tools start with "note": no guess until the name tells them apart.
        assert_eq!(at(&mut g, "note"), None);
        assert_eq!(at(&mut g, "note_l"), Some(("ist\", \"arguments\": {}".to_owned(), true)));
        assert_eq!(at(&mut g, "calc"), Some(("ulator\", \"arguments\": {\"".to_owned(), false)));
        assert_eq!(at(&mut g, "calculator\""), Some((", \"arguments\": {\"".to_owned(), false)));
        // A key only one unused parameter begins; a string parameter's value opens with it.
        let args = "calculator\", \"arguments\": {\"";
        assert_eq!(at(&mut g, args), None, "two parameters left, either may come first");
        assert_eq!(at(&mut g, &format!("{args}ex")), Some(("pression\": \"".to_owned(), false)));
        assert_eq!(at(&mut g, &format!("{args}dec")), Some(("imals\":".to_owned(), false)));
        // Inside a value the model is free: no guess.
        assert_eq!(at(&mut g, &format!("{args}expression\": \"2")), None);
        // One parameter left after a value: its key.
        let one_left = format!("{args}expression\": \"2\", ");
        assert_eq!(at(&mut g, &one_left), Some(("\"decimals\":".to_owned(), false)));
        // Right after the comma, with the space the template writes there.
        assert_eq!(at(&mut g, one_left.trim_end()), Some((" \"decimals\":".to_owned(), false)));
        // After a value with every parameter used: the arguments close; with one left, either
        // may come.
        assert_eq!(at(&mut g, &format!("{one_left}\"decimals\": 2 ")), Some(("}".to_owned(), true)));
        assert_eq!(at(&mut g, &format!("{args}expression\": \"2\"")), None);
        // Every guess is text the guide itself allows from where it was made.
        for text in ["note_l", "calc", &format!("{args}ex"), &one_left, one_left.trim_end()] {
            let (guess, closes) = at(&mut g, text).unwrap();
            assert_eq!(g.advance(g.phase.clone(), &guess) == Some(Phase::Outside), closes, "{text:?} + {guess:?}");
            assert!(g.advance(g.phase.clone(), &guess).is_some(), "{text:?} + {guess:?}");
        }
        // Outside a call: nothing.
        assert_eq!(ToolCallGuide::new(tools()).expected(""), None);
    }

    #[test]
    fn masking_keeps_logits_when_nothing_fits() {
        let mut g = ToolCallGuide::new(tools());
        g.observe("<tool_call>{\"name\": \"", "\"");
        let vocab = vec!["zz".to_owned(), "yy".to_owned()];
        let mut logits = vec![1.0, 2.0];
        g.mask(&vocab, &mut logits);
        assert_eq!(logits, [1.0, 2.0]);
    }
}
