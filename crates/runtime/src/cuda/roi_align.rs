//! [RoiAlign](https://onnx.ai/onnx/operators/onnx__RoiAlign.html) (opsets 10–22) on the device:
//! `roi_align_f32`, a thread per output bin and channel, with the CPU kernel's rules
//! (`kernels/detection.rs`: coordinate transformation mode, adaptive or fixed sampling grid,
//! avg or max over weighted corners). The batch indices are integers and so on the host, where
//! they are checked; anything the CPU kernel rejects is left to it, to say why.

use cudarc::driver::PushKernelArg;

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;

pub(super) fn roi_align(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(rois), Some(batch_of)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        host(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let &[batches, channels, height, width] = x.shape.as_slice() else {
        return Ok(None);
    };
    let batch_of = batch_of.to_i64_vec();
    let count = batch_of.len();
    let valid = batch_of
        .iter()
        .all(|&b| usize::try_from(b).is_ok_and(|b| b < batches));
    if rois.shape != [count, 4] || height == 0 || width == 0 || !valid {
        return Ok(None);
    }
    let (out_h, out_w) = (
        ctx.int("output_height", 1).max(1) as usize,
        ctx.int("output_width", 1).max(1) as usize,
    );
    let default_mode = if ctx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel =
        (ctx.string("coordinate_transformation_mode", default_mode) == "half_pixel") as i32;
    let max_mode = (ctx.string("mode", "avg") == "max") as i32;
    let sampling = ctx.int("sampling_ratio", 0);
    let scale = ctx.float("spatial_scale", 1.0);
    let shape = vec![count, channels, out_h, out_w];
    let n_out = numel(&shape);
    let batch_of = gpu.upload(&batch_of)?;
    let mut out = gpu.alloc(n_out)?;
    let [n_i, channels_i, height_i, width_i, out_h_i, out_w_i] =
        [n_out, channels, height, width, out_h, out_w].map(|v| v as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.roi_align);
    launch
        .arg(&*x.data)
        .arg(&*rois.data)
        .arg(&batch_of)
        .arg(&mut out)
        .arg(&n_i)
        .arg(&channels_i)
        .arg(&height_i)
        .arg(&width_i)
        .arg(&out_h_i)
        .arg(&out_w_i)
        .arg(&sampling)
        .arg(&scale)
        .arg(&half_pixel)
        .arg(&max_mode);
    // SAFETY: argument types match `roi_align_f32`; every batch index is below the batch
    // (checked above) and every tap is clamped into its plane.
    unsafe { launch.launch(Gpu::grid(n_out)) }.map_err(cuda_error("launch"))?;
    Ok(Some(vec![Value::Device(DeviceTensor::new(shape, out))]))
}
