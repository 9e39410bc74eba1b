//! The ops whose output size depends on the input's values: [NonZero](https://onnx.ai/onnx/operators/onnx__NonZero.html)
//! (opsets 9–13), [Compress](https://onnx.ai/onnx/operators/onnx__Compress.html) (9–11) and
//! [Unique](https://onnx.ai/onnx/operators/onnx__Unique.html) (11). Shape inference gives
//! their sizes as symbols unless it saw the values; the kernels find them here. Semantics are
//! the ONNX reference's, which are numpy's (`np.nonzero`, `np.compress`, `np.unique`).

use std::cmp::Ordering;

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::{normalize_axis, take};
use crate::tensor::{HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["NonZero"], non_zero);
    t.add(&["Compress"], compress);
    t.add(&["Unique"], unique);
}

/// Whether each element is non-zero (NaN counts as non-zero, as in numpy).
fn truthy(t: &HostTensor) -> Vec<bool> {
    match t.data() {
        TensorData::F32(v) => v.iter().map(|&x| x != 0.0).collect(),
        TensorData::I64(v) => v.iter().map(|&x| x != 0).collect(),
        TensorData::I32(v) => v.iter().map(|&x| x != 0).collect(),
        TensorData::Bool(v) => v.clone(),
        // ONNX's NonZero and Compress take numbers and booleans; an empty string is "zero".
        TensorData::String(v) => v.iter().map(|s| !s.is_empty()).collect(),
        TensorData::U8(v) => v.iter().map(|&x| x != 0).collect(),
        TensorData::I8(v) => v.iter().map(|&x| x != 0).collect(),
    }
}

/// NonZero: `[rank, count]` int64, the coordinates of the non-zero elements in row-major order.
fn non_zero(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let shape = x.shape();
    let strides = crate::tensor::strides_of(shape);
    let flat: Vec<usize> = truthy(x)
        .iter()
        .enumerate()
        .filter_map(|(i, &t)| t.then_some(i))
        .collect();
    let mut coords = vec![0i64; shape.len() * flat.len()];
    for (axis, (&stride, &dim)) in strides.iter().zip(shape).enumerate() {
        for (k, &i) in flat.iter().enumerate() {
            coords[axis * flat.len() + k] = ((i / stride) % dim) as i64;
        }
    }
    Ok(vec![HostTensor::i64(vec![shape.len(), flat.len()], coords)])
}

/// The offsets of slice `k` of `shape` along `axis` (every element whose `axis` index is `k`).
fn slice_offsets(shape: &[usize], axis: usize, k: usize) -> impl Iterator<Item = usize> + '_ {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    (0..outer).flat_map(move |o| (0..inner).map(move |i| (o * n + k) * inner + i))
}

/// Gathers the slices `picked` along `axis`, in that order.
fn gather_slices(x: &HostTensor, axis: usize, picked: &[usize]) -> Result<HostTensor, String> {
    let shape = x.shape();
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut offsets = Vec::with_capacity(outer * picked.len() * inner);
    for o in 0..outer {
        for &k in picked {
            offsets.extend((0..inner).map(|i| (o * shape[axis] + k) * inner + i));
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = picked.len();
    HostTensor::new(out_shape, take(x.data(), &offsets)?)
}

/// Compress: the slices along `axis` (the elements of the flattened input without it) whose
/// condition is true. A condition shorter than the axis drops the slices past its end.
fn compress(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let condition = truthy(input(inputs, 1)?);
    let (x, axis) = match ctx.attr("axis") {
        Some(_) => (x.clone(), normalize_axis(ctx.int("axis", 0), x.rank())?),
        None => (x.clone().reshaped(vec![x.len()])?, 0),
    };
    let n = x.shape()[axis];
    if let Some(k) = condition.iter().skip(n).position(|&c| c) {
        return Err(format!(
            "the condition selects slice {} but the axis has {n}",
            n + k
        ));
    }
    let picked: Vec<usize> = (0..n.min(condition.len()))
        .filter(|&k| condition[k])
        .collect();
    Ok(vec![gather_slices(&x, axis, &picked)?])
}

/// Compares two elements of one buffer, numpy's order for `np.unique` (NaN last, equal to NaN).
fn compare_elements(data: &TensorData, a: usize, b: usize) -> Ordering {
    match data {
        TensorData::F32(v) => v[a]
            .partial_cmp(&v[b])
            .unwrap_or_else(|| v[a].is_nan().cmp(&v[b].is_nan())),
        TensorData::I64(v) => v[a].cmp(&v[b]),
        TensorData::I32(v) => v[a].cmp(&v[b]),
        TensorData::Bool(v) => v[a].cmp(&v[b]),
        TensorData::String(v) => v[a].cmp(&v[b]),
        TensorData::U8(v) => v[a].cmp(&v[b]),
        TensorData::I8(v) => v[a].cmp(&v[b]),
    }
}

/// Unique: the distinct slices along `axis` (elements of the flattened input without it),
/// sorted (the default) or in order of first occurrence, with the index of each one's first
/// occurrence, each input slice's index in the output, and the counts.
fn unique(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let (x, axis) = match ctx.attr("axis") {
        Some(_) => (x.clone(), normalize_axis(ctx.int("axis", 0), x.rank())?),
        None => (x.clone().reshaped(vec![x.len()])?, 0),
    };
    let shape = x.shape().to_vec();
    let slices: Vec<Vec<usize>> = (0..shape[axis])
        .map(|k| slice_offsets(&shape, axis, k).collect())
        .collect();
    let compare = |a: usize, b: usize| -> Ordering {
        slices[a]
            .iter()
            .zip(&slices[b])
            .map(|(&i, &j)| compare_elements(x.data(), i, j))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    };
    // A stable sort keeps equal slices in input order, so each group starts at its first
    // occurrence.
    let mut order: Vec<usize> = (0..slices.len()).collect();
    order.sort_by(|&a, &b| compare(a, b));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &k in &order {
        match groups.last_mut() {
            Some(group) if compare(group[0], k).is_eq() => group.push(k),
            _ => groups.push(vec![k]),
        }
    }
    if ctx.int("sorted", 1) == 0 {
        groups.sort_by_key(|group| group[0]);
    }
    let first: Vec<usize> = groups.iter().map(|group| group[0]).collect();
    let mut inverse = vec![0i64; slices.len()];
    for (g, group) in groups.iter().enumerate() {
        for &k in group {
            inverse[k] = g as i64;
        }
    }
    let counts: Vec<i64> = groups.iter().map(|group| group.len() as i64).collect();
    let first_i64: Vec<i64> = first.iter().map(|&k| k as i64).collect();
    Ok(vec![
        gather_slices(&x, axis, &first)?,
        HostTensor::i64(vec![first.len()], first_i64),
        HostTensor::i64(vec![inverse.len()], inverse),
        HostTensor::i64(vec![counts.len()], counts),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{f, i, run};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn non_zero_lists_coordinates_row_major() {
        let out = run("NonZero", vec![], &[&i(&[2, 2], &[1, 0, 1, 1])]);
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(out[0].to_i64_vec(), vec![0, 1, 1, 0, 0, 1]);
    }

    #[test]
    fn compress_drops_slices_past_a_short_condition() {
        let x = f(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = run(
            "Compress",
            vec![("axis", Attribute::Int(0))],
            &[&x, &i(&[2], &[0, 1])],
        );
        assert_eq!(out[0].shape(), &[1, 2]);
        assert_eq!(out[0].to_f32_vec(), vec![3.0, 4.0]);
    }

    #[test]
    fn unique_in_first_occurrence_order_maps_every_element() {
        let x = f(&[6], &[2.0, 1.0, 1.0, 3.0, 4.0, 3.0]);
        let out = run("Unique", vec![("sorted", Attribute::Int(0))], &[&x]);
        assert_eq!(out[0].to_f32_vec(), vec![2.0, 1.0, 3.0, 4.0]);
        assert_eq!(out[1].to_i64_vec(), vec![0, 1, 3, 4]);
        assert_eq!(out[2].to_i64_vec(), vec![0, 1, 1, 2, 3, 2]);
        assert_eq!(out[3].to_i64_vec(), vec![1, 2, 2, 1]);
    }

    #[test]
    fn unique_along_an_axis_sorts_rows_lexicographically() {
        let x = f(&[3, 2], &[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
        let out = run("Unique", vec![("axis", Attribute::Int(0))], &[&x]);
        assert_eq!(out[0].shape(), &[2, 2]);
        assert_eq!(out[0].to_f32_vec(), vec![0.0, 1.0, 1.0, 1.0]);
        assert_eq!(out[2].to_i64_vec(), vec![1, 0, 1]);
    }
}
