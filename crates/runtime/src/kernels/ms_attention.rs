//! onnxruntime's `com.microsoft` Attention: the fused QKV projection, scaled dot-product attention
//! and head merge that its transformer optimizer writes for BERT- and GPT-2-style models; and its
//! RotaryEmbedding (see [`rotary_embedding`]).
//!
//! Spec: <https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.Attention>.
//! Inputs: `input [B, S, H_in]`, `weights [H_in, Q + K + V]`, `bias [Q + K + V]?`,
//! `mask_index?`, `past?`, `attention_bias [B|1, N|1, S, S]?`. Attributes: `num_heads`,
//! `qkv_hidden_sizes` (default three equal thirds), `unidirectional` (causal), `scale` (default
//! `1/√head_size`), `mask_filter_value` (default -10000, added to masked scores as onnxruntime's
//! CPU kernel does). Masks: 1-D `[B]` (valid lengths from the left), 2-D `[B, S]` and 3-D
//! `[B, S, T]` (0 masks, anything else keeps), over the `T = P + S` keys of a `past [2, B, N,
//! P, head_size]` state (incremental decoding: its K and V come before the new ones, and a
//! causal query `i` sees keys up to `P + i`). Outputs: `output [B, S, V]` and `present [2, B,
//! N, T, head_size]` (K and V, the past's first).

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::matmul::sgemm;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add_in("com.microsoft", &["Attention"], attention);
    t.add_in("com.microsoft", &["RotaryEmbedding"], rotary_embedding);
}

/// com.microsoft RotaryEmbedding
/// (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.RotaryEmbedding>):
/// `input [B, S, H]` (heads of `H / num_heads`) or `[B, N, S, head]`, `position_ids [B, S]` (or
/// `[1]`: an offset added to each position), `cos_cache` and `sin_cache [max_position, rotary/2]`.
/// The first `rotary` features of each head are rotated in pairs — `(i, i + rotary/2)`, or
/// `(2i, 2i + 1)` with `interleaved` — and the rest pass through.
fn rotary_embedding(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, positions) = (input(inputs, 0)?, input(inputs, 1)?);
    let (cos, sin) = (input(inputs, 2)?, input(inputs, 3)?);
    let [max_position, half] = *cos.shape() else {
        return Err(format!("cos_cache {:?} should be 2-D", cos.shape()));
    };
    if sin.shape() != cos.shape() {
        return Err("sin_cache and cos_cache differ in shape".into());
    }
    let rotary = 2 * half;
    let num_heads = ctx.int("num_heads", 0);
    // (batch, heads, seq, head size) and whether the layout is [B, S, N·h].
    let (batch, heads, seq, head, seq_major) = match *x.shape() {
        [b, s, hidden] => {
            let heads = if num_heads > 0 {
                num_heads as usize
            } else {
                hidden / rotary.max(1)
            };
            if heads == 0 || hidden % heads != 0 {
                return Err(format!(
                    "hidden size {hidden} does not split into {heads} heads"
                ));
            }
            (b, heads, s, hidden / heads, true)
        }
        [b, n, s, h] => (b, n, s, h, false),
        _ => return Err(format!("input {:?} should be 3-D or 4-D", x.shape())),
    };
    if rotary > head || rotary == 0 {
        return Err(format!(
            "rotary size {rotary} does not fit head size {head}"
        ));
    }
    let position_values = positions.to_i64_vec();
    let position = |b: usize, s: usize| -> Result<usize, String> {
        let p = if position_values.len() == 1 {
            position_values[0] + s as i64
        } else if positions.shape() == [batch, seq] {
            position_values[b * seq + s]
        } else {
            return Err(format!(
                "position_ids {:?} should be [B, S] or [1]",
                positions.shape()
            ));
        };
        usize::try_from(p)
            .ok()
            .filter(|&p| p < max_position)
            .ok_or_else(|| format!("position {p} is outside the {max_position} cached positions"))
    };
    let interleaved = ctx.int("interleaved", 0) != 0;
    let (values, cos, sin) = (x.as_f32()?, cos.as_f32()?, sin.as_f32()?);
    let mut out = values.to_vec();
    for b in 0..batch {
        for s in 0..seq {
            let p = position(b, s)?;
            for n in 0..heads {
                let base = if seq_major {
                    ((b * seq + s) * heads + n) * head
                } else {
                    ((b * heads + n) * seq + s) * head
                };
                for i in 0..half {
                    let (first, second) = if interleaved {
                        (base + 2 * i, base + 2 * i + 1)
                    } else {
                        (base + i, base + i + half)
                    };
                    let (c, si) = (cos[p * half + i], sin[p * half + i]);
                    let (x1, x2) = (values[first], values[second]);
                    out[first] = x1 * c - x2 * si;
                    out[second] = x2 * c + x1 * si;
                }
            }
        }
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

/// Which key positions each query may see, as an additive bias per (batch, query, key).
enum Mask {
    None,
    Lengths(Vec<i64>),
    Keep2d(Vec<f32>),
    Keep3d(Vec<f32>),
}

impl Mask {
    /// Whether query `i` of `s` may not see key `j` of `t` in batch `b`.
    fn masked(&self, b: usize, i: usize, j: usize, [s, t]: [usize; 2]) -> bool {
        match self {
            Mask::None => false,
            Mask::Lengths(ends) => j as i64 >= ends[b],
            Mask::Keep2d(m) => m[b * t + j] == 0.0,
            Mask::Keep3d(m) => m[(b * s + i) * t + j] == 0.0,
        }
    }

    /// `mask_index` in one of its supported forms, over the `total` keys.
    fn of(mask: Option<&HostTensor>, sizes: &Sizes) -> Result<Mask, String> {
        let Sizes {
            batch, seq, total, ..
        } = *sizes;
        Ok(match mask {
            None => Mask::None,
            Some(m) if m.shape() == [batch] => Mask::Lengths(m.to_i64_vec()),
            Some(m) if m.shape() == [batch, total] => Mask::Keep2d(m.to_f32_vec()),
            Some(m) if m.shape() == [batch, seq, total] => Mask::Keep3d(m.to_f32_vec()),
            Some(m) => {
                return Err(format!(
                    "mask_index {:?} is not a supported form",
                    m.shape()
                ))
            }
        })
    }
}

/// The sizes of an Attention node: its input, the projection's columns and how the heads split
/// them.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    batch: usize,
    seq: usize,
    hidden_in: usize,
    /// Columns of the projection: Q + K + V.
    w_cols: usize,
    heads: usize,
    q_size: usize,
    v_size: usize,
    /// Features per head of Q and K, and of V.
    head: usize,
    v_head: usize,
    /// Positions of the past state (0 without one), and the keys a query scores: past + seq.
    past: usize,
    total: usize,
}

impl Sizes {
    fn of(
        ctx: &Ctx,
        x: &HostTensor,
        w: &HostTensor,
        past: Option<&HostTensor>,
    ) -> Result<Sizes, String> {
        let (&[batch, seq, hidden_in], &[w_rows, w_cols]) = (x.shape(), w.shape()) else {
            return Err(format!(
                "input {:?} / weights {:?} should be [B, S, H_in] / [H_in, Q + K + V]",
                x.shape(),
                w.shape()
            ));
        };
        if w_rows != hidden_in {
            return Err(format!(
                "weights have {w_rows} rows for {hidden_in} input features"
            ));
        }
        let heads = usize::try_from(ctx.int("num_heads", 0))
            .ok()
            .filter(|&n| n > 0)
            .ok_or("num_heads must be positive")?;
        let sizes: Vec<usize> = match ctx.ints("qkv_hidden_sizes") {
            Some(s) => s
                .iter()
                .map(|&v| usize::try_from(v).map_err(|_| "negative qkv_hidden_sizes".to_string()))
                .collect::<Result<_, _>>()?,
            None => vec![w_cols / 3; 3],
        };
        let [q_size, k_size, v_size] = sizes[..] else {
            return Err("qkv_hidden_sizes needs three entries".into());
        };
        if q_size + k_size + v_size != w_cols || q_size != k_size {
            return Err(format!(
                "qkv sizes {sizes:?} do not fit {w_cols} weight columns (Q and K must be equal)"
            ));
        }
        if q_size % heads != 0 || v_size % heads != 0 {
            return Err(format!(
                "{heads} heads do not divide hidden sizes {sizes:?}"
            ));
        }
        let (head, v_head) = (q_size / heads, v_size / heads);
        let past = match past.map(HostTensor::shape) {
            None => 0,
            Some(&[2, b, n, p, d]) if b == batch && n == heads && d == head && d == v_head => p,
            Some(shape) => {
                return Err(format!(
                    "past {shape:?} is not [2, {batch}, {heads}, past, {head}] (K and V of equal head sizes)"
                ))
            }
        };
        Ok(Sizes {
            batch,
            seq,
            hidden_in,
            w_cols,
            heads,
            q_size,
            v_size,
            head,
            v_head,
            past,
            total: past + seq,
        })
    }
}

/// `attention_bias` and its leading dims `[B|1, N|1]`.
type AttentionBias = (Vec<f32>, [usize; 2]);

/// What is added to each scaled score: `attention_bias`, and the filter value where the mask
/// or causality hides the key.
struct Scoring {
    mask: Mask,
    bias: Option<AttentionBias>,
    causal: bool,
    scale: f32,
    filter: f32,
}

impl Scoring {
    /// The score of query `i` for key `j` of head `n` of batch `b`, from their dot product;
    /// `sizes` gives the queries, the keys and the past positions before the queries.
    fn score(&self, dot: f32, (b, n, i, j): (usize, usize, usize, usize), sizes: &Sizes) -> f32 {
        let (seq, total) = (sizes.seq, sizes.total);
        let mut value = dot * self.scale;
        if let Some((bias, [bb, bn])) = &self.bias {
            let (bb, bn) = (*bb, *bn);
            let (bi, ni) = (if bb == 1 { 0 } else { b }, if bn == 1 { 0 } else { n });
            value += bias[((bi * bn + ni) * seq + i) * total + j];
        }
        if self.mask.masked(b, i, j, [seq, total]) || (self.causal && j > sizes.past + i) {
            value += self.filter;
        }
        value
    }
}

fn attention(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, w, past) = (input(inputs, 0)?, input(inputs, 1)?, optional(inputs, 4));
    let sizes = Sizes::of(ctx, x, w, past)?;
    let qkv = project(x, w, optional(inputs, 2), &sizes)?;
    let scoring = Scoring {
        mask: Mask::of(optional(inputs, 3), &sizes)?,
        bias: attention_bias(optional(inputs, 5), &sizes)?,
        causal: ctx.int("unidirectional", 0) != 0,
        scale: ctx.float("scale", 1.0 / (sizes.head as f32).sqrt()),
        filter: ctx.float("mask_filter_value", -10000.0),
    };
    let keys_values = KeysValues::of(&qkv, past, &sizes)?;
    let out = attend(&qkv, &keys_values, &sizes, &scoring);
    let present = present(ctx, keys_values, &sizes)?;
    let Sizes {
        batch, seq, v_size, ..
    } = sizes;
    Ok(vec![
        HostTensor::f32(vec![batch, seq, v_size], out),
        present,
    ])
}

/// The projection `[B·S, H_in] × [H_in, Q + K + V]` (+ bias): every row's Q, K and V.
fn project(
    x: &HostTensor,
    w: &HostTensor,
    bias: Option<&HostTensor>,
    sizes: &Sizes,
) -> Result<Vec<f32>, String> {
    let Sizes {
        batch,
        seq,
        hidden_in,
        w_cols,
        ..
    } = *sizes;
    let rows = batch * seq;
    let mut qkv = vec![0.0f32; rows * w_cols];
    if let Some(bias) = bias {
        let bias = bias.as_f32()?;
        if bias.len() != w_cols {
            return Err(format!(
                "bias has {} entries for {w_cols} columns",
                bias.len()
            ));
        }
        qkv.chunks_mut(w_cols).for_each(|r| r.copy_from_slice(bias));
    }
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    sgemm(
        rows,
        hidden_in,
        w_cols,
        1.0,
        x.as_f32()?,
        (hidden_in, 1),
        w.as_f32()?,
        (w_cols, 1),
        beta,
        &mut qkv,
    );
    Ok(qkv)
}

/// `attention_bias [B|1, N|1, S, T]` with its leading dims, when given.
fn attention_bias(
    bias: Option<&HostTensor>,
    sizes: &Sizes,
) -> Result<Option<AttentionBias>, String> {
    let Sizes {
        batch,
        seq,
        heads,
        total,
        ..
    } = *sizes;
    bias.map(|b| match *b.shape() {
        [bb, bn, bs, bt]
            if (bb == 1 || bb == batch) && (bn == 1 || bn == heads) && bs == seq && bt == total =>
        {
            Ok((b.to_f32_vec(), [bb, bn]))
        }
        _ => Err(format!("attention_bias {:?} does not fit", b.shape())),
    })
    .transpose()
}

/// Each head's keys and values over all `T` positions, the past's first: `[B, N, T, head]`
/// and `[B, N, T, v_head]`.
struct KeysValues {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KeysValues {
    fn of(qkv: &[f32], past: Option<&HostTensor>, sizes: &Sizes) -> Result<KeysValues, String> {
        let Sizes {
            batch,
            seq,
            w_cols,
            heads,
            q_size,
            head,
            v_head,
            past: past_len,
            total,
            ..
        } = *sizes;
        let past = past.map(HostTensor::as_f32).transpose()?;
        let mut keys = vec![0.0f32; batch * heads * total * head];
        let mut values = vec![0.0f32; batch * heads * total * v_head];
        let half = batch * heads * past_len * head;
        for b in 0..batch {
            for n in 0..heads {
                let bn = b * heads + n;
                if let Some(past) = past {
                    let (from, to) = (bn * past_len * head, bn * total * head);
                    let len = past_len * head;
                    keys[to..to + len].copy_from_slice(&past[from..from + len]);
                    values[to..to + len].copy_from_slice(&past[half + from..half + from + len]);
                }
                for s in 0..seq {
                    let row = &qkv[(b * seq + s) * w_cols..][..w_cols];
                    let slot = bn * total + past_len + s;
                    keys[slot * head..][..head].copy_from_slice(&row[q_size + n * head..][..head]);
                    values[slot * v_head..][..v_head]
                        .copy_from_slice(&row[2 * q_size + n * v_head..][..v_head]);
                }
            }
        }
        Ok(KeysValues { keys, values })
    }
}

/// Scaled dot-product attention of every head's queries over its keys, heads merged:
/// `[B, S, V]`.
fn attend(qkv: &[f32], kv: &KeysValues, sizes: &Sizes, scoring: &Scoring) -> Vec<f32> {
    let Sizes {
        batch,
        seq,
        w_cols,
        heads,
        v_size,
        head,
        v_head,
        total,
        ..
    } = *sizes;
    let mut out = vec![0.0f32; batch * seq * v_size];
    let mut scores = vec![0.0f32; total];
    for b in 0..batch {
        for n in 0..heads {
            let keys = &kv.keys[(b * heads + n) * total * head..][..total * head];
            let values = &kv.values[(b * heads + n) * total * v_head..][..total * v_head];
            for i in 0..seq {
                let query = &qkv[(b * seq + i) * w_cols + n * head..][..head];
                for (j, score) in scores.iter_mut().enumerate() {
                    let dot: f32 = query
                        .iter()
                        .zip(&keys[j * head..][..head])
                        .map(|(q, k)| q * k)
                        .sum();
                    *score = scoring.score(dot, (b, n, i, j), sizes);
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                scores.iter_mut().for_each(|s| {
                    *s = (*s - max).exp();
                    sum += *s;
                });
                for d in 0..v_head {
                    let value: f32 = scores
                        .iter()
                        .enumerate()
                        .map(|(j, p)| p * values[j * v_head + d])
                        .sum();
                    out[(b * seq + i) * v_size + n * v_head + d] = value / sum;
                }
            }
        }
    }
    out
}

/// `present [2, B, N, T, head_size]`: each head's keys and values (zeros when their head sizes
/// differ and the node does not ask for it).
fn present(ctx: &Ctx, kv: KeysValues, sizes: &Sizes) -> Result<HostTensor, String> {
    let Sizes {
        batch,
        heads,
        head,
        v_head,
        total,
        ..
    } = *sizes;
    let shape = vec![2, batch, heads, total, head];
    if head == v_head {
        let mut present = kv.keys;
        present.extend(kv.values);
        return Ok(HostTensor::f32(shape, present));
    }
    if matches!(ctx.node.outputs.get(1), Some(Some(_))) {
        return Err("present needs equal K and V head sizes".into());
    }
    Ok(HostTensor::f32(
        shape.clone(),
        vec![0.0; shape.iter().product()],
    ))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, node};
    use super::super::{lookup, Ctx};
    use pipecut_ir::graph::Attribute;

    #[test]
    fn one_head_attention_averages_values_under_equal_scores() {
        // Zero queries and keys give equal scores: each output is the mean of the values it may
        // see (all of them, or the prefix under `unidirectional`).
        let x = f(&[1, 2, 1], &[1.0, 3.0]);
        let w = f(&[1, 3], &[0.0, 0.0, 1.0]);
        let n = node("Attention", vec![("num_heads", Attribute::Int(1))]);
        let ctx = Ctx {
            node: &n,
            opset: 1,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let out =
            lookup("com.microsoft", "Attention").unwrap()(&ctx, &[Some(&x), Some(&w)]).unwrap();
        assert_close(&out[0], &[1, 2, 1], &[2.0, 2.0]);
        let n = node(
            "Attention",
            vec![
                ("num_heads", Attribute::Int(1)),
                ("unidirectional", Attribute::Int(1)),
            ],
        );
        let ctx = Ctx {
            node: &n,
            opset: 1,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let out =
            lookup("com.microsoft", "Attention").unwrap()(&ctx, &[Some(&x), Some(&w)]).unwrap();
        assert_close(&out[0], &[1, 2, 1], &[1.0, 2.0]);
    }
}
