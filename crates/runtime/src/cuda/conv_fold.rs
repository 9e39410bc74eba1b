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

use cudarc::driver::CudaSlice;

use super::epilogue::DeviceEpilogue;
use super::gpu::Gpu;
use super::value::Value;
use super::{conv3d, window_ops};
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

/// `fold`'s epilogue for the device, its statistics uploaded when first used.
fn epilogue<'a>(gpu: &Gpu, fold: &'a DeviceFold) -> Result<DeviceEpilogue<'a>, String> {
    let epilogue = &fold.fold.epilogue;
    let norm = match &epilogue.norm {
        Some(per_channel) => Some((device_norm(gpu, fold, per_channel)?, per_channel.len())),
        None => None,
    };
    Ok(DeviceEpilogue::new(epilogue, norm))
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
        return window_ops::conv_then(gpu, ctx, args, &epilogue);
    }
    // A 3-D convolution (`conv3d.rs`), then the epilogue in one more launch.
    let Some(mut results) = conv3d::conv3d(gpu, ctx, args)? else {
        return Ok(None);
    };
    let Some(Value::Device(out)) = results.first_mut() else {
        return Err("the device Conv gave no device output".into());
    };
    epilogue.apply(gpu, out, None)?;
    Ok(Some(results))
}
