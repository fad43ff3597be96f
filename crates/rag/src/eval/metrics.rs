//! Ranking metrics at document level: nDCG@k, recall@k, MRR@k.

use std::collections::HashMap;

/// nDCG@k with graded relevance (gain = grade, log2 discount), as BEIR computes it.
pub fn ndcg_at(ranked: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| f64::from(*relevant.get(d).unwrap_or(&0)) / ((i + 2) as f64).log2())
        .sum();
    let mut ideal: Vec<u32> = relevant.values().copied().filter(|g| *g > 0).collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let idcg: f64 = ideal.iter().take(k).enumerate().map(|(i, g)| f64::from(*g) / ((i + 2) as f64).log2()).sum();
    if idcg == 0.0 { 0.0 } else { dcg / idcg }
}

/// Share of the relevant documents found in the top k.
pub fn recall_at(ranked: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    let total = relevant.values().filter(|g| **g > 0).count();
    if total == 0 {
        return 0.0;
    }
    let found = ranked.iter().take(k).filter(|d| relevant.get(*d).is_some_and(|g| *g > 0)).count();
    found as f64 / total as f64
}

/// Reciprocal rank of the first relevant document in the top k (0 if none).
pub fn mrr_at(ranked: &[String], relevant: &HashMap<String, u32>, k: usize) -> f64 {
    ranked.iter().take(k).position(|d| relevant.get(d).is_some_and(|g| *g > 0)).map_or(0.0, |i| 1.0 / (i + 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn metrics_match_hand_computed_values() {
        let rel = HashMap::from([("a".to_string(), 1), ("b".to_string(), 1)]);
        // Perfect ranking.
        assert!((ndcg_at(&ids(&["a", "b", "x"]), &rel, 10) - 1.0).abs() < 1e-12);
        // Relevant at ranks 2 and 3: DCG = 1/log2(3) + 1/log2(4); IDCG = 1 + 1/log2(3).
        let expected = (1.0 / 3f64.log2() + 0.5) / (1.0 + 1.0 / 3f64.log2());
        assert!((ndcg_at(&ids(&["x", "a", "b"]), &rel, 10) - expected).abs() < 1e-12);
        assert_eq!(recall_at(&ids(&["x", "a", "b"]), &rel, 2), 0.5);
        assert_eq!(mrr_at(&ids(&["x", "y", "b"]), &rel, 10), 1.0 / 3.0);
        assert_eq!(mrr_at(&ids(&["x", "y", "b"]), &rel, 2), 0.0);
        assert_eq!(ndcg_at(&ids(&["x"]), &HashMap::new(), 10), 0.0);
    }

    #[test]
    fn graded_relevance_counts_higher_grades_more() {
        let rel = HashMap::from([("a".to_string(), 2), ("b".to_string(), 1)]);
        assert!(ndcg_at(&ids(&["a", "b"]), &rel, 10) > ndcg_at(&ids(&["b", "a"]), &rel, 10));
    }
}
