//! onnxruntime's `com.microsoft` Attention and RotaryEmbedding on the device, with the CPU
//! kernels' semantics (`kernels/ms_attention.rs`), on the opset-23 ops' device pieces
//! (`attention.rs`): the cuBLAS score and value GEMMs around `attention_softmax_f32`, and
//! `rotary_f32`.
//!
//! Attention projects `input [B, S, H_in]` by `weights [H_in, Q + K + V]` (+ `bias`) with one
//! GEMM, then splits Q, K and V into heads (and the `present` output) with strided copies of the
//! projection. Its masks are additive as on the CPU: `mask_filter_value` (not −∞) where
//! `mask_index` or `unidirectional` masks, plus `attention_bias`; they are summed into one
//! additive mask, built on the host where `mask_index` (integers) lives. A `past` state, and
//! anything the CPU kernel would reject, are left to it.

use super::attention::{launch_rotary, scores, weighted_values, Heads, Mask, RowOptions};
use super::elementwise;
use super::gpu::{contiguous_strides, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;

/// `binary_f32`'s Add.
const ADD: i32 = 0;

/// com.microsoft RotaryEmbedding: `input [B, S, H]` (heads from `num_heads`, else `H / rotary`)
/// or `[B, N, S, head]`, `position_ids [B, S]` or `[1]` (an offset added to each position),
/// `cos_cache`/`sin_cache [max_position, rotary/2]`. The cache rows are found on the host, where
/// the positions are; the rotation is `rotary_f32`.
pub(super) fn rotary_embedding(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(cos), Some(sin)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 2)?,
        device(gpu, args, 3)?,
    ) else {
        return Ok(None);
    };
    let [cached, half] = *cos.shape.as_slice() else {
        return Ok(None);
    };
    if sin.shape != cos.shape || half == 0 {
        return Ok(None);
    }
    let rotary = 2 * half;
    let (batch, heads, seq, size, rank4) = match *x.shape.as_slice() {
        [b, s, hidden] => {
            let heads = match ctx.int("num_heads", 0) {
                n if n > 0 => n as usize,
                _ => hidden / rotary,
            };
            if heads == 0 || hidden % heads != 0 {
                return Ok(None);
            }
            (b, heads, s, hidden / heads, false)
        }
        [b, n, s, h] => (b, n, s, h, true),
        _ => return Ok(None),
    };
    if rotary > size {
        return Ok(None);
    }
    let Some(positions) = host(gpu, args, 1)? else {
        return Ok(None);
    };
    let values = positions.to_i64_vec();
    let rows: Vec<i64> = if values.len() == 1 {
        (0..batch)
            .flat_map(|_| (0..seq).map(|s| values[0] + s as i64))
            .collect()
    } else if positions.shape() == [batch, seq] {
        values
    } else {
        return Ok(None);
    };
    if rows.iter().any(|&r| r < 0 || r as usize >= cached) {
        return Ok(None);
    }
    launch_rotary(
        gpu,
        [&x, &cos, &sin],
        &rows,
        [seq, heads, size, rotary],
        rank4,
        ctx,
    )
}

/// The sizes of one com.microsoft Attention node.
struct Layout {
    batch: usize,
    seq: usize,
    heads: usize,
    /// Q (= K) and V hidden sizes.
    q_size: usize,
    v_size: usize,
}

impl Layout {
    /// `None` where the CPU kernel would refuse the node (it says why).
    fn of(ctx: &Ctx, x: &[usize], w: &[usize]) -> Option<Layout> {
        let (&[batch, seq, hidden_in], &[w_rows, w_cols]) = (x, w) else {
            return None;
        };
        let heads = usize::try_from(ctx.int("num_heads", 0))
            .ok()
            .filter(|&n| n > 0)?;
        let sizes: Vec<usize> = match ctx.ints("qkv_hidden_sizes") {
            Some(s) => s
                .iter()
                .map(|&v| usize::try_from(v).ok())
                .collect::<Option<_>>()?,
            None => vec![w_cols / 3; 3],
        };
        let [q_size, k_size, v_size] = sizes[..] else {
            return None;
        };
        let fits = w_rows == hidden_in
            && q_size + k_size + v_size == w_cols
            && q_size == k_size
            && q_size % heads == 0
            && v_size % heads == 0;
        fits.then_some(Layout {
            batch,
            seq,
            heads,
            q_size,
            v_size,
        })
    }

    fn cols(&self) -> usize {
        2 * self.q_size + self.v_size
    }

    /// Q, K or V (`start` column, `size` hidden units) of the projection `[B, S, cols]` as
    /// contiguous heads `[B, N, S, size / N]`.
    fn heads(
        &self,
        gpu: &Gpu,
        qkv: &DeviceTensor,
        start: usize,
        size: usize,
    ) -> Result<Heads, String> {
        let head = size / self.heads;
        let shape = [self.batch, self.heads, self.seq, head];
        let cols = self.cols() as i64;
        let strides = [self.seq as i64 * cols, head as i64, cols, 1];
        let data = gpu.gather_strided(&qkv.data, &shape, &strides, start as i64)?;
        Ok(Heads {
            tensor: DeviceTensor::new(shape.to_vec(), data),
            batch: self.batch,
            heads: self.heads,
            seq: self.seq,
            size: head,
        })
    }
}

/// com.microsoft Attention: outputs `[B, S, V]` and `present [2, B, N, S, head]`.
pub(super) fn attention(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    if args.get(4).is_some_and(|a| a.is_some()) {
        return Ok(None);
    }
    let (Some(x), Some(w)) = (device(gpu, args, 0)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let Some(layout) = Layout::of(ctx, &x.shape, &w.shape) else {
        return Ok(None);
    };
    let (q_head, v_head) = (layout.q_size / layout.heads, layout.v_size / layout.heads);
    let wants_present = ctx.node.outputs.get(1).is_some_and(|o| o.is_some());
    if wants_present && q_head != v_head {
        return Ok(None);
    }
    let Some(qkv) = project(gpu, args, &x, &w, &layout)? else {
        return Ok(None);
    };
    let Some(mask) = additive_mask(gpu, ctx, args, &layout)? else {
        return Ok(None);
    };
    let q = layout.heads(gpu, &qkv, 0, layout.q_size)?;
    let k = layout.heads(gpu, &qkv, layout.q_size, layout.q_size)?;
    let v = layout.heads(gpu, &qkv, 2 * layout.q_size, layout.v_size)?;
    let options = RowOptions {
        causal: false,
        softcap: 0.0,
        mode: 0,
        want_qk: false,
        past_len: 0,
        window: (-1, -1),
    };
    let scale = ctx.float("scale", 1.0 / (q_head as f32).sqrt());
    let (probabilities, _) = scores(gpu, (&q, &k), scale, mask, None, &options)?;
    let y = weighted_values(gpu, &q, &v, &probabilities)?;
    // [B, N, S, v_head] → [B, S, N · v_head].
    let [b, n, s, d] = [layout.batch, layout.heads, layout.seq, v_head];
    let strides = [(n * s * d) as i64, d as i64, (s * d) as i64, 1];
    let y = gpu.gather_strided(&y.data, &[b, s, n, d], &strides, 0)?;
    let mut outputs = vec![Value::Device(DeviceTensor::new(vec![b, s, n * d], y))];
    if wants_present {
        // K and V heads straight from the projection: (t, b, n, s, d) reads column
        // q_size + t · q_size + n · head + d of row (b, s).
        let cols = layout.cols() as i64;
        let shape = [2, b, n, s, q_head];
        let strides = [
            layout.q_size as i64,
            s as i64 * cols,
            q_head as i64,
            cols,
            1,
        ];
        let present = gpu.gather_strided(&qkv.data, &shape, &strides, layout.q_size as i64)?;
        outputs.push(Value::Device(DeviceTensor::new(shape.to_vec(), present)));
    }
    Ok(Some(outputs))
}

/// The projection `input · weights (+ bias)` as `[B, S, Q + K + V]`; `None` when the bias is
/// not one float per column.
fn project(
    gpu: &Gpu,
    args: &[Option<Value>],
    x: &DeviceTensor,
    w: &DeviceTensor,
    layout: &Layout,
) -> Result<Option<DeviceTensor>, String> {
    let (rows, hidden_in, cols) = (layout.batch * layout.seq, w.shape[0], layout.cols());
    let mut qkv = gpu.alloc(rows * cols)?;
    gpu.gemm_views(
        (rows, cols, hidden_in),
        (&*x.data, false, &*w.data, false),
        &mut qkv,
        (1.0, 0.0),
        (1, rows * hidden_in, hidden_in * cols, rows * cols),
    )?;
    let qkv = DeviceTensor::new(vec![layout.batch, layout.seq, cols], qkv);
    if args.get(2).is_none_or(|a| a.is_none()) {
        return Ok(Some(qkv));
    }
    match device(gpu, args, 2)? {
        Some(bias) if bias.shape == [cols] => elementwise::binary(gpu, &qkv, &bias, ADD).map(Some),
        _ => Ok(None),
    }
}

/// Whether `mask_index` keeps (batch, query, key).
type Keeps = Box<dyn Fn(usize, usize, usize) -> bool>;

/// `mask_filter_value` where `mask_index` or `unidirectional` masks, plus `attention_bias`:
/// `Some(None)` when there is neither, `None` when a mask has a form the CPU kernel refuses.
fn additive_mask(
    gpu: &Gpu,
    ctx: &Ctx,
    args: &[Option<Value>],
    layout: &Layout,
) -> Result<Option<Option<Mask>>, String> {
    let (batch, seq) = (layout.batch, layout.seq);
    let causal = ctx.int("unidirectional", 0) != 0;
    let filter = ctx.float("mask_filter_value", -10000.0);
    let keep: Option<Keeps> = match host(gpu, args, 3)? {
        None => None,
        Some(m) if m.shape() == [batch] => {
            let ends = m.to_i64_vec();
            Some(Box::new(move |b, _, j| (j as i64) < ends[b]))
        }
        Some(m) if m.shape() == [batch, seq] => {
            let m = m.to_f32_vec();
            Some(Box::new(move |b, _, j| m[b * seq + j] != 0.0))
        }
        Some(m) if m.shape() == [batch, seq, seq] => {
            let m = m.to_f32_vec();
            Some(Box::new(move |b, i, j| m[(b * seq + i) * seq + j] != 0.0))
        }
        Some(_) => return Ok(None),
    };
    let masked = if keep.is_some() || causal {
        let mut values = vec![0.0f32; batch * seq * seq];
        for (at, value) in values.iter_mut().enumerate() {
            let (b, i, j) = (at / (seq * seq), at / seq % seq, at % seq);
            let kept = keep.as_ref().is_none_or(|k| k(b, i, j));
            if !kept || (causal && j > i) {
                *value = filter;
            }
        }
        Some(DeviceTensor::new(
            vec![batch, 1, seq, seq],
            gpu.upload(&values)?,
        ))
    } else {
        None
    };
    let bias = match args.get(5).and_then(|a| a.as_ref()) {
        None => None,
        Some(_) => match device(gpu, args, 5)? {
            Some(t) if fits_bias(&t.shape, layout) => Some(t),
            _ => return Ok(None),
        },
    };
    let total = match (masked, bias) {
        (None, None) => return Ok(Some(None)),
        (Some(m), None) => m,
        (None, Some(b)) => b,
        (Some(m), Some(b)) => elementwise::binary(gpu, &m, &b, ADD)?,
    };
    let strides = contiguous_strides(&total.shape);
    let stride = |axis: usize| {
        if total.shape[axis] == 1 {
            0
        } else {
            strides[axis]
        }
    };
    Ok(Some(Some(Mask {
        strides: [stride(0), stride(1), stride(2)],
        cols: seq,
        values: total.data,
    })))
}

/// Whether `attention_bias` is `[B|1, N|1, S, S]`.
fn fits_bias(shape: &[usize], layout: &Layout) -> bool {
    matches!(*shape, [bb, bn, bs, bt]
        if (bb == 1 || bb == layout.batch)
            && (bn == 1 || bn == layout.heads)
            && bs == layout.seq
            && bt == layout.seq)
}
