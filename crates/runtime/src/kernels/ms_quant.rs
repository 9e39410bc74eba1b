//! CPU kernels of the `com.microsoft` ops onnxruntime's quantizer writes (the shape rules'
//! `shape/ms_quant.rs` lists them). Each dequantizes its operands (`(q − zero) · scale`), runs
//! the float op's own kernel, and quantizes the result the way QuantizeLinear does; the integer
//! matrix products (DynamicQuantizeMatMul, MatMulIntegerToFloat) accumulate in integers first,
//! as onnxruntime does. onnxruntime computes some of these with integer arithmetic or lookup
//! tables, so a quantized output may differ from it by one step where a value falls on a
//! rounding boundary; DynamicQuantizeLSTM and QAttention run in float on dequantized weights,
//! where onnxruntime also quantizes the activations (see tests/ortquant.rs for the measured
//! differences).

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use crate::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::DType;

const MS: &str = "com.microsoft";

pub(super) fn register(t: &mut KernelTable) {
    t.add_in(MS, &["QLinearAdd"], |c, i| binary(c, i, "Add"));
    t.add_in(MS, &["QLinearMul"], |c, i| binary(c, i, "Mul"));
    t.add_in(MS, &["QLinearSigmoid"], |c, i| unary(c, i, "Sigmoid"));
    t.add_in(MS, &["QLinearLeakyRelu"], |c, i| unary(c, i, "LeakyRelu"));
    t.add_in(MS, &["QLinearSoftmax"], |c, i| unary(c, i, "Softmax"));
    t.add_in(MS, &["QLinearGlobalAveragePool"], |c, i| {
        pooled(c, i, "GlobalAveragePool")
    });
    t.add_in(MS, &["QLinearAveragePool"], |c, i| {
        pooled(c, i, "AveragePool")
    });
    t.add_in(MS, &["QLinearConcat"], qlinear_concat);
    t.add_in(MS, &["QGemm"], qgemm);
    t.add_in(MS, &["DynamicQuantizeMatMul"], dynamic_quantize_matmul);
    t.add_in(MS, &["MatMulIntegerToFloat"], matmul_integer_to_float);
    t.add_in(MS, &["DynamicQuantizeLSTM"], dynamic_quantize_lstm);
    t.add_in(MS, &["QAttention"], qattention);
}

/// Runs the default-domain kernel of `op` on `inputs` with this node's attributes (the float
/// op reads the ones it shares with the quantized one: alpha, axis, kernel_shape, transA...); `opset`
/// picks the op's semantics (QLinearSoftmax names it in its `opset` attribute).
fn float_op(ctx: &Ctx, op: &str, opset: i64, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let kernel = super::lookup("", op).ok_or_else(|| format!("no CPU kernel for {op}"))?;
    // Kernels shared by several ops read which one they run from the node.
    let mut node = ctx.node.clone();
    node.op_type = op.to_string();
    node.domain.clear();
    let inner = Ctx {
        node: &node,
        opset,
        output_dtypes: &[],
    };
    kernel(&inner, inputs)
}

/// `(q − zero) · scale` for one scale and zero point per tensor, or one per channel along
/// `axis` of `q` (weights quantized per channel).
fn dequantize(
    q: &HostTensor,
    scale: &HostTensor,
    zero: Option<&HostTensor>,
    axis: usize,
) -> Result<HostTensor, String> {
    let scales = scale.to_f32_vec();
    let zeros = zero.map_or_else(|| vec![0.0], HostTensor::to_f32_vec);
    let channels = q.shape().get(axis).copied().unwrap_or(1);
    let inner: usize = q.shape().iter().skip(axis + 1).product();
    let pick = |list: &[f32], i: usize, what: &str| -> Result<f32, String> {
        match list.len() {
            1 => Ok(list[0]),
            n if n == channels => Ok(list[(i / inner.max(1)) % channels]),
            n => Err(format!("{n} {what}s for {channels} channels")),
        }
    };
    let values = q
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| Ok((v - pick(&zeros, i, "zero point")?) * pick(&scales, i, "scale")?))
        .collect::<Result<Vec<f32>, String>>()?;
    Ok(HostTensor::f32(q.shape().to_vec(), values))
}

/// `saturate(round(x / scale) + zero)`, one scale per tensor, as QuantizeLinear; the range is
/// that of the type shape inference gave the output (uint8 or int8; the runtime holds both as
/// int64), uint8 when it gave none.
fn quantize(
    ctx: &Ctx,
    x: &HostTensor,
    scale: &HostTensor,
    zero: Option<&HostTensor>,
) -> KernelResult {
    let scale = match scale.to_f32_vec().as_slice() {
        [s] => *s,
        other => {
            return Err(format!(
                "the output scale must be one value, not {}",
                other.len()
            ))
        }
    };
    let zero = zero
        .and_then(|z| z.to_i64_vec().first().copied())
        .unwrap_or(0);
    let (low, high) = match ctx.output_dtypes.first().copied().flatten() {
        Some(DType::I8) => (-128, 127),
        Some(DType::U8) | None => (0, 255),
        Some(other) => return Err(format!("quantized type {other} is not uint8 or int8")),
    };
    let values: Vec<i64> = x
        .to_f32_vec()
        .iter()
        .map(|&v| ((v / scale).round_ties_even() as i64 + zero).clamp(low, high))
        .collect();
    Ok(vec![HostTensor::new(
        x.shape().to_vec(),
        TensorData::I64(values),
    )?])
}

/// The operand at `at`, dequantized with the scale and zero point that follow it.
fn operand(inputs: &[Option<&HostTensor>], at: usize) -> Result<HostTensor, String> {
    dequantize(
        input(inputs, at)?,
        input(inputs, at + 1)?,
        optional(inputs, at + 2),
        0,
    )
}

/// QLinearAdd, QLinearMul: `A, A_scale, A_zero, B, B_scale, B_zero, C_scale, C_zero`.
fn binary(ctx: &Ctx, inputs: &[Option<&HostTensor>], op: &str) -> KernelResult {
    let (a, b) = (operand(inputs, 0)?, operand(inputs, 3)?);
    let out = float_op(ctx, op, 14, &[Some(&a), Some(&b)])?;
    quantize(ctx, &out[0], input(inputs, 6)?, optional(inputs, 7))
}

/// QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax: `X, X_scale, X_zero, Y_scale, Y_zero`.
fn unary(ctx: &Ctx, inputs: &[Option<&HostTensor>], op: &str) -> KernelResult {
    let x = operand(inputs, 0)?;
    let opset = ctx.int("opset", 13);
    let out = float_op(ctx, op, opset, &[Some(&x)])?;
    quantize(ctx, &out[0], input(inputs, 3)?, optional(inputs, 4))
}

/// QLinearGlobalAveragePool, QLinearAveragePool (NCHW): `X, X_scale, X_zero, Y_scale, Y_zero`.
fn pooled(ctx: &Ctx, inputs: &[Option<&HostTensor>], op: &str) -> KernelResult {
    if ctx.int("channels_last", 0) != 0 {
        return Err("channels_last = 1 (NHWC) is not supported".into());
    }
    unary(ctx, inputs, op)
}

/// QLinearConcat: `Y_scale, Y_zero`, then `(X, X_scale, X_zero)` per operand.
fn qlinear_concat(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let operands: Vec<HostTensor> = (2..inputs.len())
        .step_by(3)
        .map(|at| operand(inputs, at))
        .collect::<Result<_, _>>()?;
    let refs: Vec<Option<&HostTensor>> = operands.iter().map(Some).collect();
    let out = float_op(ctx, "Concat", 13, &refs)?;
    quantize(ctx, &out[0], input(inputs, 0)?, optional(inputs, 1))
}

/// QGemm: `A, a_scale, a_zero, B, b_scale, b_zero, C, y_scale, y_zero`; B per tensor or per
/// output column, C int32 in the scale `a_scale · b_scale`; a float result without `y_scale`.
fn qgemm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let a = operand(inputs, 0)?;
    let b_q = input(inputs, 3)?;
    let trans_b = ctx.int("transB", 0) != 0;
    // b_scale runs along N: B's axis 0 when transposed, else axis 1.
    let b = dequantize(
        b_q,
        input(inputs, 4)?,
        optional(inputs, 5),
        usize::from(!trans_b),
    )?;
    let bias = match optional(inputs, 6) {
        Some(c) => {
            let a_scale = input(inputs, 1)?
                .to_f32_vec()
                .first()
                .copied()
                .unwrap_or(1.0);
            let b_scales = input(inputs, 4)?;
            let c_scale = HostTensor::f32(
                b_scales.shape().to_vec(),
                b_scales.to_f32_vec().iter().map(|s| s * a_scale).collect(),
            );
            let axis = c.rank().saturating_sub(1);
            Some(dequantize(c, &c_scale, None, axis)?)
        }
        None => None,
    };
    let out = float_op(ctx, "Gemm", 13, &[Some(&a), Some(&b), bias.as_ref()])?;
    match optional(inputs, 7) {
        Some(y_scale) => quantize(ctx, &out[0], y_scale, optional(inputs, 8)),
        None => Ok(out),
    }
}

/// The integer product `(A − a_zero) · (B − b_zero)` scaled by `a_scale · b_scale` (b_scale per
/// tensor or per column), plus an optional float bias.
fn scaled_integer_matmul(
    ctx: &Ctx,
    a: &HostTensor,
    b: &HostTensor,
    zeros: [Option<&HostTensor>; 2],
    scales: [&HostTensor; 2],
    bias: Option<&HostTensor>,
) -> KernelResult {
    let product = float_op(
        ctx,
        "MatMulInteger",
        10,
        &[Some(a), Some(b), zeros[0], zeros[1]],
    )?
    .remove(0);
    let a_scale = scales[0].to_f32_vec().first().copied().unwrap_or(1.0);
    let b_scales = scales[1].to_f32_vec();
    let columns = product.shape().last().copied().unwrap_or(1).max(1);
    let biases = bias.map(HostTensor::to_f32_vec);
    let values = product
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &acc)| {
            let column = i % columns;
            let b_scale = b_scales
                .get(column)
                .or(b_scales.first())
                .copied()
                .unwrap_or(1.0);
            let add = biases
                .as_ref()
                .and_then(|b| b.get(column))
                .copied()
                .unwrap_or(0.0);
            acc * a_scale * b_scale + add
        })
        .collect();
    Ok(vec![HostTensor::f32(product.shape().to_vec(), values)])
}

/// DynamicQuantizeMatMul: `A` (float, quantized here as DynamicQuantizeLinear does), `B`,
/// `b_scale`, `b_zero_point`, `bias`.
fn dynamic_quantize_matmul(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let quantized = float_op(ctx, "DynamicQuantizeLinear", 11, &[Some(input(inputs, 0)?)])?;
    let [a, a_scale, a_zero] = quantized.as_slice() else {
        return Err("DynamicQuantizeLinear gave no scale".into());
    };
    scaled_integer_matmul(
        ctx,
        a,
        input(inputs, 1)?,
        [Some(a_zero), optional(inputs, 3)],
        [a_scale, input(inputs, 2)?],
        optional(inputs, 4),
    )
}

/// MatMulIntegerToFloat: `A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias`.
fn matmul_integer_to_float(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    scaled_integer_matmul(
        ctx,
        input(inputs, 0)?,
        input(inputs, 1)?,
        [optional(inputs, 4), optional(inputs, 5)],
        [input(inputs, 2)?, input(inputs, 3)?],
        optional(inputs, 6),
    )
}

/// DynamicQuantizeLSTM: LSTM's inputs with W `[D, I, 4H]` and R `[D, H, 4H]` int8 (transposed
/// from LSTM's) and their scales and zero points (inputs 8–11, per direction or per column):
/// the weights dequantized and transposed, then the LSTM kernel.
fn dynamic_quantize_lstm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let weight = |at: usize, scale_at: usize| -> Result<HostTensor, String> {
        let q = input(inputs, at)?;
        let [directions, rows, columns] = *q.shape() else {
            return Err(format!("weight {at} must be 3-D, not {:?}", q.shape()));
        };
        let scale = input(inputs, scale_at)?;
        let zero = optional(inputs, scale_at + 1);
        let axis = if scale.len() == directions && directions > 1 {
            0
        } else {
            2
        };
        let axis = if scale.len() == 1 { 0 } else { axis };
        let float = dequantize(q, scale, zero, axis)?.to_f32_vec();
        let mut transposed = vec![0.0_f32; float.len()];
        for d in 0..directions {
            for r in 0..rows {
                for c in 0..columns {
                    let from = (d * rows + r) * columns + c;
                    transposed[(d * columns + c) * rows + r] = float[from];
                }
            }
        }
        Ok(HostTensor::f32(vec![directions, columns, rows], transposed))
    };
    let (w, r) = (weight(1, 8)?, weight(2, 10)?);
    let mut lstm_inputs: Vec<Option<&HostTensor>> = inputs.iter().take(8).copied().collect();
    lstm_inputs[1] = Some(&w);
    lstm_inputs[2] = Some(&r);
    float_op(ctx, "LSTM", 14, &lstm_inputs)
}

/// QAttention: `input, weight, bias, input_scale, weight_scale, mask_index, input_zero_point,
/// weight_zero_point, past`: input and weight dequantized, then com.microsoft Attention
/// (`input, weights, bias, mask_index, past`).
fn qattention(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = dequantize(input(inputs, 0)?, input(inputs, 3)?, optional(inputs, 6), 0)?;
    let w_q = input(inputs, 1)?;
    let w = dequantize(
        w_q,
        input(inputs, 4)?,
        optional(inputs, 7),
        w_q.rank().saturating_sub(1),
    )?;
    let kernel = super::lookup(MS, "Attention").ok_or("no CPU kernel for Attention")?;
    let attention_inputs = [
        Some(&x),
        Some(&w),
        optional(inputs, 2),
        optional(inputs, 5),
        optional(inputs, 8),
    ];
    kernel(ctx, &attention_inputs)
}
