//! Ops built on per-set means and variances, on the device:
//! [MeanVarianceNormalization](https://onnx.ai/onnx/operators/onnx__MeanVarianceNormalization.html)
//! (opsets 9–13, any axes) and training-mode
//! [BatchNormalization](https://onnx.ai/onnx/operators/onnx__BatchNormalization.html)
//! (opsets 14–15: the batch's statistics, and the running ones updated with them), with the
//! CPU kernels' rules (`kernels/channel_norm.rs`, `kernels/norm.rs`; those compute in f64).
//!
//! The reduced axes are moved last with one strided copy (none when they already are), so each
//! set is a contiguous row for `moments_rows_f32`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::gpu::{contiguous_strides, cuda_error, numel, Gpu};
use super::operands::{device, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{normalize_axis, Ctx};

/// A tensor's values as rows of the sets to reduce.
struct Rows {
    data: Arc<CudaSlice<f32>>,
    /// Output axis i of the move is input axis perm[i].
    perm: Vec<usize>,
    rows: usize,
    cols: usize,
}

/// `x` with the axes not in `reduced` first and `reduced` last, as rows × cols.
fn rows_of(gpu: &Gpu, x: &DeviceTensor, reduced: &[usize]) -> Result<Rows, String> {
    let rank = x.shape.len();
    let perm: Vec<usize> = (0..rank)
        .filter(|a| !reduced.contains(a))
        .chain((0..rank).filter(|a| reduced.contains(a)))
        .collect();
    let cols: usize = reduced.iter().map(|&a| x.shape[a]).product();
    let rows = numel(&x.shape) / cols.max(1);
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        let data = Arc::clone(&x.data);
        return Ok(Rows {
            data,
            perm,
            rows,
            cols,
        });
    }
    let strides = contiguous_strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let moved: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &shape, &moved, 0)?;
    Ok(Rows {
        data: Arc::new(data),
        perm,
        rows,
        cols,
    })
}

/// Launches `moments_rows_f32`: each row's mean and variance, and the normalised rows into
/// `normalized` when given.
fn moments(
    gpu: &Gpu,
    rows_data: &CudaSlice<f32>,
    (rows, cols): (usize, usize),
    normalized: Option<&mut CudaSlice<f32>>,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>), String> {
    let (mut mean, mut var) = (gpu.alloc(rows)?, gpu.alloc(rows)?);
    let (r, c) = (rows as i64, cols as i64);
    let normalize = normalized.is_some() as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.moments_rows);
    launch.arg(rows_data);
    match normalized {
        Some(y) => launch.arg(y),
        // Never written without `normalize`; the input stands in for the pointer.
        None => launch.arg(rows_data),
    };
    launch
        .arg(&mut mean)
        .arg(&mut var)
        .arg(&r)
        .arg(&c)
        .arg(&normalize);
    // SAFETY: argument types match `moments_rows_f32`; the data holds rows × cols floats, the
    // statistics `rows`; shared memory is one float per thread.
    unsafe { launch.launch(Gpu::rows(rows)) }.map_err(cuda_error("launch"))?;
    Ok((mean, var))
}

/// MeanVarianceNormalization over `axes` (default [0, 2, 3]): (x − mean) / (σ + 1e-9) per set.
pub(super) fn mean_variance_normalization(
    gpu: &Gpu,
    ctx: &Ctx,
    args: &[Option<Value>],
) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let axes = ctx.ints("axes").unwrap_or_else(|| vec![0, 2, 3]);
    let Ok(mut reduced) = axes
        .iter()
        .map(|&a| normalize_axis(a, rank))
        .collect::<Result<Vec<_>, _>>()
    else {
        return Ok(None);
    };
    reduced.sort_unstable();
    reduced.dedup();
    let Rows {
        data,
        perm,
        rows,
        cols,
    } = rows_of(gpu, &x, &reduced)?;
    let mut out = gpu.alloc(rows * cols)?;
    moments(gpu, &data, (rows, cols), Some(&mut out))?;
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(Some(vec![Value::Device(DeviceTensor::new(
            x.shape.clone(),
            out,
        ))]));
    }
    // Back: moved axis i returns to perm[i].
    let moved_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let moved_strides = contiguous_strides(&moved_shape);
    let mut back = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        back[p] = moved_strides[i];
    }
    let data = gpu.gather_strided(&out, &x.shape, &back, 0)?;
    Ok(Some(vec![Value::Device(DeviceTensor::new(
        x.shape.clone(),
        data,
    ))]))
}

/// Training-mode BatchNormalization: Y normalised with the batch's statistics per channel
/// (`batch_norm_f32`), and the running mean and variance updated with them.
pub(super) fn batch_norm_training(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if x.shape.len() < 2 || ctx.node.outputs.len() > 3 {
        return Ok(None);
    }
    let channels = x.shape[1];
    let mut stats = Vec::with_capacity(4);
    for i in 1..5 {
        match device(gpu, args, i)? {
            Some(s) if numel(&s.shape) == channels => stats.push(s),
            _ => return Ok(None),
        }
    }
    let reduced: Vec<usize> = (0..x.shape.len()).filter(|&a| a != 1).collect();
    let Rows {
        data, rows, cols, ..
    } = rows_of(gpu, &x, &reduced)?;
    let (mean, var) = moments(gpu, &data, (rows, cols), None)?;
    let n = numel(&x.shape);
    let mut out = gpu.alloc(n)?;
    let (n64, c64, inner64) = (n as i64, channels as i64, numel(&x.shape[2..]) as i64);
    let epsilon = ctx.float("epsilon", 1e-5);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.batch_norm);
    launch
        .arg(&*x.data)
        .arg(&*stats[0].data)
        .arg(&*stats[1].data)
        .arg(&mean)
        .arg(&var)
        .arg(&mut out)
        .arg(&n64)
        .arg(&c64)
        .arg(&inner64)
        .arg(&epsilon);
    // SAFETY: argument types match `batch_norm_f32`; each statistic holds `channels` floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    let momentum = ctx.float("momentum", 0.9);
    let running = |old: &DeviceTensor, batch: &CudaSlice<f32>| -> Result<Value, String> {
        let mut updated = gpu.alloc(channels)?;
        let c = channels as i64;
        let mut launch = gpu.stream.launch_builder(&gpu.functions.running_stats);
        launch
            .arg(&*old.data)
            .arg(batch)
            .arg(&mut updated)
            .arg(&c)
            .arg(&momentum);
        // SAFETY: argument types match `running_stats_f32`; all three hold `channels` floats.
        unsafe { launch.launch(Gpu::grid(channels)) }.map_err(cuda_error("launch"))?;
        Ok(Value::Device(DeviceTensor::new(vec![channels], updated)))
    };
    Ok(Some(vec![
        Value::Device(DeviceTensor::new(x.shape.clone(), out)),
        running(&stats[2], &mean)?,
        running(&stats[3], &var)?,
    ]))
}
