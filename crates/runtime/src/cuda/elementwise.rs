//! The general element-wise launches other ops build on: `unary_f32` over every element and
//! `binary_f32` over two broadcast operands (through the flat fast path, `flat.rs`, when the
//! operands allow it).

use cudarc::driver::PushKernelArg;

use super::flat;
use super::gpu::{broadcast_strides, cuda_error, element_dims, numel, Gpu};
use super::value::DeviceTensor;
use crate::kernels::broadcast_shapes;

/// `unary_f32` with `code` and its two parameters over every element of `x`.
pub(super) fn unary(
    gpu: &Gpu,
    x: &DeviceTensor,
    code: i32,
    (alpha, beta): (f32, f32),
) -> Result<DeviceTensor, String> {
    let n = numel(&x.shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.unary);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&code)
        .arg(&alpha)
        .arg(&beta);
    // SAFETY: argument types match `unary_f32`; both buffers hold `n` floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::new(x.shape.clone(), out))
}

/// `binary_f32` with `code` over `a` and `b` broadcast together.
pub(super) fn binary(
    gpu: &Gpu,
    a: &DeviceTensor,
    b: &DeviceTensor,
    code: i32,
) -> Result<DeviceTensor, String> {
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let flat_kernel = &gpu.functions.flat.binary;
    if let Some(out) = flat::pair(gpu, flat_kernel, (a, b), &shape, code)? {
        return Ok(DeviceTensor::new(shape, out));
    }
    let dims = element_dims(
        &shape,
        &[
            &broadcast_strides(&a.shape, &shape),
            &broadcast_strides(&b.shape, &shape),
        ],
    )?;
    let n = numel(&shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.binary);
    launch
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&dims)
        .arg(&code);
    // SAFETY: argument types match `binary_f32`; broadcast strides keep offsets in bounds.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    Ok(DeviceTensor::new(shape, out))
}
