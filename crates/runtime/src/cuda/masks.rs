//! Boolean tensors on the device, and casts between the float formats.
//!
//! A mask (a comparison's or IsNaN's result) is a [`DeviceTensor`] with `mask` set whose
//! elements are the floats 0 and 1: exact, readable by every float kernel, and four bytes an
//! element where a byte would do — the price of one storage type for every device tensor. The
//! comparisons, IsNaN, IsInf, Not, And, Or and Xor make masks from float tensors and masks, Where
//! chooses by one, views (Reshape, Identity, …) keep one, and a Cast turns one into floats (its
//! values as they are) or a float tensor into one; a mask copied to the host is a bool tensor.
//!
//! A Cast between float formats rounds on the device to the format named (`round_float_f32`,
//! the rule of `runtime/narrow.rs`), so an fp16 model's casts give the CPU runtime's numbers.
//! Casts to integers stay on the host, where integer tensors live (module doc of `cuda`).

use cudarc::driver::PushKernelArg;

use super::gpu::{broadcast_strides, cuda_error, element_dims, numel, Gpu};
use super::operands::{device, device_or_mask, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{broadcast_shapes, Ctx};
use crate::narrow::layout;
use crate::tensor::TensorData;
use pipecut_ir::graph::DType;

/// Operand `i` when it is a mask already on the device.
pub(super) fn device_mask(args: &[Option<Value>], i: usize) -> Option<DeviceTensor> {
    match args.get(i)?.as_ref()? {
        Value::Device(t) if t.mask => Some(t.clone()),
        _ => None,
    }
}

/// Operand `i` as a mask on the device: a device mask, or a host bool tensor uploaded as 0s and
/// 1s (the other operand of an And is often a constant).
fn mask_operand(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<DeviceTensor>, String> {
    if let Some(mask) = device_mask(args, i) {
        return Ok(Some(mask));
    }
    match args.get(i).and_then(|a| a.as_ref()) {
        Some(Value::Host(t, _)) => match t.data() {
            TensorData::Bool(flags) => {
                let values: Vec<f32> = flags.iter().map(|&f| f32::from(u8::from(f))).collect();
                let data = gpu.upload(&values)?;
                Ok(Some(DeviceTensor::mask(t.shape().to_vec(), data)))
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

/// Codes of `mask_binary_f32`; the logical ones take masks.
fn compare_code(op: &str) -> Option<(i32, bool)> {
    Some(match op {
        "Less" => (0, false),
        "LessOrEqual" => (1, false),
        "Greater" => (2, false),
        "GreaterOrEqual" => (3, false),
        "Equal" => (4, false),
        "And" => (5, true),
        "Or" => (6, true),
        "Xor" => (7, true),
        _ => return None,
    })
}

/// A comparison of two float tensors, or And/Or/Xor of two masks, at least one on the device
/// (logical ops of two host bool tensors stay host work, like shape arithmetic).
pub(super) fn compare(gpu: &Gpu, op: &str, args: &[Option<Value>]) -> OpResult {
    let Some((code, logical)) = compare_code(op).filter(|_| args.len() == 2) else {
        return Ok(None);
    };
    let operands = if logical {
        if device_mask(args, 0).is_none() && device_mask(args, 1).is_none() {
            return Ok(None);
        }
        (mask_operand(gpu, args, 0)?, mask_operand(gpu, args, 1)?)
    } else if let Some((a, b)) = super::integers::comparison_operands(gpu, args)? {
        (Some(a), Some(b))
    } else {
        (device(gpu, args, 0)?, device(gpu, args, 1)?)
    };
    let (Some(a), Some(b)) = operands else {
        return Ok(None);
    };
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let flat = &gpu.functions.flat.compare;
    if let Some(out) = super::flat::pair(gpu, flat, (&a, &b), &shape, code)? {
        return one(DeviceTensor::mask(shape, out));
    }
    let strides = [
        broadcast_strides(&a.shape, &shape),
        broadcast_strides(&b.shape, &shape),
    ];
    let dims = element_dims(&shape, &[&strides[0], &strides[1]])?;
    let n = numel(&shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.masks.binary);
    launch
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&dims)
        .arg(&code);
    // SAFETY: argument types match `mask_binary_f32`; broadcast strides keep offsets in bounds.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::mask(shape, out))
}

/// IsNaN and IsInf of a float tensor, Not of a device mask.
pub(super) fn test(gpu: &Gpu, ctx: &Ctx, op: &str, args: &[Option<Value>]) -> OpResult {
    let code = match op {
        "IsNaN" => 0,
        "IsInf" => match (
            ctx.int("detect_positive", 1) != 0,
            ctx.int("detect_negative", 1) != 0,
        ) {
            (true, true) => 1,
            (true, false) => 2,
            (false, true) => 3,
            // Neither sign: every element false, which the host answers without a kernel.
            (false, false) => return Ok(None),
        },
        _ => 4,
    };
    let x = if code == 4 {
        device_mask(args, 0)
    } else {
        device(gpu, args, 0)?
    };
    let Some(x) = x else {
        return Ok(None);
    };
    one(mask_unary(gpu, &x, code)?)
}

/// `mask_unary_f32` with `code` over `x`: a mask of its shape.
fn mask_unary(gpu: &Gpu, x: &DeviceTensor, code: i32) -> Result<DeviceTensor, String> {
    let n = numel(&x.shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.masks.unary);
    launch.arg(&*x.data).arg(&mut out).arg(&n64).arg(&code);
    // SAFETY: argument types match `mask_unary_f32`; both buffers hold `n` floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::mask(x.shape.clone(), out))
}

/// Where whose condition is a device mask; the two choices must be float.
pub(super) fn where_mask(gpu: &Gpu, cond: &DeviceTensor, args: &[Option<Value>]) -> OpResult {
    let (Some(a), Some(b)) = (device(gpu, args, 1)?, device(gpu, args, 2)?) else {
        return Ok(None);
    };
    one(choose(gpu, cond, &a, &b)?)
}

/// `cond ? a : b` element-wise, the three broadcast together; `cond` a device mask.
pub(super) fn choose(
    gpu: &Gpu,
    cond: &DeviceTensor,
    a: &DeviceTensor,
    b: &DeviceTensor,
) -> Result<DeviceTensor, String> {
    let shape = broadcast_shapes(&[&cond.shape, &a.shape, &b.shape])?;
    let flat_cond = super::flat::Condition::Mask(cond);
    if let Some(out) = super::flat::choose(gpu, flat_cond, (a, b), &shape)? {
        return Ok(DeviceTensor::new(shape, out));
    }
    let strides = [
        broadcast_strides(&a.shape, &shape),
        broadcast_strides(&b.shape, &shape),
        broadcast_strides(&cond.shape, &shape),
    ];
    let dims = element_dims(&shape, &[&strides[0], &strides[1], &strides[2]])?;
    let n = numel(&shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.masks.where_);
    launch
        .arg(&*cond.data)
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&dims);
    // SAFETY: argument types match `where_mask_f32`; broadcast strides keep offsets in bounds.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::new(shape, out))
}

/// The type a Cast or CastLike converts to: Cast's `to`, CastLike's declared output type (or
/// its second input's type when shape inference left it open).
fn cast_target(ctx: &Ctx, args: &[Option<Value>]) -> Option<DType> {
    if ctx.node.op_type == "Cast" {
        return DType::from_onnx(ctx.int("to", 0) as i32);
    }
    if let Some(declared) = ctx.output_dtypes.first().copied().flatten() {
        return Some(declared);
    }
    match args.get(1)?.as_ref()? {
        Value::Host(t, _) => Some(t.dtype()),
        Value::Device(t) if t.mask => Some(DType::Bool),
        Value::Device(t) if t.int.is_some() => t.int,
        Value::Device(_) => Some(DType::F32),
        Value::Optional(_) => None,
    }
}

/// Cast and CastLike of a float tensor or a mask to a float format or to bool, and of integers
/// on the device (`integers::cast`). Other targets (integers, E8M0, strings) go to the host.
pub(super) fn cast(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(to) = cast_target(ctx, args) else {
        return Ok(None);
    };
    let x = match super::integers::device_integers(args, 0) {
        Some(integers) => match super::integers::cast(integers, to) {
            Some(super::integers::Cast::Done(t)) => return one(t),
            Some(super::integers::Cast::AsFloats(floats)) => floats,
            None => return Ok(None),
        },
        None => match device_or_mask(gpu, args, 0)? {
            Some(x) => x,
            None => return Ok(None),
        },
    };
    // `saturate` is float8's; float16 and bfloat16 overflow to infinity, as on the host.
    let saturate = ctx.int("saturate", 1) != 0 && !matches!(to, DType::F16 | DType::BF16);
    let result = match to {
        DType::Bool if x.mask => x,
        DType::Bool => mask_unary(gpu, &x, 5)?,
        // 0 and 1 are exact in every float format but E8M0, which has no zero.
        _ if x.mask && to != DType::F8E8M0 && is_float(to) => DeviceTensor { mask: false, ..x },
        DType::F32 | DType::F64 => x,
        _ => match layout(to) {
            Some(format) if !x.mask => round_float(gpu, &x, format, saturate)?,
            _ => return Ok(None),
        },
    };
    one(result)
}

fn is_float(dtype: DType) -> bool {
    dtype == DType::F32 || dtype == DType::F64 || layout(dtype).is_some()
}

/// Flags of `round_float_f32`.
const HAS_INFINITY: i32 = 1;
const UNSIGNED_ZERO: i32 = 2;
const ALWAYS_SATURATES: i32 = 4;
const SATURATE: i32 = 8;

/// `x` rounded element-wise to `format`, as `round_float` rounds on the host.
fn round_float(
    gpu: &Gpu,
    x: &DeviceTensor,
    format: crate::narrow::MiniFloat,
    saturate: bool,
) -> Result<DeviceTensor, String> {
    let flags = [
        (format.has_infinity, HAS_INFINITY),
        (format.unsigned_zero, UNSIGNED_ZERO),
        (format.always_saturates, ALWAYS_SATURATES),
        (saturate, SATURATE),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0, |acc, (_, flag)| acc | flag);
    let n = numel(&x.shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let max = format.max as f32;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.masks.round_float);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&format.mantissa_bits)
        .arg(&format.bias)
        .arg(&max)
        .arg(&flags);
    // SAFETY: argument types match `round_float_f32`; both buffers hold `n` floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::new(x.shape.clone(), out))
}
