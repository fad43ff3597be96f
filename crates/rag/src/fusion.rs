//! Reciprocal-rank fusion of the keyword and dense result lists, and the search modes.
//!
//! RRF (Cormack et al., 2009): a result's fused score is `Σ wᵢ / (k + rankᵢ)` over the lists it
//! appears in, ranks 1-based. It needs no score calibration between BM25 and cosine, which is
//! why it is the default for the tools. Each fused result keeps both lists' rank and score so a
//! playground can show why it ranked where it did.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::Hash;

/// How results are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// Keyword (BM25) only.
    Bm25,
    /// Embedding similarity only.
    Dense,
    /// Both, fused with RRF.
    Hybrid,
}

impl SearchMode {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bm25 => "bm25",
            Self::Dense => "dense",
            Self::Hybrid => "hybrid",
        }
    }
}

impl std::str::FromStr for SearchMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bm25" | "keyword" => Ok(Self::Bm25),
            "dense" | "vector" => Ok(Self::Dense),
            "hybrid" => Ok(Self::Hybrid),
            other => Err(format!("unknown search mode `{other}` (expected bm25, dense or hybrid)")),
        }
    }
}

/// RRF parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fusion {
    /// The rank constant `k` (60 in the paper): larger flattens the head of each list.
    pub k: f32,
    /// Weight of the keyword list.
    pub bm25_weight: f32,
    /// Weight of the dense list.
    pub dense_weight: f32,
    /// How deep each list is read before fusing (at least the requested `top_k`).
    pub depth: usize,
}

impl Default for Fusion {
    fn default() -> Self {
        Self { k: 60.0, bm25_weight: 1.0, dense_weight: 1.0, depth: 100 }
    }
}

/// A result's place in one list.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ListRank {
    /// 1-based rank.
    pub rank: usize,
    /// The list's own score (BM25 or cosine).
    pub score: f32,
}

/// One fused result.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused<K> {
    /// What was ranked.
    pub key: K,
    /// RRF score.
    pub score: f32,
    /// Place in the keyword list.
    pub bm25: Option<ListRank>,
    /// Place in the dense list.
    pub dense: Option<ListRank>,
}

/// Fuses two best-first lists of `(key, score)`. Ties on the fused score go to the better
/// single-list rank, then to the keyword list's order, so results are deterministic.
pub fn reciprocal_rank_fusion<K: Copy + Eq + Hash>(
    bm25: &[(K, f32)],
    dense: &[(K, f32)],
    fusion: &Fusion,
) -> Vec<Fused<K>> {
    let mut by_key: HashMap<K, usize> = HashMap::with_capacity(bm25.len() + dense.len());
    let mut out: Vec<Fused<K>> = Vec::with_capacity(bm25.len() + dense.len());
    for (list, weight, is_bm25) in [(bm25, fusion.bm25_weight, true), (dense, fusion.dense_weight, false)] {
        for (i, &(key, score)) in list.iter().enumerate() {
            let rank = ListRank { rank: i + 1, score };
            let slot = *by_key.entry(key).or_insert_with(|| {
                out.push(Fused { key, score: 0.0, bm25: None, dense: None });
                out.len() - 1
            });
            let f = &mut out[slot];
            f.score += weight / (fusion.k + rank.rank as f32);
            if is_bm25 {
                f.bm25 = Some(rank);
            } else {
                f.dense = Some(rank);
            }
        }
    }
    let best_rank = |f: &Fused<K>| f.bm25.map_or(usize::MAX, |r| r.rank).min(f.dense.map_or(usize::MAX, |r| r.rank));
    // `out` is in first-seen order (keyword list first); a stable sort keeps it for full ties.
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| best_rank(a).cmp(&best_rank(b))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rrf_scores_follow_the_formula() {
        let bm25 = [("a", 12.0), ("b", 9.0), ("c", 1.0)];
        let dense = [("c", 0.9), ("a", 0.8), ("d", 0.7)];
        let f = Fusion { k: 60.0, ..Fusion::default() };
        let fused = reciprocal_rank_fusion(&bm25, &dense, &f);
        let get = |k: &str| fused.iter().find(|x| x.key == k).unwrap().clone();
        let a = get("a");
        assert!((a.score - (1.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-7);
        assert_eq!(a.bm25, Some(ListRank { rank: 1, score: 12.0 }));
        assert_eq!(a.dense, Some(ListRank { rank: 2, score: 0.8 }));
        let c = get("c");
        assert!((c.score - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-7);
        let d = get("d");
        assert!(d.bm25.is_none() && (d.score - 1.0 / 63.0).abs() < 1e-7);
        // a (1st + 2nd) > c (3rd + 1st) > b (2nd only) > d (3rd only)
        assert_eq!(fused.iter().map(|x| x.key).collect::<Vec<_>>(), ["a", "c", "b", "d"]);
    }

    #[test]
    fn weights_and_k_change_the_order() {
        let bm25 = [("kw", 5.0), ("both", 4.0)];
        let dense = [("vec", 0.9), ("both", 0.8)];
        let equal = reciprocal_rank_fusion(&bm25, &dense, &Fusion::default());
        assert_eq!(equal[0].key, "both", "in both lists beats first in one");
        // Keyword list switched off: the dense order alone.
        let dense_only = Fusion { bm25_weight: 0.0, ..Fusion::default() };
        assert_eq!(reciprocal_rank_fusion(&bm25, &dense, &dense_only)[0].key, "vec");
        // k = 0 makes the head count more: first in one list (1/1) ties 1/2 + 1/2 and the
        // better single rank wins.
        let sharp = Fusion { k: 0.0, ..Fusion::default() };
        assert_eq!(reciprocal_rank_fusion(&bm25, &dense, &sharp)[0].key, "kw");
        // Ties: equal fused scores keep the better single-list rank, then keyword order.
        let tie = reciprocal_rank_fusion(&[("x", 1.0)], &[("y", 1.0)], &Fusion::default());
        assert_eq!(tie.iter().map(|f| f.key).collect::<Vec<_>>(), ["x", "y"]);
        // An empty list leaves the other's order.
        let only = reciprocal_rank_fusion(&[] as &[(&str, f32)], &dense, &Fusion::default());
        assert_eq!(only.iter().map(|f| f.key).collect::<Vec<_>>(), ["vec", "both"]);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("Hybrid".parse::<SearchMode>(), Ok(SearchMode::Hybrid));
        assert_eq!("bm25".parse::<SearchMode>(), Ok(SearchMode::Bm25));
        assert!("semantic".parse::<SearchMode>().unwrap_err().contains("bm25, dense or hybrid"));
    }
}
