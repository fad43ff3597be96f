//! Grounding a reply in what was retrieved: which passage supports each sentence (it gets that
//! passage's `[label]`), which sentences state a fact no source holds (they are dropped), and
//! the reply that says the documents do not hold the answer when nothing in a reply is
//! supported (docs/retrieval.md, "Grounded answers").
//!
//! The check is lexical and deterministic, so it holds whatever model wrote the reply:
//! - A sentence's **facts** are its numbers (`20`, `40 %`, `0,6`, `10:30`), its months in
//!   any of several languages or as `1월` / `tháng 1` / `20/01`, and its names (capitalised
//!   words not opening the sentence); a day with its month (`20 de enero`, `1월 20일`) and an
//!   amount with its currency (`100 euros`) are facts too, besides their number and month
//!   ([`paired_facts`](super::paired_facts)). A fact is *held* by a text that has it too; numbers
//!   compare by value as written (`0,6` is `0.6`, `01` is `1`), months as their number.
//! - A sentence is **unsupported** when one of its facts is held by no source at all: not a
//!   passage, not another tool's result, not an earlier reply, not the person's own words nor
//!   the agent's instructions. It is dropped: a small model that fills a gap from memory ("el
//!   15 de octubre") states a date the documents do not hold.
//! - Otherwise it is **cited** to the passage that holds the most of its facts, then the most
//!   of its terms by weight (a sentence without facts: the passage that supports it by the
//!   shared [`attribution`](super::attribution) — stems, or syllable pairs in Vietnamese, each
//!   weighing more the fewer passages hold it); a passage its own `[label]` names stands unless
//!   another holds more of its facts, or as many and its terms clearly better (a sentence with
//!   facts that passage lacks names each other passage it draws on as well); **backed** when
//!   only other evidence holds it (a calculator's result, an earlier answer); else **plain** (a
//!   greeting, "claro", a sentence of no facts drawn from nowhere). The facts the person gave
//!   (or the instructions) count only when the sentence's own find it no source: repeating the
//!   person's "Repaso IV" makes no passage that names "IV" the source of "the note was saved".
//! - A reply in a turn that searched, with no sentence cited or backed, is not an answer
//!   from the documents: [`GroundedReply::finish`] replaces it with [`abstention`] in the
//!   person's language.
//!
//! Cross-language answers (a Korean reply from Spanish passages) share few words with their
//! passage but the same numbers and months, which is what carries them.

pub use super::attribution::fold_accent;
use super::attribution::{Attribution, Rules, SentenceTerms, TermSet};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A retrieved passage: the label it is cited by, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    /// `metadata.citation` of the search result ("Guía docente › Evaluación").
    pub label: String,
    /// The passage's text.
    pub text: String,
}

/// The passages of a search tool's output in the normalized result shape (`{results:
/// [{content, metadata: {citation}}]}`, docs/retrieval.md); none for any other output.
pub fn passages_in(output: &Value) -> Vec<Passage> {
    let results = output.get("results").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    results
        .iter()
        .filter_map(|r| {
            let text = r.get("content").and_then(Value::as_str)?;
            let label = r.pointer("/metadata/citation").and_then(Value::as_str).filter(|l| !l.trim().is_empty())?;
            Some(Passage { label: label.trim().to_owned(), text: text.to_owned() })
        })
        .collect()
}

/// What a text holds: its facts, its terms, and the names it may write.
#[derive(Debug, Default, Clone)]
struct Holdings {
    /// Its facts but names ([`facts`]).
    facts: HashSet<String>,
    /// Its terms (what a fact-free sentence shares; a passage's are in [`Sources::attribution`]).
    terms: TermSet,
    /// Every word, lowercased: any of them may be a name a sentence repeats.
    names: HashSet<String>,
    /// The lengths of the longer words by their first four letters, for names written in
    /// another language ("Infrastructure" for "Infraestructura").
    stems: HashMap<String, Vec<usize>>,
}

/// Names of this many letters or more match another language's spelling by [`Holdings::stems`].
const FUZZY_NAME_CHARS: usize = 6;

impl Holdings {
    /// A passage's facts and names (its terms are weighed against the other passages': the
    /// [`Attribution`] holds them).
    fn of_passage(text: &str) -> Self {
        let mut h = Self::default();
        h.add_facts(text);
        h
    }

    fn add(&mut self, text: &str) {
        self.add_facts(text);
        self.terms.add(text, &Rules::DEFAULT);
    }

    fn add_facts(&mut self, text: &str) {
        self.facts.extend(facts(text, true));
        for w in words_any_length(text) {
            let n = w.chars().count();
            if n >= FUZZY_NAME_CHARS {
                self.stems.entry(w.chars().take(4).collect()).or_default().push(n);
            }
            self.names.insert(w);
        }
    }

    /// Whether this text holds fact `f` (a key of [`facts`]).
    fn holds(&self, f: &str) -> bool {
        match f.strip_prefix("n:") {
            Some(name) => {
                let n = name.chars().count();
                self.names.contains(name)
                    || (n >= FUZZY_NAME_CHARS
                        && self
                            .stems
                            .get(&name.chars().take(4).collect::<String>())
                            .is_some_and(|lens| lens.iter().any(|l| l.abs_diff(n) <= 2)))
            }
            None => self.facts.contains(f) || self.holds_parts(f),
        }
    }

    /// Whether this text holds the parts of a date or an amount it does not write as one: the
    /// day and the month, the number and a currency. A range ("del 10 al 20 de diciembre"), a
    /// list or a table writes them apart; only a date or an amount made of two texts' parts
    /// (one passage's "20 de enero", another's "julio") is held by none.
    fn holds_parts(&self, f: &str) -> bool {
        if let Some(date) = f.strip_prefix("date:")
            && let Some((month, day)) = date.split_once('-')
        {
            return self.facts.contains(&format!("num:{day}")) && self.facts.contains(&format!("m:{month}"));
        }
        if let Some(amount) = f.strip_prefix("amount:") {
            return self.facts.contains(&format!("num:{amount}")) && self.facts.contains(super::paired_facts::CURRENCY);
        }
        false
    }
}

/// What a reply may draw on (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Sources {
    labels: Vec<String>,
    /// Each passage's facts and names.
    passages: Vec<Holdings>,
    /// Each passage's terms, weighed against the others'.
    attribution: Attribution,
    /// Other tools' results, earlier replies: back a sentence, are not cited.
    evidence: Holdings,
    /// The person's words and the agent's instructions: a fact there is not invented, but
    /// repeating it backs nothing.
    given: Holdings,
}

/// How a sentence stands against the [`Sources`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Supported by passage `i` (cite its label).
    Cited(usize),
    /// Supported by evidence that is not a passage.
    Backed,
    /// No facts, and drawn from nothing in particular.
    Plain,
    /// States these facts, which no source holds.
    Unsupported(Vec<String>),
}

impl Sources {
    /// Sources with these passages (cited by their labels).
    pub fn new(passages: &[Passage]) -> Self {
        let texts: Vec<String> = passages.iter().map(|p| format!("{} {}", p.label, p.text)).collect();
        Self {
            labels: passages.iter().map(|p| p.label.clone()).collect(),
            passages: texts.iter().map(|t| Holdings::of_passage(t)).collect(),
            attribution: Attribution::new(&texts, Rules::DEFAULT),
            ..Self::default()
        }
    }

    /// Adds evidence that backs a sentence without being cited: another tool's result, an
    /// earlier reply.
    pub fn add_evidence(&mut self, text: &str) {
        self.evidence.add(text);
    }

    /// Adds text whose facts are not invented when repeated but that backs nothing: the
    /// person's messages, the agent's instructions.
    pub fn add_given(&mut self, text: &str) {
        self.given.add(text);
    }

    /// How many passages there are.
    pub fn passage_count(&self) -> usize {
        self.labels.len()
    }

    /// Passage `i`'s label.
    pub fn label(&self, i: usize) -> &str {
        &self.labels[i]
    }

    /// The passage a `[label]` marker names, ignoring case and surrounding space.
    fn labelled(&self, marker: &str) -> Option<usize> {
        let m = marker.trim().to_lowercase();
        self.labels.iter().position(|l| l.to_lowercase() == m)
    }

    /// How `sentence` (without its markers) stands; `hinted`, a passage its own marker named,
    /// is taken when it holds the sentence at all, unless another clearly holds it instead.
    pub fn judge(&self, sentence: &str, hinted: Option<usize>) -> Verdict {
        let claimed = facts(sentence, false);
        let missing: Vec<String> = claimed
            .iter()
            .filter(|f| !self.passages.iter().any(|p| p.holds(f)) && !self.evidence.holds(f) && !self.given.holds(f))
            .map(|f| f.split_once(':').map_or(f.as_str(), |(_, v)| v).to_owned())
            .collect();
        if !missing.is_empty() {
            return Verdict::Unsupported(missing);
        }
        // A fact the person gave (or the instructions) shows no source to be the sentence's:
        // "the note 'Repaso IV' was saved" is the note tool's, though a passage names "IV" too.
        // The sentence is judged on its own facts first; when that leaves it drawn from nothing,
        // on all of them (a Korean "네, 1월 20일입니다" shares no word with its Spanish passage,
        // only the person's date).
        let own: Vec<String> = claimed.iter().filter(|f| !self.given.holds(f)).cloned().collect();
        let mine: SentenceTerms = self.attribution.terms(sentence);
        match self.attribute(&own, &claimed, &mine, hinted) {
            Verdict::Plain if own.len() < claimed.len() => self.attribute(&claimed, &claimed, &mine, hinted),
            verdict => verdict,
        }
    }

    /// The other passages a sentence cited to passage `cited` draws on: for each of its facts
    /// that passage does not hold (nor the person's words, other evidence, or a passage already
    /// named), the best-ranked passage that does — one under another label (the parts of a long
    /// section share theirs). "Las clases son los lunes en el aula 1.4 y las tutorías los martes
    /// en el despacho 15" takes one passage's day and room and another's. Names do not count:
    /// every passage holds each of its words as one, so a name the cited passage lacks ("IV")
    /// would name whichever passage happens to write it.
    pub fn also_drawn_on(&self, sentence: &str, cited: usize) -> Vec<usize> {
        let mut also: Vec<usize> = Vec::new();
        let named = |also: &[usize], f: &str| {
            self.passages.get(cited).is_some_and(|p| p.holds(f)) || also.iter().any(|&j| self.passages[j].holds(f))
        };
        for f in facts(sentence, false) {
            if f.starts_with("n:") || named(&also, &f) || self.given.holds(&f) || self.evidence.holds(&f) {
                continue;
            }
            let label = |j: usize| self.labels[j].as_str();
            if let Some(j) = self.passages.iter().position(|p| p.holds(&f))
                && self.labels.get(cited).is_none_or(|l| l != label(j))
                && !also.iter().any(|&k| label(k) == label(j))
            {
                also.push(j);
            }
        }
        also
    }

    /// The source of a sentence that states `claimed` (each held by some source) in the terms
    /// `mine`, judged by the facts `counted` of them: a passage, other evidence, or none
    /// ([`Verdict::Plain`]).
    fn attribute(
        &self,
        counted: &[String],
        claimed: &[String],
        mine: &SentenceTerms,
        hinted: Option<usize>,
    ) -> Verdict {
        let support = self.attribution.support(mine);
        let held = |h: &Holdings| counted.iter().filter(|f| h.holds(f)).count();
        // A sentence of the person's facts alone is judged by its terms, by a source that holds
        // one of those facts: words shared with a passage that lacks them are not its source.
        let may_hold = |h: &Holdings| !counted.is_empty() || claimed.is_empty() || claimed.iter().any(|f| h.holds(f));
        let supports = |h: &Holdings, shared: usize| {
            may_hold(h) && if counted.is_empty() { self.attribution.enough(shared, mine) } else { held(h) > 0 }
        };
        // Of the passages that support it, the one that holds the most facts, then the most of
        // the sentence's terms by weight; ties go to the better-ranked (earlier) passage.
        let mut best: Option<(usize, usize)> = None;
        for (i, p) in self.passages.iter().enumerate() {
            let facts = held(p);
            if supports(p, support[i].shared)
                && best.is_none_or(|(b, f)| (facts, support[i].weight) > (f, support[b].weight))
            {
                best = Some((i, facts));
            }
        }
        let rules = self.attribution.rules();
        let named_holds = |i: usize| {
            let p = &self.passages[i];
            held(p) > 0 || (may_hold(p) && support[i].shared >= rules.min_shared)
        };
        if let Some(named) = hinted.filter(|&i| named_holds(i)) {
            // The model's own marker, unless another passage clearly holds the sentence instead:
            // more of its facts, or as many and its terms over `overrule` times as heavily.
            let named_facts = held(&self.passages[named]);
            let overruled = best.filter(|&(i, f)| {
                i != named
                    && (f > named_facts
                        || (f == named_facts && support[i].weight > rules.overrule * support[named].weight))
            });
            return Verdict::Cited(overruled.map_or(named, |(i, _)| i));
        }
        // Another tool's result that holds more of the facts is the sentence's source ("saved
        // as notes/repaso-iv.md" is the note tool's, not a passage's that names the course).
        if let Some((i, f)) = best
            && f >= held(&self.evidence)
        {
            return Verdict::Cited(i);
        }
        if supports(&self.evidence, self.evidence.terms.shared(mine)) {
            return Verdict::Backed;
        }
        Verdict::Plain
    }
}

/// The months, as the `m:N` facts they are, by name in English, Spanish, French, Portuguese,
/// German and Italian.
const MONTHS: [&[&str]; 12] = [
    &["january", "enero", "janvier", "janeiro", "januar", "gennaio"],
    &["february", "febrero", "février", "fevereiro", "februar", "febbraio"],
    &["march", "marzo", "mars", "março", "märz"],
    &["april", "abril", "avril", "aprile"],
    &["may", "mayo", "mai", "maio", "maggio"],
    &["june", "junio", "juin", "junho", "juni", "giugno"],
    &["july", "julio", "juillet", "julho", "juli", "luglio"],
    &["august", "agosto", "août", "august"],
    &["september", "septiembre", "setiembre", "septembre", "setembro", "settembre"],
    &["october", "octubre", "octobre", "outubro", "oktober", "ottobre"],
    &["november", "noviembre", "novembre", "novembro"],
    &["december", "diciembre", "décembre", "dezembro", "dezember", "dicembre"],
];

/// Month and weekday names that are often something else: "may" (a verb), "mai" (Vietnamese
/// "tomorrow", a name), "segunda"… (Spanish and Portuguese ordinals).
pub(super) const AMBIGUOUS: [&str; 6] = ["may", "mai", "segunda", "quarta", "quinta", "sexta"];

pub(super) fn month_of(word: &str) -> Option<usize> {
    MONTHS.iter().position(|names| names.contains(&word)).map(|i| i + 1)
}

/// The days of the week, as the `d:N` facts they are (Monday first), by name in English,
/// Spanish, French, Portuguese, German and Italian (a plural "Tuesdays" too); Korean writes
/// them as one word (`화요일`).
const WEEKDAYS: [&[&str]; 7] = [
    &["monday", "lunes", "lundi", "segunda", "montag", "lunedì", "월요일"],
    &["tuesday", "martes", "mardi", "terça", "dienstag", "martedì", "화요일"],
    &["wednesday", "miércoles", "mercredi", "quarta", "mittwoch", "mercoledì", "수요일"],
    &["thursday", "jueves", "jeudi", "quinta", "donnerstag", "giovedì", "목요일"],
    &["friday", "viernes", "vendredi", "sexta", "freitag", "venerdì", "금요일"],
    &["saturday", "sábado", "samedi", "samstag", "sabato", "토요일"],
    &["sunday", "domingo", "dimanche", "sonntag", "domenica", "일요일"],
];

fn weekday_of(word: &str) -> Option<usize> {
    let singular = word.strip_suffix('s').filter(|w| w.ends_with("day")).unwrap_or(word);
    WEEKDAYS
        .iter()
        .position(|names| {
            // Korean writes what follows into the word ("화요일입니다").
            names.contains(&singular) || names.iter().any(|n| n.ends_with('일') && word.starts_with(n))
        })
        .map(|i| i + 1)
}

/// A number as written, by value: separators between digit groups of three are thousands
/// (`2.000` is `2000`), another `,` or `.` is the decimal point, `:` stays (a time), and
/// leading zeros go (`01` is `1`).
pub(super) fn number_key(raw: &str) -> String {
    let groups: Vec<&str> = raw.split(['.', ',']).collect();
    let thousands =
        groups.len() > 1 && groups[0] != "0" && groups[1..].iter().all(|g| g.len() == 3) && !raw.contains(':');
    let joined = if thousands { groups.concat() } else { raw.replace(',', ".") };
    let trimmed = joined.trim_start_matches('0');
    if trimmed.is_empty() || trimmed.starts_with(['.', ':']) { format!("0{trimmed}") } else { trimmed.to_owned() }
}

/// A decimal of more than three places rounded to one, two and three, trailing zeros gone.
fn rounded(key: &str) -> Vec<String> {
    let Some((_, decimals)) = key.split_once('.') else { return Vec::new() };
    let Ok(value) = key.parse::<f64>() else { return Vec::new() };
    if decimals.len() <= 3 {
        return Vec::new();
    }
    (1..=3)
        .map(|places| {
            let r = format!("{value:.places$}");
            let r = r.trim_end_matches('0').trim_end_matches('.');
            number_key(r)
        })
        .collect()
}

/// The facts of `text` as `num:…`, `m:…`, `d:…`, `n:…`, `date:…` and `amount:…` keys. A source
/// (`generous`) also holds the month of every `d/m` date it writes (and both readings of its
/// date), whether it names a currency, and each of its words as a name.
fn facts(text: &str, generous: bool) -> Vec<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut sentence_start = true;
    let mut previous_word = String::new();
    while i < chars.len() {
        let (at, c) = chars[i];
        if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len() {
                let d = chars[j].1;
                let joins = matches!(d, '.' | ',' | ':')
                    && j + 1 < chars.len()
                    && chars[j + 1].1.is_ascii_digit()
                    && j > i
                    && chars[j - 1].1.is_ascii_digit();
                if d.is_ascii_digit() || joins {
                    j += 1;
                } else {
                    break;
                }
            }
            let end = chars.get(j).map_or(text.len(), |(e, _)| *e);
            let raw = &text[at..end];
            let key = number_key(raw);
            let next = chars.get(j).map(|(_, c)| *c);
            // "1. …", "2) …": a list item's number claims nothing (a reply that is "6." does).
            let list_item = matches!(next, Some('.' | ')')) && chars[j + 1..].iter().any(|(_, c)| c.is_alphabetic());
            if !generous && sentence_start && list_item {
                sentence_start = false;
                i = j;
                continue;
            }
            if next == Some('월') || previous_word == "tháng" {
                out.push(format!("m:{key}"));
            } else {
                out.push(format!("num:{key}"));
                // A computed `7.3999999999999995` is the `7.4` a reply writes.
                if generous {
                    out.extend(rounded(&key).into_iter().map(|r| format!("num:{r}")));
                }
                // `20/01`: the month is January (a reply's digits after the slash claim nothing
                // else; a source holds both readings).
                if next == Some('/') {
                    let month: String =
                        chars[j + 1..].iter().map(|(_, c)| *c).take_while(char::is_ascii_digit).collect();
                    if let Ok(m) = month.parse::<usize>()
                        && (1..=12).contains(&m)
                    {
                        out.push(format!("m:{m}"));
                        if !generous {
                            i = j + 1 + month.len();
                            previous_word.clear();
                            sentence_start = false;
                            continue;
                        }
                    }
                }
            }
            previous_word.clear();
            sentence_start = false;
            i = j;
            continue;
        }
        if c.is_alphabetic() {
            let mut j = i;
            while j < chars.len() && (chars[j].1.is_alphanumeric()) && !chars[j].1.is_ascii_digit() {
                j += 1;
            }
            let end = chars.get(j).map_or(text.len(), |(e, _)| *e);
            let word = &text[at..end];
            let lower = word.to_lowercase();
            if let Some(m) = month_of(&lower) {
                // A word that is a month or a weekday only sometimes claims nothing in a reply.
                if generous || !AMBIGUOUS.contains(&lower.as_str()) {
                    out.push(format!("m:{m}"));
                }
            } else if let Some(d) = weekday_of(&lower) {
                if generous || !AMBIGUOUS.contains(&lower.as_str()) {
                    out.push(format!("d:{d}"));
                }
            } else if !generous
                && !sentence_start
                && word.chars().count() >= 2
                && word.chars().next().is_some_and(char::is_uppercase)
                && word.chars().all(|c| !is_bigram_script(c))
            {
                out.push(format!("n:{lower}"));
            }
            previous_word = lower;
            sentence_start = false;
            i = j;
            continue;
        }
        if matches!(
            c,
            '.' | '!' | '?' | '\n' | ':' | '¿' | '¡' | '"' | '\'' | '«' | '“' | '‘' | '(' | '-' | '*' | '•' | '#'
        ) {
            sentence_start = true;
        }
        i += 1;
    }
    out.extend(super::paired_facts::paired_facts(text, generous));
    out.sort_unstable();
    out.dedup();
    out
}

fn is_bigram_script(c: char) -> bool {
    matches!(c, '\u{AC00}'..='\u{D7A3}' | '\u{3040}'..='\u{30FF}' | '\u{4E00}'..='\u{9FFF}')
}

fn words_any_length(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

/// Whether the text between brackets may name a source: "[1, 2]", "[ ]" or "[sic]" are text, a
/// label has four letters or more.
pub fn looks_like_label(text: &str) -> bool {
    text.chars().filter(|c| c.is_alphabetic()).count() >= 4
}

/// `[label]` markers of `sentence` (not markdown links): the sentence without them, and the
/// first that names a passage.
fn strip_markers(sentence: &str, sources: &Sources) -> (String, Option<usize>) {
    let mut out = String::with_capacity(sentence.len());
    let mut hinted = None;
    let mut rest = sentence;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else { break };
        let label = &after[..close];
        let tail = &after[close + 1..];
        if tail.starts_with('(') || label.contains('[') || !looks_like_label(label) {
            out.push_str(&rest[..open + 1]);
            rest = after;
            continue;
        }
        out.push_str(rest[..open].trim_end_matches(' '));
        if hinted.is_none() {
            hinted = sources.labelled(label);
        }
        rest = tail;
    }
    out.push_str(rest);
    (out, hinted)
}

/// `sentence` with ` [label]` before its closing punctuation, its trailing space kept.
fn with_label(sentence: &str, label: &str) -> String {
    let body = sentence.trim_end();
    let space = &sentence[body.len()..];
    let cut = body.trim_end_matches(['.', '!', '?', '。', '…', ':', ';']);
    format!("{cut} [{label}]{}{space}", &body[cut.len()..])
}

/// What [`GroundedReply`] did to a reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroundingReport {
    /// Sentences cited to a passage.
    pub cited: usize,
    /// Sentences backed by other evidence.
    pub backed: usize,
    /// The dropped sentences, each with the facts no source held.
    pub dropped: Vec<(String, Vec<String>)>,
    /// Whether the reply was replaced by the abstention.
    pub abstained: bool,
}

/// A reply checked sentence by sentence as it streams (see the module docs): [`push`]
/// returns the text that may be shown now, [`finish`] the rest and the whole reply.
///
/// Sentences of no support are held back until one sentence is cited or backed (and then shown
/// with it), so a reply that turns out to stand on nothing was never shown and can be replaced
/// by the abstention.
///
/// [`push`]: GroundedReply::push
/// [`finish`]: GroundedReply::finish
#[derive(Debug)]
pub struct GroundedReply {
    sources: Sources,
    /// Text of the sentence not yet ended.
    partial: String,
    /// Plain sentences waiting for the first supported one.
    held: String,
    /// Everything released so far.
    shown: String,
    grounded: bool,
    in_code: bool,
    last_label: Option<usize>,
    /// Whether the model said, in a sentence of its own, that the documents do not hold it.
    said_not_found: bool,
    /// The passage that vouches for a reply no sentence of which is cited ([`vouch`]).
    ///
    /// [`vouch`]: GroundedReply::vouch
    vouched: Option<usize>,
    report: GroundingReport,
}

impl GroundedReply {
    /// A reply checked against `sources`.
    pub fn new(sources: Sources) -> Self {
        Self {
            sources,
            partial: String::new(),
            held: String::new(),
            shown: String::new(),
            grounded: false,
            in_code: false,
            last_label: None,
            said_not_found: false,
            vouched: None,
            report: GroundingReport::default(),
        }
    }

    /// The reply so far while no sentence of it is shown, dropped or a "cannot find it": the
    /// words [`finish`] would replace by the abstention, its open last sentence judged too.
    /// A reply in another language than its passages shares none of their terms, so its
    /// sentences without facts ("Yes, you can book office hours online.") stand on nothing
    /// here however right they are: its caller may put it in their language, judge that
    /// ([`source_of`]) and [`vouch`] for it.
    ///
    /// [`finish`]: GroundedReply::finish
    /// [`source_of`]: GroundedReply::source_of
    /// [`vouch`]: GroundedReply::vouch
    pub fn standing_on_nothing(&self) -> Option<String> {
        if self.grounded || self.in_code || self.said_not_found || !self.report.dropped.is_empty() {
            return None;
        }
        // The open sentence as `finish` will judge it: one cited, backed, dropped or a
        // "cannot find it" decides the reply by itself.
        let (last, hinted) = strip_markers(&self.partial, &self.sources);
        if !last.trim().is_empty() && (says_not_found(&last) || self.sources.judge(&last, hinted) != Verdict::Plain) {
            return None;
        }
        Some(format!("{}{last}", self.held)).filter(|t| !t.trim().is_empty())
    }

    /// The passage `text` — the reply put in the passages' language — is drawn from, judged as
    /// the reply's own sentences are: the source of its first cited sentence, when none of
    /// them states a fact no source holds.
    pub fn source_of(&self, text: &str) -> Option<usize> {
        let mut cited = None;
        for sentence in sentences(text) {
            let (bare, hinted) = strip_markers(sentence, &self.sources);
            match self.sources.judge(&bare, hinted) {
                Verdict::Unsupported(_) => return None,
                Verdict::Cited(i) => cited = cited.or(Some(i)),
                Verdict::Plain | Verdict::Backed => {}
            }
        }
        cited
    }

    /// Cites the reply to passage `passage` (by its place in the sources) when [`finish`] finds
    /// that it still stands on nothing — no sentence shown, dropped or a "cannot find it" —
    /// instead of replacing it by the abstention. An index past the passages is ignored.
    ///
    /// [`finish`]: GroundedReply::finish
    pub fn vouch(&mut self, passage: usize) {
        self.vouched = Some(passage).filter(|&i| i < self.sources.passage_count());
    }

    /// Adds streamed text; returns what may be shown now (empty while a sentence is open).
    pub fn push(&mut self, delta: &str) -> String {
        self.partial.push_str(delta);
        let mut released = String::new();
        while let Some(end) = sentence_end(&self.partial) {
            let sentence: String = self.partial.drain(..end).collect();
            released.push_str(&self.take(&sentence));
        }
        released
    }

    /// Ends the reply: what is still to be shown, and the whole reply as shown. A reply of which
    /// nothing was cited or backed becomes `abstention` when `required` (the turn searched and
    /// did nothing else), when the model said the documents do not hold it, and when every
    /// sentence was dropped: a reply is never left empty by the check.
    pub fn finish(mut self, abstention: &str, required: bool) -> (String, String, GroundingReport) {
        let rest = std::mem::take(&mut self.partial);
        // What `take` releases is in `shown` already.
        let mut released = if rest.trim().is_empty() { String::new() } else { self.take(&rest) };
        let vouched = self.vouched.filter(|_| {
            !self.grounded && !self.said_not_found && self.report.dropped.is_empty() && !self.held.trim().is_empty()
        });
        if let Some(passage) = vouched {
            // Its run of sentences carries the label once, on the first that has words (not a
            // blank line, nor a code fence the label would become the language of).
            let held = std::mem::take(&mut self.held);
            let worded = |s: &&str| !s.trim().is_empty() && !s.trim_start().starts_with("```");
            let mut labelled = false;
            released = String::new();
            for sentence in sentences(&held) {
                if worded(&sentence) {
                    self.report.cited += 1;
                    if !std::mem::replace(&mut labelled, true) {
                        released.push_str(&with_label(sentence, self.sources.label(passage)));
                        continue;
                    }
                }
                released.push_str(sentence);
            }
            self.shown.push_str(&released);
        } else if !self.grounded {
            // Nothing was shown yet: only what was held, or the abstention instead.
            let nothing_left = self.held.trim().is_empty() && !self.report.dropped.is_empty();
            released = if required || nothing_left || self.said_not_found {
                self.report.abstained = true;
                abstention.to_owned()
            } else {
                std::mem::take(&mut self.held)
            };
            self.shown.push_str(&released);
        }
        let whole = self.shown.trim_end().to_owned();
        // The tail to send: what is released, short of the trailing space the reply drops.
        let tail = released.len().saturating_sub(self.shown.len() - whole.len());
        (released[..tail].to_owned(), whole, self.report)
    }

    /// One ended sentence (with its trailing space): the text it releases.
    fn take(&mut self, sentence: &str) -> String {
        let fence = sentence.trim_start().starts_with("```");
        if fence || self.in_code {
            if fence {
                self.in_code = !self.in_code;
            }
            return self.release_plain(sentence);
        }
        let (bare, hinted) = strip_markers(sentence, &self.sources);
        if bare.trim().is_empty() {
            return self.release_plain(&bare);
        }
        if says_not_found(&bare) {
            // A small model copies the instruction's English words whatever the person's
            // language: the abstention, in theirs, stands for them.
            tracing::debug!(sentence = %bare.trim(), "the model said the documents do not hold it");
            self.said_not_found = true;
            return String::new();
        }
        match self.sources.judge(&bare, hinted) {
            Verdict::Unsupported(missing) => {
                tracing::debug!(sentence = %bare.trim(), ?missing, "dropped: a fact no source holds");
                self.report.dropped.push((bare.trim().to_owned(), missing));
                String::new()
            }
            Verdict::Plain => {
                self.last_label = None;
                self.release_plain(&bare)
            }
            Verdict::Backed => {
                self.report.backed += 1;
                self.last_label = None;
                self.release_grounded(&bare)
            }
            Verdict::Cited(i) => {
                self.report.cited += 1;
                // A run of sentences from one passage carries its label once, on the first; a
                // sentence that states other passages' facts too names each of them, its own
                // first, and the next sentence is labelled again (it follows other labels).
                let also = self.sources.also_drawn_on(&bare, i);
                let mut text = if self.last_label == Some(i) && also.is_empty() {
                    bare
                } else {
                    with_label(&bare, self.sources.label(i))
                };
                for j in &also {
                    text = with_label(&text, self.sources.label(*j));
                }
                self.last_label = also.is_empty().then_some(i);
                self.release_grounded(&text)
            }
        }
    }

    fn release_plain(&mut self, text: &str) -> String {
        if self.grounded {
            self.shown.push_str(text);
            text.to_owned()
        } else {
            self.held.push_str(text);
            String::new()
        }
    }

    fn release_grounded(&mut self, text: &str) -> String {
        self.grounded = true;
        let out = std::mem::take(&mut self.held) + text;
        self.shown.push_str(&out);
        out
    }
}

/// Where the first ended sentence of `text` ends (after its trailing whitespace): at a line
/// break, or at `.`, `!`, `?`, `。` or `…` followed by whitespace. `None` while none has ended
/// (the end of the text may be the middle of "3.5").
fn sentence_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let ends = match c {
            '\n' => true,
            // "1. Docker": a list item's number ends no sentence.
            '.' if text[..i].trim().chars().all(|d| d.is_ascii_digit()) && !text[..i].trim().is_empty() => false,
            '.' | '!' | '?' | '。' | '…' => chars.peek().is_some_and(|(_, n)| n.is_whitespace()) || c == '。',
            _ => false,
        };
        if ends {
            let mut end = i + c.len_utf8();
            while let Some(&(j, n)) = chars.peek() {
                if !n.is_whitespace() {
                    break;
                }
                end = j + n.len_utf8();
                chars.next();
            }
            return Some(end);
        }
    }
    None
}

/// The sentences of `text` as [`GroundedReply`] splits them (each with its trailing space).
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(end) = sentence_end(rest) {
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    if !rest.trim().is_empty() {
        out.push(rest);
    }
    out
}

/// The person's language, as far as the abstention needs it: `vi`, `ko`, `es` or `en`.
pub fn language_of(text: &str) -> &'static str {
    let detected = crate::Analyzer::detect(text);
    if detected != crate::Analyzer::English {
        return detected.code();
    }
    let ws = words_any_length(text);
    let count = |list: &[&str]| list.iter().filter(|w| ws.contains(**w)).count();
    if count(&SPANISH) > count(&ENGLISH) { "es" } else { "en" }
}

/// Whether `text` is plainly written in another language than `other`: [`language_of`] tells
/// them apart, and `text`'s own is told by its letters (Vietnamese's, Hangul, Spanish marks) or by
/// function words (more of one language's than of the other's) — a bare word ("julio",
/// "resits?") is no evidence, as [`language_of`] calls it English for want of any.
pub fn plainly_other_language(text: &str, other: &str) -> bool {
    plainly_not_in(text, language_of(other))
}

/// Whether `text` is plainly not written in `language` (a code [`language_of`] answers): see
/// [`plainly_other_language`].
pub fn plainly_not_in(text: &str, language: &str) -> bool {
    if language_of(text) == language {
        return false;
    }
    if crate::Analyzer::detect(text) != crate::Analyzer::English {
        return true;
    }
    let ws = words_any_length(text);
    let count = |list: &[&str]| list.iter().filter(|w| ws.contains(**w)).count();
    count(&SPANISH) != count(&ENGLISH) + count(&ENGLISH_MORE)
}

/// Spanish words that tell a sentence's language.
const SPANISH: [&str; 32] = [
    "el", "la", "los", "las", "es", "son", "de", "del", "y", "en", "una", "un", "para", "por", "con", "que", "cuando",
    "cuanto", "donde", "como", "quien", "cual", "hay", "se", "mi", "mis", "tu", "tus", "su", "sus", "al", "lo",
];
/// English words that tell a sentence's language.
const ENGLISH: [&str; 20] = [
    "the", "is", "are", "of", "and", "in", "a", "an", "for", "by", "with", "what", "when", "how", "who", "which",
    "where", "does", "do", "there",
];
/// More English words, only for [`plainly_not_in`]: short replies ("Yes, you can book
/// office hours online.") hold none of [`ENGLISH`]. Not for [`clearly_not_in`], where "i" and
/// "it" would take a command (`npm i`, `docker run -it`) for English.
const ENGLISH_MORE: [&str; 10] = ["yes", "you", "your", "i", "my", "it", "can", "to", "this", "that"];

/// Whether `reply` is plainly written in another language than `asked` (`ko` or `vi`), on
/// positive evidence only: letters enough to tell (12 or more), none of the asked language's
/// own (Hangul; Vietnamese's marked vowels), and an English or Spanish function word among its
/// words. A number, a short "Sai.", code or a Korean sentence full of product names is not.
pub fn clearly_not_in(asked: &str, reply: &str) -> bool {
    if reply.chars().filter(|c| c.is_alphabetic()).count() < 12 {
        return false;
    }
    let own = match asked {
        "ko" => reply.chars().any(crate::index::is_hangul),
        "vi" => reply.to_lowercase().chars().any(|c| crate::index::VIETNAMESE_LETTERS.contains(c)),
        _ => return false,
    };
    let ws = words_any_length(reply);
    !own && SPANISH.iter().chain(&ENGLISH).any(|w| ws.contains(*w))
}

/// The English name of a language [`language_of`] tells (`es` → "Spanish"), for a prompt.
pub fn language_name(code: &str) -> &'static str {
    match code {
        "es" => "Spanish",
        "vi" => "Vietnamese",
        "ko" => "Korean",
        _ => "English",
    }
}

/// What an agent says when the documents do not hold the answer, in `language` (`en`, `es`,
/// `vi` or `ko`; English for any other).
pub fn abstention(language: &str) -> &'static str {
    match language {
        "es" => "No encuentro esa información en los documentos que tengo.",
        "vi" => "Tôi không tìm thấy thông tin này trong các tài liệu hiện có.",
        "ko" => "제가 가진 문서에서 그 내용을 찾을 수 없습니다.",
        _ => "I can't find that in the documents I have.",
    }
}

/// Whether `sentence` says only that the documents do not hold the answer: the grounding
/// instruction's English words, which a small model copies, or the abstention in any language.
fn says_not_found(sentence: &str) -> bool {
    let words: Vec<String> = sentence
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let said = words.join(" ");
    matches!(
        said.as_str(),
        "cannot find it in the documents"
            | "i cannot find it in the documents"
            | "can't find it in the documents"
            | "i can't find it in the documents"
    ) || is_abstention(sentence.trim())
}

/// Whether `reply` is the abstention, in any language.
pub fn is_abstention(reply: &str) -> bool {
    ["en", "es", "vi", "ko"].iter().any(|l| reply.contains(abstention(l)))
}

/// Words that make a message conversation rather than a question: greetings, thanks,
/// farewells, assent, in the languages the agents here speak.
const SMALL_TALK: &[&str] = &[
    "hola",
    "hello",
    "hi",
    "hey",
    "gracias",
    "muchas",
    "thanks",
    "thank",
    "you",
    "ok",
    "okay",
    "vale",
    "adiós",
    "adios",
    "bye",
    "goodbye",
    "buenos",
    "buenas",
    "días",
    "dias",
    "tardes",
    "noches",
    "good",
    "morning",
    "afternoon",
    "evening",
    "night",
    "xin",
    "chào",
    "cảm",
    "ơn",
    "bạn",
    "nhiều",
    "tạm",
    "biệt",
    "안녕하세요",
    "안녕",
    "감사합니다",
    "고마워요",
    "고맙습니다",
    "감사해요",
    "merci",
    "bonjour",
    "salut",
    "obrigado",
    "obrigada",
    "olá",
    "danke",
    "hallo",
    "perfecto",
    "genial",
    "great",
    "cool",
    "nice",
    "de",
    "nada",
    "igualmente",
    "thx",
    "so",
    "much",
    "very",
    "a",
    "todos",
    "everyone",
    "there",
    "entendido",
    "understood",
    "got",
    "it",
    "sí",
    "si",
    "yes",
    "no",
    "vâng",
    "dạ",
    "네",
    "좋아요",
    "perfect",
    "excelente",
    "bien",
    "fine",
    "all",
    "the",
    "best",
    "saludos",
];

/// Whether `message` is conversation only (greetings, thanks, farewells): not a question to
/// search the documents for.
pub fn is_small_talk(message: &str) -> bool {
    let ws: Vec<String> =
        message.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    !ws.is_empty() && ws.len() <= 8 && ws.iter().all(|w| SMALL_TALK.contains(&w.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_in_another_language_only_on_plain_evidence() {
        assert!(clearly_not_in("ko", "The course has 6 ECTS credits."));
        assert!(clearly_not_in("vi", "El examen final es el 20 de enero."));
        // Numbers, short answers, Latin-heavy Korean and code are not judged.
        assert!(!clearly_not_in("ko", "6"));
        assert!(!clearly_not_in("ko", "20/01, 40 % (ECTS)"));
        assert!(!clearly_not_in("vi", "Sai."));
        assert!(!clearly_not_in("vi", "Không, theo Điều 8 thì không được."));
        assert!(!clearly_not_in("ko", "Kubernetes Deployment는 the replicas of a Pod를 관리합니다."));
        assert!(!clearly_not_in("ko", "docker run -p 8080:80 nginx"));
        assert!(!clearly_not_in("ko", "docker run -it ubuntu bash && npm i express"));
        assert!(!clearly_not_in("es", "The course has 6 ECTS credits."), "only Korean and Vietnamese are judged");
    }

    fn guide() -> Vec<Passage> {
        vec![
            Passage {
                label: "Guía IV › Evaluación › Convocatoria ordinaria".into(),
                text: "El examen final se celebra el 20 de enero y supone el 40 % de la nota final. Las prácticas \
                       valen el 60 %."
                    .into(),
            },
            Passage {
                label: "Guía IV › Profesorado".into(),
                text: "Profesor: Juan Julián Merelo Guervós. Tutorías los martes de 10:30 a 12:30 en el despacho 24."
                    .into(),
            },
        ]
    }

    fn run(reply: &str, sources: Sources, pieces: usize, required: bool) -> (String, String, GroundingReport) {
        let mut g = GroundedReply::new(sources);
        let mut streamed = String::new();
        let chars: Vec<char> = reply.chars().collect();
        for piece in chars.chunks(pieces) {
            streamed.push_str(&g.push(&piece.iter().collect::<String>()));
        }
        let (rest, whole, report) = g.finish(abstention("es"), required);
        streamed.push_str(&rest);
        (streamed, whole, report)
    }

    #[test]
    fn a_reply_that_stands_on_nothing_is_cited_only_when_vouched_for_and_still_clean() {
        let english = "Yes, the final exam is in person. You need to bring your student card.";
        let streamed_in = |g: &mut GroundedReply| {
            let mut streamed = String::new();
            for piece in english.split_inclusive(' ') {
                streamed.push_str(&g.push(piece));
            }
            streamed
        };
        // Not a word of the Spanish passages: nothing is shown while it streams, and it is the
        // reply so far, its last sentence still open.
        let mut g = GroundedReply::new(Sources::new(&guide()));
        assert_eq!(streamed_in(&mut g), "");
        assert_eq!(g.standing_on_nothing().as_deref(), Some(english));
        // Its words in the passages' language are judged as a Spanish reply is.
        assert_eq!(g.source_of("Sí, el examen final se celebra en persona."), Some(0));
        assert_eq!(g.source_of("Sí, hay aparcamiento en el campus."), None, "no passage's words");
        assert_eq!(g.source_of("Sí, el examen final es el 15 de octubre."), None, "a fact no passage holds");
        g.vouch(0);
        let (rest, whole, report) = g.finish(abstention("en"), true);
        assert_eq!(
            whole,
            "Yes, the final exam is in person [Guía IV › Evaluación › Convocatoria ordinaria]. You need to bring your student card."
        );
        assert_eq!(rest, whole, "the whole reply is released at its end");
        assert_eq!((report.cited, report.abstained), (2, false), "{report:?}");
        // A reply that opens on a blank line carries the label on its first sentence.
        let mut g = GroundedReply::new(Sources::new(&guide()));
        g.push("\n\nYes, the final exam is in person.");
        g.vouch(0);
        let (_, whole, report) = g.finish(abstention("en"), true);
        assert_eq!(whole, "\n\nYes, the final exam is in person [Guía IV › Evaluación › Convocatoria ordinaria].");
        assert_eq!(report.cited, 1);
        // Without a vouch, or vouched by a passage there is not, it is the abstention.
        for vouched in [None, Some(7)] {
            let mut g = GroundedReply::new(Sources::new(&guide()));
            streamed_in(&mut g);
            if let Some(i) = vouched {
                g.vouch(i);
            }
            let (_, whole, report) = g.finish(abstention("en"), true);
            assert_eq!((whole.as_str(), report.abstained), (abstention("en"), true), "{vouched:?}");
        }
        // A vouch does not save a reply whose last sentence states a fact no source holds, nor one
        // that says the documents do not hold it.
        for last in [" The resit is on 3 March.", " I cannot find it in the documents."] {
            let mut g = GroundedReply::new(Sources::new(&guide()));
            g.push("Yes, the final exam is in person.");
            assert!(g.standing_on_nothing().is_some());
            g.push(last);
            g.vouch(0);
            let (_, whole, report) = g.finish(abstention("en"), true);
            assert_eq!((whole.as_str(), report.abstained), (abstention("en"), true), "{last}");
        }
        // An open last sentence its own facts cite decides the reply: nothing to vouch for.
        let mut g = GroundedReply::new(Sources::new(&guide()));
        g.push("The final exam is on 20 January");
        assert_eq!(g.standing_on_nothing(), None);
        // Once a sentence is shown, dropped or a "cannot find it", nothing stands on nothing.
        for first in [
            "El examen final es el 20 de enero. ",
            "El examen es el 15 de octubre. ",
            "I cannot find it in the documents. ",
        ] {
            let mut g = GroundedReply::new(Sources::new(&guide()));
            g.push(first);
            g.push("Yes, in person");
            assert_eq!(g.standing_on_nothing(), None, "{first}");
        }
    }

    #[test]
    fn a_language_is_plainly_another_only_on_evidence() {
        assert!(plainly_other_language("Who teaches the course?", "¿y la extraordinaria?"));
        assert!(plainly_other_language("시험은 언제예요?", "¿Cuándo es el examen?"));
        assert!(plainly_other_language("Còn thi lại thì sao?", "When is the exam?"));
        assert!(plainly_other_language("y la de julio", "When is the exam?"));
        // The same language, or a word that tells none.
        assert!(!plainly_other_language("¿y la extraordinaria?", "¿Cuándo es el examen?"));
        assert!(!plainly_other_language("resits?", "¿Cuándo es el examen?"));
        assert!(!plainly_other_language("Docker", "시험은 언제예요?"));
    }

    #[test]
    fn the_instructions_english_words_for_not_found_become_the_abstention_in_the_persons_language() {
        for pieces in [1, 4, 200] {
            // A turn that also called another tool: no abstention is required, yet the model
            // said it.
            let (streamed, whole, report) =
                run("Cannot find it in the documents.", Sources::new(&guide()), pieces, false);
            assert_eq!(whole, abstention("es"), "pieces of {pieces}");
            assert_eq!(streamed.trim_end(), whole);
            assert!(report.abstained);
        }
        // Beside a supported sentence, the words are only dropped.
        let reply = "El examen final es el 20 de enero. I cannot find it in the documents.";
        let (_, whole, report) = run(reply, Sources::new(&guide()), 3, true);
        assert_eq!(whole, "El examen final es el 20 de enero [Guía IV › Evaluación › Convocatoria ordinaria].");
        assert!(!report.abstained);
        // Words that only look alike are judged as usual.
        assert!(!says_not_found("I cannot find it in the documents, but the guide lists two exams."));
        assert!(says_not_found("No encuentro esa información en los documentos que tengo."));
    }

    #[test]
    fn a_supported_sentence_is_cited_and_an_invented_date_is_dropped() {
        let reply = "El examen final es el 20 de enero y vale el 40 % de la nota. La revisión es el 15 de octubre.";
        for pieces in [1, 3, 200] {
            let (streamed, whole, report) = run(reply, Sources::new(&guide()), pieces, true);
            assert_eq!(
                whole,
                "El examen final es el 20 de enero y vale el 40 % de la nota [Guía IV › Evaluación › Convocatoria ordinaria]."
            );
            assert_eq!(streamed.trim_end(), whole, "what streams is what is kept (pieces of {pieces})");
            assert_eq!(report.cited, 1);
            assert_eq!(report.dropped.len(), 1, "{report:?}");
            assert!(report.dropped[0].1.contains(&"15".to_owned()) && report.dropped[0].1.contains(&"10".to_owned()));
            assert!(!report.abstained);
        }
    }

    #[test]
    fn a_reply_that_stands_on_nothing_becomes_the_abstention_in_the_persons_language() {
        let (streamed, whole, report) = run(
            "Docker es una herramienta de contenedores muy popular. El examen es el 3 de marzo.",
            Sources::new(&guide()),
            4,
            true,
        );
        assert_eq!(whole, "No encuentro esa información en los documentos que tengo.");
        assert_eq!(streamed, whole, "nothing of the reply was shown before the abstention");
        assert!(report.abstained && is_abstention(&whole));
        // Without an abstention (a greeting turn), a plain reply is shown as it is.
        let (_, whole, report) = run("¡Hola! ¿En qué puedo ayudarte?", Sources::new(&guide()), 2, false);
        assert_eq!(whole, "¡Hola! ¿En qué puedo ayudarte?");
        assert!(!report.abstained);
        // Nor is a reply left empty: one whose every sentence was dropped says it cannot find it.
        let (_, whole, report) = run("Vale 7,5 puntos.", Sources::new(&guide()), 3, false);
        assert_eq!((whole.as_str(), report.abstained), (abstention("es"), true));
        assert_eq!(language_of("¿Qué es docker y cuándo es el examen?"), "es");
    }

    #[test]
    fn numbers_months_and_names_compare_by_value_across_languages() {
        let sources = Sources::new(&guide());
        // Korean: months as 1월, the passage writes "enero".
        assert_eq!(sources.judge("기말 시험은 1월 20일이며 성적의 40%입니다.", None), Verdict::Cited(0));
        assert_eq!(sources.judge("Kỳ thi cuối kỳ vào ngày 20 tháng 1.", None), Verdict::Cited(0));
        assert_eq!(sources.judge("Las tutorías son los martes de 10:30 a 12:30.", None), Verdict::Cited(1));
        assert_eq!(
            sources.judge("El profesor es Pedro Castillo.", None),
            Verdict::Unsupported(vec!["castillo".into(), "pedro".into()])
        );
        assert_eq!(sources.judge("El profesor es Juan Julián Merelo.", None), Verdict::Cited(1));
        assert_eq!(
            sources.judge("The exam is on 21 January.", None),
            Verdict::Unsupported(vec!["1-21".into(), "21".into()])
        );
        // A day moved to a month another passage names is a date no source holds, and a
        // percentage is no price.
        let mut resit = guide();
        resit.push(Passage {
            label: "Guía IV › Evaluación › Convocatoria extraordinaria".into(),
            text: "Quien no supere la ordinaria puede presentarse a un examen en julio que vale el 100 %.".into(),
        });
        let sources = Sources::new(&resit);
        assert_eq!(sources.judge("La extraordinaria es en julio.", None), Verdict::Cited(2));
        assert_eq!(
            sources.judge("La extraordinaria es el 20 de julio.", None),
            Verdict::Unsupported(vec!["7-20".into()])
        );
        assert_eq!(sources.judge("기말 시험은 7월 20일입니다.", None), Verdict::Unsupported(vec!["7-20".into()]));
        assert_eq!(sources.judge("La matrícula cuesta 100 euros.", None), Verdict::Unsupported(vec!["100".into()]));
        assert_eq!(sources.judge("El examen vale el 100 %.", None), Verdict::Cited(2));
        // A date or an amount a passage writes in a range, a list or a table holds its parts.
        let mut guide = guide();
        guide.push(Passage {
            label: "Guía IV › Entregas".into(),
            text:
                "Plazo de entrega: del 10 al 20 de diciembre. Tasas: entre 300 y 600 euros.\n| Revisión | 27 | enero |"
                    .into(),
        });
        let sources = Sources::new(&guide);
        for held in
            ["El plazo empieza el 10 de diciembre.", "Cuesta al menos 300 euros.", "La revisión es el 27 de enero."]
        {
            assert_eq!(sources.judge(held, None), Verdict::Cited(2), "{held}");
        }
        // "may" in a reply is no month, in a date either: "20 may" claims no 20th of May.
        assert_eq!(sources.judge("Students who get less than 20 may not pass.", None), Verdict::Cited(0));
        // Weekdays by name in any of the languages: "Tuesdays" is "los martes".
        assert_eq!(sources.judge("Office hours are on Tuesdays from 10:30 to 12:30.", None), Verdict::Cited(1));
        assert_eq!(sources.judge("Office hours are on Fridays.", None), Verdict::Unsupported(vec!["5".into()]));
        assert_eq!(sources.judge("상담 시간은 화요일입니다.", None), Verdict::Cited(1));
        assert_eq!(number_key("2.000"), "2000");
        assert_eq!(number_key("0,6"), "0.6");
        assert_eq!(number_key("01"), "1");
        assert_eq!(number_key("7.40"), "7.40");
        assert_eq!(number_key("0,600"), "0.600", "a leading 0 is no thousands");
        assert_eq!(sources.judge("El examen es el 20/01.", None), Verdict::Cited(0), "20/01 is the 20th of January");
        assert_eq!(sources.judge("Nos vemos en la segunda convocatoria.", None), Verdict::Plain);
        // A reply that is only the number states it.
        assert_eq!(sources.judge("24.", None), Verdict::Cited(1));
        assert_eq!(sources.judge("7.", None), Verdict::Unsupported(vec!["7".into()]));
    }

    #[test]
    fn other_evidence_backs_without_a_citation_and_the_persons_numbers_are_not_invented() {
        let mut sources = Sources::new(&guide());
        sources.add_evidence(r#"{"ok": true, "expression": "0.6 * 8 + 0.4 * 6.5", "result": 7.3999999999999995}"#);
        sources.add_given("Calcula mi nota final: 0.6 * 8 + 0.4 * 6.5");
        let (_, whole, report) = run("Tu nota final es 7,4 (0.6 × 8 + 0.4 × 6.5).", sources, 5, true);
        assert_eq!(whole, "Tu nota final es 7,4 (0.6 × 8 + 0.4 × 6.5).");
        assert_eq!((report.backed, report.cited, report.abstained), (1, 0, false));
    }

    #[test]
    fn a_fact_the_person_gave_makes_no_passage_the_source() {
        let datos = Passage {
            label: "Guía IV › Datos de la asignatura".into(),
            text: "Infraestructura Virtual (IV) es una asignatura optativa de 6 créditos ECTS.".into(),
        };
        let mut sources = Sources::new(&[datos]);
        sources.add_evidence(r#"{"ok": true, "path": "notes/repaso-iv.md", "characters": 42}"#);
        sources.add_given("Guarda una nota titulada 'Repaso IV' con el texto 'Examen final el 20 de enero.'");
        // "IV" is the person's, and the passage's too: the sentence is the note tool's.
        let saved = "La nota 'Repaso IV' ha sido guardada en notes/repaso-iv.md.";
        assert_eq!(sources.judge(saved, None), Verdict::Backed);
        // What the passage holds and the person did not say still cites it.
        assert_eq!(sources.judge("IV tiene 6 créditos ECTS.", None), Verdict::Cited(0));
        // The person's facts in the passage's words: cited by its terms.
        assert_eq!(sources.judge("Infraestructura Virtual (IV) es una asignatura optativa.", None), Verdict::Cited(0));
        // A reply that shares no word with its passage, only the person's date: cited by it
        // all the same (drawn from nothing else).
        let mut korean = Sources::new(&guide());
        korean.add_given("기말 시험은 1월 20일인가요?");
        assert_eq!(korean.judge("네, 1월 20일입니다.", None), Verdict::Cited(0));
        // The person's name again, in a passage's words, where no passage holds the name: drawn
        // from nothing there (a held-out question answered from its neighbour's words).
        let mut elsewhere = Sources::new(&guide());
        elsewhere.add_given("¿Qué dijo Sánchez del examen?");
        let echoed = "Según Sánchez, el examen final supone parte de la nota final.";
        assert_eq!(elsewhere.judge(echoed, None), Verdict::Plain);
    }

    #[test]
    fn markers_naming_no_passage_are_removed_and_a_right_one_is_kept() {
        let (_, whole, _) = run(
            "Las prácticas valen el 60 % [Guía IV › Evaluación › Convocatoria ordinaria]. Tutorías los martes [Wikipedia].",
            Sources::new(&guide()),
            7,
            false,
        );
        assert_eq!(
            whole,
            "Las prácticas valen el 60 % [Guía IV › Evaluación › Convocatoria ordinaria]. Tutorías los martes [Guía IV › Profesorado]."
        );
    }

    #[test]
    fn a_sentence_drawing_on_two_passages_names_both() {
        let mut passages = guide();
        passages.push(Passage {
            label: "Guía IV › Datos".into(),
            text: "Las clases de teoría son los lunes de 9:30 a 11:30 en el aula 1.4.".into(),
        });
        let reply = "Las clases son los lunes en el aula 1.4 y las tutorías los martes en el despacho 24. Hola.";
        let (streamed, whole, report) = run(reply, Sources::new(&passages), 4, true);
        assert_eq!(streamed, whole);
        let (first, rest) = whole.split_once(". ").unwrap();
        for label in ["[Guía IV › Datos]", "[Guía IV › Profesorado]"] {
            assert!(first.contains(label), "{whole}");
        }
        assert!(!first.contains("Evaluación"), "{whole}");
        assert_eq!(rest, "Hola.");
        assert_eq!(report.cited, 1);
        // One passage's facts alone: its label only.
        let (_, whole, _) = run("Las clases son los lunes en el aula 1.4.", Sources::new(&passages), 4, true);
        assert_eq!(whole, "Las clases son los lunes en el aula 1.4 [Guía IV › Datos].");
        // After a sentence of its own passage, one that draws on another too names both, and the
        // next of the first passage is labelled again.
        let reply =
            "Las clases son los lunes. Son en el aula 1.4, y las tutorías en el despacho 24. Empiezan a las 9:30.";
        let (_, whole, _) = run(reply, Sources::new(&passages), 4, true);
        assert_eq!(
            whole,
            "Las clases son los lunes [Guía IV › Datos]. Son en el aula 1.4, y las tutorías en el despacho 24 \
             [Guía IV › Profesorado] [Guía IV › Datos]. Empiezan a las 9:30 [Guía IV › Datos]."
        );
        // A name the cited passage lacks names no other passage ("Merelo" is only the
        // professor's, and every passage holds its words as names).
        let (_, whole, _) = run("Las clases de Merelo son los lunes en el aula 1.4.", Sources::new(&passages), 4, true);
        assert_eq!(whole, "Las clases de Merelo son los lunes en el aula 1.4 [Guía IV › Datos].");
    }

    #[test]
    fn a_marker_naming_a_passage_stands_unless_another_holds_more_of_the_sentences_facts() {
        let sources = Sources::new(&guide());
        let profesorado = Some(1);
        // The model named the teachers' section for the exam's date, which the evaluation holds.
        let misnamed = "El profesor de tutorías pone el examen final el 20 de enero.";
        assert_eq!(sources.judge(misnamed, profesorado), Verdict::Cited(0));
        // A sentence the named section holds as well as any other keeps its marker.
        assert_eq!(sources.judge("El profesor atiende tutorías en su despacho.", profesorado), Verdict::Cited(1));
        assert_eq!(sources.judge("El profesor atiende tutorías en su despacho.", None), Verdict::Cited(1));
    }

    #[test]
    fn the_passage_that_supports_a_sentence_is_its_source_though_another_holds_a_rarer_word() {
        let passage = |label: &str, text: &str| Passage { label: label.into(), text: text.into() };
        // "kubernetes" is in one passage, which holds nothing else of the sentence: it weighs more
        // than the two words four others share with it, and supports nothing alone.
        let mut passages = vec![passage("Tema 3 › Orquestación", "Kubernetes orquesta clústeres.")];
        for n in 1..=4 {
            passages.push(passage(&format!("Tema 1 › Parte {n}"), "Docker despliega contenedores."));
        }
        assert_eq!(Sources::new(&passages).judge("Kubernetes despliega contenedores.", None), Verdict::Cited(1));
    }

    #[test]
    fn a_vietnamese_sentence_is_attributed_by_its_syllable_pairs() {
        let law = vec![
            Passage {
                label: "Điều 45, Luật Điện ảnh".into(),
                text: "Chính phủ thống nhất quản lý nhà nước về điện ảnh.".into(),
            },
            Passage {
                label: "Điều 39, Luật Du lịch".into(),
                text: "Hợp đồng lữ hành phải được lập thành văn bản.".into(),
            },
        ];
        let sources = Sources::new(&law);
        assert_eq!(sources.judge("Hợp đồng lữ hành phải lập thành văn bản.", None), Verdict::Cited(1));
        // Syllables each passage has, in no pair either has ("nhà hành", "văn nước"): no source.
        assert_eq!(sources.judge("Nhà hành văn nước.", None), Verdict::Plain);
    }

    #[test]
    fn a_numbered_list_keeps_its_numbers_and_brackets_that_name_nothing_stay() {
        let reply = "Hay dos partes:\n1. Las prácticas valen el 60 %.\n2. El examen vale el 40 % [x].";
        let (_, whole, report) = run(reply, Sources::new(&guide()), 4, true);
        assert_eq!(
            whole,
            "Hay dos partes:\n1. Las prácticas valen el 60 % [Guía IV › Evaluación › Convocatoria ordinaria].\n2. El examen vale el 40 % [x]."
        );
        assert!(report.dropped.is_empty(), "{report:?}");
    }

    #[test]
    fn code_blocks_pass_as_they_are_and_a_decimal_point_ends_no_sentence() {
        let reply = "Las prácticas valen el 60 %.\n```\ndocker run -p 8080:80 nginx:1.25\n```\nNota 7.5 no aparece.";
        let (_, whole, report) = run(reply, Sources::new(&guide()), 3, false);
        assert!(whole.contains("docker run -p 8080:80 nginx:1.25"), "{whole}");
        assert!(!whole.contains("7.5"), "{whole}");
        assert_eq!(report.dropped.len(), 1, "{report:?}");
    }

    #[test]
    fn greetings_and_thanks_are_small_talk_and_questions_are_not() {
        for m in ["Hola", "¡Muchas gracias!", "thanks!", "Xin chào", "안녕하세요", "ok, gracias"] {
            assert!(is_small_talk(m), "{m}");
        }
        for m in ["¿y la extraordinaria?", "hola, ¿cuándo es el examen?", "What is the capital?", ""] {
            assert!(!is_small_talk(m), "{m}");
        }
        assert_eq!(language_of("cuando es el examen final"), "es");
        // No accent and no article: "mi" tells it ("Calcula mi nota final: 0.6 * 8 + 0.4 * 6.5").
        assert_eq!(language_of("Calcula mi nota final: 0.6 * 8 + 0.4 * 6.5"), "es");
        assert_eq!(language_of("When is the final exam?"), "en");
        assert_eq!(language_of("Khi nào thi cuối kỳ?"), "vi");
        assert_eq!(language_of("기말 시험은 언제예요?"), "ko");
    }

    #[test]
    fn passages_are_read_from_the_normalized_search_shape() {
        let found = serde_json::json!({"ok": true, "results": [
            {"content": "a", "metadata": {"citation": " Guía › Evaluación "}, "score": 0.5},
            {"content": "b", "metadata": {}},
        ]});
        assert_eq!(passages_in(&found), vec![Passage { label: "Guía › Evaluación".into(), text: "a".into() }]);
        assert!(passages_in(&serde_json::json!({"result": 7})).is_empty());
    }
}
