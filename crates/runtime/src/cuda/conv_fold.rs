//! A Conv with the nodes after it folded in, on the device. The folds are the CPU backend's
//! (`runtime/fuse.rs`: an inference BatchNormalization, a scalar Mul and Add, a written-out
//! hard-swish or a Relu, each intermediate read only by the next node of the stage). Run one
//! by one, each folded node is a launch of its own and a read and write of every activation:
//! PP-OCR follows most of its convolutions with four to six of them. Folded, a depthwise
//! convolution (`conv_direct_f32`) applies them as it writes each value, and any other one in
//! one launch of `conv_epilogue_f32` over the output cuBLAS wrote, which adds the
//! convolution's bias too (one launch fewer than writing it into the output first). A convolution the device op
//! leaves runs the CPU's folded kernel on host copies, counted as a host run of Conv.
//! `PIPECUT_CUDA_FOLD=off` runs the nodes one by one, to compare the two on a GPU.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg};

use super::ops::{cuda_error, Gpu};
use super::{DeviceTensor, Value};
use crate::fuse::FoldedConv;
use crate::kernels::Ctx;

/// Whether Conv chains are folded on the device (they are unless `PIPECUT_CUDA_FOLD=off`).
pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PIPECUT_CUDA_FOLD").map_or(true, |v| v != "off"))
}

/// A fold and the device copy of its normalisation statistics, made when first used.
#[derive(Debug)]
pub(super) struct DeviceFold {
    pub(super) fold: Arc<FoldedConv>,
    norm: OnceLock<CudaSlice<f32>>,
}

impl DeviceFold {
    pub(super) fn new(fold: Arc<FoldedConv>) -> DeviceFold {
        DeviceFold {
            fold,
            norm: OnceLock::new(),
        }
    }
}

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

impl DeviceEpilogue<'_> {
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

/// `fold`'s epilogue for the device, its statistics uploaded when first used.
fn epilogue<'a>(gpu: &Gpu, fold: &'a DeviceFold) -> Result<DeviceEpilogue<'a>, String> {
    let epilogue = &fold.fold.epilogue;
    let norm = match &epilogue.norm {
        Some(per_channel) => Some((device_norm(gpu, fold, per_channel)?, per_channel.len())),
        None => None,
    };
    let [scale, shift] = epilogue.affine.unwrap_or([1.0, 0.0]);
    let [add, lo, hi, div] = epilogue.hard_swish.unwrap_or([0.0, 0.0, 0.0, 1.0]);
    Ok(DeviceEpilogue {
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
    })
}

/// The fold's `[mean, factor, shift]` per channel on the device, uploaded when first used.
fn device_norm<'a>(
    gpu: &Gpu,
    fold: &'a DeviceFold,
    per_channel: &[[f32; 3]],
) -> Result<&'a CudaSlice<f32>, String> {
    if let Some(norm) = fold.norm.get() {
        return Ok(norm);
    }
    let flat: Vec<f32> = per_channel.iter().flatten().copied().collect();
    let norm = gpu.upload(&flat)?;
    Ok(fold.norm.get_or_init(|| norm))
}

/// The Conv of `ctx` on the device with `fold`'s epilogue applied to its output, or `None`
/// when the device ops leave the convolution to the CPU.
pub(super) fn run(
    gpu: &Gpu,
    ctx: &Ctx,
    args: &[Option<Value>],
    fold: &DeviceFold,
) -> Result<Option<Vec<Value>>, String> {
    let epilogue = epilogue(gpu, fold)?;
    let rank = args
        .first()
        .and_then(Option::as_ref)
        .map_or(0, |x| x.shape().len());
    if rank != 5 {
        return super::window_ops::conv_then(gpu, ctx, args, &epilogue);
    }
    // A 3-D convolution (`conv3d.rs`), then the epilogue in one more launch.
    let Some(mut results) = super::conv3d::conv3d(gpu, ctx, args)? else {
        return Ok(None);
    };
    let Some(Value::Device(out)) = results.first_mut() else {
        return Err("the device Conv gave no device output".into());
    };
    epilogue.apply(gpu, out, None)?;
    Ok(Some(results))
}
