//! Reductions: `ReduceMean/Sum/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare`
//! (<https://onnx.ai/onnx/operators/onnx__ReduceMean.html>). Axes are an attribute before
//! opset 18 (13 for ReduceSum) and an input after; both forms are read.

use super::context::{normalize_axis, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{ConstValue, Dim, Shape, SymInt};

pub(super) fn register(r: &mut Registry) {
    r.add(
        "",
        &[
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceSumSquare",
        ],
        reduce,
    );
}

fn reduce(ctx: &OpCtx) -> RuleResult {
    let input = ctx.input(0)?;
    let x = input.shape;
    let keep = ctx.int_attr_or("keepdims", 1)? != 0;
    let noop_when_empty = ctx.int_attr_or("noop_with_empty_axes", 0)? != 0;
    let axes: Vec<usize> = match ctx.ints_from_attr_or_input("axes", 1)? {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&a| normalize_axis(a, x.len()))
            .collect::<Result<_, _>>()?,
        _ if noop_when_empty => {
            return Ok(vec![
                Inferred::new(input.dtype, x.clone()).with_value(input.value.cloned())
            ]);
        }
        _ => (0..x.len()).collect(),
    };
    let out: Shape = x
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            if axes.contains(&i) {
                keep.then_some(Dim::Known(1))
            } else {
                Some(d.clone())
            }
        })
        .collect();
    // ReduceProd over a whole 1-D shape vector computes an element count: fold it.
    let value = match (ctx.node.op_type.as_str(), input.value) {
        ("ReduceProd", Some(ConstValue::Ints(v))) if x.len() == 1 => v
            .iter()
            .try_fold(Dim::Known(1), |acc, e| acc.checked_mul(&e.to_dim()?))
            .map(|d| ConstValue::Ints(vec![SymInt::from(&d)])),
        ("ReduceSum", Some(ConstValue::Ints(v))) if x.len() == 1 => v
            .iter()
            .map(SymInt::lit)
            .sum::<Option<i64>>()
            .map(|s| ConstValue::Ints(vec![SymInt::Lit(s)])),
        (op, Some(value)) => fold(op, value, x, &axes),
        _ => None,
    };
    Ok(vec![Inferred::new(input.dtype, out).with_value(value)])
}

/// A reduction of a value known at plan time, over `axes` of `shape`, as TorchScript exports
/// compute Resize sizes and Pad pads from constants (Constant → ReduceMin → Floor → Cast →
/// Concat). Only the reductions shape arithmetic uses (Min, Max, Sum, Prod, Mean of floats);
/// `None` for others, symbolic elements or dims. The value holds at most
/// [`crate::graph::MAX_TRACKED_ELEMENTS`] elements, so this is a bounded loop.
fn fold(op: &str, value: &ConstValue, shape: &Shape, axes: &[usize]) -> Option<ConstValue> {
    if !matches!(
        op,
        "ReduceMin" | "ReduceMax" | "ReduceSum" | "ReduceMean" | "ReduceProd"
    ) {
        return None;
    }
    let dims: Vec<u64> = shape.iter().map(Dim::known).collect::<Option<_>>()?;
    // The output position of each input element: its index with the reduced axes dropped.
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let groups = kept.iter().map(|&a| dims[a] as usize).product::<usize>();
    let slot = |mut flat: usize| {
        let mut index = vec![0usize; dims.len()];
        for axis in (0..dims.len()).rev() {
            index[axis] = flat % dims[axis] as usize;
            flat /= dims[axis] as usize;
        }
        kept.iter()
            .fold(0usize, |at, &a| at * dims[a] as usize + index[a])
    };
    let combine = |a: f64, b: f64| match op {
        "ReduceMin" => a.min(b),
        "ReduceMax" => a.max(b),
        "ReduceProd" => a * b,
        _ => a + b,
    };
    let elements = value.as_f64s()?;
    if elements.is_empty() {
        return None;
    }
    let mut out: Vec<Option<f64>> = vec![None; groups];
    for (flat, &x) in elements.iter().enumerate() {
        let at = &mut out[slot(flat)];
        *at = Some(match *at {
            Some(acc) => combine(acc, x),
            None => x,
        });
    }
    let count = (elements.len() / groups.max(1)) as f64;
    let out: Vec<f64> = out
        .into_iter()
        .map(|v| v.map(|v| if op == "ReduceMean" { v / count } else { v }))
        .collect::<Option<_>>()?;
    match value {
        ConstValue::Floats(_) => Some(ConstValue::Floats(out)),
        // Integers stay exact below 2^53, far above any size; a mean of integers is left alone.
        ConstValue::Ints(_) if op != "ReduceMean" => Some(ConstValue::Ints(
            out.into_iter().map(|v| SymInt::Lit(v as i64)).collect(),
        )),
        _ => None,
    }
}
