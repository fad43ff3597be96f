//! Fusion of the keyword list and one or more dense lists (one per embedding model of the
//! knowledge base), and the search modes.
//!
//! Two methods. RRF (Cormack et al., 2009), the default: a result's fused score is
//! `Σ wᵢ / (k + rankᵢ)` over the lists it appears in, ranks 1-based; it needs no score
//! calibration between BM25 and cosine. DBSF (distribution-based score fusion, as Qdrant names
//! it): each list's scores are mapped from `mean ± 3σ` of that list onto [0, 1], clipped, and
//! summed with the weights; unlike RRF it keeps how far ahead a result is, not only its place.
//! Each fused result keeps every list's rank and score so a playground can show why it ranked
//! where it did.

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

/// How hybrid search combines its two lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FusionMethod {
    /// Reciprocal-rank fusion: ranks only.
    Rrf,
    /// Distribution-based score fusion: scores normalised per list by `mean ± 3σ`. The
    /// default: it beats RRF on every evaluation set here (docs/retrieval.md) and has no
    /// parameter to tune.
    #[default]
    Dbsf,
}

impl FusionMethod {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rrf => "rrf",
            Self::Dbsf => "dbsf",
        }
    }
}

/// Hybrid-search parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fusion {
    /// How the lists are combined.
    pub method: FusionMethod,
    /// RRF's rank constant `k` (60 in the paper): larger flattens the head of each list.
    pub k: f32,
    /// Weight of the keyword list.
    pub bm25_weight: f32,
    /// Weight of each dense list.
    pub dense_weight: f32,
    /// How deep each list is read before fusing (at least the requested `top_k`).
    pub depth: usize,
}

impl Default for Fusion {
    fn default() -> Self {
        Self { method: FusionMethod::Dbsf, k: 60.0, bm25_weight: 1.0, dense_weight: 1.0, depth: 100 }
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
    /// Fused score (RRF or DBSF, by [`Fusion::method`]).
    pub score: f32,
    /// Place in the keyword list.
    pub bm25: Option<ListRank>,
    /// Place in the (first) dense list.
    pub dense: Option<ListRank>,
    /// Place in each further dense list (a knowledge base with several embedding models).
    pub more_dense: Vec<Option<ListRank>>,
}

/// Fuses two best-first lists of `(key, score)` by [`Fusion::method`]. Ties on the fused score
/// go to the better single-list rank, then to the keyword list's order, so results are
/// deterministic.
pub fn fuse<K: Copy + Eq + Hash>(bm25: &[(K, f32)], dense: &[(K, f32)], fusion: &Fusion) -> Vec<Fused<K>> {
    fuse_many(bm25, &[dense], fusion)
}

/// Like [`fuse`] with several dense lists (one per embedding model), each weighted
/// [`Fusion::dense_weight`]; [`Fused::dense`] is the first one's rank, [`Fused::more_dense`] the
/// others'.
pub fn fuse_many<K: Copy + Eq + Hash>(bm25: &[(K, f32)], dense: &[&[(K, f32)]], fusion: &Fusion) -> Vec<Fused<K>> {
    let capacity = bm25.len() + dense.iter().map(|d| d.len()).sum::<usize>();
    let mut by_key: HashMap<K, usize> = HashMap::with_capacity(capacity);
    let mut out: Vec<Fused<K>> = Vec::with_capacity(capacity);
    let more = dense.len().saturating_sub(1);
    let lists = std::iter::once((bm25, fusion.bm25_weight)).chain(dense.iter().map(|d| (*d, fusion.dense_weight)));
    for (which, (list, weight)) in lists.enumerate() {
        let range = match fusion.method {
            FusionMethod::Dbsf => Some(ScoreRange::of(list)),
            FusionMethod::Rrf => None,
        };
        for (i, &(key, score)) in list.iter().enumerate() {
            let rank = ListRank { rank: i + 1, score };
            let slot = *by_key.entry(key).or_insert_with(|| {
                out.push(Fused { key, score: 0.0, bm25: None, dense: None, more_dense: vec![None; more] });
                out.len() - 1
            });
            let f = &mut out[slot];
            f.score += weight * range.map_or(1.0 / (fusion.k + rank.rank as f32), |r| r.unit(score));
            match which {
                0 => f.bm25 = Some(rank),
                1 => f.dense = Some(rank),
                n => f.more_dense[n - 2] = Some(rank),
            }
        }
    }
    let best_rank = |f: &Fused<K>| {
        std::iter::once(f.bm25)
            .chain(std::iter::once(f.dense))
            .chain(f.more_dense.iter().copied())
            .flatten()
            .map(|r| r.rank)
            .min()
            .unwrap_or(usize::MAX)
    };
    // `out` is in first-seen order (keyword list first); a stable sort keeps it for full ties.
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| best_rank(a).cmp(&best_rank(b))));
    out
}

/// DBSF's normalisation of one list: `mean ± 3σ` (population σ) of its scores onto [0, 1].
#[derive(Debug, Clone, Copy)]
struct ScoreRange {
    low: f32,
    width: f32,
}

impl ScoreRange {
    fn of<K>(list: &[(K, f32)]) -> Self {
        if list.is_empty() {
            return Self { low: 0.0, width: 0.0 };
        }
        // f64 sums: BM25 scores of a deep list would lose digits in f32.
        let n = list.len() as f64;
        let mean = list.iter().map(|&(_, s)| f64::from(s)).sum::<f64>() / n;
        let sd = (list.iter().map(|&(_, s)| (f64::from(s) - mean).powi(2)).sum::<f64>() / n).sqrt();
        Self { low: (mean - 3.0 * sd) as f32, width: (6.0 * sd) as f32 }
    }

    /// A score's place in the range; every score of a list without spread is 0.5.
    fn unit(self, score: f32) -> f32 {
        if self.width > 0.0 { ((score - self.low) / self.width).clamp(0.0, 1.0) } else { 0.5 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RRF with the defaults' k and weights (the default method is DBSF).
    fn rrf() -> Fusion {
        Fusion { method: FusionMethod::Rrf, ..Fusion::default() }
    }

    #[test]
    fn rrf_scores_follow_the_formula() {
        let bm25 = [("a", 12.0), ("b", 9.0), ("c", 1.0)];
        let dense = [("c", 0.9), ("a", 0.8), ("d", 0.7)];
        let f = Fusion { k: 60.0, ..rrf() };
        let fused = fuse(&bm25, &dense, &f);
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
        let equal = fuse(&bm25, &dense, &rrf());
        assert_eq!(equal[0].key, "both", "in both lists beats first in one");
        // Keyword list switched off: the dense order alone.
        let dense_only = Fusion { bm25_weight: 0.0, ..rrf() };
        assert_eq!(fuse(&bm25, &dense, &dense_only)[0].key, "vec");
        // k = 0 makes the head count more: first in one list (1/1) ties 1/2 + 1/2 and the
        // better single rank wins.
        let sharp = Fusion { k: 0.0, ..rrf() };
        assert_eq!(fuse(&bm25, &dense, &sharp)[0].key, "kw");
        // Ties: equal fused scores keep the better single-list rank, then keyword order.
        let tie = fuse(&[("x", 1.0)], &[("y", 1.0)], &rrf());
        assert_eq!(tie.iter().map(|f| f.key).collect::<Vec<_>>(), ["x", "y"]);
        // An empty list leaves the other's order.
        let only = fuse(&[] as &[(&str, f32)], &dense, &rrf());
        assert_eq!(only.iter().map(|f| f.key).collect::<Vec<_>>(), ["vec", "both"]);
    }

    #[test]
    fn dbsf_scores_follow_the_formula() {
        // bm25: mean 4, σ = sqrt(((8-4)² + (3-4)² + (1-4)²) / 3) = sqrt(26/3); range mean ± 3σ.
        let bm25 = [("a", 8.0), ("b", 3.0), ("c", 1.0)];
        // dense: mean 0.5, σ = 0.1 → range 0.2 ..= 0.8.
        let dense = [("c", 0.6), ("d", 0.4)];
        let f = Fusion { method: FusionMethod::Dbsf, ..Fusion::default() };
        let fused = fuse(&bm25, &dense, &f);
        let get = |k: &str| fused.iter().find(|x| x.key == k).unwrap().clone();
        let sd = (26.0f32 / 3.0).sqrt();
        let unit = |s: f32| (s - (4.0 - 3.0 * sd)) / (6.0 * sd);
        assert!((get("a").score - unit(8.0)).abs() < 1e-5);
        assert!((get("c").score - (unit(1.0) + (0.6 - 0.2) / 0.6)).abs() < 1e-5);
        assert!((get("d").score - (0.4 - 0.2) / 0.6).abs() < 1e-5);
        assert_eq!(get("c").bm25, Some(ListRank { rank: 3, score: 1.0 }));
        assert_eq!(get("c").dense, Some(ListRank { rank: 1, score: 0.6 }));
        // c (last keyword hit, first dense) > a (first keyword hit only) > b > d.
        assert_eq!(fused.iter().map(|x| x.key).collect::<Vec<_>>(), ["c", "a", "b", "d"]);
    }

    #[test]
    fn dbsf_keeps_a_clear_lead_that_rrf_flattens() {
        // The keyword list's top result is far ahead of the rest; the dense list is nearly flat
        // and has it third.
        let bm25 = [("lead", 30.0), ("x", 5.0), ("y", 4.9), ("z", 4.8)];
        let dense = [("x", 0.81), ("y", 0.80), ("lead", 0.80), ("z", 0.79)];
        let rrf = fuse(&bm25, &dense, &rrf());
        assert_eq!(rrf[0].key, "x", "RRF: second and first beat first and third");
        let dbsf = fuse(&bm25, &dense, &Fusion { method: FusionMethod::Dbsf, ..Fusion::default() });
        assert_eq!(dbsf[0].key, "lead", "DBSF: the lead counts");
    }

    #[test]
    fn dbsf_edge_cases_stay_finite() {
        let f = Fusion { method: FusionMethod::Dbsf, ..Fusion::default() };
        // One result, or equal scores: no spread, every score is 0.5.
        let one = fuse(&[("a", 3.0)], &[("a", 0.9), ("b", 0.9)], &f);
        assert_eq!(one.iter().map(|x| (x.key, x.score)).collect::<Vec<_>>(), [("a", 1.0), ("b", 0.5)]);
        // An empty list adds nothing; the weights scale each list.
        let weighted = Fusion { bm25_weight: 2.0, dense_weight: 0.0, ..f };
        let only = fuse(&[("a", 2.0), ("b", 1.0)], &[] as &[(&str, f32)], &weighted);
        // mean 1.5, σ 0.5: the range is 0 ..= 3, so a is 2/3 of it, weighted 2.
        assert!((only[0].score - 2.0 * 2.0 / 3.0).abs() < 1e-6, "{only:?}");
        assert!(only.iter().all(|x| x.score.is_finite() && x.score >= 0.0));
    }

    #[test]
    fn three_lists_fuse_with_every_dense_list_weighted_alike() {
        let bm25 = [("a", 5.0), ("b", 4.0)];
        let e5 = [("b", 0.9), ("c", 0.8)];
        let minilm = [("c", 0.7), ("b", 0.6), ("d", 0.5)];
        let f = rrf();
        let fused = fuse_many(&bm25, &[&e5, &minilm], &f);
        let get = |k: &str| fused.iter().find(|x| x.key == k).unwrap().clone();
        let b = get("b");
        assert!((b.score - (1.0 / 62.0 + 1.0 / 61.0 + 1.0 / 62.0)).abs() < 1e-7);
        assert_eq!(b.dense, Some(ListRank { rank: 1, score: 0.9 }));
        assert_eq!(b.more_dense, vec![Some(ListRank { rank: 2, score: 0.6 })]);
        assert_eq!(get("d").more_dense, vec![Some(ListRank { rank: 3, score: 0.5 })]);
        assert!(get("a").dense.is_none() && get("a").more_dense == vec![None]);
        // b is in all three lists; c in two; a and d in one each.
        assert_eq!(fused.iter().map(|x| x.key).collect::<Vec<_>>(), ["b", "c", "a", "d"]);
        // The third list counts: without it, c (0.8 in e5 only) falls behind a (first keyword hit).
        let two = fuse(&bm25, &e5, &f);
        assert_eq!(two.iter().map(|x| x.key).collect::<Vec<_>>(), ["b", "a", "c"]);
        // With DBSF the dense weight scales each dense list.
        let dbsf = Fusion { method: FusionMethod::Dbsf, dense_weight: 0.0, ..f };
        let keyword_only = fuse_many(&bm25, &[&e5, &minilm], &dbsf);
        assert_eq!(keyword_only[0].key, "a");
        assert!(keyword_only.iter().filter(|x| x.bm25.is_none()).all(|x| x.score == 0.0));
    }

    #[test]
    fn modes_parse() {
        assert_eq!("Hybrid".parse::<SearchMode>(), Ok(SearchMode::Hybrid));
        assert_eq!("bm25".parse::<SearchMode>(), Ok(SearchMode::Bm25));
        assert!("semantic".parse::<SearchMode>().unwrap_err().contains("bm25, dense or hybrid"));
    }
}
