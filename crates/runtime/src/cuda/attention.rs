//! Attention (opsets 23 to 25) and RotaryEmbedding (opset 23) on the device, with the
//! semantics of the CPU kernels in `kernels/attention.rs`.
//!
//! Attention is two strided-batched cuBLAS GEMMs around one row kernel. Grouped-query heads need
//! no copy: the query heads sharing a KV head are consecutive, so Q `[batch, q_heads, seq, d]`
//! is `[batch · kv_heads]` matrices of `group · seq` rows, each multiplied by its KV head's Kᵀ
//! (scores, scaled through the GEMM's alpha) and then its V. Between them
//! `attention_softmax_f32` applies the soft cap, adds the masks (`attn_mask`, causal, the sliding
//! window, `nonpad_kv_seqlen`) and the softmax in place (a fully masked row gives zeros), and
//! writes the `qk_matmul_output_mode` output when asked.
//! The past KV caches are joined to the new keys and values along the sequence (the present
//! outputs). A 3-D `[batch, seq, heads · d]` operand is split into heads with one strided copy,
//! and the 3-D output joined back the same way.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::gpu::{contiguous_strides, cuda_error, numel, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{Ctx, RotaryCacheRows};
use pipecut_ir::graph::DType;

/// A device tensor viewed as `[batch, heads, seq, size]`, contiguous.
pub(super) struct Heads {
    pub(super) tensor: DeviceTensor,
    pub(super) batch: usize,
    pub(super) heads: usize,
    pub(super) seq: usize,
    pub(super) size: usize,
}

impl Heads {
    /// A 4-D tensor as it is; a 3-D `[batch, seq, heads · size]` one split into `heads` (the
    /// attribute; `None` when it does not divide the hidden size).
    fn of(gpu: &Gpu, x: DeviceTensor, heads: i64) -> Result<Option<Heads>, String> {
        match *x.shape.as_slice() {
            [batch, heads, seq, size] => Ok(Some(Heads {
                tensor: x,
                batch,
                heads,
                seq,
                size,
            })),
            [batch, seq, hidden] => {
                let Some(heads) = usize::try_from(heads)
                    .ok()
                    .filter(|&h| h > 0 && hidden % h == 0)
                else {
                    return Ok(None);
                };
                let size = hidden / heads;
                let shape = vec![batch, heads, seq, size];
                let strides = [(seq * hidden) as i64, size as i64, hidden as i64, 1];
                let data = gpu.gather_strided(&x.data, &shape, &strides, 0)?;
                Ok(Some(Heads {
                    tensor: DeviceTensor::new(shape, data),
                    batch,
                    heads,
                    seq,
                    size,
                }))
            }
            _ => Ok(None),
        }
    }

    /// The past cache followed by these rows along the sequence (`None` when they disagree).
    fn after(self, gpu: &Gpu, past: Option<Heads>) -> Result<Option<Heads>, String> {
        let Some(past) = past else {
            return Ok(Some(self));
        };
        if (past.batch, past.heads, past.size) != (self.batch, self.heads, self.size) {
            return Ok(None);
        }
        let seq = past.seq + self.seq;
        let shape = vec![self.batch, self.heads, seq, self.size];
        let mut out = gpu.alloc(numel(&shape))?;
        let outer = (self.batch * self.heads) as i64;
        let out_inner = (seq * self.size) as i64;
        let parts = [(&past, 0), (&self, past.seq * self.size)];
        for (part, offset) in parts {
            let in_inner = (part.seq * part.size) as i64;
            let offset = offset as i64;
            let mut launch = gpu.stream.launch_builder(&gpu.functions.copy_block);
            launch
                .arg(&*part.tensor.data)
                .arg(&mut out)
                .arg(&outer)
                .arg(&in_inner)
                .arg(&out_inner)
                .arg(&offset);
            // SAFETY: argument types match `copy_block_f32`; the past fills each row's first
            // `past.seq · size` columns, the new rows the rest.
            unsafe { launch.launch(Gpu::grid(numel(&part.tensor.shape))) }
                .map_err(cuda_error("launch"))?;
        }
        Ok(Some(Heads {
            tensor: DeviceTensor::new(shape, out),
            seq,
            ..self
        }))
    }
}

/// `attn_mask` as additive floats on the device and its element strides along batch, head and
/// query (0 where it broadcasts) and its length along the keys. A boolean mask (false masks) is
/// made additive on the host, where booleans live.
pub(super) struct Mask {
    pub(super) values: Arc<CudaSlice<f32>>,
    pub(super) strides: [i64; 3],
    pub(super) cols: usize,
}

impl Mask {
    fn of(gpu: &Gpu, args: &[Option<Value>]) -> Result<Option<Option<Mask>>, String> {
        let Some(given) = args.get(3).and_then(|a| a.as_ref()) else {
            return Ok(Some(None));
        };
        let shape = given.shape().to_vec();
        if !(1..=4).contains(&shape.len()) {
            return Ok(None);
        }
        let values = match device(gpu, args, 3)? {
            Some(t) => t.data,
            None => {
                let Some(mask) = host(gpu, args, 3)? else {
                    return Ok(None);
                };
                if mask.dtype() != DType::Bool {
                    return Ok(None);
                }
                let additive: Vec<f32> = mask
                    .to_f32_vec()
                    .iter()
                    .map(|&v| if v != 0.0 { 0.0 } else { f32::NEG_INFINITY })
                    .collect();
                Arc::new(gpu.upload(&additive)?)
            }
        };
        let mut full = [1usize; 4];
        full[4 - shape.len()..].copy_from_slice(&shape);
        let strides = contiguous_strides(&full);
        let stride = |axis: usize| if full[axis] == 1 { 0 } else { strides[axis] };
        Ok(Some(Some(Mask {
            values,
            strides: [stride(0), stride(1), stride(2)],
            cols: full[3],
        })))
    }
}

/// The attributes that shape the row kernel's work.
pub(super) struct RowOptions {
    pub(super) causal: bool,
    pub(super) softcap: f32,
    pub(super) mode: i32,
    pub(super) want_qk: bool,
    pub(super) past_len: usize,
    /// `left_window_size`, `right_window_size` (opset 25); −1 leaves a side open.
    pub(super) window: (i64, i64),
}

/// [Attention](https://onnx.ai/onnx/operators/onnx__Attention.html), opsets 23–24: outputs Y,
/// present key, present value and (when the node asks) the QK output. Anything the CPU kernel
/// would reject (disagreeing shapes, heads that do not divide) is left to it, to say why.
pub(super) fn attention(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(q3), Some(k), Some(v)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let q_rank = q3.shape.len();
    let kv_heads = ctx.int("kv_num_heads", 0);
    let Some(q) = Heads::of(gpu, q3, ctx.int("q_num_heads", 0))? else {
        return Ok(None);
    };
    let mut past = [None, None];
    for (slot, i) in past.iter_mut().zip([4, 5]) {
        if args.get(i).is_some_and(|a| a.is_some()) {
            let Some(t) = device(gpu, args, i)? else {
                return Ok(None);
            };
            let Some(heads) = Heads::of(gpu, t, kv_heads)? else {
                return Ok(None);
            };
            *slot = Some(heads);
        }
    }
    let past_len = past[0].as_ref().map_or(0, |p| p.seq);
    let [past_k, past_v] = past;
    let (Some(k), Some(v)) = (Heads::of(gpu, k, kv_heads)?, Heads::of(gpu, v, kv_heads)?) else {
        return Ok(None);
    };
    let (Some(k), Some(v)) = (k.after(gpu, past_k)?, v.after(gpu, past_v)?) else {
        return Ok(None);
    };
    let agree = q.size == k.size && q.batch == k.batch && k.batch == v.batch && k.seq == v.seq;
    if !agree || k.heads == 0 || q.heads % k.heads != 0 || k.heads != v.heads {
        return Ok(None);
    }
    let Some(mask) = Mask::of(gpu, args)? else {
        return Ok(None);
    };
    let lengths = match host(gpu, args, 6)? {
        Some(t) if matches!(t.dtype(), DType::I64 | DType::I32) => {
            let lengths: Vec<f32> = t.to_i64_vec().iter().map(|&n| n as f32).collect();
            if lengths.len() < q.batch {
                return Ok(None);
            }
            Some(Arc::new(gpu.upload(&lengths)?))
        }
        Some(_) => return Ok(None),
        None => None,
    };
    let options = RowOptions {
        causal: ctx.int("is_causal", 0) != 0,
        softcap: ctx.float("softcap", 0.0),
        mode: ctx.int("qk_matmul_output_mode", 0) as i32,
        want_qk: ctx.node.outputs.get(3).is_some_and(|o| o.is_some()),
        past_len,
        window: (
            ctx.int("left_window_size", -1),
            ctx.int("right_window_size", -1),
        ),
    };
    let scale = match ctx.attr("scale") {
        Some(_) => ctx.float("scale", 1.0),
        None => 1.0 / (q.size as f32).sqrt(),
    };
    let (probabilities, qk) = scores(gpu, (&q, &k), scale, mask, lengths, &options)?;
    let y = weighted_values(gpu, &q, &v, &probabilities)?;
    let y = if q_rank == 3 {
        // [batch, heads, seq, dv] → [batch, seq, heads · dv].
        let [b, h, s, d] = [q.batch, q.heads, q.seq, v.size];
        let strides = [(h * s * d) as i64, d as i64, (s * d) as i64, 1];
        let data = gpu.gather_strided(&y.data, &[b, s, h, d], &strides, 0)?;
        DeviceTensor::new(vec![b, s, h * d], data)
    } else {
        y
    };
    let mut outputs = vec![
        Value::Device(y),
        Value::Device(k.tensor),
        Value::Device(v.tensor),
    ];
    if let Some(qk) = qk {
        outputs.push(Value::Device(qk));
    }
    Ok(Some(outputs))
}

/// The attention probabilities `[batch, q_heads, q_seq, total]` (and the QK output when asked):
/// scale · Q·Kᵀ per KV head through cuBLAS, then the row kernel.
pub(super) fn scores(
    gpu: &Gpu,
    (q, k): (&Heads, &Heads),
    scale: f32,
    mask: Option<Mask>,
    lengths: Option<Arc<CudaSlice<f32>>>,
    options: &RowOptions,
) -> Result<(CudaSlice<f32>, Option<DeviceTensor>), String> {
    let group = q.heads / k.heads;
    let (rows_per_kv, total) = (group * q.seq, k.seq);
    let shape = vec![q.batch, q.heads, q.seq, total];
    let mut scores = gpu.alloc(numel(&shape))?;
    gpu.gemm_views(
        (rows_per_kv, total, q.size),
        (&*q.tensor.data, false, &*k.tensor.data, true),
        &mut scores,
        (scale, 0.0),
        (
            q.batch * k.heads,
            rows_per_kv * q.size,
            total * k.size,
            rows_per_kv * total,
        ),
    )?;
    let mut qk = if options.want_qk {
        Some(gpu.alloc(numel(&shape))?)
    } else {
        None
    };
    let rows = q.batch * q.heads * q.seq;
    let [rows_i, cols, heads, seq, past] =
        [rows, total, q.heads, q.seq, options.past_len].map(|v| v as i64);
    // An absent operand is never read; Q's buffer stands in for its pointer.
    let stand_in = &*q.tensor.data;
    let (mask_values, [mask_b, mask_h, mask_i], mask_cols) = match &mask {
        Some(m) => (&*m.values, m.strides, m.cols as i64),
        None => (stand_in, [0; 3], 0),
    };
    let flags = [
        mask.is_some() as i32,
        options.causal as i32,
        lengths.is_some() as i32,
    ];
    let lengths_values = lengths.as_deref().unwrap_or(stand_in);
    let want_qk = options.want_qk as i32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.attention.softmax);
    launch.arg(&mut scores);
    match qk.as_mut() {
        Some(out) => launch.arg(out),
        None => launch.arg(stand_in),
    };
    launch
        .arg(mask_values)
        .arg(lengths_values)
        .arg(&rows_i)
        .arg(&cols)
        .arg(&heads)
        .arg(&seq)
        .arg(&past)
        .arg(&mask_b)
        .arg(&mask_h)
        .arg(&mask_i)
        .arg(&mask_cols)
        .arg(&flags[0])
        .arg(&flags[1])
        .arg(&flags[2])
        .arg(&options.softcap)
        .arg(&options.mode)
        .arg(&want_qk)
        .arg(&options.window.0)
        .arg(&options.window.1);
    // SAFETY: argument types match `attention_softmax_f32`; the mask offsets stay inside it
    // (its broadcast strides and `j < mask_cols`), the lengths hold a float per batch row, and
    // the stand-ins are read or written only under flags that are 0.
    unsafe { launch.launch(Gpu::rows(rows)) }.map_err(cuda_error("launch"))?;
    Ok((scores, qk.map(|data| DeviceTensor::new(shape, data))))
}

/// Y `[batch, q_heads, q_seq, dv]` = P·V per KV head through cuBLAS.
pub(super) fn weighted_values(
    gpu: &Gpu,
    q: &Heads,
    v: &Heads,
    probabilities: &CudaSlice<f32>,
) -> Result<DeviceTensor, String> {
    let rows_per_kv = q.heads / v.heads * q.seq;
    let shape = vec![q.batch, q.heads, q.seq, v.size];
    let mut y = gpu.alloc(numel(&shape))?;
    gpu.gemm_views(
        (rows_per_kv, v.size, v.seq),
        (probabilities, false, &*v.tensor.data, false),
        &mut y,
        (1.0, 0.0),
        (
            q.batch * v.heads,
            rows_per_kv * v.seq,
            v.seq * v.size,
            rows_per_kv * v.size,
        ),
    )?;
    Ok(DeviceTensor::new(shape, y))
}

/// [RotaryEmbedding](https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html), opset 23: the
/// cache row of every (batch, position) is found on the host, where `position_ids` are, with
/// the CPU kernel's rules; the rotation is one thread per element.
pub(super) fn rotary_embedding(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(cos), Some(sin)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let (batch, seq, heads, size, rank4) = match *x.shape.as_slice() {
        [b, h, s, d] => (b, s, h, d, true),
        [b, s, hidden] => match usize::try_from(ctx.int("num_heads", 0)) {
            Ok(h) if h > 0 && hidden % h == 0 => (b, s, h, hidden / h, false),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let rotary = match ctx.int("rotary_embedding_dim", 0) {
        0 => size,
        d => match usize::try_from(d) {
            Ok(d) if d <= size && d % 2 == 0 => d,
            _ => return Ok(None),
        },
    };
    let half = rotary / 2;
    if half == 0 || cos.shape.last() != Some(&half) || sin.shape != cos.shape {
        return Ok(None);
    }
    let cached = numel(&cos.shape) / half;
    let Some(rows) = cache_rows(gpu, args, &cos.shape, (batch, seq), cached)? else {
        return Ok(None);
    };
    launch_rotary(
        gpu,
        [&x, &cos, &sin],
        &rows,
        [seq, heads, size, rotary],
        rank4,
        ctx,
    )
}

/// Rotates `x` by the cache rows `rows` (batch · seq of them, each below the caches' row count:
/// the callers check it) with `rotary_f32`; shared by the opset-23 and com.microsoft ops.
pub(super) fn launch_rotary(
    gpu: &Gpu,
    [x, cos, sin]: [&DeviceTensor; 3],
    rows: &[i64],
    [seq, heads, size, rotary]: [usize; 4],
    rank4: bool,
    ctx: &Ctx,
) -> OpResult {
    let rows = gpu.upload(rows)?;
    let n = numel(&x.shape);
    let mut out = gpu.alloc(n)?;
    let [n_i, seq_i, heads_i, size_i, rotary_i] = [n, seq, heads, size, rotary].map(|v| v as i64);
    let (rank4, interleaved) = (rank4 as i32, (ctx.int("interleaved", 0) != 0) as i32);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.attention.rotary);
    launch
        .arg(&*x.data)
        .arg(&*cos.data)
        .arg(&*sin.data)
        .arg(&rows)
        .arg(&mut out)
        .arg(&n_i)
        .arg(&seq_i)
        .arg(&heads_i)
        .arg(&size_i)
        .arg(&rotary_i)
        .arg(&rank4)
        .arg(&interleaved);
    // SAFETY: argument types match `rotary_f32`; every cache row index is below the caches'
    // row count (the callers check it) and `rows` holds batch · seq of them.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(Some(vec![Value::Device(DeviceTensor::new(
        x.shape.clone(),
        out,
    ))]))
}

/// The cache row of each (batch, position), `[batch · seq]`: from `position_ids` when given,
/// else the caches' own layout; `None` when one falls outside the `cached` rows.
fn cache_rows(
    gpu: &Gpu,
    args: &[Option<Value>],
    cache_shape: &[usize],
    (batch, seq): (usize, usize),
    cached: usize,
) -> Result<Option<Vec<i64>>, String> {
    let rows: Vec<usize> = match host(gpu, args, 3)? {
        Some(positions) => {
            let positions = positions.to_i64_vec();
            if positions.len() < batch * seq {
                return Ok(None);
            }
            let mut rows = Vec::with_capacity(batch * seq);
            for &p in &positions[..batch * seq] {
                match usize::try_from(p) {
                    Ok(row) => rows.push(row),
                    Err(_) => return Ok(None),
                }
            }
            rows
        }
        None => {
            let layout = RotaryCacheRows::new(cache_shape, batch, seq);
            (0..batch)
                .flat_map(|b| (0..seq).map(move |s| (b, s)))
                .map(|(b, s)| layout.of(b, s))
                .collect()
        }
    };
    if rows.iter().any(|&r| r >= cached) {
        return Ok(None);
    }
    Ok(Some(rows.into_iter().map(|r| r as i64).collect()))
}
