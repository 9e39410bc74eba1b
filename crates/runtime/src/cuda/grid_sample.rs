//! [GridSample](https://onnx.ai/onnx/operators/onnx__GridSample.html) (opsets 16–22) on the
//! device: `grid_sample_f32`, a thread per output, with the CPU kernel's rules
//! (`kernels/grid_sample.rs`: denormalisation per `align_corners`, zeros/border/reflection
//! padding, nearest half to even, linear over 1–6 spatial axes, cubic in 2-D). An attribute or
//! shape the CPU kernel rejects is left to it, to say why.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;

/// Spatial axes `struct GridDims` in `kernels.cu` carries (rank 8 in all, as the other kernels).
const MAX_SPATIAL: usize = 6;

/// The input's spatial sizes, laid out as `struct GridDims` in `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GridDims {
    rank: i32,
    dims: [i64; MAX_SPATIAL],
}

// SAFETY: `GridDims` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for GridDims {}

pub(super) fn grid_sample(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(grid)) = (device(gpu, args, 0)?, device(gpu, args, 1)?) else {
        return Ok(None);
    };
    let rank = x.shape.len().saturating_sub(2);
    let fits = (1..=MAX_SPATIAL).contains(&rank)
        && grid.shape.len() == rank + 2
        && grid.shape[rank + 1] == rank
        && grid.shape[0] == x.shape[0];
    if !fits {
        return Ok(None);
    }
    let mode: i32 = match ctx.string("mode", "linear").as_str() {
        "nearest" => 0,
        "linear" | "bilinear" => 1,
        "cubic" | "bicubic" if rank == 2 => 2,
        _ => return Ok(None),
    };
    let padding: i32 = match ctx.string("padding_mode", "zeros").as_str() {
        "zeros" => 0,
        "border" => 1,
        "reflection" => 2,
        _ => return Ok(None),
    };
    let align_corners = (ctx.int("align_corners", 0) != 0) as i32;
    let mut dims = GridDims {
        rank: rank as i32,
        ..GridDims::default()
    };
    for (slot, &size) in dims.dims.iter_mut().zip(&x.shape[2..]) {
        *slot = size as i64;
    }
    let (n, channels) = (x.shape[0], x.shape[1]);
    let points = numel(&grid.shape[1..=rank]);
    let mut shape = vec![n, channels];
    shape.extend_from_slice(&grid.shape[1..=rank]);
    let n_out = numel(&shape);
    let mut out = gpu.alloc(n_out)?;
    let [n_out_i, channels_i, points_i] = [n_out, channels, points].map(|v| v as i64);
    let mut launch = gpu.stream.launch_builder(&gpu.functions.grid_sample);
    launch
        .arg(&*x.data)
        .arg(&*grid.data)
        .arg(&mut out)
        .arg(&n_out_i)
        .arg(&channels_i)
        .arg(&points_i)
        .arg(&dims)
        .arg(&mode)
        .arg(&padding)
        .arg(&align_corners);
    // SAFETY: argument types match `grid_sample_f32`; every pixel read is clamped into its
    // plane (or skipped, zeros padding), and the grid holds `rank` values per output point.
    unsafe { launch.launch(Gpu::grid(n_out)) }.map_err(cuda_error("launch"))?;
    Ok(Some(vec![Value::Device(DeviceTensor::new(shape, out))]))
}
