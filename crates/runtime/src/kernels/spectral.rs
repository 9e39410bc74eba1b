//! Spectral ops, after the ONNX reference (numpy's FFT semantics):
//! [DFT](https://onnx.ai/onnx/operators/onnx__DFT.html) (opsets 17–20; `axis` an attribute
//! before 20, an input from 20), [STFT](https://onnx.ai/onnx/operators/onnx__STFT.html) (17) and
//! [MelWeightMatrix](https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html) (17).
//!
//! Complex tensors are real ones with a last axis of 2 (real, imaginary); a last axis of 1 is a
//! real signal. Each line is transformed in f64 by `rustfft` (O(n log n) for every length, prime
//! ones included), planned once per node for its length: the direct O(n²) sum it replaced made
//! a filterbank of 512-point frames 24–38× slower than onnxruntime (issue 36).

use rustfft::num_complex::Complex;
use rustfft::FftPlanner;

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::{checked_size, normalize_axis};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["DFT"], dft);
    t.add(&["STFT"], stft);
    t.add(&["MelWeightMatrix"], mel_weight_matrix);
}

/// The scalar integer in an optional input.
fn scalar_int(inputs: &[Option<&HostTensor>], i: usize) -> Option<i64> {
    optional(inputs, i).and_then(|t| t.to_i64_vec().first().copied())
}

/// `e^{∓2πi·m/length}` for m in 0..length, as (cos, sin): bin k of a line takes sample n's
/// factor at m = k·n mod length, so a transform evaluates `length` sines and cosines, not
/// length² (the CUDA DFT's table; the CPU transforms through `rustfft`).
#[cfg(feature = "cuda")]
pub(crate) fn twiddles(length: usize, inverse: bool) -> Vec<(f64, f64)> {
    let sign = if inverse { 1.0 } else { -1.0 };
    (0..length)
        .map(|m| {
            let (s, c) = (sign * 2.0 * std::f64::consts::PI * m as f64 / length as f64).sin_cos();
            (c, s)
        })
        .collect()
}

/// Transforms every line of `x` (`[outer, n, inner, parts]`, parts 1 or 2) along its axis `n`,
/// cut or zero-padded to `length` samples (numpy's `n`), keeping the first `kept` of `length`
/// bins, `inverse` with the `1/length` factor of `ifft`; the result is `[outer, kept, inner, 2]`.
fn transform_lines(
    x: &[f32],
    [outer, n, inner, parts]: [usize; 4],
    length: usize,
    kept: usize,
    inverse: bool,
) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; checked_size(&[outer, kept, inner, 2])?];
    let mut planner = FftPlanner::<f64>::new();
    let fft = match inverse {
        true => planner.plan_fft_inverse(length),
        false => planner.plan_fft_forward(length),
    };
    let scale = if inverse { 1.0 / length as f64 } else { 1.0 };
    let mut line = vec![Complex::default(); length];
    let mut scratch = vec![Complex::default(); fft.get_inplace_scratch_len()];
    for o in 0..outer {
        for i in 0..inner {
            line.fill(Complex::default());
            for (j, sample) in line.iter_mut().enumerate().take(n) {
                let at = ((o * n + j) * inner + i) * parts;
                let im = if parts == 2 { x[at + 1] as f64 } else { 0.0 };
                *sample = Complex::new(x[at] as f64, im);
            }
            fft.process_with_scratch(&mut line, &mut scratch);
            for (k, bin) in line.iter().take(kept).enumerate() {
                let at = ((o * kept + k) * inner + i) * 2;
                out[at] = (bin.re * scale) as f32;
                out[at + 1] = (bin.im * scale) as f32;
            }
        }
    }
    Ok(out)
}

/// numpy's `irfft` of every line of `x` (`[outer, n, inner, parts]`): bins `0..=length/2` (cut
/// or zero-padded) complete a Hermitian spectrum (the imaginary parts of bin 0 and, for an even
/// length, bin `length/2` ignored, as pocketfft ignores them), whose inverse transform with the
/// `1/length` factor is real: `[outer, length, inner, 1]`.
fn inverse_real_lines(
    x: &[f32],
    [outer, n, inner, parts]: [usize; 4],
    length: usize,
) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; checked_size(&[outer, length, inner])?];
    let fft = FftPlanner::<f64>::new().plan_fft_inverse(length);
    let mut line = vec![Complex::default(); length];
    let mut scratch = vec![Complex::default(); fft.get_inplace_scratch_len()];
    let half = length / 2;
    for o in 0..outer {
        for i in 0..inner {
            line.fill(Complex::default());
            for (k, bin) in line.iter_mut().enumerate().take(n.min(half + 1)) {
                let at = ((o * n + k) * inner + i) * parts;
                let im = if parts == 2 { x[at + 1] as f64 } else { 0.0 };
                *bin = Complex::new(x[at] as f64, im);
            }
            line[0].im = 0.0;
            if length.is_multiple_of(2) {
                line[half].im = 0.0;
            }
            for k in 1..length.div_ceil(2) {
                line[length - k] = line[k].conj();
            }
            fft.process_with_scratch(&mut line, &mut scratch);
            for (j, sample) in line.iter().enumerate() {
                out[(o * length + j) * inner + i] = (sample.re / length as f64) as f32;
            }
        }
    }
    Ok(out)
}

/// What a DFT node does to its input: the lines it transforms and the bins it keeps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DftLines {
    /// The input as `[outer, n, inner, parts]`: lines of `n` samples along the axis, each
    /// sample 1 (real) or 2 (complex) floats.
    pub(crate) layout: [usize; 4],
    /// The transform's length (`dft_length`, default n): the line cut or zero-padded to it.
    pub(crate) length: usize,
    /// The bins kept: `length`, or `length/2 + 1` when `onesided`; the samples of a real
    /// inverse (`length`).
    pub(crate) kept: usize,
    pub(crate) inverse: bool,
    /// An inverse of a one-sided spectrum (numpy's `irfft`, the reference of onnx 1.23): the
    /// line's first `length/2 + 1` bins stand for the whole Hermitian spectrum, and the output
    /// is the real signal, `[..., length, ..., 1]`.
    pub(crate) real_inverse: bool,
    pub(crate) out_shape: Vec<usize>,
}

/// The DFT of a node with input `shape` (`[..., 1 or 2]`): `dft_length` and `axis` are its
/// inputs 1 and 2 (opset 20; before, `axis` is an attribute).
pub(crate) fn dft_lines(
    ctx: &Ctx,
    shape: &[usize],
    dft_length: Option<i64>,
    axis_input: Option<i64>,
) -> Result<DftLines, String> {
    let parts = *shape
        .last()
        .filter(|&&p| p == 1 || p == 2)
        .ok_or_else(|| format!("the input {shape:?} must end in 1 (real) or 2 (complex)"))?;
    let axis = if ctx.opset >= 20 {
        axis_input.unwrap_or(-2)
    } else {
        ctx.int("axis", 1)
    };
    let axis = normalize_axis(axis, shape.len())?;
    if axis == shape.len() - 1 {
        return Err("the transformed axis cannot be the last (real/imaginary) one".into());
    }
    let n = shape[axis];
    let (onesided, inverse) = (ctx.int("onesided", 0) != 0, ctx.int("inverse", 0) != 0);
    let real_inverse = onesided && inverse;
    let length = match dft_length {
        Some(l) => usize::try_from(l)
            .ok()
            .filter(|&l| l > 0)
            .ok_or(format!("dft_length {l} is not positive"))?,
        None if real_inverse => 2 * n.saturating_sub(1),
        None => n,
    };
    if length == 0 {
        return Err(format!("a one-sided inverse of {n} bins needs dft_length"));
    }
    let kept = if onesided && !inverse {
        length / 2 + 1
    } else {
        length
    };
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..shape.len() - 1].iter().product();
    let mut out_shape = shape.to_vec();
    out_shape[axis] = kept;
    *out_shape.last_mut().expect("the input has an axis") = if real_inverse { 1 } else { 2 };
    Ok(DftLines {
        layout: [outer, n, inner, parts],
        length,
        kept,
        inverse,
        real_inverse,
        out_shape,
    })
}

/// DFT: the transform of length `dft_length` (default the axis's size) along `axis`, only the
/// first `length/2 + 1` bins when `onesided`.
fn dft(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let lines = dft_lines(ctx, x.shape(), scalar_int(inputs, 1), scalar_int(inputs, 2))?;
    if lines.real_inverse {
        let out = inverse_real_lines(&x.to_f32_vec(), lines.layout, lines.length)?;
        return Ok(vec![HostTensor::f32(lines.out_shape, out)]);
    }
    let out = transform_lines(
        &x.to_f32_vec(),
        lines.layout,
        lines.length,
        lines.kept,
        lines.inverse,
    )?;
    Ok(vec![HostTensor::f32(lines.out_shape, out)])
}

/// How an STFT node cuts its signal into frames (shared with the CUDA STFT).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StftFrames {
    pub(crate) batch: usize,
    pub(crate) samples: usize,
    /// 1 (real) or 2 (complex) floats a sample.
    pub(crate) parts: usize,
    pub(crate) step: usize,
    /// The transform's length (`frame_length`, else the window's, else the signal's).
    pub(crate) frame: usize,
    /// Samples a frame takes (the window's length, else `frame`).
    pub(crate) window_len: usize,
    pub(crate) frames: usize,
    pub(crate) bins: usize,
}

/// The frames of an STFT of a signal of `shape` `[batch, length, 1 or 2]` (or a real
/// `[batch, length]`, as onnxruntime accepts), from its inputs `frame_step`, the window's
/// length and `frame_length`.
pub(crate) fn stft_frames(
    ctx: &Ctx,
    shape: &[usize],
    step: Option<i64>,
    window_len: Option<usize>,
    frame_length: Option<i64>,
) -> Result<StftFrames, String> {
    let [batch, samples, parts] = match *shape {
        [batch, samples] => [batch, samples, 1],
        [batch, samples, parts] => [batch, samples, parts],
        _ => {
            return Err(format!(
                "the signal {shape:?} is not [batch, length, 1 or 2] (nor a real [batch, length])"
            ))
        }
    };
    let step = step
        .and_then(|s| usize::try_from(s).ok())
        .filter(|&s| s > 0)
        .ok_or("frame_step must be a positive scalar")?;
    let frame = match (frame_length, window_len) {
        (Some(l), _) => usize::try_from(l).map_err(|_| format!("frame_length {l} is negative"))?,
        (None, Some(w)) => w,
        (None, None) => samples,
    };
    let window_len = window_len.unwrap_or(frame);
    if frame == 0 || frame > samples || window_len == 0 {
        return Err(format!(
            "frames of {frame} samples do not fit a signal of {samples}"
        ));
    }
    let bins = if ctx.int("onesided", 1) != 0 {
        frame / 2 + 1
    } else {
        frame
    };
    Ok(StftFrames {
        batch,
        samples,
        parts,
        step,
        frame,
        window_len,
        frames: 1 + (samples - frame) / step,
        bins,
    })
}

/// STFT: frames of `frame_length` samples every `frame_step`, each weighted by the window and
/// transformed; `[batch, frames, bins, 2]`.
fn stft(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let window = optional(inputs, 2).map(|w| w.to_f32_vec());
    let StftFrames {
        batch,
        samples,
        parts,
        step,
        frame,
        window_len,
        frames,
        bins,
    } = stft_frames(
        ctx,
        x.shape(),
        scalar_int(inputs, 1),
        window.as_ref().map(Vec::len),
        scalar_int(inputs, 3),
    )?;
    let window = window.unwrap_or_else(|| vec![1.0; frame]);
    let xv = x.to_f32_vec();
    // Each frame is the window's length of samples (zero past the signal's end), weighted.
    let mut framed = vec![0f32; checked_size(&[batch, frames, window_len, parts])?];
    for b in 0..batch {
        for f in 0..frames {
            for (j, &w) in window.iter().enumerate() {
                let s = f * step + j;
                if s >= samples {
                    continue;
                }
                for p in 0..parts {
                    framed[((b * frames + f) * window_len + j) * parts + p] =
                        xv[(b * samples + s) * parts + p] * w;
                }
            }
        }
    }
    let out = transform_lines(
        &framed,
        [batch * frames, window_len, 1, parts],
        frame,
        bins,
        false,
    )?;
    Ok(vec![HostTensor::f32(vec![batch, frames, bins, 2], out)])
}

/// The `num_mel_bins + 2` filter edges of MelWeightMatrix, as spectrogram bins: evenly spaced
/// on the mel scale between the edge frequencies, rounded down (the device op uses them too).
pub(crate) fn mel_filter_edges(
    mel_bins: usize,
    dft_length: i64,
    sample_rate: i64,
    lower: f64,
    upper: f64,
) -> Vec<i64> {
    let to_mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
    let (low, high) = (to_mel(lower), to_mel(upper));
    let step = (high - low) / (mel_bins + 2) as f64;
    (0..mel_bins + 2)
        .map(|i| {
            let hz = 700.0 * (10f64.powf((i as f64 * step + low) / 2595.0) - 1.0);
            ((dft_length + 1) as f64 * hz / sample_rate as f64).floor() as i64
        })
        .collect()
}

/// The scalar inputs of MelWeightMatrix: `num_mel_bins`, `dft_length`, `sample_rate`, and the
/// lower and upper edge frequencies.
pub(crate) fn mel_inputs(
    inputs: &[Option<&HostTensor>],
) -> Result<(i64, i64, i64, f64, f64), String> {
    let int = |i: usize| scalar_int(inputs, i).ok_or(format!("input {i} must be a scalar"));
    let float = |i: usize| {
        input(inputs, i)?
            .to_f32_vec()
            .first()
            .map(|&v| v as f64)
            .ok_or(format!("input {i} must be a scalar"))
    };
    let (mel_bins, dft_length, sample_rate) = (int(0)?, int(1)?, int(2)?);
    let (lower, upper) = (float(3)?, float(4)?);
    if mel_bins < 0 || dft_length < 0 || sample_rate <= 0 {
        return Err(format!("num_mel_bins {mel_bins}, dft_length {dft_length} and sample_rate {sample_rate} must be positive"));
    }
    Ok((mel_bins, dft_length, sample_rate, lower, upper))
}

/// MelWeightMatrix: `[dft_length/2 + 1, num_mel_bins]` triangular filters, evenly spaced on the
/// mel scale between the edge frequencies, as the reference computes them (bin edges rounded
/// down to spectrogram bins).
fn mel_weight_matrix(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (mel_bins, dft_length, sample_rate, lower, upper) = mel_inputs(inputs)?;
    let (mel_bins, spectrogram_bins) = (mel_bins as usize, dft_length as usize / 2 + 1);
    let mut out = vec![0f32; checked_size(&[spectrogram_bins, mel_bins])?];
    let edges = mel_filter_edges(mel_bins, dft_length, sample_rate, lower, upper);
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), String> {
        let j = usize::try_from(j).ok().filter(|&j| j < spectrogram_bins);
        let j = j.ok_or("a filter edge falls outside the spectrogram")?;
        out[j * mel_bins + i] = v as f32;
        Ok(())
    };
    for i in 0..mel_bins {
        let (left, center, right) = (edges[i], edges[i + 1], edges[i + 2]);
        if center == left {
            set(center, i, 1.0)?;
        } else {
            for j in left..=center {
                set(j, i, (j - left) as f64 / (center - left) as f64)?;
            }
        }
        for j in center..right {
            set(j, i, (right - j) as f64 / (right - center) as f64)?;
        }
    }
    Ok(vec![HostTensor::f32(vec![spectrogram_bins, mel_bins], out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, run};

    #[test]
    fn dft_of_an_impulse_is_flat_and_the_inverse_restores_it() {
        let x = f(&[1, 4, 1], &[1.0, 0.0, 0.0, 0.0]);
        let spectrum = run("DFT", vec![], &[&x]);
        assert_close(
            &spectrum[0],
            &[1, 4, 2],
            &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
        );
        let node = super::super::test_util::node(
            "DFT",
            vec![("inverse", pipecut_ir::graph::Attribute::Int(1))],
        );
        let ctx = super::Ctx {
            node: &node,
            opset: 17,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let back = super::dft(&ctx, &[Some(&spectrum[0])]).unwrap();
        assert_close(
            &back[0],
            &[1, 4, 2],
            &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        );
    }
}
