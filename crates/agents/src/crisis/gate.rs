//! The crisis gate's decision: a multilingual keyword pre-filter, so an ordinary turn costs no
//! model call, then one deterministic model call with a JSON-Schema verdict for the turns it
//! flags. When that call fails the gate errs on the side of the person: the turn is treated as
//! at risk.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use toolgraph_llm::{ChatModel, ChatRequest, Message, ResponseFormat};

/// Words and phrases that send a turn to the model's judgement (lowercase; matched as
/// substrings of the lowercased text). English, Spanish, Vietnamese, Korean, French,
/// Portuguese, German and Chinese.
pub const KEYWORDS: &[&str] = &[
    // English
    "suicide",
    "suicidal",
    "kill myself",
    "end my life",
    "end it all",
    "want to die",
    "wanna die",
    "self-harm",
    "self harm",
    "hurt myself",
    "cut myself",
    "no reason to live",
    "better off dead",
    "overdose",
    // Spanish
    "suicid",
    "quitarme la vida",
    "matarme",
    "quiero morir",
    "no quiero vivir",
    "hacerme daño",
    "autolesi",
    // Vietnamese
    "tự tử",
    "tự sát",
    "muốn chết",
    "không muốn sống",
    "kết liễu",
    "tự làm hại",
    "tự hại",
    // Korean
    "자살",
    "죽고 싶",
    "자해",
    "살기 싫",
    // French, Portuguese, German
    "me tuer",
    "envie de mourir",
    "me matar",
    "quero morrer",
    "umbringen",
    "sterben will",
    "selbstmord",
    // Chinese
    "自杀",
    "不想活",
    "想死",
    "自残",
];

/// How long the verdict may take.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(30);

/// How much risk the gate sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    /// None: an ordinary reply.
    None,
    /// Possible: the reply offers crisis lines.
    Possible,
    /// Imminent danger: the reply offers crisis lines first.
    Imminent,
}

/// The gate's decision for one turn, as the conversation's state keeps it (`crisis_gate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The risk.
    pub risk: Risk,
    /// Why, in a few words.
    pub reason: String,
    /// `keywords` (no keyword matched: no model call), `model`, or `fallback` (the model call
    /// failed, so the turn is treated as at risk).
    pub screened_by: String,
}

/// Whether `text` holds one of the [`KEYWORDS`].
pub fn keyword_hit(text: &str) -> bool {
    let lower = text.to_lowercase();
    KEYWORDS.iter().any(|k| lower.contains(k))
}

/// The verdict for a turn whose recent user messages are `recent`.
pub async fn screen(model: &Arc<dyn ChatModel>, recent: &str) -> Verdict {
    if !keyword_hit(recent) {
        return Verdict { risk: Risk::None, reason: "no risk words".into(), screened_by: "keywords".into() };
    }
    let schema = json!({
        "type": "object",
        "properties": {
            "risk": {"type": "string", "enum": ["none", "possible", "imminent"]},
            "reason": {"type": "string", "maxLength": 200}
        },
        "required": ["risk", "reason"],
        "additionalProperties": false
    });
    let mut request = ChatRequest::new(vec![
        Message::system(
            "You screen messages to a support companion for risk of suicide or self-harm. Judge only the user's \
             own risk: a question about the topic, a book or someone else is \"none\"; talk of wanting to die or \
             hurting oneself is \"possible\"; a plan, means or a time is \"imminent\". Answer with JSON only: \
             {\"risk\": \"none\"|\"possible\"|\"imminent\", \"reason\": \"…\"}.",
        ),
        Message::user(recent.to_owned()),
    ]);
    request.response_format = Some(ResponseFormat::JsonSchema { name: "crisis_verdict".into(), schema, strict: true });
    request.temperature = Some(0.0);
    request.max_tokens = Some(80);
    let fallback = |why: String| {
        tracing::warn!(%why, "the crisis verdict failed; treating the turn as at risk");
        Verdict { risk: Risk::Possible, reason: why, screened_by: "fallback".into() }
    };
    match tokio::time::timeout(VERDICT_TIMEOUT, model.complete(request)).await {
        Ok(Ok(reply)) => match parse_verdict(&reply.content) {
            Some((risk, reason)) => Verdict { risk, reason, screened_by: "model".into() },
            None => fallback(format!("unreadable verdict: {}", reply.content.chars().take(120).collect::<String>())),
        },
        Ok(Err(e)) => fallback(format!("model failed: {e}")),
        Err(_) => fallback("model timed out".into()),
    }
}

/// `(risk, reason)` of a verdict answer (inside a code fence or not).
fn parse_verdict(reply: &str) -> Option<(Risk, String)> {
    let (start, end) = (reply.find('{')?, reply.rfind('}')?);
    let v: Value = serde_json::from_str(reply.get(start..=end)?).ok()?;
    let risk: Risk = serde_json::from_value(v["risk"].clone()).ok()?;
    Some((risk, v["reason"].as_str().unwrap_or_default().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_match_across_languages_and_case() {
        for text in ["I want to END MY LIFE", "ya no quiero vivir", "tôi muốn chết", "죽고 싶어요", "我不想活了"]
        {
            assert!(keyword_hit(text), "{text}");
        }
        for text in ["How do I renew my passport?", "¿Qué tal el examen?", "Hôm nay trời đẹp"] {
            assert!(!keyword_hit(text), "{text}");
        }
    }

    #[test]
    fn verdicts_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_verdict("{\"risk\": \"imminent\", \"reason\": \"plan\"}"),
            Some((Risk::Imminent, "plan".into()))
        );
        assert_eq!(parse_verdict("{\"risk\": \"maybe\"}"), None);
        assert_eq!(parse_verdict("no"), None);
    }
}
