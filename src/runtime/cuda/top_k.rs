//! [TopK](https://onnx.ai/onnx/operators/onnx__TopK.html) (opsets 1–24) on float tensors, with
//! the CPU kernel's order (`kernels/topk.rs`): largest (or smallest) first by IEEE total order,
//! equal values by index, so NaNs and ties land where the CPU puts them.
//!
//! `top_k_f32` ranks every element of a line against the whole line (a thread per element, no
//! sort) and writes those ranked below k: O(n²) comparisons per line of n, which is cheap for
//! the lines models take top-k of (detections, classes, beams) but not for a vocabulary-sized
//! line, so lines longer than [`LONGEST_LINE`] stay with the CPU kernel. The indices, integers,
//! are made on the device as floats (exact below 2²⁴) and copied to the host, where integer
//! tensors live, only when the node uses them.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::ops::{cuda_error, device, host, numel, Gpu, OpResult};
use super::{DeviceTensor, Value};
use crate::graph::DType;
use crate::runtime::kernels::{normalize_axis, Ctx};
use crate::runtime::tensor::{HostTensor, TensorData};

/// Longest line ranked on the device: 4,096² ≈ 1.7·10⁷ comparisons a line.
const LONGEST_LINE: usize = 4096;

pub(super) fn top_k(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let Ok(axis) = normalize_axis(ctx.int("axis", -1), x.shape.len()) else {
        return Ok(None);
    };
    let k = match host(gpu, args, 1)? {
        Some(k) if matches!(k.dtype(), DType::I64 | DType::I32) => k.to_i64_vec().first().copied(),
        Some(_) => None,
        None => Some(ctx.int("k", -1)),
    };
    let n = x.shape[axis];
    // A k outside 1..=n is the CPU kernel's to refuse (or, for 0, to make empty outputs).
    let Some(k) = k
        .and_then(|k| usize::try_from(k).ok())
        .filter(|&k| (1..=n).contains(&k))
    else {
        return Ok(None);
    };
    if n > LONGEST_LINE {
        return Ok(None);
    }
    let (outer, inner) = (numel(&x.shape[..axis]), numel(&x.shape[axis + 1..]));
    let (mut values, mut indices) = (gpu.alloc(outer * k * inner)?, gpu.alloc(outer * k * inner)?);
    let (o, len, i, k64) = (outer as i64, n as i64, inner as i64, k as i64);
    let largest = i32::from(ctx.int("largest", 1) != 0);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.top_k);
    launch
        .arg(&*x.data)
        .arg(&mut values)
        .arg(&mut indices)
        .arg(&o)
        .arg(&len)
        .arg(&i)
        .arg(&k64)
        .arg(&largest);
    // SAFETY: argument types match `top_k_f32`; `x` holds outer · n · inner floats and each
    // output outer · k · inner, every one written (the ranks of a line are 0..n, distinct).
    unsafe { launch.launch(Gpu::grid(outer * n * inner)) }.map_err(cuda_error("launch"))?;
    let mut shape = x.shape.clone();
    shape[axis] = k;
    let mut results = vec![Value::Device(DeviceTensor::new(shape.clone(), values))];
    if matches!(ctx.node.outputs.get(1), Some(Some(_))) {
        let positions = gpu
            .stream
            .clone_dtoh(&indices)
            .map_err(cuda_error("device-to-host copy"))?;
        let positions = positions.into_iter().map(|p| p as i64).collect();
        let indices = HostTensor::new(shape, TensorData::I64(positions))?;
        results.push(Value::host(Arc::new(indices)));
    }
    Ok(Some(results))
}
