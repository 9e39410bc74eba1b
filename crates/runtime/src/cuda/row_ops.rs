//! Device ops along one axis or over rows: Softmax, LogSoftmax and Hardmax (any axis), the
//! normalisations (LayerNormalization with its optional statistics, RMSNormalization,
//! InstanceNormalization, GroupNormalization, LRN), ArgMax/ArgMin and CumSum.
//!
//! Each views its input as `[outer, axis, inner]` or as rows of contiguous values, as the CPU
//! kernels of `kernels/axis_ops.rs`, `kernels/norm.rs` and `kernels/channel_norm.rs` do; an
//! op over a non-trailing axis that needs rows moves the axis last with one strided copy.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::gpu::{contiguous_strides, cuda_error, numel, Gpu};
use super::operands::{device, extra_outputs, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{normalize_axis, Ctx};
use crate::tensor::HostTensor;

/// `x` with `axis` moved last (a strided copy), or `x` itself when it is last already.
fn axis_last(gpu: &Gpu, x: &DeviceTensor, axis: usize) -> Result<DeviceTensor, String> {
    let rank = x.shape.len();
    if axis + 1 == rank {
        return Ok(x.clone());
    }
    let perm: Vec<usize> = (0..rank).filter(|&a| a != axis).chain([axis]).collect();
    permute(gpu, x, &perm)
}

/// `x` transposed by `perm` (output axis i is input axis perm[i]).
fn permute(gpu: &Gpu, x: &DeviceTensor, perm: &[usize]) -> Result<DeviceTensor, String> {
    let strides = contiguous_strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let moved: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &shape, &moved, 0)?;
    Ok(DeviceTensor::new(shape, data))
}

/// Softmax (mode 0), LogSoftmax (1) or Hardmax (2). Before opset 13 the input is flattened at
/// `axis` into rows; from 13 on the axis alone is the row, moved last when it is not.
pub(super) fn softmax(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let mode: i32 = match ctx.node.op_type.as_str() {
        "Softmax" => 0,
        "LogSoftmax" => 1,
        _ => 2,
    };
    let rank = x.shape.len();
    if rank == 0 {
        return Ok(None);
    }
    let axis = normalize_axis(ctx.int("axis", if ctx.opset >= 13 { -1 } else { 1 }), rank)?;
    if ctx.opset < 13 {
        let cols = numel(&x.shape[axis..]);
        let out = softmax_rows(gpu, &x, cols, mode)?;
        return one(DeviceTensor::new(x.shape.clone(), out));
    }
    one(softmax_axis(gpu, &x, axis, mode)?)
}

/// Softmax (`mode` 0), LogSoftmax (1) or Hardmax (2) of `x` over `axis`.
pub(super) fn softmax_axis(
    gpu: &Gpu,
    x: &DeviceTensor,
    axis: usize,
    mode: i32,
) -> Result<DeviceTensor, String> {
    let rank = x.shape.len();
    let moved = axis_last(gpu, x, axis)?;
    let out = softmax_rows(gpu, &moved, x.shape[axis], mode)?;
    let out = DeviceTensor::new(moved.shape.clone(), out);
    if axis + 1 == rank {
        return Ok(out);
    }
    // Back: the last axis returns to `axis`.
    let perm: Vec<usize> = (0..rank)
        .map(|a| match a.cmp(&axis) {
            std::cmp::Ordering::Less => a,
            std::cmp::Ordering::Equal => rank - 1,
            std::cmp::Ordering::Greater => a - 1,
        })
        .collect();
    permute(gpu, &out, &perm)
}

fn softmax_rows(
    gpu: &Gpu,
    x: &DeviceTensor,
    cols: usize,
    mode: i32,
) -> Result<cudarc::driver::CudaSlice<f32>, String> {
    let rows = numel(&x.shape) / cols.max(1);
    let mut out = gpu.alloc(rows * cols)?;
    let (r, c) = (rows as i64, cols as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.softmax_rows);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&r)
        .arg(&c)
        .arg(&mode);
    // SAFETY: argument types match `softmax_rows_f32`; shared memory is one float per thread.
    unsafe { launch.launch(Gpu::rows(rows)) }.map_err(cuda_error("launch"))?;
    Ok(out)
}

/// LayerNormalization (with its Mean and InvStdDev outputs when asked for) and
/// RMSNormalization over the axes from `axis` on; a scale or bias not of the normalised size
/// (broadcast) is left to the CPU.
pub(super) fn norm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], rms: bool) -> OpResult {
    let (Some(x), Some(scale)) = (device(gpu, args, 0)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let bias = if rms { None } else { device(gpu, args, 2)? };
    let stats = !rms && extra_outputs(ctx);
    if rms && extra_outputs(ctx) {
        return Ok(None);
    }
    let axis = normalize_axis(ctx.int("axis", -1), x.shape.len())?;
    let cols = numel(&x.shape[axis..]);
    if numel(&scale.shape) != cols || bias.as_ref().is_some_and(|b| numel(&b.shape) != cols) {
        return Ok(None);
    }
    let epsilon = ctx.float("epsilon", 1e-5);
    let NormalizedRows {
        out,
        mean,
        inv_deviation: inv,
    } = normalize_rows(gpu, &x, &scale, bias.as_ref(), (epsilon, rms))?;
    let mut results = vec![Value::Device(DeviceTensor::new(x.shape.clone(), out))];
    if stats {
        let mut stat_shape = x.shape[..axis].to_vec();
        stat_shape.resize(x.shape.len(), 1);
        results.push(Value::Device(DeviceTensor::new(stat_shape.clone(), mean)));
        results.push(Value::Device(DeviceTensor::new(stat_shape, inv)));
    }
    Ok(Some(results))
}

/// What [`normalize_rows`] gives: the rows normalised, and each row's statistics.
pub(super) struct NormalizedRows {
    pub(super) out: CudaSlice<f32>,
    /// 0 for a root-mean-square normalisation.
    pub(super) mean: CudaSlice<f32>,
    pub(super) inv_deviation: CudaSlice<f32>,
}

/// Normalises each row of `x` (its last `scale` elements a row) by its mean and variance, or
/// by its root mean square when `rms`, times `scale` plus `bias`: the output, and each row's
/// mean (0 when `rms`) and inverse deviation. Scale and bias hold a row's length of floats.
pub(super) fn normalize_rows(
    gpu: &Gpu,
    x: &DeviceTensor,
    scale: &DeviceTensor,
    bias: Option<&DeviceTensor>,
    (epsilon, rms): (f32, bool),
) -> Result<NormalizedRows, String> {
    let cols = scale.data.len();
    let rows = x.data.len() / cols.max(1);
    let mut out = gpu.alloc(rows * cols)?;
    // The kernel writes each row's statistics; they are a float or two per row, returned only
    // when the node asks for them.
    let (mut mean, mut inv) = (gpu.alloc(rows)?, gpu.alloc(rows)?);
    let (r, c, flag) = (rows as i64, cols as i64, rms as i32);
    let has_bias = bias.is_some() as i32;
    // Without a bias the kernel never reads its bias argument; the scale stands in.
    let bias_data = bias.map_or(&*scale.data, |b| &*b.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.norm_rows);
    launch
        .arg(&*x.data)
        .arg(&*scale.data)
        .arg(bias_data)
        .arg(&mut out)
        .arg(&r)
        .arg(&c)
        .arg(&epsilon)
        .arg(&flag)
        .arg(&has_bias)
        .arg(&mut mean)
        .arg(&mut inv);
    // SAFETY: argument types match `norm_rows_f32`; scale and bias hold `cols` floats, the
    // statistics `rows`.
    unsafe { launch.launch(Gpu::rows(rows)) }.map_err(cuda_error("launch"))?;
    Ok(NormalizedRows {
        out,
        mean,
        inv_deviation: inv,
    })
}

/// InstanceNormalization (a row per image and channel) and GroupNormalization (a row per image
/// and group; scale and bias per channel, or per group as before opset 21).
pub(super) fn channel_norm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(scale), Some(bias)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    if x.shape.len() < 2 {
        return Ok(None);
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let spatial = numel(&x.shape[2..]);
    let groups = if ctx.node.op_type == "GroupNormalization" {
        usize::try_from(ctx.int("num_groups", 0))
            .ok()
            .filter(|&g| g > 0 && c % g == 0)
            .ok_or_else(|| format!("num_groups must divide the {c} channels"))?
    } else {
        c
    };
    let cols = c / groups * spatial;
    let (channels, inner) = match numel(&scale.shape) {
        s if s == c => (c, spatial),
        s if s == groups => (groups, cols),
        // A mis-sized scale: the CPU kernel says what is wrong.
        _ => return Ok(None),
    };
    if numel(&bias.shape) != channels {
        return Ok(None);
    }
    let rows = n * groups;
    let mut out = gpu.alloc(rows * cols)?;
    let [r, cl, ch, inn] = [rows, cols, channels, inner].map(|v| v as i64);
    let epsilon = ctx.float("epsilon", 1e-5);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.norm_channels);
    launch
        .arg(&*x.data)
        .arg(&*scale.data)
        .arg(&*bias.data)
        .arg(&mut out)
        .arg(&r)
        .arg(&cl)
        .arg(&ch)
        .arg(&inn)
        .arg(&epsilon);
    // SAFETY: argument types match `norm_channels_f32`; scale and bias hold `channels` floats
    // and every channel index the kernel forms is below it.
    unsafe { launch.launch(Gpu::rows(rows)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}

/// `[outer, axis, inner]` sizes of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> [i64; 3] {
    [
        numel(&shape[..axis]),
        shape[axis],
        numel(&shape[axis + 1..]),
    ]
    .map(|v| v as i64)
}

/// ArgMax and ArgMin: the indices are made on the device and brought to the host, where
/// integer tensors live.
pub(super) fn arg_reduce(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.is_empty() {
        return Ok(None);
    }
    let axis = normalize_axis(ctx.int("axis", 0), x.shape.len())?;
    let [outer, len, inner] = around(&x.shape, axis);
    let count = (outer * inner) as usize;
    // SAFETY: the kernel writes each of the `count` indices.
    let mut indices =
        unsafe { gpu.stream.alloc::<i64>(count) }.map_err(cuda_error("allocation"))?;
    let is_min = (ctx.node.op_type == "ArgMin") as i32;
    let last = (ctx.int("select_last_index", 0) != 0) as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.arg_reduce);
    launch
        .arg(&*x.data)
        .arg(&mut indices)
        .arg(&outer)
        .arg(&len)
        .arg(&inner)
        .arg(&is_min)
        .arg(&last);
    // SAFETY: argument types match `arg_reduce_f32`; x holds outer · len · inner floats.
    unsafe { launch.launch(Gpu::grid(count)) }.map_err(cuda_error("launch"))?;
    let values = gpu
        .stream
        .clone_dtoh(&indices)
        .map_err(cuda_error("device-to-host copy"))?;
    let mut shape = x.shape.clone();
    if ctx.int("keepdims", 1) != 0 {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Some(vec![Value::host(Arc::new(HostTensor::i64(
        shape, values,
    )))]))
}

/// CumSum along the axis given as the second input (on the host).
pub(super) fn cumsum(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(axis)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let axis = *axis.to_i64_vec().first().ok_or("CumSum needs an axis")?;
    let axis = normalize_axis(axis, x.shape.len())?;
    let [outer, len, inner] = around(&x.shape, axis);
    let mut out = gpu.alloc(numel(&x.shape))?;
    let exclusive = (ctx.int("exclusive", 0) != 0) as i32;
    let reverse = (ctx.int("reverse", 0) != 0) as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.cumsum);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&outer)
        .arg(&len)
        .arg(&inner)
        .arg(&exclusive)
        .arg(&reverse);
    // SAFETY: argument types match `cumsum_f32`; both buffers hold outer · len · inner floats.
    unsafe { launch.launch(Gpu::grid((outer * inner) as usize)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}

/// LRN across the channels of `[n, c, ...]`.
pub(super) fn lrn(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.len() < 2 {
        return Ok(None);
    }
    let size = ctx.int("size", 0);
    if size < 1 {
        return Err("size must be at least 1".into());
    }
    let n = numel(&x.shape);
    let (channels, inner) = (x.shape[1] as i64, numel(&x.shape[2..]) as i64);
    let (alpha, beta, bias) = (
        ctx.float("alpha", 1e-4),
        ctx.float("beta", 0.75),
        ctx.float("bias", 1.0),
    );
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.lrn);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&channels)
        .arg(&inner)
        .arg(&size)
        .arg(&alpha)
        .arg(&beta)
        .arg(&bias);
    // SAFETY: argument types match `lrn_f32`; every channel it reads is clamped to the input.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}
