//! Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
//! ConvInteger, QLinearMatMul and QLinearConv — what onnxruntime's static and dynamic
//! quantizers write.
//!
//! Specs: <https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html> and
//! <https://onnx.ai/onnx/operators/onnx__DequantizeLinear.html> (opsets 10–23: per-tensor, per-axis
//! from 13, blocked and `output_dtype` from 21), DynamicQuantizeLinear (11), MatMulInteger (10),
//! ConvInteger (10), QLinearMatMul (10–21), QLinearConv (10).
//!
//! The runtime holds 8- and 16-bit integers widened to int64 (see [`crate::tensor`]), so
//! integer arithmetic needs no sign juggling; the range a result saturates to comes from the
//! output type shape inference recorded ([`Ctx::output_dtypes`]). Rounding is half to even, as
//! the spec and onnxruntime (`nearbyint`) do. MatMulInteger accumulates exactly in int64 and
//! gives int32, wrapping as onnxruntime's int32 accumulator would. The float8 and 4-bit types
//! are refused with their name: the runtime has no storage for them.

use super::context::{input, optional, Ctx, KernelResult, KernelTable};
use super::conv;
use super::indexing::normalize_axis;
use crate::tensor::{strides_of, HostTensor, TensorData};
use pipecut_ir::graph::DType;

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["QuantizeLinear"], quantize_linear);
    t.add(&["DequantizeLinear"], dequantize_linear);
    t.add(&["DynamicQuantizeLinear"], dynamic_quantize_linear);
    t.add(&["MatMulInteger"], matmul_integer);
    t.add(&["QLinearMatMul"], qlinear_matmul);
    t.add(&["ConvInteger"], conv_integer);
    t.add(&["QLinearConv"], qlinear_conv);
    t.add_in("com.microsoft", &["MatMulNBits"], matmul_nbits);
}

/// com.microsoft MatMulNBits
/// (<https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MatMulNBits>):
/// `A [..., K]` times `Wᵀ`, where `W [N, K]` is stored as `B [N, K/block, block·bits/8]` uint8
/// with `bits`-bit values packed low bits first, one `scales` entry per (column, block) and zero
/// points packed the same way (or as floats; default `2^(bits-1)`), plus an optional `bias [N]`.
/// The weights are dequantized to f32 once per call and multiplied with sgemm. `g_idx` (act-order
/// block maps) is refused by name.
fn matmul_nbits(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, packed, scales) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if optional(inputs, 4).is_some() {
        return Err("g_idx is not supported".into());
    }
    let dim = |name: &str| {
        usize::try_from(ctx.int(name, 0))
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("attribute {name} must be positive"))
    };
    let (k, n, bits, block) = (dim("K")?, dim("N")?, dim("bits")?, dim("block_size")?);
    if ![2, 4, 8].contains(&bits) {
        return Err(format!(
            "{bits}-bit weights are not supported (2, 4 and 8 are)"
        ));
    }
    if a.shape().last() != Some(&k) {
        return Err(format!("A {:?} does not have K = {k} features", a.shape()));
    }
    let blocks = k.div_ceil(block);
    let blob = block * bits / 8;
    if packed.len() != n * blocks * blob || scales.len() != n * blocks {
        return Err(format!(
            "B {:?} / scales {:?} do not hold {n} columns of {blocks} blocks of {block}",
            packed.shape(),
            scales.shape()
        ));
    }
    let per_byte = 8 / bits;
    let mask = (1i64 << bits) - 1;
    let unpack = |bytes: &[i64], index: usize| {
        (bytes[index / per_byte] >> ((index % per_byte) * bits)) & mask
    };
    let zero_point: Box<dyn Fn(usize, usize) -> f32> = match optional(inputs, 3) {
        None => Box::new(|_, _| (1i64 << (bits - 1)) as f32),
        Some(z) if z.dtype().is_float() => {
            let z = z.to_f32_vec();
            if z.len() != n * blocks {
                return Err("float zero points need one per column and block".into());
            }
            Box::new(move |col, b| z[col * blocks + b])
        }
        Some(z) => {
            let z = z.to_i64_vec();
            let row = (blocks * bits).div_ceil(8);
            if z.len() != n * row {
                return Err(format!(
                    "{} packed zero points for {n} columns of {blocks} blocks",
                    z.len()
                ));
            }
            Box::new(move |col, b| unpack(&z[col * row..(col + 1) * row], b) as f32)
        }
    };
    let (q, s) = (packed.to_i64_vec(), scales.to_f32_vec());
    let mut weights = vec![0.0f32; n * k];
    for col in 0..n {
        for b in 0..blocks {
            let (scale, zero) = (s[col * blocks + b], zero_point(col, b));
            let bytes = &q[(col * blocks + b) * blob..][..blob];
            for i in 0..block.min(k - b * block) {
                weights[col * k + b * block + i] = (unpack(bytes, i) as f32 - zero) * scale;
            }
        }
    }
    let rows = a.len() / k;
    let mut out = vec![0.0f32; rows * n];
    if let Some(bias) = optional(inputs, 5) {
        let bias = bias.to_f32_vec();
        if bias.len() != n {
            return Err(format!("bias has {} entries for {n} columns", bias.len()));
        }
        out.chunks_mut(n).for_each(|r| r.copy_from_slice(&bias));
    }
    let beta = if optional(inputs, 5).is_some() {
        1.0
    } else {
        0.0
    };
    super::matmul::sgemm(
        rows,
        k,
        n,
        1.0,
        a.as_f32()?,
        (k, 1),
        &weights,
        (1, k),
        beta,
        &mut out,
    );
    let mut shape = a.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    Ok(vec![HostTensor::f32(shape, out)])
}

/// The saturation range of an integer quantized type.
fn int_range(dtype: DType) -> Result<(i64, i64), String> {
    Ok(match dtype {
        DType::U4 => (0, 15),
        DType::I4 => (-8, 7),
        DType::U2 => (0, 3),
        DType::I2 => (-2, 1),
        DType::U8 => (0, u8::MAX as i64),
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        other => {
            return Err(format!(
                "quantized type {other} is not supported by the CPU runtime"
            ))
        }
    })
}

/// The type a quantizing op writes: what shape inference recorded for output 0, else
/// `output_dtype` (opset 21+), else uint8 when there is no zero point (the spec's default).
fn quantized_output_type(ctx: &Ctx, zero_point: Option<&HostTensor>) -> Result<DType, String> {
    if let Some(Some(dtype)) = ctx.output_dtypes.first() {
        return Ok(*dtype);
    }
    let code = ctx.int("output_dtype", 0);
    if code != 0 {
        return DType::from_onnx(code as i32)
            .ok_or_else(|| format!("output_dtype {code} is not an ONNX type"));
    }
    match zero_point {
        None => Ok(DType::U8),
        Some(_) => Err("the output type is unknown (run shape inference first)".into()),
    }
}

/// Integer data in the runtime's representation of `dtype`.
fn int_tensor(shape: Vec<usize>, values: Vec<i64>, dtype: DType) -> HostTensor {
    // Saturated to `dtype`'s range by the caller: the narrowing casts are exact.
    let data = match crate::tensor::runtime_dtype(dtype) {
        DType::I32 => TensorData::I32(values.into_iter().map(|v| v as i32).collect()),
        DType::U8 => TensorData::U8(values.into_iter().map(|v| v as u8).collect()),
        DType::I8 => TensorData::I8(values.into_iter().map(|v| v as i8).collect()),
        _ => TensorData::I64(values),
    };
    HostTensor::with_data(shape, data)
}

/// For each element of a tensor of `shape`, the offset of its quantization parameter in
/// `param`: one value (per tensor), a 1-D tensor along `axis` (per axis), or a tensor of the
/// same rank whose `axis` dim is `ceil(shape[axis] / block_size)` (blocked).
pub(crate) fn param_offsets(
    shape: &[usize],
    param: &HostTensor,
    axis: i64,
    block_size: usize,
    what: &str,
) -> Result<Vec<usize>, String> {
    let total: usize = shape.iter().product();
    if param.len() == 1 {
        return Ok(vec![0; total]);
    }
    let axis = normalize_axis(axis, shape.len())?;
    let inner: usize = shape[axis + 1..].iter().product();
    if block_size == 0 {
        if param.rank() != 1 || param.len() != shape[axis] {
            return Err(format!(
                "{what} {:?} is neither per tensor nor per axis {axis} of {shape:?}",
                param.shape()
            ));
        }
        return Ok((0..total).map(|i| (i / inner) % shape[axis]).collect());
    }
    let blocks = shape[axis].div_ceil(block_size);
    let expected: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if d == axis { blocks } else { n })
        .collect();
    if param.shape() != expected.as_slice() {
        return Err(format!(
            "blocked {what} is {:?} but {shape:?} with block size {block_size} needs {expected:?}",
            param.shape()
        ));
    }
    let strides = strides_of(shape);
    let param_strides = strides_of(param.shape());
    Ok((0..total)
        .map(|i| {
            (0..shape.len())
                .map(|d| {
                    let coord = (i / strides[d]) % shape[d];
                    let coord = if d == axis { coord / block_size } else { coord };
                    coord * param_strides[d]
                })
                .sum()
        })
        .collect())
}

pub(crate) fn block_size(ctx: &Ctx) -> Result<usize, String> {
    usize::try_from(ctx.int("block_size", 0))
        .map_err(|_| "block_size must not be negative".to_string())
}

/// QuantizeLinear: `y = saturate(round(x / scale) + zero_point)`.
fn quantize_linear(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, scale) = (input(inputs, 0)?, input(inputs, 1)?);
    let zero_point = optional(inputs, 2);
    let dtype = quantized_output_type(ctx, zero_point)?;
    if crate::narrow::is_narrow_float(dtype) {
        return quantize_to_float(ctx, x, scale, zero_point, dtype);
    }
    let (low, high) = int_range(dtype)?;
    let (axis, block) = (ctx.int("axis", 1), block_size(ctx)?);
    let scale_at = param_offsets(x.shape(), scale, axis, block, "scale")?;
    let scales = scale.to_f32_vec();
    let (zeros, zero_at) = match zero_point {
        Some(z) => (
            z.to_i64_vec(),
            param_offsets(x.shape(), z, axis, block, "zero point")?,
        ),
        None => (vec![0], vec![0; x.len()]),
    };
    let values: Vec<i64> = x
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let q = (v / scales[scale_at[i]]).round_ties_even() as i64 + zeros[zero_at[i]];
            q.clamp(low, high)
        })
        .collect();
    Ok(vec![int_tensor(x.shape().to_vec(), values, dtype)])
}

/// QuantizeLinear to a float8 (or float4) type: `saturate(x / scale + zero_point)`, rounded to
/// the format and kept as f32 ([`crate::narrow`]); the zero point is a float8 zero.
fn quantize_to_float(
    ctx: &Ctx,
    x: &HostTensor,
    scale: &HostTensor,
    zero_point: Option<&HostTensor>,
    dtype: DType,
) -> KernelResult {
    let (axis, block) = (ctx.int("axis", 1), block_size(ctx)?);
    let scale_at = param_offsets(x.shape(), scale, axis, block, "scale")?;
    let scales = scale.to_f32_vec();
    let (zeros, zero_at) = match zero_point {
        Some(z) => (
            z.to_f32_vec(),
            param_offsets(x.shape(), z, axis, block, "zero point")?,
        ),
        None => (vec![0.0], vec![0; x.len()]),
    };
    let saturate = ctx.int("saturate", 1) != 0;
    let values = x
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let shifted = v / scales[scale_at[i]] + zeros[zero_at[i]];
            crate::narrow::round_float(dtype, shifted, saturate)
        })
        .collect();
    Ok(vec![HostTensor::f32(x.shape().to_vec(), values)])
}

/// DequantizeLinear: `y = (x - zero_point) · scale`, in float32; a float8 input (kept as f32)
/// is scaled as it is.
fn dequantize_linear(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, scale) = (input(inputs, 0)?, input(inputs, 1)?);
    let (axis, block) = (ctx.int("axis", 1), block_size(ctx)?);
    if x.dtype() == DType::F32 {
        let scale_at = param_offsets(x.shape(), scale, axis, block, "scale")?;
        let scales = scale.to_f32_vec();
        let (zeros, zero_at) = match optional(inputs, 2) {
            Some(z) => (
                z.to_f32_vec(),
                param_offsets(x.shape(), z, axis, block, "zero point")?,
            ),
            None => (vec![0.0], vec![0; x.len()]),
        };
        let values = x
            .to_f32_vec()
            .iter()
            .enumerate()
            .map(|(i, &q)| (q - zeros[zero_at[i]]) * scales[scale_at[i]])
            .collect();
        return Ok(vec![HostTensor::f32(x.shape().to_vec(), values)]);
    }
    let scale_at = param_offsets(x.shape(), scale, axis, block, "scale")?;
    let scales = scale.to_f32_vec();
    let (zeros, zero_at) = match optional(inputs, 2) {
        Some(z) => (
            z.to_i64_vec(),
            param_offsets(x.shape(), z, axis, block, "zero point")?,
        ),
        None => (vec![0], vec![0; x.len()]),
    };
    let values = x
        .to_i64_vec()
        .iter()
        .enumerate()
        .map(|(i, &q)| (q - zeros[zero_at[i]]) as f32 * scales[scale_at[i]])
        .collect();
    Ok(vec![HostTensor::f32(x.shape().to_vec(), values)])
}

/// DynamicQuantizeLinear: uint8 with the range of `x` widened to include 0;
/// `scale = (max - min) / 255` (1 when the range is empty, as onnxruntime does),
/// `zero_point = saturate(round(-min / scale))`.
fn dynamic_quantize_linear(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let values = x.as_f32()?;
    let min = values.iter().copied().fold(0.0f32, f32::min);
    let max = values.iter().copied().fold(0.0f32, f32::max);
    if !(min.is_finite() && max.is_finite()) {
        return Err("the input holds a NaN or an infinity".into());
    }
    let scale = if max == min { 1.0 } else { (max - min) / 255.0 };
    let zero_point = ((0.0 - min) / scale).round_ties_even().clamp(0.0, 255.0) as i64;
    let quantized = values
        .iter()
        .map(|&v| ((v / scale).round_ties_even() as i64 + zero_point).clamp(0, 255))
        .collect();
    Ok(vec![
        int_tensor(x.shape().to_vec(), quantized, DType::U8),
        HostTensor::f32(vec![], vec![scale]),
        int_tensor(vec![], vec![zero_point], DType::U8),
    ])
}

/// A zero point that is one value, or one per row of A (`rows`) / column of B: its value for
/// index `i` along that dim.
fn zero_points(z: Option<&HostTensor>, count: usize, what: &str) -> Result<Vec<i64>, String> {
    match z {
        None => Ok(vec![0; count]),
        Some(z) if z.len() == 1 => Ok(vec![z.to_i64_vec()[0]; count]),
        Some(z) if z.rank() == 1 && z.len() == count => Ok(z.to_i64_vec()),
        Some(z) => Err(format!(
            "{what} zero point {:?} is neither one value nor {count} values",
            z.shape()
        )),
    }
}

/// `(a - a_zero) · (b - b_zero)` with MatMul's numpy semantics, exactly in int64. `a_zero` is
/// per row of A, `b_zero` per column of B.
fn integer_matmul(
    a: &HostTensor,
    b: &HostTensor,
    a_zero: Option<&HostTensor>,
    b_zero: Option<&HostTensor>,
) -> Result<(Vec<usize>, Vec<i64>), String> {
    let super::matmul::MatmulLayout {
        m,
        k,
        n,
        a_index,
        b_index,
        out_shape,
    } = super::matmul::matmul_layout(a.shape(), b.shape())?;
    let a_zero = zero_points(a_zero, m, "A")?;
    let b_zero = zero_points(b_zero, n, "B")?;
    let (av, bv) = (a.to_i64_vec(), b.to_i64_vec());
    let mut out = vec![0i64; a_index.len() * m * n];
    let mut row = vec![0i64; n];
    for (p, (&ia, &ib)) in a_index.iter().zip(&b_index).enumerate() {
        let (a_mat, b_mat) = (&av[ia * m * k..][..m * k], &bv[ib * k * n..][..k * n]);
        for i in 0..m {
            row.iter_mut().for_each(|r| *r = 0);
            for (kk, &x) in a_mat[i * k..(i + 1) * k].iter().enumerate() {
                let x = x - a_zero[i];
                for ((r, &w), &z) in row
                    .iter_mut()
                    .zip(&b_mat[kk * n..(kk + 1) * n])
                    .zip(&b_zero)
                {
                    *r += x * (w - z);
                }
            }
            out[(p * m + i) * n..][..n].copy_from_slice(&row);
        }
    }
    Ok((out_shape, out))
}

/// MatMulInteger: the int32 product of zero-point-shifted integer matrices.
fn matmul_integer(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let (shape, values) = integer_matmul(a, b, optional(inputs, 2), optional(inputs, 3))?;
    Ok(vec![int_tensor(shape, values, DType::I32)])
}

/// Requantizes int32 accumulators: `saturate(round(acc · multiplier[col]) + y_zero)`, where the
/// multiplier is `a_scale · b_scale[col] / y_scale` (`col` indexes the last dim, or output
/// channels for QLinearConv through `channel_of`).
fn requantize(
    ctx: &Ctx,
    accumulators: &[i64],
    multipliers: &[f32],
    channel_of: impl Fn(usize) -> usize,
    y_zero: &HostTensor,
) -> Result<Vec<i64>, String> {
    let (low, high) = int_range(quantized_output_type(ctx, Some(y_zero))?)?;
    if y_zero.len() != 1 {
        return Err("the output zero point must be one value".into());
    }
    let zero = y_zero.to_i64_vec()[0];
    Ok(accumulators
        .iter()
        .enumerate()
        .map(|(i, &acc)| {
            let scaled = (acc as f32 * multipliers[channel_of(i)]).round_ties_even() as i64;
            (scaled + zero).clamp(low, high)
        })
        .collect())
}

/// `a_scale · b_scale[c] / y_scale` for each of `channels` channels (b_scale per tensor or per
/// channel).
fn multipliers(
    a_scale: &HostTensor,
    b_scale: &HostTensor,
    y_scale: &HostTensor,
    channels: usize,
) -> Result<Vec<f32>, String> {
    if a_scale.len() != 1 || y_scale.len() != 1 {
        return Err("the input and output scales must be one value each".into());
    }
    let (a, y) = (a_scale.to_f32_vec()[0], y_scale.to_f32_vec()[0]);
    let b = b_scale.to_f32_vec();
    match b.len() {
        1 => Ok(vec![a * b[0] / y; channels]),
        len if len == channels => Ok(b.iter().map(|&s| a * s / y).collect()),
        len => Err(format!("{len} weight scales for {channels} channels")),
    }
}

/// QLinearMatMul: `a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero`.
fn qlinear_matmul(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let arg = |i| input(inputs, i);
    let (a, b) = (arg(0)?, arg(3)?);
    let (shape, acc) = integer_matmul(a, b, Some(arg(2)?), Some(arg(5)?))?;
    let n = if b.rank() > 1 {
        b.shape()[b.rank() - 1]
    } else {
        1
    };
    let scales = multipliers(arg(1)?, arg(4)?, arg(6)?, n)?;
    let values = requantize(ctx, &acc, &scales, |i| i % n, arg(7)?)?;
    let dtype = quantized_output_type(ctx, Some(arg(7)?))?;
    Ok(vec![int_tensor(shape, values, dtype)])
}

/// `(x - x_zero)` and `(w - w_zero[channel])` as float32, then the float convolution. Exact
/// while every partial sum stays below 2^24 in magnitude — always for products of 8-bit
/// operands over up to 258 taps (C/group · kernel size), and for larger kernels unless the
/// operands sit near their extremes; the result is then rounded to the nearest integer.
fn shifted_conv(
    ctx: &Ctx,
    x: &HostTensor,
    w: &HostTensor,
    x_zero: Option<&HostTensor>,
    w_zero: Option<&HostTensor>,
    bias: Option<&HostTensor>,
) -> Result<HostTensor, String> {
    if w.rank() < 3 {
        return Err(format!(
            "weights {:?} should be [M, C/group, k...]",
            w.shape()
        ));
    }
    let x_zero = zero_points(x_zero, 1, "input")?[0];
    let channels = w.shape()[0];
    let w_zero = zero_points(w_zero, channels, "weight")?;
    let per_channel = w.len() / channels.max(1);
    let xf = x
        .to_i64_vec()
        .iter()
        .map(|&v| (v - x_zero) as f32)
        .collect();
    let wf = w
        .to_i64_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| (v - w_zero[i / per_channel]) as f32)
        .collect();
    let xf = HostTensor::f32(x.shape().to_vec(), xf);
    let wf = HostTensor::f32(w.shape().to_vec(), wf);
    let bias = bias.map(|b| HostTensor::f32(b.shape().to_vec(), b.to_f32_vec()));
    let mut out = conv::conv(ctx, &[Some(&xf), Some(&wf), bias.as_ref()])?;
    Ok(out.remove(0))
}

/// ConvInteger: `x, w, x_zero?, w_zero?` → int32.
fn conv_integer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let y = shifted_conv(ctx, x, w, optional(inputs, 2), optional(inputs, 3), None)?;
    let values = y.as_f32()?.iter().map(|&v| v.round() as i64).collect();
    Ok(vec![int_tensor(y.shape().to_vec(), values, DType::I32)])
}

/// QLinearConv: `x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias?` (bias int32 in
/// the accumulator's scale).
fn qlinear_conv(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let arg = |i| input(inputs, i);
    let (x, w) = (arg(0)?, arg(3)?);
    let y = shifted_conv(ctx, x, w, Some(arg(2)?), Some(arg(5)?), optional(inputs, 8))?;
    let channels = w.shape()[0];
    let plane: usize = y.shape()[2..].iter().product();
    let scales = multipliers(arg(1)?, arg(4)?, arg(6)?, channels)?;
    let acc: Vec<i64> = y.as_f32()?.iter().map(|&v| v.round() as i64).collect();
    let values = requantize(
        ctx,
        &acc,
        &scales,
        |i| (i / plane.max(1)) % channels,
        arg(7)?,
    )?;
    let dtype = quantized_output_type(ctx, Some(arg(7)?))?;
    Ok(vec![int_tensor(y.shape().to_vec(), values, dtype)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, f, i, node};
    use super::super::{call, lookup, Ctx};
    use crate::tensor::{HostTensor, TensorData};
    use pipecut_ir::graph::DType;

    fn run_typed(op: &str, out: DType, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, String> {
        let n = node(op, vec![]);
        let dtypes = [Some(out)];
        let ctx = Ctx {
            node: &n,
            opset: 19,
            output_dtypes: &dtypes,
            input_dtypes: &[],
        };
        let inputs: Vec<_> = inputs.iter().map(|t| Some(*t)).collect();
        call(lookup("", op).unwrap(), &ctx, &inputs)
    }

    #[test]
    fn quantize_saturates_to_the_output_type_and_rounds_half_to_even() {
        let x = f(&[4], &[2.5, 3.5, -300.0, 300.0]);
        let out = run_typed(
            "QuantizeLinear",
            DType::I8,
            &[&x, &f(&[], &[1.0]), &i(&[], &[0])],
        )
        .unwrap();
        assert_eq!(out[0].data(), &TensorData::I8(vec![2, 4, -128, 127]));
        let out = run_typed(
            "QuantizeLinear",
            DType::U8,
            &[&x, &f(&[], &[1.0]), &i(&[], &[0])],
        )
        .unwrap();
        assert_eq!(out[0].data(), &TensorData::U8(vec![2, 4, 0, 255]));
        // Dequantized from the bytes themselves.
        let back = run_typed(
            "DequantizeLinear",
            DType::F32,
            &[&out[0], &f(&[], &[0.5]), &i(&[], &[0])],
        )
        .unwrap();
        assert_eq!(back[0].as_f32().unwrap(), &[1.0, 2.0, 0.0, 127.5]);
        // float8 E4M3FN: 2.5 and 3.5 are representable; ±300 round to ±288 (spacing 32 in
        // [256, 448]); saturation keeps ±448 for larger values.
        let out = run_typed("QuantizeLinear", DType::F8E4M3FN, &[&x, &f(&[], &[1.0])]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[2.5, 3.5, -288.0, 288.0]);
        let big = f(&[2], &[1000.0, -1000.0]);
        let out = run_typed("QuantizeLinear", DType::F8E4M3FN, &[&big, &f(&[], &[1.0])]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[448.0, -448.0]);
    }

    #[test]
    fn per_axis_dequantize_and_integer_matmul() {
        let x = i(&[2, 2], &[10, 20, 30, 40]);
        let out = run_typed(
            "DequantizeLinear",
            DType::F32,
            &[&x, &f(&[2], &[0.5, 2.0]), &i(&[2], &[10, 0])],
        )
        .unwrap();
        assert_close(&out[0], &[2, 2], &[0.0, 40.0, 10.0, 80.0]);
        let a = i(&[1, 2], &[3, 4]);
        let b = i(&[2, 1], &[5, 6]);
        let out = run_typed(
            "MatMulInteger",
            DType::I32,
            &[&a, &b, &i(&[], &[1]), &i(&[], &[2])],
        )
        .unwrap();
        assert_eq!(out[0].dtype(), DType::I32);
        assert_eq!(out[0].to_i64_vec(), vec![2 * 3 + 3 * 4]);
    }
}
