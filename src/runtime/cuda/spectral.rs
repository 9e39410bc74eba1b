//! [DFT](https://onnx.ai/onnx/operators/onnx__DFT.html) on the device (opsets 17–20: `axis` an
//! attribute before 20, an input from 20; `dft_length` padding or truncating; `onesided`;
//! `inverse`; real or complex input), with the CPU kernel's geometry (`kernels/spectral.rs`,
//! `dft_lines`) and its twiddle table, so both sum the same factors in the same order in f64.
//!
//! `dft_f32` is a direct sum, a thread per output bin: O(length) work per bin, as the CPU
//! kernel's. Lengths met in models (audio frames of a few hundred samples) keep it cheap; an FFT
//! would pay off from lengths of a few thousand.

use cudarc::driver::PushKernelArg;

use super::ops::{cuda_error, device, host, one, Gpu, OpResult};
use super::{DeviceTensor, Value};
use crate::graph::DType;
use crate::runtime::kernels::{dft_lines, twiddles, Ctx};

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

pub(super) fn dft(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let (Some(length), Some(axis)) = (scalar(gpu, args, 1)?, scalar(gpu, args, 2)?) else {
        return Ok(None);
    };
    // A bad node (axis, length, shape) is left to the CPU kernel, which says what is wrong.
    let Ok(lines) = dft_lines(ctx, &x.shape, length, axis) else {
        return Ok(None);
    };
    let [outer, n, inner, parts] = lines.layout;
    let table: Vec<f64> = twiddles(lines.length, lines.inverse)
        .into_iter()
        .flat_map(|(c, s)| [c, s])
        .collect();
    let table = gpu.upload(&table)?;
    let bins = outer * lines.kept * inner;
    let mut out = gpu.alloc(bins * 2)?;
    let scale = if lines.inverse {
        1.0 / lines.length as f64
    } else {
        1.0
    };
    let (o, n, i, parts) = (outer as i64, n as i64, inner as i64, parts as i32);
    let (length, kept) = (lines.length as i64, lines.kept as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.dft);
    launch
        .arg(&*x.data)
        .arg(&table)
        .arg(&mut out)
        .arg(&o)
        .arg(&n)
        .arg(&i)
        .arg(&parts)
        .arg(&length)
        .arg(&kept)
        .arg(&scale);
    // SAFETY: argument types match `dft_f32`; `x` holds outer · n · inner · parts floats (its
    // shape gave the layout), the table 2 · length doubles, `out` two floats per bin.
    unsafe { launch.launch(Gpu::grid(bins)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(lines.out_shape, out))
}
