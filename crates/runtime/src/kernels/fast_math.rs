//! Float functions the compiler can vectorise (exp, tanh, erf, sigmoid), and slice loops that
//! run them with AVX2 where the CPU has it.
//!
//! The standard library's `f32::exp`, `tanh` and libm's `erff` are one call per element, which
//! no loop vectorises: on the transformers they made Softmax, Erf (GELU) and Tanh the slowest
//! ops after the matrix products. These are branch-free polynomial and rational approximations
//! (Cephes' `expf` polynomial, Eigen's rational `tanh` and `erf`) within a few float ulps of the
//! exact values, the accuracy onnxruntime's MLAS kernels also give. The default build targets
//! plain x86-64 (SSE2, four lanes); [`map`], [`extend_zip`] and [`exp_shifted_in_place`] compile
//! their loop a second time for AVX2 (eight lanes) and pick it at run time.

use std::mem::MaybeUninit;

/// `e^x`, within 2 ulp of the exact value on f32's normal range; `+inf` above 88.72, `0` below
/// −87.3365 (where the exact value is subnormal), NaN for NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two (Cephes): `n · LN2_HI` is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 · 2^23 rounds a float of magnitude below 2^22 to an integer, whose value then
    // sits in the low mantissa bits: no float-to-int conversion, which SSE2 lacks in vector form.
    const ROUNDER: f32 = 12_582_912.0;
    const MAX_INPUT: f32 = 88.722_83;
    // Just above ln 2^−126: every value computed from a clamped input is a normal float. A
    // subnormal intermediate (even one the final select discards) costs a microcode assist
    // of ~100 cycles per element: masked attention scores (−3.4e38) all land here.
    const MIN_INPUT: f32 = -87.336_5;
    let clamped = x.clamp(MIN_INPUT, MAX_INPUT);
    let shifted = clamped * LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n is in [−126, 128], and 2^128 is not a float: scale by 2^⌊n/2⌋ · 2^⌈n/2⌉.
    let n_int = shifted.to_bits().wrapping_sub(ROUNDER.to_bits()) as i32;
    let half = n_int >> 1;
    let power_of_two = |e: i32| f32::from_bits((e + 127).wrapping_shl(23) as u32);
    let value = e_r * power_of_two(half) * power_of_two(n_int - half);
    if x > MAX_INPUT {
        f32::INFINITY
    } else if x < MIN_INPUT {
        0.0
    } else {
        value
    }
}

/// The logistic function `1 / (1 + e^−x)`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `tanh x`: Eigen's rational approximation (odd degree 13 over even degree 6) on
/// [−7.9, 7.9], beyond which tanh is ±1 in f32; `x` itself below 0.0004, where tanh x = x in f32.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    let c = x.clamp(-CLAMP, CLAMP);
    let x2 = c * c;
    let mut p = -2.760_768_5e-16;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 - 8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    p *= c;
    let mut q = 1.198_258_4e-6;
    q = q * x2 + 1.185_347_1e-4;
    q = q * x2 + 2.268_434_7e-3;
    q = q * x2 + 4.893_525e-3;
    if x.abs() < 0.0004 {
        x
    } else {
        p / q
    }
}

/// The error function: Eigen's rational approximation (odd degree 13 over even degree 8) on
/// [−4, 4], beyond which erf is ±1 in f32 (this gives 1 − 1 ulp there).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let c = x.clamp(-4.0, 4.0);
    let x2 = c * c;
    let mut p = -2.726_142_3e-10;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    p *= c;
    let mut q = -1.456_607_2e-5;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    // Below 1e-20 the numerator is subnormal and loses bits; there erf x = 2x/√π in f32.
    if x.abs() < 1e-20 {
        x * std::f32::consts::FRAC_2_SQRT_PI
    } else {
        p / q
    }
}

/// `f(x)` of each element, in a new vector.
pub(crate) fn map(src: &[f32], f: impl Fn(f32) -> f32 + Copy) -> Vec<f32> {
    let mut out = Vec::with_capacity(src.len());
    extend_zip(&mut out, src, 1, &[()], 0, src.len(), move |x, ()| f(x));
    out
}

/// Appends `f(a[k · a_step], b[k · b_step])` for `k < len` to `out`. The steps are 1 or 0 (the
/// latter repeats a broadcast element); each pattern gets its own loop, so that each vectorises
/// (a loop with a variable stride does not).
///
/// # Panics
/// If `a` or `b` is shorter than the steps and `len` make it read.
pub(crate) fn extend_zip<A: Copy, B: Copy, O>(
    out: &mut Vec<O>,
    a: &[A],
    a_step: usize,
    b: &[B],
    b_step: usize,
    len: usize,
    f: impl Fn(A, B) -> O + Copy,
) {
    out.reserve(len);
    let spare = &mut out.spare_capacity_mut()[..len];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { zip_avx2(spare, a, a_step, b, b_step, f) };
    } else {
        zip_portable(spare, a, a_step, b, b_step, f);
    }
    #[cfg(not(target_arch = "x86_64"))]
    zip_portable(spare, a, a_step, b, b_step, f);
    // SAFETY: `zip_portable` wrote every one of the `len` spare elements (it panics, leaving
    // the length as it was, if an input is too short).
    unsafe { out.set_len(out.len() + len) };
}

#[inline(always)]
fn zip_portable<A: Copy, B: Copy, O>(
    dst: &mut [MaybeUninit<O>],
    a: &[A],
    a_step: usize,
    b: &[B],
    b_step: usize,
    f: impl Fn(A, B) -> O,
) {
    let len = dst.len();
    match (a_step, b_step) {
        (1, 1) => {
            for ((d, &x), &y) in dst.iter_mut().zip(&a[..len]).zip(&b[..len]) {
                d.write(f(x, y));
            }
        }
        (1, 0) => {
            let y = b[0];
            for (d, &x) in dst.iter_mut().zip(&a[..len]) {
                d.write(f(x, y));
            }
        }
        (0, 1) => {
            let x = a[0];
            for (d, &y) in dst.iter_mut().zip(&b[..len]) {
                d.write(f(x, y));
            }
        }
        _ => {
            for (k, d) in dst.iter_mut().enumerate() {
                d.write(f(a[k * a_step], b[k * b_step]));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn zip_avx2<A: Copy, B: Copy, O>(
    dst: &mut [MaybeUninit<O>],
    a: &[A],
    a_step: usize,
    b: &[B],
    b_step: usize,
    f: impl Fn(A, B) -> O,
) {
    zip_portable(dst, a, a_step, b, b_step, f);
}

/// Replaces each element by `f(x)`: the loop of [`map`] in place (the recurrent layers'
/// activations), compiled a second time for AVX2 and picked at run time.
pub(crate) fn map_in_place(values: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { map_in_place_avx2(values, f) };
    }
    map_in_place_portable(values, f)
}

#[inline(always)]
fn map_in_place_portable(values: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in values.iter_mut() {
        *v = f(*v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn map_in_place_avx2(values: &mut [f32], f: impl Fn(f32) -> f32) {
    map_in_place_portable(values, f);
}

/// `Σ a[i]·b[i]` over the shorter length, in sixteen independent lanes (so the loop vectorises
/// and two AVX2 registers of sums run side by side), summed pairwise at the end. Compiled a
/// second time for AVX2 and picked at run time; both give the same bits, as the lanes fix the
/// order of the additions.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

const DOT_LANES: usize = 16;

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let (a_lanes, b_lanes) = (a.chunks_exact(DOT_LANES), b.chunks_exact(DOT_LANES));
    let mut lanes = [0.0f32; DOT_LANES];
    for (x, y) in a_lanes.zip(b_lanes) {
        for i in 0..DOT_LANES {
            lanes[i] += x[i] * y[i];
        }
    }
    dot_finish(lanes, a, b)
}

/// The lanes summed pairwise, plus the products past the last whole group of lanes.
fn dot_finish(mut lanes: [f32; DOT_LANES], a: &[f32], b: &[f32]) -> f32 {
    let whole = a.len() / DOT_LANES * DOT_LANES;
    let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
    let mut width = DOT_LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0] + tail
}

/// [`dot_portable`] in two AVX registers of eight lanes: the same products and additions in
/// the same order (no fused multiply-add), so the same bits. Written out because the compiler
/// vectorised the portable loop two lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps};
    use std::arch::x86_64::{_mm256_setzero_ps, _mm256_storeu_ps};
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let (mut low, mut high) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for start in (0..len / DOT_LANES).map(|group| group * DOT_LANES) {
        // SAFETY: `start + 16 <= len`, the length of both slices, so each load of eight
        // floats at `start` and `start + 8` stays inside them.
        unsafe {
            let (x, y) = (a.as_ptr().add(start), b.as_ptr().add(start));
            low = _mm256_add_ps(low, _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y)));
            let (x, y) = (x.add(8), y.add(8));
            high = _mm256_add_ps(high, _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y)));
        }
    }
    let mut lanes = [0.0f32; DOT_LANES];
    // SAFETY: `lanes` holds sixteen floats, the two stores eight each.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), low);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), high);
    }
    dot_finish(lanes, a, b)
}

/// `[a0·b0, a0·b1, a1·b0, a1·b1]`, each as [`dot`] computes it (the same bits), four at once:
/// each row is loaded once for two products, which is what a product of many short rows
/// (a convolution's patches against its weights) is limited by. The rows are all as long as
/// `a0`, which none may be shorter than.
pub(crate) fn dots_2x2(a: [&[f32]; 2], b: [&[f32]; 2]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { dots_2x2_avx2(a, b) };
    }
    [
        dot(a[0], b[0]),
        dot(a[0], b[1]),
        dot(a[1], b[0]),
        dot(a[1], b[1]),
    ]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_2x2_avx2(a: [&[f32]; 2], b: [&[f32]; 2]) -> [f32; 4] {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps};
    use std::arch::x86_64::{_mm256_setzero_ps, _mm256_storeu_ps};
    let len = a[0].len();
    assert!(a[1].len() >= len && b[0].len() >= len && b[1].len() >= len);
    // sums[half][2·i + j] holds lanes 8·half to 8·half + 7 of a_i·b_j.
    let mut sums = [[_mm256_setzero_ps(); 4]; 2];
    for start in (0..len / DOT_LANES).map(|group| group * DOT_LANES) {
        for (half, sums) in sums.iter_mut().enumerate() {
            let at = start + 8 * half;
            // SAFETY: `at + 8 <= len`, and every row holds at least `len` floats.
            unsafe {
                let load = |row: &[f32]| _mm256_loadu_ps(row.as_ptr().add(at));
                let (a0, a1, b0, b1) = (load(a[0]), load(a[1]), load(b[0]), load(b[1]));
                sums[0] = _mm256_add_ps(sums[0], _mm256_mul_ps(a0, b0));
                sums[1] = _mm256_add_ps(sums[1], _mm256_mul_ps(a0, b1));
                sums[2] = _mm256_add_ps(sums[2], _mm256_mul_ps(a1, b0));
                sums[3] = _mm256_add_ps(sums[3], _mm256_mul_ps(a1, b1));
            }
        }
    }
    let mut out = [0.0f32; 4];
    for (e, value) in out.iter_mut().enumerate() {
        let mut lanes = [0.0f32; DOT_LANES];
        // SAFETY: `lanes` holds sixteen floats, the two stores eight each.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), sums[0][e]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sums[1][e]);
        }
        *value = dot_finish(lanes, &a[e / 2][..len], &b[e % 2][..len]);
    }
    out
}

/// The largest element (NaN elements are skipped; `−inf` for an empty slice), in eight
/// independent lanes so that the loop vectorises.
pub(crate) fn max(v: &[f32]) -> f32 {
    let mut chunks = v.chunks_exact(8);
    let lanes = (&mut chunks).fold([f32::NEG_INFINITY; 8], |mut lanes, chunk| {
        for i in 0..8 {
            lanes[i] = if chunk[i] > lanes[i] {
                chunk[i]
            } else {
                lanes[i]
            };
        }
        lanes
    });
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    lanes.iter().fold(rest, |m, &x| m.max(x))
}

/// Σ f(v) over a row in f64, in four partial sums so that the loop vectorises.
pub(crate) fn sum_f64(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0f64; 4];
    let mut chunks = row.chunks_exact(4);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f(v);
        }
    }
    chunks.remainder().iter().map(|&v| f(v)).sum::<f64>() + lanes.iter().sum::<f64>()
}

/// Replaces each element by `e^(x − shift)` and returns their sum (eight partial sums, so that
/// the loop vectorises).
pub(crate) fn exp_shifted_in_place(v: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { exp_shifted_avx2(v, shift) };
    }
    exp_shifted_portable(v, shift)
}

#[inline(always)]
fn exp_shifted_portable(v: &mut [f32], shift: f32) -> f32 {
    // Two simple loops: the loop vectoriser turns the first's selects into blends, where one
    // loop doing both over eight-element chunks was left scalar, with branches.
    for x in v.iter_mut() {
        *x = exp(*x - shift);
    }
    lanes_sum(v)
}

/// Σ v in eight partial sums, so that the loop vectorises (one running sum is a dependency
/// chain the compiler may not reorder).
#[inline(always)]
fn lanes_sum(v: &[f32]) -> f32 {
    let mut chunks = v.chunks_exact(8);
    let lanes = (&mut chunks).fold([0.0f32; 8], |mut lanes, chunk| {
        for i in 0..8 {
            lanes[i] += chunk[i];
        }
        lanes
    });
    chunks.remainder().iter().sum::<f32>() + lanes.iter().sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_shifted_avx2(v: &mut [f32], shift: f32) -> f32 {
    exp_shifted_portable(v, shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_the_same_bits_on_every_path_and_near_the_exact_sum() {
        for len in 0..100usize {
            let a: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let b: Vec<f32> = (0..len)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 3.0)
                .collect();
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let scale: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from((x * y).abs()))
                .sum();
            let got = dot(&a, &b);
            assert_eq!(
                got.to_bits(),
                dot_portable(&a, &b).to_bits(),
                "length {len}"
            );
            assert!(
                (f64::from(got) - exact).abs() <= 1e-6 * scale,
                "length {len}"
            );
            if len >= 2 {
                let (a1, b1) = (&b[1..], &a[1..]);
                let (a0, b0) = (&a[..len - 1], &b[..len - 1]);
                let want = [dot(a0, b0), dot(a0, b1), dot(a1, b0), dot(a1, b1)];
                let got = dots_2x2([a0, a1], [b0, b1]);
                assert_eq!(
                    got.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "length {len}"
                );
            }
            // The shorter operand decides the length.
            assert_eq!(dot(&a, &b[..len / 2]), dot(&a[..len / 2], &b[..len / 2]));
        }
    }

    /// Every 997th float bit pattern in `[lo, hi]` (normal floats: a subnormal result has fewer
    /// significant bits than ulp bounds assume), and the boundaries.
    fn samples(lo: f32, hi: f32) -> Vec<f32> {
        let mut xs: Vec<f32> = (0..u32::MAX / 997)
            .map(|i| f32::from_bits(i * 997))
            .flat_map(|x| [x, -x])
            .filter(|x| x.is_normal() && (lo..=hi).contains(x))
            .collect();
        xs.extend([lo, hi, 0.0, -0.0]);
        xs
    }

    fn max_relative_error(f: impl Fn(f32) -> f32, exact: impl Fn(f64) -> f64, xs: &[f32]) -> f64 {
        xs.iter()
            .map(|&x| {
                let want = exact(f64::from(x));
                let got = f64::from(f(x));
                if want == 0.0 {
                    got.abs()
                } else {
                    ((got - want) / want).abs()
                }
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn exp_is_within_a_few_ulp_and_saturates() {
        let xs = samples(-87.3, 88.7);
        assert!(max_relative_error(exp, f64::exp, &xs) < 4.0 * f64::from(f32::EPSILON));
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn tanh_and_erf_are_within_a_few_ulp() {
        let xs = samples(-10.0, 10.0);
        assert!(max_relative_error(tanh, f64::tanh, &xs) < 8.0 * f64::from(f32::EPSILON));
        let erf64 = |x: f64| libm::erf(x);
        assert!(max_relative_error(erf, erf64, &xs) < 8.0 * f64::from(f32::EPSILON));
        assert!((tanh(20.0) - 1.0).abs() <= f32::EPSILON);
        assert!((erf(-6.0) + 1.0).abs() <= 2.0 * f32::EPSILON);
        assert!(tanh(f32::NAN).is_nan() && erf(f32::NAN).is_nan());
    }

    #[test]
    fn sigmoid_saturates_without_nan() {
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }

    #[test]
    fn slice_loops_match_the_scalar_functions() {
        let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
        let ys: Vec<f32> = xs.iter().map(|&x| tanh(x)).collect();
        assert_eq!(map(&xs, tanh), ys);
        let mut sum = vec![1.0];
        extend_zip(&mut sum, &xs, 1, &[2.0], 0, xs.len(), |x, y| x + y);
        assert_eq!((sum.len(), sum[4]), (38, xs[3] + 2.0));
        assert_eq!(max(&xs), xs[36]);
        let mut e = xs.clone();
        let total = exp_shifted_in_place(&mut e, 1.0);
        let want: f32 = xs.iter().map(|&x| exp(x - 1.0)).sum();
        assert!((total - want).abs() <= want * 1e-6);
    }
}
