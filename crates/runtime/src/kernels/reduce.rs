//! Reductions over axes, and arg-reductions.
//!
//! Specs: <https://onnx.ai/onnx/operators/> (ReduceMean, ReduceSum, ReduceMax, ReduceMin,
//! ReduceProd, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin), opsets 7 to
//! 23: axes come from the `axes` input where the opset has one (ReduceSum from 13, the others
//! from 18) and from the attribute before; `noop_with_empty_axes` is honoured. Sums accumulate in
//! f64.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::fast_math;
use super::indexing::{broadcast_offsets, normalize_axis};
use crate::tensor::{HostTensor, TensorData};

pub(super) fn register(t: &mut KernelTable) {
    t.add(
        &[
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceSumSquare",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSumExp",
            "ReduceLogSum",
        ],
        reduce,
    );
    t.add(&["ArgMax", "ArgMin"], arg_reduce);
}

fn reduce(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    if x.dtype() == pipecut_ir::graph::DType::Bool {
        // ReduceMax / ReduceMin of booleans (opset 20): any / all, through 0 and 1.
        let as_numbers = x.cast(pipecut_ir::graph::DType::F32)?;
        let mut numeric = inputs.to_vec();
        numeric[0] = Some(&as_numbers);
        let reduced = reduce(ctx, &numeric)?;
        // `> 0`: the max of an empty set (−∞) is false (any), the min (+∞) true (all).
        return Ok(reduced
            .into_iter()
            .map(|t| {
                let truth = t.to_f32_vec().iter().map(|&v| v > 0.0).collect();
                HostTensor::with_data(t.shape().to_vec(), TensorData::Bool(truth))
            })
            .collect());
    }
    let rank = x.rank();
    let axes: Vec<i64> = match optional(inputs, 1) {
        Some(a) => a.to_i64_vec(),
        None => ctx.ints("axes").unwrap_or_default(),
    };
    let keep = ctx.int("keepdims", 1) != 0;
    if axes.is_empty() && ctx.int("noop_with_empty_axes", 0) != 0 {
        return Ok(vec![x.clone()]);
    }
    let mut reduced = vec![axes.is_empty(); rank];
    for &a in &axes {
        reduced[normalize_axis(a, rank)?] = true;
    }
    let keep_shape: Vec<usize> = x
        .shape()
        .iter()
        .zip(&reduced)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let out_len: usize = keep_shape.iter().product();
    let group = x.len().checked_div(out_len).unwrap_or(0);
    let op = ctx.node.op_type.as_str();
    let out_shape: Vec<usize> = if keep {
        keep_shape.clone()
    } else {
        x.shape()
            .iter()
            .zip(&reduced)
            .filter(|(_, r)| !**r)
            .map(|(&d, _)| d)
            .collect()
    };
    if let TensorData::I64(v) = x.data() {
        let acc = reduce_i64(op, v, x.shape(), &keep_shape)?;
        return Ok(vec![HostTensor::i64(out_shape, acc)]);
    }
    let acc = accumulate(op, x.as_f32()?, x.shape(), &reduced, &keep_shape)?;
    let out: Vec<f32> = acc
        .into_iter()
        .map(|a| match op {
            "ReduceMean" => (a / group as f64) as f32,
            "ReduceL2" => a.sqrt() as f32,
            "ReduceLogSumExp" | "ReduceLogSum" => a.ln() as f32,
            _ => a as f32,
        })
        .collect();
    Ok(vec![HostTensor::f32(out_shape, out)])
}

/// An int64 reduction (shape arithmetic), exact: each output of `keep_shape` (the input's
/// shape with the reduced axes 1) over its inputs.
fn reduce_i64(
    op: &str,
    v: &[i64],
    shape: &[usize],
    keep_shape: &[usize],
) -> Result<Vec<i64>, String> {
    let targets = broadcast_offsets(keep_shape, shape)?;
    let (init, f): (i64, fn(i64, i64) -> i64) = match op {
        "ReduceSum" => (0, |a, b| a + b),
        "ReduceMax" => (i64::MIN, i64::max),
        "ReduceMin" => (i64::MAX, i64::min),
        "ReduceProd" => (1, |a, b| a * b),
        _ => return Err(format!("{op} over int64 is not supported")),
    };
    let out_len: usize = keep_shape.iter().product();
    let mut acc = vec![init; out_len];
    for (&t, &v) in targets.iter().zip(v) {
        acc[t] = f(acc[t], v);
    }
    Ok(acc)
}

/// A float reduction's accumulators in f64, one per output of `keep_shape`, before the op's
/// final step (the mean's division, L2's root, the logarithms): sums over one block of axes
/// and over trailing axes take their fast paths, any other set of axes an offset per element.
fn accumulate(
    op: &str,
    xv: &[f32],
    shape: &[usize],
    reduced: &[bool],
    keep_shape: &[usize],
) -> Result<Vec<f64>, String> {
    let (init, step): (f64, fn(f64, f64) -> f64) = match op {
        "ReduceMean" | "ReduceSum" | "ReduceLogSum" => (0.0, |a, v| a + v),
        "ReduceMax" => (f64::NEG_INFINITY, f64::max),
        "ReduceMin" => (f64::INFINITY, f64::min),
        "ReduceProd" => (1.0, |a, v| a * v),
        "ReduceSumSquare" | "ReduceL2" => (0.0, |a, v| a + v * v),
        "ReduceL1" => (0.0, |a, v| a + v.abs()),
        _ => (0.0, |a, v| a + v.exp()), // ReduceLogSumExp (inputs of exported models are small)
    };
    let out_len: usize = keep_shape.iter().product();
    let group = xv.len().checked_div(out_len).unwrap_or(0);
    let mut acc = vec![init; out_len];
    let trailing = reduced.iter().rev().take_while(|r| **r).count();
    let first = reduced.iter().position(|r| *r).unwrap_or(reduced.len());
    let count = reduced.iter().filter(|r| **r).count();
    let one_block = count > 0 && reduced[first..first + count].iter().all(|r| *r);
    if matches!(op, "ReduceSum" | "ReduceMean") && one_block {
        // Sums over one block of adjacent axes, the common case, as vectorised row sums or
        // row additions (not a function call and an offset lookup per element).
        sum_block(xv, &mut acc, &shape[first + count..], group);
    } else if trailing == count && trailing > 0 {
        // Only trailing axes are reduced: each output is a contiguous run.
        for (a, row) in acc.iter_mut().zip(xv.chunks(group.max(1))) {
            *a = row.iter().fold(init, |s, &v| step(s, v as f64));
        }
    } else {
        let targets = broadcast_offsets(keep_shape, shape)?;
        for (&t, &v) in targets.iter().zip(xv) {
            acc[t] = step(acc[t], v as f64);
        }
    }
    Ok(acc)
}

/// Adds each `[outer, reduced, inner]` block of `x` over its middle dim into `acc`
/// (`[outer, inner]`, zeroed), in f64; `inner_shape` holds the dims after the reduced ones.
fn sum_block(x: &[f32], acc: &mut [f64], inner_shape: &[usize], group: usize) {
    let inner: usize = inner_shape.iter().product();
    if inner == 1 {
        for (a, row) in acc.iter_mut().zip(x.chunks(group.max(1))) {
            *a = fast_math::sum_f64(row, f64::from);
        }
        return;
    }
    for (acc_row, block) in acc.chunks_mut(inner).zip(x.chunks((group * inner).max(1))) {
        for row in block.chunks(inner) {
            for (a, &v) in acc_row.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
    }
}

fn arg_reduce(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let axis = normalize_axis(ctx.int("axis", 0), x.rank())?;
    let keep = ctx.int("keepdims", 1) != 0;
    let last = ctx.int("select_last_index", 0) != 0;
    let max = ctx.node.op_type == "ArgMax";
    let n = x.shape()[axis];
    if n == 0 {
        // No index to give, however many fibres the other dims make (`[0, 2^40]` would ask
        // for 8 TB of answers).
        return Err(format!(
            "{} over axis {axis}, which has length 0, has no index to give",
            ctx.node.op_type
        ));
    }
    let v = x.to_f32_vec();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let outer: usize = x.shape()[..axis].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0usize;
            for k in 1..n {
                let (cand, cur) = (v[(o * n + k) * inner + i], v[(o * n + best) * inner + i]);
                let better = if max { cand > cur } else { cand < cur };
                if better || (last && cand == cur) {
                    best = k;
                }
            }
            out.push(best as i64);
        }
    }
    let mut shape = x.shape().to_vec();
    if keep {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(vec![HostTensor::i64(shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, run, run_opset};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn max_and_min_of_booleans_are_any_and_all() {
        use crate::tensor::{HostTensor, TensorData};
        let x = HostTensor::with_data(
            vec![2, 2],
            TensorData::Bool(vec![true, false, false, false]),
        );
        let keep = || vec![("keepdims", pipecut_ir::graph::Attribute::Int(0))];
        let max = super::super::test_util::run("ReduceMax", keep(), &[&x]);
        assert_eq!(max[0].data(), &TensorData::Bool(vec![true]));
        let min = super::super::test_util::run("ReduceMin", keep(), &[&x]);
        assert_eq!(min[0].data(), &TensorData::Bool(vec![false]));
    }

    #[test]
    fn reduce_over_attribute_and_input_axes() {
        let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = run_opset(
            "ReduceMean",
            13,
            vec![("axes", Attribute::Ints(vec![-1]))],
            &[&x],
        );
        assert_close(&out[0], &[2, 1], &[2.0, 5.0]);
        let out = run(
            "ReduceSum",
            vec![("keepdims", Attribute::Int(0))],
            &[&x, &i(&[1], &[0])],
        );
        assert_close(&out[0], &[3], &[5.0, 7.0, 9.0]);
        let out = run("ReduceMax", vec![], &[&x]);
        assert_close(&out[0], &[1, 1], &[6.0]);
        let out = run(
            "ReduceL2",
            vec![("axes", Attribute::Ints(vec![0]))],
            &[&f(&[2], &[3.0, 4.0])],
        );
        assert_close(&out[0], &[1], &[5.0]);
        let out = run(
            "ReduceLogSum",
            vec![("keepdims", Attribute::Int(0))],
            &[&f(&[2], &[1.0, 2.0])],
        );
        assert_close(&out[0], &[], &[(3.0f32).ln()]);
    }

    #[test]
    fn argmax_picks_first_or_last() {
        let x = f(&[2, 2], &[1.0, 1.0, 0.0, 2.0]);
        let out = run("ArgMax", vec![("axis", Attribute::Int(1))], &[&x]);
        assert_eq!(out[0].to_i64_vec(), vec![0, 1]);
        let out = run(
            "ArgMax",
            vec![
                ("axis", Attribute::Int(1)),
                ("select_last_index", Attribute::Int(1)),
            ],
            &[&x],
        );
        assert_eq!(out[0].to_i64_vec(), vec![1, 1]);
    }
}
