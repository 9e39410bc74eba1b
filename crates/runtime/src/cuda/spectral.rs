//! [DFT](https://onnx.ai/onnx/operators/onnx__DFT.html) on the device (opsets 17–20: `axis` an
//! attribute before 20, an input from 20; `dft_length` padding or truncating; `onesided`;
//! `inverse`; real or complex input) and STFT, with the CPU kernels' geometry
//! (`kernels/spectral.rs`: `dft_lines`, `stft_frames`) and their twiddle table, so both sum the
//! same factors in the same order in f64.
//!
//! Transforms of [`FAST_FROM`] bins or more run as fast transforms (`fft.rs`: radix-2 for
//! powers of two, Bluestein's algorithm otherwise, in f64); shorter ones run `dft_f32`, a
//! direct sum a thread per output bin over the CPU kernel's own twiddle table, so both add the
//! same factors in the same order.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::fft::FAST_FROM;
use super::gpu::{cuda_error, Gpu};
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{dft_lines, stft_frames, twiddles, Ctx};
use pipecut_ir::graph::DType;

/// The integer scalar of the optional host input `i` (`dft_length`, `axis`): `Some(None)` when
/// it is absent, `None` when it is not an integer tensor the host holds.
fn scalar(gpu: &Gpu, args: &[Option<Value>], i: usize) -> Result<Option<Option<i64>>, String> {
    match args.get(i).and_then(|a| a.as_ref()) {
        None => Ok(Some(None)),
        Some(Value::Device(_)) => Ok(None),
        Some(_) => Ok(host(gpu, args, i)?
            .filter(|t| matches!(t.dtype(), DType::I64 | DType::I32))
            .map(|t| t.to_i64_vec().first().copied())),
    }
}

/// Launches `dft_f32` over the lines of `x` (`[outer, n, inner, parts]`): `length` bins a
/// line, the first `kept` written, as `[outer, kept, inner, 2]`.
fn transform_lines(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    [outer, n, inner, parts]: [usize; 4],
    (length, kept): (usize, usize),
    inverse: bool,
) -> Result<CudaSlice<f32>, String> {
    if length >= FAST_FROM {
        return super::fft::transform(gpu, x, [outer, n, inner, parts], (length, kept), inverse);
    }
    let table: Vec<f64> = twiddles(length, inverse)
        .into_iter()
        .flat_map(|(c, s)| [c, s])
        .collect();
    let table = gpu.upload(&table)?;
    let bins = outer * kept * inner;
    let mut out = gpu.alloc(bins * 2)?;
    let scale = if inverse { 1.0 / length as f64 } else { 1.0 };
    let (o, n, i, parts) = (outer as i64, n as i64, inner as i64, parts as i32);
    let (length, kept) = (length as i64, kept as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.dft);
    launch
        .arg(x)
        .arg(&table)
        .arg(&mut out)
        .arg(&o)
        .arg(&n)
        .arg(&i)
        .arg(&parts)
        .arg(&length)
        .arg(&kept)
        .arg(&scale);
    // SAFETY: argument types match `dft_f32`; `x` holds outer · n · inner · parts floats (the
    // callers' layouts come from its shape), the table 2 · length doubles, `out` two floats a
    // bin.
    unsafe { launch.launch(Gpu::grid(bins)) }.map_err(cuda_error("launch"))?;
    Ok(out)
}

pub(super) fn dft(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let (Some(length), Some(axis)) = (scalar(gpu, args, 1)?, scalar(gpu, args, 2)?) else {
        return Ok(None);
    };
    // A bad node (axis, length, shape) is left to the CPU kernel, which says what is wrong.
    // So is a one-sided inverse (a real signal out), which the device kernel does not make.
    let Ok(lines) = dft_lines(ctx, &x.shape, length, axis) else {
        return Ok(None);
    };
    if lines.real_inverse {
        return Ok(None);
    }
    let sizes = (lines.length, lines.kept);
    let out = transform_lines(gpu, &x.data, lines.layout, sizes, lines.inverse)?;
    one(DeviceTensor::new(lines.out_shape, out))
}

/// [STFT](https://onnx.ai/onnx/operators/onnx__STFT.html) (opset 17): `stft_frames_f32` cuts
/// the signal into window-weighted frames, then `dft_f32` transforms each, as the CPU kernel
/// does on the host. `frame_step` and `frame_length` are host integers; the window may be on
/// either side.
pub(super) fn stft(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let window = match args.get(2).and_then(|a| a.as_ref()) {
        None => None,
        Some(_) => match device(gpu, args, 2)? {
            Some(w) => Some(w),
            None => return Ok(None),
        },
    };
    let (Some(step), Some(frame_length)) = (scalar(gpu, args, 1)?, scalar(gpu, args, 3)?) else {
        return Ok(None);
    };
    let window_len = window.as_ref().map(|w| w.data.len());
    let Ok(g) = stft_frames(ctx, &x.shape, step, window_len, frame_length) else {
        return Ok(None);
    };
    if !(1..=2).contains(&g.parts) {
        return Ok(None);
    }
    let framed_len = g.batch * g.frames * g.window_len * g.parts;
    let mut framed = gpu.alloc(framed_len)?;
    let (batch, samples, parts) = (g.batch as i64, g.samples as i64, g.parts as i64);
    let (frames, step, window_len) = (g.frames as i64, g.step as i64, g.window_len as i64);
    let weighted = i32::from(window.is_some());
    let mut launch = gpu.stream.launch_builder(&gpu.functions.stft_frames);
    launch.arg(&*x.data);
    match &window {
        Some(w) => launch.arg(&*w.data),
        // Never read without a window; the signal stands in for the pointer.
        None => launch.arg(&*x.data),
    };
    launch
        .arg(&mut framed)
        .arg(&batch)
        .arg(&samples)
        .arg(&parts)
        .arg(&frames)
        .arg(&step)
        .arg(&window_len)
        .arg(&weighted);
    // SAFETY: argument types match `stft_frames_f32`; it reads samples below `samples` of each
    // of `batch` signals and `window_len` window values, and writes `framed_len` floats.
    unsafe { launch.launch(Gpu::grid(framed_len)) }.map_err(cuda_error("launch"))?;
    let layout = [g.batch * g.frames, g.window_len, 1, g.parts];
    let out = transform_lines(gpu, &framed, layout, (g.frame, g.bins), false)?;
    one(DeviceTensor::new(vec![g.batch, g.frames, g.bins, 2], out))
}
