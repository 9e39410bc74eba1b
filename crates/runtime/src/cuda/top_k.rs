//! [TopK](https://onnx.ai/onnx/operators/onnx__TopK.html) (opsets 1–24) on float tensors, with
//! the CPU kernel's order (`kernels/topk.rs`): largest (or smallest) first by IEEE total order,
//! equal values by index, so NaNs and ties land where the CPU puts them.
//!
//! Each line is sorted by a bitonic network (O(n log² n) comparisons, in parallel): a line of
//! up to [`SHARED_LINE`] elements by a block in shared memory (`top_k_block_f32`, one launch),
//! a longer one padded to p in global memory (`top_k_load_f32`; `top_k_chunk_f32` sorts its
//! chunks of 4,096 in shared memory, then for each size from 8,192 to p, `top_k_step_f32` runs
//! the steps of strides of 4,096 and more over global memory, a launch each, and
//! `top_k_chunk_f32` the rest in shared memory; then `top_k_store_f32`): for p = 2^(12 + c),
//! c(c + 1)/2 global steps and c + 1 chunk launches, where a global step per stride would take
//! log₂p·(log₂p + 1)/2 launches (91 at 8,192).
//! The indices, integers, are made on the device as floats (exact below 2²⁴, the longest line
//! taken) and copied to the host, where integer tensors live, only when the node uses them.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{normalize_axis, Ctx};
use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::DType;

/// Longest line sorted by one block in shared memory (its values and indices, 32 KiB).
const SHARED_LINE: usize = 4096;
/// Longest line taken: its indices are floats on the device, exact below 2²⁴.
const LONGEST_LINE: usize = 1 << 24;
/// Threads of a block sorting a line.
const BLOCK: u32 = 256;

/// A TopK's lines: `lines` (outer · inner) of `n` elements `inner` apart, the first `k` kept,
/// sorted padded to `p` (a power of two).
struct Lines {
    lines: usize,
    n: usize,
    inner: usize,
    k: usize,
    p: usize,
    largest: i32,
}

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
    let lines = Lines {
        lines: outer * inner,
        n,
        inner,
        k,
        p: n.next_power_of_two(),
        largest: i32::from(ctx.int("largest", 1) != 0),
    };
    let (mut values, mut indices) = (gpu.alloc(outer * k * inner)?, gpu.alloc(outer * k * inner)?);
    if lines.p <= SHARED_LINE {
        sort_in_blocks(gpu, &x.data, &lines, &mut values, &mut indices)?;
    } else {
        sort_in_memory(gpu, &x.data, &lines, &mut values, &mut indices)?;
    }
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

/// Every line sorted by a block in shared memory, its first k written.
fn sort_in_blocks(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    lines: &Lines,
    values: &mut CudaSlice<f32>,
    indices: &mut CudaSlice<f32>,
) -> Result<(), String> {
    let [count, n, inner, k, p] =
        [lines.lines, lines.n, lines.inner, lines.k, lines.p].map(|v| v as i64);
    let config = LaunchConfig {
        grid_dim: (lines.lines.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: (2 * lines.p * 4) as u32,
    };
    let mut launch = gpu.stream.launch_builder(&gpu.functions.top_k.block);
    launch
        .arg(x)
        .arg(values)
        .arg(indices)
        .arg(&count)
        .arg(&n)
        .arg(&inner)
        .arg(&k)
        .arg(&p)
        .arg(&lines.largest);
    // SAFETY: argument types match `top_k_block_f32`; `x` holds lines · n floats, each output
    // lines · k, and the shared memory p values and p indices.
    unsafe { launch.launch(config) }.map_err(cuda_error("launch"))?;
    Ok(())
}

/// Every line copied out padded to p, sorted by chunks of [`SHARED_LINE`] in shared memory and
/// global steps for the larger strides, and its first k written.
fn sort_in_memory(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    lines: &Lines,
    values: &mut CudaSlice<f32>,
    indices: &mut CudaSlice<f32>,
) -> Result<(), String> {
    let [count, n, inner, k, p] =
        [lines.lines, lines.n, lines.inner, lines.k, lines.p].map(|v| v as i64);
    let total = lines.lines * lines.p;
    let (mut v, mut ix) = (gpu.alloc(total)?, gpu.alloc(total)?);
    let kernels = &gpu.functions.top_k;
    let mut launch = gpu.stream.launch_builder(&kernels.load);
    launch
        .arg(x)
        .arg(&mut v)
        .arg(&mut ix)
        .arg(&count)
        .arg(&n)
        .arg(&inner)
        .arg(&p);
    // SAFETY: argument types match `top_k_load_f32`; `x` holds lines · n floats, `v` and `ix`
    // lines · p, each written.
    unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
    let chunk = SHARED_LINE as i64;
    sort_chunks(gpu, (&mut v, &mut ix), lines, chunk, None)?;
    let mut size = 2 * chunk;
    while size <= p {
        let mut stride = size / 2;
        while stride >= chunk {
            let mut launch = gpu.stream.launch_builder(&kernels.step);
            launch
                .arg(&mut v)
                .arg(&mut ix)
                .arg(&count)
                .arg(&p)
                .arg(&size)
                .arg(&stride)
                .arg(&lines.largest);
            // SAFETY: argument types match `top_k_step_f32`; partners stay inside their line.
            unsafe { launch.launch(Gpu::grid(total)) }.map_err(cuda_error("launch"))?;
            stride /= 2;
        }
        sort_chunks(gpu, (&mut v, &mut ix), lines, chunk, Some(size))?;
        size *= 2;
    }
    let mut launch = gpu.stream.launch_builder(&kernels.store);
    launch
        .arg(&v)
        .arg(&ix)
        .arg(values)
        .arg(indices)
        .arg(&count)
        .arg(&inner)
        .arg(&k)
        .arg(&p);
    // SAFETY: argument types match `top_k_store_f32`; k ≤ n ≤ p, outputs lines · k floats.
    unsafe { launch.launch(Gpu::grid(lines.lines * lines.k)) }.map_err(cuda_error("launch"))?;
    Ok(())
}

/// `top_k_chunk_f32` over every chunk of every line: all sizes up to the chunk (`size` None),
/// or the strides below the chunk of `size`.
fn sort_chunks(
    gpu: &Gpu,
    (v, ix): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    lines: &Lines,
    chunk: i64,
    size: Option<i64>,
) -> Result<(), String> {
    let (count, p) = (lines.lines as i64, lines.p as i64);
    let blocks = lines.lines * (lines.p / SHARED_LINE);
    let config = LaunchConfig {
        grid_dim: (blocks.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: (2 * SHARED_LINE * 4) as u32,
    };
    let (size, presort) = (size.unwrap_or(chunk), i32::from(size.is_none()));
    let mut launch = gpu.stream.launch_builder(&gpu.functions.top_k.chunk);
    launch
        .arg(v)
        .arg(ix)
        .arg(&count)
        .arg(&p)
        .arg(&chunk)
        .arg(&size)
        .arg(&presort)
        .arg(&lines.largest);
    // SAFETY: argument types match `top_k_chunk_f32`; `v` and `ix` hold lines · p floats, p a
    // multiple of the chunk, and the shared memory a chunk's values and indices.
    unsafe { launch.launch(config) }.map_err(cuda_error("launch"))?;
    Ok(())
}
