//! Ops that place float values by integer geometry the host holds, with the CPU kernels' rules:
//! [Tile](https://onnx.ai/onnx/operators/onnx__Tile.html) (opsets 6–13) and
//! [Trilu](https://onnx.ai/onnx/operators/onnx__Trilu.html) (opset 14) (`kernels/movement.rs`),
//! [Compress](https://onnx.ai/onnx/operators/onnx__Compress.html) (opsets 9–11,
//! `kernels/select.rs`), [CenterCropPad](https://onnx.ai/onnx/operators/onnx__CenterCropPad.html)
//! (opset 18, `kernels/crop.rs`) and
//! [AffineGrid](https://onnx.ai/onnx/operators/onnx__AffineGrid.html) (opset 20) and
//! [Col2Im](https://onnx.ai/onnx/operators/onnx__Col2Im.html) (opset 18) (`kernels/spatial.rs`),
//! and [OneHot](https://onnx.ai/onnx/operators/onnx__OneHot.html) (opsets 9–11) of float
//! values (`kernels/rearrange.rs`).
//!
//! Tile needs no kernel of its own: the row-major output of `x` `[d0, d1, …]` repeated
//! `[r0, r1, …]` times is the strided view `[r0, d0, r1, d1, …]` of `x` with stride 0 on every
//! `r` axis, which `gather_strided_f32` copies (axes of size 1 dropped, so up to rank 8).
//! Compress gathers the kept slices (`gather_axis_f32`), CenterCropPad is a constant Pad
//! (`pad_f32`) by the centred offsets, and AffineGrid multiplies the grid's homogeneous
//! points, made on the host, by each θᵀ in one strided-batched cuBLAS GEMM. Col2Im gathers:
//! the host lists, per image position, the column entries that land on it (in the CPU
//! kernel's order, so the sums agree), and `col2im_f32` adds them, a thread per output.
//! OneHot's indices are normalised on the host, where they are, and `one_hot_f32` copies the
//! off or on value to each output.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::gpu::{contiguous_strides, cuda_error, dims, numel, Gpu, MAX_RANK};
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{affine_grid_points, col2im_geometry, normalize_axis, Col2Im, Ctx};
use pipecut_ir::graph::DType;

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

/// `x` viewed as `[outer, axis_len, inner]` with the axis's entries `picked` (each below
/// axis_len): `[outer, picked.len(), inner]` through `gather_axis_f32`.
pub(super) fn gather_along(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    (outer, axis_len, inner): (usize, usize, usize),
    picked: &[i64],
) -> Result<CudaSlice<f32>, String> {
    let n = outer * picked.len() * inner;
    let idx = gpu.upload(picked)?;
    let mut out = gpu.alloc(n)?;
    let (o, a, m, i) = (
        outer as i64,
        axis_len as i64,
        picked.len() as i64,
        inner as i64,
    );
    let mut launch = gpu.stream.launch_builder(&gpu.functions.gather_axis);
    launch
        .arg(x)
        .arg(&idx)
        .arg(&mut out)
        .arg(&o)
        .arg(&a)
        .arg(&m)
        .arg(&i);
    // SAFETY: argument types match `gather_axis_f32`; the callers check every index against
    // the axis, and `x` holds outer · axis_len · inner floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(out)
}

/// Compress: the slices along `axis` (of the flattened input without one) whose condition is
/// true. A condition selecting past the axis, or nothing, is left to the CPU kernel.
pub(super) fn compress(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(condition)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    if matches!(condition.dtype(), DType::String) {
        return Ok(None);
    }
    let (shape, axis) = match ctx.attr("axis") {
        Some(_) => match normalize_axis(ctx.int("axis", 0), x.shape.len()) {
            Ok(axis) => (x.shape.clone(), axis),
            Err(_) => return Ok(None),
        },
        None => (vec![x.data.len()], 0),
    };
    let keep: Vec<bool> = condition.to_f32_vec().iter().map(|&c| c != 0.0).collect();
    let n = shape[axis];
    let picked: Vec<i64> = (0..keep.len().min(n) as i64)
        .filter(|&k| keep[k as usize])
        .collect();
    if keep.iter().skip(n).any(|&k| k) || picked.is_empty() {
        return Ok(None);
    }
    let (outer, inner) = (numel(&shape[..axis]), numel(&shape[axis + 1..]));
    let data = gather_along(gpu, &x.data, (outer, n, inner), &picked)?;
    let mut out_shape = shape;
    out_shape[axis] = picked.len();
    one(DeviceTensor::new(out_shape, data))
}

/// CenterCropPad: each listed axis cropped or zero-padded to its target size about its centre
/// (the extra element of an odd difference at the end), as a constant Pad.
pub(super) fn center_crop_pad(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(sizes)) = (device(gpu, args, 0)?, host_ints(gpu, args, 1)?) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let axes = ctx
        .ints("axes")
        .unwrap_or_else(|| (0..rank as i64).collect());
    if axes.len() != sizes.len() {
        return Ok(None);
    }
    let mut shape = x.shape.clone();
    for (&axis, &size) in axes.iter().zip(&sizes) {
        let (Ok(axis), Ok(size)) = (normalize_axis(axis, rank), usize::try_from(size)) else {
            return Ok(None);
        };
        shape[axis] = size;
    }
    // pad_f32 reads output coordinate o at o − begin: begin is the padding before, or minus the
    // crop before.
    let begin: Vec<i64> = x
        .shape
        .iter()
        .zip(&shape)
        .map(|(&input, &output)| {
            if output <= input {
                -(((input - output) / 2) as i64)
            } else {
                ((output - input) / 2) as i64
            }
        })
        .collect();
    let n = numel(&shape);
    if n == 0 {
        return Ok(None);
    }
    let in_shape: Vec<i64> = x.shape.iter().map(|&s| s as i64).collect();
    let d = dims(&shape, &[&contiguous_strides(&x.shape), &begin, &in_shape])?;
    let mut out = gpu.alloc(n)?;
    let (count, constant, zero) = (n as i64, 0i32, 0f32);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.pad);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&count)
        .arg(&d)
        .arg(&constant)
        .arg(&zero);
    // SAFETY: argument types match `pad_f32` (mode 0, constant); it reads only coordinates
    // inside the input.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// AffineGrid: `[N, H, W, 2]` (or `[N, D, H, W, 3]`) sampling points, each θ[n] applied to the
/// point's normalised coordinates: `points[P, dims + 1] · θ[n]ᵀ` per image.
pub(super) fn affine_grid(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(theta), Some(size)) = (device(gpu, args, 0)?, host_ints(gpu, args, 1)?) else {
        return Ok(None);
    };
    let Ok(size) = size
        .iter()
        .map(|&s| usize::try_from(s))
        .collect::<Result<Vec<_>, _>>()
    else {
        return Ok(None);
    };
    let dims = size.len().saturating_sub(2);
    if !(2..=3).contains(&dims) || theta.shape != [size[0], dims, dims + 1] {
        return Ok(None);
    }
    let spatial = &size[2..];
    let points = numel(spatial);
    let base = gpu.upload(&affine_grid_points(
        spatial,
        ctx.int("align_corners", 0) != 0,
    )?)?;
    let batch = size[0];
    let mut out = gpu.alloc(batch * points * dims)?;
    gpu.gemm_views(
        (points, dims, dims + 1),
        (&base, false, &*theta.data, true),
        &mut out,
        (1.0, 0.0),
        (batch, 0, dims * (dims + 1), points * dims),
    )?;
    let mut shape = vec![batch];
    shape.extend_from_slice(spatial);
    shape.push(dims);
    one(DeviceTensor::new(shape, out))
}

/// Col2Im: the columns `[N, C·Π block, L]` summed back into images `[N, C, image…]`. A node
/// whose geometry the CPU kernel refuses is left to it.
pub(super) fn col2im(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(image), Some(block)) = (
        device(gpu, args, 0)?,
        host_ints(gpu, args, 1)?,
        host_ints(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let sizes = |v: Vec<i64>| {
        v.into_iter()
            .map(usize::try_from)
            .collect::<Result<Vec<_>, _>>()
    };
    let (Ok(image), Ok(block)) = (sizes(image), sizes(block)) else {
        return Ok(None);
    };
    let Ok(Col2Im {
        batch,
        channels,
        block_size,
        length,
        image,
        targets,
    }) = col2im_geometry(ctx, &x.shape, image, &block)
    else {
        return Ok(None);
    };
    let image_size = numel(&image);
    // Per image position p, the entries landing on it: sources[starts[p]..starts[p + 1]].
    let mut starts = vec![0i64; image_size + 1];
    for &flat in targets.iter().flatten() {
        starts[flat + 1] += 1;
    }
    for p in 0..image_size {
        starts[p + 1] += starts[p];
    }
    let mut fill: Vec<i64> = starts[..image_size].to_vec();
    let mut sources = vec![0i64; starts[image_size] as usize];
    for (entry, target) in targets.iter().enumerate() {
        if let Some(flat) = *target {
            sources[fill[flat] as usize] = entry as i64;
            fill[flat] += 1;
        }
    }
    if sources.is_empty() {
        sources.push(0);
    }
    let (starts, sources) = (gpu.upload(&starts)?, gpu.upload(&sources)?);
    let planes = batch * channels;
    let mut out = gpu.alloc(planes * image_size)?;
    let (p, size, stride) = (
        planes as i64,
        image_size as i64,
        (block_size * length) as i64,
    );
    let mut launch = gpu.stream.launch_builder(&gpu.functions.col2im);
    launch
        .arg(&*x.data)
        .arg(&starts)
        .arg(&sources)
        .arg(&mut out)
        .arg(&p)
        .arg(&size)
        .arg(&stride);
    // SAFETY: argument types match `col2im_f32`; `starts` has image_size + 1 entries, every
    // source is below block_size · L, and `x` holds planes · block_size · L floats.
    unsafe { launch.launch(Gpu::grid(planes * image_size)) }.map_err(cuda_error("launch"))?;
    let mut shape = vec![batch, channels];
    shape.extend(&image);
    one(DeviceTensor::new(shape, out))
}

/// OneHot: `values[1]` (on) where the position along the new `axis` equals the index
/// (negative indices counted from `depth`), `values[0]` (off) elsewhere. Values that are not
/// floats, or a depth or value count the CPU kernel refuses, are left to it.
pub(super) fn one_hot(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(indices), Some(depth), Some(values)) = (
        host(gpu, args, 0)?,
        host(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let depth = match depth.to_f32_vec()[..] {
        [d] if d >= 1.0 => d as usize,
        _ => return Ok(None),
    };
    if values.data.len() != 2 || matches!(indices.dtype(), DType::String | DType::Bool) {
        return Ok(None);
    }
    let Ok(axis) = normalize_axis(ctx.int("axis", -1), indices.shape().len() + 1) else {
        return Ok(None);
    };
    let mut shape = indices.shape().to_vec();
    shape.insert(axis, depth);
    let inner = numel(&indices.shape()[axis..]);
    // The CPU kernel's reading of an index: through f32, truncated, negative from the end.
    let hot: Vec<i64> = indices
        .to_f32_vec()
        .into_iter()
        .map(|v| match v as i64 {
            h if h < 0 => h + depth as i64,
            h => h,
        })
        .collect();
    let n = numel(&shape);
    let hot = gpu.upload(&hot)?;
    let mut out = gpu.alloc(n)?;
    let (count, depth64, inner64) = (n as i64, depth as i64, inner as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.one_hot);
    launch
        .arg(&hot)
        .arg(&*values.data)
        .arg(&mut out)
        .arg(&count)
        .arg(&depth64)
        .arg(&inner64);
    // SAFETY: argument types match `one_hot_f32`; `hot` holds one index per output line
    // (n / depth of them), `values` two floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}
