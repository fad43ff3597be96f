//! A grounded reply — a `model` node with `cite = true`, as the ReAct agent's with
//! `grounding = "retrieve_first"` is: what its prompt adds, the sources its reply is checked
//! against, and when it must say the documents do not hold the answer (docs/retrieval.md,
//! "Grounded answers"). The check itself is the retrieval crate's
//! [`grounding`](toolgraph_rag::search::grounding).

use super::{AgentDeps, this_turn};
use serde_json::Value;
use toolgraph_graph::RunContext;
use toolgraph_llm::{ChatModel, ChatRequest, Message};
use toolgraph_rag::search::grounding::{self, GroundedReply, GroundingReport, Passage, Sources};
use toolgraph_tools::ToolRegistry;

/// Added to a grounded node's system prompt.
pub const GROUNDING_INSTRUCTION: &str = "Answer the question directly and briefly, in your own words, from the \
search results in this conversation, with only the facts they state; when they do not hold the answer, say you \
cannot find it in the documents. Reply in the language the person writes in, even when the results are in another.";

/// A grounded node's system prompt: `prompt` with the [`GROUNDING_INSTRUCTION`] after it,
/// unless it ends with it already (the grounded ReAct agent's prompt does, so that the prompt its
/// service computes ahead is the one its calls send).
pub fn grounded_prompt(prompt: &str) -> std::borrow::Cow<'_, str> {
    match prompt {
        // The grounded ReAct agent's, on every call: borrowed, not copied.
        p if p.ends_with(GROUNDING_INSTRUCTION) => p.into(),
        "" => GROUNDING_INSTRUCTION.into(),
        p => format!("{p}\n\n{GROUNDING_INSTRUCTION}").into(),
    }
}

/// The report of a reply's check against the documents, as a checking node writes it to its
/// channel and streams it as its own data (docs/graph.md, "Streaming a node's own data"): the
/// sentences cited and backed, each dropped sentence with what no source held, and whether the
/// reply became the abstention.
pub(crate) fn report_json(report: &GroundingReport) -> Value {
    let dropped: Vec<Value> = report
        .dropped
        .iter()
        .map(|(sentence, missing)| serde_json::json!({ "sentence": sentence, "unsupported": missing }))
        .collect();
    serde_json::json!({
        "cited": report.cited,
        "backed": report.backed,
        "dropped": dropped,
        "abstained": report.abstained,
    })
}

/// A grounded call's messages as the model reads them: this turn's search calls and results
/// (JSON, which a small model copies out or takes for a call still to make) become the passages
/// written before the person's question, with the language to answer in by name. The results of
/// the turn's other calls (a section of the guide, a calculation) are written out with them under
/// their tool's name: a model offered no tools that reads calls in its history writes one more
/// instead of answering. The conversation keeps them as calls; only the request changes, after
/// the system prompt, whose computed prefix stays as it is.
pub(crate) fn write_out_results(messages: &mut Vec<Message>, tools: &ToolRegistry) -> Option<WrittenOut> {
    /// Most characters of one other tool's result written out (a long one is cut, marked).
    const MAX_RESULT_CHARS: usize = 4_000;
    let user = messages.iter().rposition(|m| matches!(m, Message::User { .. }))?;
    let turn = &messages[user + 1..];
    let mut found: Vec<Passage> = Vec::new();
    let mut searched = false;
    let mut others: Vec<(&str, &str)> = Vec::new();
    for m in turn {
        let Message::Tool { tool_call_id, name, content } = m else { continue };
        match search_output(content) {
            Some(v) => {
                searched = true;
                found.extend(grounding::passages_in(&v));
            }
            // A tool whose results are documents (`cited_as`): a passage under its label.
            _ => match cited_result(turn, tools, tool_call_id, name, content) {
                Some(p) => {
                    searched = true;
                    found.push(p);
                }
                None => others.push((name.as_str(), content.as_str())),
            },
        }
    }
    if !searched {
        return None;
    }
    read_follow_up_first(messages, &mut found);
    let first = found.first().cloned();
    let mut text = String::from(DOCUMENTS_HEAD);
    if found.is_empty() {
        text.push_str("(none found)\n");
    }
    for p in &found {
        text.push_str(&written_passage(p));
        text.push_str("\n\n");
    }
    if !others.is_empty() {
        text.push_str("Tool results:\n");
        for (name, result) in &others {
            let cut = result.char_indices().nth(MAX_RESULT_CHARS).map_or(result.len(), |(at, _)| at);
            let marked = if cut < result.len() { "…" } else { "" };
            text.push_str(&format!("[{name}] {}{marked}\n\n", result[..cut].trim()));
        }
    }
    // Every call of the turn and its result are written out above: none stays as a call.
    let mut i = user + 1;
    while i < messages.len() {
        let drop = match &messages[i] {
            Message::Tool { .. } => true,
            Message::Assistant { tool_calls, .. } => !tool_calls.is_empty(),
            _ => false,
        };
        if drop {
            messages.remove(i);
        } else {
            i += 1;
        }
    }
    let Message::User { content } = &mut messages[user] else { return None };
    let question = std::mem::take(content);
    let language = grounding::language_name(grounding::language_of(&question));
    *content = format!("{text}{QUESTION_HEAD}{question}\n(Answer in {language}, from the documents.)");
    Some(WrittenOut { first, documents: text, question })
}

/// A grounded call's view of the turns before this one without their searches: each earlier
/// search result (the normalized search shape) and the call that asked for it are left out — the
/// answer of that turn stays, with its citations, and the checker still reads those passages
/// from the conversation. A follow-up's request is then the earlier words alone: a search
/// result is hundreds of tokens the model reads again on every later call, and a small model
/// answers a follow-up from the earlier passages instead of this turn's. Calls of other tools,
/// and a call message's words, stay.
pub(crate) fn without_earlier_searches(messages: &mut Vec<Message>) {
    let Some(turn) = messages.iter().rposition(|m| matches!(m, Message::User { .. })) else { return };
    let (dropped, removed) = earlier_searches(messages);
    if !dropped.contains(&true) {
        return;
    }
    for (at, gone) in removed {
        if let Some(Message::Assistant { tool_calls, .. }) = messages.get_mut(at) {
            let mut k = 0;
            tool_calls.retain(|_| {
                let keep = !gone.get(k).copied().unwrap_or(false);
                k += 1;
                keep
            });
        }
    }
    let mut i = 0;
    messages.retain(|_| {
        let keep = !dropped.get(i).copied().unwrap_or(false);
        i += 1;
        keep
    });
    // What the removal made neighbours (words said before a search call and the answer after
    // it; a question whose turn searched and never answered, and the next one) is one message:
    // a chat template that wants the roles to alternate refuses two of one role in a row.
    let turn = turn - dropped.iter().filter(|d| **d).count();
    let mut merged: Vec<Message> = Vec::with_capacity(messages.len());
    for (at, m) in messages.drain(..).enumerate() {
        match (merged.last_mut(), m) {
            (Some(Message::User { content: before }), Message::User { content }) if at < turn => {
                before.push_str("\n\n");
                before.push_str(&content);
            }
            (
                Some(Message::Assistant { content: before, tool_calls: none_before }),
                Message::Assistant { content, tool_calls },
            ) if at < turn && none_before.is_empty() && tool_calls.is_empty() => {
                before.push_str("\n\n");
                before.push_str(&content);
            }
            (_, m) => merged.push(m),
        }
    }
    *messages = merged;
}

/// What [`without_earlier_searches`] leaves out of the messages before the current turn:
/// whether each of them goes, and, for each message of calls, which of its calls (by position).
/// A result answers a call of the last message of calls before it: call ids repeat across turns
/// and model steps (a local model numbers each step's calls from 1), so a search's id names no
/// other call than that one.
fn earlier_searches(messages: &[Message]) -> (Vec<bool>, std::collections::BTreeMap<usize, Vec<bool>>) {
    let mut removed = std::collections::BTreeMap::<usize, Vec<bool>>::new();
    let Some(turn) = messages.iter().rposition(|m| matches!(m, Message::User { .. })) else {
        return (Vec::new(), removed);
    };
    let mut dropped = vec![false; turn];
    let mut calls_at = None;
    for (i, m) in messages[..turn].iter().enumerate() {
        match m {
            Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => calls_at = Some(i),
            Message::Tool { tool_call_id, content, .. } if is_search_output(content) => {
                if let Some(at) = calls_at
                    && let Message::Assistant { content, tool_calls } = &messages[at]
                {
                    let gone = removed.entry(at).or_insert_with(|| vec![false; tool_calls.len()]);
                    if let Some(call) =
                        tool_calls.iter().enumerate().position(|(k, c)| !gone[k] && c.id == *tool_call_id)
                    {
                        gone[call] = true;
                        dropped[i] = true;
                        dropped[at] = gone.iter().all(|g| *g) && content.trim().is_empty();
                    }
                }
            }
            _ => {}
        }
    }
    (dropped, removed)
}

/// The most recent messages a grounded call reads within `budget`, as
/// [`history_window`](super::history_window) cuts them, where what [`without_earlier_searches`]
/// leaves out of the request (the earlier turns' search results, and a message that only called
/// for them) costs nothing: it takes no room an earlier turn's words could have.
pub(crate) fn grounded_history_window(messages: &[Message], budget: usize) -> &[Message] {
    let (left_out, _) = earlier_searches(messages);
    super::spec::history_window_costing(messages, budget, |i, _| left_out.get(i).copied().unwrap_or(false))
}

/// A grounded model call's window of `messages` within `budget`: [`grounded_history_window`]
/// when `grounded`, else [`history_window`](super::history_window). The request and the summary
/// of older turns cut the same one.
pub(crate) fn model_window(messages: &[Message], budget: usize, grounded: bool) -> &[Message] {
    if grounded { grounded_history_window(messages, budget) } else { super::history_window(messages, budget) }
}

/// Whether a tool's result is in the normalized search shape (`{results: [...]}`,
/// docs/retrieval.md), without building it: earlier turns' results are told apart on every model
/// call, and their passages are not read.
fn is_search_output(content: &str) -> bool {
    /// The shape's one required part, each result skipped unread.
    #[derive(serde::Deserialize)]
    struct Shape {
        #[allow(dead_code)] // read only to require an array there
        results: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<Shape>(content).is_ok()
}

/// A tool's result, when in the shape [`is_search_output`] tells (parsed once): the documents a
/// turn found.
fn search_output(content: &str) -> Option<Value> {
    serde_json::from_str::<Value>(content).ok().filter(|v| v.get("results").is_some_and(Value::is_array))
}

/// A passage as the written-out documents show it: `[label] text`.
fn written_passage(p: &Passage) -> String {
    format!("[{}] {}", p.label, p.text.trim())
}

/// What [`write_out_results`] wrote before the person's question.
pub(crate) struct WrittenOut {
    /// The first passage found.
    pub first: Option<Passage>,
    /// Everything written before the question: the documents, and other tools' results.
    pub documents: String,
    /// The person's question.
    pub question: String,
}

/// Where the written-out documents begin.
const DOCUMENTS_HEAD: &str = "Documents:\n";
/// What the person's question follows.
const QUESTION_HEAD: &str = "Question: ";

/// The default of [`AgentSpec::min_question_gain`](super::AgentSpec::min_question_gain).
pub const DEFAULT_MIN_QUESTION_GAIN: f32 = 0.25;

/// Longest question whose likelihood is judged (bytes); a longer message is answered as it is.
const MAX_JUDGED_QUESTION_BYTES: usize = 400;

/// How much more likely the documents a turn found make the person's question than it is
/// without them — after the first passage alone, or after all of them, whichever gains more: the
/// mean gain in log-probability per token of the question (nats), when the model can tell
/// ([`ChatModel::tail_logprobs`]); not judged (`None`) for a question in another language than
/// the first passage, or too long. A question asked about what a passage says is
/// far more likely after that passage (the model reads its words in the question); a question
/// on the same subject whose answer is elsewhere gains little — which is how a grounded agent
/// tells "the documents do not hold it" from an answer (docs/retrieval.md, "Grounded answers").
/// `request` is the written-out answer request.
pub(crate) async fn question_gain(model: &dyn ChatModel, request: &ChatRequest, written: &WrittenOut) -> Option<f32> {
    let question = written.question.trim();
    let first = written.first.as_ref()?;
    if question.is_empty() || question.len() > MAX_JUDGED_QUESTION_BYTES {
        return None;
    }
    // A question in another language than the documents is not made likelier by their words.
    if grounding::language_of(question) != grounding::language_of(&first.text) {
        return None;
    }
    // The question alone and after the first passage are read with the system prompt only: an
    // earlier answer in the history would make a question asked again likely by itself, and
    // the passage would seem to add nothing. After all the documents, it is the answer's own
    // prompt up to the question (history and all), so the answer reads only what follows.
    let system = request.messages.iter().take_while(|m| matches!(m, Message::System { .. })).cloned();
    let asking = |content: String| ChatRequest::new(system.clone().chain([Message::user(content)]).collect());
    let alone = asking(format!("{QUESTION_HEAD}{question}"));
    let after = asking(format!("{DOCUMENTS_HEAD}{}\n\n{QUESTION_HEAD}{question}", written_passage(first)));
    let mut after_all = request.clone();
    after_all.tools.clear();
    if let Some(Message::User { content }) = after_all.messages.last_mut() {
        *content = format!("{}{QUESTION_HEAD}{question}", written.documents);
    }
    let mean = |lp: Vec<f32>| (!lp.is_empty()).then(|| lp.iter().sum::<f32>() / lp.len() as f32);
    let scored = async {
        let alone = model.tail_logprobs(alone, question).await?;
        let after = model.tail_logprobs(after, question).await?;
        let after_all = model.tail_logprobs(after_all, question).await?;
        Ok::<_, toolgraph_llm::LlmError>(alone.zip(after).zip(after_all))
    };
    match scored.await {
        Ok(Some(((alone, after), after_all))) => {
            let alone = mean(alone)?;
            let (one, all) = (mean(after)? - alone, mean(after_all)? - alone);
            tracing::debug!(first = one, all, question, "the question's gain from the documents");
            // A probability the model put at zero both ways says nothing.
            Some(one.max(all)).filter(|gain| gain.is_finite())
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot judge the question's likelihood; the model answers");
            None
        }
    }
}

/// Longest reply put in its documents' language ([`judge_in_documents_language`]): a longer
/// one states more than a yes or a no, and is judged as it is.
const MAX_TRANSLATED_BYTES: usize = 600;

/// How long the model may take to put a reply in its documents' language.
const TRANSLATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The request that puts `reply` in `documents` (the language code of the first passage it is
/// checked against), when it is plainly in another (see [`judge_in_documents_language`]).
fn translation_request(documents: &str, reply: &str) -> Option<ChatRequest> {
    let reply = reply.trim();
    if reply.len() > MAX_TRANSLATED_BYTES || !grounding::plainly_not_in(reply, documents) {
        return None;
    }
    let language = grounding::language_name(documents);
    let mut request = ChatRequest::new(vec![
        Message::system("You translate text faithfully: the same statements, nothing added or left out."),
        Message::user(format!("Translate into {language}. Write only the translation.\n\n{reply}")),
    ]);
    // A translation is about as long as what it translates.
    request.max_tokens = Some(u32::try_from(reply.len() / 2 + 16).unwrap_or(u32::MAX));
    Some(request)
}

/// A reply that stands on nothing, plainly in another language than its documents, judged in
/// theirs: a reply across languages shares none of its passages' words, so one without facts
/// ("Yes, you can book office hours online.") stands on nothing by its own words. The model puts
/// it in their language ("Sí, puedes pedir tutorías en línea."), and that is held to the check
/// every reply in their language is ([`GroundedReply::source_of`]), no more and no less: when
/// it is cited, the reply is vouched for by that passage; one the model would give anyway ("Sí,
/// hay aparcamiento en el campus.") shares none of their words and stays the abstention, as
/// does a reply the model cannot translate in time (docs/retrieval.md, "Check every
/// sentence"). The translation is not given the documents: with them, a small model borrows
/// their words for what they do not say. `model` is the node's own (a declared node may name
/// another than the agent's); its tokens count as the node's model call — all but those of a
/// translation cut off by the timeout, which reports none.
pub(crate) async fn judge_in_documents_language(
    ctx: &RunContext<AgentDeps>,
    model: &dyn ChatModel,
    checker: &mut Checker,
) {
    let Some(reply) = checker.reply.standing_on_nothing() else { return };
    let Some(request) = checker.documents_language.and_then(|language| translation_request(language, &reply)) else {
        return;
    };
    let translating = tokio::time::timeout(TRANSLATION_TIMEOUT, model.complete(request));
    let translated = ctx
        .counted_model_call(translating, |out| match out {
            Ok(out) => super::steps::call_report(model, &out.as_ref().map(|r| r.usage)),
            Err(_) => (false, None),
        })
        .await;
    match translated {
        Ok(Ok(translation)) => {
            let text = translation.content;
            let source = checker.reply.source_of(&text);
            tracing::debug!(node = %ctx.node(), %reply, translated = %text.trim(), ?source, "a reply judged in its documents' language");
            if let Some(passage) = source {
                checker.reply.vouch(passage);
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(node = %ctx.node(), error = %e, "cannot put the reply in its documents' language; it stands on nothing");
        }
        Err(_) => {
            tracing::warn!(node = %ctx.node(), "the reply was not put in its documents' language in time; it stands on nothing")
        }
    }
}

/// The documents `messages` read: tool results in the normalized search shape, and results of
/// tools that say how they are cited ([`ToolSpec::cited_as`](toolgraph_tools::ToolSpec::cited_as)).
/// Whether any came in this turn, the passages (this turn's first), and this turn's other tool
/// results.
fn passages<'a>(messages: &'a [Message], tools: &ToolRegistry) -> (bool, Vec<Passage>, Vec<&'a str>) {
    let turn_start = messages.len() - this_turn(messages).len();
    let (mut now, mut before, mut other) = (Vec::new(), Vec::new(), Vec::new());
    let mut searched = false;
    for (i, m) in messages.iter().enumerate() {
        let Message::Tool { tool_call_id, name, content } = m else { continue };
        let found = match search_output(content) {
            Some(v) => Some(grounding::passages_in(&v)),
            None => cited_result(messages, tools, tool_call_id, name, content).map(|p| vec![p]),
        };
        match (found, i >= turn_start) {
            (Some(found), true) => {
                searched = true;
                now.extend(found);
            }
            (Some(found), false) => before.extend(found),
            (None, true) => other.push(content.as_str()),
            (None, false) => {}
        }
    }
    now.extend(before);
    (searched, now, other)
}

/// A result of a tool with a `cited_as` label, as a passage: the label filled from its call's
/// arguments. `None` for any other tool, and for a failure.
fn cited_result(
    messages: &[Message],
    tools: &ToolRegistry,
    call_id: &str,
    name: &str,
    content: &str,
) -> Option<Passage> {
    let template = tools.get(name)?.spec().cited_as.clone()?;
    if super::failed(content) {
        return None;
    }
    let arguments: Value = messages
        .iter()
        .find_map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.iter().find(|c| c.id == call_id),
            _ => None,
        })
        .and_then(|c| serde_json::from_str(&c.arguments).ok())
        .unwrap_or(Value::Null);
    Some(Passage { label: cited_label(&template, &arguments), text: content.to_owned() })
}

/// `template` with each `{name}` replaced by that argument (an argument not given is left out,
/// and the separator before it with it).
fn cited_label(template: &str, arguments: &Value) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        out.push_str(&rest[..open]);
        match arguments.get(&rest[open + 1..open + close]) {
            Some(Value::String(v)) if !v.trim().is_empty() => out.push_str(v.trim()),
            Some(v) if !v.is_null() && !v.is_string() => out.push_str(&v.to_string()),
            _ => {
                let kept = out.trim_end_matches([' ', '›', '>', '/', ',', ':', '-']).len();
                out.truncate(kept);
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out.trim().to_owned()
}

/// What checks the reply of the model call that follows `messages` under `system`.
pub(crate) struct Checker {
    /// The reply's check.
    pub reply: GroundedReply,
    /// "Cannot find it", in the person's language.
    pub abstention: &'static str,
    /// Whether a reply that stands on nothing must abstain: this turn searched and called no
    /// other tool (a greeting searched nothing, and a reply after a calculation or a saved note
    /// is about that, not about the documents).
    pub required: bool,
    /// The language of the first passage the reply is checked against (a [`language_of`] code):
    /// the one a reply across languages is judged in ([`judge_in_documents_language`]).
    ///
    /// [`language_of`]: grounding::language_of
    pub documents_language: Option<&'static str>,
}

/// The [`Checker`] of the model call that follows `messages` under `system`.
pub(crate) fn checker(messages: &[Message], system: &str, tools: &ToolRegistry) -> Checker {
    checker_over(messages, system, tools, None)
}

/// [`checker`], citing `given` (a `cite` node's channel) instead of the conversation's
/// passages when it is `Some`, even empty; whether the reply must abstain is still the turn's
/// (it searched, and called no other tool).
pub(crate) fn checker_over(
    messages: &[Message],
    system: &str,
    tools: &ToolRegistry,
    given: Option<Vec<Passage>>,
) -> Checker {
    let (searched, found, other) = passages(messages, tools);
    let found = given.unwrap_or(found);
    let only_searched = searched && other.is_empty();
    let mut sources = Sources::new(&found);
    for text in other {
        sources.add_evidence(text);
    }
    let mut last_user = "";
    for m in messages {
        match m {
            Message::User { content } => {
                sources.add_given(content);
                last_user = content;
            }
            // Earlier replies were checked when they were written.
            Message::Assistant { content, .. } if !content.is_empty() => sources.add_evidence(content),
            _ => {}
        }
    }
    sources.add_given(system);
    Checker {
        reply: GroundedReply::new(sources),
        abstention: grounding::abstention(grounding::language_of(last_user)),
        required: only_searched,
        documents_language: found.first().map(|p| grounding::language_of(&p.text)),
    }
}

/// A short follow-up's passages in the order its own new words name them: those holding more
/// of the words the follow-up adds to the question before it ("extraordinaria" in "¿y la
/// extraordinaria?") first, the search's order otherwise. The follow-up is searched together
/// with the question before it, so the passage that answered that question ranks first again —
/// and a small model reads the first passage, repeating the earlier answer. A passage whose
/// heading (its label) holds more of the words comes first, then one whose text does; a word
/// every passage holds counts for none. Words are the terms citations are attributed by
/// ([`attribution`](toolgraph_rag::search::attribution): stems, stopwords left out, accents
/// folded; syllable pairs in Vietnamese).
fn read_follow_up_first(messages: &[Message], found: &mut [Passage]) {
    use toolgraph_rag::search::attribution::{Attribution, TermSet};
    let Some((before, last)) = short_follow_up(messages) else { return };
    if found.len() < 2 {
        return;
    }
    let cut = Attribution::default();
    let rules = cut.rules();
    let asked_before = TermSet::of(before, rules);
    let held: Vec<(TermSet, TermSet)> =
        found.iter().map(|p| (TermSet::of(&p.label, rules), TermSet::of(&p.text, rules))).collect();
    let mut new = cut.terms(last);
    let kind = new.kind();
    // A word the question before had names nothing new; one every passage holds tells none of
    // them apart.
    new.retain(|t| {
        !asked_before.holds(kind, t) && !held.iter().all(|(label, text)| label.holds(kind, t) || text.holds(kind, t))
    });
    if new.is_empty() {
        return;
    }
    // A word in a passage's heading names it before any in a text ("what about the resits?":
    // the section on resits, not a text that says "about").
    let scores: Vec<(usize, usize)> =
        held.iter().map(|(label, text)| (label.shared(&new), text.shared(&new))).collect();
    if scores.iter().skip(1).any(|s| *s > scores[0]) {
        // Stable: passages naming the words as much keep the search's order.
        let mut ranked: Vec<((usize, usize), Passage)> = scores.into_iter().zip(found.iter().cloned()).collect();
        ranked.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
        for (slot, (_, p)) in found.iter_mut().zip(ranked) {
            *slot = p;
        }
    }
}

/// The person's last message and the one before it, when the last is a short follow-up of it
/// (five words at most, not plainly in another language — "Who teaches the course?" after
/// "¿y la extraordinaria?" is a question of its own —, after a message that is neither small
/// talk nor a computation to make — "Calcula mi nota: 0.6 * 8 + 0.4 * 6.5" names no subject a
/// follow-up could be about).
pub(crate) fn short_follow_up(messages: &[Message]) -> Option<(&str, &str)> {
    const SHORT_WORDS: usize = 5;
    let mut users = messages.iter().rev().filter_map(|m| match m {
        Message::User { content } => Some(content.as_str()),
        _ => None,
    });
    let last = users.next()?;
    let before = users.next()?;
    let about_something =
        !grounding::is_small_talk(before) && toolgraph_tools::builtin::expression_in(before).is_none();
    let short = last.split_whitespace().count() <= SHORT_WORDS;
    (short && about_something && !grounding::plainly_other_language(last, before)).then_some((before, last))
}

/// The search query for the person's last message: the message, after the one before it
/// when it is short — a follow-up such as "¿y la extraordinaria?" names only what changed.
pub fn question_in_context(messages: &[Message]) -> Option<String> {
    match short_follow_up(messages) {
        Some((before, last)) => Some(format!("{before} {last}")),
        None => messages.iter().rev().find_map(|m| match m {
            Message::User { content } => Some(content.clone()),
            _ => None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call of tool `name` as `id`, with no arguments.
    fn call(id: &str, name: &str) -> toolgraph_llm::ToolCall {
        toolgraph_llm::ToolCall { id: id.into(), name: name.into(), arguments: "{}".into() }
    }

    /// The model's step that only calls tool `name` as `id`.
    fn calling(id: &str, name: &str) -> Message {
        Message::Assistant { content: String::new(), tool_calls: vec![call(id, name)] }
    }

    #[test]
    fn a_short_follow_up_is_searched_with_the_question_before_it() {
        let history = vec![
            Message::user("¿Cuándo es el examen final de la convocatoria ordinaria?"),
            Message::assistant("El 20 de enero."),
            Message::user("¿y la extraordinaria?"),
        ];
        assert_eq!(
            question_in_context(&history).as_deref(),
            Some("¿Cuándo es el examen final de la convocatoria ordinaria? ¿y la extraordinaria?")
        );
        let long =
            vec![Message::user("hola"), Message::user("¿Cuántos créditos tiene la asignatura de IV este curso?")];
        assert_eq!(
            question_in_context(&long).as_deref(),
            Some("¿Cuántos créditos tiene la asignatura de IV este curso?")
        );
        assert_eq!(
            question_in_context(&[Message::user("hola"), Message::user("¿y el examen?")]).as_deref(),
            Some("¿y el examen?")
        );
        // After a computation, a short question is one of its own.
        let computed = [
            Message::user("Calcula mi nota: 0.6 * 8 + 0.4 * 6.5"),
            Message::assistant("Tu nota es 7.4."),
            Message::user("¿y la extraordinaria cuándo es?"),
        ];
        assert_eq!(question_in_context(&computed).as_deref(), Some("¿y la extraordinaria cuándo es?"));
        // A short question plainly in another language is one of its own; a bare word is not
        // plainly in any, and an English follow-up of an English question is one.
        let asked = |before: &str, last: &str| question_in_context(&[Message::user(before), Message::user(last)]);
        assert_eq!(
            asked("¿y la extraordinaria?", "Who teaches the course?").as_deref(),
            Some("Who teaches the course?")
        );
        assert_eq!(asked("¿Cuándo es el examen?", "Tutorías").as_deref(), Some("¿Cuándo es el examen? Tutorías"));
        assert_eq!(asked("¿Cuándo es el examen?", "resits?").as_deref(), Some("¿Cuándo es el examen? resits?"));
        assert_eq!(
            asked("When is the final exam?", "And the resits?").as_deref(),
            Some("When is the final exam? And the resits?")
        );
        assert_eq!(asked("When is the final exam?", "¿y en julio?").as_deref(), Some("¿y en julio?"));
    }

    #[test]
    fn a_short_follow_up_reads_first_the_passage_its_own_words_name() {
        let search = r#"{"ok":true,"results":[
            {"content":"El examen final, que se celebra el 20 de enero, vale el 40 %.","metadata":{"citation":"Guía › Evaluación › Convocatoria ordinaria"}},
            {"content":"Las tutorías son los martes.","metadata":{"citation":"Guía › Tutorías"}},
            {"content":"Quien no supere la ordinaria puede presentarse a un examen único en julio.","metadata":{"citation":"Guía › Evaluación › Convocatoria extraordinaria"}}]}"#;
        let turn = |first: &str, follow_up: &str| {
            vec![
                Message::user(first),
                Message::assistant("El examen final se celebra el 20 de enero."),
                Message::user(follow_up),
                calling("s1", "rag_search"),
                Message::tool("s1", "rag_search", search),
            ]
        };
        let labels = |written: &WrittenOut| -> Vec<String> {
            written
                .documents
                .lines()
                .filter_map(|l| l.strip_prefix('[')?.split(']').next().map(str::to_owned))
                .collect()
        };
        // "extraordinaria" (accents and case folded) is the follow-up's own word: its passage
        // is read first, the others keep the search's order.
        let mut messages = turn("¿Cuándo es el examen final?", "¿Y la EXTRAORDINARIA?");
        let written = write_out_results(&mut messages, &ToolRegistry::new()).unwrap();
        assert_eq!(
            labels(&written),
            [
                "Guía › Evaluación › Convocatoria extraordinaria",
                "Guía › Evaluación › Convocatoria ordinaria",
                "Guía › Tutorías"
            ]
        );
        assert_eq!(written.first.map(|p| p.label).as_deref(), Some("Guía › Evaluación › Convocatoria extraordinaria"));
        assert_eq!(written.question, "¿Y la EXTRAORDINARIA?", "the question is the person's own");
        let search_order = [
            "Guía › Evaluación › Convocatoria ordinaria",
            "Guía › Tutorías",
            "Guía › Evaluación › Convocatoria extraordinaria",
        ];
        // A question of its own (more than five words), a follow-up adding no word a passage
        // holds, and one whose words the question before had: the search's order.
        // A heading the follow-up names comes before a text holding its other words.
        let english = r#"{"ok":true,"results":[
            {"content":"What you should know about the exam: it is on 20 January.","metadata":{"citation":"Exams › Ordinary"}},
            {"content":"Office hours are on Tuesdays.","metadata":{"citation":"Office hours"}},
            {"content":"A second exam is held in July.","metadata":{"citation":"Exams › Resits"}}]}"#;
        let mut messages = turn("When is the final exam?", "And what about the resits?");
        if let Some(Message::Tool { content, .. }) = messages.last_mut() {
            *content = english.to_owned();
        }
        let written = write_out_results(&mut messages, &ToolRegistry::new()).unwrap();
        assert_eq!(labels(&written), ["Exams › Resits", "Exams › Ordinary", "Office hours"]);
        for (first, then) in [
            ("¿Cuándo es el examen final?", "¿Y cuándo es la convocatoria extraordinaria del examen?"),
            ("¿Cuándo es el examen final?", "¿y el despacho?"),
            ("¿Cuándo es el examen final de la extraordinaria?", "¿y la extraordinaria?"),
        ] {
            let mut messages = turn(first, then);
            let written = write_out_results(&mut messages, &ToolRegistry::new()).unwrap();
            assert_eq!(labels(&written), search_order, "{then}");
        }
    }

    #[test]
    fn earlier_searches_are_left_out_and_everything_else_stays() {
        let search = r#"{"ok":true,"results":[{"content":"El examen final es el 20 de enero.","metadata":{"citation":"Guía"}}]}"#;
        let mut messages = vec![
            Message::system("Eres el tutor."),
            Message::user("¿Cuándo es el examen?"),
            calling("s1", "rag_search"),
            Message::tool("s1", "rag_search", search),
            Message::assistant("El 20 de enero [Guía]."),
            Message::user("Calcula 0.6 * 8 y busca la bibliografía"),
            // A local model numbers each step's calls from 1: the calculator's id is the
            // earlier search's.
            Message::Assistant {
                content: "Lo calculo y lo busco.".into(),
                tool_calls: vec![call("s1", "calculator"), call("s2", "rag_search")],
            },
            Message::tool("s1", "calculator", "4.8"),
            Message::tool("s2", "rag_search", search),
            Message::assistant("4.8."),
            // Words before a search call, then the answer; a turn that searched and never answered.
            Message::user("¿Y la revisión?"),
            Message::Assistant { content: "Lo busco.".into(), tool_calls: vec![call("s4", "rag_search")] },
            Message::tool("s4", "rag_search", search),
            Message::assistant("El 3 de febrero."),
            Message::user("¿Y las tutorías?"),
            calling("s5", "rag_search"),
            Message::tool("s5", "rag_search", search),
            Message::user("¿Dónde?"),
            Message::assistant("En el despacho 15."),
            Message::user("¿y la extraordinaria?"),
            calling("s3", "rag_search"),
            Message::tool("s3", "rag_search", search),
        ];
        without_earlier_searches(&mut messages);
        let shown: Vec<String> = messages
            .iter()
            .map(|m| match m {
                Message::Assistant { content, tool_calls } if !tool_calls.is_empty() => {
                    let names: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
                    format!("calls {names:?} {content}")
                }
                Message::Tool { tool_call_id, .. } => format!("result {tool_call_id}"),
                m => m.content().to_owned(),
            })
            .collect();
        assert_eq!(
            shown,
            [
                "Eres el tutor.",
                "¿Cuándo es el examen?",
                "El 20 de enero [Guía].",
                "Calcula 0.6 * 8 y busca la bibliografía",
                "calls [\"s1\"] Lo calculo y lo busco.",
                "result s1",
                "4.8.",
                "¿Y la revisión?",
                "Lo busco.\n\nEl 3 de febrero.",
                "¿Y las tutorías?\n\n¿Dónde?",
                "En el despacho 15.",
                "¿y la extraordinaria?",
                "calls [\"s3\"] ",
                "result s3",
            ]
        );
    }

    #[test]
    fn the_search_shape_is_told_alike_with_and_without_reading_it() {
        for (content, search) in [
            (r#"{"ok":true,"results":[{"content":"x","metadata":{"citation":"G"}}]}"#, true),
            (r#"{"results":[]}"#, true),
            (r#"{"results":"none"}"#, false),
            (r#"{"result":[1]}"#, false),
            (r#"[{"results":[]}]"#, false),
            ("4.8", false),
            ("error: the search failed", false),
        ] {
            assert_eq!(is_search_output(content), search, "{content}");
            assert_eq!(search_output(content).is_some(), search, "{content}");
        }
    }

    #[test]
    fn earlier_searches_take_no_room_in_a_grounded_window() {
        // Each search result ≈ 1,000 tokens at 4 characters a token; each turn's words a few.
        let passage = "El examen final es el 20 de enero y vale el 40 % de la nota. ".repeat(66);
        let search =
            serde_json::json!({"results": [{"content": passage, "metadata": {"citation": "Guía"}}]}).to_string();
        let mut messages = Vec::new();
        for (i, question) in ["¿Cuándo es el examen?", "¿Y la revisión?", "¿Y las tutorías?"].into_iter().enumerate()
        {
            let id = format!("s{i}");
            messages.push(Message::user(question));
            messages.push(calling(&id, "rag_search"));
            messages.push(Message::tool(&id, "rag_search", &search));
            messages.push(Message::assistant("El 20 de enero [Guía]."));
        }
        // The current turn's search is read (written out): it counts.
        messages.push(Message::user("¿y la extraordinaria?"));
        messages.push(calling("s9", "rag_search"));
        messages.push(Message::tool("s9", "rag_search", &search));
        let budget = 1_500;
        let plain = super::super::history_window(&messages, budget);
        let grounded = grounded_history_window(&messages, budget);
        assert_eq!(plain.len(), 3, "the plain window holds the current turn alone");
        assert_eq!(grounded.len(), messages.len(), "every earlier turn fits once its search costs nothing");
        // The current turn's result still counts: a budget it alone exceeds keeps that turn only.
        assert_eq!(grounded_history_window(&messages, 500).len(), 3);
        // A result that is no search (a calculation) still counts.
        let mut calculated = messages.clone();
        calculated[2] = Message::tool("s0", "calculator", &passage);
        assert_eq!(grounded_history_window(&calculated, budget).len(), messages.len() - 4);
        // A search result whose call is not before it stays in the request: it counts too.
        let mut orphan = messages.clone();
        orphan[1] = Message::assistant("");
        assert_eq!(grounded_history_window(&orphan, budget).len(), messages.len() - 4);
    }

    #[test]
    fn a_cited_tools_label_is_filled_from_its_call() {
        let args = serde_json::json!({"key": "sistema_de_evaluación", "n": 2});
        assert_eq!(cited_label("Guía docente › {key}", &args), "Guía docente › sistema_de_evaluación");
        assert_eq!(cited_label("Guía docente › {key}", &Value::Null), "Guía docente");
        assert_eq!(cited_label("{key} ({n})", &args), "sistema_de_evaluación (2)");
    }

    #[test]
    fn a_node_without_tools_reads_the_search_written_out_before_the_question() {
        let search = r#"{"ok":true,"results":[{"content":"El examen final es el 20 de enero.","metadata":{"citation":"Guía › Evaluación"}}]}"#;
        let mut messages = vec![
            Message::system("Eres el tutor."),
            Message::user("Hola"),
            Message::assistant("¡Hola!"),
            Message::user("¿Cuándo es el examen?"),
            calling("s1", "rag_search"),
            Message::tool("s1", "rag_search", search),
        ];
        write_out_results(&mut messages, &ToolRegistry::new());
        assert_eq!(messages.len(), 4, "the call and its result are written out: {messages:?}");
        assert_eq!(
            messages[3].content(),
            "Documents:\n[Guía › Evaluación] El examen final es el 20 de enero.\n\nQuestion: ¿Cuándo es el examen?\n\
             (Answer in Spanish, from the documents.)"
        );
        assert_eq!(messages[1].content(), "Hola", "earlier turns stay as they were");

        // The turn's other calls are written out too, under their tool's name: no call is left
        // for a model offered no tools to copy.
        let mut messages = vec![
            Message::user("¿Cuándo es el examen?"),
            calling("g1", "get_guia"),
            Message::tool("g1", "get_guia", r#"{"convocatoria_ordinaria":"20 de enero"}"#),
            calling("s1", "rag_search"),
            Message::tool("s1", "rag_search", search),
        ];
        write_out_results(&mut messages, &ToolRegistry::new());
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].content().contains(
                "Tool results:\n[get_guia] {\"convocatoria_ordinaria\":\"20 de enero\"}\n\nQuestion: ¿Cuándo es el examen?"
            ),
            "{}",
            messages[0].content()
        );
        // With no search in the turn, nothing is written out.
        let mut unsearched =
            vec![Message::user("3+3?"), calling("c1", "calculator"), Message::tool("c1", "calculator", "6")];
        write_out_results(&mut unsearched, &ToolRegistry::new());
        assert_eq!(unsearched.len(), 3);
    }

    #[test]
    fn only_a_turn_that_searched_abstains_and_earlier_passages_stay_citable() {
        let search = r#"{"ok":true,"results":[{"content":"El examen final es el 20 de enero.","metadata":{"citation":"Guía › Evaluación"}}]}"#;
        let history = vec![
            Message::user("¿Cuándo es el examen?"),
            Message::tool("r1", "rag_search", search),
            Message::assistant("El examen es el 20 de enero [Guía › Evaluación]."),
            Message::user("gracias"),
        ];
        let Checker { mut reply, abstention, required, .. } = checker(&history, "", &ToolRegistry::new());
        assert!(!required, "no search in this turn");
        reply.push("De nada. Recuerda: el 20 de enero. ");
        let (_, whole, report) = reply.finish(abstention, required);
        assert_eq!(whole, "De nada. Recuerda: el 20 de enero [Guía › Evaluación].");
        assert_eq!(report.cited, 1);
        let mut searched = history[..3].to_vec();
        searched.push(Message::user("¿y la extraordinaria?"));
        searched.push(Message::tool("r2", "rag_search", r#"{"ok":true,"results":[]}"#));
        let c = checker(&searched, "", &ToolRegistry::new());
        assert_eq!((c.abstention, c.required), (grounding::abstention("es"), true));
        searched.push(Message::tool("c1", "note_write", r#"{"ok":true,"path":"notes/examen.md"}"#));
        assert!(
            !checker(&searched, "", &ToolRegistry::new()).required,
            "a reply about a note written is not about the documents"
        );
    }

    /// A model whose prompts' likelihoods are set by the test: each tail's tokens get the first
    /// of `answer` with no documents before it, the second after the first passage only, the
    /// third after all of them; the requests are kept.
    struct Judging {
        answer: Option<(f32, f32, f32)>,
        asked: std::sync::Mutex<Vec<(ChatRequest, String)>>,
    }

    #[async_trait::async_trait]
    impl ChatModel for Judging {
        async fn stream(&self, _: ChatRequest) -> Result<toolgraph_llm::ChatStream, toolgraph_llm::LlmError> {
            Err(toolgraph_llm::LlmError::InvalidRequest("no replies here".into()))
        }

        async fn tail_logprobs(
            &self,
            request: ChatRequest,
            tail: &str,
        ) -> Result<Option<Vec<f32>>, toolgraph_llm::LlmError> {
            let last = request.messages.last().map_or("", Message::content);
            let (documents, all) = (last.starts_with(DOCUMENTS_HEAD), last.contains("Prácticas"));
            let answer = self.answer.map(|(alone, first, every)| {
                vec![
                    match (documents, all) {
                        (false, _) => alone,
                        (true, false) => first,
                        (true, true) => every,
                    };
                    4
                ]
            });
            self.asked.lock().unwrap().push((request, tail.to_owned()));
            Ok(answer)
        }

        fn model_id(&self) -> &str {
            "judging"
        }
    }

    #[tokio::test]
    async fn the_question_is_judged_after_the_first_passage_and_without_it_in_the_answers_own_prompt() {
        let search = r#"{"ok":true,"results":[{"content":"El examen final es el 20 de enero.","metadata":{"citation":"Guía › Evaluación"}},{"content":"Las prácticas valen un 30 %.","metadata":{"citation":"Guía › Prácticas"}}]}"#;
        let mut messages = vec![
            Message::system("Eres el tutor."),
            Message::user("Hola"),
            Message::assistant("¡Hola!"),
            Message::user("¿Cuándo es el examen final?"),
            calling("s1", "rag_search"),
            Message::tool("s1", "rag_search", search),
        ];
        let written = write_out_results(&mut messages, &ToolRegistry::new()).expect("the turn searched");
        let first =
            Passage { label: "Guía › Evaluación".into(), text: "El examen final es el 20 de enero.".into() };
        assert_eq!(written.first, Some(first));
        assert_eq!(written.question, "¿Cuándo es el examen final?");
        let request = ChatRequest::new(messages.clone());

        let model = Judging { answer: Some((-4.0, -1.5, -2.0)), asked: Default::default() };
        let gain = question_gain(&model, &request, &written).await;
        assert_eq!(gain, Some(2.5), "the mean per token after the first passage, less without it");
        let asked = model.asked.into_inner().unwrap();
        assert_eq!(asked.len(), 3);
        assert!(asked.iter().all(|(_, tail)| tail == "¿Cuándo es el examen final?"));
        // Without the documents, then after the first passage only: the system prompt and the
        // question, none of the history (an earlier answer would make a question asked again
        // likely by itself).
        let system_and = |last: &str| vec![Message::system("Eres el tutor."), Message::user(last)];
        assert_eq!(asked[0].0.messages, system_and("Question: ¿Cuándo es el examen final?"));
        assert_eq!(
            asked[1].0.messages,
            system_and(
                "Documents:\n[Guía › Evaluación] El examen final es el 20 de enero.\n\nQuestion: ¿Cuándo es el examen final?"
            )
        );
        assert_eq!(asked[2].0.messages[..3], messages[..3], "after all: the history as the answer has it");
        let answer = messages[3].content();
        let scored = asked[2].0.messages[3].content();
        assert!(
            scored.ends_with("\n\nQuestion: ¿Cuándo es el examen final?") && answer.starts_with(scored),
            "last, after all of them: the answer's own prompt up to the question\n{scored}\n{answer}"
        );
        // The passages together make it likelier than the first alone: that gain counts.
        let model = Judging { answer: Some((-4.0, -3.5, -1.0)), asked: Default::default() };
        assert_eq!(question_gain(&model, &request, &written).await, Some(3.0));

        // A model that cannot tell, a question too long to judge, nothing found: not judged.
        let blind = Judging { answer: None, asked: Default::default() };
        assert_eq!(question_gain(&blind, &request, &written).await, None);
        let asking = |question: &str| WrittenOut {
            first: written.first.clone(),
            documents: written.documents.clone(),
            question: question.to_owned(),
        };
        let model = Judging { answer: Some((-4.0, -1.5, -1.5)), asked: Default::default() };
        let long = asking(&"¿".repeat(MAX_JUDGED_QUESTION_BYTES));
        assert_eq!(question_gain(&model, &request, &long).await, None);
        let none = WrittenOut { first: None, ..asking(&written.question) };
        assert_eq!(question_gain(&model, &request, &none).await, None);
        // Asked in another language than the passage's: its words make no question likelier.
        let english = asking("When is the final exam?");
        assert_eq!(question_gain(&model, &request, &english).await, None);
        assert!(model.asked.into_inner().unwrap().is_empty(), "nothing asked of the model");
    }
}
