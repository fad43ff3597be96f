//! `generate_test`: review questions on a topic, written by the model.
//!
//! The course tutor's contract: `topic`, `num_questions` (1–10), `difficulty` (easy, medium,
//! hard), `context`, `asignatura` (injected); the defaults are the professor's preferences for
//! the subject (`GET {backend}/users/subject/{asignatura}/preferences`, 5 s), else 5 and
//! medium; the result is `[{"question": {"question_text", "difficulty"}, "options": []}]`; and
//! whatever fails, the answer is the one fallback question `¿Qué has aprendido sobre {topic}?`,
//! never an error.
//!
//! Beyond the contract: the model is asked for JSON matching a schema (providers that enforce
//! schemas do), its answer is checked, repeated questions are dropped and the missing ones
//! asked for once more, so the student gets the number asked for; questions are written in the
//! language of the topic; without `context`, the questions are grounded in the subject's
//! documents (a search of the knowledge base for the topic).

use super::search::CourseSearch;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgraph_llm::{ChatModel, ChatRequest, Message, ResponseFormat};
use toolgraph_rag::{KbStore, Retriever};
use toolgraph_tools::{Tool, ToolBuilder};

/// How long the professor's preferences may take.
const PREFERENCES_TIMEOUT: Duration = Duration::from_secs(5);

/// The whole call's limit (a local model writes ten questions in about a minute).
const TOOL_TIMEOUT: Duration = Duration::from_secs(180);

/// The model's share of it: past this the fallback answers, before the tool's limit.
const MODEL_BUDGET: Duration = Duration::from_secs(150);

/// A question's difficulty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Difficulty {
    /// Recall of facts.
    Easy,
    /// Understanding.
    Medium,
    /// Applying and combining.
    Hard,
}

impl Difficulty {
    fn as_str(self) -> &'static str {
        match self {
            Self::Easy => "easy",
            Self::Medium => "medium",
            Self::Hard => "hard",
        }
    }
}

/// Arguments of `generate_test`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TestGenerationInput {
    /// The topic of the questions, in the student's language.
    #[schemars(length(min = 1, max = 300))]
    pub topic: String,
    /// How many questions (1-10). Default: the professor's preference, else 5.
    #[serde(default)]
    #[schemars(range(min = 1, max = 10))]
    pub num_questions: Option<u8>,
    /// Default: the professor's preference, else medium.
    #[serde(default)]
    pub difficulty: Option<Difficulty>,
    /// Material to base the questions on (e.g. passages found by rag_search).
    #[serde(default)]
    #[schemars(length(max = 8000))]
    pub context: Option<String>,
    /// Subject identifier (from the conversation).
    #[serde(default)]
    pub asignatura: Option<String>,
}

/// Where the knowledge base is, to ground questions asked without `context`.
#[derive(Clone)]
pub struct Grounding {
    /// The knowledge bases.
    pub store: Arc<KbStore>,
    /// How to search them.
    pub retriever: Retriever,
    /// The knowledge base searched.
    pub kb: String,
}

/// What `generate_test` needs.
#[derive(Clone)]
pub struct TestGenerator {
    /// The model that writes the questions; `None`: every call answers the fallback.
    pub model: Option<Arc<dyn ChatModel>>,
    /// The backend that keeps the professors' preferences (`{url}/users/subject/{s}/preferences`).
    pub backend_url: Option<String>,
    /// The knowledge base to ground questions in.
    pub grounding: Option<Grounding>,
    /// The tenant when the turn names none.
    pub default_tenant: String,
    http: reqwest::Client,
}

/// The professor's defaults for a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preferences {
    /// Questions per test.
    pub questions: u8,
    /// Their difficulty.
    pub difficulty: Difficulty,
}

impl Default for Preferences {
    fn default() -> Self {
        Self { questions: 5, difficulty: Difficulty::Medium }
    }
}

/// One review question, in the course tutor's shape.
fn question(text: &str, difficulty: Difficulty) -> Value {
    json!({"question": {"question_text": text, "difficulty": difficulty.as_str()}, "options": []})
}

/// The answer when anything fails.
pub fn fallback(topic: &str) -> Value {
    Value::Array(vec![question(&format!("¿Qué has aprendido sobre {topic}?"), Difficulty::Medium)])
}

impl TestGenerator {
    /// A generator on `model` (none: the fallback), with the professors' preferences at
    /// `backend_url` when given.
    pub fn new(model: Option<Arc<dyn ChatModel>>, backend_url: Option<String>, default_tenant: String) -> Self {
        let http = reqwest::Client::builder().timeout(PREFERENCES_TIMEOUT).build().unwrap_or_default();
        Self { model, backend_url, grounding: None, default_tenant, http }
    }

    /// Grounds questions asked without context in `grounding`'s knowledge base.
    #[must_use]
    pub fn grounded_in(mut self, grounding: Grounding) -> Self {
        self.grounding = Some(grounding);
        self
    }

    /// The professor's preferences for `subject`, else the defaults (on any failure, logged).
    pub async fn preferences(&self, subject: Option<&str>) -> Preferences {
        let (Some(base), Some(subject)) = (&self.backend_url, subject) else { return Preferences::default() };
        // The subject is one path segment, percent-encoded as such (`a b` → `a%20b`, `a/b` → `a%2Fb`).
        let url = match url::Url::parse(base) {
            Ok(mut url) if !url.cannot_be_a_base() => {
                if let Ok(mut path) = url.path_segments_mut() {
                    path.pop_if_empty().extend(["users", "subject", subject, "preferences"]);
                }
                url.to_string()
            }
            _ => {
                tracing::warn!(%base, "the backend URL is not a base URL; using the default test preferences");
                return Preferences::default();
            }
        };
        let answer = async {
            let resp = self.http.get(&url).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("answered {}", resp.status()));
            }
            resp.json::<Value>().await.map_err(|e| e.to_string())
        };
        match answer.await {
            Ok(body) => {
                let defaults = Preferences::default();
                let questions = body["default_test_questions"]
                    .as_u64()
                    .filter(|n| (1..=10).contains(n))
                    .map_or(defaults.questions, |n| n as u8);
                let difficulty =
                    serde_json::from_value(body["default_test_difficulty"].clone()).unwrap_or(defaults.difficulty);
                Preferences { questions, difficulty }
            }
            Err(e) => {
                tracing::warn!(%url, error = %e, "the professor's test preferences are unavailable; using the defaults");
                Preferences::default()
            }
        }
    }

    /// Passages of `tenant`'s knowledge base (`kb`, else the configured one) about `topic` (in
    /// `subject`), to ground the questions.
    async fn ground(&self, tenant: &str, kb: Option<&str>, topic: &str, subject: Option<&str>) -> Option<String> {
        let g = self.grounding.clone()?;
        let request = CourseSearch {
            query: topic.to_owned(),
            asignatura: subject.map(str::to_owned),
            top_k: Some(4),
            ..CourseSearch::default()
        };
        let (tenant, kb) = (tenant.to_owned(), kb.map_or_else(|| g.kb.clone(), str::to_owned));
        let found = tokio::task::spawn_blocking(move || request.run(&g.store, &g.retriever, &tenant, &kb)).await;
        let results = found.ok()?.ok()?;
        let passages: Vec<&str> = results["results"].as_array()?.iter().filter_map(|r| r["content"].as_str()).collect();
        (!passages.is_empty()).then(|| passages.join("\n\n"))
    }

    /// The questions for `args` (the fallback when anything fails), grounded in `tenant`'s
    /// knowledge base `kb` (else the configured one) when the call brings no context.
    pub async fn generate(&self, tenant: &str, kb: Option<&str>, args: TestGenerationInput) -> Value {
        let topic = args.topic.trim().to_owned();
        let subject = args.asignatura.as_deref().map(str::trim).filter(|s| !s.is_empty());
        let prefs = if args.num_questions.is_none() || args.difficulty.is_none() {
            self.preferences(subject).await
        } else {
            Preferences::default()
        };
        let wanted = usize::from(args.num_questions.unwrap_or(prefs.questions).clamp(1, 10));
        let difficulty = args.difficulty.unwrap_or(prefs.difficulty);
        let Some(model) = &self.model else {
            tracing::warn!("generate_test has no model configured; answering the fallback question");
            return fallback(&topic);
        };
        let context = match args.context.filter(|c| !c.trim().is_empty()) {
            Some(c) => Some(c),
            None => self.ground(tenant, kb, &topic, subject).await,
        };
        let started = Instant::now();
        let mut questions: Vec<String> = Vec::new();
        // A second round asks only for the questions still missing.
        for _ in 0..2 {
            let missing = wanted - questions.len();
            let left = MODEL_BUDGET.saturating_sub(started.elapsed());
            let request = prompt(&topic, missing, difficulty, context.as_deref(), &questions);
            match tokio::time::timeout(left, model.complete(request)).await {
                Ok(Ok(reply)) => {
                    toolgraph_llm::usage::report(model.model_id(), reply.usage);
                    match parse(&reply.content) {
                        Some(found) => add_distinct(&mut questions, found, wanted),
                        None => {
                            tracing::warn!(reply = %reply.content, "generate_test: the model's answer is not the asked JSON")
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "generate_test: the model failed");
                    break;
                }
                Err(_) => {
                    tracing::warn!("generate_test: the model did not answer in time");
                    break;
                }
            }
            if questions.len() == wanted {
                break;
            }
        }
        if questions.is_empty() {
            return fallback(&topic);
        }
        if questions.len() < wanted {
            tracing::warn!(wanted, got = questions.len(), "generate_test: fewer distinct questions than asked");
        }
        Value::Array(questions.iter().map(|q| question(q, difficulty)).collect())
    }
}

/// The request for `count` questions (not repeating `existing`).
fn prompt(
    topic: &str,
    count: usize,
    difficulty: Difficulty,
    context: Option<&str>,
    existing: &[String],
) -> ChatRequest {
    let mut ask = format!(
        "Write exactly {count} distinct review questions about: {topic}\nDifficulty: {}\n\
         Write the questions in the same language as the topic. Each question asks one thing and ends with \
         a question mark.",
        difficulty.as_str()
    );
    if let Some(context) = context {
        ask.push_str(&format!("\nBase every question on this material, and only on it:\n---\n{context}\n---"));
    }
    if !existing.is_empty() {
        ask.push_str(&format!("\nDo not repeat these questions:\n- {}", existing.join("\n- ")));
    }
    ask.push_str(&format!(
        "\nAnswer with JSON only: {{\"questions\": [{{\"question_text\": \"…?\", \"difficulty\": \"{}\"}}]}}",
        difficulty.as_str()
    ));
    let schema = json!({
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "minItems": count,
                "maxItems": count,
                "items": {
                    "type": "object",
                    "properties": {
                        "question_text": {"type": "string", "minLength": 5},
                        "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]}
                    },
                    "required": ["question_text", "difficulty"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["questions"],
        "additionalProperties": false
    });
    let mut request = ChatRequest::new(vec![
        Message::system(
            "You write review questions that help a student check what they have learned. You answer with JSON only.",
        ),
        Message::user(ask),
    ]);
    request.response_format =
        Some(ResponseFormat::JsonSchema { name: "review_questions".into(), schema, strict: false });
    request.temperature = Some(0.4);
    request.max_tokens = Some(120 * count as u32 + 200);
    request
}

/// The question texts of a model's answer: `{"questions": [...]}` or a bare list, each item an
/// object with `question_text` (or `question`) or a string; inside a code fence or not.
fn parse(reply: &str) -> Option<Vec<String>> {
    let start = reply.find(['{', '['])?;
    let end = reply.rfind(['}', ']'])?;
    let value: Value = serde_json::from_str(reply.get(start..=end)?).ok()?;
    let items = match &value {
        Value::Array(items) => items,
        Value::Object(m) => m.get("questions")?.as_array()?,
        _ => return None,
    };
    let texts: Vec<String> = items
        .iter()
        .filter_map(|item| match item {
            Value::String(s) => Some(s.as_str()),
            Value::Object(m) => m.get("question_text").or_else(|| m.get("question")).and_then(Value::as_str),
            _ => None,
        })
        .map(|s| s.trim().to_owned())
        .filter(|s| s.chars().count() >= 5)
        .collect();
    (!texts.is_empty()).then_some(texts)
}

/// Adds the questions of `found` not already in `questions` (ignoring case, spacing and final
/// punctuation), up to `wanted`.
fn add_distinct(questions: &mut Vec<String>, found: Vec<String>, wanted: usize) {
    let key = |q: &str| {
        q.to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .trim_matches(|c: char| c.is_ascii_punctuation() || c == '¿' || c == '¡')
            .to_owned()
    };
    for q in found {
        if questions.len() == wanted {
            break;
        }
        if !questions.iter().any(|have| key(have) == key(&q)) {
            questions.push(q);
        }
    }
}

/// The `generate_test` read tool.
pub fn generate_test_tool(generator: TestGenerator) -> Arc<dyn Tool> {
    let generator = Arc::new(generator);
    ToolBuilder::<TestGenerationInput>::new(
        "generate_test",
        "Write practice questions (a quiz) on a topic, for the student to test themselves, when they ask for \
         questions. Not for questions about the subject itself, such as how it is assessed (get_guia). Pass \
         passages found by rag_search as context when you have them.",
    )
    .inject("asignatura")
    .display_name("Review questions")
    .timeout(TOOL_TIMEOUT)
    .handler(move |ctx, args: TestGenerationInput| {
        let generator = Arc::clone(&generator);
        let tenant = ctx.get_str("tenant").unwrap_or(&generator.default_tenant).to_owned();
        // The agent's own knowledge base, when it has one (`AgentSpec::tool_context`).
        let kb = ctx.get_str("kb").map(str::to_owned);
        async move { Ok(generator.generate(&tenant, kb.as_deref(), args).await) }
    })
    // The builder's only failure is a schema or name error, fixed at compile time here.
    .expect("generate_test's schema is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The subject is one path segment, percent-encoded, under the backend URL's own path.
    #[tokio::test]
    async fn preferences_are_asked_for_the_subject_as_one_path_segment() {
        use axum::{Json, Router, http::Uri, routing::get};
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let app = Router::new().fallback(get(move |uri: Uri| {
            let record = Arc::clone(&record);
            async move {
                record.lock().unwrap().push(uri.path().to_owned());
                Json(json!({"default_test_questions": 3, "default_test_difficulty": "hard"}))
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/api/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let generator = TestGenerator::new(None, Some(base), "t".into());
        let prefs = generator.preferences(Some("física 1/b")).await;
        assert_eq!(prefs, Preferences { questions: 3, difficulty: Difficulty::Hard });
        assert_eq!(*seen.lock().unwrap(), ["/api/users/subject/f%C3%ADsica%201%2Fb/preferences"]);
    }

    #[test]
    fn answers_are_read_leniently_and_repeats_dropped() {
        let fenced = "```json\n{\"questions\": [{\"question_text\": \"¿Qué es Docker?\", \"difficulty\": \"easy\"}, \
                      {\"question\": \"¿Qué es un volumen?\"}]}\n```";
        assert_eq!(parse(fenced).unwrap(), ["¿Qué es Docker?", "¿Qué es un volumen?"]);
        assert_eq!(parse("[\"What is CI?\", 3]").unwrap(), ["What is CI?"]);
        assert_eq!(parse("I cannot do that"), None);
        assert_eq!(parse("{\"questions\": []}"), None);
        let mut have = vec!["¿Qué es Docker?".to_string()];
        add_distinct(&mut have, vec!["qué es  docker".into(), "¿Qué es un volumen?".into(), "¿Y una red?".into()], 2);
        assert_eq!(have, ["¿Qué es Docker?", "¿Qué es un volumen?"]);
    }

    #[test]
    fn the_fallback_is_the_tutors() {
        assert_eq!(
            fallback("Docker"),
            json!([{"question": {"question_text": "¿Qué has aprendido sobre Docker?", "difficulty": "medium"}, "options": []}])
        );
    }
}
