//! The encoder's weights as loaded: its shape, named tensors in f32 or Q4_0, and the
//! word-embedding table, which stays 4-bit when the file stores it so.

use crate::LocalModelError;

/// Weights per Q4_0 block.
pub(crate) const QK: usize = 32;
/// Bytes per Q4_0 block: an f16 scale and 16 bytes of nibbles.
pub(crate) const Q4_0_BLOCK_BYTES: usize = 18;

/// A BERT-layout encoder's shape (e5-small: 12 layers; all-MiniLM-L6-v2: 6; both hidden 384).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderShape {
    /// Hidden size (384).
    pub hidden: usize,
    /// Encoder layers (12).
    pub layers: usize,
    /// Attention heads (12).
    pub heads: usize,
    /// Feed-forward size (1536).
    pub intermediate: usize,
    /// Rows of the word-embedding table.
    pub vocab_rows: usize,
    /// Rows of the position table (512).
    pub max_positions: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
}

/// One tensor under the encoder's name for it (`emb.word`, `l3.q.w`, …; E5S1 files use these
/// names, other formats are mapped onto them).
#[derive(Debug)]
pub struct RawTensor {
    /// The file's tensor name.
    pub name: String,
    /// Values in row-major order.
    pub data: TensorData,
}

/// A tensor's values as stored.
#[derive(Debug)]
pub enum TensorData {
    /// Plain floats.
    F32(Vec<f32>),
    /// Q4_0 blocks of `n` values.
    Q4_0 {
        /// The blocks.
        blocks: Vec<u8>,
        /// Number of values.
        n: usize,
    },
}

impl TensorData {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Q4_0 { n, .. } => *n,
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Self::F32(v) => v,
            Self::Q4_0 { blocks, n } => dequantize_q4_0(&blocks, n),
        }
    }
}

/// The word-embedding table. A Q4_0 table stays 4-bit and its rows are dequantised on demand
/// (e5's 250k-row table is 54 MB this way instead of 384 MB as f32; a batch only needs its
/// own tokens' rows); an f32 table (MiniLM's 30k rows) is used as it is.
#[derive(Debug)]
pub struct EmbeddingRows {
    storage: RowStorage,
    row_len: usize,
    rows: usize,
}

#[derive(Debug)]
enum RowStorage {
    Q4_0(Vec<u8>),
    F32(Vec<f32>),
}

impl EmbeddingRows {
    /// A `rows × row_len` matrix from its values.
    ///
    /// # Errors
    /// When the sizes do not fit.
    pub fn new(data: TensorData, row_len: usize) -> Result<Self, LocalModelError> {
        let n = data.len();
        if row_len == 0 || !n.is_multiple_of(row_len) {
            return Err(LocalModelError::Format(format!("{n} values do not make rows of {row_len}")));
        }
        let storage = match data {
            TensorData::Q4_0 { blocks, .. } if row_len.is_multiple_of(QK) => RowStorage::Q4_0(blocks),
            TensorData::Q4_0 { .. } => {
                return Err(LocalModelError::Format(format!("Q4_0 rows of {row_len} do not fill whole blocks")));
            }
            TensorData::F32(values) => RowStorage::F32(values),
        };
        Ok(Self { storage, row_len, rows: n / row_len })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends row `row` as f32 to `out`.
    ///
    /// # Errors
    /// When `row` is out of range.
    pub fn extend_row(&self, row: usize, out: &mut Vec<f32>) -> Result<(), LocalModelError> {
        if row >= self.rows {
            return Err(LocalModelError::Input(format!("token id {row} is outside the {}-row vocabulary", self.rows)));
        }
        match &self.storage {
            RowStorage::Q4_0(blocks) => {
                let bytes_per_row = self.row_len / QK * Q4_0_BLOCK_BYTES;
                let raw = &blocks[row * bytes_per_row..(row + 1) * bytes_per_row];
                let start = out.len();
                out.resize(start + self.row_len, 0.0);
                dequantize_q4_0_into(raw, &mut out[start..]);
            }
            RowStorage::F32(values) => out.extend_from_slice(&values[row * self.row_len..(row + 1) * self.row_len]),
        }
        Ok(())
    }
}

/// Q4_0: per 32 weights an f16 scale `d` and 16 bytes; byte `j` holds weight `j` in its low
/// nibble and weight `j + 16` in its high nibble, each stored with an offset of 8.
pub fn dequantize_q4_0(raw: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_q4_0_into(raw, &mut out);
    out
}

/// [`dequantize_q4_0`] into `out` (whose length is the element count).
pub(crate) fn dequantize_q4_0_into(raw: &[u8], out: &mut [f32]) {
    for (block, o) in raw.chunks_exact(Q4_0_BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (j, &byte) in block[2..].iter().enumerate() {
            o[j] = (i32::from(byte & 0x0f) - 8) as f32 * d;
            o[j + 16] = (i32::from(byte >> 4) - 8) as f32 * d;
        }
    }
}
