//! `toolgraph eval answers`: whether an agent answers from its documents — the gold answer in
//! the reply, the reply cited, the gold passage retrieved, and "cannot find it" where the
//! documents do not hold the answer (docs/benchmarks.md, "Grounded answers").
//!
//! Two sources of questions:
//! - `--dataset DIR`: XQuAD (`xquad.LANG.json`, SQuAD's layout). Each paragraph is ingested as a
//!   document into a knowledge base of its own in a scratch data directory, except every fifth
//!   (`--held-out`), whose questions the right reply says it cannot find. Questions are taken
//!   one per paragraph, spread over the whole set.
//! - `--cases FILE`: JSON lines `{"lang", "question", "expect": [[alternatives…], …],
//!   "abstain": bool, "before": [messages…]}` asked of the configured agent over its own
//!   knowledge base (ingested before): right when every group of `expect` has one alternative
//!   in the reply, and the reply cites a passage (or, with `abstain`, says it cannot find it).
//!   `before`: the person's earlier messages, each asked and answered in the same conversation
//!   first (a follow-up — "¿y la extraordinaria?" — is judged in its conversation); their
//!   replies are not judged.
//!
//! Each case is asked in a fresh conversation, through the agent's graph as `chat` runs it.

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use toolgraph_agents::assembly::{self, SharedParts};
use toolgraph_agents::kit::user_turn;
use toolgraph_config::Config;
use toolgraph_graph::{MemoryCheckpointer, RunEvent, RunOptions, RunOutcome, ThreadId};
use toolgraph_rag::search::grounding::{self, Passage, Sources, Verdict, is_abstention, passages_in};
use toolgraph_rag::{Analyzer, IngestOptions, NoProgress, RecordMapping, ingest};

/// `toolgraph eval answers`.
#[derive(Debug, clap::Args)]
pub struct AnswersArgs {
    /// XQuAD's folder (xquad.es.json, xquad.vi.json, xquad.en.json …).
    #[arg(long, value_name = "DIR", conflicts_with = "cases", required_unless_present = "cases")]
    pub dataset: Option<PathBuf>,
    /// A case file instead (JSON lines, see `eval answers --help`), e.g.
    /// examples/eval/course-answers.jsonl, over the configured knowledge base.
    #[arg(long, value_name = "FILE")]
    pub cases: Option<PathBuf>,
    /// With --dataset: the languages, comma-separated.
    #[arg(long, default_value = "es,vi,en", value_delimiter = ',')]
    pub lang: Vec<String>,
    /// Questions per language (--dataset) or cases (--cases); default: all.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// With --dataset: one paragraph in this many is not ingested (its questions should be
    /// answered "cannot find it"); 0 ingests every one.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub held_out: usize,
    /// With --dataset: ingest keyword-only (no embeddings; faster, weaker retrieval).
    #[arg(long)]
    pub keyword_only: bool,
    /// The agent to ask (default: the default agent). With --dataset its knowledge base is
    /// the data set's, and its tools must include rag_search.
    #[arg(long)]
    pub agent: Option<String>,
    /// A state value for the agent's injected tool arguments, e.g. `--context asignatura=iv`.
    #[arg(long = "context", value_name = "KEY=VALUE")]
    pub context: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One question to ask.
#[derive(Debug, Clone, Deserialize)]
struct Case {
    lang: String,
    question: String,
    /// Groups of alternatives; each group must have one in the reply.
    #[serde(default)]
    expect: Vec<Vec<String>>,
    /// The right reply says the documents do not hold the answer.
    #[serde(default)]
    abstain: bool,
    /// The person's earlier messages in the conversation, asked first (not judged).
    #[serde(default)]
    before: Vec<String>,
    /// XQuAD: the gold paragraph's citation label, and the gold answers.
    #[serde(skip)]
    gold_label: Option<String>,
    #[serde(skip)]
    gold: Vec<String>,
}

/// What one question got.
#[derive(Debug, Serialize)]
struct Answered {
    lang: String,
    question: String,
    /// The conversation before the question: each earlier message and its reply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    before: Vec<(String, String)>,
    reply: String,
    abstain_expected: bool,
    abstained: bool,
    /// The expected facts (or a gold answer) are in the reply.
    right_fact: bool,
    /// Best token F1 against a gold answer (XQuAD).
    f1: Option<f64>,
    cited: bool,
    /// The gold paragraph among the first three passages the turn retrieved (XQuAD).
    gold_retrieved: Option<bool>,
    /// Facts of the reply that no passage, tool result or message of the turn holds.
    unsupported: Vec<String>,
    /// The whole case's, its earlier turns' included.
    seconds: f64,
    error: Option<String>,
}

impl Answered {
    /// Right: an abstention where one is expected; else the fact in the reply, cited.
    fn right(&self) -> bool {
        if self.abstain_expected { self.abstained } else { self.right_fact && self.cited && !self.abstained }
    }
}

pub async fn run(args: AnswersArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let context = crate::chat_cmd::context_pairs(&args.context)?;
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    // Each group is asked of one agent: a language of the data set over its paragraphs, or
    // the case file over the configured knowledge base.
    let groups: Vec<(Config, Vec<Case>)> = match (&args.dataset, &args.cases) {
        (Some(dir), _) => {
            let mut groups = Vec::with_capacity(args.lang.len());
            for lang in &args.lang {
                groups.push(xquad(dir, lang, &args, cfg, scratch.path()).await?);
            }
            groups
        }
        (None, Some(file)) => {
            let text =
                tokio::fs::read_to_string(file).await.with_context(|| format!("cannot read {}", file.display()))?;
            let mut cases: Vec<Case> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", file.display(), i + 1)))
                .collect::<anyhow::Result<_>>()?;
            cases.truncate(args.limit.unwrap_or(usize::MAX));
            vec![(cfg.clone(), cases)]
        }
        (None, None) => bail!("give --dataset DIR or --cases FILE"),
    };
    let local_model = crate::agent::local_model(cfg).await?;
    let total: usize = groups.iter().map(|(_, c)| c.len()).sum();
    let bar = if args.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total as u64).with_style(
            ProgressStyle::with_template("{spinner} asking [{bar:30}] {pos}/{len} {msg} ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        )
    };
    let mut results = Vec::with_capacity(total);
    let mut model_id = String::new();
    for (cfg, cases) in &groups {
        let tools = crate::agent::all_tools(cfg, local_model.as_ref()).await?;
        let shared = SharedParts {
            tools,
            local_model: local_model.clone(),
            schema_prompt: None,
            kinds: Default::default(),
            memory_store: None,
            item_index: None,
        };
        let agent = assembly::build(cfg, args.agent.as_deref(), Arc::new(MemoryCheckpointer::new()), &shared)?;
        model_id = assembly::model(cfg, &agent.settings, local_model.as_ref())?.model_id().to_owned();
        for case in cases {
            bar.set_message(case.lang.clone());
            let answered = ask(&agent, results.len(), case, context.clone()).await;
            if !args.json {
                bar.suspend(|| println!("{}", line(&answered)));
            }
            results.push(answered);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    report(&results, args.json, &model_id);
    Ok(ExitCode::SUCCESS)
}

fn line(a: &Answered) -> String {
    let after: String = a.before.iter().map(|(asked, _)| format!("{asked:?} … ")).collect();
    format!(
        "{} [{}] {after}{:?} → {:?}{}",
        if a.right() { "ok  " } else { "MISS" },
        a.lang,
        a.question,
        a.reply.chars().take(160).collect::<String>(),
        if a.unsupported.is_empty() { String::new() } else { format!(" (unsupported: {})", a.unsupported.join(", ")) }
            + &a.error.as_ref().map(|e| format!(" (error: {e})")).unwrap_or_default()
    )
}

/// Asks `case` in a fresh conversation (after its earlier messages, in the same one) and
/// judges the reply.
async fn ask(agent: &assembly::Agent, i: usize, case: &Case, context: Option<Map<String, Value>>) -> Answered {
    let started = std::time::Instant::now();
    let thread = ThreadId::new("eval", format!("q{i}"));
    let options =
        || RunOptions { recursion_limit: agent.settings.recursion_limit, owns_thread: true, ..Default::default() };
    // The context goes with the first message, as a client sends it when it opens a conversation.
    let mut context = context;
    let mut before = Vec::with_capacity(case.before.len());
    let mut error = None;
    // What the earlier turns retrieved is the conversation's too: a reply may draw on it.
    let mut read_before: Vec<Passage> = Vec::new();
    for earlier in &case.before {
        let mut said = String::new();
        let started_run = agent.graph.start(&thread, user_turn(earlier.clone(), context.take()), options()).await;
        let failed = to_the_end(started_run, |event| match event {
            RunEvent::TextDelta { text } => said.push_str(&text),
            RunEvent::ToolResult { outcome, .. } => read_before.extend(passages_in(&outcome)),
            _ => {}
        })
        .await;
        before.push((earlier.clone(), said.trim().to_owned()));
        if let Some(e) = failed {
            error = Some(format!("before the question, {earlier:?}: {e}"));
            break;
        }
    }
    let mut reply = String::new();
    let mut passages: Vec<Passage> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    // A conversation that failed before the question is not asked it: its reply stays empty,
    // and the case is not right.
    let error = match error {
        Some(failed) => Some(failed),
        None => {
            let started_run = agent.graph.start(&thread, user_turn(case.question.clone(), context), options()).await;
            to_the_end(started_run, |event| match event {
                RunEvent::TextDelta { text } => reply.push_str(&text),
                RunEvent::ToolResult { outcome, .. } => {
                    let found = passages_in(&outcome);
                    if found.is_empty() {
                        others.push(outcome.to_string());
                    }
                    passages.extend(found);
                }
                _ => {}
            })
            .await
        }
    };
    let reply = reply.trim().to_owned();
    let abstained = is_abstention(&reply);
    // A number as a whole number ("6" is not in "60 %", "20" is in "20th" and "20일"), words
    // at the start of a word ("volume" is in "volumes").
    let normalized = format!(" {}", normalize(&reply));
    let numbers: Vec<String> = reply
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .map(|n| n.trim_matches(['.', ',']).replace(',', "."))
        .filter(|n| !n.is_empty())
        .collect();
    let holds = |text: &str| {
        let words = normalize(text);
        if !words.is_empty() && words.chars().all(|c| c.is_ascii_digit()) {
            return numbers.contains(&words);
        }
        !words.is_empty() && normalized.contains(&format!(" {words}"))
    };
    let right_fact = if case.gold.is_empty() {
        !case.expect.is_empty() && case.expect.iter().all(|group| group.iter().any(|alt| holds(alt)))
    } else {
        case.gold.iter().any(|g| holds(g))
    };
    let f1 = (!case.gold.is_empty()).then(|| case.gold.iter().map(|g| token_f1(&reply, g)).fold(0.0, f64::max));
    let labels: Vec<&str> = passages.iter().map(|p| p.label.as_str()).collect();
    // A marker the check left names a source the turn read (it removes the others), a search's
    // passage or a cited tool's result; "[1, 2]" or a link's text names nothing.
    let cited = reply.split('[').skip(1).any(|after| {
        after.split_once(']').is_some_and(|(label, tail)| !tail.starts_with('(') && grounding::looks_like_label(label))
    });
    let gold_retrieved = case.gold_label.as_ref().map(|gold| labels.iter().take(3).any(|l| l == gold));
    // The support pass again, over what the conversation read: a reply must state nothing new.
    let read: Vec<Passage> = passages.iter().chain(&read_before).cloned().collect();
    let mut sources = Sources::new(&read);
    for o in &others {
        sources.add_evidence(o);
    }
    sources.add_given(&case.question);
    // What the person said earlier is theirs to repeat; the agent's earlier replies are not
    // sources (a fact they invented would vouch for itself).
    for earlier in &case.before {
        sources.add_given(earlier);
    }
    sources.add_given(&agent.settings.system_prompt);
    let unsupported = grounding::sentences(&reply)
        .into_iter()
        .filter_map(|s| match sources.judge(&strip_labels(s), None) {
            Verdict::Unsupported(missing) => Some(missing),
            _ => None,
        })
        .flatten()
        .collect();
    Answered {
        lang: case.lang.clone(),
        question: case.question.clone(),
        before,
        reply,
        abstain_expected: case.abstain,
        abstained,
        right_fact,
        f1,
        cited,
        gold_retrieved,
        unsupported,
        seconds: started.elapsed().as_secs_f64(),
        error,
    }
}

/// Runs a started turn to its end, handing each event to `on_event`; why it did not complete,
/// if it did not.
pub(crate) async fn to_the_end<S: toolgraph_graph::State + std::fmt::Debug>(
    started: Result<toolgraph_graph::RunHandle<S>, toolgraph_graph::GraphError>,
    mut on_event: impl FnMut(RunEvent),
) -> Option<String> {
    let mut run = match started {
        Ok(run) => run,
        Err(e) => return Some(e.to_string()),
    };
    while let Some(event) = run.next_event().await {
        on_event(event);
    }
    match run.outcome().await {
        RunOutcome::Completed { .. } => None,
        other => Some(format!("{other:?}").chars().take(200).collect()),
    }
}

/// `text` without its `[label]` markers (they name sources, they state nothing).
fn strip_labels(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Lowercased words of letters and digits, one space apart (SQuAD's normalisation without
/// the English articles, which other languages do not have).
fn normalize(text: &str) -> String {
    text.to_lowercase().split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Token F1 of `reply` against `gold` (SQuAD's), on [`normalize`]d words.
fn token_f1(reply: &str, gold: &str) -> f64 {
    let (r, g) = (normalize(&strip_labels(reply)), normalize(gold));
    let (r, g): (Vec<&str>, Vec<&str>) =
        (r.split(' ').filter(|w| !w.is_empty()).collect(), g.split(' ').filter(|w| !w.is_empty()).collect());
    if r.is_empty() || g.is_empty() {
        return 0.0;
    }
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for w in &g {
        *counts.entry(w).or_default() += 1;
    }
    let mut same = 0;
    for w in &r {
        if let Some(n) = counts.get_mut(w).filter(|n| **n > 0) {
            *n -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let (p, q) = (same as f64 / r.len() as f64, same as f64 / g.len() as f64);
    2.0 * p * q / (p + q)
}

/// SQuAD's layout, as XQuAD ships it.
#[derive(Deserialize)]
struct Squad {
    data: Vec<Article>,
}

#[derive(Deserialize)]
struct Article {
    #[serde(default)]
    title: Option<String>,
    paragraphs: Vec<Paragraph>,
}

#[derive(Deserialize)]
struct Paragraph {
    context: String,
    qas: Vec<Qa>,
}

#[derive(Deserialize)]
struct Qa {
    question: String,
    answers: Vec<GoldAnswer>,
}

#[derive(Deserialize)]
struct GoldAnswer {
    text: String,
}

/// A paragraph's citation label: its article and its place in it.
fn label(article: &str, n: usize) -> String {
    format!("{article} ¶{n}")
}

/// Ingests XQuAD's `lang` paragraphs (all but the held-out ones) into a knowledge base of a
/// scratch data directory and picks the questions: the configuration the agent runs with (its
/// knowledge base that one), and the cases.
async fn xquad(
    dir: &Path,
    lang: &str,
    args: &AnswersArgs,
    cfg: &Config,
    scratch: &Path,
) -> anyhow::Result<(Config, Vec<Case>)> {
    let path = dir.join(format!("xquad.{lang}.json"));
    let text = tokio::fs::read_to_string(&path).await.with_context(|| format!("cannot read {}", path.display()))?;
    let squad: Squad =
        serde_json::from_str(&text).with_context(|| format!("{} is not in SQuAD's layout", path.display()))?;
    let mut records = Vec::new();
    let mut paragraphs = Vec::new();
    for (a, article) in squad.data.iter().enumerate() {
        let title = article.title.clone().unwrap_or_else(|| format!("Article {}", a + 1));
        let mut items = Vec::new();
        for (n, p) in article.paragraphs.iter().enumerate() {
            let held_out = args.held_out > 0 && paragraphs.len() % args.held_out == args.held_out - 1;
            if !held_out {
                items.push(serde_json::json!({"id": n + 1, "text": p.context.trim_start_matches('\u{feff}')}));
            }
            paragraphs.push((label(&title, n + 1), held_out, p));
        }
        records.push(serde_json::json!({"id": title, "paragraphs": items}));
    }
    let wanted = args.limit.unwrap_or(paragraphs.len()).min(paragraphs.len());
    // One question per paragraph, spread over the set; the k-th pick takes its paragraph's
    // (k mod its questions)-th question, so the picks do not all ask the first kind.
    let mut cases = Vec::with_capacity(wanted);
    for k in 0..wanted {
        let (gold_label, held_out, p) = &paragraphs[k * paragraphs.len() / wanted];
        let Some(qa) = p.qas.get(k % p.qas.len().max(1)) else { continue };
        cases.push(Case {
            lang: lang.to_owned(),
            question: qa.question.clone(),
            expect: Vec::new(),
            abstain: *held_out,
            before: Vec::new(),
            gold_label: (!held_out).then(|| gold_label.clone()),
            gold: if *held_out { Vec::new() } else { qa.answers.iter().map(|a| a.text.clone()).collect() },
        });
    }
    let mut cfg = cfg.clone();
    cfg.data_dir = scratch.join("data");
    let file = scratch.join(format!("xquad.{lang}.records.json"));
    tokio::fs::write(&file, serde_json::to_vec(&records)?).await?;
    let kb = format!("xquad-{lang}");
    let options = IngestOptions {
        mapping: Some(RecordMapping::from_toml(XQUAD_MAPPING).map_err(anyhow::Error::msg)?),
        analyzer: Analyzer::from_code(lang),
        ..IngestOptions::default()
    };
    let (store, tenant, ingest_cfg, keyword_only) =
        (crate::retrieval::kb_store(&cfg), cfg.rag.tenant.clone(), cfg.clone(), args.keyword_only);
    let kb_name = kb.clone();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let options = IngestOptions {
            embedder: if keyword_only { None } else { crate::retrieval::embedder(&ingest_cfg)? },
            ..options
        };
        Ok(ingest(&store, &tenant, &kb_name, &[file], &options, &NoProgress)?)
    })
    .await
    .context("the ingest task failed")??;
    eprintln!(
        "{lang}: {} paragraphs ingested into {kb} ({}), {} held out; {} questions",
        report.documents,
        report.embedding_model.as_deref().unwrap_or("keyword only"),
        paragraphs.iter().filter(|(_, held, _)| *held).count(),
        cases.len()
    );
    let agent = args.agent.clone().unwrap_or_else(|| cfg.default_agent_name());
    let mut settings =
        cfg.effective_agents().get(&agent).cloned().with_context(|| format!("no agent named '{agent}'"))?;
    settings.kb = Some(kb);
    cfg.agents.insert(agent, settings);
    Ok((cfg, cases))
}

/// How XQuAD's records become documents: a paragraph each, cited as "Article ¶n".
const XQUAD_MAPPING: &str = r#"records = "paragraphs"
id = "{^id}#{id}"
title = "{^id}"
citation = "{^id} ¶{id}"
"#;

/// The figures, per language and in all.
fn report(results: &[Answered], json: bool, model: &str) {
    let share = |n: usize, of: usize| if of == 0 { None } else { Some(n as f64 / of as f64) };
    let summary = |of: &[&Answered]| {
        let answerable: Vec<&&Answered> = of.iter().filter(|r| !r.abstain_expected).collect();
        let held: Vec<&&Answered> = of.iter().filter(|r| r.abstain_expected).collect();
        let retrieved: Vec<&&&Answered> = answerable.iter().filter(|r| r.gold_retrieved == Some(true)).collect();
        let f1s: Vec<f64> = answerable.iter().filter_map(|r| r.f1).collect();
        serde_json::json!({
            "questions": of.len(),
            "right": share(of.iter().filter(|r| r.right()).count(), of.len()),
            "answerable": answerable.len(),
            "fact_in_reply": share(answerable.iter().filter(|r| r.right_fact).count(), answerable.len()),
            "cited": share(answerable.iter().filter(|r| r.cited).count(), answerable.len()),
            "f1": (!f1s.is_empty()).then(|| f1s.iter().sum::<f64>() / f1s.len() as f64),
            "gold_retrieved_top3": share(retrieved.len(), answerable.iter().filter(|r| r.gold_retrieved.is_some()).count()),
            "fact_in_reply_when_retrieved": share(retrieved.iter().filter(|r| r.right_fact).count(), retrieved.len()),
            "abstained_wrongly": share(answerable.iter().filter(|r| r.abstained).count(), answerable.len()),
            "held_out": held.len(),
            "abstained_rightly": share(held.iter().filter(|r| r.abstained).count(), held.len()),
            "replies_with_unsupported_facts": of.iter().filter(|r| !r.unsupported.is_empty()).count(),
            "errors": of.iter().filter(|r| r.error.is_some()).count(),
            "seconds_per_question": of.iter().map(|r| r.seconds).sum::<f64>() / of.len().max(1) as f64,
        })
    };
    let mut langs: Vec<&str> = results.iter().map(|r| r.lang.as_str()).collect();
    langs.sort_unstable();
    langs.dedup();
    let all: Vec<&Answered> = results.iter().collect();
    let per_lang: Map<String, Value> = langs
        .iter()
        .map(|l| {
            let of: Vec<&Answered> = results.iter().filter(|r| r.lang == *l).collect();
            (l.to_string(), summary(&of))
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({"model": model, "all": summary(&all), "languages": per_lang, "results": results})
        );
        return;
    }
    let pct = |v: &Value| v.as_f64().map_or_else(|| "–".to_owned(), |f| format!("{:.0} %", f * 100.0));
    for (lang, s) in per_lang.iter().chain([(&"all".to_owned(), &summary(&all))]) {
        println!(
            "{lang}: {} right of {} · fact in reply {} · cited {} · F1 {} · gold passage in top 3 {} (fact in reply then {}) · \
             abstained on {} held-out: {} right, on answerable {} · {} replies with unsupported facts · {:.1} s a question",
            pct(&s["right"]),
            s["questions"],
            pct(&s["fact_in_reply"]),
            pct(&s["cited"]),
            s["f1"].as_f64().map_or_else(|| "–".to_owned(), |f| format!("{f:.2}")),
            pct(&s["gold_retrieved_top3"]),
            pct(&s["fact_in_reply_when_retrieved"]),
            s["held_out"],
            pct(&s["abstained_rightly"]),
            pct(&s["abstained_wrongly"]),
            s["replies_with_unsupported_facts"],
            s["seconds_per_question"].as_f64().unwrap_or_default(),
        );
    }
    println!("model: {model}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped answers case reads, asks something, and expects a fact or an abstention.
    #[test]
    fn the_shipped_answer_cases_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/eval");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with("-answers.jsonl") {
                continue;
            }
            files += 1;
            for (i, line) in std::fs::read_to_string(&path).unwrap().lines().enumerate() {
                let case: Case =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
                assert!(!case.question.trim().is_empty(), "{} line {}", path.display(), i + 1);
                assert!(case.before.iter().all(|m| !m.trim().is_empty()), "{} line {}", path.display(), i + 1);
                assert!(case.abstain == case.expect.is_empty(), "{} line {}: expect or abstain", path.display(), i + 1);
            }
        }
        assert!(files > 0, "no answers cases in {}", dir.display());
    }

    #[test]
    fn gold_answers_are_found_by_their_words_and_scored_by_token_f1() {
        assert_eq!(normalize("¡El 20 de enero, [Guía] 40 %!"), "el 20 de enero guía 40");
        assert!((token_f1("Fue en Denver [X ¶1].", "Denver") - 2.0 / 3.0 * 1.0 / (1.0 / 3.0 + 1.0)).abs() < 1e-9);
        assert_eq!(token_f1("nada", "Denver"), 0.0);
        assert_eq!(strip_labels("El 20 [Guía ¶2]."), "El 20 .");
    }
}
