//! Shape rules of the `com.microsoft` ops onnxruntime's quantizer writes
//! (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md>):
//! `quantize_dynamic` (DynamicQuantizeLSTM, QAttention; DynamicQuantizeMatMul and
//! MatMulIntegerToFloat where its graph optimizer fuses MatMulInteger), and `quantize_static` in
//! the QOperator format (QGemm, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
//! QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat). Operands come
//! with their scales and zero points, so each rule names which inputs are the operands; an
//! output takes its zero point's type (quantized) or its scale's (float).

use super::context::{broadcast, normalize_axis, same_shape, Inferred, OpCtx, RuleResult};
use super::linalg::{gemm_shape, matmul_shape};
use super::registry::Registry;
use crate::graph::{DType, Dim};

const MS: &str = "com.microsoft";

pub(super) fn register(r: &mut Registry) {
    r.add(MS, &["DynamicQuantizeMatMul"], float_matmul);
    r.add(MS, &["MatMulIntegerToFloat"], integer_to_float_matmul);
    r.add(MS, &["QGemm"], qgemm);
    r.add(MS, &["QAttention"], qattention);
    r.add(MS, &["QLinearAdd", "QLinearMul"], qlinear_binary);
    r.add(
        MS,
        &["QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax"],
        qlinear_unary,
    );
    r.add(MS, &["QLinearGlobalAveragePool"], qlinear_global_pool);
    r.add(MS, &["QLinearAveragePool"], qlinear_pool);
    r.add(MS, &["QLinearConcat"], qlinear_concat);
}

/// DynamicQuantizeMatMul: float `A` times int8 `B` (inputs 0, 1), a float product.
fn float_matmul(ctx: &OpCtx) -> RuleResult {
    let shape = matmul_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

/// MatMulIntegerToFloat: integer `A` times `B` (inputs 0, 1), in the type of A's scale
/// (input 2: float or float16).
fn integer_to_float_matmul(ctx: &OpCtx) -> RuleResult {
    let shape = matmul_shape(ctx, ctx.shape(0)?, ctx.shape(1)?)?;
    Ok(vec![Inferred::new(ctx.dtype(2)?, shape)])
}

/// QGemm: `A` (input 0) and `B` (input 3) as Gemm; quantized to `y_zero_point`'s type (input
/// 8) when `y_scale` is given, else float.
fn qgemm(ctx: &OpCtx) -> RuleResult {
    let shape = gemm_shape(ctx, ctx.shape(0)?, ctx.shape(3)?)?;
    let dtype = match (ctx.opt_input(7), ctx.opt_input(8)) {
        (Some(_), Some(zero_point)) => zero_point.dtype,
        (Some(_), None) => ctx.dtype(0)?,
        (None, _) => DType::F32,
    };
    Ok(vec![Inferred::new(dtype, shape)])
}

/// QAttention: `[batch, seq, hidden]` quantized input, weights `[hidden, 3 · hidden]`, float
/// bias `[3 · hidden]` (input 2); the output `[batch, seq, hidden]` in the bias's type, and
/// with a past state (input 8, `[2, batch, heads, past, head]`) the present one.
fn qattention(ctx: &OpCtx) -> RuleResult {
    let x = ctx.shape(0)?;
    let [batch, seq, _] = x.as_slice() else {
        return Err(format!(
            "the input must be [batch, seq, hidden], not rank {}",
            x.len()
        ));
    };
    let bias = ctx.shape(2)?;
    let hidden = match bias.as_slice() {
        [Dim::Known(n)] if n.is_multiple_of(3) => Dim::Known(n / 3),
        [other] => return Err(format!("the bias has {other} values, not 3 · hidden")),
        _ => return Err("the bias must be 1-D".into()),
    };
    let dtype = ctx.dtype(2)?;
    let mut out = vec![Inferred::new(
        dtype,
        vec![batch.clone(), seq.clone(), hidden],
    )];
    if ctx.output_count() > 1 {
        let past = ctx
            .shape(8)
            .map_err(|_| "a present output needs the past input")?;
        let [two, _, heads, past_len, head] = past.as_slice() else {
            return Err("the past must be [2, batch, heads, past, head]".into());
        };
        let total = match (past_len, seq) {
            (Dim::Known(p), Dim::Known(s)) => Dim::Known(p + s),
            _ => ctx.data_dependent_dim(1, 3),
        };
        let present = vec![
            two.clone(),
            batch.clone(),
            heads.clone(),
            total,
            head.clone(),
        ];
        out.push(Inferred::new(dtype, present));
    }
    Ok(out)
}

/// QLinearAdd, QLinearMul: `A` (input 0) and `B` (input 3) broadcast, in A's type.
fn qlinear_binary(ctx: &OpCtx) -> RuleResult {
    let shape = broadcast(&[ctx.shape(0)?, ctx.shape(3)?], ctx, 0)?;
    Ok(vec![Inferred::new(ctx.dtype(0)?, shape)])
}

/// QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax: elementwise on input 0.
fn qlinear_unary(ctx: &OpCtx) -> RuleResult {
    same_shape(ctx, ctx.dtype(0)?)
}

/// Refuses `channels_last`, the NHWC layout the pooling rules below do not read.
fn channels_first(ctx: &OpCtx) -> Result<(), String> {
    match ctx.int_attr_or("channels_last", 0)? {
        0 => Ok(()),
        _ => Err("channels_last = 1 (NHWC) is not supported".into()),
    }
}

/// QLinearGlobalAveragePool: GlobalAveragePool on input 0 (NCHW).
fn qlinear_global_pool(ctx: &OpCtx) -> RuleResult {
    channels_first(ctx)?;
    super::nn::global_pool(ctx)
}

/// QLinearAveragePool: AveragePool on input 0 (NCHW), with its attributes.
fn qlinear_pool(ctx: &OpCtx) -> RuleResult {
    channels_first(ctx)?;
    let mut out = super::nn::pool(ctx)?;
    out.truncate(1);
    Ok(out)
}

/// QLinearConcat: inputs `Y_scale, Y_zero_point`, then `(X, scale, zero point)` per operand;
/// the operands joined along `axis`, in the output zero point's type.
fn qlinear_concat(ctx: &OpCtx) -> RuleResult {
    let operands: Vec<_> = (2..ctx.input_count())
        .step_by(3)
        .map(|i| ctx.shape(i))
        .collect::<Result<_, _>>()?;
    let first = operands.first().ok_or("QLinearConcat needs an operand")?;
    let axis = normalize_axis(
        ctx.int_attr("axis")?.ok_or("attribute 'axis' is missing")?,
        first.len(),
    )?;
    let mut total = 0u64;
    for (i, shape) in operands.iter().enumerate() {
        if shape.len() != first.len() {
            return Err(format!(
                "operand {i} has rank {}, not {}",
                shape.len(),
                first.len()
            ));
        }
        match shape[axis] {
            Dim::Known(n) => total += n,
            _ => {
                return Ok(vec![concat_of(
                    ctx,
                    first,
                    axis,
                    ctx.data_dependent_dim(0, axis),
                )?])
            }
        }
    }
    Ok(vec![concat_of(ctx, first, axis, Dim::Known(total))?])
}

fn concat_of(ctx: &OpCtx, first: &[Dim], axis: usize, along: Dim) -> Result<Inferred, String> {
    let mut shape = first.to_vec();
    shape[axis] = along;
    Ok(Inferred::new(ctx.dtype(1)?, shape))
}
