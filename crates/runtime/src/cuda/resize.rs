//! Resize on the device (every mode the CPU kernel takes: nearest, linear, cubic, antialiased):
//! the CPU runtime's own taps (input index and weight per output index, per axis) are computed on
//! the host from the shapes alone, uploaded, and applied one resized axis after another by
//! `resize_axis_f32`. A coordinate outside the input (tf_crop_and_resize's extrapolation) is left
//! to the CPU kernel.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{resize_plan, Ctx};
use crate::tensor::HostTensor;

pub(super) fn resize(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    // roi, scales, sizes: small host-side operands (weights keep their host copy).
    let mut operands: Vec<Option<Arc<HostTensor>>> = vec![None];
    for i in 1..args.len() {
        operands.push(host(gpu, args, i)?);
    }
    let refs: Vec<Option<&HostTensor>> = operands.iter().map(|t| t.as_deref()).collect();
    let Some((out_shape, axes)) = resize_plan(ctx, &refs, &x.shape)? else {
        return Ok(None);
    };
    let mut current = x;
    for (axis, taps) in axes {
        let count = taps.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut index = vec![0i64; taps.len() * count];
        let mut weight = vec![0f32; taps.len() * count];
        for (o, output_taps) in taps.iter().enumerate() {
            for (t, &(i, w)) in output_taps.iter().enumerate() {
                index[o * count + t] = i as i64;
                weight[o * count + t] = w as f32;
            }
        }
        let mut shape = current.shape.clone();
        shape[axis] = out_shape[axis];
        let (outer, width, inner) = (
            numel(&current.shape[..axis]),
            current.shape[axis],
            numel(&current.shape[axis + 1..]),
        );
        let n = numel(&shape);
        let mut out = gpu.alloc(n)?;
        let (index, weight) = (gpu.upload(&index)?, gpu.upload(&weight)?);
        let sizes = [outer, width, out_shape[axis], inner, count].map(|v| v as i64);
        let mut launch = gpu.stream.launch_builder(&gpu.functions.resize_axis);
        launch
            .arg(&*current.data)
            .arg(&mut out)
            .arg(&index)
            .arg(&weight);
        for size in &sizes {
            launch.arg(size);
        }
        // SAFETY: argument types match `resize_axis_f32`; the taps index the axis of `current`
        // (the CPU runtime's taps, clamped to the input).
        unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
        current = DeviceTensor::new(shape, out);
    }
    if current.shape != out_shape {
        return Err(format!(
            "Resize gave {:?} where {out_shape:?} was asked",
            current.shape
        ));
    }
    one(current)
}
