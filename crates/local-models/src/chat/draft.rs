//! Drafts for speculative decoding, read from the prompt itself ("prompt lookup"), and the
//! logits computed for one while the reply takes its tokens.
//!
//! A reply that quotes — a passage of a tool's result, the user's words in a call's
//! arguments, a name it wrote before — goes on as the text it quotes did: the tokens that
//! followed the reply's last few tokens where they occurred earlier are a good guess of what
//! comes next. [`Qwen2::draft_logits`](super::qwen2::Qwen2::draft_logits) computes the guess
//! in one pass, which reads the weights once as one token does, and the reply keeps each drafted
//! token only while its own choice (after every constraint and the sampler) is that token: the
//! reply is token for token the one decoding one token at a time writes, sooner.

/// How drafts are looked up in the prompt and the reply so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    /// The most tokens one draft holds; 0: no drafts.
    pub max_tokens: usize,
    /// The fewest tokens worth a draft: a pass over a token and a short draft costs nearly as
    /// much as over a long one (a prompt's kernels take sixteen tokens at a time, and below
    /// eight each token is computed with its own overheads), so a short one, even if right,
    /// saves less than a wrong one wastes. At most `max_tokens`.
    pub min_tokens: usize,
    /// The longest run of last tokens looked up; shorter runs are tried after it.
    pub max_ngram: usize,
    /// The shortest run looked up: one or two tokens ("de la") match too often to guess well
    /// (in the demo's cited answer, runs of two drafted 105 tokens and 68 were taken, runs of
    /// three 90 and 66).
    pub min_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        Self { max_tokens: 15, min_tokens: 7, max_ngram: 4, min_ngram: 3 }
    }
}

impl PromptLookup {
    /// Drafts off.
    pub const OFF: Self = Self { max_tokens: 0, min_tokens: 0, max_ngram: 0, min_ngram: 0 };

    /// The tokens that followed the latest earlier occurrence of `ids`'s last `n` tokens, for
    /// the longest `n` from `max_ngram` down to `min_ngram` that occurs; at most `limit` and
    /// `max_tokens` of them, and none when no run occurs or fewer than `min_tokens` follow it.
    pub fn draft<'a>(&self, ids: &'a [u32], limit: usize) -> &'a [u32] {
        let limit = limit.min(self.max_tokens);
        if limit == 0 {
            return &[];
        }
        let len = ids.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if len <= n {
                continue;
            }
            let run = &ids[len - n..];
            // The latest occurrence that has a token after it, the run itself excluded.
            if let Some(start) = (0..len - n).rev().find(|&s| &ids[s..s + n] == run) {
                let follow = start + n;
                let draft = &ids[follow..(follow + limit).min(len)];
                return if draft.len() >= self.min_tokens.min(self.max_tokens) { draft } else { &[] };
            }
        }
        &[]
    }
}

/// Logits rows computed for a prompt and a draft after it ([`Qwen2::draft_logits`]): row `i`
/// is the logits after the prompt and the draft's first `i` tokens.
///
/// [`Qwen2::draft_logits`]: super::qwen2::Qwen2::draft_logits
#[derive(Debug, Default)]
pub struct Lookahead {
    /// The prompt's length when the rows were computed.
    start: usize,
    draft: Vec<u32>,
    rows: Vec<f32>,
    vocab: usize,
}

impl Lookahead {
    /// Keeps `rows` (`draft.len() + 1` rows of `vocab` logits) computed for the prompt of
    /// `start` tokens followed by `draft`.
    pub fn set(&mut self, start: usize, draft: &[u32], rows: Vec<f32>, vocab: usize) {
        debug_assert_eq!(rows.len(), (draft.len() + 1) * vocab);
        self.start = start;
        self.draft.clear();
        self.draft.extend_from_slice(draft);
        self.rows = rows;
        self.vocab = vocab;
    }

    /// The logits after `ids` when they were computed: `ids` is the prompt they were computed
    /// for followed by a part of the draft (the tokens the reply took so far).
    pub fn row(&self, ids: &[u32]) -> Option<&[f32]> {
        self.rows.get(self.row_range(ids)?)
    }

    /// [`Lookahead::row`], to be masked or sampled in place: each row is read once, as the
    /// reply takes its token, so it need not be copied first.
    pub fn row_mut(&mut self, ids: &[u32]) -> Option<&mut [f32]> {
        let range = self.row_range(ids)?;
        self.rows.get_mut(range)
    }

    fn row_range(&self, ids: &[u32]) -> Option<std::ops::Range<usize>> {
        let taken = ids.len().checked_sub(self.start)?;
        (self.vocab != 0 && self.taken(ids) == taken).then(|| taken * self.vocab..(taken + 1) * self.vocab)
    }

    /// How many of the draft's tokens the reply took, given the prompt `ids` now.
    pub fn taken(&self, ids: &[u32]) -> usize {
        let Some(after) = ids.get(self.start..) else { return 0 };
        after.iter().zip(&self.draft).take_while(|(a, b)| a == b).count()
    }

    /// The draft's length.
    pub fn drafted(&self) -> usize {
        self.draft.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_is_what_followed_the_longest_run_that_occurred_before() {
        let lookup = PromptLookup { max_tokens: 3, min_tokens: 1, max_ngram: 3, min_ngram: 2 };
        //          0  1  2  3  4  5  6  7  8  9
        let ids = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7];
        // The last two tokens (6 7) occurred at 1 and 6: the latest is followed by 2 6 7.
        assert_eq!(lookup.draft(&ids, 10), &[2, 6, 7]);
        // Three tokens (2 6 7) never occurred before, so two decide; the limit cuts the draft.
        assert_eq!(lookup.draft(&ids, 1), &[2]);
        // A longer run wins over a later shorter one: 7 8 after 6 7 8 at 1.
        let ids = [6, 7, 8, 4, 1, 7, 8, 3, 6, 7, 8];
        assert_eq!(lookup.draft(&ids, 10), &[4, 1, 7]);
        // No run of two occurred: no draft, whatever single tokens repeat.
        assert!(lookup.draft(&[1, 2, 3, 1, 4], 10).is_empty());
        // Off, or nothing left to generate.
        assert!(PromptLookup::OFF.draft(&[1, 2, 1, 2], 10).is_empty());
        assert!(lookup.draft(&[1, 2, 3, 1, 2], 0).is_empty());
        // A draft stops at the end of what is there.
        assert_eq!(lookup.draft(&[1, 2, 3, 1, 2], 10), &[3, 1, 2]);
        // Too short to be worth a pass, also where the reply's limit allows no more.
        let long_only = PromptLookup { min_tokens: 4, max_tokens: 8, ..lookup };
        assert!(long_only.draft(&[1, 2, 3, 1, 2], 10).is_empty());
        assert_eq!(long_only.draft(&[1, 2, 3, 4, 5, 6, 1, 2], 10), &[3, 4, 5, 6, 1, 2]);
        assert!(long_only.draft(&[1, 2, 3, 4, 5, 6, 1, 2], 2).is_empty());
    }

    #[test]
    fn lookahead_rows_follow_the_tokens_the_reply_takes() {
        let mut ahead = Lookahead::default();
        let prompt = [9u32, 9, 9];
        // Rows for the prompt, then after 4, then after 4 5.
        ahead.set(3, &[4, 5], vec![0.0, 0.1, 1.0, 1.1, 2.0, 2.1], 2);
        assert_eq!(ahead.row(&prompt), Some(&[0.0, 0.1][..]));
        assert_eq!(ahead.row(&[9, 9, 9, 4]), Some(&[1.0, 1.1][..]));
        assert_eq!(ahead.row(&[9, 9, 9, 4, 5]), Some(&[2.0, 2.1][..]));
        assert_eq!(ahead.row_mut(&[9, 9, 9, 4]).map(|r| &*r), Some(&[1.0, 1.1][..]));
        // The reply left the draft, went past it, or the prompt is another one: nothing.
        assert_eq!(ahead.row(&[9, 9, 9, 6]), None);
        assert_eq!(ahead.row(&[9, 9, 9, 4, 5, 6]), None);
        assert_eq!(ahead.row(&[9, 9]), None);
        assert_eq!(ahead.taken(&[9, 9, 9, 4, 6]), 1);
        assert_eq!(ahead.taken(&[9, 9, 9, 4, 5, 6]), 2);
        assert_eq!(Lookahead::default().row(&prompt), None);
    }
}
