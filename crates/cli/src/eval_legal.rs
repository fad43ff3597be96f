//! `toolgraph eval legal`: the legal Q&A agent's tools on the ALQAC questions (BEIR layout with
//! `question_type`, `choices` and `answer` on each query): retrieval recall@k of the gold
//! article through `retrieve_laws`, and with a model, the answers of `generate_answer` cited by
//! `format_citation` — whether the cited article is a gold one, and the accuracy of true/false
//! and multiple-choice verdicts (docs/legal.md).

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use toolgraph_agents::legal::answer::{choice, true_or_false};
use toolgraph_agents::legal::{AnswerWriter, Chunk, LawLibrary, MAX_TOP_K, cite, cited_labels};
use toolgraph_config::{Config, MAX_ANSWER_ARTICLES};

/// `toolgraph eval legal`.
#[derive(Debug, clap::Args)]
pub struct LegalArgs {
    /// The ALQAC BEIR folder (queries.jsonl with question_type/choices/answer, qrels/test.tsv).
    #[arg(long, value_name = "DIR")]
    pub dataset: PathBuf,
    /// The knowledge base holding the laws (default: `tools.legal.kb`, else `luat`).
    #[arg(long)]
    pub kb: Option<String>,
    /// Evaluate only the first N questions of each type.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Articles retrieved per question (recall@K).
    #[arg(long, default_value_t = 5)]
    pub top_k: usize,
    /// Of those, how many the model reads to answer and the citations choose among. Default:
    /// `tools.legal.answer_articles` (2).
    #[arg(long, value_name = "N")]
    pub answer_chunks: Option<usize>,
    /// Retrieval only: no model calls.
    #[arg(long)]
    pub no_model: bool,
    /// Re-scores the answers of an earlier `--json` run (its `model_answer` per question)
    /// instead of asking the model again: citation changes measured in seconds.
    #[arg(long, value_name = "FILE", conflicts_with = "no_model")]
    pub answers: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Deserialize)]
struct Question {
    #[serde(rename = "_id")]
    id: String,
    text: String,
    #[serde(default)]
    question_type: String,
    #[serde(default)]
    choices: Option<BTreeMap<String, String>>,
    #[serde(default)]
    answer: String,
}

/// One question's outcome.
#[derive(Debug, Serialize)]
struct Outcome {
    id: String,
    question_type: String,
    retrieved_gold: bool,
    /// The labels of the retrieved articles, best first.
    retrieved: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cited: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    citation_correct: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<String>,
    /// The answer with its citations.
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<String>,
    /// The model's answer before citing.
    #[serde(skip_serializing_if = "Option::is_none")]
    model_answer: Option<String>,
    seconds: f64,
}

/// The model's answers of an earlier run, by question id.
fn earlier_answers(path: &Path) -> anyhow::Result<HashMap<String, String>> {
    #[derive(Deserialize)]
    struct Earlier {
        outcomes: Vec<EarlierOutcome>,
    }
    #[derive(Deserialize)]
    struct EarlierOutcome {
        id: String,
        model_answer: Option<String>,
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let earlier: Earlier = serde_json::from_str(&text)
        .with_context(|| format!("{} is not the --json report of `toolgraph eval legal`", path.display()))?;
    let answers: HashMap<String, String> =
        earlier.outcomes.into_iter().filter_map(|o| Some((o.id, o.model_answer?))).collect();
    if answers.is_empty() {
        bail!("{} holds no model_answer to re-score (written before they were recorded?)", path.display());
    }
    Ok(answers)
}

/// What the command prints.
#[derive(Debug, Serialize)]
struct Report {
    questions: usize,
    top_k: usize,
    /// Of the `top_k`, how many an answer read and its citations chose among.
    answer_articles: usize,
    recall_at_k: f64,
    /// With a model: questions whose answer cites at least one article.
    #[serde(skip_serializing_if = "Option::is_none")]
    cited_share: Option<f64>,
    /// With a model: of those, the share whose first cited article is a gold one.
    #[serde(skip_serializing_if = "Option::is_none")]
    citation_correctness: Option<f64>,
    /// With a model: accuracy per question type that has a verdict (`Đúng/Sai`, `Trắc nghiệm`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    verdict_accuracy: BTreeMap<String, f64>,
    model: Option<String>,
    outcomes: Vec<Outcome>,
}

/// Question id → its gold articles' document ids.
type Gold = HashMap<String, Vec<String>>;

fn read_questions(dir: &Path) -> anyhow::Result<(Vec<Question>, Gold)> {
    let path = dir.join("queries.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let questions = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1)))
        .collect::<anyhow::Result<Vec<Question>>>()?;
    let path = dir.join("qrels/test.tsv");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut gold = Gold::new();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        if let [q, doc, grade] = cols[..]
            && grade.trim() != "0"
        {
            gold.entry(q.to_owned()).or_default().push(doc.to_owned());
        }
    }
    Ok((questions, gold))
}

/// The question as the model reads it: the text, and the choices of a multiple-choice one.
fn asked(q: &Question) -> String {
    match &q.choices {
        Some(choices) if !choices.is_empty() => {
            let lines: Vec<String> = choices.iter().map(|(k, v)| format!("{k}. {v}")).collect();
            format!("{}\n{}", q.text, lines.join("\n"))
        }
        _ => q.text.clone(),
    }
}

pub async fn run(args: LegalArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let legal = cfg.tools.legal.clone().unwrap_or_default();
    let answer_articles = args.answer_chunks.unwrap_or(legal.answer_articles);
    if !(1..=MAX_TOP_K).contains(&args.top_k) || !(1..=MAX_ANSWER_ARTICLES).contains(&answer_articles) {
        bail!("--top-k must be 1-{MAX_TOP_K} and --answer-chunks 1-{MAX_ANSWER_ARTICLES}");
    }
    // No more are read than are retrieved.
    let answer_articles = answer_articles.min(args.top_k);
    let (mut questions, gold) = read_questions(&args.dataset)?;
    questions.retain(|q| gold.contains_key(&q.id));
    if let Some(n) = args.limit {
        let mut per_type: HashMap<String, usize> = HashMap::new();
        questions.retain(|q| {
            let seen = per_type.entry(q.question_type.clone()).or_default();
            *seen += 1;
            *seen <= n
        });
    }
    let kb = args.kb.clone().unwrap_or_else(|| legal.kb.clone());
    let store = crate::retrieval::kb_store(cfg);
    // Blocking: opening a knowledge base on Qdrant is an HTTP call.
    let found = {
        let (store, tenant, kb) = (Arc::clone(&store), cfg.rag.tenant.clone(), kb.clone());
        tokio::task::spawn_blocking(move || store.open(&tenant, &kb).is_ok()).await.context("the open task failed")?
    };
    if !found {
        bail!(
            "knowledge base '{kb}' not found for tenant '{}': ingest the laws first, e.g. toolgraph ingest \
             law.json --kb {kb} --mapping examples/kb/alqac-mapping.toml",
            cfg.rag.tenant
        );
    }
    let library = LawLibrary {
        store,
        retriever: crate::retrieval::retriever(cfg),
        kb,
        default_tenant: cfg.rag.tenant.clone(),
        url_template: None,
        answer_articles,
    };
    let replayed = args.answers.as_deref().map(earlier_answers).transpose()?;
    let model = if args.no_model || replayed.is_some() {
        None
    } else {
        let local = crate::agent::local_model(cfg).await?;
        crate::agent::tool_model(cfg, local.as_ref())
    };
    let model_id = match &args.answers {
        Some(path) => Some(format!("answers of {}", path.display())),
        None => model.as_ref().map(|m| m.model_id().to_owned()),
    };
    let writer = AnswerWriter { model };
    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(questions.len() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} questions, {elapsed} ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut outcomes = Vec::with_capacity(questions.len());
    for q in &questions {
        let started = std::time::Instant::now();
        let golds = &gold[&q.id];
        let chunks: Vec<Chunk> = library
            .retrieve(&cfg.rag.tenant, None, &q.text, args.top_k)
            .await
            .map_err(|e| anyhow::anyhow!("retrieval failed for {}: {e}", q.id))?;
        let retrieved_gold = chunks.iter().any(|c| golds.contains(&c.meta.doc_id));
        let mut outcome = Outcome {
            id: q.id.clone(),
            question_type: q.question_type.clone(),
            retrieved_gold,
            retrieved: chunks.iter().map(|c| c.meta.label()).collect(),
            cited: None,
            citation_correct: None,
            expected: None,
            verdict: None,
            answer: None,
            model_answer: None,
            seconds: 0.0,
        };
        let read = library.read(chunks);
        let answer = match &replayed {
            Some(answers) => answers.get(&q.id).cloned(),
            None if writer.model.is_some() => {
                Some(writer.generate(&asked(q), &read).await.with_context(|| format!("answering {}", q.id))?)
            }
            None => None,
        };
        if let Some(answer) = answer {
            let cited_answer = cite(&answer, &read);
            let labels = cited_labels(&cited_answer);
            // A label names a chunk: the chunk's document is the cited article.
            let first = labels.first().and_then(|l| read.iter().find(|c| &c.meta.label() == l));
            outcome.citation_correct =
                (!labels.is_empty()).then(|| first.is_some_and(|c| golds.contains(&c.meta.doc_id)));
            outcome.cited = Some(labels);
            match q.question_type.as_str() {
                "Đúng/Sai" => {
                    outcome.expected = Some(q.answer.clone());
                    outcome.verdict = true_or_false(&answer).map(|t| if t { "Đúng" } else { "Sai" }.to_owned());
                }
                "Trắc nghiệm" => {
                    outcome.expected = Some(q.answer.clone());
                    outcome.verdict = choice(&answer).map(String::from);
                }
                _ => {}
            }
            outcome.answer = Some(cited_answer);
            outcome.model_answer = Some(answer);
        }
        outcome.seconds = started.elapsed().as_secs_f64();
        outcomes.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let n = outcomes.len().max(1) as f64;
    let recall = outcomes.iter().filter(|o| o.retrieved_gold).count() as f64 / n;
    let (mut cited_share, mut correctness) = (None, None);
    let mut verdict_accuracy = BTreeMap::new();
    if model_id.is_some() {
        let with = outcomes.iter().filter(|o| o.citation_correct.is_some()).count();
        cited_share = Some(with as f64 / n);
        correctness = (with > 0)
            .then(|| outcomes.iter().filter(|o| o.citation_correct == Some(true)).count() as f64 / with as f64);
        for kind in ["Đúng/Sai", "Trắc nghiệm"] {
            let of_kind: Vec<&Outcome> = outcomes.iter().filter(|o| o.question_type == kind).collect();
            if !of_kind.is_empty() {
                let right = of_kind.iter().filter(|o| o.verdict.is_some() && o.verdict == o.expected).count();
                verdict_accuracy.insert(kind.to_owned(), right as f64 / of_kind.len() as f64);
            }
        }
    }
    let report = Report {
        questions: outcomes.len(),
        top_k: args.top_k,
        answer_articles,
        recall_at_k: recall,
        cited_share,
        citation_correctness: correctness,
        verdict_accuracy,
        model: model_id,
        outcomes,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("questions        {}", report.questions);
        println!("recall@{:<9} {:.4}", report.top_k, report.recall_at_k);
        if let (Some(share), Some(model)) = (report.cited_share, &report.model) {
            println!("model            {model}");
            println!("articles read    {} of {}", report.answer_articles, report.top_k);
            println!("answers citing   {:.1} %", share * 100.0);
            match report.citation_correctness {
                Some(c) => println!("citation correct {:.1} % (first cited article is a gold one)", c * 100.0),
                None => println!("citation correct - (no answer cited an article)"),
            }
            for (kind, acc) in &report.verdict_accuracy {
                println!("{kind:<16} {:.1} % right", acc * 100.0);
            }
        } else {
            println!("(no model: retrieval only)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiple_choice_questions_show_their_choices_in_order() {
        let q: Question = serde_json::from_value(serde_json::json!({
            "_id": "TN-1", "text": "Hỏi?", "question_type": "Trắc nghiệm",
            "choices": {"B": "hai", "A": "một"}, "answer": "A"
        }))
        .unwrap();
        assert_eq!(asked(&q), "Hỏi?\nA. một\nB. hai");
    }
}
