//! The stateful sequence mixers of opset 27, after the ONNX reference implementation
//! (`onnx/reference/ops/op_linear_attention.py`, `op_causal_conv_with_state.py`):
//! LinearAttention (<https://onnx.ai/onnx/operators/onnx__LinearAttention.html>) and
//! CausalConvWithState (<https://onnx.ai/onnx/operators/onnx__CausalConvWithState.html>).
//! Both compute in f32, as the reference does, and return the state the next step starts from.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::fast_math;
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["LinearAttention"], linear_attention);
    t.add(&["CausalConvWithState"], causal_conv_with_state);
}

/// `[B, T, W]` of a rank-3 input, or an error naming it.
fn dims3(x: &HostTensor, name: &str) -> Result<[usize; 3], String> {
    match x.shape() {
        &[b, t, w] => Ok([b, t, w]),
        other => Err(format!("{name} must be rank 3, not {other:?}")),
    }
}

/// Which of the four update rules: `gated` decays the state by `exp(decay)` each step,
/// `delta` writes `beta · (v − Sᵀk)` instead of `v`.
struct UpdateRule {
    gated: bool,
    delta: bool,
}

impl UpdateRule {
    fn parse(name: &str) -> Result<UpdateRule, String> {
        let (gated, delta) = match name {
            "linear" => (false, false),
            "gated" => (true, false),
            "delta" => (false, true),
            "gated_delta" => (true, true),
            other => return Err(format!("unknown update_rule '{other}'")),
        };
        Ok(UpdateRule { gated, delta })
    }
}

/// The head geometry of one LinearAttention node.
struct Heads {
    q: usize,
    kv: usize,
    d_k: usize,
    d_v: usize,
}

fn heads(ctx: &Ctx, query: [usize; 3], value: [usize; 3]) -> Result<Heads, String> {
    let q = ctx.int("q_num_heads", 0);
    let kv = ctx.int("kv_num_heads", 0);
    if q <= 0 || kv <= 0 || q % kv != 0 {
        return Err(format!(
            "q_num_heads {q} must be a positive multiple of kv_num_heads {kv}"
        ));
    }
    let (q, kv) = (q as usize, kv as usize);
    if !query[2].is_multiple_of(q) || !value[2].is_multiple_of(kv) {
        return Err("the query or value width does not split into its heads".into());
    }
    Ok(Heads {
        q,
        kv,
        d_k: query[2] / q,
        d_v: value[2] / kv,
    })
}

/// LinearAttention: per batch row and key/value head a `d_k × d_v` state `S`, per step
/// `S ← exp(g)·S` (gated), `v ← β·(v − Sᵀk)` (delta), `S ← S + k vᵀ`, and each query head of
/// the group reads `scale · Sᵀq`.
fn linear_attention(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (query, key, value) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let [b, t, q_width] = dims3(query, "query")?;
    let [_, _, k_width] = dims3(key, "key")?;
    let value_dims = dims3(value, "value")?;
    let h = heads(ctx, [b, t, q_width], value_dims)?;
    if k_width != h.kv * h.d_k {
        return Err(format!("key width {k_width} is not kv_num_heads · d_k"));
    }
    let rule = UpdateRule::parse(&ctx.string("update_rule", "gated_delta"))?;
    let decay = optional(inputs, 4).map(HostTensor::to_f32_vec);
    let beta = optional(inputs, 5).map(HostTensor::to_f32_vec);
    let decay_width = optional(inputs, 4).map_or(0, |d| *d.shape().last().unwrap_or(&0));
    let beta_width = optional(inputs, 5).map_or(0, |d| *d.shape().last().unwrap_or(&0));
    if rule.gated && (decay_width != h.kv && decay_width != h.kv * h.d_k) {
        return Err(
            "this update_rule needs decay of width kv_num_heads or kv_num_heads · d_k".into(),
        );
    }
    if rule.delta && beta_width != h.kv && beta_width != 1 {
        return Err("this update_rule needs beta of width kv_num_heads or 1".into());
    }
    let state_len = h.d_k * h.d_v;
    let mut state = match optional(inputs, 3) {
        Some(past) if past.len() == b * h.kv * state_len => past.to_f32_vec(),
        Some(past) => {
            return Err(format!(
                "past_state {:?} is not [B, kv_num_heads, d_k, d_v]",
                past.shape()
            ))
        }
        None => vec![0.0; b * h.kv * state_len],
    };
    // An absent or zero scale is 1/√d_k.
    let scale = match ctx.float("scale", 0.0) {
        0.0 => 1.0 / (h.d_k as f32).sqrt(),
        s => s,
    };
    let (q, k, v) = (query.to_f32_vec(), key.to_f32_vec(), value.to_f32_vec());
    let mut out = vec![0.0f32; b * t * h.q * h.d_v];
    let group = h.q / h.kv;
    let mut written = vec![0.0f32; h.d_v];
    for bi in 0..b {
        for step in 0..t {
            let row = bi * t + step;
            for kv in 0..h.kv {
                let s = &mut state[(bi * h.kv + kv) * state_len..][..state_len];
                let k_t = &k[row * k_width + kv * h.d_k..][..h.d_k];
                let v_t = &v[row * value_dims[2] + kv * h.d_v..][..h.d_v];
                if let (true, Some(decay)) = (rule.gated, &decay) {
                    for i in 0..h.d_k {
                        let g = if decay_width == h.kv {
                            decay[row * decay_width + kv]
                        } else {
                            decay[row * decay_width + kv * h.d_k + i]
                        };
                        s[i * h.d_v..][..h.d_v]
                            .iter_mut()
                            .for_each(|x| *x *= g.exp());
                    }
                }
                written.copy_from_slice(v_t);
                if let (true, Some(beta)) = (rule.delta, &beta) {
                    let b_t = beta[row * beta_width + if beta_width == 1 { 0 } else { kv }];
                    for (j, w) in written.iter_mut().enumerate() {
                        let retrieved: f32 = (0..h.d_k).map(|i| s[i * h.d_v + j] * k_t[i]).sum();
                        *w = b_t * (*w - retrieved);
                    }
                }
                for i in 0..h.d_k {
                    for j in 0..h.d_v {
                        s[i * h.d_v + j] += k_t[i] * written[j];
                    }
                }
                for head in kv * group..(kv + 1) * group {
                    let q_t = &q[row * q_width + head * h.d_k..][..h.d_k];
                    let o = &mut out[row * h.q * h.d_v + head * h.d_v..][..h.d_v];
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = scale * (0..h.d_k).map(|i| q_t[i] * s[i * h.d_v + j]).sum::<f32>();
                    }
                }
            }
        }
    }
    Ok(vec![
        HostTensor::f32(vec![b, t, h.q * h.d_v], out),
        HostTensor::f32(vec![b, h.kv, h.d_k, h.d_v], state),
    ])
}

/// CausalConvWithState: the input left-padded with `past_state` (zeros without it), a
/// depthwise valid convolution with the `(C, 1, k)` weight, bias, then SiLU if asked; the
/// present state is the padded input's last `k − 1` positions.
fn causal_conv_with_state(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let weight = input(inputs, 1)?;
    let [b, c, len] = dims3(x, "input")?;
    let k = match weight.shape() {
        &[wc, 1, k] if wc == c && k > 0 => k,
        other => return Err(format!("weight {other:?} is not [{c}, 1, k]")),
    };
    let silu = match ctx.string("activation", "none").as_str() {
        "none" => false,
        "silu" | "swish" => true,
        other => return Err(format!("unknown activation '{other}'")),
    };
    let past = match optional(inputs, 3) {
        Some(p) if p.shape() == [b, c, k - 1] => Some(p.to_f32_vec()),
        Some(p) => {
            return Err(format!(
                "past_state {:?} is not [{b}, {c}, {}]",
                p.shape(),
                k - 1
            ))
        }
        None => None,
    };
    let bias = optional(inputs, 2).map(HostTensor::to_f32_vec);
    let (x, w) = (x.to_f32_vec(), weight.to_f32_vec());
    let padded_len = len + k - 1;
    let mut out = vec![0.0f32; b * c * len];
    let mut present = vec![0.0f32; b * c * (k - 1)];
    let mut padded = vec![0.0f32; padded_len];
    for row in 0..b * c {
        let channel = row % c;
        match &past {
            Some(p) => padded[..k - 1].copy_from_slice(&p[row * (k - 1)..][..k - 1]),
            None => padded[..k - 1].fill(0.0),
        }
        padded[k - 1..].copy_from_slice(&x[row * len..][..len]);
        let taps = &w[channel * k..][..k];
        let shift = bias.as_ref().map_or(0.0, |b| b[channel]);
        for (t, o) in out[row * len..][..len].iter_mut().enumerate() {
            let sum = shift
                + taps
                    .iter()
                    .zip(&padded[t..])
                    .map(|(a, b)| a * b)
                    .sum::<f32>();
            *o = if silu {
                sum * fast_math::sigmoid(sum)
            } else {
                sum
            };
        }
        present[row * (k - 1)..][..k - 1].copy_from_slice(&padded[len..]);
    }
    Ok(vec![
        HostTensor::f32(vec![b, c, len], out),
        HostTensor::f32(vec![b, c, k - 1], present),
    ])
}
