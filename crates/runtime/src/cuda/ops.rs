//! The ops the CUDA backend runs on the device, in fp32: matrix products through cuBLAS, the rest
//! through the NVRTC kernels of `kernels.cu`. [`run`] answers `Ok(None)` for a node it does not
//! take (an op without a device kernel, a non-float operand, a rank above 8, an empty tensor);
//! the executor then runs the CPU kernel on host copies, so every op the CPU runtime supports
//! runs, and the stage reports how often it fell back.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::gpu::{
    broadcast_strides, contiguous_strides, cuda_error, dims, element_dims, numel, Gpu, MAX_RANK,
};
use super::operands::{
    all_device, device, device_or_mask, expand_shape, extra_outputs, host, one, OpResult,
};
use super::value::{DeviceTensor, Value};
use super::{elementwise, index_ops, losses, masks, row_ops, window_ops};
use crate::kernels::{
    broadcast_shapes, normalize_axis, shape_tensor, transpose_perm, view_shape, Ctx,
};
use crate::tensor::HostTensor;
use pipecut_ir::graph::DType;

/// Runs the node on the device when it can.
pub(super) fn run(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let op = ctx.node.op_type.as_str();
    let ml = ctx.node.domain == "ai.onnx.ml";
    let microsoft = ctx.node.domain == "com.microsoft";
    if !ctx.node.domain.is_empty() && ctx.node.domain != "ai.onnx" && !ml && !microsoft {
        return Ok(None);
    }
    // Shape and Size read only the shape: a device tensor is not copied for them.
    if let (Some(Some(x)), "Shape" | "Size") = (args.first(), op) {
        let out = if op == "Shape" {
            shape_tensor(ctx, x.shape())
        } else {
            HostTensor::i64(vec![], vec![numel(x.shape()) as i64])
        };
        return Ok(Some(vec![Value::host(Arc::new(out))]));
    }
    if !operands_fit(op, args) {
        return Ok(None);
    }
    if ml {
        return super::ml::run(gpu, ctx, args);
    }
    if microsoft {
        return super::microsoft::run(gpu, ctx, args);
    }
    if let Some(code) = unary_code(ctx, op) {
        return unary(gpu, ctx, args, code);
    }
    if let Some(code) = binary_code(ctx, op).filter(|_| args.len() == 2) {
        return binary(gpu, args, code);
    }
    by_op_type(gpu, ctx, op, args)
}

/// Whether the operands suit the kernels: empty or over-ranked ones are left to the CPU kernels
/// (Resize's roi, scales and sizes are read on the host, where an empty one means "not given";
/// Concat skips empty parts and Split makes them on the host, where an empty tensor costs
/// nothing). CastLike's second input gives only its type (often an empty tensor).
fn operands_fit(op: &str, args: &[Option<Value>]) -> bool {
    let tensors = if matches!(op, "Resize" | "Upsample" | "CastLike") {
        &args[..args.len().min(1)]
    } else {
        args
    };
    let empty_allowed = matches!(op, "Concat" | "Split");
    tensors.iter().flatten().all(|v| {
        let shape = v.shape();
        shape.len() <= MAX_RANK && (!shape.contains(&0) || empty_allowed)
    })
}

/// The device op of a default-domain node that is neither a plain unary nor a plain binary
/// element-wise op.
fn by_op_type(gpu: &Gpu, ctx: &Ctx, op: &str, args: &[Option<Value>]) -> OpResult {
    match op {
        "MatMul" => matmul(gpu, args),
        "Gemm" => gemm(gpu, ctx, args),
        "Where" => where_op(gpu, args),
        "Identity" => alias(gpu, args, None),
        "Dropout" => dropout(gpu, ctx, args),
        "Cast" | "CastLike" => masks::cast(gpu, ctx, args),
        "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Equal" | "And" | "Or" | "Xor" => {
            masks::compare(gpu, op, args)
        }
        "IsNaN" | "IsInf" | "Not" => masks::test(gpu, ctx, op, args),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => reshape(gpu, ctx, args),
        "Transpose" => transpose(gpu, ctx, args),
        "Expand" => expand(gpu, args),
        "Concat" => concat(gpu, ctx, args),
        "Slice" => slice(gpu, ctx, args),
        "Split" => split(gpu, ctx, args),
        "Gather" => gather(gpu, ctx, args),
        "GatherElements" => index_ops::gather_elements(gpu, ctx, args),
        "GatherND" => index_ops::gather_nd(gpu, ctx, args),
        "ScatterND" | "ScatterElements" | "Scatter" => index_ops::scatter(gpu, ctx, args),
        "Sum" | "Mean" | "Max" | "Min" => variadic(gpu, op, args),
        "Softmax" | "LogSoftmax" | "Hardmax" => row_ops::softmax(gpu, ctx, args),
        "LayerNormalization" => row_ops::norm(gpu, ctx, args, false),
        "RMSNormalization" => row_ops::norm(gpu, ctx, args, true),
        "InstanceNormalization" | "GroupNormalization" => row_ops::channel_norm(gpu, ctx, args),
        "ArgMax" | "ArgMin" => row_ops::arg_reduce(gpu, ctx, args),
        "CumSum" => row_ops::cumsum(gpu, ctx, args),
        "LRN" => row_ops::lrn(gpu, ctx, args),
        "DepthToSpace" | "SpaceToDepth" => depth_space(gpu, ctx, args),
        "Einsum" => einsum(gpu, ctx, args),
        "LpNormalization" => lp_normalization(gpu, ctx, args),
        "NegativeLogLikelihoodLoss" => losses::loss(gpu, ctx, args, false),
        "SoftmaxCrossEntropyLoss" => losses::loss(gpu, ctx, args, true),
        "DequantizeLinear" => super::quant::dequantize_linear(gpu, ctx, args),
        "DFT" => super::spectral::dft(gpu, ctx, args),
        "Det" => super::linalg::det(gpu, args),
        "STFT" => super::spectral::stft(gpu, ctx, args),
        "Tile" => super::layout_ops::tile(gpu, args),
        "Trilu" => super::layout_ops::trilu(gpu, ctx, args),
        "Compress" => super::layout_ops::compress(gpu, ctx, args),
        "CenterCropPad" => super::layout_ops::center_crop_pad(gpu, ctx, args),
        "AffineGrid" => super::layout_ops::affine_grid(gpu, ctx, args),
        "TopK" => super::top_k::top_k(gpu, ctx, args),
        "Col2Im" => super::layout_ops::col2im(gpu, ctx, args),
        "OneHot" => super::layout_ops::one_hot(gpu, ctx, args),
        "MelWeightMatrix" => super::mel_weights::mel_weight_matrix(gpu, args),
        "Bernoulli" => super::random::bernoulli(gpu, ctx, args),
        _ if reduce_code(op).is_some() => reduce(gpu, ctx, args),
        "Conv" | "ConvTranspose"
            if args
                .first()
                .is_some_and(|x| x.as_ref().is_some_and(|x| x.shape().len() == 5)) =>
        {
            super::conv3d::conv3d(gpu, ctx, args)
        }
        "Conv" => window_ops::conv(gpu, ctx, args),
        "ConvTranspose" => window_ops::conv_transpose(gpu, ctx, args),
        "Resize" | "Upsample" => super::resize::resize(gpu, ctx, args),
        "Attention" => super::attention::attention(gpu, ctx, args),
        "RotaryEmbedding" => super::attention::rotary_embedding(gpu, ctx, args),
        "GridSample" => super::grid_sample::grid_sample(gpu, ctx, args),
        "RNN" | "GRU" | "LSTM" => super::recurrent::recurrent(gpu, ctx, args),
        "Pad" => super::movement_ops::pad(gpu, ctx, args),
        "ReverseSequence" => super::movement_ops::reverse_sequence(gpu, ctx, args),
        "TensorScatter" => index_ops::tensor_scatter(gpu, ctx, args),
        "MaxUnpool" => index_ops::max_unpool(gpu, ctx, args),
        "RoiAlign" => super::roi_align::roi_align(gpu, ctx, args),
        "DeformConv" => super::deform_conv::deform_conv(gpu, ctx, args),
        "MeanVarianceNormalization" => super::moments::mean_variance_normalization(gpu, ctx, args),
        "BatchNormalization" if ctx.int("training_mode", 0) != 0 => {
            super::moments::batch_norm_training(gpu, ctx, args)
        }
        "MaxPool" => window_ops::pool(gpu, ctx, args),
        "AveragePool" | "LpPool" if !extra_outputs(ctx) => window_ops::pool(gpu, ctx, args),
        "GlobalAveragePool" | "GlobalMaxPool" => window_ops::global_pool(gpu, ctx, args),
        "BatchNormalization" if !extra_outputs(ctx) && ctx.int("training_mode", 0) == 0 => {
            window_ops::batch_norm(gpu, ctx, args)
        }
        _ => Ok(None),
    }
}

/// Reshape, Flatten, Squeeze and Unsqueeze: the input under its new shape, not copied.
fn reshape(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = viewable(gpu, args)? else {
        return Ok(None);
    };
    let second = host(gpu, args, 1)?;
    let shape = view_shape(ctx, &x.shape, second.as_deref())?;
    alias(gpu, args, Some(shape))
}

/// Expand: integers on the device broadcast as integers (`integers.rs`), floats copied out.
fn expand(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    if let Some(integers) = super::integers::expand(gpu, args)? {
        return Ok(Some(integers));
    }
    let (Some(x), Some(target)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let Some(shape) = expand_shape(&x.shape, &target)? else {
        return Ok(None);
    };
    one(gpu.expand(&x, &shape)?)
}

/// Codes of `unary_f32`.
fn unary_code(ctx: &Ctx, op: &str) -> Option<i32> {
    Some(match op {
        "Relu" => 0,
        "Sigmoid" => 1,
        "Tanh" => 2,
        "Erf" => 3,
        "Exp" => 4,
        "Log" => 5,
        "Sqrt" => 6,
        "Neg" => 7,
        "Abs" => 8,
        "Reciprocal" => 9,
        "Gelu" if ctx.string("approximate", "none") == "tanh" => 11,
        "Gelu" => 10,
        "LeakyRelu" => 12,
        "Clip" => 13,
        "Swish" => 14,
        "HardSigmoid" => 15,
        "HardSwish" => 16,
        "Elu" => 17,
        "Selu" => 18,
        "Celu" => 19,
        "Mish" => 20,
        "Softplus" => 21,
        "Softsign" => 22,
        "ThresholdedRelu" => 23,
        "Shrink" => 24,
        "Floor" => 25,
        "Ceil" => 26,
        "Round" => 27,
        "Sign" => 28,
        "Sin" => 29,
        "Cos" => 30,
        "Tan" => 31,
        "Asin" => 32,
        "Acos" => 33,
        "Atan" => 34,
        "Sinh" => 35,
        "Cosh" => 36,
        "Asinh" => 37,
        "Acosh" => 38,
        "Atanh" => 39,
        _ => return None,
    })
}

/// `unary_f32`'s code that multiplies by its `alpha` (Mean's division by the input count).
const SCALE_CODE: i32 = 40;

fn unary(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], code: i32) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let (alpha, beta) = match code {
        12 => (ctx.float("alpha", 0.01), 0.0),
        14 | 17 | 19 | 23 => (ctx.float("alpha", 1.0), 0.0),
        // Defaults from the ONNX spec (Selu's are 1.67326319217681884765625 and
        // 1.05070102214813232421875).
        18 => (
            ctx.float("alpha", 1.673_263_2),
            ctx.float("gamma", 1.050_701),
        ),
        24 => (ctx.float("bias", 0.0), ctx.float("lambd", 0.5)),
        15 => (ctx.float("alpha", 0.2), ctx.float("beta", 0.5)),
        13 if ctx.opset < 11 => (
            ctx.float("min", f32::NEG_INFINITY),
            ctx.float("max", f32::INFINITY),
        ),
        13 => {
            let bound = |i: usize, default: f32| -> Result<f32, String> {
                Ok(match host(gpu, args, i)? {
                    Some(t) => *t.to_f32_vec().first().ok_or("Clip bound is empty")?,
                    None => default,
                })
            };
            (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?)
        }
        _ => (0.0, 0.0),
    };
    one(elementwise::unary(gpu, &x, code, (alpha, beta))?)
}

/// Codes of `binary_f32` (two-input forms only; more inputs go to [`variadic`]).
fn binary_code(ctx: &Ctx, op: &str) -> Option<i32> {
    Some(match op {
        "Add" => 0,
        "Sub" => 1,
        "Mul" => 2,
        "Div" => 3,
        "Pow" => 4,
        "Max" => 5,
        "Min" => 6,
        "PRelu" => 7,
        // Float Mod must be C's fmod (the spec requires fmod = 1 for floats).
        "Mod" if ctx.int("fmod", 0) != 0 => 8,
        _ => return None,
    })
}

fn binary(gpu: &Gpu, args: &[Option<Value>], code: i32) -> OpResult {
    if args.len() != 2 {
        return Ok(None);
    }
    let Some(a) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let b = match device(gpu, args, 1)? {
        Some(b) => b,
        // Pow's exponent may be an integer tensor (small, on the host): raised as floats.
        None if code == 4 => match host(gpu, args, 1)? {
            Some(e) if matches!(e.dtype(), DType::I64 | DType::I32) => {
                let values = e.to_f32_vec();
                DeviceTensor::new(e.shape().to_vec(), gpu.upload(&values)?)
            }
            _ => return Ok(None),
        },
        None => return Ok(None),
    };
    one(elementwise::binary(gpu, &a, &b, code)?)
}

/// Sum, Mean, Max and Min of any number of float inputs, folded pairwise with broadcasting
/// (Mean scaled by 1/count at the end); one input is itself.
fn variadic(gpu: &Gpu, op: &str, args: &[Option<Value>]) -> OpResult {
    let Some(inputs) = all_device(gpu, args, args.len())? else {
        return Ok(None);
    };
    let Some((first, rest)) = inputs.split_first() else {
        return Ok(None);
    };
    let code = match op {
        "Max" => 5,
        "Min" => 6,
        _ => 0,
    };
    let mut acc = first.clone();
    for next in rest {
        acc = elementwise::binary(gpu, &acc, next, code)?;
    }
    if op == "Mean" && !rest.is_empty() {
        acc = elementwise::unary(gpu, &acc, SCALE_CODE, (1.0 / inputs.len() as f32, 0.0))?;
    }
    one(acc)
}

/// Dropout at inference: the input itself and, when asked for, a mask of ones (as the CPU
/// kernel, which never drops).
fn dropout(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let mut results = vec![Value::Device(x.clone())];
    if extra_outputs(ctx) {
        let mask = crate::TensorData::Bool(vec![true; numel(&x.shape)]);
        results.push(Value::host(Arc::new(HostTensor::with_data(
            x.shape.clone(),
            mask,
        ))));
    }
    Ok(Some(results))
}

/// DepthToSpace and SpaceToDepth: one strided copy through a rank-6 view.
fn depth_space(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let &[n, c, h, w] = x.shape.as_slice() else {
        return Ok(None);
    };
    let b = usize::try_from(ctx.int("blocksize", 0))
        .ok()
        .filter(|&b| b > 0)
        .ok_or("blocksize must be positive")?;
    let (view, perm, out_shape) = if ctx.node.op_type == "DepthToSpace" {
        if c % (b * b) != 0 {
            return Err(format!("{c} channels do not divide into blocks of {b}×{b}"));
        }
        let cb = c / (b * b);
        let out = vec![n, cb, h * b, w * b];
        if ctx.string("mode", "DCR") == "CRD" {
            (vec![n, cb, b, b, h, w], [0, 1, 4, 2, 5, 3], out)
        } else {
            (vec![n, b, b, cb, h, w], [0, 3, 4, 1, 5, 2], out)
        }
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(format!("{h}×{w} does not divide into blocks of {b}"));
        }
        let out = vec![n, c * b * b, h / b, w / b];
        // CRD (opset 25) keeps the input channel outermost, DCR the block offset.
        let perm = if ctx.string("mode", "DCR") == "CRD" {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        (vec![n, c, h / b, b, w / b, b], perm, out)
    };
    let strides = contiguous_strides(&view);
    let moved_shape: Vec<usize> = perm.iter().map(|&p| view[p]).collect();
    let moved_strides: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &moved_shape, &moved_strides, 0)?;
    one(DeviceTensor::new(out_shape, data))
}

fn where_op(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    if let Some(cond) = masks::device_mask(args, 0) {
        return masks::where_mask(gpu, &cond, args);
    }
    let Some(cond) = host(gpu, args, 0)? else {
        return Ok(None);
    };
    let crate::TensorData::Bool(flags) = cond.data() else {
        return Ok(None);
    };
    let (Some(a), Some(b)) = (device(gpu, args, 1)?, device(gpu, args, 2)?) else {
        return Ok(None);
    };
    let shape = broadcast_shapes(&[cond.shape(), &a.shape, &b.shape])?;
    let flags: Vec<u8> = flags.iter().map(|&f| f as u8).collect();
    let flags = gpu.upload(&flags)?;
    let flat_cond = super::flat::Condition::Flags(&flags, cond.shape());
    if let Some(out) = super::flat::choose(gpu, flat_cond, (&a, &b), &shape)? {
        return one(DeviceTensor::new(shape, out));
    }
    let dims = element_dims(
        &shape,
        &[
            &broadcast_strides(&a.shape, &shape),
            &broadcast_strides(&b.shape, &shape),
            &broadcast_strides(cond.shape(), &shape),
        ],
    )?;
    let n = numel(&shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.where_);
    launch
        .arg(&flags)
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&dims);
    // SAFETY: argument types match `where_f32`; broadcast strides keep offsets in bounds.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// Operand 0 for a view: a float tensor, a mask or integers on the device (a view changes no
/// value), or a host float tensor uploaded.
fn viewable(gpu: &Gpu, args: &[Option<Value>]) -> Result<Option<DeviceTensor>, String> {
    match super::integers::device_integers(args, 0) {
        Some(integers) => Ok(Some(integers)),
        None => device_or_mask(gpu, args, 0),
    }
}

/// The input itself (shared, not copied), optionally under a new shape.
fn alias(gpu: &Gpu, args: &[Option<Value>], shape: Option<Vec<usize>>) -> OpResult {
    let Some(x) = viewable(gpu, args)? else {
        return Ok(None);
    };
    let shape = shape.unwrap_or_else(|| x.shape.clone());
    if numel(&shape) != numel(&x.shape) {
        return Err(format!(
            "cannot view {:?} as {shape:?}: element counts differ",
            x.shape
        ));
    }
    one(DeviceTensor { shape, ..x })
}

fn transpose(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let perm = transpose_perm(ctx, x.shape.len())?;
    let strides = contiguous_strides(&x.shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let out_strides: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &out_shape, &out_strides, 0)?;
    one(DeviceTensor::new(out_shape, data))
}

fn concat(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    // Empty parts add nothing; the CPU kernel checks them (and an all-empty output) itself.
    let filled: Vec<Option<Value>> = args
        .iter()
        .filter(|a| a.as_ref().is_none_or(|v| !v.shape().contains(&0)))
        .cloned()
        .collect();
    if filled.is_empty() || filled.len() < args.len() && !empty_parts_agree(ctx, args)? {
        return Ok(None);
    }
    let Some(parts) = all_device(gpu, &filled, filled.len())? else {
        return Ok(None);
    };
    let first = &parts[0].shape;
    let axis = normalize_axis(ctx.int("axis", 0), first.len())?;
    // Every dim but the axis must agree: a longer row would be written past its place.
    for part in &parts {
        let agrees = part.shape.len() == first.len()
            && (0..first.len()).all(|i| i == axis || part.shape[i] == first[i]);
        if !agrees {
            return Err(format!(
                "Concat parts {first:?} and {:?} differ outside axis {axis}",
                part.shape
            ));
        }
    }
    let mut shape = first.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    let outer = numel(&first[..axis]);
    let out_inner = numel(&shape[axis..]);
    let mut out = gpu.alloc(numel(&shape))?;
    let mut offset = 0usize;
    for part in &parts {
        let in_inner = numel(&part.shape[axis..]);
        let (o, i, oi, off) = (
            outer as i64,
            in_inner as i64,
            out_inner as i64,
            offset as i64,
        );
        let mut launch = gpu.stream.launch_builder(&gpu.functions.copy_block);
        launch
            .arg(&*part.data)
            .arg(&mut out)
            .arg(&o)
            .arg(&i)
            .arg(&oi)
            .arg(&off);
        // SAFETY: argument types match `copy_block_f32`; each part lands in its own columns.
        unsafe { launch.launch(Gpu::grid(outer * in_inner)) }.map_err(cuda_error("launch"))?;
        offset += in_inner;
    }
    one(DeviceTensor::new(shape, out))
}

/// Whether Concat's empty parts have the rank of the others and agree with them outside the
/// axis (else the CPU kernel reports the mismatch).
fn empty_parts_agree(ctx: &Ctx, args: &[Option<Value>]) -> Result<bool, String> {
    let shapes: Vec<&[usize]> = args.iter().flatten().map(Value::shape).collect();
    let Some(first) = shapes.first() else {
        return Ok(false);
    };
    let axis = normalize_axis(ctx.int("axis", 0), first.len())?;
    Ok(shapes
        .iter()
        .all(|s| s.len() == first.len() && (0..first.len()).all(|i| i == axis || s[i] == first[i])))
}

/// First index, step and length of a slice of an axis of `dim` elements (ONNX's clamping).
fn slice_axis(dim: usize, start: i64, end: i64, step: i64) -> (i64, i64, usize) {
    let dim = dim as i64;
    let fix = |v: i64| if v < 0 { v + dim } else { v };
    let (start, end) = (fix(start), fix(end));
    let (start, end) = if step > 0 {
        (start.clamp(0, dim), end.clamp(0, dim))
    } else {
        (start.clamp(0, dim - 1), end.clamp(-1, dim - 1))
    };
    let len = if step > 0 { end - start } else { start - end }.max(0) as u64;
    let count = len.div_ceil(step.unsigned_abs());
    (start, step, count as usize)
}

fn slice(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let (starts, ends, axes, steps) = if ctx.opset >= 10 {
        let get = |i| -> Result<Option<Vec<i64>>, String> {
            Ok(host(gpu, args, i)?.map(|t| t.to_i64_vec()))
        };
        (
            get(1)?.ok_or("Slice needs starts")?,
            get(2)?.ok_or("Slice needs ends")?,
            get(3)?,
            get(4)?,
        )
    } else {
        (
            ctx.ints("starts").ok_or("Slice needs starts")?,
            ctx.ints("ends").ok_or("Slice needs ends")?,
            ctx.ints("axes"),
            None,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice's starts, ends, axes and steps differ in length".into());
    }
    let strides = contiguous_strides(&x.shape);
    let mut out_shape = x.shape.clone();
    let mut out_strides = strides.clone();
    let mut base = 0i64;
    for i in 0..starts.len() {
        let axis = normalize_axis(axes[i], rank)?;
        if steps[i] == 0 {
            return Err("Slice step 0".into());
        }
        let (start, step, count) = slice_axis(x.shape[axis], starts[i], ends[i], steps[i]);
        out_shape[axis] = count;
        out_strides[axis] = strides[axis] * step;
        if count > 0 {
            base += start * strides[axis];
        }
    }
    if out_shape.contains(&0) {
        return Ok(None);
    }
    let data = gpu.gather_strided(&x.data, &out_shape, &out_strides, base)?;
    one(DeviceTensor::new(out_shape, data))
}

fn split(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let axis = normalize_axis(ctx.int("axis", 0), x.shape.len())?;
    let outputs = ctx.node.outputs.len();
    let dim = x.shape[axis];
    let sizes: Vec<usize> = match if ctx.opset >= 13 {
        host(gpu, args, 1)?.map(|t| t.to_i64_vec())
    } else {
        ctx.ints("split")
    } {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            // Equal parts, the last smaller when the axis does not divide (opset 18).
            let part = dim.div_ceil(outputs.max(1));
            (0..outputs)
                .map(|i| part.min(dim.saturating_sub(i * part)))
                .collect()
        }
    };
    if sizes.len() != outputs || sizes.iter().sum::<usize>() != dim {
        return Ok(None);
    }
    let strides = contiguous_strides(&x.shape);
    let mut results = Vec::with_capacity(outputs);
    let mut start = 0usize;
    for size in sizes {
        let mut shape = x.shape.clone();
        shape[axis] = size;
        if size == 0 {
            // An empty part holds no data: a host tensor, with no device allocation.
            let empty = HostTensor::f32(shape, Vec::new());
            results.push(Value::host(Arc::new(empty)));
            continue;
        }
        let base = start as i64 * strides[axis];
        let data = gpu.gather_strided(&x.data, &shape, &strides, base)?;
        results.push(Value::Device(DeviceTensor::new(shape, data)));
        start += size;
    }
    Ok(Some(results))
}

fn gather(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    if !matches!(indices.dtype(), DType::I64 | DType::I32) {
        return Ok(None);
    }
    let axis = normalize_axis(ctx.int("axis", 0), x.shape.len())?;
    let axis_len = x.shape[axis];
    let idx: Vec<i64> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + axis_len as i64 } else { i };
            if (0..axis_len as i64).contains(&j) {
                Ok(j)
            } else {
                Err(format!("Gather index {i} out of range for {axis_len}"))
            }
        })
        .collect::<Result<_, _>>()?;
    let mut shape = x.shape[..axis].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&x.shape[axis + 1..]);
    if idx.is_empty() {
        return Ok(None);
    }
    let (outer, inner) = (numel(&x.shape[..axis]), numel(&x.shape[axis + 1..]));
    let idx = gpu.upload(&idx)?;
    let n = outer * indices.len() * inner;
    let mut out = gpu.alloc(n)?;
    let (o, a, m, i) = (
        outer as i64,
        axis_len as i64,
        indices.len() as i64,
        inner as i64,
    );
    let mut launch = gpu.stream.launch_builder(&gpu.functions.gather_axis);
    launch
        .arg(&*x.data)
        .arg(&idx)
        .arg(&mut out)
        .arg(&o)
        .arg(&a)
        .arg(&m)
        .arg(&i);
    // SAFETY: argument types match `gather_axis_f32`; indices were checked against the axis.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// Codes of `reduce_rows_f32` and `reduce_f32`.
fn reduce_code(op: &str) -> Option<i32> {
    Some(match op {
        "ReduceSum" => 0,
        "ReduceMean" => 1,
        "ReduceMax" => 2,
        "ReduceMin" => 3,
        "ReduceSumSquare" => 4,
        "ReduceL1" => 5,
        "ReduceL2" => 6,
        "ReduceLogSum" => 7,
        "ReduceLogSumExp" => 8,
        "ReduceProd" => 9,
        _ => return None,
    })
}

fn reduce(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let Some(code) = reduce_code(&ctx.node.op_type) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let axes: Vec<i64> = match host(gpu, args, 1)? {
        Some(a) => a.to_i64_vec(),
        None => ctx.ints("axes").unwrap_or_default(),
    };
    let keep_dims = ctx.int("keepdims", 1) != 0;
    if axes.is_empty() && ctx.int("noop_with_empty_axes", 0) != 0 {
        return alias(gpu, args, None);
    }
    let mut reduced_axes: Vec<usize> = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?
    };
    reduced_axes.sort_unstable();
    reduced_axes.dedup();
    one(reduce_axes(gpu, &x, &reduced_axes, code, keep_dims)?)
}

/// `x` reduced over `reduced_axes` (sorted, distinct) with a code of `reduce_rows_f32`:
/// one block per row when they are the trailing axes, else `reductions::reduce_strided`.
fn reduce_axes(
    gpu: &Gpu,
    x: &DeviceTensor,
    reduced_axes: &[usize],
    code: i32,
    keep_dims: bool,
) -> Result<DeviceTensor, String> {
    let rank = x.shape.len();
    let strides = contiguous_strides(&x.shape);
    let kept_axes: Vec<usize> = (0..rank)
        .filter(|a| reduced_axes.binary_search(a).is_err())
        .collect();
    let kept_shape: Vec<usize> = kept_axes.iter().map(|&a| x.shape[a]).collect();
    let kept_strides: Vec<i64> = kept_axes.iter().map(|&a| strides[a]).collect();
    let red_shape: Vec<usize> = reduced_axes.iter().map(|&a| x.shape[a]).collect();
    let red_strides: Vec<i64> = reduced_axes.iter().map(|&a| strides[a]).collect();
    let (n_out, count) = (numel(&kept_shape), numel(&red_shape));
    let mut out = gpu.alloc(n_out)?;
    let trailing = reduced_axes
        .iter()
        .enumerate()
        .all(|(i, &a)| a == rank - reduced_axes.len() + i);
    if trailing {
        gpu.reduce_rows(&x.data, &mut out, (n_out, count), code)?;
    } else {
        let kept = dims(&kept_shape, &[&kept_strides])?;
        let reduced = dims(&red_shape, &[&red_strides])?;
        let operands = (&*x.data, &mut out);
        super::reductions::reduce_strided(gpu, operands, (kept, reduced), (n_out, count), code)?;
    }
    let shape: Vec<usize> = if keep_dims {
        (0..rank)
            .map(|a| {
                if reduced_axes.binary_search(&a).is_ok() {
                    1
                } else {
                    x.shape[a]
                }
            })
            .collect()
    } else {
        kept_shape
    };
    Ok(DeviceTensor::new(shape, out))
}

/// LpNormalization: `x` divided by its L1 or L2 norm along `axis` (a reduction kept as a
/// size-1 axis, then a broadcast division).
fn lp_normalization(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let code = match ctx.int("p", 2) {
        1 => 5,
        2 => 6,
        // Another p: the CPU kernel refuses it with the reason.
        _ => return Ok(None),
    };
    let axis = normalize_axis(ctx.int("axis", -1), x.shape.len())?;
    let norm = reduce_axes(gpu, &x, &[axis], code, true)?;
    // A zero fibre stays zero, as the CPU kernel keeps it: its norm is raised to the least
    // normal float (every nonzero norm of normal floats is above it), so 0/0 becomes 0.
    let least = DeviceTensor::new(vec![], gpu.upload(&[f32::MIN_POSITIVE])?);
    let norm = elementwise::binary(gpu, &norm, &least, 5)?;
    one(elementwise::binary(gpu, &x, &norm, 3)?)
}

fn matmul(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    scaled_matmul(gpu, args, 1.0)
}

/// MatMul with its product times `alpha` (cuBLAS's alpha: a fused step's scale, `fuse.rs`).
pub(super) fn scaled_matmul(gpu: &Gpu, args: &[Option<Value>], alpha: f32) -> OpResult {
    let Some(v) = all_device(gpu, args, 2)? else {
        return Ok(None);
    };
    let (a, b) = (&v[0], &v[1]);
    if a.shape.is_empty() || b.shape.is_empty() {
        return Ok(None);
    }
    // Vectors are promoted to matrices, and the promoted axis is dropped from the result.
    let a_shape = if a.shape.len() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let b_shape = if b.shape.len() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k) = (a_shape[ra - 2], a_shape[ra - 1]);
    let (k2, n) = (b_shape[rb - 2], b_shape[rb - 1]);
    if k != k2 {
        return Err(format!(
            "MatMul inner dims differ: {:?} × {:?}",
            a.shape, b.shape
        ));
    }
    let batch = broadcast_shapes(&[&a_shape[..ra - 2], &b_shape[..rb - 2]])?;
    let count = numel(&batch);
    let mut out = gpu.alloc(count * m * n)?;
    let (a_count, b_count) = (numel(&a_shape[..ra - 2]), numel(&b_shape[..rb - 2]));
    if b_count == 1 && a_count == count {
        // Weights shared by the whole batch: one product with the batch folded into the rows.
        gpu.gemm(
            (count * m, n, k),
            &a.data,
            false,
            &b.data,
            false,
            &mut out,
            (alpha, 0.0),
            (1, 0, 0),
        )?;
    } else {
        // A batch broadcast from one matrix reads it with stride 0; any other broadcast is
        // materialised first.
        let operand = |t: &DeviceTensor, shape: &[usize], own: usize, rows: usize, cols: usize| {
            if own == count {
                Ok((t.data.clone(), rows * cols))
            } else if own == 1 {
                Ok((t.data.clone(), 0))
            } else {
                let mut full = batch.clone();
                full.extend_from_slice(&[rows, cols]);
                let view = DeviceTensor {
                    shape: shape.to_vec(),
                    data: t.data.clone(),
                    mask: false,
                    int: None,
                };
                gpu.expand(&view, &full).map(|e| (e.data, rows * cols))
            }
        };
        let (a_data, stride_a) = operand(a, &a_shape, a_count, m, k)?;
        let (b_data, stride_b) = operand(b, &b_shape, b_count, k, n)?;
        gpu.gemm(
            (m, n, k),
            &a_data,
            false,
            &b_data,
            false,
            &mut out,
            (alpha, 0.0),
            (count, stride_a, stride_b),
        )?;
    }
    let mut shape = batch;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    one(DeviceTensor::new(shape, out))
}

fn gemm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(v) = all_device(gpu, args, 2)? else {
        return Ok(None);
    };
    let (a, b) = (&v[0], &v[1]);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Ok(None);
    }
    let (trans_a, trans_b) = (ctx.int("transA", 0) != 0, ctx.int("transB", 0) != 0);
    let (alpha, beta) = (ctx.float("alpha", 1.0), ctx.float("beta", 1.0));
    let (m, k) = if trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(format!(
            "Gemm inner dims differ: {:?} × {:?}",
            a.shape, b.shape
        ));
    }
    let c = match args.get(2).and_then(|c| c.as_ref()) {
        Some(_) => match device(gpu, args, 2)? {
            Some(c) => Some(c),
            None => return Ok(None),
        },
        None => None,
    };
    // C (broadcast to [m, n]) is written first and accumulated into by the product.
    let (mut out, beta) = match c {
        Some(c) if beta != 0.0 => {
            let strides = broadcast_strides(&c.shape, &[m, n]);
            (gpu.gather_strided(&c.data, &[m, n], &strides, 0)?, beta)
        }
        _ => (gpu.alloc(m * n)?, 0.0),
    };
    gpu.gemm(
        (m, n, k),
        &a.data,
        trans_a,
        &b.data,
        trans_b,
        &mut out,
        (alpha, beta),
        (1, 0, 0),
    )?;
    one(DeviceTensor::new(vec![m, n], out))
}

/// Borrowed views of each vector, as [`dims`] takes them.
fn slices(vectors: &[Vec<i64>]) -> Vec<&[i64]> {
    vectors.iter().map(Vec::as_slice).collect()
}

/// Einsum of one to three float operands: the CPU kernel's loops (`kernels/einsum.rs`), one
/// thread per output value summing over the contracted labels. A contraction that is a matrix
/// product would be faster as transposes and a cuBLAS batched GEMM; exporters write those as
/// MatMul, and the Einsums left are small.
fn einsum(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    if !(1..=3).contains(&args.len()) {
        return Ok(None);
    }
    let Some(operands) = all_device(gpu, args, args.len())? else {
        return Ok(None);
    };
    let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape.as_slice()).collect();
    let loops = crate::kernels::einsum_loops(ctx, &shapes)?;
    if loops.out_shape.len() > MAX_RANK || loops.summed_shape.len() > MAX_RANK {
        return Ok(None);
    }
    let as_i64 = |v: &[usize]| v.iter().map(|&s| s as i64).collect::<Vec<_>>();
    let out_strides: Vec<Vec<i64>> = loops.out_strides.iter().map(|s| as_i64(s)).collect();
    let summed_strides: Vec<Vec<i64>> = loops.summed_strides.iter().map(|s| as_i64(s)).collect();
    let out_dims = dims(&loops.out_shape, &slices(&out_strides))?;
    let summed_dims = dims(&loops.summed_shape, &slices(&summed_strides))?;
    let n = numel(&loops.out_shape);
    let count = numel(&loops.summed_shape) as i64;
    let mut out = gpu.alloc(n)?;
    let (n64, used) = (n as i64, operands.len() as i32);
    // Operands past the last are never read; the first stands in for them.
    let operand = |k: usize| &*operands[k.min(operands.len() - 1)].data;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.einsum);
    launch
        .arg(operand(0))
        .arg(operand(1))
        .arg(operand(2))
        .arg(&mut out)
        .arg(&n64)
        .arg(&out_dims)
        .arg(&summed_dims)
        .arg(&count)
        .arg(&used);
    // SAFETY: argument types match `einsum_f32`; the strides are the operands' own, checked
    // against their shapes by `einsum_loops`.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(loops.out_shape, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_onnx_clamping() {
        assert_eq!(slice_axis(10, 2, 8, 1), (2, 1, 6));
        assert_eq!(slice_axis(10, 0, i64::MAX, 3), (0, 3, 4));
        assert_eq!(slice_axis(10, -1, i64::MIN, -1), (9, -1, 10));
        assert_eq!(slice_axis(10, 8, 2, 1), (8, 1, 0));
        assert_eq!(slice_axis(4, -3, -1, 1), (1, 1, 2));
    }
}
