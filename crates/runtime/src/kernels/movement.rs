//! Shape and data movement: ops that compute shapes or move elements without arithmetic.
//!
//! Specs: <https://onnx.ai/onnx/operators/> (Reshape, Transpose, Concat, Split, Slice, Gather,
//! GatherElements, Expand, Unsqueeze, Squeeze, Flatten, Shape, Size, Range, ConstantOfShape,
//! Tile, Pad (constant mode), Resize (nearest and linear), Trilu, CumSum, CumProd), opsets 7
//! to 23. Axes, splits and slice bounds come from inputs where the opset has them and from
//! attributes before.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::indexing::{checked_size, normalize_axis, take, take_strided};
use crate::tensor::{checked_numel, strides_of, try_collect, try_filled, HostTensor, TensorData};
use pipecut_ir::graph::Attribute;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Reshape", "Unsqueeze", "Squeeze", "Flatten"], view);
    t.add(&["Transpose"], transpose);
    t.add(&["Concat"], concat);
    t.add(&["Split"], split);
    t.add(&["Slice"], slice);
    t.add(&["Gather"], gather);
    t.add(&["GatherElements"], gather_elements);
    t.add(&["Expand"], expand);
    t.add(&["Shape"], shape);
    t.add(&["Size"], size);
    t.add(&["Range"], range);
    t.add(&["ConstantOfShape"], constant_of_shape);
    t.add(&["Tile"], tile);
    t.add(&["Pad"], pad);
    t.add(&["Trilu"], trilu);
    t.add(&["CumSum"], cumsum);
    t.add(&["CumProd"], cumprod);
}

fn dims_from(values: &[i64], what: &str) -> Result<Vec<usize>, String> {
    values
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| format!("{what} has a negative entry {v}")))
        .collect()
}

fn transpose(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let perm = transpose_perm(ctx, x.rank())?;
    let strides = strides_of(x.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let view_strides: Vec<isize> = perm.iter().map(|&p| strides[p] as isize).collect();
    Ok(vec![HostTensor::with_data(
        shape.clone(),
        take_strided(x.data(), 0, &shape, &view_strides)?,
    )])
}

/// Transpose's `perm` (reversed axes by default), checked to be a permutation of `rank` axes.
/// Shared with the CUDA backend.
pub(crate) fn transpose_perm(ctx: &Ctx, rank: usize) -> Result<Vec<usize>, String> {
    let perm: Vec<usize> = match ctx.ints("perm") {
        Some(p) => p
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = vec![false; rank];
    for &p in &perm {
        if std::mem::replace(&mut seen[p], true) {
            return Err(format!("perm {perm:?} is not a permutation"));
        }
    }
    if perm.len() != rank {
        return Err(format!("perm {perm:?} for rank {rank}"));
    }
    Ok(perm)
}

/// Concatenates along `axis` tensors of equal dtype whose other dims agree.
pub(super) fn concat_along(parts: &[&HostTensor], axis: usize) -> Result<HostTensor, String> {
    let first = parts.first().ok_or("nothing to concatenate")?;
    let mut shape = first.shape().to_vec();
    shape[axis] = 0;
    for p in parts {
        if p.rank() != first.rank()
            || p.shape()[..axis] != first.shape()[..axis]
            || p.shape()[axis + 1..] != first.shape()[axis + 1..]
        {
            return Err(format!(
                "cannot concatenate {:?} with {:?} on axis {axis}",
                first.shape(),
                p.shape()
            ));
        }
        shape[axis] += p.shape()[axis];
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    macro_rules! join {
        ($variant:ident) => {{
            let mut out = Vec::with_capacity(checked_numel(&shape).unwrap_or(0));
            let slices = parts
                .iter()
                .map(|p| match p.data() {
                    TensorData::$variant(v) => Ok(v.as_slice()),
                    _ => Err(format!(
                        "cannot concatenate {} with {}",
                        first.dtype(),
                        p.dtype()
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            for o in 0..outer {
                for (p, s) in parts.iter().zip(&slices) {
                    let run = p.shape()[axis] * inner;
                    out.extend_from_slice(&s[o * run..(o + 1) * run]);
                }
            }
            TensorData::$variant(out)
        }};
    }
    let data = match first.data() {
        TensorData::F32(_) => join!(F32),
        TensorData::I64(_) => join!(I64),
        TensorData::I32(_) => join!(I32),
        TensorData::Bool(_) => join!(Bool),
        TensorData::String(_) => join!(String),
        TensorData::U8(_) => join!(U8),
        TensorData::I8(_) => join!(I8),
    };
    Ok(HostTensor::with_data(shape, data))
}

fn concat(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let parts: Vec<&HostTensor> = inputs.iter().flatten().copied().collect();
    let first = parts.first().ok_or("Concat has no inputs")?;
    let axis = normalize_axis(ctx.int("axis", 0), first.rank())?;
    // Mixed integer widths arise from the runtime's widening; join them as int64.
    if parts.iter().any(|p| p.dtype() != first.dtype()) {
        let target = if parts
            .iter()
            .any(|p| p.dtype() == pipecut_ir::graph::DType::F32)
        {
            pipecut_ir::graph::DType::F32
        } else {
            pipecut_ir::graph::DType::I64
        };
        let cast: Vec<HostTensor> = parts
            .iter()
            .map(|p| p.cast(target))
            .collect::<Result<_, _>>()?;
        return Ok(vec![concat_along(&cast.iter().collect::<Vec<_>>(), axis)?]);
    }
    Ok(vec![concat_along(&parts, axis)?])
}

/// Elements `start..start+len` along `axis`.
pub(crate) fn narrow(
    x: &HostTensor,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<HostTensor, String> {
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let n = x.shape()[axis];
    let mut offsets = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let base = (o * n + start) * inner;
        offsets.extend(base..base + len * inner);
    }
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    Ok(HostTensor::with_data(shape, take(x.data(), &offsets)?))
}

fn split(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", 0), x.rank())?;
    let n = x.shape()[axis];
    let outputs = ctx.node.outputs.len().max(1);
    let sizes: Vec<usize> = match optional(inputs, 1)
        .map(|t| t.to_i64_vec())
        .or_else(|| ctx.ints("split"))
    {
        Some(s) => dims_from(&s, "split")?,
        None => {
            let parts = usize::try_from(ctx.int("num_outputs", outputs as i64))
                .unwrap_or(outputs)
                .max(1);
            let chunk = n.div_ceil(parts);
            (0..parts)
                .map(|i| chunk.min(n.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.iter().sum::<usize>() != n {
        return Err(format!("split sizes {sizes:?} do not add up to {n}"));
    }
    let mut start = 0;
    sizes
        .iter()
        .map(|&len| {
            let part = narrow(x, axis, start, len);
            start += len;
            part
        })
        .collect()
}

fn slice(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let (starts, ends, axes, steps) = if ctx.opset < 10 {
        (
            ctx.ints("starts").unwrap_or_default(),
            ctx.ints("ends").unwrap_or_default(),
            ctx.ints("axes"),
            None,
        )
    } else {
        (
            input(inputs, 1)?.to_i64_vec(),
            input(inputs, 2)?.to_i64_vec(),
            optional(inputs, 3).map(HostTensor::to_i64_vec),
            optional(inputs, 4).map(HostTensor::to_i64_vec),
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    // Per axis: (start, step, count)
    let mut plan: Vec<(i64, i64, usize)> = x.shape().iter().map(|&d| (0, 1, d)).collect();
    for k in 0..starts.len() {
        let axis = normalize_axis(axes[k], rank)?;
        let dim = x.shape()[axis] as i64;
        let step = steps[k];
        if step == 0 {
            return Err("slice step 0".into());
        }
        let clamp = |v: i64, lo: i64, hi: i64| {
            let v = if v < 0 { v.saturating_add(dim) } else { v };
            v.clamp(lo, hi)
        };
        let (start, end) = if step > 0 {
            (clamp(starts[k], 0, dim), clamp(ends[k], 0, dim))
        } else {
            (clamp(starts[k], -1, dim - 1), clamp(ends[k], -1, dim - 1))
        };
        // In i128, as onnx computes it: with a step near i64::MAX (or i64::MIN) the rounding-up
        // addition and the negation overflow i64 (a release build then gave 0 elements).
        let (start128, end128, step128) = (i128::from(start), i128::from(end), i128::from(step));
        let count = if step > 0 {
            ((end128 - start128).max(0) + step128 - 1) / step128
        } else {
            ((start128 - end128).max(0) - step128 - 1) / -step128
        };
        // At most `dim` elements, which fit in usize.
        plan[axis] = (start, step, count as usize);
    }
    let strides = strides_of(x.shape());
    let shape: Vec<usize> = plan.iter().map(|p| p.2).collect();
    // An empty output may start past the end: any base will do.
    let base: i64 = if shape.contains(&0) {
        0
    } else {
        plan.iter()
            .zip(&strides)
            .map(|(p, &s)| p.0 * s as i64)
            .sum()
    };
    let view_strides: Vec<isize> = plan
        .iter()
        .zip(&strides)
        .map(|(p, &s)| p.1 as isize * s as isize)
        .collect();
    Ok(vec![HostTensor::with_data(
        shape.clone(),
        take_strided(x.data(), base as isize, &shape, &view_strides)?,
    )])
}

fn gather(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let axis = normalize_axis(ctx.int("axis", 0), x.rank())?;
    let n = x.shape()[axis] as i64;
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let indices = idx
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + n } else { i };
            if (0..n).contains(&j) {
                Ok(j as usize)
            } else {
                Err(format!(
                    "index {i} is out of range for axis {axis} of size {n}"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut offsets = Vec::with_capacity(outer * indices.len() * inner);
    for o in 0..outer {
        for &j in &indices {
            let base = (o * n as usize + j) * inner;
            offsets.extend(base..base + inner);
        }
    }
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend_from_slice(idx.shape());
    shape.extend_from_slice(&x.shape()[axis + 1..]);
    Ok(vec![HostTensor::with_data(
        shape,
        take(x.data(), &offsets)?,
    )])
}

fn gather_elements(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let offsets = gather_elements_offsets(ctx, x.shape(), idx)?;
    Ok(vec![HostTensor::with_data(
        idx.shape().to_vec(),
        take(x.data(), &offsets)?,
    )])
}

/// GatherElements' source offset in the data (of `shape`) of every index, checked; the CUDA
/// backend gathers by the same offsets.
pub(crate) fn gather_elements_offsets(
    ctx: &Ctx,
    shape: &[usize],
    idx: &HostTensor,
) -> Result<Vec<usize>, String> {
    let rank = shape.len();
    let axis = normalize_axis(ctx.int("axis", 0), rank)?;
    if idx.rank() != rank {
        return Err("indices and data differ in rank".into());
    }
    let xs = strides_of(shape);
    let is = strides_of(idx.shape());
    let n = shape[axis] as i64;
    idx.to_i64_vec()
        .iter()
        .enumerate()
        .map(|(flat, &i)| {
            let j = if i < 0 { i + n } else { i };
            if !(0..n).contains(&j) {
                return Err(format!(
                    "index {i} is out of range for axis {axis} of size {n}"
                ));
            }
            let mut off = 0;
            for d in 0..rank {
                let coord = if d == axis {
                    j as usize
                } else {
                    (flat / is[d]) % idx.shape()[d]
                };
                off += coord * xs[d];
            }
            Ok(off)
        })
        .collect()
}

fn expand(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let target = dims_from(&input(inputs, 1)?.to_i64_vec(), "shape")?;
    let shape = super::indexing::broadcast_shapes(&[x.shape(), &target])?;
    checked_size(&shape)?;
    let offsets = super::indexing::broadcast_offsets(x.shape(), &shape)?;
    Ok(vec![HostTensor::with_data(
        shape,
        take(x.data(), &offsets)?,
    )])
}

/// Reshape, Flatten, Squeeze and Unsqueeze: the same data under a new shape.
fn view(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let shape = view_shape(ctx, x.shape(), optional(inputs, 1))?;
    Ok(vec![x.clone().reshaped(shape)?])
}

/// The output shape of a view op (Reshape, Flatten, Squeeze, Unsqueeze) of `input`, given its
/// second input (Reshape's target, the axes from opset 13), per ONNX's rules. Shared with the
/// CUDA backend, which reshapes without moving data.
pub(crate) fn view_shape(
    ctx: &Ctx,
    input: &[usize],
    second: Option<&HostTensor>,
) -> Result<Vec<usize>, String> {
    let rank = input.len();
    let axes = || {
        second
            .map(HostTensor::to_i64_vec)
            .or_else(|| ctx.ints("axes"))
    };
    match ctx.node.op_type.as_str() {
        "Reshape" => {
            let target = second.ok_or("Reshape needs its shape input")?.to_i64_vec();
            let allow_zero = ctx.int("allowzero", 0) != 0;
            let mut shape = Vec::with_capacity(target.len());
            let mut infer = None;
            for (i, &d) in target.iter().enumerate() {
                match d {
                    -1 if infer.is_none() => {
                        infer = Some(i);
                        shape.push(1);
                    }
                    0 if !allow_zero => shape.push(*input.get(i).ok_or_else(|| {
                        format!("0 at position {i} copies a dim the input lacks")
                    })?),
                    d if d >= 0 => shape.push(d as usize),
                    _ => return Err(format!("bad target shape {target:?}")),
                }
            }
            if let Some(i) = infer {
                let known: usize = shape.iter().product();
                let total: usize = input.iter().product();
                if known == 0 || !total.is_multiple_of(known) {
                    return Err(format!("cannot reshape {input:?} to {target:?}"));
                }
                shape[i] = total / known;
            }
            Ok(shape)
        }
        "Unsqueeze" => {
            let axes = axes().ok_or("Unsqueeze needs axes")?;
            let out_rank = rank + axes.len();
            let mut positions = axes
                .iter()
                .map(|&a| normalize_axis(a, out_rank))
                .collect::<Result<Vec<_>, _>>()?;
            positions.sort_unstable();
            let mut shape = input.to_vec();
            for p in positions {
                shape.insert(p, 1);
            }
            Ok(shape)
        }
        "Squeeze" => match axes() {
            Some(axes) => {
                let drop = axes
                    .iter()
                    .map(|&a| normalize_axis(a, rank))
                    .collect::<Result<Vec<_>, _>>()?;
                for &d in &drop {
                    if input[d] != 1 {
                        return Err(format!("cannot squeeze axis {d} of size {}", input[d]));
                    }
                }
                Ok(input
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !drop.contains(i))
                    .map(|(_, &d)| d)
                    .collect())
            }
            None => Ok(input.iter().copied().filter(|&d| d != 1).collect()),
        },
        "Flatten" => {
            let axis = ctx.int("axis", 1);
            let axis = if axis == rank as i64 {
                rank
            } else {
                normalize_axis(axis, rank)?
            };
            Ok(vec![
                input[..axis].iter().product(),
                input[axis..].iter().product(),
            ])
        }
        other => Err(format!("{other} is not a view op")),
    }
}

fn shape(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    Ok(vec![shape_tensor(ctx, input(inputs, 0)?.shape())])
}

/// Shape's output for an input of `shape` (its `start` and `end` clamped as ONNX says). Shared
/// with the CUDA backend, which answers it without copying a device tensor.
pub(crate) fn shape_tensor(ctx: &Ctx, shape: &[usize]) -> HostTensor {
    let rank = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(ctx.int("start", 0));
    let end = clamp(ctx.int("end", rank));
    let dims: Vec<i64> = shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    HostTensor::i64(vec![dims.len()], dims)
}

fn size(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    Ok(vec![HostTensor::i64(
        vec![],
        vec![input(inputs, 0)?.len() as i64],
    )])
}

fn range(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (start, limit, delta) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let count = |steps: f64| -> Result<usize, String> {
        if !steps.is_finite() {
            return Err("Range delta is 0 or the bounds are not finite".into());
        }
        let n = steps.ceil().max(0.0) as usize;
        checked_size(&[n])
    };
    if start.dtype() == pipecut_ir::graph::DType::F32 {
        let scalar = |t: &HostTensor| t.to_f32_vec().first().copied().ok_or("Range needs scalars");
        let (s, l, d) = (scalar(start)?, scalar(limit)?, scalar(delta)?);
        let n = count(((l - s) / d) as f64)?;
        return Ok(vec![HostTensor::f32(
            vec![n],
            try_collect(n, (0..n).map(|i| s + i as f32 * d))?,
        )]);
    }
    let scalar = |t: &HostTensor| t.to_i64_vec().first().copied().ok_or("Range needs scalars");
    let (s, l, d) = (scalar(start)?, scalar(limit)?, scalar(delta)?);
    if d == 0 {
        return Err("Range delta is 0".into());
    }
    let n = count((l as f64 - s as f64) / d as f64)?;
    // Wrapping like onnxruntime's int64 Range: the count already bounds the loop, and a value
    // past i64 can only come from bounds whose difference overflowed.
    let values = try_collect(n, (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))))?;
    HostTensor::i64(vec![n], values)
        .cast(start.dtype())
        .map(|t| vec![t])
}

fn constant_of_shape(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let shape = dims_from(&input(inputs, 0)?.to_i64_vec(), "shape")?;
    let n = checked_size(&shape)?;
    let data = match ctx.attr("value") {
        Some(Attribute::Tensor(lit)) => match (&lit.value, lit.dtype) {
            (Some(v), dtype) => {
                let x = v.as_f64s().and_then(|f| f.first().copied()).unwrap_or(0.0);
                match dtype {
                    pipecut_ir::graph::DType::F32
                    | pipecut_ir::graph::DType::F16
                    | pipecut_ir::graph::DType::F64 => TensorData::F32(try_filled(n, x as f32)?),
                    pipecut_ir::graph::DType::I32 => TensorData::I32(try_filled(n, x as i32)?),
                    pipecut_ir::graph::DType::Bool => TensorData::Bool(try_filled(n, x != 0.0)?),
                    pipecut_ir::graph::DType::U8 => TensorData::U8(try_filled(n, x as u8)?),
                    pipecut_ir::graph::DType::I8 => TensorData::I8(try_filled(n, x as i8)?),
                    _ => TensorData::I64(try_filled(n, x as i64)?),
                }
            }
            (None, _) => return Err("ConstantOfShape value is not readable".into()),
        },
        _ => TensorData::F32(try_filled(n, 0.0)?),
    };
    Ok(vec![HostTensor::with_data(shape, data)])
}

fn tile(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let reps = dims_from(&input(inputs, 1)?.to_i64_vec(), "repeats")?;
    if reps.len() != x.rank() {
        return Err("repeats must have one entry per axis".into());
    }
    let shape: Vec<usize> = x
        .shape()
        .iter()
        .zip(&reps)
        .map(|(d, r)| d.checked_mul(*r).ok_or("repeats overflow"))
        .collect::<Result<_, _>>()?;
    checked_size(&shape)?;
    let xs = strides_of(x.shape());
    let total: usize = shape.iter().product();
    let out_strides = strides_of(&shape);
    let offsets: Vec<usize> = try_collect(
        total,
        (0..total).map(|flat| {
            (0..x.rank())
                .map(|d| ((flat / out_strides[d]) % shape[d] % x.shape()[d]) * xs[d])
                .sum()
        }),
    )?;
    Ok(vec![HostTensor::with_data(
        shape,
        take(x.data(), &offsets)?,
    )])
}

fn pad(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let mode = ctx.string("mode", "constant");
    if !matches!(mode.as_str(), "constant" | "edge" | "reflect" | "wrap") {
        return Err(format!("unknown Pad mode '{mode}'"));
    }
    let pads = if ctx.opset < 11 {
        ctx.ints("pads").unwrap_or_default()
    } else {
        input(inputs, 1)?.to_i64_vec()
    };
    let value = if ctx.opset < 11 {
        ctx.float("value", 0.0)
    } else {
        optional(inputs, 2)
            .and_then(|v| v.to_f32_vec().first().copied())
            .unwrap_or(0.0)
    };
    let axes: Vec<usize> = match optional(inputs, 3) {
        Some(a) => a
            .to_i64_vec()
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads has {} entries for {} axes",
            pads.len(),
            axes.len()
        ));
    }
    let mut begin = vec![0i64; rank];
    let mut end = vec![0i64; rank];
    for (k, &a) in axes.iter().enumerate() {
        begin[a] = pads[k];
        end[a] = pads[k + axes.len()];
    }
    // In i128: two pads near i64::MAX wrapped around in i64 (a release build padded [1, 8] by
    // 2·i64::MAX to [1, 6]).
    let shape: Vec<usize> = (0..rank)
        .map(|d| {
            let size = x.shape()[d] as i128 + i128::from(begin[d]) + i128::from(end[d]);
            usize::try_from(size).map_err(|_| {
                format!(
                    "padding axis {d} of size {} by {} and {} gives {size} elements",
                    x.shape()[d],
                    begin[d],
                    end[d]
                )
            })
        })
        .collect::<Result<_, _>>()?;
    checked_size(&shape)?;
    let total: usize = shape.iter().product();
    if total == 0 {
        return HostTensor::f32(shape, Vec::new())
            .cast(x.dtype())
            .map(|t| vec![t]);
    }
    let source = |d: usize, c: usize| {
        outside_source(
            &mode,
            c as i128 - i128::from(begin[d]),
            x.shape()[d] as i128,
        )
    };
    // Bytes (an image) are padded as bytes, the fill cast to their type as any value is; the
    // rest through f32 and back.
    let fill = HostTensor::f32(Vec::new(), vec![value]).cast(x.dtype())?;
    let data = match (x.data(), fill.data()) {
        (TensorData::U8(v), TensorData::U8(f)) => {
            TensorData::U8(padded_rows(v, x.shape(), &shape, source, f[0])?)
        }
        (TensorData::I8(v), TensorData::I8(f)) => {
            TensorData::I8(padded_rows(v, x.shape(), &shape, source, f[0])?)
        }
        _ => {
            let out = padded_rows(&x.to_f32_vec(), x.shape(), &shape, source, value)?;
            return HostTensor::f32(shape, out).cast(x.dtype()).map(|t| vec![t]);
        }
    };
    Ok(vec![HostTensor::with_data(shape, data)])
}

/// The padded tensor of `shape` (not empty), row by row along the last axis: `source(d, c)` is
/// the input index that output coordinate `c` of axis `d` reads, `None` for `value`. Each axis's
/// sources are worked out once; before, every element divided its flat index by each axis's
/// stride and matched the mode's name (a reflect pad of faster-whisper's 938 × 576 windows took
/// longer than its convolutions).
fn padded_rows<T: Copy>(
    src: &[T],
    in_shape: &[usize],
    shape: &[usize],
    source: impl Fn(usize, usize) -> Option<usize>,
    value: T,
) -> Result<Vec<T>, String> {
    let total: usize = shape.iter().product();
    let mut out = crate::tensor::try_with_capacity(total)?;
    let Some((&row_len, outer_shape)) = shape.split_last() else {
        out.push(src[0]);
        return Ok(out);
    };
    let sources: Vec<Vec<Option<usize>>> = (shape.iter().enumerate())
        .map(|(d, &size)| (0..size).map(|c| source(d, c)).collect())
        .collect();
    let strides = strides_of(in_shape);
    for row in 0..total / row_len {
        let mut rest = row;
        let mut base = Some(0usize);
        for d in (0..outer_shape.len()).rev() {
            let c = rest % outer_shape[d];
            rest /= outer_shape[d];
            base = base.and_then(|b| sources[d][c].map(|i| b + i * strides[d]));
        }
        match base {
            None => out.extend(std::iter::repeat_n(value, row_len)),
            Some(b) => out.extend(
                sources[outer_shape.len()]
                    .iter()
                    .map(|s| s.map_or(value, |i| src[b + i])),
            ),
        }
    }
    Ok(out)
}

/// The input index a padded coordinate `c` (negative or past `size` in the padding) reads
/// under Pad's `mode`: `None` for the constant; the nearest edge; the mirror image without
/// repeating the edge (reflect); the periodic image (wrap).
fn outside_source(mode: &str, c: i128, size: i128) -> Option<usize> {
    if (0..size).contains(&c) {
        return Some(c as usize);
    }
    let index = match mode {
        "edge" => c.clamp(0, size - 1),
        "wrap" => c.rem_euclid(size),
        "reflect" if size == 1 => 0,
        "reflect" => {
            let period = 2 * (size - 1);
            let m = c.rem_euclid(period);
            if m < size {
                m
            } else {
                period - m
            }
        }
        _ => return None,
    };
    Some(index as usize)
}

fn trilu(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(format!("Trilu needs a matrix, got {:?}", x.shape()));
    }
    let k = optional(inputs, 1)
        .and_then(|t| t.to_i64_vec().first().copied())
        .unwrap_or(0);
    let upper = ctx.int("upper", 1) != 0;
    let (rows, cols) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    let keep: Vec<bool> = (0..x.len())
        .map(|flat| {
            let (i, j) = (((flat / cols) % rows) as i64, (flat % cols) as i64);
            if upper {
                j - i >= k
            } else {
                j - i <= k
            }
        })
        .collect();
    let zeroed = match x.data() {
        TensorData::F32(v) => TensorData::F32(
            v.iter()
                .zip(&keep)
                .map(|(&a, &k)| if k { a } else { 0.0 })
                .collect(),
        ),
        TensorData::I64(v) => TensorData::I64(
            v.iter()
                .zip(&keep)
                .map(|(&a, &k)| if k { a } else { 0 })
                .collect(),
        ),
        TensorData::I32(v) => TensorData::I32(
            v.iter()
                .zip(&keep)
                .map(|(&a, &k)| if k { a } else { 0 })
                .collect(),
        ),
        TensorData::Bool(v) => {
            TensorData::Bool(v.iter().zip(&keep).map(|(&a, &k)| a && k).collect())
        }
        TensorData::U8(v) => TensorData::U8(
            v.iter()
                .zip(&keep)
                .map(|(&a, &k)| if k { a } else { 0 })
                .collect(),
        ),
        TensorData::I8(v) => TensorData::I8(
            v.iter()
                .zip(&keep)
                .map(|(&a, &k)| if k { a } else { 0 })
                .collect(),
        ),
        TensorData::String(_) => return Err("Trilu does not accept string".into()),
    };
    Ok(vec![HostTensor::with_data(x.shape().to_vec(), zeroed)])
}

fn cumsum(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    cumulative(ctx, inputs, "CumSum", 0.0, |acc, x| acc + x)
}

/// CumProd (opset 26): CumSum's axis, `exclusive` and `reverse`, with products.
fn cumprod(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    cumulative(ctx, inputs, "CumProd", 1.0, |acc, x| acc * x)
}

/// A running `combine` along the axis the second input names, starting from `identity`
/// (which an `exclusive` scan writes first), in f64 so that integer inputs stay exact below
/// 2^53.
fn cumulative(
    ctx: &Ctx,
    inputs: &[Option<&HostTensor>],
    op: &str,
    identity: f64,
    combine: fn(f64, f64) -> f64,
) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis_value = input(inputs, 1)?
        .to_i64_vec()
        .first()
        .copied()
        .ok_or_else(|| format!("{op} needs an axis"))?;
    let axis = normalize_axis(axis_value, x.rank())?;
    let exclusive = ctx.int("exclusive", 0) != 0;
    let reverse = ctx.int("reverse", 0) != 0;
    let n = x.shape()[axis];
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let outer: usize = x.shape()[..axis].iter().product();
    let v: Vec<f64> = if x.dtype().is_float() {
        x.to_f32_vec().into_iter().map(f64::from).collect()
    } else {
        x.to_i64_vec().into_iter().map(|a| a as f64).collect()
    };
    let mut out = vec![0.0f64; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = identity;
            for step in 0..n {
                let k = if reverse { n - 1 - step } else { step };
                let at = (o * n + k) * inner + i;
                if exclusive {
                    out[at] = acc;
                    acc = combine(acc, v[at]);
                } else {
                    acc = combine(acc, v[at]);
                    out[at] = acc;
                }
            }
        }
    }
    let out = if x.dtype().is_float() {
        HostTensor::f32(x.shape().to_vec(), out.iter().map(|&a| a as f32).collect())
    } else {
        HostTensor::with_data(
            x.shape().to_vec(),
            TensorData::I64(out.iter().map(|&a| a as i64).collect()),
        )
    };
    out.cast(x.dtype()).map(|t| vec![t])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn reshape_infers_and_copies_dims() {
        let x = f(&[2, 3, 4], &[0.0; 24]);
        let out = run("Reshape", vec![], &[&x, &i(&[2], &[0, -1])]);
        assert_eq!(out[0].shape(), &[2, 12]);
    }

    #[test]
    fn transpose_and_concat() {
        let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let t = run("Transpose", vec![], &[&x]);
        assert_close(&t[0], &[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let c = run(
            "Concat",
            vec![("axis", Attribute::Int(1))],
            &[&x, &f(&[2, 1], &[7.0, 8.0])],
        );
        assert_close(&c[0], &[2, 4], &[1.0, 2.0, 3.0, 7.0, 4.0, 5.0, 6.0, 8.0]);
    }

    #[test]
    fn slice_gather_split_expand() {
        let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let s = run(
            "Slice",
            vec![],
            &[
                &x,
                &i(&[1], &[-1]),
                &i(&[1], &[i64::MIN]),
                &i(&[1], &[1]),
                &i(&[1], &[-1]),
            ],
        );
        assert_close(&s[0], &[2, 3], &[3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
        let g = run(
            "Gather",
            vec![("axis", Attribute::Int(1))],
            &[&x, &i(&[2], &[2, -3])],
        );
        assert_close(&g[0], &[2, 2], &[3.0, 1.0, 6.0, 4.0]);
        let parts = run(
            "Split",
            vec![("axis", Attribute::Int(1))],
            &[&x, &i(&[2], &[1, 2])],
        );
        assert_close(&parts[1], &[2, 2], &[2.0, 3.0, 5.0, 6.0]);
        let e = run(
            "Expand",
            vec![],
            &[&f(&[2, 1], &[1.0, 2.0]), &i(&[2], &[2, 2])],
        );
        assert_close(&e[0], &[2, 2], &[1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn shape_ops() {
        let x = f(&[2, 1, 3], &[0.0; 6]);
        assert_eq!(run("Shape", vec![], &[&x])[0].to_i64_vec(), vec![2, 1, 3]);
        assert_eq!(
            run("Squeeze", vec![], &[&x, &i(&[1], &[1])])[0].shape(),
            &[2, 3]
        );
        assert_eq!(
            run("Unsqueeze", vec![], &[&x, &i(&[1], &[-1])])[0].shape(),
            &[2, 1, 3, 1]
        );
        assert_eq!(run("Flatten", vec![], &[&x])[0].shape(), &[2, 3]);
        let r = run(
            "Range",
            vec![],
            &[&i(&[], &[1]), &i(&[], &[7]), &i(&[], &[2])],
        );
        assert_eq!(r[0].to_i64_vec(), vec![1, 3, 5]);
    }

    #[test]
    fn trilu_and_cumsum() {
        let x = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert_close(
            &run("Trilu", vec![], &[&x])[0],
            &[2, 2],
            &[1.0, 2.0, 0.0, 4.0],
        );
        let lower = run(
            "Trilu",
            vec![("upper", Attribute::Int(0))],
            &[&x, &i(&[], &[-1])],
        );
        assert_close(&lower[0], &[2, 2], &[0.0, 0.0, 3.0, 0.0]);
        let c = run("CumSum", vec![], &[&x, &i(&[], &[1])]);
        assert_close(&c[0], &[2, 2], &[1.0, 3.0, 3.0, 7.0]);
        let c = run(
            "CumSum",
            vec![
                ("exclusive", Attribute::Int(1)),
                ("reverse", Attribute::Int(1)),
            ],
            &[&x, &i(&[], &[0])],
        );
        assert_close(&c[0], &[2, 2], &[3.0, 4.0, 0.0, 0.0]);
    }

    #[test]
    fn pad_tile_resize() {
        let x = f(&[1, 2], &[1.0, 2.0]);
        let p = run(
            "Pad",
            vec![],
            &[&x, &i(&[4], &[0, 1, 0, 0]), &f(&[], &[9.0])],
        );
        assert_close(&p[0], &[1, 3], &[9.0, 1.0, 2.0]);
        // Pads of i64::MAX on both sides: 2^64 + 6 elements, not [1, 6] by wrap-around.
        let node = super::super::test_util::node("Pad", vec![]);
        let ctx = super::Ctx {
            node: &node,
            opset: 17,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let huge = i(&[4], &[0, i64::MAX, 0, i64::MAX]);
        let wide = f(&[1, 8], &[0.0; 8]);
        let err = super::pad(&ctx, &[Some(&wide), Some(&huge)]).unwrap_err();
        assert!(err.contains("gives 18446744073709551622 elements"), "{err}");
        // Slice with a step near i64::MAX takes the first element, as onnx does ([8, 1]).
        let x8 = f(&[8, 4], &[1.0; 32]);
        let sliced = run(
            "Slice",
            vec![],
            &[
                &x8,
                &i(&[1], &[0]),
                &i(&[1], &[i64::MAX]),
                &i(&[1], &[1]),
                &i(&[1], &[i64::MAX]),
            ],
        );
        assert_eq!(sliced[0].shape(), &[8, 1]);
        let sliced = run(
            "Slice",
            vec![],
            &[
                &x8,
                &i(&[1], &[-1]),
                &i(&[1], &[i64::MIN]),
                &i(&[1], &[1]),
                &i(&[1], &[i64::MIN]),
            ],
        );
        assert_eq!(sliced[0].shape(), &[8, 1]);
        assert_close(
            &run("Tile", vec![], &[&x, &i(&[2], &[2, 1])])[0],
            &[2, 2],
            &[1.0, 2.0, 1.0, 2.0],
        );
    }

    #[test]
    fn pad_modes_read_the_edge_the_mirror_and_the_period() {
        // Size 3, coordinates -2..5.
        let read = |mode| {
            (-2..5)
                .map(|c| super::outside_source(mode, c, 3))
                .collect::<Vec<_>>()
        };
        let some = |v: &[usize]| v.iter().map(|&i| Some(i)).collect::<Vec<_>>();
        assert_eq!(read("edge"), some(&[0, 0, 0, 1, 2, 2, 2]));
        assert_eq!(read("reflect"), some(&[2, 1, 0, 1, 2, 1, 0]));
        assert_eq!(read("wrap"), some(&[1, 2, 0, 1, 2, 0, 1]));
        assert_eq!(read("constant")[0], None);
    }
}
