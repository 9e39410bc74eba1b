//! ONNX Runtime's `com.microsoft` fused ops that exported and optimised transformers carry
//! (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md>), plus the
//! ORT ops registered in the default domain (`SimplifiedLayerNormalization`).

use super::context::{normalize_axis, same_shape, Inferred, OpCtx, RuleResult};
use super::linalg::matmul_shape;
use super::registry::Registry;
use crate::graph::{format_shape, DType, Dim, Shape};

const MS: &str = "com.microsoft";

pub(super) fn register(r: &mut Registry) {
    r.add(
        MS,
        &["FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd"],
        first_input,
    );
    r.add(
        MS,
        &["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"],
        skip_layer_norm,
    );
    r.add(
        MS,
        &["SimplifiedLayerNormalization", "LayerNormalization"],
        layer_norm_like,
    );
    r.add("", &["SimplifiedLayerNormalization"], layer_norm_like);
    r.add(MS, &["Attention"], attention);
    r.add(MS, &["MultiHeadAttention"], multi_head_attention);
    r.add(MS, &["FusedMatMul"], fused_matmul);
    r.add(MS, &["RotaryEmbedding"], first_input);
    r.add(MS, &["EmbedLayerNormalization"], embed_layer_norm);
}

fn first_input(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// SkipLayerNormalization: output, mean, inv_std_var, input_skip_bias_sum. Mean and inv_std
/// keep the leading axes with a 1 for the hidden axis, in float32.
fn skip_layer_norm(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?.clone();
    let dtype = ctx.dtype(0)?;
    let mut stats = x.clone();
    if let Some(last) = stats.last_mut() {
        *last = Dim::Known(1);
    }
    Ok(vec![
        Inferred::new(dtype, x.clone()),
        Inferred::new(DType::F32, stats.clone()),
        Inferred::new(DType::F32, stats),
        Inferred::new(dtype, x),
    ])
}

fn layer_norm_like(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let axis = normalize_axis(ctx.int_attr_or("axis", -1)?, x.len())?;
    let stats: Shape = x
        .iter()
        .enumerate()
        .map(|(i, d)| if i < axis { d.clone() } else { Dim::Known(1) })
        .collect();
    Ok(vec![
        Inferred::new(ctx.dtype(0)?, x.clone()),
        Inferred::new(DType::F32, stats.clone()),
        Inferred::new(DType::F32, stats),
    ])
}

/// Attention: input `[B, S, H_in]`, weights `[H_in, 3·H]` (or with `qkv_hidden_sizes`
/// `[q, k, v]`): output `[B, S, v]`; `present` `[2, B, heads, S_past + S, H/heads]`.
fn attention(ctx: &OpCtx) -> RuleResult {
    let (x, w) = (ctx.shape(0)?, ctx.shape(1)?);
    if x.len() != 3 || w.len() != 2 {
        return Err(format!(
            "input {} / weights {} should be 3-D / 2-D",
            format_shape(x),
            format_shape(w)
        ));
    }
    let (q_hidden, v_hidden) = match ctx.ints_attr("qkv_hidden_sizes")? {
        Some(sizes) if sizes.len() == 3 => {
            let size = |v: i64| {
                u64::try_from(v)
                    .map(Dim::Known)
                    .map_err(|_| "negative qkv size")
            };
            (size(sizes[0])?, size(sizes[2])?)
        }
        _ => {
            let third = w[1]
                .exact_div(&Dim::Known(3))
                .ok_or("weights' second dim is not divisible by 3")?;
            (third.clone(), third)
        }
    };
    let out = vec![x[0].clone(), x[1].clone(), v_hidden];
    // Without a past state, present holds this sequence's K and V heads.
    let heads = ctx
        .int_attr("num_heads")?
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n > 0);
    let present = match heads.and_then(|n| Some((n, q_hidden.exact_div(&Dim::Known(n))?))) {
        Some((n, head)) => vec![
            Dim::Known(2),
            x[0].clone(),
            Dim::Known(n),
            x[1].clone(),
            head,
        ],
        _ => vec![ctx.data_dependent_dim(1, 0)],
    };
    let mut outs = vec![Inferred::new(ctx.dtype(0)?, out)];
    if ctx.output_count() > 1 {
        let present = match ctx.opt_input(4) {
            Some(past) => {
                let mut p = past.shape.clone();
                if p.len() == 5 {
                    p[3] = ctx.data_dependent_dim(1, 3);
                }
                p
            }
            None => present,
        };
        outs.push(Inferred::new(ctx.dtype(0)?, present));
    }
    Ok(outs)
}

/// MultiHeadAttention: query `[B, S, D]`, value `[B, L, D_v]` (or packed forms); output
/// `[B, S, D_v]`.
fn multi_head_attention(ctx: &OpCtx) -> RuleResult {
    let q = ctx.shape(0)?;
    if q.len() != 3 {
        return Err(format!(
            "query {} should be [batch, sequence, hidden]",
            format_shape(q)
        ));
    }
    let v_hidden = match ctx.opt_input(2) {
        Some(v) if v.shape.len() == 3 => v.shape[2].clone(),
        Some(v) if v.shape.len() == 4 => v.shape[1].checked_mul(&v.shape[3]).ok_or("overflow")?,
        _ => q[2].clone(),
    };
    Ok(vec![Inferred::new(
        ctx.dtype(0)?,
        vec![q[0].clone(), q[1].clone(), v_hidden],
    )])
}

fn transpose_last_two(shape: &Shape) -> Shape {
    let mut s = shape.clone();
    let n = s.len();
    if n >= 2 {
        s.swap(n - 1, n - 2);
    }
    s
}

fn fused_matmul(ctx: &OpCtx) -> RuleResult {
    let mut a = ctx.shape(0)?.clone();
    let mut b = ctx.shape(1)?.clone();
    if ctx.int_attr_or("transA", 0)? != 0 {
        a = transpose_last_two(&a);
    }
    if ctx.int_attr_or("transB", 0)? != 0 {
        b = transpose_last_two(&b);
    }
    Ok(vec![Inferred::new(
        ctx.dtype(0)?,
        matmul_shape(ctx, &a, &b)?,
    )])
}

/// EmbedLayerNormalization: output `[B, S, hidden]`, mask_index `[B]`, optional embedding sum.
fn embed_layer_norm(ctx: &OpCtx) -> RuleResult {
    let ids = ctx.shape(0)?;
    let word = ctx.shape(2)?;
    if ids.len() != 2 || word.len() != 2 {
        return Err("input_ids must be [batch, sequence] and word_embedding 2-D".into());
    }
    let out = vec![ids[0].clone(), ids[1].clone(), word[1].clone()];
    let dtype = ctx.dtype(2)?;
    Ok(vec![
        Inferred::new(dtype, out.clone()),
        Inferred::new(DType::I32, vec![ids[0].clone()]),
        Inferred::new(dtype, out),
    ])
}
