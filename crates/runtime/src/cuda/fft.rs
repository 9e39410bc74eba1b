//! DFT lines by fast transforms, for `spectral.rs` (DFT and STFT) from [`FAST_FROM`] bins up:
//! O(m log m) a line where the direct sum costs O(length²). Everything is in f64, as the CPU
//! kernel's direct sum, so the two differ by f64 rounding only (far below the f32 outputs').
//!
//! - A power-of-two length runs radix-2 Stockham steps (`fft_step_f64`, log₂ length launches
//!   over every line at once, ping-ponging between two buffers; natural order, no bit
//!   reversal) on the CPU kernel's twiddle table.
//! - Any other length runs Bluestein's algorithm: with the chirp w_t = exp(∓πi·t²/length)
//!   (t² taken mod 2·length, so the angle stays exact), bin k is w_k · Σ_j (x_j·w_j)·conj(w_{k−j}),
//!   a circular convolution of power-of-two size m ≥ 2·length − 1: both sides transformed
//!   forward, multiplied (`fft_multiply_f64`), transformed back.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::gpu::{cuda_error, Gpu};
use crate::kernels::twiddles;

/// Shortest transform taken here; shorter ones sum directly (`dft_f32`), as cheap at ≤ 256
/// products a bin.
pub(super) const FAST_FROM: usize = 16;

/// Complex values as (re, im) pairs of doubles.
fn pairs(values: impl IntoIterator<Item = (f64, f64)>) -> Vec<f64> {
    values.into_iter().flat_map(|(re, im)| [re, im]).collect()
}

fn alloc_f64(gpu: &Gpu, n: usize) -> Result<CudaSlice<f64>, String> {
    // SAFETY: every kernel writing into the buffer writes each of its `n` elements.
    unsafe { gpu.stream.alloc::<f64>(n) }.map_err(cuda_error("allocation"))
}

/// The DFT of every line of `x` (`[outer, n, inner, parts]`): `length` bins a line, the first
/// `kept` written as `[outer, kept, inner, 2]` floats; `inverse` with the 1/length factor.
pub(super) fn transform(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    layout: [usize; 4],
    (length, kept): (usize, usize),
    inverse: bool,
) -> Result<CudaSlice<f32>, String> {
    let [outer, n, inner, _] = layout;
    let lines = outer * inner;
    let samples = n.min(length);
    let scale = if inverse { 1.0 / length as f64 } else { 1.0 };
    if length.is_power_of_two() {
        let buf = load(gpu, x, layout, samples, length, None)?;
        let table = gpu.upload(&pairs(twiddles(length, inverse)))?;
        let buf = fft(gpu, buf, &table, lines, length)?;
        return store(gpu, &buf, [outer, kept, inner], length, scale, None);
    }
    let m = (2 * length - 1).next_power_of_two();
    let sign = if inverse { 1.0 } else { -1.0 };
    let twice = 2 * length as u64;
    let chirp: Vec<(f64, f64)> = (0..length as u64)
        .map(|t| {
            let angle = sign * std::f64::consts::PI * ((t * t) % twice) as f64 / length as f64;
            let (s, c) = angle.sin_cos();
            (c, s)
        })
        .collect();
    // The filter conj(w_t) at t and m − t, zero between.
    let mut filter = vec![(0.0, 0.0); m];
    for (t, &(c, s)) in chirp.iter().enumerate() {
        filter[t] = (c, -s);
        filter[(m - t) % m] = (c, -s);
    }
    let forward = gpu.upload(&pairs(twiddles(m, false)))?;
    let filter = gpu.upload(&pairs(filter))?;
    let filter = fft(gpu, filter, &forward, 1, m)?;
    let chirp = gpu.upload(&pairs(chirp))?;
    let buf = load(gpu, x, layout, samples, m, Some(&chirp))?;
    let mut buf = fft(gpu, buf, &forward, lines, m)?;
    let (lines64, m64) = (lines as i64, m as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fft.multiply);
    launch.arg(&mut buf).arg(&filter).arg(&lines64).arg(&m64);
    // SAFETY: argument types match `fft_multiply_f64`; `buf` holds lines · m complex values,
    // `filter` m.
    unsafe { launch.launch(Gpu::grid(lines * m)) }.map_err(cuda_error("launch"))?;
    let backward = gpu.upload(&pairs(twiddles(m, true)))?;
    let buf = fft(gpu, buf, &backward, lines, m)?;
    let scale = scale / m as f64;
    store(gpu, &buf, [outer, kept, inner], m, scale, Some(&chirp))
}

/// Rows of `m` complex values from the lines of `x`: the first `samples` (times the chirp when
/// given), then zeros.
fn load(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    [outer, n, inner, parts]: [usize; 4],
    samples: usize,
    m: usize,
    chirp: Option<&CudaSlice<f64>>,
) -> Result<CudaSlice<f64>, String> {
    let count = outer * inner * m;
    let mut buf = alloc_f64(gpu, 2 * count)?;
    let [o, n, i, samples, m] = [outer, n, inner, samples, m].map(|v| v as i64);
    let (parts, chirped) = (parts as i32, i32::from(chirp.is_some()));
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fft.load);
    launch.arg(x);
    // Without a chirp the row buffer stands in for its pointer, never read.
    let stand_in = alloc_f64(gpu, 1)?;
    launch.arg(chirp.unwrap_or(&stand_in));
    launch
        .arg(&mut buf)
        .arg(&o)
        .arg(&n)
        .arg(&i)
        .arg(&parts)
        .arg(&samples)
        .arg(&m)
        .arg(&chirped);
    // SAFETY: argument types match `fft_load_f64`; `x` holds outer · n · inner · parts floats,
    // the chirp `samples` complex values, `buf` outer · inner · m.
    unsafe { launch.launch(Gpu::grid(count)) }.map_err(cuda_error("launch"))?;
    Ok(buf)
}

/// The forward (or, by the table, backward) transform of every row of `buf` [lines, m], m a
/// power of two ≥ 2: log₂ m Stockham steps between two buffers; answers the one holding it.
fn fft(
    gpu: &Gpu,
    mut buf: CudaSlice<f64>,
    table: &CudaSlice<f64>,
    lines: usize,
    m: usize,
) -> Result<CudaSlice<f64>, String> {
    let mut other = alloc_f64(gpu, 2 * lines * m)?;
    let (lines64, m64) = (lines as i64, m as i64);
    let mut stride = 1usize;
    while stride < m {
        let stride64 = stride as i64;
        let mut launch = gpu.stream.launch_builder(&gpu.functions.fft.step);
        launch
            .arg(&buf)
            .arg(&mut other)
            .arg(table)
            .arg(&lines64)
            .arg(&m64)
            .arg(&stride64);
        // SAFETY: argument types match `fft_step_f64`; both buffers hold lines · m complex
        // values and the table m; every output position is written once.
        unsafe { launch.launch(Gpu::grid(lines * m / 2)) }.map_err(cuda_error("launch"))?;
        std::mem::swap(&mut buf, &mut other);
        stride *= 2;
    }
    Ok(buf)
}

/// `[outer, kept, inner, 2]` floats from the first `kept` values of each row (times the chirp
/// when given), times `scale`.
fn store(
    gpu: &Gpu,
    buf: &CudaSlice<f64>,
    [outer, kept, inner]: [usize; 3],
    m: usize,
    scale: f64,
    chirp: Option<&CudaSlice<f64>>,
) -> Result<CudaSlice<f32>, String> {
    let count = outer * kept * inner;
    let mut y = gpu.alloc(2 * count)?;
    let [o, kept, i, m] = [outer, kept, inner, m].map(|v| v as i64);
    let chirped = i32::from(chirp.is_some());
    let mut launch = gpu.stream.launch_builder(&gpu.functions.fft.store);
    launch.arg(buf);
    launch.arg(chirp.unwrap_or(buf));
    launch
        .arg(&mut y)
        .arg(&o)
        .arg(&kept)
        .arg(&i)
        .arg(&m)
        .arg(&scale)
        .arg(&chirped);
    // SAFETY: argument types match `fft_store_f32`; `buf` holds outer · inner · m complex
    // values (kept ≤ m), the chirp kept or more, `y` two floats a bin.
    unsafe { launch.launch(Gpu::grid(count)) }.map_err(cuda_error("launch"))?;
    Ok(y)
}
