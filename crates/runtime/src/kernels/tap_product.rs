//! A convolution's matrix product with its column matrix read in place ("implicit GEMM").
//!
//! Through im2col, every tap of a small convolution was copied into a column matrix (9 or 49
//! times the input), which the `gemm` crate then packed again: on resnet_tiny the copies, the
//! packing and the zeroing of the buffers took as long as the products. Here row k of the column
//! matrix is never made: it is `source[offsets[k]..]`, a run of the input laid out as phase
//! planes (`conv::PhasePlanes`), and the kernel keeps a register tile of output channels ×
//! columns while it walks k, broadcasting one weight per channel and loading the tap row once
//! for all the tile's channels (the direct-convolution scheme of MLAS and oneDNN, on rows of
//! the input plane instead of NCHWc blocks). Only the weights are packed, once per call.
//!
//! The tile is 8 channels × 32 columns with AVX-512 (16 accumulators of 32), 6 × 16 with AVX2
//! and FMA (12 of 16 registers), picked at run time; the portable loop (4 × 16) is what the
//! default SSE2 build vectorises.

/// Columns are computed in blocks of this many: a product of `columns` columns reads and writes
/// up to [`padded_columns`]`(columns)` of them.
const COLUMN_BLOCK: usize = 16;

/// The columns a product of `columns` columns touches (its last block runs past the end).
pub(super) fn padded_columns(columns: usize) -> usize {
    columns.next_multiple_of(COLUMN_BLOCK)
}

/// One register tile's kernel: the sum over the taps for channels `0..channels` (≤ the tile's)
/// at columns `p0..p0 + its width`, written to `out` rows `out_stride` apart.
type TileKernel = unsafe fn(&TapWeights, &[usize], *const f32, usize, *mut f32, usize, usize);

/// A group's weights packed for the tile kernel: per block of `tile_channels` output channels,
/// the weights of tap k for those channels side by side (zero for channels past the last).
pub(super) struct TapWeights {
    packed: Vec<f32>,
    channels: usize,
    taps: usize,
    tile_channels: usize,
    /// Tile kernels by width in columns, widest first.
    kernels: &'static [(usize, TileKernel)],
}

impl TapWeights {
    /// Packs `weights` (`channels` rows of `taps`) for this CPU's tile kernel.
    pub(super) fn pack(weights: &[f32], channels: usize, taps: usize) -> TapWeights {
        TapWeights::pack_for(weights, channels, taps, kernels_for_this_cpu())
    }

    /// [`TapWeights::pack`] for a given tile height and set of kernels.
    fn pack_for(
        weights: &[f32],
        channels: usize,
        taps: usize,
        (tile_channels, kernels): KernelSet,
    ) -> TapWeights {
        let blocks = channels.div_ceil(tile_channels);
        let mut packed = vec![0.0f32; blocks * taps * tile_channels];
        for (block, panel) in packed.chunks_mut(taps * tile_channels).enumerate() {
            for i in 0..tile_channels.min(channels - block * tile_channels) {
                let row = &weights[(block * tile_channels + i) * taps..][..taps];
                for (k, &w) in row.iter().enumerate() {
                    panel[k * tile_channels + i] = w;
                }
            }
        }
        TapWeights {
            packed,
            channels,
            taps,
            tile_channels,
            kernels,
        }
    }

    /// `out[m · out_stride + p] = Σ_k weights[m][k] · source[offsets[k] + p]` for every channel
    /// m and column p < `columns`; columns up to [`padded_columns`]`(columns)` are computed too
    /// (from whatever `source` holds there) and written.
    ///
    /// # Panics
    /// If `offsets` is not one per tap, or `source` or `out` is shorter than those reads and
    /// writes need.
    pub(super) fn multiply(
        &self,
        source: &[f32],
        offsets: &[usize],
        columns: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let padded = padded_columns(columns);
        assert_eq!(offsets.len(), self.taps, "one offset per tap");
        let reach = offsets.iter().max().map_or(0, |&o| o + padded);
        assert!(reach <= source.len(), "tap rows run past the source");
        assert!(
            self.channels == 0
                || (out_stride >= padded && (self.channels - 1) * out_stride + padded <= out.len()),
            "the product runs past its output"
        );
        let mut p0 = 0;
        while p0 < padded {
            let left = padded - p0;
            let &(width, kernel) = self
                .kernels
                .iter()
                .find(|(width, _)| *width <= left)
                .expect("the narrowest tile is one column block");
            for block in 0..self.channels.div_ceil(self.tile_channels) {
                let first = block * self.tile_channels;
                // SAFETY: by the asserts above, every tap row read (`offsets[k] + p0 ..`,
                // `width` long, p0 + width ≤ padded) lies inside `source`, and every row written
                // (`(first + i) · out_stride + p0 ..` for i below the block's real channels)
                // inside `out`; the kernel needs only features this CPU has
                // (`kernels_for_this_cpu` checked them).
                unsafe {
                    kernel(
                        self,
                        offsets,
                        source.as_ptr(),
                        p0,
                        out.as_mut_ptr().add(first * out_stride),
                        out_stride,
                        block,
                    );
                }
            }
            p0 += width;
        }
    }

    /// The packed weights of channel block `block`: tap k's at `k · tile_channels`.
    fn panel(&self, block: usize) -> &[f32] {
        &self.packed[block * self.taps * self.tile_channels..][..self.taps * self.tile_channels]
    }

    /// Real channels in block `block` (the last block may be partial).
    fn rows_in(&self, block: usize) -> usize {
        self.tile_channels
            .min(self.channels - block * self.tile_channels)
    }
}

/// A tile height (channels) and its kernels by width in columns, widest first.
type KernelSet = (usize, &'static [(usize, TileKernel)]);

/// The tile height and kernels (by width) this CPU runs best.
fn kernels_for_this_cpu() -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (x86::AVX512_CHANNELS, x86::AVX512_KERNELS);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return (x86::AVX2_CHANNELS, x86::AVX2_KERNELS);
        }
    }
    (PORTABLE_CHANNELS, PORTABLE_KERNELS)
}

const PORTABLE_KERNELS: &[(usize, TileKernel)] = &[(COLUMN_BLOCK, tile_portable)];

const PORTABLE_CHANNELS: usize = 4;

/// The portable tile (4 × 16): fixed-size arrays the compiler keeps in vector registers.
///
/// # Safety
/// `source + offsets[k] + p0 .. + 16` must be readable for every k, and rows
/// `out + i · out_stride + p0 .. + 16` writable for i below the block's real channels.
unsafe fn tile_portable(
    weights: &TapWeights,
    offsets: &[usize],
    source: *const f32,
    p0: usize,
    out: *mut f32,
    out_stride: usize,
    block: usize,
) {
    const W: usize = COLUMN_BLOCK;
    let panel = weights.panel(block);
    let mut acc = [[0.0f32; W]; PORTABLE_CHANNELS];
    for (k, &offset) in offsets.iter().enumerate() {
        // SAFETY: the caller's contract.
        let row = unsafe { &*(source.add(offset + p0) as *const [f32; W]) };
        let w = &panel[k * PORTABLE_CHANNELS..][..PORTABLE_CHANNELS];
        for (acc_row, &wi) in acc.iter_mut().zip(w) {
            for (a, &x) in acc_row.iter_mut().zip(row) {
                *a += wi * x;
            }
        }
    }
    for (i, acc_row) in acc.iter().enumerate().take(weights.rows_in(block)) {
        // SAFETY: the caller's contract.
        let dst = unsafe { &mut *(out.add(i * out_stride + p0) as *mut [f32; W]) };
        *dst = *acc_row;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TapWeights, TileKernel};
    use std::arch::x86_64::*;

    pub(super) const AVX512_CHANNELS: usize = 8;
    pub(super) const AVX2_CHANNELS: usize = 6;
    pub(super) const AVX512_KERNELS: &[(usize, TileKernel)] =
        &[(32, tile_avx512::<2>), (16, tile_avx512::<1>)];
    pub(super) const AVX2_KERNELS: &[(usize, TileKernel)] = &[(16, tile_avx2)];

    /// The AVX-512 tile: 8 channels × `VECS` · 16 columns.
    ///
    /// # Safety
    /// The CPU has AVX-512F; reads and writes as [`super::tile_portable`]'s, `VECS` · 16 wide.
    // AVX-512 intrinsics are stable since Rust 1.89, the crate's `rust-version`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_avx512<const VECS: usize>(
        weights: &TapWeights,
        offsets: &[usize],
        source: *const f32,
        p0: usize,
        out: *mut f32,
        out_stride: usize,
        block: usize,
    ) {
        const C: usize = AVX512_CHANNELS;
        let panel = weights.panel(block).as_ptr();
        let mut acc = [[_mm512_setzero_ps(); VECS]; C];
        for (k, &offset) in offsets.iter().enumerate() {
            let row = source.add(offset + p0);
            let mut x = [_mm512_setzero_ps(); VECS];
            for (v, xv) in x.iter_mut().enumerate() {
                *xv = _mm512_loadu_ps(row.add(16 * v));
            }
            let w = panel.add(k * C);
            for (i, acc_row) in acc.iter_mut().enumerate() {
                let wi = _mm512_set1_ps(*w.add(i));
                for (a, &xv) in acc_row.iter_mut().zip(&x) {
                    *a = _mm512_fmadd_ps(wi, xv, *a);
                }
            }
        }
        for (i, acc_row) in acc.iter().enumerate().take(weights.rows_in(block)) {
            for (v, &a) in acc_row.iter().enumerate() {
                _mm512_storeu_ps(out.add(i * out_stride + p0 + 16 * v), a);
            }
        }
    }

    /// The AVX2 tile: 6 channels × 16 columns.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; reads and writes as [`super::tile_portable`]'s.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(
        weights: &TapWeights,
        offsets: &[usize],
        source: *const f32,
        p0: usize,
        out: *mut f32,
        out_stride: usize,
        block: usize,
    ) {
        const C: usize = AVX2_CHANNELS;
        let panel = weights.panel(block).as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; C];
        for (k, &offset) in offsets.iter().enumerate() {
            let row = source.add(offset + p0);
            let x = [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))];
            let w = panel.add(k * C);
            for (i, acc_row) in acc.iter_mut().enumerate() {
                let wi = _mm256_set1_ps(*w.add(i));
                acc_row[0] = _mm256_fmadd_ps(wi, x[0], acc_row[0]);
                acc_row[1] = _mm256_fmadd_ps(wi, x[1], acc_row[1]);
            }
        }
        for (i, acc_row) in acc.iter().enumerate().take(weights.rows_in(block)) {
            _mm256_storeu_ps(out.add(i * out_stride + p0), acc_row[0]);
            _mm256_storeu_ps(out.add(i * out_stride + p0 + 8), acc_row[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel set this CPU can run: the portable one, and AVX2 and AVX-512 where present.
    fn runnable_sets() -> Vec<KernelSet> {
        let mut sets = vec![(PORTABLE_CHANNELS, PORTABLE_KERNELS)];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                sets.push((x86::AVX2_CHANNELS, x86::AVX2_KERNELS));
            }
            if has!("avx512f") {
                sets.push((x86::AVX512_CHANNELS, x86::AVX512_KERNELS));
            }
        }
        sets
    }

    #[test]
    fn every_kernel_set_gives_the_sums_over_its_tap_rows() {
        // Channel counts below, at and past a tile (1, 6, 8, 13), column counts that leave a
        // partial block (5, 16, 47, 70), taps read at scattered offsets.
        for (channels, columns, taps) in [(1, 5, 3), (6, 16, 9), (8, 47, 4), (13, 70, 11)] {
            let weights: Vec<f32> = (0..channels * taps)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
                .collect();
            let offsets: Vec<usize> = (0..taps).map(|k| (k * 29) % 53).collect();
            let padded = padded_columns(columns);
            let source: Vec<f32> = (0..53 + padded)
                .map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0)
                .collect();
            let stride = padded + 3;
            for set in runnable_sets() {
                let packed = TapWeights::pack_for(&weights, channels, taps, set);
                let mut out = vec![f32::NAN; channels * stride];
                packed.multiply(&source, &offsets, columns, &mut out, stride);
                for m in 0..channels {
                    for p in 0..columns {
                        let want: f32 = (0..taps)
                            .map(|k| weights[m * taps + k] * source[offsets[k] + p])
                            .sum();
                        let got = out[m * stride + p];
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "tile of {} channels: [{m}, {p}] = {got}, want {want}",
                            set.0
                        );
                    }
                }
            }
        }
    }
}
