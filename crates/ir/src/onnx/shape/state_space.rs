//! The stateful sequence mixers of linear-attention and state-space models (Gated DeltaNet,
//! Mamba), opset 27: LinearAttention
//! (<https://onnx.ai/onnx/operators/onnx__LinearAttention.html>) and CausalConvWithState
//! (<https://onnx.ai/onnx/operators/onnx__CausalConvWithState.html>). Each gives its output and
//! the state a decode step carries to the next.

use super::context::{Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{Dim, Shape};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["LinearAttention"], linear_attention);
    r.add("", &["CausalConvWithState"], causal_conv_with_state);
}

/// A dim that must be known to split heads or size a state.
fn known(dim: &Dim, what: &str) -> Result<u64, String> {
    match dim {
        Dim::Known(n) => Ok(*n),
        Dim::Sym(s) => Err(format!("{what} is {s}, which must be known at plan time")),
    }
}

/// A rank-3 shape, or an error naming the input.
fn rank3<'s>(shape: &'s Shape, name: &str) -> Result<&'s Shape, String> {
    if shape.len() == 3 {
        Ok(shape)
    } else {
        Err(format!("{name} must be rank 3, not rank {}", shape.len()))
    }
}

/// The width of one head: `total` split over `heads`, evenly.
fn head_size(total: &Dim, heads: i64, name: &str) -> Result<u64, String> {
    let total = known(total, &format!("the last dim of {name}"))?;
    if heads <= 0 || total % heads as u64 != 0 {
        return Err(format!(
            "{name}'s last dim {total} does not split into {heads} heads"
        ));
    }
    Ok(total / heads as u64)
}

/// output `(B, T, q_num_heads · d_v)`, present_state `(B, kv_num_heads, d_k, d_v)` with
/// `d_k = query width / q_num_heads` and `d_v = value width / kv_num_heads`.
fn linear_attention(ctx: &OpCtx) -> RuleResult {
    let query = rank3(ctx.shape(0)?, "query")?;
    let value = rank3(ctx.shape(2)?, "value")?;
    let q_heads = ctx
        .int_attr("q_num_heads")?
        .ok_or("q_num_heads is required")?;
    let kv_heads = ctx
        .int_attr("kv_num_heads")?
        .ok_or("kv_num_heads is required")?;
    if kv_heads <= 0 || q_heads % kv_heads != 0 {
        return Err(format!(
            "q_num_heads {q_heads} is not a positive multiple of kv_num_heads {kv_heads}"
        ));
    }
    let d_k = head_size(&query[2], q_heads, "query")?;
    let d_v = head_size(&value[2], kv_heads, "value")?;
    let dtype = ctx.dtype(0)?;
    let output = vec![
        query[0].clone(),
        query[1].clone(),
        Dim::Known(q_heads as u64 * d_v),
    ];
    let state = vec![
        query[0].clone(),
        Dim::Known(kv_heads as u64),
        Dim::Known(d_k),
        Dim::Known(d_v),
    ];
    let state_dtype = ctx.opt_input(3).map_or(dtype, |past| past.dtype);
    let outputs = [
        Inferred::new(dtype, output),
        Inferred::new(state_dtype, state),
    ];
    Ok(outputs.into_iter().take(ctx.output_count()).collect())
}

/// output: the input's shape; present_state `(B, C, k − 1)` for a `(C, 1, k)` weight.
fn causal_conv_with_state(ctx: &OpCtx) -> RuleResult {
    let input = rank3(ctx.shape(0)?, "input")?;
    let weight = rank3(ctx.shape(1)?, "weight")?;
    let k = known(&weight[2], "the kernel size (weight dim 2)")?;
    if k == 0 {
        return Err("the kernel size (weight dim 2) is 0".into());
    }
    let dtype = ctx.dtype(0)?;
    let state = vec![input[0].clone(), input[1].clone(), Dim::Known(k - 1)];
    let outputs = [
        Inferred::new(dtype, input.clone()),
        Inferred::new(dtype, state),
    ];
    Ok(outputs.into_iter().take(ctx.output_count()).collect())
}
