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
