//! BEIR-layout evaluation sets: `corpus.jsonl(.gz)`, `queries.jsonl`, `qrels/test.tsv`.

use crate::RagError;
use serde::Deserialize;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// A corpus document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Document {
    /// Document id.
    #[serde(rename = "_id")]
    pub id: String,
    /// Title (may be empty).
    #[serde(default)]
    pub title: String,
    /// Text.
    #[serde(default)]
    pub text: String,
}

#[derive(Deserialize)]
struct Query {
    #[serde(rename = "_id")]
    id: String,
    text: String,
}

/// A loaded evaluation set.
#[derive(Debug, Default)]
pub struct BeirDataset {
    /// Documents.
    pub corpus: Vec<Document>,
    /// Queries by id, in file order.
    pub queries: Vec<(String, String)>,
    /// Relevance judgments: query id → document id → grade.
    pub qrels: HashMap<String, HashMap<String, u32>>,
}

impl BeirDataset {
    /// A smaller set for quick evaluations: the first `queries` judged queries, every document
    /// judged for them, and `distractors` other documents spread evenly over the corpus (the
    /// same ones on every run).
    pub fn sub_corpus(&self, queries: usize, distractors: usize) -> BeirDataset {
        let kept: Vec<(String, String)> =
            self.queries.iter().filter(|(id, _)| self.qrels.contains_key(id)).take(queries).cloned().collect();
        let gold: std::collections::HashSet<&str> =
            kept.iter().flat_map(|(id, _)| self.qrels[id].keys().map(String::as_str)).collect();
        let others: Vec<&Document> = self.corpus.iter().filter(|d| !gold.contains(d.id.as_str())).collect();
        let stride = (others.len() / distractors.max(1)).max(1);
        let picked: std::collections::HashSet<&str> =
            others.iter().step_by(stride).take(distractors).map(|d| d.id.as_str()).collect();
        let corpus = self
            .corpus
            .iter()
            .filter(|d| gold.contains(d.id.as_str()) || picked.contains(d.id.as_str()))
            .cloned()
            .collect();
        let qrels = kept.iter().map(|(id, _)| (id.clone(), self.qrels[id].clone())).collect();
        BeirDataset { corpus, queries: kept, qrels }
    }
}

fn open(path: &Path) -> Result<Box<dyn BufRead>, RagError> {
    let file = std::fs::File::open(path)
        .map_err(|e| RagError::Io { path: path.display().to_string(), reason: e.to_string() })?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    Ok(Box::new(BufReader::new(reader)))
}

fn lines(path: &Path) -> Result<Vec<(usize, String)>, RagError> {
    let mut out = Vec::new();
    for (i, line) in open(path)?.lines().enumerate() {
        let line = line.map_err(|e| RagError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        if !line.trim().is_empty() {
            out.push((i + 1, line));
        }
    }
    Ok(out)
}

impl BeirDataset {
    /// Loads `dir` (`corpus.jsonl` or `corpus.jsonl.gz`, `queries.jsonl`, `qrels/test.tsv`);
    /// only queries with judgments are kept.
    ///
    /// # Errors
    /// A missing file or a malformed line, named with its path and line number.
    pub fn load(dir: &Path) -> Result<Self, RagError> {
        let corpus_path = [dir.join("corpus.jsonl"), dir.join("corpus.jsonl.gz")]
            .into_iter()
            .find(|p| p.is_file())
            .unwrap_or(dir.join("corpus.jsonl"));
        let parse_err = |path: &Path, line: usize, e: serde_json::Error| RagError::Format {
            path: path.display().to_string(),
            line,
            reason: e.to_string(),
        };
        let mut ds = Self::default();
        for (n, line) in lines(&corpus_path)? {
            ds.corpus.push(serde_json::from_str(&line).map_err(|e| parse_err(&corpus_path, n, e))?);
        }
        let qrels_path = dir.join("qrels").join("test.tsv");
        for (n, line) in lines(&qrels_path)? {
            let cols: Vec<&str> = line.split('\t').collect();
            if n == 1 && cols.first().is_some_and(|c| c.eq_ignore_ascii_case("query-id")) {
                continue;
            }
            let [q, d, grade] = cols[..] else {
                return Err(RagError::Format {
                    path: qrels_path.display().to_string(),
                    line: n,
                    reason: "expected query-id, corpus-id and score separated by tabs".into(),
                });
            };
            let grade: u32 = grade.trim().parse().map_err(|_| RagError::Format {
                path: qrels_path.display().to_string(),
                line: n,
                reason: format!("score '{grade}' is not a whole number"),
            })?;
            ds.qrels.entry(q.to_owned()).or_default().insert(d.to_owned(), grade);
        }
        let queries_path = dir.join("queries.jsonl");
        for (n, line) in lines(&queries_path)? {
            let q: Query = serde_json::from_str(&line).map_err(|e| parse_err(&queries_path, n, e))?;
            if ds.qrels.contains_key(&q.id) {
                ds.queries.push((q.id, q.text));
            }
        }
        Ok(ds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_the_beir_layout_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("corpus.jsonl"),
            "{\"_id\":\"d1\",\"title\":\"T\",\"text\":\"x\"}\n{\"_id\":\"d2\",\"text\":\"y\"}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("queries.jsonl"),
            "{\"_id\":\"q1\",\"text\":\"x?\"}\n{\"_id\":\"q9\",\"text\":\"unjudged\"}\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("qrels")).unwrap();
        std::fs::write(dir.path().join("qrels/test.tsv"), "query-id\tcorpus-id\tscore\nq1\td1\t1\n").unwrap();
        let ds = BeirDataset::load(dir.path()).unwrap();
        assert_eq!(ds.corpus.len(), 2);
        assert_eq!(ds.queries, vec![("q1".to_string(), "x?".to_string())]);
        assert_eq!(ds.qrels["q1"]["d1"], 1);
        std::fs::write(dir.path().join("qrels/test.tsv"), "query-id\tcorpus-id\tscore\nq1 d1\n").unwrap();
        let err = BeirDataset::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("test.tsv line 2"), "{err}");
    }
}
