//! `[tools]`: settings of the built-in tools that need any.

use crate::{Check, ConfigError, Secret, is_http_url};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[tools]`: settings of built-in tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSettings {
    /// SQLite database (a path, or `sqlite::memory:`) that the read-only `general_query`
    /// tool queries; unset: the tool is not offered. Env: `TOOLGRAPH_TOOLS_SQL_DATABASE`.
    pub sql_database: Option<String>,
    /// The course tutor's `get_guia` (the teaching guides `toolgraph guides import` stores) and
    /// `generate_test`; absent: not offered. `[tools.course]` alone turns them on.
    pub course: Option<CourseToolSettings>,
    /// The legal Q&A tools `retrieve_laws`, `generate_answer` and `format_citation`
    /// (docs/legal.md); absent: not offered. `[tools.legal]` alone turns them on.
    pub legal: Option<LegalToolSettings>,
    /// The crisis companion's `find_local_crisis_resources` (docs/crisis.md); absent: not
    /// offered. `[tools.crisis]` alone turns it on with the offline hotline directory only.
    pub crisis: Option<CrisisToolSettings>,
}

/// `[tools.legal]`: the legal Q&A tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LegalToolSettings {
    /// The knowledge base of laws `retrieve_laws` searches (an agent's own `kb` wins).
    /// Default: `luat`.
    pub kb: String,
    /// Each chunk's `url` when the knowledge base's metadata has none: a template over
    /// `{law}`, `{article}` and `{doc_id}` (percent-encoded), e.g.
    /// `https://laws.example/search?q={law}&article={article}`. Default: none (an empty `url`).
    pub url: Option<String>,
    /// How many of the chunks they are given, best-ranked first, `generate_answer` answers
    /// from and `format_citation` cites among (1–20). Default: 2 — with the local 1.5B model,
    /// a third article read was the gold one for 1 question in 100 and the source of most
    /// answers quoted from an article that is not (docs/benchmarks.md).
    pub answer_articles: usize,
}

/// The most articles an answer reads (`tools.legal.answer_articles`).
pub const MAX_ANSWER_ARTICLES: usize = 20;

impl Default for LegalToolSettings {
    fn default() -> Self {
        Self { kb: "luat".into(), url: None, answer_articles: 2 }
    }
}

/// Which provider's native web-search grounding `find_local_crisis_resources` uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchProvider {
    /// No web search: the offline directory only.
    #[default]
    None,
    /// OpenAI's Responses API with the `web_search` tool.
    Openai,
    /// Gemini's `generateContent` with the `google_search` tool.
    Gemini,
}

/// `[tools.crisis]`: the crisis companion's resource finder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrisisToolSettings {
    /// Web-search grounding: `none` (default), `openai` or `gemini`.
    pub search_provider: SearchProvider,
    /// The provider's API root. Default: `https://api.openai.com/v1` for OpenAI,
    /// `https://generativelanguage.googleapis.com/v1beta` for Gemini.
    pub search_base_url: Option<String>,
    /// The model that searches. Default: `gpt-4.1-mini` (OpenAI), `gemini-2.5-flash` (Gemini).
    pub search_model: Option<String>,
    /// The provider's API key. Env: `TOOLGRAPH_TOOLS_CRISIS__SEARCH_API_KEY`.
    pub search_api_key: Option<Secret>,
    /// How long the search may take, ms. Default: 15000.
    pub search_timeout_ms: u64,
    /// A hotline directory (JSON: region → entries) replacing the shipped one; operators must
    /// check the numbers of the regions they serve.
    pub directory: Option<PathBuf>,
}

impl Default for CrisisToolSettings {
    fn default() -> Self {
        Self {
            search_provider: SearchProvider::None,
            search_base_url: None,
            search_model: None,
            search_api_key: None,
            search_timeout_ms: 15_000,
            directory: None,
        }
    }
}

/// `[tools.course]`: the course tutor's tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CourseToolSettings {
    /// The backend that keeps the professors' test preferences: `generate_test` reads
    /// `GET {backend_url}/users/subject/{asignatura}/preferences` (5 s), else uses 5 questions
    /// of medium difficulty. Env: `TOOLGRAPH_TOOLS_COURSE_BACKEND_URL`.
    pub backend_url: Option<String>,
}

impl ToolSettings {
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        if let Some(url) = self.course.as_ref().and_then(|c| c.backend_url.as_deref())
            && !is_http_url(Some(url))
        {
            return Err(check.invalid("tools.course.backend_url", format!("'{url}' is not an http(s) URL")));
        }
        if let Some(legal) = &self.legal {
            if legal.kb.is_empty() {
                return Err(check.invalid("tools.legal.kb", "must not be empty".into()));
            }
            if !(1..=MAX_ANSWER_ARTICLES).contains(&legal.answer_articles) {
                return Err(check.invalid(
                    "tools.legal.answer_articles",
                    format!("must be 1-{MAX_ANSWER_ARTICLES}, got {}", legal.answer_articles),
                ));
            }
            if let Some(url) = &legal.url
                && !is_http_url(Some(&url.replace(['{', '}'], "")))
            {
                return Err(check.invalid("tools.legal.url", format!("'{url}' is not an http(s) URL template")));
            }
        }
        if let Some(crisis) = &self.crisis {
            if let Some(url) = crisis.search_base_url.as_deref()
                && !is_http_url(Some(url))
            {
                return Err(check.invalid("tools.crisis.search_base_url", format!("'{url}' is not an http(s) URL")));
            }
            if crisis.search_timeout_ms == 0 {
                return Err(check.invalid("tools.crisis.search_timeout_ms", "must be greater than 0".into()));
            }
        }
        Ok(())
    }
}
