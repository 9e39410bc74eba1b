//! Index-tuple gathers and scatters: GatherND, ScatterND, ScatterElements and its deprecated
//! alias Scatter.
//!
//! Specs: <https://onnx.ai/onnx/operators/onnx__GatherND.html> (opsets 11–13, `batch_dims` from
//! 12), <https://onnx.ai/onnx/operators/onnx__ScatterND.html> (opsets 11–18, `reduction` from 16,
//! `max`/`min` from 18), <https://onnx.ai/onnx/operators/onnx__ScatterElements.html> (opsets
//! 11–18, same reductions) and `Scatter` (opsets 9–10, ScatterElements without reduction).
//! torch's dynamo exporter emits GatherND for attention masks, so every exported Hugging Face
//! text model needs it. Indices may be negative (counted from the end); an index out of range
//! is an error naming it, never a wrap-around. Duplicate indices with `reduction = none` keep the
//! last update, as onnxruntime's CPU kernel does.

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::{checked_size, normalize_axis, take};
use crate::tensor::{strides_of, HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["GatherND"], gather_nd);
    t.add(&["ScatterND"], scatter_nd);
    t.add(&["ScatterElements", "Scatter"], scatter_elements);
}

/// Resolves a possibly negative index against an axis of `size`.
fn resolve_index(index: i64, size: usize, what: &str) -> Result<usize, String> {
    let n = size as i64;
    let j = if index < 0 { index + n } else { index };
    if (0..n).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!(
            "{what} index {index} is out of range for size {size}"
        ))
    }
}

/// GatherND: `indices[..., :k]` picks a slice of `data[batch..]` for each index tuple.
fn gather_nd(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (data, indices) = (input(inputs, 0)?, input(inputs, 1)?);
    let rows = gather_nd_rows(ctx, data.shape(), indices)?;
    let mut offsets = Vec::with_capacity(rows.starts.len() * rows.len);
    for &start in &rows.starts {
        offsets.extend(start..start + rows.len);
    }
    Ok(vec![HostTensor::with_data(
        rows.shape,
        take(data.data(), &offsets)?,
    )])
}

/// Where a gather reads or a scatter writes: rows of `len` contiguous elements of the data,
/// starting at `starts`, and (for a gather) the output's shape.
pub(crate) struct IndexRows {
    pub(crate) shape: Vec<usize>,
    pub(crate) starts: Vec<usize>,
    pub(crate) len: usize,
}

/// GatherND's rows of data (of `ds`), one per index tuple, checked; the CUDA backend gathers
/// the same rows.
pub(crate) fn gather_nd_rows(
    ctx: &Ctx,
    ds: &[usize],
    indices: &HostTensor,
) -> Result<IndexRows, String> {
    let batch_dims = usize::try_from(ctx.int("batch_dims", 0))
        .map_err(|_| "batch_dims must not be negative".to_string())?;
    let is = indices.shape();
    let Some((&tuple_len, index_outer)) = is.split_last() else {
        return Err("indices must have rank ≥ 1".into());
    };
    if batch_dims >= is.len() || batch_dims + tuple_len > ds.len() {
        return Err(format!(
            "indices {is:?} with batch_dims {batch_dims} do not fit data {ds:?}"
        ));
    }
    if ds[..batch_dims] != is[..batch_dims] {
        return Err(format!(
            "the first {batch_dims} dims of data {ds:?} and indices {is:?} differ"
        ));
    }
    let batches: usize = ds[..batch_dims].iter().product();
    let tuples_per_batch: usize = index_outer[batch_dims..].iter().product();
    let len: usize = ds[batch_dims + tuple_len..].iter().product();
    let batch_stride: usize = ds[batch_dims..].iter().product();
    let strides = strides_of(ds);
    let mut shape = index_outer.to_vec();
    shape.extend_from_slice(&ds[batch_dims + tuple_len..]);
    if checked_size(&shape)? == 0 {
        // Nothing to gather: no row starts either, however many empty tuples the indices'
        // other dims make (`[2^40, 0]` would ask for 8 TB of them).
        return Ok(IndexRows {
            shape,
            starts: Vec::new(),
            len,
        });
    }
    let flat_indices = indices.to_i64_vec();
    let mut starts = Vec::with_capacity(batches * tuples_per_batch);
    for batch in 0..batches {
        for t in 0..tuples_per_batch {
            let tuple_start = (batch * tuples_per_batch + t) * tuple_len;
            let mut base = batch * batch_stride;
            for (j, &index) in flat_indices[tuple_start..tuple_start + tuple_len]
                .iter()
                .enumerate()
            {
                let axis = batch_dims + j;
                base += resolve_index(index, ds[axis], "GatherND")? * strides[axis];
            }
            starts.push(base);
        }
    }
    Ok(IndexRows { shape, starts, len })
}

/// How a scatter combines an update with the element already there.
#[derive(Clone, Copy)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(ctx: &Ctx) -> Result<Reduction, String> {
    match ctx.string("reduction", "none").as_str() {
        "none" => Ok(Reduction::None),
        "add" => Ok(Reduction::Add),
        "mul" => Ok(Reduction::Mul),
        "max" => Ok(Reduction::Max),
        "min" => Ok(Reduction::Min),
        other => Err(format!("unknown reduction '{other}'")),
    }
}

fn combine<T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    old: T,
    new: T,
    reduction: Reduction,
) -> T {
    match reduction {
        Reduction::None => new,
        Reduction::Add => old + new,
        Reduction::Mul => old * new,
        Reduction::Max => {
            if new > old {
                new
            } else {
                old
            }
        }
        Reduction::Min => {
            if new < old {
                new
            } else {
                old
            }
        }
    }
}

/// Writes `updates[src]` into `data[dst]` for each `(dst, src)` pair, in order.
fn apply_updates(
    data: &mut TensorData,
    updates: &TensorData,
    pairs: &[(usize, usize)],
    reduction: Reduction,
) -> Result<(), String> {
    match (data, updates) {
        (TensorData::F32(d), TensorData::F32(u)) => {
            pairs
                .iter()
                .for_each(|&(i, j)| d[i] = combine(d[i], u[j], reduction));
        }
        (TensorData::I64(d), TensorData::I64(u)) => {
            pairs.iter().for_each(|&(i, j)| {
                d[i] = match reduction {
                    Reduction::Add => d[i].wrapping_add(u[j]),
                    Reduction::Mul => d[i].wrapping_mul(u[j]),
                    other => combine(d[i], u[j], other),
                }
            });
        }
        (TensorData::I32(d), TensorData::I32(u)) => {
            pairs.iter().for_each(|&(i, j)| {
                d[i] = match reduction {
                    Reduction::Add => d[i].wrapping_add(u[j]),
                    Reduction::Mul => d[i].wrapping_mul(u[j]),
                    other => combine(d[i], u[j], other),
                }
            });
        }
        (TensorData::Bool(d), TensorData::Bool(u)) => {
            for &(i, j) in pairs {
                d[i] = match reduction {
                    Reduction::None => u[j],
                    Reduction::Add | Reduction::Max => d[i] || u[j],
                    Reduction::Mul | Reduction::Min => d[i] && u[j],
                };
            }
        }
        (d, u) => {
            return Err(format!(
                "updates are {} but data is {}",
                u.dtype(),
                d.dtype()
            ))
        }
    }
    Ok(())
}

/// ScatterND: a copy of `data` with the slices named by `indices[..., :k]` replaced (or
/// reduced) by `updates`.
fn scatter_nd(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (data, indices, updates) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let reduction = reduction(ctx)?;
    let rows = scatter_nd_rows(data.shape(), indices, updates.shape())?;
    let mut pairs = Vec::with_capacity(rows.starts.len() * rows.len);
    for (t, &base) in rows.starts.iter().enumerate() {
        pairs.extend((0..rows.len).map(|k| (base + k, t * rows.len + k)));
    }
    let (shape, mut out) = data.clone().into_parts();
    apply_updates(&mut out, updates.data(), &pairs, reduction)?;
    Ok(vec![HostTensor::with_data(shape, out)])
}

/// ScatterND's rows of data (of `ds`), one per index tuple in the order of the updates (of
/// shape `us`), checked; the CUDA backend writes the same rows.
pub(crate) fn scatter_nd_rows(
    ds: &[usize],
    indices: &HostTensor,
    us: &[usize],
) -> Result<IndexRows, String> {
    let is = indices.shape();
    let Some((&tuple_len, index_outer)) = is.split_last() else {
        return Err("indices must have rank ≥ 1".into());
    };
    if tuple_len > ds.len() {
        return Err(format!(
            "index tuples of {tuple_len} exceed data rank {}",
            ds.len()
        ));
    }
    let mut updates_shape = index_outer.to_vec();
    updates_shape.extend_from_slice(&ds[tuple_len..]);
    if us != updates_shape.as_slice() {
        return Err(format!(
            "updates are {us:?} but data {ds:?} and indices {is:?} need {updates_shape:?}"
        ));
    }
    let strides = strides_of(ds);
    let len: usize = ds[tuple_len..].iter().product();
    let tuples: usize = index_outer.iter().product();
    let flat_indices = indices.to_i64_vec();
    let mut starts = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let mut base = 0;
        for (axis, &index) in flat_indices[t * tuple_len..(t + 1) * tuple_len]
            .iter()
            .enumerate()
        {
            base += resolve_index(index, ds[axis], "ScatterND")? * strides[axis];
        }
        starts.push(base);
    }
    Ok(IndexRows {
        shape: ds.to_vec(),
        starts,
        len,
    })
}

/// ScatterElements (and Scatter): `out[i with i[axis] = indices[i]] = updates[i]`.
fn scatter_elements(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (data, indices, updates) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let reduction = reduction(ctx)?;
    let offsets = scatter_elements_offsets(ctx, data.shape(), indices, updates.shape())?;
    let pairs: Vec<(usize, usize)> = offsets
        .into_iter()
        .enumerate()
        .map(|(u, o)| (o, u))
        .collect();
    let (shape, mut out) = data.clone().into_parts();
    apply_updates(&mut out, updates.data(), &pairs, reduction)?;
    Ok(vec![HostTensor::with_data(shape, out)])
}

/// ScatterElements' target offset in the data (of `ds`) of every update (of shape `us`), in
/// the updates' order, checked; the CUDA backend writes the same offsets.
pub(crate) fn scatter_elements_offsets(
    ctx: &Ctx,
    ds: &[usize],
    indices: &HostTensor,
    us: &[usize],
) -> Result<Vec<usize>, String> {
    let axis = normalize_axis(ctx.int("axis", 0), ds.len())?;
    let is = indices.shape();
    if is != us || is.len() != ds.len() {
        return Err(format!(
            "indices {is:?} and updates {us:?} must have one shape of data's rank ({})",
            ds.len()
        ));
    }
    if is.iter().zip(ds).any(|(i, d)| i > d) {
        return Err(format!("indices {is:?} exceed data {ds:?}"));
    }
    let data_strides = strides_of(ds);
    let index_strides = strides_of(is);
    indices
        .to_i64_vec()
        .iter()
        .enumerate()
        .map(|(flat, &index)| {
            let mut offset = 0;
            for d in 0..ds.len() {
                let coord = if d == axis {
                    resolve_index(index, ds[axis], "ScatterElements")?
                } else {
                    (flat / index_strides[d]) % is[d]
                };
                offset += coord * data_strides[d];
            }
            Ok(offset)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::node;
    use super::super::test_util::{assert_close, f, i, run};
    use super::super::{lookup, Ctx};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn gather_nd_with_batch_dims_and_negative_indices() {
        let x = f(&[2, 2], &[0.0, 1.0, 2.0, 3.0]);
        let out = run("GatherND", vec![], &[&x, &i(&[2, 2], &[0, 0, -1, 1])]);
        assert_close(&out[0], &[2], &[0.0, 3.0]);
        let rows = run("GatherND", vec![], &[&x, &i(&[2, 1], &[1, 0])]);
        assert_close(&rows[0], &[2, 2], &[2.0, 3.0, 0.0, 1.0]);
        let batched = run(
            "GatherND",
            vec![("batch_dims", Attribute::Int(1))],
            &[&x, &i(&[2, 1], &[1, 0])],
        );
        assert_close(&batched[0], &[2], &[1.0, 2.0]);
    }

    #[test]
    fn scatters_reduce_and_refuse_out_of_range_indices() {
        let x = f(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let out = run(
            "ScatterND",
            vec![("reduction", Attribute::String("mul".into()))],
            &[&x, &i(&[2, 1], &[1, 1]), &f(&[2], &[3.0, 5.0])],
        );
        assert_close(&out[0], &[4], &[1.0, 30.0, 3.0, 4.0]);
        let out = run(
            "ScatterElements",
            vec![("reduction", Attribute::String("max".into()))],
            &[&x, &i(&[2], &[-1, 0]), &f(&[2], &[9.0, 0.0])],
        );
        assert_close(&out[0], &[4], &[1.0, 2.0, 3.0, 9.0]);
        let n = node("ScatterElements", vec![]);
        let ctx = Ctx {
            node: &n,
            opset: 18,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let (idx, upd) = (i(&[1], &[4]), f(&[1], &[0.0]));
        let err = lookup("", "ScatterElements").unwrap()(&ctx, &[Some(&x), Some(&idx), Some(&upd)])
            .unwrap_err();
        assert!(err.contains("index 4 is out of range"), "{err}");
    }
}
