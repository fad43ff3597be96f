//! Provider-native web-search grounding: one model call with the provider's own search tool —
//! OpenAI's Responses API with `{"type": "web_search"}`, or Gemini's `generateContent` with
//! `{"google_search": {}}` — and the grounded text with the pages it cites.
//!
//! What each provider sends back (docs/crisis.md): OpenAI an `output` list with a
//! `web_search_call` item and a `message` item whose `output_text` content carries
//! `url_citation` annotations; Gemini a candidate whose `groundingMetadata` lists
//! `webSearchQueries` and `groundingChunks[].web.{uri, title}`.

use serde_json::{Value, json};
use std::time::Duration;
use toolgraph_config::SearchProvider;

/// A page a grounded answer cites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Its title (may be empty).
    pub title: String,
    /// Its address.
    pub url: String,
}

/// A grounded answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grounded {
    /// The model's text.
    pub text: String,
    /// The pages it cites, in order, without repeats.
    pub sources: Vec<Source>,
    /// The queries the provider searched for (Gemini reports them).
    pub queries: Vec<String>,
}

/// A web search on a provider.
#[derive(Clone)]
pub struct WebSearch {
    provider: SearchProvider,
    base_url: String,
    model: String,
    api_key: String,
    http: reqwest::Client,
}

impl WebSearch {
    /// A search on `provider` at `base_url` (else the provider's public API) with `model`
    /// (else a current small model of the provider's); `None` for [`SearchProvider::None`].
    pub fn new(
        provider: SearchProvider,
        base_url: Option<&str>,
        model: Option<&str>,
        api_key: Option<&str>,
        timeout: Duration,
    ) -> Option<Self> {
        let (default_base, default_model) = match provider {
            SearchProvider::None => return None,
            SearchProvider::Openai => ("https://api.openai.com/v1", "gpt-4.1-mini"),
            SearchProvider::Gemini => ("https://generativelanguage.googleapis.com/v1beta", "gemini-2.5-flash"),
        };
        let http = reqwest::Client::builder().timeout(timeout).connect_timeout(Duration::from_secs(5)).build().ok()?;
        Some(Self {
            provider,
            base_url: base_url.unwrap_or(default_base).trim_end_matches('/').to_owned(),
            model: model.unwrap_or(default_model).to_owned(),
            api_key: api_key.unwrap_or_default().to_owned(),
            http,
        })
    }

    /// The provider.
    pub fn provider(&self) -> SearchProvider {
        self.provider
    }

    /// The grounded answer to `prompt`.
    ///
    /// # Errors
    /// A readable reason: the provider unreachable, an error status (e.g. a model without
    /// search support), or an answer of an unknown shape. The API key never appears in it.
    pub async fn search(&self, prompt: &str) -> Result<Grounded, String> {
        let request = match self.provider {
            SearchProvider::Openai => self
                .http
                .post(format!("{}/responses", self.base_url))
                .bearer_auth(&self.api_key)
                .json(&json!({ "model": self.model, "tools": [{"type": "web_search"}], "input": prompt })),
            SearchProvider::Gemini => self
                .http
                .post(format!("{}/models/{}:generateContent", self.base_url, self.model))
                .header("x-goog-api-key", &self.api_key)
                .json(&json!({
                    "contents": [{"role": "user", "parts": [{"text": prompt}]}],
                    "tools": [{"google_search": {}}]
                })),
            SearchProvider::None => return Err("no search provider".into()),
        };
        let response =
            request.send().await.map_err(|e| redact(&format!("search request failed: {e}"), &self.api_key))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| format!("search answer unreadable: {e}"))?;
        if !status.is_success() {
            let shown: String = body.chars().take(300).collect();
            return Err(redact(&format!("the search provider answered {status}: {shown}"), &self.api_key));
        }
        let value: Value = serde_json::from_str(&body).map_err(|e| format!("the search answer is not JSON: {e}"))?;
        match self.provider {
            SearchProvider::Gemini => parse_gemini(&value),
            _ => parse_openai(&value),
        }
        .ok_or_else(|| "the search answer has no text".into())
    }
}

/// `text` with `key` masked (providers quote a bad key in their errors).
fn redact(text: &str, key: &str) -> String {
    if key.len() >= 4 { text.replace(key, "********") } else { text.to_owned() }
}

fn push_source(sources: &mut Vec<Source>, title: &str, url: &str) {
    if !url.is_empty() && !sources.iter().any(|s| s.url == url) {
        sources.push(Source { title: title.to_owned(), url: url.to_owned() });
    }
}

/// An OpenAI Responses API answer: the `output_text` parts of its `message` items and their
/// `url_citation` annotations.
pub fn parse_openai(v: &Value) -> Option<Grounded> {
    let mut out = Grounded::default();
    for item in v["output"].as_array()? {
        match item["type"].as_str() {
            Some("web_search_call") => {
                if let Some(q) = item["action"]["query"].as_str() {
                    out.queries.push(q.to_owned());
                }
            }
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    if part["type"] != "output_text" {
                        continue;
                    }
                    out.text.push_str(part["text"].as_str().unwrap_or_default());
                    for a in part["annotations"].as_array().into_iter().flatten() {
                        if a["type"] == "url_citation" {
                            push_source(
                                &mut out.sources,
                                a["title"].as_str().unwrap_or_default(),
                                a["url"].as_str().unwrap_or_default(),
                            );
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (!out.text.trim().is_empty()).then_some(out)
}

/// A Gemini `generateContent` answer: the first candidate's text parts and its
/// `groundingMetadata`.
pub fn parse_gemini(v: &Value) -> Option<Grounded> {
    let candidate = v["candidates"].as_array()?.first()?;
    let mut out = Grounded::default();
    for part in candidate["content"]["parts"].as_array().into_iter().flatten() {
        out.text.push_str(part["text"].as_str().unwrap_or_default());
    }
    let meta = &candidate["groundingMetadata"];
    for q in meta["webSearchQueries"].as_array().into_iter().flatten() {
        if let Some(q) = q.as_str() {
            out.queries.push(q.to_owned());
        }
    }
    for chunk in meta["groundingChunks"].as_array().into_iter().flatten() {
        push_source(
            &mut out.sources,
            chunk["web"]["title"].as_str().unwrap_or_default(),
            chunk["web"]["uri"].as_str().unwrap_or_default(),
        );
    }
    (!out.text.trim().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_text_and_citations_are_read() {
        let v = json!({"output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "crisis line Singapore"}},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "SOS | 1767",
              "annotations": [{"type": "url_citation", "start_index": 0, "end_index": 3, "url": "https://www.sos.org.sg", "title": "SOS"},
                              {"type": "url_citation", "start_index": 6, "end_index": 10, "url": "https://www.sos.org.sg", "title": "SOS"}]}]}
        ]});
        let g = parse_openai(&v).unwrap();
        assert_eq!(g.text, "SOS | 1767");
        assert_eq!(g.sources, [Source { title: "SOS".into(), url: "https://www.sos.org.sg".into() }]);
        assert_eq!(g.queries, ["crisis line Singapore"]);
        assert!(parse_openai(&json!({"output": []})).is_none());
    }

    #[test]
    fn gemini_text_and_grounding_are_read() {
        let v = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "**Samaritans**: "}, {"text": "116 123"}]},
            "groundingMetadata": {"webSearchQueries": ["UK crisis hotline"],
              "groundingChunks": [{"web": {"uri": "https://vertexaisearch.cloud.google.com/grounding-api-redirect/x", "title": "samaritans.org"}}]}}]});
        let g = parse_gemini(&v).unwrap();
        assert_eq!(g.text, "**Samaritans**: 116 123");
        assert_eq!(g.sources[0].title, "samaritans.org");
        assert_eq!(g.queries, ["UK crisis hotline"]);
        assert!(parse_gemini(&json!({"candidates": []})).is_none());
    }

    #[test]
    fn the_key_is_masked_in_errors() {
        assert_eq!(redact("bad key sk-123456", "sk-123456"), "bad key ********");
    }
}
