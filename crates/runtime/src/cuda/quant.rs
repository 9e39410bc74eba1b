//! DequantizeLinear on the device: `y = (x − zero_point) · scale`, per tensor, per axis or
//! blocked, with the CPU kernel's parameter layout (`kernels/quant.rs`, whose offset function
//! checks the parameters' shapes and says which scale each element takes).
//!
//! Integer data lives on the host; it goes to the device as floats, exact up to 2²⁴ in
//! magnitude (int8, uint8, int16, uint16 always; larger int32 values are left to the CPU), and
//! the subtraction and product run there in the CPU kernel's order, so the results are its own.

use std::sync::Arc;

use super::elementwise;
use super::gpu::Gpu;
use super::losses::pick;
use super::operands::{device, to_device, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{quant_block_size, quant_param_offsets, Ctx};
use crate::tensor::{HostTensor, TensorData};

/// `binary_f32`'s Sub and Mul.
const SUB: i32 = 1;
const MUL: i32 = 2;

/// Largest integer magnitude an f32 holds exactly.
const EXACT: i64 = 1 << 24;

/// A host parameter tensor (scale, zero point): weights and constants, as quantised models give.
fn host_param(args: &[Option<Value>], i: usize) -> Option<Arc<HostTensor>> {
    match args.get(i)?.as_ref()? {
        Value::Host(t, _) => Some(Arc::clone(t)),
        Value::Device(_) | Value::Optional(_) => None,
    }
}

/// `t` as floats on the device: float data as it is, integers exact up to 2²⁴ (else `None`).
fn as_device_floats(gpu: &Gpu, value: &Value) -> Result<Option<DeviceTensor>, String> {
    let host = match value {
        Value::Device(t) if !t.mask => return Ok(Some(t.clone())),
        Value::Device(_) | Value::Optional(_) => return Ok(None),
        Value::Host(t, _) => t,
    };
    if let TensorData::F32(_) = host.data() {
        return to_device(gpu, value);
    }
    if !matches!(
        host.data(),
        TensorData::I64(_) | TensorData::I32(_) | TensorData::U8(_) | TensorData::I8(_)
    ) {
        return Ok(None);
    }
    let ints = host.to_i64_vec();
    if ints.iter().any(|v| v.abs() > EXACT) {
        return Ok(None);
    }
    let floats: Vec<f32> = ints.iter().map(|&v| v as f32).collect();
    Ok(Some(DeviceTensor::new(
        host.shape().to_vec(),
        gpu.upload(&floats)?,
    )))
}

/// The parameter `param` (on the device as `values`) spread to one value per element of
/// `shape`: itself when it is one value (broadcast), else gathered by the CPU kernel's offsets.
fn spread(
    gpu: &Gpu,
    values: &DeviceTensor,
    offsets: &[usize],
    shape: &[usize],
) -> Result<DeviceTensor, String> {
    if values.data.len() == 1 {
        return Ok(DeviceTensor {
            shape: Vec::new(),
            ..values.clone()
        });
    }
    let offsets: Vec<i64> = offsets.iter().map(|&o| o as i64).collect();
    pick(gpu, values, &offsets, shape)
}

pub(super) fn dequantize_linear(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(Some(x)), Some(scale)) = (args.first(), host_param(args, 1)) else {
        return Ok(None);
    };
    let zero = match args.get(2) {
        Some(Some(_)) => match host_param(args, 2) {
            Some(z) => Some(z),
            None => return Ok(None),
        },
        _ => None,
    };
    let (Some(data), Some(scales)) = (as_device_floats(gpu, x)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let shape = data.shape.clone();
    let (axis, block) = (ctx.int("axis", 1), quant_block_size(ctx)?);
    let scale_at = quant_param_offsets(&shape, &scale, axis, block, "scale")?;
    let mut shifted = data;
    if let Some(zero) = zero {
        let zero_at = quant_param_offsets(&shape, &zero, axis, block, "zero point")?;
        let Some(zeros) = as_device_floats(gpu, &Value::host(zero))? else {
            return Ok(None);
        };
        shifted = elementwise::binary(gpu, &shifted, &spread(gpu, &zeros, &zero_at, &shape)?, SUB)?;
    }
    let scales = spread(gpu, &scales, &scale_at, &shape)?;
    Ok(Some(vec![Value::Device(elementwise::binary(
        gpu, &shifted, &scales, MUL,
    )?)]))
}
