//! onnxruntime's `com.microsoft` fused ops that its transformer optimizer writes into BERT,
//! GPT-2 and T5-style models, on the device, with the CPU kernels' semantics
//! (`kernels/microsoft.rs`, after onnxruntime's ContribOperators document): BiasAdd, BiasGelu,
//! FastGelu, Gelu and QuickGelu (additions and `unary_f32`'s Gelu, tanh-Gelu and Swish codes),
//! SkipLayerNormalization and SkipSimplifiedLayerNormalization (the sum, then `norm_rows_f32`,
//! with the mean, inverse deviation and sum outputs). Statistics are f32 here, f64 on the CPU.
//!
//! Operands that do not fit the CPU kernel's rules (a bias of another length than the hidden
//! size, a skip that broadcasts the input larger) are left to it, which reports them.

use super::elementwise;
use super::gpu::{numel, Gpu};
use super::operands::{device, OpResult};
use super::row_ops::{normalize_rows, NormalizedRows};
use super::value::{DeviceTensor, Value};
use crate::kernels::{broadcast_shapes, Ctx};

/// `binary_f32`'s Add.
const ADD: i32 = 0;
/// `unary_f32`'s exact Gelu, tanh Gelu and Swish (`x·sigmoid(alpha·x)`).
const GELU: i32 = 10;
const GELU_TANH: i32 = 11;
const SWISH: i32 = 14;

/// Runs a `com.microsoft` node on the device when it can.
pub(super) fn run(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    match ctx.node.op_type.as_str() {
        "BiasAdd" => bias_add(gpu, args),
        "BiasGelu" | "FastGelu" | "Gelu" | "QuickGelu" => gelu_family(gpu, ctx, args),
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => {
            skip_layer_norm(gpu, ctx, args)
        }
        "Attention" => super::ms_attention::attention(gpu, ctx, args),
        "RotaryEmbedding" => super::ms_attention::rotary_embedding(gpu, ctx, args),
        "MatMulNBits" => super::nbits::matmul_nbits(gpu, ctx, args),
        _ => Ok(None),
    }
}

/// `a + b`, or `None` when `b` does not broadcast into `a`'s shape.
fn add(gpu: &Gpu, a: &DeviceTensor, b: &DeviceTensor) -> Result<Option<DeviceTensor>, String> {
    if broadcast_shapes(&[&a.shape, &b.shape]).ok().as_deref() != Some(&a.shape[..]) {
        return Ok(None);
    }
    elementwise::binary(gpu, a, b, ADD).map(Some)
}

/// Whether `param` holds one value per element of `x`'s last axis.
fn per_hidden(x: &DeviceTensor, param: &DeviceTensor) -> bool {
    numel(&param.shape) == x.shape.last().copied().unwrap_or(1)
}

/// The operand `i` when given: `Some(None)` absent, `None` given but not a float tensor.
fn optional(gpu: &Gpu, args: &[Option<Value>], i: usize) -> Option<Option<DeviceTensor>> {
    match args.get(i).and_then(|a| a.as_ref()) {
        None => Some(None),
        Some(_) => device(gpu, args, i).ok().flatten().map(Some),
    }
}

/// BiasAdd: `input + bias + skip` (bias one value per hidden unit).
fn bias_add(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(bias), Some(skip)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    if !per_hidden(&x, &bias) {
        return Ok(None);
    }
    let Some(biased) = add(gpu, &x, &bias)? else {
        return Ok(None);
    };
    Ok(add(gpu, &biased, &skip)?.map(|sum| vec![Value::Device(sum)]))
}

/// BiasGelu and Gelu (exact), FastGelu (tanh approximation) of `x` (+ bias), and QuickGelu
/// `x·sigmoid(alpha·x)` (alpha 1.702 by default).
fn gelu_family(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let op = ctx.node.op_type.as_str();
    let Some(mut x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    if matches!(op, "BiasGelu" | "FastGelu") {
        match optional(gpu, args, 1) {
            Some(Some(bias)) => match add(gpu, &x, &bias)? {
                Some(sum) => x = sum,
                None => return Ok(None),
            },
            // BiasGelu without its bias is the CPU kernel's error to report.
            Some(None) if op == "FastGelu" => {}
            _ => return Ok(None),
        }
    }
    let (code, alpha) = match op {
        "FastGelu" => (GELU_TANH, 0.0),
        "QuickGelu" => (SWISH, ctx.float("alpha", 1.702)),
        _ => (GELU, 0.0),
    };
    Ok(Some(vec![Value::Device(elementwise::unary(
        gpu,
        &x,
        code,
        (alpha, 0.0),
    )?)]))
}

/// SkipLayerNormalization (`input, skip, gamma, beta?, bias?`) and the simplified (RMS) form
/// (`input, skip, gamma, bias?`): `sum = input + skip (+ bias)` normalised over the last axis;
/// outputs `output`, `mean`, `inv_std_var` (`[..., 1]`) and `input_skip_bias_sum`. The
/// simplified form has no mean, and a node asking for one is left to the CPU kernel's error.
fn skip_layer_norm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let simplified = ctx.node.op_type == "SkipSimplifiedLayerNormalization";
    let (Some(x), Some(skip), Some(gamma)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let (beta, bias) = if simplified {
        (Some(None), optional(gpu, args, 3))
    } else {
        (optional(gpu, args, 3), optional(gpu, args, 4))
    };
    let (Some(beta), Some(bias)) = (beta, bias) else {
        return Ok(None);
    };
    let asks = |i: usize| matches!(ctx.node.outputs.get(i), Some(Some(_)));
    let params_fit = [Some(&gamma), beta.as_ref(), bias.as_ref()]
        .into_iter()
        .flatten()
        .all(|p| per_hidden(&x, p));
    if x.shape.is_empty() || !params_fit || (simplified && asks(1)) {
        return Ok(None);
    }
    let Some(mut sum) = add(gpu, &x, &skip)? else {
        return Ok(None);
    };
    if let Some(bias) = &bias {
        sum = add(gpu, &sum, bias)?.expect("a bias of the hidden size broadcasts");
    }
    let epsilon = ctx.float("epsilon", 1e-12);
    let NormalizedRows {
        out,
        mean,
        inv_deviation,
    } = normalize_rows(gpu, &sum, &gamma, beta.as_ref(), (epsilon, simplified))?;
    let mut stats_shape = x.shape.clone();
    *stats_shape.last_mut().expect("rank ≥ 1") = 1;
    Ok(Some(vec![
        Value::Device(DeviceTensor::new(x.shape.clone(), out)),
        Value::Device(DeviceTensor::new(stats_shape.clone(), mean)),
        Value::Device(DeviceTensor::new(stats_shape, inv_deviation)),
        Value::Device(sum),
    ]))
}
