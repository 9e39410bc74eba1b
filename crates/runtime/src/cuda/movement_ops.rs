//! Device ops that move float values without arithmetic, beyond those of `ops.rs`:
//! [Pad](https://onnx.ai/onnx/operators/onnx__Pad.html) (opsets 2–24, every mode: constant,
//! edge, reflect, wrap; negative pads crop) and
//! [ReverseSequence](https://onnx.ai/onnx/operators/onnx__ReverseSequence.html) (opset 10).
//! Pads, axes and lengths are integers and so on the host; anything the CPU kernels reject is
//! left to them, to say why.

use cudarc::driver::PushKernelArg;

use super::gpu::{contiguous_strides, cuda_error, dims, numel, Gpu};
use super::index_ops::gather_rows;
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{normalize_axis, Ctx};

/// Pad through `pad_f32`, a thread per output element.
pub(super) fn pad(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let mode: i32 = match ctx.string("mode", "constant").as_str() {
        "constant" => 0,
        "edge" => 1,
        "reflect" => 2,
        "wrap" => 3,
        _ => return Ok(None),
    };
    let (pads, value) = if ctx.opset < 11 {
        (
            ctx.ints("pads").unwrap_or_default(),
            ctx.float("value", 0.0),
        )
    } else {
        let Some(pads) = host(gpu, args, 1)? else {
            return Ok(None);
        };
        let value = match host(gpu, args, 2)? {
            Some(v) => v.to_f32_vec().first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        (pads.to_i64_vec(), value)
    };
    let axes: Vec<usize> = match host(gpu, args, 3)? {
        Some(a) => match a
            .to_i64_vec()
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()
        {
            Ok(axes) => axes,
            Err(_) => return Ok(None),
        },
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Ok(None);
    }
    let mut begin = vec![0i64; rank];
    let mut shape = x.shape.clone();
    for (k, &axis) in axes.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + axes.len()]);
        let size = i128::from(before) + i128::from(after) + x.shape[axis] as i128;
        // A negative size, or one past memory, is the CPU kernel's error to report.
        let Some(size) = usize::try_from(size)
            .ok()
            .filter(|&s| s <= u32::MAX as usize)
        else {
            return Ok(None);
        };
        begin[axis] = before;
        shape[axis] = size;
    }
    let n = numel(&shape);
    // Reflecting or wrapping an empty axis has no source; an empty output has no work.
    if n == 0 || (mode != 0 && x.shape.contains(&0)) {
        return Ok(None);
    }
    let in_shape: Vec<i64> = x.shape.iter().map(|&s| s as i64).collect();
    let d = dims(&shape, &[&contiguous_strides(&x.shape), &begin, &in_shape])?;
    let mut out = gpu.alloc(n)?;
    let n_i = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.pad);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&n_i)
        .arg(&d)
        .arg(&mode)
        .arg(&value);
    // SAFETY: argument types match `pad_f32`; every coordinate it reads is inside the input
    // (the constant's are not read; the others are folded into [0, size)).
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// ReverseSequence: each batch entry's first `len` time steps reversed. The output is rows of
/// the contiguous block after both axes, each read from the row the lengths name (worked out on
/// the host, where they are).
pub(super) fn reverse_sequence(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(lens)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let shape = &x.shape;
    let rank = shape.len();
    let (Ok(time), Ok(batch)) = (
        normalize_axis(ctx.int("time_axis", 0), rank),
        normalize_axis(ctx.int("batch_axis", 1), rank),
    ) else {
        return Ok(None);
    };
    let lens = lens.to_i64_vec();
    if time == batch || rank < 2 || lens.len() != shape[batch] {
        return Ok(None);
    }
    let strides = contiguous_strides(shape);
    let (time_stride, batch_stride) = (strides[time] as usize, strides[batch] as usize);
    let inner = numel(&shape[time.max(batch) + 1..]);
    let starts: Vec<usize> = (0..numel(shape) / inner)
        .map(|row| {
            let flat = row * inner;
            let t = (flat / time_stride) % shape[time];
            let b = (flat / batch_stride) % shape[batch];
            let len = lens[b].clamp(0, shape[time] as i64) as usize;
            if t < len {
                flat - t * time_stride + (len - 1 - t) * time_stride
            } else {
                flat
            }
        })
        .collect();
    gather_rows(gpu, &x, &starts, inner, shape.clone())
}
