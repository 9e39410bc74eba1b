//! Data movement and shape computation: reshapes, transposes, concatenation, slicing, gathers,
//! padding, and the ops that exported models use to compute shapes at run time (`Shape`,
//! `ConstantOfShape`, `Range`, `Constant`). Values are propagated through these so that a
//! `Reshape` whose target was computed from `Shape` still gets a known output. Spec:
//! <https://onnx.ai/onnx/operators/> (each op's page); rules cover opsets 7–23, reading attribute
//! forms (older opsets) and input forms (newer) alike.

use super::context::{
    broadcast, concrete, gather_value, normalize_axis, strides, Inferred, OpCtx, RuleResult,
};
use super::registry::Registry;
use crate::graph::{element_count, format_shape, Attribute, ConstValue, DType, Dim, Shape, SymInt};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["Reshape"], reshape);
    r.add("", &["Transpose"], transpose);
    r.add("", &["Flatten"], flatten);
    r.add("", &["Squeeze"], squeeze);
    r.add("", &["Unsqueeze"], unsqueeze);
    r.add("", &["Concat"], concat);
    r.add("", &["Split"], split);
    r.add("", &["Slice"], slice);
    r.add("", &["Gather"], gather);
    r.add("", &["GatherElements"], gather_elements);
    r.add("", &["GatherND"], gather_nd);
    r.add(
        "",
        &["ScatterND", "ScatterElements", "Scatter", "TensorScatter"],
        same_as_data,
    );
    r.add("", &["Expand"], expand);
    r.add("", &["Tile"], tile);
    r.add("", &["Pad"], pad);
    r.add("", &["Shape"], shape_of);
    r.add("", &["Size"], size_of);
    r.add("", &["ConstantOfShape"], constant_of_shape);
    r.add("", &["Range"], range);
    r.add("", &["Constant"], constant);
    r.add("", &["TopK"], top_k);
    r.add("", &["ArgMax", "ArgMin"], arg_reduce);
    r.add("", &["OneHot"], one_hot);
    r.add("", &["EyeLike"], eye_like);
    r.add("", &["RoiAlign"], roi_align);
    r.add("", &["GridSample"], grid_sample);
}

fn overflow() -> String {
    "a dimension overflows 64 bits".to_string()
}

/// The most dims a shape computed at run time may have. ONNX sets no limit, but no real tensor
/// comes near it, and the output shape is allocated from this length: a declared length of 2^45
/// (a corrupt or hostile file) must be an error, not a 35 TB allocation.
pub(crate) const MAX_RANK: u64 = 64;

/// The length of the 1-D shape tensor at `input`, whose values are unknown.
fn shape_tensor_length(ctx: &OpCtx, input: usize) -> Result<usize, String> {
    let len = ctx
        .shape(input)?
        .first()
        .and_then(Dim::known)
        .ok_or("the shape input's length is not known")?;
    if len > MAX_RANK {
        return Err(format!(
            "the shape input has {len} entries: a tensor of rank above {MAX_RANK} is not supported"
        ));
    }
    Ok(len as usize)
}

/// Keeps the input value; used by ops that change only the shape (Reshape, Squeeze, ...).
fn reshaped(ctx: &OpCtx, shape: Shape) -> RuleResult {
    let input = ctx.input(0)?;
    Ok(vec![
        Inferred::new(input.dtype, shape).with_value(input.value.cloned())
    ])
}

/// Reshape (opset 5+): `0` copies the input dim (unless `allowzero`), one `-1` is inferred.
fn reshape(ctx: &OpCtx) -> RuleResult {
    let data = ctx.shape(0)?;
    let allow_zero = ctx.int_attr_or("allowzero", 0)? != 0;
    let Some(target) = ctx.sym_ints(1) else {
        // The target is computed at run time from data we cannot see: only its length is known.
        let target_len = shape_tensor_length(ctx, 1)?;
        let out = (0..target_len)
            .map(|axis| ctx.data_dependent_dim(0, axis))
            .collect();
        return reshaped(ctx, out);
    };
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (axis, entry) in target.iter().enumerate() {
        out.push(match entry {
            SymInt::Lit(-1) => {
                if infer_at.replace(axis).is_some() {
                    return Err(format!(
                        "target shape {} has more than one -1",
                        display_ints(target)
                    ));
                }
                None
            }
            SymInt::Lit(0) if !allow_zero => Some(data.get(axis).cloned().ok_or_else(|| {
                format!(
                    "target has 0 at axis {axis} but the input has rank {}",
                    data.len()
                )
            })?),
            SymInt::Lit(v) if *v < 0 => {
                return Err(format!(
                    "target shape {} has invalid value {v}",
                    display_ints(target)
                ))
            }
            other => other.to_dim(),
        });
    }
    if let Some(axis) = infer_at {
        let total = element_count(data).ok_or_else(overflow)?;
        let known = out
            .iter()
            .flatten()
            .try_fold(Dim::Known(1), |acc, d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        out[axis] = Some(match total.exact_div(&known) {
            Some(d) => d,
            None if matches!((&total, &known), (Dim::Known(_), Dim::Known(_))) => {
                return Err(format!(
                    "cannot reshape {} ({total} elements) to {}",
                    format_shape(data),
                    display_ints(target)
                ))
            }
            None => ctx.data_dependent_dim(0, axis),
        });
    }
    let out: Shape = out
        .into_iter()
        .map(|d| d.expect("every axis filled"))
        .collect();
    if let (Some(Dim::Known(a)), Some(Dim::Known(b))) = (element_count(data), element_count(&out)) {
        if a != b {
            return Err(format!(
                "cannot reshape {} ({a} elements) to {} ({b} elements)",
                format_shape(data),
                format_shape(&out)
            ));
        }
    }
    reshaped(ctx, out)
}

fn display_ints(values: &[SymInt]) -> String {
    format!(
        "[{}]",
        values
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn transpose(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let rank = input.shape.len();
    let perm: Vec<usize> = match ctx.ints_attr("perm")? {
        Some(p) => p
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(format!("perm {perm:?} is not a permutation of {rank} axes"));
    }
    let out: Shape = perm.iter().map(|&p| input.shape[p].clone()).collect();
    let value = (|| {
        let in_shape = concrete(input.shape)?;
        let out_shape = concrete(&out)?;
        let in_strides = strides(&in_shape);
        gather_value(input.value?, &out_shape, |coords| {
            Some(
                coords
                    .iter()
                    .zip(&perm)
                    .map(|(c, &p)| c * in_strides[p])
                    .sum::<u64>() as usize,
            )
        })
    })();
    Ok(vec![Inferred::new(input.dtype, out).with_value(value)])
}

fn product(dims: &[Dim]) -> Result<Dim, String> {
    element_count(dims).ok_or_else(overflow)
}

fn flatten(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let mut axis = ctx.int_attr_or("axis", 1)?;
    if axis < 0 {
        axis += x.len() as i64;
    }
    if axis < 0 || axis as usize > x.len() {
        return Err(format!("axis {axis} is out of range for rank {}", x.len()));
    }
    let axis = axis as usize;
    reshaped(ctx, vec![product(&x[..axis])?, product(&x[axis..])?])
}

fn squeeze(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axes = ctx.ints_from_attr_or_input("axes", 1)?;
    let out: Shape = match axes {
        Some(axes) => {
            let axes: Vec<usize> = axes
                .iter()
                .map(|&a| normalize_axis(a, x.len()))
                .collect::<Result<_, _>>()?;
            for &a in &axes {
                if let Dim::Known(n) = x[a] {
                    if n != 1 {
                        return Err(format!("cannot squeeze axis {a} of size {n}"));
                    }
                }
            }
            x.iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        }
        None => {
            if let Some(Dim::Sym(s)) = x.iter().find(|d| matches!(d, Dim::Sym(_))) {
                return Err(format!(
                    "Squeeze without axes needs concrete dims, but '{s}' is symbolic"
                ));
            }
            x.iter().filter(|d| **d != Dim::Known(1)).cloned().collect()
        }
    };
    reshaped(ctx, out)
}

fn unsqueeze(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axes = ctx
        .ints_from_attr_or_input("axes", 1)?
        .ok_or("'axes' is missing")?;
    let rank = x.len() + axes.len();
    let mut axes: Vec<usize> = axes
        .iter()
        .map(|&a| normalize_axis(a, rank))
        .collect::<Result<_, _>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err("'axes' repeats an axis".into());
    }
    let mut source = x.iter();
    let out: Shape = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Dim::Known(1)
            } else {
                source.next().cloned().expect("rank adds up")
            }
        })
        .collect();
    reshaped(ctx, out)
}

/// Sum of dims along a concatenation axis; sums of different symbols are not monomials and
/// get a fresh symbol.
fn add_dims(ctx: &OpCtx, dims: &[&Dim], axis: usize) -> Result<Dim, String> {
    let mut known = 0u64;
    let mut symbolic: Vec<&Dim> = Vec::new();
    for d in dims {
        match d {
            Dim::Known(v) => known = known.checked_add(*v).ok_or_else(overflow)?,
            sym => symbolic.push(sym),
        }
    }
    Ok(match (symbolic.as_slice(), known) {
        ([], k) => Dim::Known(k),
        ([one], 0) => (*one).clone(),
        _ => ctx.data_dependent_dim(0, axis),
    })
}

fn concat(ctx: &OpCtx) -> RuleResult {
    let inputs: Vec<_> = (0..ctx.input_count())
        .map(|i| ctx.input(i))
        .collect::<Result<_, _>>()?;
    let first = inputs.first().ok_or("Concat needs at least one input")?;
    let rank = first.shape.len();
    let axis = normalize_axis(
        ctx.int_attr("axis")?.ok_or("attribute 'axis' is missing")?,
        rank,
    )?;
    let mut out = first.shape.clone();
    for (i, input) in inputs.iter().enumerate() {
        if input.shape.len() != rank {
            return Err(format!(
                "input {i} has rank {} but input 0 has rank {rank} ({} vs {})",
                input.shape.len(),
                format_shape(input.shape),
                format_shape(first.shape)
            ));
        }
        for (a, (d, o)) in input.shape.iter().zip(out.iter_mut()).enumerate() {
            if a == axis {
                continue;
            }
            match (&*o, d) {
                (Dim::Known(x), Dim::Known(y)) if x != y => {
                    return Err(format!(
                        "input {i} has size {y} at axis {a} where input 0 has {x}"
                    ));
                }
                (Dim::Sym(_), Dim::Known(_)) => *o = d.clone(),
                _ => {}
            }
        }
    }
    let along: Vec<&Dim> = inputs.iter().map(|i| &i.shape[axis]).collect();
    out[axis] = add_dims(ctx, &along, axis)?;
    let value = concat_values(
        &inputs
            .iter()
            .map(|i| (i.shape, i.value))
            .collect::<Vec<_>>(),
        &out,
        axis,
    );
    Ok(vec![Inferred::new(first.dtype, out).with_value(value)])
}

fn concat_values(
    inputs: &[(&Shape, Option<&ConstValue>)],
    out: &Shape,
    axis: usize,
) -> Option<ConstValue> {
    let out_shape = concrete(out)?;
    let shapes: Vec<Vec<u64>> = inputs
        .iter()
        .map(|(s, _)| concrete(s))
        .collect::<Option<_>>()?;
    let values: Vec<&ConstValue> = inputs.iter().map(|(_, v)| *v).collect::<Option<_>>()?;
    // Concatenate as one flat value, then index into it.
    let mut offsets = Vec::with_capacity(values.len());
    let mut flat = match values[0] {
        ConstValue::Ints(_) => ConstValue::Ints(Vec::new()),
        ConstValue::Floats(_) => ConstValue::Floats(Vec::new()),
        ConstValue::Strings(_) => ConstValue::Strings(Vec::new()),
    };
    for v in &values {
        offsets.push(flat.len());
        match (&mut flat, v) {
            (ConstValue::Ints(acc), ConstValue::Ints(x)) => acc.extend(x.iter().cloned()),
            (ConstValue::Floats(acc), ConstValue::Floats(x)) => acc.extend(x.iter().copied()),
            (ConstValue::Strings(acc), ConstValue::Strings(x)) => acc.extend(x.iter().cloned()),
            _ => return None,
        }
    }
    gather_value(&flat, &out_shape, |coords| {
        let mut along = coords[axis];
        for (i, shape) in shapes.iter().enumerate() {
            if along < shape[axis] {
                let s = strides(shape);
                let index: u64 = coords
                    .iter()
                    .enumerate()
                    .map(|(a, &c)| if a == axis { along * s[a] } else { c * s[a] })
                    .sum();
                return Some(offsets[i] + index as usize);
            }
            along -= shape[axis];
        }
        None
    })
}

fn split(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let x = input.shape;
    let axis = normalize_axis(ctx.int_attr_or("axis", 0)?, x.len())?;
    let outputs = ctx.output_count();
    let sizes: Vec<Dim> = match ctx.ints_from_attr_or_input("split", 1)? {
        Some(split) => {
            if split.len() != outputs {
                return Err(format!(
                    "'split' has {} sizes for {outputs} outputs",
                    split.len()
                ));
            }
            split
                .iter()
                .map(|&s| {
                    u64::try_from(s)
                        .map(Dim::Known)
                        .map_err(|_| format!("negative split size {s}"))
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let parts = match ctx.int_attr("num_outputs")? {
                // Opset 18 requires num_outputs to equal the node's output count.
                Some(n) if n != outputs as i64 => {
                    return Err(format!(
                        "num_outputs is {n} but the node has {outputs} outputs"
                    ))
                }
                _ => outputs as u64,
            };
            if parts == 0 {
                return Err("split into zero parts".into());
            }
            match &x[axis] {
                // Opset 18: with num_outputs, the last chunk may be smaller.
                Dim::Known(n) => {
                    let chunk = n.div_ceil(parts);
                    (0..outputs as u64)
                        .map(|i| Dim::Known(chunk.min(n.saturating_sub(i * chunk))))
                        .collect()
                }
                sym => match sym.exact_div(&Dim::Known(parts)) {
                    Some(d) => vec![d; outputs],
                    None => (0..outputs)
                        .map(|o| ctx.data_dependent_dim(o, axis))
                        .collect(),
                },
            }
        }
    };
    if let (Dim::Known(n), Some(total)) =
        (&x[axis], sizes.iter().map(Dim::known).sum::<Option<u64>>())
    {
        if *n != total {
            return Err(format!(
                "split sizes add up to {total} but axis {axis} has {n}"
            ));
        }
    }
    // A known 1-D value (a shape vector split into its dims) splits into known parts.
    let mut start = 0usize;
    Ok(sizes
        .into_iter()
        .map(|size| {
            let value = match (input.value, x.len(), size.known()) {
                (Some(ConstValue::Ints(v)), 1, Some(len)) => {
                    let part = v.get(start..start + len as usize).map(|p| p.to_vec());
                    start += len as usize;
                    part.map(ConstValue::Ints)
                }
                _ => None,
            };
            let mut shape = x.clone();
            shape[axis] = size;
            Inferred::new(input.dtype, shape).with_value(value)
        })
        .collect())
}

/// Resolves one slice bound against a dim as the spec says: negative counts from the end, then
/// clamp to `[0, dim]` (or `[-1, dim-1]` for negative steps).
fn clamp_bound(value: i64, dim: i64, step: i64) -> i64 {
    let v = if value < 0 {
        value.saturating_add(dim)
    } else {
        value
    };
    if step > 0 {
        v.clamp(0, dim)
    } else {
        v.clamp(-1, dim - 1)
    }
}

/// Slice bounds as given: attributes before opset 10, inputs 1..=4 from opset 10.
struct SliceArgs {
    starts: Vec<SymInt>,
    ends: Vec<SymInt>,
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
}

fn slice_args(ctx: &OpCtx) -> Result<SliceArgs, String> {
    if let Some(starts) = ctx.ints_attr("starts")? {
        let ends = ctx
            .ints_attr("ends")?
            .ok_or("attribute 'ends' is missing")?;
        let lits = |v: &[i64]| v.iter().map(|&x| SymInt::Lit(x)).collect();
        return Ok(SliceArgs {
            starts: lits(starts),
            ends: lits(ends),
            axes: ctx.ints_attr("axes")?.map(<[i64]>::to_vec),
            steps: None,
        });
    }
    let bound = |i: usize, what: &str| {
        ctx.sym_ints(i).map(<[SymInt]>::to_vec).ok_or(format!(
            "'{what}' is computed at run time; its value must be known"
        ))
    };
    let optional = |i: usize, what: &str| match ctx.opt_input(i) {
        Some(_) => ctx.const_ints(i).map(Some).ok_or(format!(
            "'{what}' is computed at run time; its value must be known"
        )),
        None => Ok(None),
    };
    Ok(SliceArgs {
        starts: bound(1, "starts")?,
        ends: bound(2, "ends")?,
        axes: optional(3, "axes")?,
        steps: optional(4, "steps")?,
    })
}

fn slice(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let x = input.shape;
    let rank = x.len();
    let SliceArgs {
        starts,
        ends,
        axes,
        steps,
    } = slice_args(ctx)?;
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; axes.len()]);
    if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    // Without `axes`, starts names the first axes: no more of them than the input has.
    if let Some(&axis) = axes.iter().find(|&&a| a >= rank) {
        return Err(format!(
            "slices axis {axis} of a rank-{rank} input ({} starts)",
            starts.len()
        ));
    }
    let mut out = x.clone();
    // Per axis (start, step) for folding the value.
    let mut plan: Vec<(u64, i64)> = vec![(0, 1); rank];
    for (i, &axis) in axes.iter().enumerate() {
        let step = steps[i];
        if step == 0 {
            return Err("a slice step is 0".into());
        }
        out[axis] = match (&x[axis], &starts[i], &ends[i]) {
            (Dim::Known(n), SymInt::Lit(s), SymInt::Lit(e)) => {
                let n = i64::try_from(*n).map_err(|_| overflow())?;
                let (s, e) = (clamp_bound(*s, n, step), clamp_bound(*e, n, step));
                plan[axis] = (s.max(0) as u64, step);
                // In i128: a step near i64::MAX would overflow the rounding-up addition.
                let (s128, e128, step128) = (i128::from(s), i128::from(e), i128::from(step));
                let len = if step > 0 && e > s {
                    (e128 - s128 + step128 - 1) / step128
                } else if step < 0 && s > e {
                    (s128 - e128 - step128 - 1) / -step128
                } else {
                    0
                };
                Dim::Known(len as u64)
            }
            // x[..end] with a symbolic end inside a known dim, e.g. a position table cut to `seq`.
            (_, SymInt::Lit(0), SymInt::Sym(end)) if step == 1 => Dim::Sym(end.clone()),
            // x[0..] of a symbolic dim: the whole axis.
            (d, SymInt::Lit(0), SymInt::Lit(e)) if step == 1 && *e >= i32::MAX as i64 => d.clone(),
            _ => ctx.data_dependent_dim(0, axis),
        };
    }
    let value = (|| {
        let in_shape = concrete(x)?;
        let out_shape = concrete(&out)?;
        let s = strides(&in_shape);
        gather_value(input.value?, &out_shape, |coords| {
            let idx: i64 = coords
                .iter()
                .enumerate()
                .map(|(a, &c)| (plan[a].0 as i64 + c as i64 * plan[a].1) * s[a] as i64)
                .sum();
            usize::try_from(idx).ok()
        })
    })();
    Ok(vec![Inferred::new(input.dtype, out).with_value(value)])
}

fn gather(ctx: &OpCtx) -> RuleResult {
    let data = ctx.input(0)?;
    let indices = ctx.input(1)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", 0)?, data.shape.len())?;
    let mut out: Shape = data.shape[..axis].to_vec();
    out.extend(indices.shape.iter().cloned());
    out.extend(data.shape[axis + 1..].iter().cloned());
    let value = (|| {
        let data_shape = concrete(data.shape)?;
        let out_shape = concrete(&out)?;
        let index_values = indices.value?.as_i64s()?;
        let s = strides(&data_shape);
        let n_idx = indices.shape.len();
        let idx_strides = strides(&concrete(indices.shape)?);
        gather_value(data.value?, &out_shape, |coords| {
            let idx_flat: u64 = coords[axis..axis + n_idx]
                .iter()
                .zip(&idx_strides)
                .map(|(c, s)| c * s)
                .sum();
            let mut i = *index_values.get(idx_flat as usize)?;
            if i < 0 {
                i += data_shape[axis] as i64;
            }
            let i = u64::try_from(i).ok().filter(|&i| i < data_shape[axis])?;
            let mut flat = i * s[axis];
            for a in 0..axis {
                flat += coords[a] * s[a];
            }
            for a in axis + 1..data_shape.len() {
                flat += coords[a + n_idx - 1] * s[a];
            }
            Some(flat as usize)
        })
    })();
    Ok(vec![Inferred::new(data.dtype, out).with_value(value)])
}

fn gather_elements(ctx: &OpCtx) -> RuleResult {
    Ok(vec![Inferred::new(ctx.dtype(0)?, ctx.shape(1)?.clone())])
}

/// GatherND: `indices[:-1] + data[batch_dims + indices[-1]:]`.
fn gather_nd(ctx: &OpCtx) -> RuleResult {
    let (data, indices) = (ctx.shape(0)?, ctx.shape(1)?);
    let batch = ctx.int_attr_or("batch_dims", 0)? as usize;
    let last = indices
        .last()
        .and_then(Dim::known)
        .ok_or("the last dim of 'indices' must be known")? as usize;
    if batch + last > data.len() || indices.is_empty() {
        return Err(format!(
            "indices {} do not fit data {}",
            format_shape(indices),
            format_shape(data)
        ));
    }
    let mut out: Shape = indices[..indices.len() - 1].to_vec();
    out.extend(data[batch + last..].iter().cloned());
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

fn same_as_data(ctx: &OpCtx) -> RuleResult {
    Ok(vec![Inferred::new(ctx.dtype(0)?, ctx.shape(0)?.clone())])
}

/// A shape given as an input value, with entries that may be symbolic; unknown values (or
/// negative entries) become data-dependent dims.
pub(super) fn shape_from_value(ctx: &OpCtx, input: usize) -> Result<Shape, String> {
    match ctx.sym_ints(input) {
        Some(values) => values
            .iter()
            .map(|v| {
                v.to_dim()
                    .ok_or_else(|| format!("shape value {v} is negative"))
            })
            .collect(),
        None => {
            let len = shape_tensor_length(ctx, input)?;
            Ok((0..len).map(|a| ctx.data_dependent_dim(0, a)).collect())
        }
    }
}

fn expand(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let target = shape_from_value(ctx, 1)?;
    let out = broadcast(&[input.shape, &target], ctx, 0)?;
    let value = input.value.and_then(|v| match v {
        ConstValue::Ints(x) => {
            super::context::fold_broadcast(&[(input.shape, x.as_slice())], &out, |a| {
                Some(a[0].clone())
            })
            .map(ConstValue::Ints)
        }
        ConstValue::Floats(x) => {
            super::context::fold_broadcast(&[(input.shape, x.as_slice())], &out, |a| Some(*a[0]))
                .map(ConstValue::Floats)
        }
        ConstValue::Strings(x) => {
            super::context::fold_broadcast(&[(input.shape, x.as_slice())], &out, |a| {
                Some(a[0].clone())
            })
            .map(ConstValue::Strings)
        }
    });
    Ok(vec![Inferred::new(input.dtype, out).with_value(value)])
}

fn tile(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let repeats = ctx
        .const_ints(1)
        .ok_or("'repeats' is computed at run time; its value must be known")?;
    if repeats.len() != x.len() {
        return Err(format!(
            "'repeats' has {} values for rank {}",
            repeats.len(),
            x.len()
        ));
    }
    let out = x
        .iter()
        .zip(&repeats)
        .map(|(d, &r)| {
            let r = u64::try_from(r).map_err(|_| format!("negative repeat {r}"))?;
            d.checked_mul(&Dim::Known(r)).ok_or_else(overflow)
        })
        .collect::<Result<Shape, String>>()?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// Pad: `out = in + begin + end` per axis (pads may be negative, which crops).
fn pad(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let rank = x.len();
    let pads = ctx
        .ints_from_attr_or_input("pads", 1)?
        .ok_or("'pads' is missing")?;
    let axes: Vec<usize> = match ctx.opt_input(3) {
        Some(_) => ctx
            .const_ints(3)
            .ok_or("'axes' is computed at run time")?
            .iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "'pads' has {} values for {} axes",
            pads.len(),
            axes.len()
        ));
    }
    let mut out = x.clone();
    for (i, &axis) in axes.iter().enumerate() {
        // In i128: pads come from the model, and two near i64::MAX overflowed i64 (a finding of
        // the fuzzer).
        let total = i128::from(pads[i]) + i128::from(pads[i + axes.len()]);
        out[axis] = match &x[axis] {
            Dim::Known(n) => Dim::Known(u64::try_from(i128::from(*n) + total).map_err(|_| {
                format!("padding axis {axis} of size {n} by {total} in all gives no valid size")
            })?),
            d if total == 0 => d.clone(),
            _ => ctx.data_dependent_dim(0, axis),
        };
    }
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}

/// Shape (with opset-15 `start`/`end`): a 1-D int64 tensor whose value is the dims.
fn shape_of(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let rank = x.len() as i64;
    let bound = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = bound(ctx.int_attr_or("start", 0)?);
    let end = bound(ctx.int_attr_or("end", rank)?);
    let dims = if start < end {
        &x[start..end]
    } else {
        &x[0..0]
    };
    let value = ConstValue::Ints(dims.iter().map(SymInt::from).collect());
    Ok(vec![Inferred::new(
        DType::I64,
        vec![Dim::Known(dims.len() as u64)],
    )
    .with_value(Some(value))])
}

fn size_of(ctx: &OpCtx) -> RuleResult {
    let count = product(ctx.shape(0)?)?;
    Ok(vec![Inferred::new(DType::I64, vec![]).with_value(Some(
        ConstValue::Ints(vec![SymInt::from(&count)]),
    ))])
}

fn constant_of_shape(ctx: &OpCtx) -> RuleResult {
    let shape = shape_from_value(ctx, 0)?;
    let (dtype, fill) = match ctx.attr("value") {
        Some(Attribute::Tensor(t)) => (t.dtype, t.value.clone()),
        _ => (DType::F32, Some(ConstValue::Floats(vec![0.0]))),
    };
    let value = match (element_count(&shape), fill) {
        (Some(Dim::Known(n)), Some(ConstValue::Ints(v)))
            if n <= crate::graph::MAX_TRACKED_ELEMENTS && v.len() == 1 =>
        {
            Some(ConstValue::Ints(vec![v[0].clone(); n as usize]))
        }
        (Some(Dim::Known(n)), Some(ConstValue::Floats(v)))
            if n <= crate::graph::MAX_TRACKED_ELEMENTS && v.len() == 1 =>
        {
            Some(ConstValue::Floats(vec![v[0]; n as usize]))
        }
        _ => None,
    };
    Ok(vec![Inferred::new(dtype, shape).with_value(value)])
}

/// Range: `max(ceil((limit − start) / delta), 0)` elements.
fn range(ctx: &OpCtx) -> RuleResult {
    let dtype = ctx.dtype(0)?;
    let scalar = |i: usize| {
        ctx.opt_input(i)
            .and_then(|x| x.value)
            .filter(|v| v.len() == 1)
    };
    let (start, limit, delta) = (scalar(0), scalar(1), scalar(2));
    if let (Some(s), Some(l), Some(d)) = (
        start.and_then(|v| v.as_f64s()),
        limit.and_then(|v| v.as_f64s()),
        delta.and_then(|v| v.as_f64s()),
    ) {
        let (s, l, d) = (s[0], l[0], d[0]);
        if d == 0.0 {
            return Err("delta is 0".into());
        }
        let n = ((l - s) / d).ceil().max(0.0) as u64;
        let value = (n <= crate::graph::MAX_TRACKED_ELEMENTS).then(|| {
            if dtype.is_float() {
                ConstValue::Floats((0..n).map(|i| s + i as f64 * d).collect())
            } else {
                ConstValue::Ints(
                    (0..n)
                        .map(|i| SymInt::Lit(s as i64 + i as i64 * d as i64))
                        .collect(),
                )
            }
        });
        return Ok(vec![
            Inferred::new(dtype, vec![Dim::Known(n)]).with_value(value)
        ]);
    }
    // range(0, seq, 1) with a symbolic limit is `seq` long: the usual position-id pattern.
    let zero = start.and_then(|v| v.as_i64s()).is_some_and(|v| v[0] == 0);
    let one = delta.and_then(|v| v.as_i64s()).is_some_and(|v| v[0] == 1);
    let len = match limit {
        Some(ConstValue::Ints(l)) if zero && one => l[0]
            .to_dim()
            .unwrap_or_else(|| ctx.data_dependent_dim(0, 0)),
        _ => ctx.data_dependent_dim(0, 0),
    };
    Ok(vec![Inferred::new(dtype, vec![len])])
}

fn constant(ctx: &OpCtx) -> RuleResult {
    let lit =
        |dtype, shape: Shape, value| Ok(vec![Inferred::new(dtype, shape).with_value(Some(value))]);
    let n = |len: usize| vec![Dim::Known(len as u64)];
    match ctx.node.attributes.iter().next() {
        Some((_, Attribute::Tensor(t))) => Ok(vec![Inferred::new(
            t.dtype,
            t.dims.iter().map(|&d| Dim::Known(d)).collect(),
        )
        .with_value(t.value.clone())]),
        Some((name, Attribute::Int(v))) if name == "value_int" => {
            lit(DType::I64, vec![], ConstValue::Ints(vec![SymInt::Lit(*v)]))
        }
        Some((name, Attribute::Ints(v))) if name == "value_ints" => lit(
            DType::I64,
            n(v.len()),
            ConstValue::Ints(v.iter().map(|&x| SymInt::Lit(x)).collect()),
        ),
        Some((name, Attribute::Float(v))) if name == "value_float" => {
            lit(DType::F32, vec![], ConstValue::Floats(vec![*v as f64]))
        }
        Some((name, Attribute::Floats(v))) if name == "value_floats" => lit(
            DType::F32,
            n(v.len()),
            ConstValue::Floats(v.iter().map(|&x| x as f64).collect()),
        ),
        Some((name, Attribute::String(_))) if name == "value_string" => {
            Ok(vec![Inferred::new(DType::String, vec![])])
        }
        Some((name, Attribute::Strings(v))) if name == "value_strings" => {
            Ok(vec![Inferred::new(DType::String, n(v.len()))])
        }
        Some((name, other)) => Err(format!(
            "unsupported Constant attribute '{name}': {other:?}"
        )),
        None => Err("Constant has no value attribute".into()),
    }
}

fn top_k(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, x.len())?;
    let k = match ctx.int_attr("k")? {
        Some(k) => Some(SymInt::Lit(k)),
        None => ctx.sym_ints(1).and_then(|v| v.first().cloned()),
    };
    let mut out = x.clone();
    out[axis] = k
        .and_then(|k| k.to_dim())
        .unwrap_or_else(|| ctx.data_dependent_dim(0, axis));
    Ok(vec![
        Inferred::new(ctx.dtype(0)?, out.clone()),
        Inferred::new(DType::I64, out),
    ])
}

fn arg_reduce(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", 0)?, x.len())?;
    let keep = ctx.int_attr_or("keepdims", 1)? != 0;
    let out: Shape = x
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            if i != axis {
                Some(d.clone())
            } else {
                keep.then_some(Dim::Known(1))
            }
        })
        .collect();
    Ok(vec![Inferred::new(DType::I64, out)])
}

fn one_hot(ctx: &OpCtx) -> RuleResult {
    let indices = ctx.shape(0)?;
    let depth = ctx
        .opt_input(1)
        .and_then(|i| i.value)
        .and_then(|v| v.as_f64s())
        .and_then(|v| v.first().copied());
    let rank = indices.len() + 1;
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, rank)?;
    let depth = match depth {
        Some(d) if d >= 0.0 => Dim::Known(d as u64),
        _ => ctx.data_dependent_dim(0, axis),
    };
    let mut out = indices.clone();
    out.insert(axis, depth);
    let value = one_hot_value(ctx, &out, axis);
    Ok(vec![Inferred::new(ctx.dtype(2)?, out).with_value(value)])
}

/// OneHot of known indices, depth and values (a small tensor), folded: the TorchScript exporter
/// computes `Tile` repeats as a OneHot of a size read from `Shape` (Mixtral's experts).
fn one_hot_value(ctx: &OpCtx, out: &[Dim], axis: usize) -> Option<ConstValue> {
    const MAX_FOLDED: u64 = 4096;
    let out = concrete(out)?;
    if out.iter().product::<u64>() > MAX_FOLDED {
        return None;
    }
    let indices = ctx.input(0).ok()?.value?.as_f64s()?;
    let depth = out[axis] as i64;
    let values = ctx.input(2).ok()?.value?;
    if values.len() != 2 {
        return None;
    }
    let inner: u64 = out[axis + 1..].iter().product();
    let is_on = |flat: u64| {
        let (outer, rest) = (flat / (depth as u64 * inner), flat % (depth as u64 * inner));
        let (class, within) = (rest / inner, rest % inner);
        let index = indices[(outer * inner + within) as usize] as i64;
        // Negative indices count from the end, as the spec allows.
        let index = if index < 0 { index + depth } else { index };
        index == class as i64
    };
    let count = out.iter().product::<u64>();
    match values {
        ConstValue::Ints(v) => Some(ConstValue::Ints(
            (0..count)
                .map(|flat| v[usize::from(is_on(flat))].clone())
                .collect(),
        )),
        ConstValue::Floats(v) => Some(ConstValue::Floats(
            (0..count).map(|flat| v[usize::from(is_on(flat))]).collect(),
        )),
        ConstValue::Strings(_) => None,
    }
}

fn eye_like(ctx: &OpCtx) -> RuleResult {
    let dtype = match ctx.int_attr("dtype")? {
        Some(code) => DType::from_onnx(code as i32).ok_or("unknown dtype")?,
        None => ctx.dtype(0)?,
    };
    Ok(vec![Inferred::new(dtype, ctx.shape(0)?.clone())])
}

/// RoiAlign: `[num_rois, C, output_height, output_width]`.
fn roi_align(ctx: &OpCtx) -> RuleResult {
    let (x, rois) = (ctx.shape(0)?, ctx.shape(1)?);
    let h = ctx.int_attr_or("output_height", 1)?.max(0) as u64;
    let w = ctx.int_attr_or("output_width", 1)?.max(0) as u64;
    let (n, c) = (
        rois.first().cloned().ok_or("rois must be 2-D")?,
        x.get(1).cloned().ok_or("input must be 4-D")?,
    );
    Ok(vec![Inferred::new(
        ctx.dtype(0)?,
        vec![n, c, Dim::Known(h), Dim::Known(w)],
    )])
}

/// GridSample: `[N, C] + grid[1:-1]`.
fn grid_sample(ctx: &OpCtx) -> RuleResult {
    let (x, grid) = (ctx.shape(0)?, ctx.shape(1)?);
    if x.len() < 3 || grid.len() != x.len() {
        return Err(format!(
            "input {} and grid {} do not match",
            format_shape(x),
            format_shape(grid)
        ));
    }
    let mut out = x[..2].to_vec();
    out.extend(grid[1..grid.len() - 1].iter().cloned());
    Ok(vec![Inferred::new(ctx.dtype(0)?, out)])
}
