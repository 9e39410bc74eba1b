//! [Tile](https://onnx.ai/onnx/operators/onnx__Tile.html) (opsets 6–13) and
//! [Trilu](https://onnx.ai/onnx/operators/onnx__Trilu.html) (opset 14) on float tensors, with
//! the CPU kernels' rules (`kernels/movement.rs`).
//!
//! Tile needs no kernel of its own: the row-major output of `x` `[d0, d1, …]` repeated
//! `[r0, r1, …]` times is the strided view `[r0, d0, r1, d1, …]` of `x` with stride 0 on every
//! `r` axis, which `gather_strided_f32` copies (axes of size 1 dropped, so up to rank 8).

use cudarc::driver::PushKernelArg;

use super::ops::{contiguous_strides, cuda_error, device, host, one, Gpu, OpResult, MAX_RANK};
use super::{DeviceTensor, Value};
use crate::graph::DType;
use crate::runtime::kernels::Ctx;

/// The integer values of host input `i`, or `None` when it is absent or not integer.
fn host_ints(gpu: &Gpu, args: &[Option<Value>], i: usize) -> Result<Option<Vec<i64>>, String> {
    Ok(host(gpu, args, i)?
        .filter(|t| matches!(t.dtype(), DType::I64 | DType::I32))
        .map(|t| t.to_i64_vec()))
}

/// Tile: `x` repeated `repeats[k]` times along each axis k. Bad repeats (negative, one per axis
/// missing) and empty outputs are left to the CPU kernel.
pub(super) fn tile(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(repeats)) = (device(gpu, args, 0)?, host_ints(gpu, args, 1)?) else {
        return Ok(None);
    };
    if repeats.len() != x.shape.len() || repeats.iter().any(|&r| r < 1) {
        return Ok(None);
    }
    let strides = contiguous_strides(&x.shape);
    let (mut view_shape, mut view_strides) = (Vec::new(), Vec::new());
    for ((&size, &stride), &times) in x.shape.iter().zip(&strides).zip(&repeats) {
        for (extent, step) in [(times as usize, 0), (size, stride)] {
            if extent > 1 {
                view_shape.push(extent);
                view_strides.push(step);
            }
        }
    }
    if view_shape.len() > MAX_RANK {
        return Ok(None);
    }
    let out_shape: Vec<usize> = x
        .shape
        .iter()
        .zip(&repeats)
        .map(|(&size, &times)| size * times as usize)
        .collect();
    let data = gpu.gather_strided(&x.data, &view_shape, &view_strides, 0)?;
    one(DeviceTensor::new(out_shape, data))
}

/// Trilu: the upper (`upper` = 1, j − i ≥ k) or lower (j − i ≤ k) triangle of each trailing
/// matrix, zeros elsewhere; `k` from the optional input 1.
pub(super) fn trilu(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    if rank < 2 {
        return Ok(None);
    }
    let k = match args.get(1).and_then(|a| a.as_ref()) {
        None => 0,
        Some(_) => match host_ints(gpu, args, 1)? {
            Some(values) => values.first().copied().unwrap_or(0),
            None => return Ok(None),
        },
    };
    let n = x.data.len();
    let mut out = gpu.alloc(n)?;
    let (rows, cols) = (x.shape[rank - 2] as i64, x.shape[rank - 1] as i64);
    let (count, upper) = (n as i64, i32::from(ctx.int("upper", 1) != 0));
    let mut launch = gpu.stream.launch_builder(&gpu.functions.trilu);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&count)
        .arg(&rows)
        .arg(&cols)
        .arg(&k)
        .arg(&upper);
    // SAFETY: argument types match `trilu_f32`; both buffers hold n floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}
