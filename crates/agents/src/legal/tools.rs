//! The legal Q&A tools as a model calls them: `retrieve_laws`, `generate_answer`,
//! `format_citation` (the contract's names, parameters and result shapes).

use super::answer::{AnswerError, AnswerWriter};
use super::{Chunk, LawLibrary, MAX_TOP_K, cite};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use toolgraph_tools::{Tool, ToolBuilder, ToolContext, ToolError};

/// Arguments of `retrieve_laws`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RetrieveLawsInput {
    /// The legal question, in the user's words.
    #[schemars(length(min = 1, max = 2000))]
    pub question: String,
    /// How many articles to return (default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 20))]
    pub top_k: Option<usize>,
}

fn default_top_k() -> usize {
    5
}

/// Arguments of `generate_answer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct GenerateAnswerInput {
    /// The legal question.
    #[schemars(length(min = 1, max = 2000))]
    pub question: String,
    /// The articles `retrieve_laws` returned; leave out to use those it returned in this turn.
    #[serde(default)]
    #[schemars(length(max = 20))]
    pub chunks: Option<Vec<Chunk>>,
}

/// Arguments of `format_citation`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FormatCitationInput {
    /// The answer to attribute; leave out to use the one generate_answer gave in this turn.
    #[serde(default)]
    #[schemars(length(min = 1, max = 8000))]
    pub answer: Option<String>,
    /// The articles the answer was written from; leave out to use those retrieve_laws
    /// returned in this turn.
    #[serde(default)]
    #[schemars(length(max = 20))]
    pub chunks: Option<Vec<Chunk>>,
}

/// The chunks a call gave, else the articles `retrieve_laws` returned earlier in the turn (so
/// a model need not copy them into its call).
///
/// # Errors
/// Neither: invalid arguments, saying where chunks come from.
fn given_or_retrieved(ctx: &ToolContext, given: Option<Vec<Chunk>>) -> Result<Vec<Chunk>, ToolError> {
    if let Some(chunks) = given {
        return Ok(chunks);
    }
    ctx.turn_result("retrieve_laws").and_then(|v| serde_json::from_value::<Vec<Chunk>>(v).ok()).ok_or_else(|| {
        ToolError::invalid_arguments(
            "chunks: none given, and retrieve_laws has returned no articles in this turn; call retrieve_laws first",
        )
    })
}

/// The answer a call gave, else the one `generate_answer` returned earlier in the turn.
///
/// # Errors
/// Neither: invalid arguments, saying where an answer comes from.
fn given_or_generated(ctx: &ToolContext, given: Option<String>) -> Result<String, ToolError> {
    if let Some(answer) = given {
        return Ok(answer);
    }
    ctx.turn_result("generate_answer")
        .and_then(|v| v.get("answer").and_then(serde_json::Value::as_str).map(str::to_owned))
        .ok_or_else(|| {
            ToolError::invalid_arguments(
                "answer: none given, and generate_answer has not answered in this turn; give the answer to cite",
            )
        })
}

/// `retrieve_laws` over `library`: the tenant is the conversation's (`tenant` in the tool
/// context), the knowledge base the agent's (`kb`), else the library's.
pub fn retrieve_laws_tool(library: LawLibrary) -> Arc<dyn Tool> {
    ToolBuilder::<RetrieveLawsInput>::new(
        "retrieve_laws",
        "Find the articles of law that bear on a legal question. Returns a list of chunks {text, meta: {doc_id, \
         section_title, article_number, url, law, citation}}, best first.",
    )
    .display_name("Law search")
    .hide("top_k")
    .handler(move |ctx, args: RetrieveLawsInput| {
        let library = library.clone();
        let (tenant, kb) = library.scope(&ctx);
        async move {
            let top_k = args.top_k.unwrap_or_else(default_top_k);
            if top_k > MAX_TOP_K {
                return Err(ToolError::invalid_arguments(format!("top_k must be 1-{MAX_TOP_K}")));
            }
            library.retrieve(&tenant, kb.as_deref(), &args.question, top_k).await
        }
    })
    // The builder's only failure is a schema or name error, fixed at compile time here.
    .expect("retrieve_laws's schema is valid")
}

/// `generate_answer` on `writer`'s model: `{answer}`, from the best-ranked chunks
/// ([`LawLibrary::read`]) as `library` holds them ([`LawLibrary::verified`]: an article it lacks
/// is refused); a model that fails or is missing is an `unavailable` failure.
pub fn generate_answer_tool(writer: AnswerWriter, library: LawLibrary) -> Arc<dyn Tool> {
    ToolBuilder::<GenerateAnswerInput>::new(
        "generate_answer",
        "Answer a legal question from the articles of law retrieve_laws returned only. Returns {answer}; says \
         so when the articles do not hold the answer.",
    )
    .display_name("Answer from the law")
    .hide("chunks")
    // The answer is the articles' to give, never the caller's memory: once they are in, the
    // next step is this one (docs/legal.md).
    .required_after(["retrieve_laws"])
    .timeout(super::answer::ANSWER_TIMEOUT + std::time::Duration::from_secs(5))
    .handler(move |ctx, args: GenerateAnswerInput| {
        let (writer, library) = (writer.clone(), library.clone());
        let (tenant, kb) = library.scope(&ctx);
        let chunks = given_or_retrieved(&ctx, args.chunks);
        async move {
            let chunks = library.verified(&tenant, kb.as_deref(), library.read(chunks?)).await?;
            match writer.generate(&args.question, &chunks).await {
                Ok(answer) => Ok(json!({ "answer": answer })),
                Err(AnswerError::Timeout(t)) => Err(ToolError::timeout(format!("no answer within {t:?}"))),
                Err(e) => Err(ToolError::unavailable(e.to_string())),
            }
        }
    })
    .expect("generate_answer's schema is valid")
}

/// `format_citation`: `{cited_answer}` (see [`cite`]) against the chunks the answer read
/// ([`LawLibrary::read`]) as `library` holds them ([`LawLibrary::verified`]: an article it
/// lacks is refused, never cited).
pub fn format_citation_tool(library: LawLibrary) -> Arc<dyn Tool> {
    ToolBuilder::<FormatCitationInput>::new(
        "format_citation",
        // Placeholders, not a real article: a small model copies an example citation into
        // answers it writes from memory.
        "Attribute each sentence of an answer to the article of law that supports it, as \"Theo [Điều <number>, \
         <law>], …\", using the chunks retrieve_laws returned. Only articles among the chunks are ever cited. \
         Returns {cited_answer}.",
    )
    .display_name("Cite the law")
    .offered_after(["retrieve_laws"])
    // After generate_answer, citing needs nothing the model would write: the agent calls it.
    .runs_after(["generate_answer"])
    // The cited answer is the reply: a model restating it could only lose or garble citations.
    .answers_with("cited_answer")
    .handler(move |ctx, args: FormatCitationInput| {
        let library = library.clone();
        let (tenant, kb) = library.scope(&ctx);
        let (answer, chunks) = (given_or_generated(&ctx, args.answer), given_or_retrieved(&ctx, args.chunks));
        async move {
            let (answer, chunks) = (answer?, chunks?);
            let chunks = library.verified(&tenant, kb.as_deref(), library.read(chunks)).await?;
            Ok(json!({ "cited_answer": cite(&answer, &chunks) }))
        }
    })
    .expect("format_citation's schema is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_left_out_are_the_ones_retrieve_laws_returned_in_the_turn() {
        let chunk = json!({"text": "Chính phủ thống nhất quản lý.", "meta": {"doc_id": "Luật Điện ảnh#45"}});
        let ctx = ToolContext::default().with_turn_results(vec![
            ("retrieve_laws".into(), json!([chunk]).to_string()),
            ("other".into(), "1".into()),
        ]);
        let found = given_or_retrieved(&ctx, None).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].meta.doc_id, "Luật Điện ảnh#45");
        // Chunks given win over the turn's.
        assert!(given_or_retrieved(&ctx, Some(Vec::new())).unwrap().is_empty());
        // Without a search in the turn, or after a failed one, the call says what to do.
        for ctx in [
            ToolContext::default(),
            ToolContext::default().with_turn_results(vec![("retrieve_laws".into(), r#"{"ok": false}"#.into())]),
        ] {
            let e = given_or_retrieved(&ctx, None).unwrap_err();
            assert_eq!(e.kind, toolgraph_tools::ToolErrorKind::InvalidArguments);
            assert!(e.message.contains("call retrieve_laws first"), "{}", e.message);
        }
    }
}
