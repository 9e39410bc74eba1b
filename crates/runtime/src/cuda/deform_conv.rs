//! [DeformConv](https://onnx.ai/onnx/operators/onnx__DeformConv.html) (opsets 19–22, 2-D) on
//! the device: `deform_conv_f32`, a thread per output value, with the CPU kernel's sampling
//! (`kernels/spatial.rs`: each tap bilinear at its offset position, times the optional mask;
//! groups and offset groups). Shapes the CPU kernel rejects are left to it, to say why.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;

/// The sizes, laid out as `struct DeformGeometry` in `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DeformGeometry {
    ic: i64,
    ih: i64,
    iw: i64,
    oc: i64,
    icg: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    offset_group: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
}

// SAFETY: `DeformGeometry` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for DeformGeometry {}

/// Attribute `name` with at least `n` entries (`default` each when absent); `None` when short.
fn per_axis(ctx: &Ctx, name: &str, n: usize, default: i64) -> Option<Vec<i64>> {
    match ctx.ints(name) {
        Some(v) if v.len() >= n => Some(v),
        Some(_) => None,
        None => Some(vec![default; n]),
    }
}

pub(super) fn deform_conv(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(w), Some(offset)) = (
        device(gpu, args, 0)?,
        device(gpu, args, 1)?,
        device(gpu, args, 2)?,
    ) else {
        return Ok(None);
    };
    let (&[n, ic, ih, iw], &[oc, icg, kh, kw], &[_, offset_rows, oh, ow]) = (
        x.shape.as_slice(),
        w.shape.as_slice(),
        offset.shape.as_slice(),
    ) else {
        return Ok(None);
    };
    let group = ctx.int("group", 1).max(1) as usize;
    let offset_group = ctx.int("offset_group", 1).max(1) as usize;
    let taps = kh * kw;
    let agree = ic == icg * group
        && oc % group == 0
        && ic % offset_group == 0
        && offset_rows == 2 * offset_group * taps
        && offset.shape[0] == n;
    let optional = |i: usize, len: usize| -> Result<Option<Option<DeviceTensor>>, String> {
        if !args.get(i).is_some_and(|a| a.is_some()) {
            return Ok(Some(None));
        }
        Ok(device(gpu, args, i)?
            .filter(|t| numel(&t.shape) == len)
            .map(Some))
    };
    let (Some(bias), Some(mask)) = (
        optional(3, oc)?,
        optional(4, n * offset_group * taps * oh * ow)?,
    ) else {
        return Ok(None);
    };
    let (Some(dilations), Some(pads), Some(strides)) = (
        per_axis(ctx, "dilations", 2, 1),
        per_axis(ctx, "pads", 4, 0),
        per_axis(ctx, "strides", 2, 1),
    ) else {
        return Ok(None);
    };
    if !agree || group == 0 {
        return Ok(None);
    }
    let [ic, ih, iw, oc, icg, kh, kw, oh, ow, og] =
        [ic, ih, iw, oc, icg, kh, kw, oh, ow, offset_group].map(|v| v as i64);
    let geometry = DeformGeometry {
        ic,
        ih,
        iw,
        oc,
        icg,
        kh,
        kw,
        oh,
        ow,
        offset_group: og,
        sh: strides[0],
        sw: strides[1],
        ph: pads[0],
        pw: pads[1],
        dh: dilations[0],
        dw: dilations[1],
    };
    let shape = vec![n, oc as usize, oh as usize, ow as usize];
    let n_out = numel(&shape);
    let mut out = gpu.alloc(n_out)?;
    let n_i = n_out as i64;
    let flags = [bias.is_some() as i32, mask.is_some() as i32];
    // Absent operands are never read; the offsets stand in for their pointers.
    let bias_data = bias.as_ref().map_or(&*offset.data, |b| &*b.data);
    let mask_data = mask.as_ref().map_or(&*offset.data, |m| &*m.data);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.deform_conv);
    launch
        .arg(&*x.data)
        .arg(&*w.data)
        .arg(&*offset.data)
        .arg(bias_data)
        .arg(mask_data)
        .arg(&mut out)
        .arg(&n_i)
        .arg(&geometry)
        .arg(&flags[0])
        .arg(&flags[1]);
    // SAFETY: argument types match `deform_conv_f32`; the shapes were checked to agree (the
    // offsets and mask cover every tap of every output point), and samples outside the plane
    // are not read.
    unsafe { launch.launch(Gpu::grid(n_out)) }.map_err(cuda_error("launch"))?;
    Ok(Some(vec![Value::Device(DeviceTensor::new(shape, out))]))
}
