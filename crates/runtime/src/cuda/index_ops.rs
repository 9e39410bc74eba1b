//! Device gathers and scatters by index tensors on float data: GatherElements, GatherND,
//! ScatterElements (and Scatter) and ScatterND.
//!
//! The indices are integer tensors and so live on the host; the CPU kernels' own offset
//! functions (`kernels/movement.rs`, `kernels/scatter.rs`) check them and work out where each
//! row of data is read or written, and the device moves the floats (`gather_rows_f32`,
//! `scatter_rows_f32`). Only the offsets are uploaded, one per index row.

use std::collections::HashSet;

use cudarc::driver::PushKernelArg;

use super::gpu::{contiguous_strides, cuda_error, Gpu};
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{
    gather_elements_offsets, gather_nd_rows, max_unpool_targets, normalize_axis,
    scatter_elements_offsets, scatter_nd_rows, tensor_scatter_rows, Ctx,
};

/// `rows` rows of `len` floats of `x` starting at `starts`, as one tensor of `shape`.
pub(super) fn gather_rows(
    gpu: &Gpu,
    x: &DeviceTensor,
    starts: &[usize],
    len: usize,
    shape: Vec<usize>,
) -> OpResult {
    if starts.is_empty() || len == 0 {
        return Ok(None);
    }
    let offsets: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
    let offsets = gpu.upload(&offsets)?;
    let n = starts.len() * len;
    let mut out = gpu.alloc(n)?;
    let (rows, inner) = (starts.len() as i64, len as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.gather_rows);
    launch
        .arg(&*x.data)
        .arg(&offsets)
        .arg(&mut out)
        .arg(&rows)
        .arg(&inner);
    // SAFETY: argument types match `gather_rows_f32`; the offsets were checked against the
    // data's shape, so every row lies inside `x`.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

pub(super) fn gather_elements(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let starts = gather_elements_offsets(ctx, &x.shape, &indices)?;
    gather_rows(gpu, &x, &starts, 1, indices.shape().to_vec())
}

pub(super) fn gather_nd(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let rows = gather_nd_rows(ctx, &x.shape, &indices)?;
    gather_rows(gpu, &x, &rows.starts, rows.len, rows.shape)
}

/// ScatterND, ScatterElements and Scatter: the data copied, then the updates written over it.
pub(super) fn scatter(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(data), Some(indices), Some(updates)) = (
        device(gpu, args, 0)?,
        host(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let (starts, len) = if ctx.node.op_type == "ScatterND" {
        let rows = scatter_nd_rows(&data.shape, &indices, &updates.shape)?;
        (rows.starts, rows.len)
    } else {
        let offsets = scatter_elements_offsets(ctx, &data.shape, &indices, &updates.shape)?;
        (offsets, 1)
    };
    let mut reduction: i32 = match ctx.string("reduction", "none").as_str() {
        "none" => 0,
        "add" => 1,
        "mul" => 2,
        "max" => 3,
        "min" => 4,
        // An unknown reduction: the CPU kernel names it.
        _ => return Ok(None),
    };
    // Repeated targets without a reduction keep the last update, as on the CPU: written in
    // order rather than by racing threads.
    if reduction == 0 && starts.iter().collect::<HashSet<_>>().len() != starts.len() {
        reduction = 5;
    }
    scatter_rows(gpu, &data, (&starts, len), &updates, reduction)
}

/// A copy of `data` with row t of `len` floats of `updates` written at `starts[t]`, combined by
/// `reduction` (the codes of `scatter_rows_f32`).
fn scatter_rows(
    gpu: &Gpu,
    data: &DeviceTensor,
    (starts, len): (&[usize], usize),
    updates: &DeviceTensor,
    reduction: i32,
) -> OpResult {
    let strides = contiguous_strides(&data.shape);
    let mut out = gpu.gather_strided(&data.data, &data.shape, &strides, 0)?;
    if starts.is_empty() || len == 0 {
        return one(DeviceTensor::new(data.shape.clone(), out));
    }
    let offsets: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
    let offsets = gpu.upload(&offsets)?;
    let (rows, inner) = (starts.len() as i64, len as i64);
    let threads = if reduction == 0 {
        starts.len() * len
    } else {
        len
    };
    let mut launch = gpu.stream.launch_builder(&gpu.functions.scatter_rows);
    launch
        .arg(&mut out)
        .arg(&*updates.data)
        .arg(&offsets)
        .arg(&rows)
        .arg(&inner)
        .arg(&reduction);
    // SAFETY: argument types match `scatter_rows_f32`; the offsets were checked against the
    // data's shape and the updates hold rows · inner floats (checked with the offsets).
    unsafe { launch.launch(Gpu::grid(threads)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(data.shape.clone(), out))
}

/// [TensorScatter](https://onnx.ai/onnx/operators/onnx__TensorScatter.html) (opset 24): the
/// cache copied, each batch entry's update rows written over it where the CPU kernel's
/// `tensor_scatter_rows` puts them (checked there).
pub(super) fn tensor_scatter(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(cache), Some(update)) = (device(gpu, args, 0)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let write_indices = host(gpu, args, 2)?.map(|w| w.to_i64_vec());
    let (rows, inner) = tensor_scatter_rows(ctx, &cache.shape, &update.shape, write_indices)?;
    // The update's rows are read in order; the kernel takes row t from t · inner.
    let in_order = rows
        .iter()
        .enumerate()
        .all(|(t, &(_, from))| from == t * inner);
    let axis = normalize_axis(ctx.int("axis", -2), cache.shape.len())?;
    if !in_order || inner == 0 || cache.shape[axis] == 0 {
        return Ok(None);
    }
    let starts: Vec<usize> = rows.iter().map(|&(to, _)| to).collect();
    // Circular writes longer than the cache revisit positions: the last write wins, as on the
    // CPU.
    let reduction = if starts.iter().collect::<HashSet<_>>().len() == starts.len() {
        0
    } else {
        5
    };
    scatter_rows(gpu, &cache, (&starts, inner), &update, reduction)
}

/// [MaxUnpool](https://onnx.ai/onnx/operators/onnx__MaxUnpool.html) (opsets 9–22): zeros with
/// each input value written where its index (checked by the CPU kernel's
/// `max_unpool_targets`) puts it; a repeated target keeps the last, as on the CPU.
pub(super) fn max_unpool(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let output_shape = host(gpu, args, 2)?;
    let (targets, shape) = max_unpool_targets(ctx, &x.shape, &indices, output_shape.as_deref())?;
    let total: usize = shape.iter().product();
    if targets.len() != x.shape.iter().product::<usize>() || total == 0 {
        return Ok(None);
    }
    let zeros = gpu
        .stream
        .alloc_zeros::<f32>(total)
        .map_err(cuda_error("allocation"))?;
    let zeros = DeviceTensor::new(shape, zeros);
    let reduction = if targets.iter().collect::<HashSet<_>>().len() == targets.len() {
        0
    } else {
        5
    };
    scatter_rows(gpu, &zeros, (&targets, 1), &x, reduction)
}
