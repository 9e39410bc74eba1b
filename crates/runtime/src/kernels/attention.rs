//! The standard attention op of ai.onnx:
//! [Attention](https://onnx.ai/onnx/operators/onnx__Attention.html), opsets 23 to 25.
//!
//! Q·Kᵀ·scale (scale 1/√head_size unless given), the soft cap `c·tanh(x/c)`, plus the mask
//! (`attn_mask`, additive floats or booleans where false masks; shorter than the total sequence
//! it is padded with masked positions), the causal mask (query i sees keys j ≤ i + past
//! length), and the padding mask of `nonpad_kv_seqlen` (opset 24); then the softmax over keys,
//! and the product with V. Grouped-query attention repeats each KV head for `q_heads / kv_heads`
//! consecutive query heads. `qk_matmul_output_mode` picks what the fourth output holds: 0 the
//! scaled Q·Kᵀ, 1 after the soft cap, 2 with the bias added too, 3 after the softmax.
//!
//! As the reference of onnx 1.23 computes it (for every opset): the soft cap comes before the
//! bias, a fully masked row gives zeros, and opset 25's sliding window (`left_window_size`,
//! `right_window_size`) and an external cache's causal offset (`nonpad_kv_seqlen − q_len`)
//! apply.
//!
//! [RotaryEmbedding](https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html), opset 23:
//! rotates the first `rotary_embedding_dim` (default: all) elements of every head by the cos/sin
//! caches, indexed by `position_ids` (`[batch, seq]` into caches `[positions, dim/2]`) or, without
//! them, read as `[batch, seq, dim/2]`; pairs are the two halves, or neighbours when
//! `interleaved`. Input 4-D `[batch, heads, seq, head_size]` or 3-D `[batch, seq, hidden]` with
//! `num_heads`.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use crate::tensor::HostTensor;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["Attention"], attention);
    t.add(&["RotaryEmbedding"], rotary_embedding);
    t.add_in("ai.onnx.preview", &["FlexAttention"], flex_attention);
}

/// FlexAttention (ai.onnx.preview opset 1, after `onnx/reference/ops/aionnx_preview/
/// op_flex_attention.py`): 4-D Q, K, V, scaled scores (1/√E unless `scale` is given), a softmax
/// over keys and the product with V, KV heads grouped as Attention groups them. The
/// `score_mod` and `prob_mod` subgraphs are not run: a node with one is refused.
fn flex_attention(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    for name in ["score_mod", "prob_mod"] {
        if ctx.node.attributes.contains_key(name) {
            return Err(format!(
                "FlexAttention's '{name}' subgraph is not run by the CPU runtime"
            ));
        }
    }
    for (i, what) in [(0, "Q"), (1, "K"), (2, "V")] {
        if input(inputs, i)?.rank() != 4 {
            return Err(format!("FlexAttention needs a 4-D {what}"));
        }
    }
    let q = Heads::read(input(inputs, 0)?, 0, "Q")?;
    let k = Heads::read(input(inputs, 1)?, 0, "K")?;
    let v = Heads::read(input(inputs, 2)?, 0, "V")?;
    let scoring = Scoring {
        scale: match ctx.attr("scale") {
            Some(_) => ctx.float("scale", 1.0),
            None => 1.0 / (q.size as f32).sqrt(),
        },
        softcap: 0.0,
        causal: false,
        offsets: Vec::new(),
        window: (-1, -1),
        mode: 0,
        mask: None,
        nonpad: None,
    };
    let (y, _) = attend(&q, &k, &v, &scoring)?;
    Ok(vec![HostTensor::f32(
        vec![q.batch, q.heads, q.seq, v.size],
        y,
    )])
}

fn rotary_embedding(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let values = x.to_f32_vec();
    // (batch, seq, heads, head_size) and the element stride of the head and seq axes.
    let (batch, seq, heads, size, head_stride, seq_stride) = match *x.shape() {
        [b, h, s, d] => (b, s, h, d, s * d, d),
        [b, s, hidden] => {
            let h = usize::try_from(ctx.int("num_heads", 0))
                .ok()
                .filter(|&h| h > 0 && hidden % h == 0)
                .ok_or_else(|| {
                    format!("hidden size {hidden} does not split into 'num_heads' heads")
                })?;
            (b, s, h, hidden / h, hidden / h, hidden)
        }
        ref other => return Err(format!("input {other:?} should be 3-D or 4-D")),
    };
    let rotary = match ctx.int("rotary_embedding_dim", 0) {
        0 => size,
        d => usize::try_from(d)
            .ok()
            .filter(|&d| d <= size && d % 2 == 0)
            .ok_or_else(|| {
                format!("rotary_embedding_dim {d} is not an even size up to the head size {size}")
            })?,
    };
    let half = rotary / 2;
    let (cos, sin) = (input(inputs, 1)?, input(inputs, 2)?);
    if cos.shape().last() != Some(&half) || sin.shape() != cos.shape() {
        return Err(format!(
            "cos/sin caches {:?}/{:?} should end in rotary_embedding_dim/2 = {half}",
            cos.shape(),
            sin.shape()
        ));
    }
    let (cos, sin) = (cos.to_f32_vec(), sin.to_f32_vec());
    let positions = optional(inputs, 3).map(|p| p.to_i64_vec());
    let rows = cos.len() / half.max(1);
    let cache_row = CacheRows::new(input(inputs, 1)?.shape(), batch, seq);
    let interleaved = ctx.int("interleaved", 0) != 0;
    let mut out = values.clone();
    for b in 0..batch {
        for s in 0..seq {
            let row = match &positions {
                Some(p) => {
                    let pos = *p
                        .get(b * seq + s)
                        .ok_or("position_ids is smaller than [batch, seq]")?;
                    usize::try_from(pos)
                        .ok()
                        .filter(|&r| r < rows)
                        .ok_or_else(|| {
                            format!("position {pos} is outside the {rows} cached positions")
                        })?
                }
                None => cache_row.of(b, s),
            };
            if row >= rows {
                return Err(format!(
                    "the caches hold {rows} rows, fewer than batch × seq"
                ));
            }
            let (c, sn) = (&cos[row * half..][..half], &sin[row * half..][..half]);
            for h in 0..heads {
                let base = if x.rank() == 4 {
                    b * heads * seq * size + h * head_stride + s * seq_stride
                } else {
                    b * seq * seq_stride + s * seq_stride + h * head_stride
                };
                for i in 0..half {
                    let (a, z) = if interleaved {
                        (base + 2 * i, base + 2 * i + 1)
                    } else {
                        (base + i, base + half + i)
                    };
                    let (x1, x2) = (values[a], values[z]);
                    out[a] = c[i] * x1 - sn[i] * x2;
                    out[z] = sn[i] * x1 + c[i] * x2;
                }
            }
        }
    }
    Ok(vec![HostTensor::f32(x.shape().to_vec(), out)])
}

/// Which cache row rotates position `s` of batch row `b` when no `position_ids` are given: the
/// caches are `[batch, seq, dim/2]`, where a batch or seq axis of 1 broadcasts, as numpy does in
/// the ONNX reference implementation. torch.onnx's dynamo exporter (opset 23) writes Llama's
/// caches with a batch axis of 1, computed once for every row.
pub(crate) struct CacheRows {
    batch_stride: usize,
    seq_stride: usize,
}

impl CacheRows {
    pub(crate) fn new(cache_shape: &[usize], batch: usize, seq: usize) -> CacheRows {
        match *cache_shape {
            [cache_batch, cache_seq, _] if cache_batch <= 1 || cache_seq <= 1 => CacheRows {
                batch_stride: if cache_batch == 1 && batch > 1 {
                    0
                } else {
                    cache_seq
                },
                seq_stride: usize::from(!(cache_seq == 1 && seq > 1)),
            },
            _ => CacheRows {
                batch_stride: seq,
                seq_stride: 1,
            },
        }
    }

    pub(crate) fn of(&self, b: usize, s: usize) -> usize {
        b * self.batch_stride + s * self.seq_stride
    }
}

/// A tensor viewed as `[batch, heads, sequence, head_size]`, row-major.
struct Heads {
    data: Vec<f32>,
    batch: usize,
    heads: usize,
    seq: usize,
    size: usize,
}

impl Heads {
    /// Input `i` in the 4-D layout; a 3-D `[batch, seq, heads·size]` input is split into `heads`.
    fn read(tensor: &HostTensor, heads: i64, what: &str) -> Result<Heads, String> {
        let data = tensor.to_f32_vec();
        match *tensor.shape() {
            [batch, heads, seq, size] => Ok(Heads {
                data,
                batch,
                heads,
                seq,
                size,
            }),
            [batch, seq, hidden] => {
                let heads = usize::try_from(heads)
                    .ok()
                    .filter(|&h| h > 0 && hidden % h == 0)
                    .ok_or_else(|| {
                        format!("{what}'s hidden size {hidden} does not split into {heads} heads")
                    })?;
                let size = hidden / heads;
                let mut out = vec![0.0; data.len()];
                for b in 0..batch {
                    for s in 0..seq {
                        for h in 0..heads {
                            let from = ((b * seq + s) * heads + h) * size;
                            let to = ((b * heads + h) * seq + s) * size;
                            out[to..to + size].copy_from_slice(&data[from..from + size]);
                        }
                    }
                }
                Ok(Heads {
                    data: out,
                    batch,
                    heads,
                    seq,
                    size,
                })
            }
            ref other => Err(format!("{what} {other:?} should be 3-D or 4-D")),
        }
    }

    fn row(&self, b: usize, h: usize, s: usize) -> &[f32] {
        let start = ((b * self.heads + h) * self.seq + s) * self.size;
        &self.data[start..start + self.size]
    }

    /// The past cache followed by these rows along the sequence.
    fn after(self, past: Option<Heads>) -> Result<Heads, String> {
        let Some(past) = past else { return Ok(self) };
        if (past.batch, past.heads, past.size) != (self.batch, self.heads, self.size) {
            return Err(
                "the past cache's batch, heads or head size differ from the new rows".into(),
            );
        }
        let seq = past.seq + self.seq;
        let mut data = Vec::with_capacity(self.batch * self.heads * seq * self.size);
        for b in 0..self.batch {
            for h in 0..self.heads {
                for s in 0..past.seq {
                    data.extend_from_slice(past.row(b, h, s));
                }
                for s in 0..self.seq {
                    data.extend_from_slice(self.row(b, h, s));
                }
            }
        }
        Ok(Heads { data, seq, ..self })
    }

    fn tensor(&self) -> HostTensor {
        HostTensor::f32(
            vec![self.batch, self.heads, self.seq, self.size],
            self.data.clone(),
        )
    }
}

/// The additive mask at `[b, h, i, j]`: `attn_mask` broadcast from the right, padded as masked
/// beyond its last dim.
struct Mask {
    values: Vec<f32>,
    shape: [usize; 4],
    boolean: bool,
}

impl Mask {
    fn new(tensor: &HostTensor) -> Result<Mask, String> {
        let rank = tensor.rank();
        if !(1..=4).contains(&rank) {
            return Err(format!(
                "attn_mask {:?} should have rank 1 to 4",
                tensor.shape()
            ));
        }
        let mut shape = [1; 4];
        shape[4 - rank..].copy_from_slice(tensor.shape());
        Ok(Mask {
            values: tensor.to_f32_vec(),
            shape,
            boolean: tensor.dtype() == pipecut_ir::graph::DType::Bool,
        })
    }

    fn at(&self, index: [usize; 4]) -> f32 {
        if index[3] >= self.shape[3] {
            return f32::NEG_INFINITY;
        }
        let mut offset = 0;
        for (axis, &i) in index.iter().enumerate() {
            let i = if self.shape[axis] == 1 { 0 } else { i };
            offset = offset * self.shape[axis] + i;
        }
        let value = self.values[offset];
        if self.boolean {
            if value != 0.0 {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        } else {
            value
        }
    }
}

/// How a score is made from a query's and a key's dot product (scale, softcap, then the bias of
/// the mask, causality, the sliding window and padding), and which stage of it
/// `qk_matmul_output_mode` reports.
struct Scoring {
    scale: f32,
    softcap: f32,
    causal: bool,
    /// The absolute position of query 0 per batch row: the past cache's length, or without one
    /// `nonpad_kv_seqlen[b] − q_len` (an external cache), else 0. Causality and the window
    /// count from there; a negative offset masks whole rows, as the reference does.
    offsets: Vec<i64>,
    /// `left_window_size`, `right_window_size` (opset 25): −1 leaves that side open.
    window: (i64, i64),
    mode: i64,
    mask: Option<Mask>,
    /// `nonpad_kv_seqlen`: keys at or past a batch's length are masked.
    nonpad: Option<Vec<i64>>,
}

impl Scoring {
    /// The additive bias of key `j` for query `i` of head `h` of batch `b`: 0 or −∞ from
    /// causality, the window and padding, plus the mask's value.
    fn bias(&self, [b, h, i, j]: [usize; 4]) -> f32 {
        let position = i as i64 + self.offsets.get(b).copied().unwrap_or(0);
        let distance = position - j as i64;
        let (left, right) = self.window;
        let hidden = (self.causal && distance < 0)
            || (left >= 0 && distance > left)
            || (right >= 0 && -distance > right)
            || self
                .nonpad
                .as_ref()
                .is_some_and(|n| n.get(b).is_some_and(|&n| j as i64 >= n));
        if hidden {
            return f32::NEG_INFINITY;
        }
        self.mask.as_ref().map_or(0.0, |m| m.at([b, h, i, j]))
    }

    /// The score of key `j` for query `i` of head `h` of batch `b` before the softmax, and its
    /// bias; `qk` receives the stage the mode reports (0 and 1: after the softcap, the raw
    /// product without one; 2: with the bias).
    fn score(&self, dot: f32, at: [usize; 4], qk: &mut f32) -> (f32, f32) {
        let mut score = dot * self.scale;
        if self.softcap > 0.0 {
            score = self.softcap * (score / self.softcap).tanh();
        }
        if self.mode == 0 || self.mode == 1 {
            *qk = score;
        }
        let bias = self.bias(at);
        score += bias;
        if self.mode == 2 {
            *qk = score;
        }
        (score, bias)
    }
}

/// The softmax of one row as the reference computes it: a row whose bias masks every key, or
/// whose scores are all −∞, gives zeros (not NaN).
fn guarded_softmax(scores: &mut [f32], all_masked: bool) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if all_masked || max == f32::NEG_INFINITY {
        scores.iter_mut().for_each(|p| *p = 0.0);
        return;
    }
    let mut sum = 0.0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }
    for score in scores.iter_mut() {
        *score /= sum;
    }
}

/// `y [batch, heads, seq, v_size]` as `[batch, seq, heads · v_size]`, the 3-D inputs' layout.
fn merge_heads(y: &[f32], q: &Heads, v_size: usize) -> HostTensor {
    let mut flat = vec![0.0f32; y.len()];
    for b in 0..q.batch {
        for h in 0..q.heads {
            for i in 0..q.seq {
                let from = ((b * q.heads + h) * q.seq + i) * v_size;
                let to = ((b * q.seq + i) * q.heads + h) * v_size;
                flat[to..to + v_size].copy_from_slice(&y[from..from + v_size]);
            }
        }
    }
    HostTensor::f32(vec![q.batch, q.seq, q.heads * v_size], flat)
}

/// Scores every query against every key as `scoring` says, softmaxes them and weighs V:
/// `y [batch, q_heads, q_seq, v_size]` and the scores `qk_matmul_output_mode` reports
/// `[batch, q_heads, q_seq, total]`. Grouped-query attention reads KV head `h / group`.
fn attend(
    q: &Heads,
    k: &Heads,
    v: &Heads,
    scoring: &Scoring,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    if q.size != k.size || q.batch != k.batch || k.batch != v.batch || k.seq != v.seq {
        return Err("Q, K and V disagree on batch, sequence or head size".into());
    }
    if k.heads == 0 || !q.heads.is_multiple_of(k.heads) || k.heads != v.heads {
        return Err(format!(
            "{} query heads do not group over {} KV heads",
            q.heads, k.heads
        ));
    }
    let group = q.heads / k.heads;
    let total = k.seq;
    let mut qk_out = vec![0.0f32; q.batch * q.heads * q.seq * total];
    let mut y = vec![0.0f32; q.batch * q.heads * q.seq * v.size];
    let mut scores = vec![0.0f32; total];
    for b in 0..q.batch {
        for h in 0..q.heads {
            let kv = h / group;
            for i in 0..q.seq {
                let query = q.row(b, h, i);
                let out_row = ((b * q.heads + h) * q.seq + i) * total;
                let mut all_masked = true;
                for (j, score) in scores.iter_mut().enumerate() {
                    let dot: f32 = query.iter().zip(k.row(b, kv, j)).map(|(a, c)| a * c).sum();
                    let bias;
                    (*score, bias) = scoring.score(dot, [b, h, i, j], &mut qk_out[out_row + j]);
                    all_masked &= bias == f32::NEG_INFINITY;
                }
                guarded_softmax(&mut scores, all_masked);
                if scoring.mode == 3 {
                    qk_out[out_row..out_row + total].copy_from_slice(&scores);
                }
                let y_row = ((b * q.heads + h) * q.seq + i) * v.size;
                for (j, &p) in scores.iter().enumerate() {
                    for (acc, &value) in y[y_row..y_row + v.size].iter_mut().zip(v.row(b, kv, j)) {
                        *acc += p * value;
                    }
                }
            }
        }
    }
    Ok((y, qk_out))
}

fn attention(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let q_tensor = input(inputs, 0)?;
    let q = Heads::read(q_tensor, ctx.int("q_num_heads", 0), "Q")?;
    let kv_heads = ctx.int("kv_num_heads", 0);
    let past = |i: usize| {
        optional(inputs, i)
            .map(|t| Heads::read(t, kv_heads, "past cache"))
            .transpose()
    };
    let k = Heads::read(input(inputs, 1)?, kv_heads, "K")?.after(past(4)?)?;
    let v = Heads::read(input(inputs, 2)?, kv_heads, "V")?.after(past(5)?)?;
    let past_len = optional(inputs, 4).map_or(0, |t| t.shape().get(2).copied().unwrap_or(0));
    let nonpad = optional(inputs, 6).map(|t| t.to_i64_vec());
    let offsets = match (&nonpad, past_len) {
        (Some(lengths), 0) => lengths.iter().map(|&n| n - q.seq as i64).collect(),
        _ => vec![past_len as i64; q.batch],
    };
    let scoring = Scoring {
        scale: match ctx.attr("scale") {
            Some(_) => ctx.float("scale", 1.0),
            None => 1.0 / (q.size as f32).sqrt(),
        },
        softcap: ctx.float("softcap", 0.0),
        causal: ctx.int("is_causal", 0) != 0,
        offsets,
        window: (
            ctx.int("left_window_size", -1),
            ctx.int("right_window_size", -1),
        ),
        mode: ctx.int("qk_matmul_output_mode", 0),
        mask: optional(inputs, 3).map(Mask::new).transpose()?,
        nonpad,
    };
    let (y, qk_out) = attend(&q, &k, &v, &scoring)?;
    let total = k.seq;
    let y = if q_tensor.rank() == 3 {
        merge_heads(&y, &q, v.size)
    } else {
        HostTensor::f32(vec![q.batch, q.heads, q.seq, v.size], y)
    };
    Ok(vec![
        y,
        k.tensor(),
        v.tensor(),
        HostTensor::f32(vec![q.batch, q.heads, q.seq, total], qk_out),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::run;
    use crate::tensor::HostTensor;
    use pipecut_ir::graph::Attribute;

    /// A quarter turn: position 1 with cos 0, sin 1 maps (x1, x2) to (−x2, x1); the element past
    /// rotary_embedding_dim stays.
    #[test]
    fn rotary_embedding_rotates_the_pairs() {
        let x = HostTensor::f32(vec![1, 1, 1, 3], vec![1.0, 2.0, 5.0]);
        let cos = HostTensor::f32(vec![2, 1], vec![1.0, 0.0]);
        let sin = HostTensor::f32(vec![2, 1], vec![0.0, 1.0]);
        let positions = HostTensor::new(vec![1, 1], crate::TensorData::I64(vec![1])).unwrap();
        let out = run(
            "RotaryEmbedding",
            vec![("rotary_embedding_dim", Attribute::Int(2))],
            &[&x, &cos, &sin, &positions],
        );
        assert_eq!(out[0].to_f32_vec(), vec![-2.0, 1.0, 5.0]);
    }

    /// Caches `[1, seq, dim/2]` without position_ids (torch.onnx's opset-23 Llama) broadcast over
    /// the batch: both batch rows rotate by the same angles, as with the cache repeated per row.
    #[test]
    fn rotary_embedding_broadcasts_a_batch_of_one_cache() {
        // x: [batch 2, heads 1, seq 2, head_size 2]
        let x = HostTensor::f32(
            vec![2, 1, 2, 2],
            vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0],
        );
        let cos = HostTensor::f32(vec![1, 2, 1], vec![1.0, 0.0]);
        let sin = HostTensor::f32(vec![1, 2, 1], vec![0.0, 1.0]);
        let out = run("RotaryEmbedding", vec![], &[&x, &cos, &sin]);
        let per_row = vec![1.0, 2.0, -4.0, 3.0];
        assert_eq!(out[0].to_f32_vec(), [per_row.clone(), per_row].concat());
        let cos2 = HostTensor::f32(vec![2, 2, 1], vec![1.0, 0.0, 1.0, 0.0]);
        let sin2 = HostTensor::f32(vec![2, 2, 1], vec![0.0, 1.0, 0.0, 1.0]);
        let repeated = run("RotaryEmbedding", vec![], &[&x, &cos2, &sin2]);
        assert_eq!(out[0].to_f32_vec(), repeated[0].to_f32_vec());
    }

    /// One query over two keys with a causal mask: the query at position 0 sees only key 0, so
    /// Y is V's first row whatever the scores; without the mask it is the softmax mix.
    #[test]
    fn causal_mask_hides_later_keys() {
        let q = HostTensor::f32(vec![1, 1, 1, 2], vec![1.0, 0.0]);
        let k = HostTensor::f32(vec![1, 1, 2, 2], vec![1.0, 0.0, 0.0, 1.0]);
        let v = HostTensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let causal = run(
            "Attention",
            vec![("is_causal", Attribute::Int(1))],
            &[&q, &k, &v],
        );
        assert_eq!(causal[0].to_f32_vec(), vec![1.0, 2.0]);
        let open = run("Attention", vec![], &[&q, &k, &v]);
        // Scores 1/√2 and 0: weights e^{0.707}/(e^{0.707}+1) ≈ 0.670 and 0.330.
        let w = (0.5f32.sqrt()).exp() / ((0.5f32.sqrt()).exp() + 1.0);
        let expected = [w * 1.0 + (1.0 - w) * 3.0, w * 2.0 + (1.0 - w) * 4.0];
        for (got, want) in open[0].to_f32_vec().iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
