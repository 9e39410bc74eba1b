//! The standard attention ops of ai.onnx:
//! [Attention](https://onnx.ai/onnx/operators/onnx__Attention.html), opsets 23 and 24 (the
//! `nonpad_kv_seqlen` input of 24 changes no shape), and
//! [RotaryEmbedding](https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html), opset 23, whose
//! output is its input's shape and dtype.
//!
//! Q, K and V are either 4-D, `[batch, heads, sequence, head_size]`, or 3-D,
//! `[batch, sequence, heads · head_size]` with the head counts in `q_num_heads` and
//! `kv_num_heads`. The cache inputs `past_key`/`past_value` are 4-D; the present cache holds the
//! past sequence followed by the new one. Outputs: Y in Q's layout (with V's head size),
//! `present_key`, `present_value`, and `qk_matmul_output`, `[batch, q_heads, q_sequence,
//! total_sequence]`.

use super::context::{same_shape, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{format_shape, Dim, Shape};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["Attention"], attention);
    r.add("", &["RotaryEmbedding"], rotary_embedding);
    r.add("ai.onnx.preview", &["FlexAttention"], flex_attention);
}

/// FlexAttention (ai.onnx.preview opset 1,
/// <https://onnx.ai/onnx/operators/onnx_aionnxpreview_FlexAttention.html>): 4-D Q
/// `[B, Hq, L, E]`, K `[B, Hkv, S, E]`, V `[B, Hkv, S, Ev]`; Y `[B, Hq, L, Ev]` of V's dtype.
/// The `score_mod`/`prob_mod` subgraphs map the scores elementwise and change no shape.
fn flex_attention(ctx: &OpCtx) -> RuleResult {
    let (q, k, v) = (ctx.shape(0)?, ctx.shape(1)?, ctx.shape(2)?);
    if q.len() != 4 || k.len() != 4 || v.len() != 4 {
        return Err("FlexAttention needs 4-D Q, K and V".into());
    }
    if q[3] != k[3] {
        return Err(format!("Q's head size {} differs from K's {}", q[3], k[3]));
    }
    let y = vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()];
    Ok(vec![Inferred::new(ctx.dtype(2)?, y)])
}

fn rotary_embedding(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// The 4-D form `[batch, heads, sequence, head_size]` of input `i`; a 3-D input is split into
/// `heads_attr` heads.
fn as_4d(ctx: &OpCtx, i: usize, heads_attr: &str) -> Result<Shape, String> {
    let shape = ctx.shape(i)?;
    match shape.len() {
        4 => Ok(shape.clone()),
        3 => {
            let heads = ctx
                .int_attr(heads_attr)?
                .filter(|&h| h > 0)
                .ok_or_else(|| format!("a 3-D input {i} needs a positive '{heads_attr}'"))?;
            let head_size = shape[2]
                .exact_div(&Dim::Known(heads as u64))
                .ok_or_else(|| {
                    format!(
                        "input {i}'s hidden size {} is not divisible by {heads_attr} {heads}",
                        shape[2]
                    )
                })?;
            Ok(vec![
                shape[0].clone(),
                Dim::Known(heads as u64),
                shape[1].clone(),
                head_size,
            ])
        }
        _ => Err(format!(
            "input {i} {} should be 3-D or 4-D",
            format_shape(shape)
        )),
    }
}

fn attention(ctx: &OpCtx) -> RuleResult {
    let q_rank = ctx.shape(0)?.len();
    let q = as_4d(ctx, 0, "q_num_heads")?;
    let k = as_4d(ctx, 1, "kv_num_heads")?;
    let v = as_4d(ctx, 2, "kv_num_heads")?;
    if q[3] != k[3] {
        return Err(format!("Q's head size {} differs from K's {}", q[3], k[3]));
    }
    let total = match ctx.opt_input(4) {
        None => k[2].clone(),
        Some(past) => match (past.shape.get(2).and_then(Dim::known), k[2].known()) {
            (Some(p), Some(n)) => Dim::Known(p.checked_add(n).ok_or("sequence overflow")?),
            _ => ctx.data_dependent_dim(1, 2),
        },
    };
    let y = if q_rank == 3 {
        let hidden = q[1].checked_mul(&v[3]).ok_or("Y's hidden size overflows")?;
        vec![q[0].clone(), q[2].clone(), hidden]
    } else {
        vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]
    };
    let dtype = ctx.dtype(0)?;
    Ok(vec![
        Inferred::new(dtype, y),
        Inferred::new(
            ctx.dtype(1)?,
            vec![k[0].clone(), k[1].clone(), total.clone(), k[3].clone()],
        ),
        Inferred::new(
            ctx.dtype(2)?,
            vec![v[0].clone(), v[1].clone(), total.clone(), v[3].clone()],
        ),
        Inferred::new(dtype, vec![q[0].clone(), q[1].clone(), q[2].clone(), total]),
    ])
}
