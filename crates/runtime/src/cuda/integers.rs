//! Integer tensors on the device, for one case only: a broadcast of host integers whose output
//! is large (a one-hot encoding: magika compares its `[B, 2048, 1]` int32 bytes with the
//! `[1, 1, 257]` values 0…256, then casts the `[B, 2048, 257]` result to float).
//!
//! Integer tensors live on the host (module doc of `cuda`): shapes and indices are small and the
//! host reads them next. But a comparison or an Expand that broadcasts host integers to millions
//! of elements made its result there, and the float op after it uploaded all of it every
//! micro-batch (33 MB a micro-batch for magika at batch 16, most of its time on an H100:
//! docs/benchmarks.md). Here such a broadcast runs on the device from the small operands:
//!
//! - an Expand of a host integer tensor with a large output makes an *integer device tensor*:
//!   a [`DeviceTensor`] with `int` set to its host dtype (int32, int64, uint8 or int8, the host
//!   runtime's integer storages), its values held as floats, exact because every value is at most 2²⁴ in
//!   magnitude (checked on the host before the upload; a tensor with a larger value stays
//!   there);
//! - a comparison reads integer device tensors, and host integer operands uploaded the same way
//!   when one operand already is one or the output is large, and makes a mask (`masks.rs`);
//! - a Cast relabels one: to a float format it is that float tensor (a narrow format rounds as a
//!   float tensor does), to an integer type held as int64 or int32 the same values (the host's
//!   casts convert through int64, and these values fit those storages), to bool a mask; a Cast
//!   to uint8 or int8 wraps into a byte, on the host;
//! - views (Reshape, Identity, …) and Expand keep it; Shape and Size read its shape;
//! - every other op refuses it (`operands::device` and `operands::device_or_mask` pass only floats and
//!   masks), so it runs on the host on the exact integers downloaded (`Value::to_host`): an
//!   integer tensor's semantics cannot change by landing on the device.

use std::sync::Arc;

use super::gpu::{numel, Gpu};
use super::operands::{expand_shape, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::broadcast_shapes;
use crate::narrow::layout;
use crate::tensor::HostTensor;
use pipecut_ir::graph::DType;

/// Largest integer magnitude an f32 holds exactly (and every integer below it).
const EXACT: u64 = 1 << 24;

/// Fewest output elements for which a broadcast of host integers runs on the device: 256 KiB
/// as floats. Below it the host makes the result in microseconds and the float op after it
/// uploads it through the page-locked ring without waiting (`staging.rs`), about what a
/// launch and its small uploads cost; and shape arithmetic, indices and small masks, whose
/// readers are host ops, never come near it.
const LARGE_OUTPUT: usize = 1 << 16;

/// How many times its operands' elements an output must hold: a broadcast that does not grow
/// its operands saves no upload by running on the device, and its result (read next by a host
/// op, often) would come back down.
const GROWTH: usize = 4;

/// Operand `i` when it is an integer tensor on the device.
pub(super) fn device_integers(args: &[Option<Value>], i: usize) -> Option<DeviceTensor> {
    match args.get(i)?.as_ref()? {
        Value::Device(t) if t.int.is_some() => Some(t.clone()),
        _ => None,
    }
}

/// Operand `i` when it is an integer tensor on the host.
fn host_integers(args: &[Option<Value>], i: usize) -> Option<Arc<HostTensor>> {
    match args.get(i)?.as_ref()? {
        Value::Host(t, _)
            if matches!(t.dtype(), DType::I32 | DType::I64 | DType::U8 | DType::I8) =>
        {
            Some(Arc::clone(t))
        }
        _ => None,
    }
}

/// Whether a broadcast to `out` elements from operands of `operands` elements is worth the
/// device: a large output, much larger than what it reads.
fn worth_the_device(out: usize, operands: usize) -> bool {
    out >= LARGE_OUTPUT && out >= operands.saturating_mul(GROWTH)
}

/// The integer operand `i` on the device: an integer device tensor as it is, a host one
/// uploaded as floats (once per value: the copy is kept beside the host tensor) when every
/// value is exact in f32; `None` otherwise.
fn upload_exact(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<DeviceTensor>, String> {
    if let Some(t) = device_integers(args, i) {
        return Ok(Some(t));
    }
    let Some(Some(Value::Host(t, uploaded))) = args.get(i) else {
        return Ok(None);
    };
    if let Some(copy) = uploaded.get().filter(|c| c.int.is_some()) {
        return Ok(Some(copy.clone()));
    }
    let dtype = t.dtype();
    if !matches!(dtype, DType::I32 | DType::I64 | DType::U8 | DType::I8) || t.is_empty() {
        return Ok(None);
    }
    let values = t.to_i64_vec();
    if values.iter().any(|v| v.unsigned_abs() > EXACT) {
        return Ok(None);
    }
    let floats: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    let copy = DeviceTensor::integers(t.shape().to_vec(), gpu.upload(&floats)?, dtype);
    // A float copy another op made of these values first is as exact: labelled, it serves.
    let kept = uploaded.get_or_init(|| copy).clone();
    Ok(Some(DeviceTensor {
        int: Some(dtype),
        ..kept
    }))
}

/// Expand of an integer tensor: on the device when it is there already, or when it is a host
/// tensor exact in f32 whose output is large (`worth_the_device`); `None` leaves it to the
/// host.
pub(super) fn expand(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let on_device = device_integers(args, 0);
    let Some(x_shape) = on_device
        .as_ref()
        .map(|t| t.shape.clone())
        .or_else(|| host_integers(args, 0).map(|t| t.shape().to_vec()))
    else {
        return Ok(None);
    };
    let Some(target) = host(gpu, args, 1)? else {
        return Ok(None);
    };
    let shape = match expand_shape(&x_shape, &target) {
        Ok(Some(shape)) => shape,
        Err(e) if on_device.is_some() => return Err(e),
        // A bad target for host integers is the CPU kernel's to report, as before.
        Ok(None) | Err(_) => return Ok(None),
    };
    if on_device.is_none() && !worth_the_device(numel(&shape), numel(&x_shape)) {
        return Ok(None);
    }
    let Some(x) = upload_exact(gpu, args, 0)? else {
        return Ok(None);
    };
    let expanded = gpu.expand(&x, &shape)?;
    one(DeviceTensor {
        int: x.int,
        ..expanded
    })
}

/// The two operands of a comparison of integers, on the device: when one of them is an
/// integer device tensor, or both are host integers broadcast to a large output, and every
/// host value is exact in f32. `None` leaves the comparison to the host (on downloaded
/// integers, where one was on the device).
pub(super) fn comparison_operands(
    gpu: &Gpu,
    args: &[Option<Value>],
) -> Result<Option<(DeviceTensor, DeviceTensor)>, String> {
    let shape_of = |i: usize| {
        device_integers(args, i)
            .map(|t| t.shape)
            .or_else(|| host_integers(args, i).map(|t| t.shape().to_vec()))
    };
    let (Some(a), Some(b)) = (shape_of(0), shape_of(1)) else {
        return Ok(None);
    };
    let any_on_device = device_integers(args, 0).is_some() || device_integers(args, 1).is_some();
    if !any_on_device {
        let out = numel(&broadcast_shapes(&[&a, &b])?);
        if !worth_the_device(out, numel(&a) + numel(&b)) {
            return Ok(None);
        }
    }
    match (upload_exact(gpu, args, 0)?, upload_exact(gpu, args, 1)?) {
        (Some(a), Some(b)) => Ok(Some((a, b))),
        _ => Ok(None),
    }
}

/// What a Cast of an integer device tensor gives.
pub(super) enum Cast {
    /// The result: integers of another storage (the same values).
    Done(DeviceTensor),
    /// The values as a float tensor, for the float Cast to finish (round to a narrow format,
    /// or compare with 0 for bool).
    AsFloats(DeviceTensor),
}

/// A Cast of the integer device tensor `x` to `to`, or `None` for the host (uint8, int8 and
/// the sub-byte integers, which wrap into their byte storage; strings, float8 E8M0).
pub(super) fn cast(x: DeviceTensor, to: DType) -> Option<Cast> {
    let floats = DeviceTensor {
        int: None,
        ..x.clone()
    };
    match to {
        // The host's casts to integers convert through int64 (`HostTensor::cast`), and
        // values within ±2²⁴ are the same in every storage.
        DType::I32 => Some(Cast::Done(DeviceTensor {
            int: Some(DType::I32),
            ..x
        })),
        DType::I64 | DType::I16 | DType::U16 | DType::U32 => Some(Cast::Done(DeviceTensor {
            int: Some(DType::I64),
            ..x
        })),
        DType::F32 | DType::F64 | DType::Bool => Some(Cast::AsFloats(floats)),
        _ if to != DType::F8E8M0 && layout(to).is_some() => Some(Cast::AsFloats(floats)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_takes_large_growing_broadcasts_only() {
        // magika at batch 2: [2, 2048, 1] against [1, 1, 257].
        assert!(worth_the_device(2 * 2048 * 257, 2 * 2048 + 257));
        // Shape arithmetic and indices: small.
        assert!(!worth_the_device(64, 2));
        // Large but not grown: nothing to save.
        assert!(!worth_the_device(1 << 20, 1 << 20));
        assert!(worth_the_device(LARGE_OUTPUT, LARGE_OUTPUT / GROWTH));
        assert!(!worth_the_device(LARGE_OUTPUT - 1, 1));
    }
}
