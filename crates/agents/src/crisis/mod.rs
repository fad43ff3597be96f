//! The crisis companion (docs/crisis.md): a conversation agent with a safety gate before every
//! reply ([`graph`]) and one tool, `find_local_crisis_resources`, which a node calls when the
//! gate sees risk — never the model.
//!
//! The tool chains two deterministic model calls: the chat model extracts where the user is
//! from the conversation (`inferred_location`: "Singapore", "UK", or ""), then a provider with
//! native web-search grounding ([`search`]) looks for crisis lines there; at most five
//! `{name, phone, url, region}` are parsed from its answer (`found_resources`). It never fails:
//! whatever goes wrong (no grounding support, a timeout, an answer that parses to nothing)
//! logs a warning and the offline [`directory`] answers instead.

pub mod directory;
pub mod graph;
pub mod search;

use directory::Directory;
use schemars::JsonSchema;
use search::WebSearch;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use toolgraph_config::CrisisToolSettings;
use toolgraph_llm::{ChatModel, ChatRequest, Message, ResponseFormat};
use toolgraph_tools::{Tool, ToolBuilder};

/// The tool's name.
pub const TOOL_NAME: &str = "find_local_crisis_resources";

/// Most resources a search returns.
pub const MAX_RESOURCES: usize = 5;

/// How long the location extraction may take.
const LOCATION_TIMEOUT: Duration = Duration::from_secs(30);

/// A crisis line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Resource {
    /// The service.
    pub name: String,
    /// Its number ("" when it has none).
    pub phone: String,
    /// Its web address ("").
    pub url: String,
    /// Where it serves.
    pub region: String,
}

/// What the tool found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Found {
    /// Where the user seems to be ("" when the conversation does not say).
    pub inferred_location: String,
    /// At most five lines.
    pub found_resources: Vec<Resource>,
    /// `web_search` or `directory`.
    pub source: String,
    /// Why the web search did not answer, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// The resources as lines of text, `- name — phone — url (region)`: what a reply gives.
    #[serde(default)]
    pub lines: String,
    /// Each resource's number, or its address when it has none: a reply that holds one of them
    /// gives a line.
    #[serde(default)]
    pub contacts: Vec<String>,
}

impl Found {
    /// What was found, with its [`Found::lines`] and [`Found::contacts`].
    pub fn new(
        inferred_location: String,
        found_resources: Vec<Resource>,
        source: &str,
        warning: Option<String>,
    ) -> Self {
        let lines = found_resources
            .iter()
            .map(|r| {
                let mut line = format!("- {}", r.name);
                for part in [&r.phone, &r.url] {
                    if !part.is_empty() {
                        line.push_str(&format!(" — {part}"));
                    }
                }
                if !r.region.is_empty() {
                    line.push_str(&format!(" ({})", r.region));
                }
                line
            })
            .collect::<Vec<_>>()
            .join("\n");
        let contacts = found_resources
            .iter()
            .map(|r| if r.phone.is_empty() { r.url.clone() } else { r.phone.clone() })
            .filter(|c| !c.is_empty())
            .collect();
        Self { inferred_location, found_resources, source: source.to_owned(), warning, lines, contacts }
    }
}

/// The resource finder behind the tool.
pub struct ResourceFinder {
    /// The chat model that reads the location; `None`: no location.
    pub model: Option<Arc<dyn ChatModel>>,
    /// The grounded search; `None`: the directory only.
    pub search: Option<WebSearch>,
    /// The offline directory.
    pub directory: Directory,
}

impl ResourceFinder {
    /// The finder `settings` describe, reading locations with `model`.
    ///
    /// # Errors
    /// A directory file that cannot be used.
    pub fn from_settings(
        settings: &CrisisToolSettings,
        model: Option<Arc<dyn ChatModel>>,
    ) -> Result<Self, directory::DirectoryError> {
        let directory = match &settings.directory {
            Some(path) => Directory::load(path)?,
            None => Directory::shipped(),
        };
        let search = WebSearch::new(
            settings.search_provider,
            settings.search_base_url.as_deref(),
            settings.search_model.as_deref(),
            settings.search_api_key.as_ref().map(|k| k.expose()),
            Duration::from_millis(settings.search_timeout_ms),
        );
        Ok(Self { model, search, directory })
    }

    /// Crisis lines for the user of `conversation` (the user's recent words); never fails.
    pub async fn find(&self, conversation: &str) -> Found {
        let location = self.location(conversation).await;
        let mut warning = None;
        if let Some(search) = &self.search {
            match search.search(&search_prompt(&location)).await {
                Ok(grounded) => {
                    let found = parse_resources(&grounded.text, &location);
                    if !found.is_empty() {
                        return Found::new(location, found, "web_search", None);
                    }
                    warning = Some("the web search answer listed no resource".to_owned());
                }
                Err(e) => warning = Some(e),
            }
            tracing::warn!(
                warning = warning.as_deref().unwrap_or_default(),
                "crisis resource search failed; using the offline directory"
            );
        }
        let found = self.directory.lookup(&location, MAX_RESOURCES);
        Found::new(location, found, "directory", warning)
    }

    /// Where the user is, as the conversation says ("" when it does not, or on any failure).
    pub async fn location(&self, conversation: &str) -> String {
        let Some(model) = &self.model else { return String::new() };
        let schema = json!({
            "type": "object",
            "properties": {"location": {"type": "string", "maxLength": 80}},
            "required": ["location"],
            "additionalProperties": false
        });
        let mut request = ChatRequest::new(vec![
            Message::system(
                "Extract where the user lives or is now (a country, or a city with its country) from their \
                 messages. Answer with JSON only: {\"location\": \"Singapore\"}. Use English names (\"UK\", \
                 \"Spain\", \"Viet Nam\"). If the messages do not say, answer {\"location\": \"\"}. Never guess.",
            ),
            Message::user(conversation.to_owned()),
        ]);
        request.response_format = Some(ResponseFormat::JsonSchema { name: "location".into(), schema, strict: true });
        request.temperature = Some(0.0);
        request.max_tokens = Some(40);
        match tokio::time::timeout(LOCATION_TIMEOUT, model.complete(request)).await {
            Ok(Ok(reply)) => {
                toolgraph_llm::usage::report(model.model_id(), reply.usage);
                parse_location(&reply.content)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "crisis location extraction failed");
                String::new()
            }
            Err(_) => {
                tracing::warn!("crisis location extraction timed out");
                String::new()
            }
        }
    }
}

/// The location of a `{"location": …}` answer (inside a code fence or not); "" otherwise.
fn parse_location(reply: &str) -> String {
    let (Some(start), Some(end)) = (reply.find('{'), reply.rfind('}')) else { return String::new() };
    let value: Value = reply.get(start..=end).and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    let location = value["location"].as_str().unwrap_or_default().trim();
    // A model that cannot tell sometimes says so in words.
    match location.to_lowercase().as_str() {
        "unknown" | "none" | "n/a" | "not specified" => String::new(),
        _ => location.chars().take(80).collect(),
    }
}

/// The grounded search's request: one line per resource, pipe-separated.
fn search_prompt(location: &str) -> String {
    let place = if location.is_empty() {
        "internationally (the user's country is unknown)".to_owned()
    } else {
        format!("in {location}")
    };
    format!(
        "Find up to {MAX_RESOURCES} currently operating crisis or suicide-prevention hotlines {place}, from official \
         or well-known sources. Answer with one line per hotline and nothing else, in this form:\n\
         name | phone number | website | region"
    )
}

/// Resources in a search answer: pipe-separated lines (`name | phone | url | region`) or
/// markdown lines with a bold name (`**Name**: 1767 (https://…)`), at most [`MAX_RESOURCES`],
/// without repeats; `region` defaults to `location`.
pub fn parse_resources(text: &str, location: &str) -> Vec<Resource> {
    let mut out: Vec<Resource> = Vec::new();
    for line in text.lines() {
        let mut line = line.trim();
        for bullet in ["- ", "* ", "• "] {
            line = line.strip_prefix(bullet).unwrap_or(line).trim_start();
        }
        let line = line.trim_start_matches(|c: char| c.is_ascii_digit()).trim_start_matches(['.', ')', ' ']);
        let resource = if line.contains('|') { pipe_line(line, location) } else { bold_line(line, location) };
        let Some(r) = resource else { continue };
        if r.phone.is_empty() && r.url.is_empty() {
            continue;
        }
        if !out.iter().any(|o| o.name.eq_ignore_ascii_case(&r.name) || (!r.phone.is_empty() && o.phone == r.phone)) {
            out.push(r);
        }
        if out.len() == MAX_RESOURCES {
            break;
        }
    }
    out
}

fn clean(s: &str) -> String {
    s.trim().trim_matches(['*', '_', '`', '[', ']']).trim().to_owned()
}

fn pipe_line(line: &str, location: &str) -> Option<Resource> {
    let fields: Vec<String> = line.trim_matches('|').split('|').map(clean).collect();
    if fields.len() < 2
        || fields[0].is_empty()
        || fields[0].eq_ignore_ascii_case("name")
        || fields[0].starts_with("---")
    {
        return None;
    }
    let field = |i: usize| fields.get(i).cloned().unwrap_or_default();
    let phone = phone_in(&field(1)).unwrap_or_default();
    let url = url_in(&field(2)).or_else(|| url_in(line)).unwrap_or_default();
    let region = Some(field(3)).filter(|r| !r.is_empty()).unwrap_or_else(|| location.to_owned());
    Some(Resource { name: field(0), phone, url, region })
}

fn bold_line(line: &str, location: &str) -> Option<Resource> {
    let rest = line.strip_prefix("**")?;
    let end = rest.find("**")?;
    let name = clean(&rest[..end]);
    let tail = &rest[end + 2..];
    if name.is_empty() {
        return None;
    }
    Some(Resource {
        name,
        phone: phone_in(tail).unwrap_or_default(),
        url: url_in(tail).unwrap_or_default(),
        region: location.to_owned(),
    })
}

/// The first run of digits, spaces, `+`, `-` and parentheses holding at least three digits.
fn phone_in(text: &str) -> Option<String> {
    let text = match text.find("http") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut best = String::new();
    let mut current = String::new();
    for c in text.chars().chain(std::iter::once('\u{0}')) {
        if c.is_ascii_digit()
            || (matches!(c, '+' | '-' | ' ' | '(' | ')') && !current.is_empty())
            || (c == '+' && current.is_empty())
        {
            current.push(c);
            continue;
        }
        let candidate = current.trim().trim_end_matches(['-', '(']).trim().to_owned();
        if candidate.chars().filter(char::is_ascii_digit).count() >= 3 {
            best = candidate;
            break;
        }
        current.clear();
    }
    (!best.is_empty()).then_some(best)
}

/// The first http(s) address, without trailing punctuation.
fn url_in(text: &str) -> Option<String> {
    let start = text.find("https://").or_else(|| text.find("http://"))?;
    let url: String =
        text[start..].chars().take_while(|c| !c.is_whitespace() && !matches!(c, ')' | ']' | '>' | '"' | '|')).collect();
    Some(url.trim_end_matches(['.', ',', ';']).to_owned())
}

/// Arguments of `find_local_crisis_resources`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FindResourcesInput {
    /// The user's recent messages, oldest first.
    #[schemars(length(max = 8000))]
    pub conversation: String,
}

/// `find_local_crisis_resources` over `finder`: `{inferred_location, found_resources, source,
/// warning?}`, never an error.
pub fn find_local_crisis_resources_tool(finder: Arc<ResourceFinder>) -> Arc<dyn Tool> {
    ToolBuilder::<FindResourcesInput>::new(
        TOOL_NAME,
        "Find crisis hotlines near the user: reads where the user is from the conversation, searches the web \
         for local lines, falls back to an offline directory. Returns {inferred_location, found_resources: \
         [{name, phone, url, region}], source}.",
    )
    .display_name("Crisis resources")
    // Location (30 s) plus the search's own limit, with room; the finder never outlives it.
    .timeout(Duration::from_secs(120))
    .handler(move |_ctx, args: FindResourcesInput| {
        let finder = Arc::clone(&finder);
        async move { Ok(finder.find(&args.conversation).await) }
    })
    .expect("find_local_crisis_resources's schema is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_and_bold_lines_become_resources() {
        let text = "name | phone | website | region\n---|---|---|---\n\
                    Samaritans of Singapore | 1767 | https://www.sos.org.sg | Singapore\n\
                    - **IMH Mental Health Helpline**: 6389 2222 (https://www.imh.com.sg).\n\
                    Some closing words without a number.\n\
                    Samaritans of Singapore | 1767 | https://www.sos.org.sg | Singapore";
        let found = parse_resources(text, "Singapore");
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0],
            Resource {
                name: "Samaritans of Singapore".into(),
                phone: "1767".into(),
                url: "https://www.sos.org.sg".into(),
                region: "Singapore".into(),
            }
        );
        assert_eq!(found[1].name, "IMH Mental Health Helpline");
        assert_eq!(found[1].phone, "6389 2222");
        assert_eq!(found[1].url, "https://www.imh.com.sg");
    }

    #[test]
    fn at_most_five_are_kept() {
        let text: String = (0..8).map(|i| format!("Line {i} | 100{i} | | X\n")).collect();
        assert_eq!(parse_resources(&text, "").len(), MAX_RESOURCES);
    }

    #[test]
    fn phones_keep_their_international_form() {
        assert_eq!(phone_in("call +44 (0)116 123 now").as_deref(), Some("+44 (0)116 123"));
        assert_eq!(phone_in("24/7"), None);
    }

    #[test]
    fn locations_are_read_leniently() {
        assert_eq!(parse_location("```json\n{\"location\": \"UK\"}\n```"), "UK");
        assert_eq!(parse_location("{\"location\": \"unknown\"}"), "");
        assert_eq!(parse_location("I cannot tell"), "");
    }
}
