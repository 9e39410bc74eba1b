//! CPU kernels of the `com.microsoft` ops onnxruntime's quantizer writes (the shape rules'
//! `shape/ms_quant.rs` lists them). Each dequantizes its operands (`(q − zero) · scale`), runs
//! the float op's own kernel, and quantizes the result the way QuantizeLinear does; the integer
//! matrix products (DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM's two)
//! quantize their float operand and accumulate in integers, as onnxruntime does. onnxruntime
//! computes some of these with integer arithmetic or lookup tables, so a quantized output may
//! differ from it by one step where a value falls on a rounding boundary; QAttention runs in
//! float on the dequantized input and weights (see tests/ortquant.rs for the measured
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
        // The float op's inputs are the dequantized floats, not the node's declared types.
        input_dtypes: &[],
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
    let signed = match ctx.output_dtypes.first().copied().flatten() {
        Some(DType::I8) => true,
        Some(DType::U8) | None => false,
        Some(other) => return Err(format!("quantized type {other} is not uint8 or int8")),
    };
    let (low, high) = if signed { (-128, 127) } else { (0, 255) };
    let values = x
        .to_f32_vec()
        .into_iter()
        .map(|v| ((v / scale).round_ties_even() as i64 + zero).clamp(low, high));
    // Clamped to the type's range just above, so the narrowing casts are exact.
    let data = if signed {
        TensorData::I8(values.map(|v| v as i8).collect())
    } else {
        TensorData::U8(values.map(|v| v as u8).collect())
    };
    Ok(vec![HostTensor::new(x.shape().to_vec(), data)?])
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

/// DynamicQuantizeLSTM (`X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale,
/// W_zero_point, R_scale, R_zero_point`; W `[D, I, 4H]` and R `[D, H, 4H]` int8, scales per
/// direction or per column): LSTM (gates i, o, f, c; sigmoid, tanh, tanh) whose two matrix
/// products quantize their float operand as onnxruntime does — X for the whole sequence, H
/// at every step, to uint8 with DynamicQuantizeLinear's range — and accumulate in integers.
/// onnxruntime quantizes a step's H in one range per chunk of batch rows, a chunk per thread
/// of its pool (`uni_directional_lstm.cc`: `batch_parallel_`), so its output depends on its
/// thread count; pipecut takes one range for the whole batch, as onnxruntime on one thread.
/// A reverse direction (and the second of `bidirectional`) runs the steps last to first.
fn dynamic_quantize_lstm(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let [steps, batch, features] = *x.shape() else {
        return Err(format!(
            "X must be [seq, batch, input], not {:?}",
            x.shape()
        ));
    };
    if optional(inputs, 4).is_some() || optional(inputs, 7).is_some() {
        return Err("sequence_lens and peepholes (P) are not supported".into());
    }
    let hidden = usize::try_from(ctx.int("hidden_size", 0))
        .ok()
        .filter(|&h| h > 0)
        .ok_or("hidden_size is required")?;
    let directions = match ctx.string("direction", "forward").as_str() {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        other => return Err(format!("direction '{other}' is not an ONNX one")),
    };
    let x_values = x.to_f32_vec();
    let mut y = vec![0.0_f32; steps * directions * batch * hidden];
    let mut last = [vec![], vec![]];
    for d in 0..directions {
        let weights =
            |at: usize, rows: usize| QuantizedWeights::of(inputs, at, d, rows, 4 * hidden);
        let (w, r) = (weights(1, features)?, weights(2, hidden)?);
        let bias = lstm_bias(optional(inputs, 3), d, hidden)?;
        let state = |at: usize| -> Vec<f32> {
            optional(inputs, at).map_or_else(
                || vec![0.0; batch * hidden],
                |t| {
                    t.to_f32_vec()
                        .into_iter()
                        .skip(d * batch * hidden)
                        .take(batch * hidden)
                        .collect()
                },
            )
        };
        let (mut h, mut c) = (state(5), state(6));
        let projected = w.product(ctx, &x_values, steps * batch)?;
        let reverse = d == 1 || ctx.string("direction", "forward") == "reverse";
        for step in 0..steps {
            let t = if reverse { steps - 1 - step } else { step };
            let recurrent = r.product(ctx, &h, batch)?;
            for b in 0..batch {
                let gate = |g: usize, k: usize| {
                    let col = g * hidden + k;
                    projected[(t * batch + b) * 4 * hidden + col]
                        + recurrent[b * 4 * hidden + col]
                        + bias[col]
                };
                for k in 0..hidden {
                    let (i, o, f, g) = (
                        sigmoid(gate(0, k)),
                        sigmoid(gate(1, k)),
                        sigmoid(gate(2, k)),
                        gate(3, k).tanh(),
                    );
                    let cell = f * c[b * hidden + k] + i * g;
                    c[b * hidden + k] = cell;
                    h[b * hidden + k] = o * cell.tanh();
                }
            }
            let at = ((t * directions + d) * batch) * hidden;
            y[at..at + batch * hidden].copy_from_slice(&h);
        }
        last[0].extend(h);
        last[1].extend(c);
    }
    let [y_h, y_c] = last;
    let state_shape = vec![directions, batch, hidden];
    Ok(vec![
        HostTensor::f32(vec![steps, directions, batch, hidden], y),
        HostTensor::f32(state_shape.clone(), y_h),
        HostTensor::f32(state_shape, y_c),
    ])
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `Wb + Rb` of direction `d` (`B` is `[D, 8H]`), zeros without B.
fn lstm_bias(bias: Option<&HostTensor>, d: usize, hidden: usize) -> Result<Vec<f32>, String> {
    let Some(bias) = bias else {
        return Ok(vec![0.0; 4 * hidden]);
    };
    let values = bias.to_f32_vec();
    let row = values
        .get(d * 8 * hidden..(d + 1) * 8 * hidden)
        .ok_or_else(|| {
            format!(
                "B has {} values, not 8 · hidden per direction",
                values.len()
            )
        })?;
    Ok((0..4 * hidden)
        .map(|k| row[k] + row[4 * hidden + k])
        .collect())
}

/// One direction's int8 weights `[rows, columns]` with their scales and zero points (per
/// tensor, per direction, or per column).
struct QuantizedWeights {
    values: Vec<i64>,
    rows: usize,
    columns: usize,
    scales: Vec<f32>,
    zeros: Vec<i64>,
}

impl QuantizedWeights {
    fn of(
        inputs: &[Option<&HostTensor>],
        at: usize,
        direction: usize,
        rows: usize,
        columns: usize,
    ) -> Result<QuantizedWeights, String> {
        let all = input(inputs, at)?.to_i64_vec();
        let values: Vec<i64> = all
            .iter()
            .copied()
            .skip(direction * rows * columns)
            .take(rows * columns)
            .collect();
        if values.len() != rows * columns {
            return Err(format!(
                "weight {at} is not [directions, {rows}, {columns}]"
            ));
        }
        // Scales and zero points: inputs 8, 9 for W (input 1), 10, 11 for R (input 2).
        let param_at = 8 + 2 * (at - 1);
        // One value per tensor, per direction, or per column of each direction.
        let per = |list: Vec<f32>| -> Result<Vec<f32>, String> {
            if list.len() == 1 {
                return Ok(list);
            }
            if let Some(columns) = list.get(direction * columns..(direction + 1) * columns) {
                return Ok(columns.to_vec());
            }
            list.get(direction)
                .map(|&v| vec![v])
                .ok_or_else(|| format!("{} scales or zero points for weight {at}", list.len()))
        };
        let scales = per(input(inputs, param_at)?.to_f32_vec())?;
        let zeros = match optional(inputs, param_at + 1) {
            Some(z) => per(z.to_f32_vec())?,
            None => vec![0.0],
        };
        Ok(QuantizedWeights {
            values,
            rows,
            columns,
            scales,
            zeros: zeros.into_iter().map(|z| z as i64).collect(),
        })
    }

    /// `a · W` for `a` of `count` rows, `a` quantized as DynamicQuantizeLinear does, in one
    /// range for all of it.
    fn product(&self, ctx: &Ctx, a: &[f32], count: usize) -> Result<Vec<f32>, String> {
        let tensor = HostTensor::f32(vec![a.len()], a.to_vec());
        let parts = float_op(ctx, "DynamicQuantizeLinear", 11, &[Some(&tensor)])?;
        let [q, scale, zero] = parts.as_slice() else {
            return Err("DynamicQuantizeLinear gave no scale".into());
        };
        let (a_scale, zero) = (scale.to_f32_vec()[0], zero.to_i64_vec()[0]);
        let quantized: Vec<i64> = q.to_i64_vec().iter().map(|v| v - zero).collect();
        let pick = |list: &[f32], c: usize| if list.len() == 1 { list[0] } else { list[c] };
        let mut out = vec![0.0_f32; count * self.columns];
        for (r, row) in quantized.chunks(self.rows.max(1)).enumerate().take(count) {
            for c in 0..self.columns {
                let zero = if self.zeros.len() == 1 {
                    self.zeros[0]
                } else {
                    self.zeros[c]
                };
                let acc: i64 = row
                    .iter()
                    .enumerate()
                    .map(|(k, &q)| q * (self.values[k * self.columns + c] - zero))
                    .sum();
                out[r * self.columns + c] = acc as f32 * a_scale * pick(&self.scales, c);
            }
        }
        Ok(out)
    }
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
