//! How a device op takes its operands and gives its results: float operands on the device
//! (uploaded once), small ones (shapes, axes, indices) on the host, and `Ok(None)` where the op
//! is left to the CPU kernel.

use std::sync::Arc;

use super::gpu::{Gpu, MAX_RANK};
use super::value::{DeviceTensor, Value};
use crate::kernels::{broadcast_shapes, checked_size, Ctx};
use crate::tensor::{HostTensor, TensorData};

/// A device result, or `None` when the op is left to the CPU kernel.
pub(super) type OpResult = Result<Option<Vec<Value>>, String>;

/// The device form of a float value (uploaded from the host when needed); `None` for other
/// dtypes, which stay on the host.
pub(super) fn to_device(gpu: &Gpu, value: &Value) -> Result<Option<DeviceTensor>, String> {
    match value {
        Value::Device(t) => Ok(Some(t.clone())),
        Value::Host(t, uploaded) => match t.data() {
            TensorData::F32(v) if !v.is_empty() => {
                if let Some(copy) = uploaded.get() {
                    return Ok(Some(copy.clone()));
                }
                let data = gpu.upload(v)?;
                let copy = DeviceTensor::new(t.shape().to_vec(), data);
                Ok(Some(uploaded.get_or_init(|| copy).clone()))
            }
            _ => Ok(None),
        },
        Value::Optional(_) => Ok(None),
    }
}

/// The device operand `i`, float or mask (a host float tensor is uploaded), or `None` (for
/// integers on the device too: only `integers.rs`, comparisons and views read those).
pub(super) fn device_or_mask(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<DeviceTensor>, String> {
    match args.get(i).and_then(|a| a.as_ref()) {
        Some(v) => Ok(to_device(gpu, v)?.filter(|t| t.int.is_none())),
        None => Ok(None),
    }
}

/// The device operand `i`, or `None` when it is absent or not float (a boolean mask on the
/// device is not: only the ops of `masks.rs` and views take one).
pub(super) fn device(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<DeviceTensor>, String> {
    Ok(device_or_mask(gpu, args, i)?.filter(|t| !t.mask))
}

/// The host copy of operand `i` (small: shapes, axes, indices, scalars).
pub(super) fn host(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<Arc<HostTensor>>, String> {
    match args.get(i).and_then(|a| a.as_ref()) {
        Some(v) => v.to_host(gpu.stream).map(Some),
        None => Ok(None),
    }
}

/// Every listed operand on the device, or `None` if one is not float or is missing.
pub(super) fn all_device(
    gpu: &Gpu,
    args: &[Option<Value>],
    count: usize,
) -> Result<Option<Vec<DeviceTensor>>, String> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        match device(gpu, args, i)? {
            Some(t) => out.push(t),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

pub(super) fn one(t: DeviceTensor) -> OpResult {
    Ok(Some(vec![Value::Device(t)]))
}

/// Whether the node asks for outputs beyond the first (statistics, masks): left to the CPU.
pub(super) fn extra_outputs(ctx: &Ctx) -> bool {
    ctx.node.outputs.iter().skip(1).any(|o| o.is_some())
}

/// The output shape of an Expand of `x_shape` to the host tensor `target`; `None` past the
/// kernels' rank.
pub(super) fn expand_shape(
    x_shape: &[usize],
    target: &HostTensor,
) -> Result<Option<Vec<usize>>, String> {
    let target = target
        .to_i64_vec()
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("Expand shape has a negative entry {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = broadcast_shapes(&[x_shape, &target])?;
    checked_size(&shape)?;
    Ok((shape.len() <= MAX_RANK).then_some(shape))
}
