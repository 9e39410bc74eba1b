//! What a convolution's device kernels apply to each value they write (`ConvEpilogue` of
//! `kernels.cu`): the nodes a fold took into the Conv (`conv_fold.rs`), or nothing. The
//! convolutions of `window_ops.rs` take one, and `conv_fold.rs` makes it from the CPU fold's.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, Gpu};
use super::value::DeviceTensor;
use crate::kernels::Epilogue;

/// `struct ConvEpilogue` of `kernels.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ConvEpilogue {
    scale: f32,
    shift: f32,
    add: f32,
    lo: f32,
    hi: f32,
    div: f32,
    has_norm: i32,
    has_affine: i32,
    has_hard_swish: i32,
    relu: i32,
}

// SAFETY: `ConvEpilogue` is `repr(C)` plain data matching the CUDA struct.
unsafe impl DeviceRepr for ConvEpilogue {}

/// What a convolution's kernels apply to its output: the flags and scalars, and the per-channel
/// statistics on the device with their channel count (the identity: none of them).
#[derive(Debug, Default)]
pub(super) struct DeviceEpilogue<'a> {
    pub(super) params: ConvEpilogue,
    norm: Option<(&'a CudaSlice<f32>, usize)>,
}

impl<'a> DeviceEpilogue<'a> {
    /// `epilogue` (the CPU fold's) for the kernels, with its statistics `norm` already on the
    /// device as `[mean, factor, shift]` per channel, and their channel count.
    pub(super) fn new(epilogue: &Epilogue, norm: Option<(&'a CudaSlice<f32>, usize)>) -> Self {
        let [scale, shift] = epilogue.affine.unwrap_or([1.0, 0.0]);
        let [add, lo, hi, div] = epilogue.hard_swish.unwrap_or([0.0, 0.0, 0.0, 1.0]);
        DeviceEpilogue {
            params: ConvEpilogue {
                scale,
                shift,
                add,
                lo,
                hi,
                div,
                has_norm: norm.is_some() as i32,
                has_affine: epilogue.affine.is_some() as i32,
                has_hard_swish: epilogue.hard_swish.is_some() as i32,
                relu: epilogue.relu as i32,
            },
            norm,
        }
    }

    pub(super) fn is_identity(&self) -> bool {
        let p = &self.params;
        p.has_norm == 0 && p.has_affine == 0 && p.has_hard_swish == 0 && p.relu == 0
    }

    /// The statistics' device address for a kernel's `norm` argument, checked against the
    /// output's channels; without statistics the kernels never read it and `stand_in`'s
    /// address (a live buffer of the launch) is passed.
    pub(super) fn norm_pointer<T>(
        &self,
        gpu: &Gpu,
        channels: usize,
        stand_in: &CudaSlice<T>,
    ) -> Result<u64, String> {
        match self.norm {
            Some((_, folded)) if folded != channels => Err(format!(
                "the normalisation folded in has {folded} channels, the Conv {channels}"
            )),
            Some((norm, _)) => Ok(norm.device_ptr(gpu.stream).0),
            None => Ok(stand_in.device_ptr(gpu.stream).0),
        }
    }

    /// The convolution's `bias` (one value per channel, when given) and the epilogue over
    /// `out` [n, channels, spatial...] in place, in one launch.
    pub(super) fn apply(
        &self,
        gpu: &Gpu,
        out: &mut DeviceTensor,
        bias: Option<&DeviceTensor>,
    ) -> Result<(), String> {
        if self.is_identity() && bias.is_none() {
            return Ok(());
        }
        let channels = *out.shape.get(1).ok_or("a Conv output of rank below 2")?;
        let plane: usize = out.shape[2..].iter().product();
        let n = out.shape.iter().product::<usize>();
        let data = Arc::get_mut(&mut out.data).ok_or("the device Conv's output is shared")?;
        let norm = self.norm_pointer(gpu, channels, data)?;
        let bias_pointer = match bias {
            Some(b) if b.data.len() != channels => {
                return Err(format!(
                    "bias has {} entries for {channels} output channels",
                    b.data.len()
                ))
            }
            Some(b) => b.data.device_ptr(gpu.stream).0,
            // Not read: the output's address stands in.
            None => data.device_ptr(gpu.stream).0,
        };
        let has_bias = bias.is_some() as i32;
        let (n64, plane64, channels64) = (n as i64, plane.max(1) as i64, channels as i64);
        let mut launch = gpu.stream.launch_builder(&gpu.functions.conv_epilogue);
        launch
            .arg(data)
            .arg(&bias_pointer)
            .arg(&has_bias)
            .arg(&norm)
            .arg(&n64)
            .arg(&plane64)
            .arg(&channels64)
            .arg(&self.params);
        // SAFETY: argument types match `conv_epilogue_f32`; `data` holds n floats, the bias
        // one per channel and `norm` 3 (checked), or they are not read.
        unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
        Ok(())
    }
}
