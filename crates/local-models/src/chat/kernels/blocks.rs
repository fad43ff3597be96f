//! The block layouts: GGUF's Q4_K, Q6_K and Q8_0 weight blocks byte for byte as the file stores
//! them, and the two 8-bit forms activations are quantised to.

/// Values per k-quant super-block.
pub const QK_K: usize = 256;

/// A block type whose bytes in the file are its bytes in memory.
///
/// # Safety
/// Implementors are `repr(C)` integer fields and arrays without padding, so any bytes of the
/// right length are a valid value; the file is little-endian, as is every target this crate
/// builds for (checked below).
pub(super) unsafe trait Block: Copy {}

const _: () = assert!(cfg!(target_endian = "little"), "GGUF blocks are read as little-endian memory");

/// 256 weights at 4.5 bits: `w = d·scale·q − dmin·min` with 6-bit scales and mins per 32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    /// Super-block scale of the scales (`f16` bits).
    pub d: u16,
    /// Super-block scale of the mins (`f16` bits).
    pub dmin: u16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; 12],
    /// Values `64j + l` (`l < 32`) in the low nibble of byte `32j + l`, `64j + 32 + l` in its
    /// high nibble.
    pub qs: [u8; 128],
}

// SAFETY: integer fields only, laid out without padding (sizes checked in the tests).
unsafe impl Block for BlockQ4K {}

impl BlockQ4K {
    /// The scale and min of sub-block `j` (32 values), both 6-bit.
    #[inline]
    pub fn scale_min(&self, j: usize) -> (u8, u8) {
        let s = &self.scales;
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        }
    }
}

/// 256 weights at 6.5 bits: `w = d·scale·(q − 32)` with an 8-bit scale per 16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    /// Low four bits of each value.
    pub ql: [u8; 128],
    /// High two bits of each value.
    pub qh: [u8; 64],
    /// Signed scale per 16 values.
    pub scales: [i8; 16],
    /// Super-block scale (`f16` bits).
    pub d: u16,
}

// SAFETY: integer fields only, laid out without padding (sizes checked in the tests).
unsafe impl Block for BlockQ6K {}

/// 32 weights at 8.5 bits: `w = d·q`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    /// Scale (`f16` bits).
    pub d: u16,
    /// Values.
    pub qs: [i8; 32],
}

// SAFETY: integer fields only, laid out without padding (sizes checked in the tests).
unsafe impl Block for BlockQ8_0 {}

/// 256 activations at 8 bits with the sum of each 16, which the k-quants' mins and offsets
/// need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Values.
    pub qs: [i8; QK_K],
    /// Sum of values `16i..16i + 16`.
    pub bsums: [i16; QK_K / 16],
}

impl BlockQ8K {
    /// An all-zero block.
    pub const ZERO: Self = Self { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
}

/// 32 activations at 8 bits, for Q8_0 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8x32 {
    /// Scale.
    pub d: f32,
    /// Values.
    pub qs: [i8; 32],
}

impl BlockQ8x32 {
    /// An all-zero block.
    pub const ZERO: Self = Self { d: 0.0, qs: [0; 32] };
}

/// Tokens per tile: one per 32-bit lane of a 512-bit register.
pub const TILE_TOKENS: usize = 16;

/// One [`BlockQ8K`] of each of [`TILE_TOKENS`] tokens, regrouped so that four values of a weight
/// row meet the same four values of every token in one 512-bit multiply: lane `l` of each row
/// below is token `l`'s. Lanes past the prompt's last token are zero.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct TileQ8K {
    /// Values `4k..4k + 4` of each token, four bytes per lane.
    pub qs: [[u32; TILE_TOKENS]; QK_K / 4],
    /// Sums of values `32p..32p + 16` and `32p + 16..32p + 32` of each token, two `i16` per lane.
    pub bsums: [[u32; TILE_TOKENS]; QK_K / 32],
    /// Each token's scale.
    pub d: [f32; TILE_TOKENS],
}

impl TileQ8K {
    /// An all-zero tile.
    pub const ZERO: Self =
        Self { qs: [[0; TILE_TOKENS]; QK_K / 4], bsums: [[0; TILE_TOKENS]; QK_K / 32], d: [0.0; TILE_TOKENS] };
}

/// One [`BlockQ8x32`] of each of [`TILE_TOKENS`] tokens, regrouped as [`TileQ8K`] is, the values
/// offset by +128 to unsigned bytes (the multiply takes one side unsigned; Q8_0 weights are
/// signed, so the activations carry the offset and the kernel subtracts `128 · Σ w`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct TileQ8x32 {
    /// Values `4k..4k + 4` of each token plus 128, four bytes per lane.
    pub qs: [[u32; TILE_TOKENS]; 8],
    /// Each token's scale.
    pub d: [f32; TILE_TOKENS],
}

impl TileQ8x32 {
    /// An all-zero tile.
    pub const ZERO: Self = Self { qs: [[0; TILE_TOKENS]; 8], d: [0.0; TILE_TOKENS] };
}

/// Regroups `tokens` tokens' activations (`n` blocks each, token-major) into tiles, `n` per
/// group of [`TILE_TOKENS`] tokens (group-major), the last group's missing lanes zero.
pub fn tile_q8k(blocks: &[BlockQ8K], tokens: usize, n: usize, tiles: &mut Vec<TileQ8K>) {
    let groups = tokens.div_ceil(TILE_TOKENS);
    tiles.clear();
    tiles.resize(groups * n, TileQ8K::ZERO);
    for (t, row) in blocks[..tokens * n].chunks_exact(n).enumerate() {
        let (g, l) = (t / TILE_TOKENS, t % TILE_TOKENS);
        for (x, tile) in row.iter().zip(&mut tiles[g * n..(g + 1) * n]) {
            for (k, q) in x.qs.chunks_exact(4).enumerate() {
                tile.qs[k][l] = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
            }
            for (p, s) in x.bsums.chunks_exact(2).enumerate() {
                tile.bsums[p][l] = u32::from(s[0] as u16) | (u32::from(s[1] as u16) << 16);
            }
            tile.d[l] = x.d;
        }
    }
}

/// [`tile_q8k`] for Q8_0's activations.
pub fn tile_q8x32(blocks: &[BlockQ8x32], tokens: usize, n: usize, tiles: &mut Vec<TileQ8x32>) {
    let groups = tokens.div_ceil(TILE_TOKENS);
    tiles.clear();
    tiles.resize(groups * n, TileQ8x32::ZERO);
    let biased = |v: i8| (i16::from(v) + 128) as u8;
    for (t, row) in blocks[..tokens * n].chunks_exact(n).enumerate() {
        let (g, l) = (t / TILE_TOKENS, t % TILE_TOKENS);
        for (x, tile) in row.iter().zip(&mut tiles[g * n..(g + 1) * n]) {
            for (k, q) in x.qs.chunks_exact(4).enumerate() {
                tile.qs[k][l] = u32::from_le_bytes([biased(q[0]), biased(q[1]), biased(q[2]), biased(q[3])]);
            }
            tile.d[l] = x.d;
        }
    }
}

/// An `f16` bit pattern as `f32`.
#[inline]
pub fn f16_bits(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_the_files_sizes() {
        // The GGUF sizes: a mismatch would read every block after the first from the wrong place.
        assert_eq!(std::mem::size_of::<BlockQ4K>(), 144);
        assert_eq!(std::mem::size_of::<BlockQ6K>(), 210);
        assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
    }
}
