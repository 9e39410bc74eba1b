//! The loss ops of ai.onnx:
//! [NegativeLogLikelihoodLoss](https://onnx.ai/onnx/operators/onnx__NegativeLogLikelihoodLoss.html)
//! and [SoftmaxCrossEntropyLoss](https://onnx.ai/onnx/operators/onnx__SoftmaxCrossEntropyLoss.html),
//! opsets 12 to 22 (later versions only add types).
//!
//! Scores `[N, C, d1, …]` and integer targets `[N, d1, …]`; the loss has the target's shape with
//! `reduction = "none"` and is a scalar otherwise (`mean`, the default, or `sum`).
//! SoftmaxCrossEntropyLoss's optional second output, the log-probabilities, has the scores' shape.

use super::context::{Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::format_shape;

pub(super) fn register(r: &mut Registry) {
    r.add(
        "",
        &["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"],
        loss,
    );
}

fn loss(ctx: &OpCtx) -> RuleResult {
    let scores = ctx.shape(0)?;
    let target = ctx.shape(1)?;
    if scores.len() < 2 || target.len() + 1 != scores.len() {
        return Err(format!(
            "scores {} should be [N, C, d1, …] and target {} [N, d1, …]",
            format_shape(scores),
            format_shape(target)
        ));
    }
    let dtype = ctx.dtype(0)?;
    let loss_shape = match ctx.string_attr("reduction")?.unwrap_or("mean") {
        "none" => target.clone(),
        "mean" | "sum" => Vec::new(),
        other => return Err(format!("reduction '{other}' is none of none, mean, sum")),
    };
    Ok(vec![
        Inferred::new(dtype, loss_shape),
        Inferred::new(dtype, scores.clone()),
    ])
}
