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
        _ => None,
    };
    Ok(vec![Inferred::new(input.dtype, out).with_value(value)])
}
