//! onnxruntime's `com.microsoft` MatMulNBits (2-, 4- and 8-bit weight-only quantised LLMs) on
//! the device, with the CPU kernel's semantics (`kernels/quant.rs`): the packed weight is
//! uploaded as bytes (it is an integer tensor, held on the host), `dequant_nbits_f32` expands it
//! to `W [N, K]` floats on the device, and one cuBLAS GEMM computes `A · Wᵀ` (+ `bias`). The
//! expanded weight is kept per node (`expanded.rs`) for as long as the node's packed
//! weight, scales and zero points are the tensors it was made from (weights are, for the whole
//! run), so a run expands it once, like the float weights it uploads once, not at every
//! micro-batch. `g_idx`, and anything the CPU kernel would refuse, are left to it.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::elementwise;
use super::expanded::Source;
use super::gpu::{cuda_error, numel, Gpu};
use super::operands::{device, host, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::Ctx;

/// `binary_f32`'s Add.
const ADD: i32 = 0;

/// The node's sizes: `K`, `N`, `bits`, `block_size` and the derived block count and bytes.
struct Sizes {
    k: usize,
    n: usize,
    bits: usize,
    block: usize,
    blocks: usize,
    blob: usize,
}

impl Sizes {
    fn of(ctx: &Ctx) -> Option<Sizes> {
        let dim = |name: &str| usize::try_from(ctx.int(name, 0)).ok().filter(|&v| v > 0);
        let (k, n, bits, block) = (dim("K")?, dim("N")?, dim("bits")?, dim("block_size")?);
        if ![2, 4, 8].contains(&bits) {
            return None;
        }
        let blocks = k.div_ceil(block);
        Some(Sizes {
            k,
            n,
            bits,
            block,
            blocks,
            blob: block * bits / 8,
        })
    }
}

/// The zero points as `dequant_nbits_f32` takes them: its `zero_kind`, and the packed bytes or
/// floats on the device.
enum ZeroPoints {
    Default,
    Floats(DeviceTensor),
    Packed(cudarc::driver::CudaSlice<u8>, usize),
}

impl ZeroPoints {
    /// `None` when given in a form the CPU kernel refuses.
    fn of(gpu: &Gpu, args: &[Option<Value>], sizes: &Sizes) -> Result<Option<ZeroPoints>, String> {
        if args.get(3).and_then(|a| a.as_ref()).is_none() {
            return Ok(Some(ZeroPoints::Default));
        }
        if let Some(floats) = device(gpu, args, 3)? {
            let fits = numel(&floats.shape) == sizes.n * sizes.blocks;
            return Ok(fits.then_some(ZeroPoints::Floats(floats)));
        }
        let Some(packed) = host(gpu, args, 3)? else {
            return Ok(None);
        };
        let row = (sizes.blocks * sizes.bits).div_ceil(8);
        let Some(bytes) = bytes_of(&packed.to_i64_vec()) else {
            return Ok(None);
        };
        if packed.dtype().is_float() || bytes.len() != sizes.n * row {
            return Ok(None);
        }
        Ok(Some(ZeroPoints::Packed(gpu.upload(&bytes)?, row)))
    }
}

/// The values as bytes, or `None` when one is not a byte.
fn bytes_of(values: &[i64]) -> Option<Vec<u8>> {
    values.iter().map(|&v| u8::try_from(v).ok()).collect()
}

/// The packed weight, scales and zero points (operands 1–3) of a node, as held tensors.
fn sources(args: &[Option<Value>]) -> Vec<Option<Source>> {
    (1..4)
        .map(|i| args.get(i).and_then(|a| a.as_ref()).and_then(Source::of))
        .collect()
}

/// `W [N, K]` of the node: the stage's expanded copy when its operands are the ones it was made
/// from, else expanded now (and kept); `None` when the CPU kernel must take the node.
fn expanded_weights(
    gpu: &Gpu,
    ctx: &Ctx,
    args: &[Option<Value>],
    sizes: &Sizes,
) -> Result<Option<Arc<CudaSlice<f32>>>, String> {
    let node = std::ptr::from_ref(ctx.node) as usize;
    let from = sources(args);
    if let Some(weights) = gpu.expanded.get(node, &from) {
        return Ok(Some(weights));
    }
    let (Some(packed), Some(scales)) = (host(gpu, args, 1)?, device(gpu, args, 2)?) else {
        return Ok(None);
    };
    let Some(bytes) = bytes_of(&packed.to_i64_vec()) else {
        return Ok(None);
    };
    let fits = !packed.dtype().is_float()
        && bytes.len() == sizes.n * sizes.blocks * sizes.blob
        && numel(&scales.shape) == sizes.n * sizes.blocks;
    if !fits {
        return Ok(None);
    }
    let Some(zero_points) = ZeroPoints::of(gpu, args, sizes)? else {
        return Ok(None);
    };
    let packed = gpu.upload(&bytes)?;
    let weights = Arc::new(dequantize(gpu, &packed, &scales, &zero_points, sizes)?);
    gpu.expanded.keep(node, from, &weights);
    Ok(Some(weights))
}

/// com.microsoft MatMulNBits: `A [..., K] · Wᵀ (+ bias)`, `[..., N]`.
pub(super) fn matmul_nbits(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    if args.get(4).is_some_and(|a| a.is_some()) {
        return Ok(None);
    }
    let (Some(a), Some(sizes)) = (device(gpu, args, 0)?, Sizes::of(ctx)) else {
        return Ok(None);
    };
    let (n, k) = (sizes.n, sizes.k);
    if a.shape.last() != Some(&k) {
        return Ok(None);
    }
    let Some(weights) = expanded_weights(gpu, ctx, args, &sizes)? else {
        return Ok(None);
    };
    let rows = numel(&a.shape) / k;
    let mut out = gpu.alloc(rows * n)?;
    gpu.gemm_views(
        (rows, n, k),
        (&*a.data, false, &*weights, true),
        &mut out,
        (1.0, 0.0),
        (1, rows * k, n * k, rows * n),
    )?;
    let mut shape = a.shape.clone();
    *shape.last_mut().expect("A has K features") = n;
    let out = DeviceTensor::new(shape, out);
    let out = match args.get(5).and_then(|a| a.as_ref()) {
        None => out,
        Some(_) => match device(gpu, args, 5)? {
            Some(bias) if bias.shape == [n] => elementwise::binary(gpu, &out, &bias, ADD)?,
            _ => return Ok(None),
        },
    };
    Ok(Some(vec![Value::Device(out)]))
}

/// `W [N, K]` expanded from the packed bytes by `dequant_nbits_f32`.
fn dequantize(
    gpu: &Gpu,
    packed: &cudarc::driver::CudaSlice<u8>,
    scales: &DeviceTensor,
    zero_points: &ZeroPoints,
    sizes: &Sizes,
) -> Result<cudarc::driver::CudaSlice<f32>, String> {
    let count = sizes.n * sizes.k;
    let mut w = gpu.alloc(count)?;
    let [n, k, block, blob] = [sizes.n, sizes.k, sizes.block, sizes.blob].map(|v| v as i64);
    let bits = sizes.bits as i32;
    // An absent zero-point operand is never read; the weight's and scales' buffers stand in.
    let (kind, zp_packed, zp_float, zp_row) = match zero_points {
        ZeroPoints::Default => (0i32, packed, &*scales.data, 0i64),
        ZeroPoints::Floats(z) => (1, packed, &*z.data, 0),
        ZeroPoints::Packed(z, row) => (2, z, &*scales.data, *row as i64),
    };
    let mut launch = gpu.stream.launch_builder(&gpu.functions.nbits.dequant);
    launch
        .arg(packed)
        .arg(&*scales.data)
        .arg(zp_packed)
        .arg(zp_float)
        .arg(&mut w)
        .arg(&n)
        .arg(&k)
        .arg(&block)
        .arg(&blob)
        .arg(&bits)
        .arg(&kind)
        .arg(&zp_row);
    // SAFETY: argument types match `dequant_nbits_f32`; the packed bytes, scales and zero points
    // hold n · blocks blocks (checked above), and `w` n · k floats.
    unsafe { launch.launch(Gpu::grid(count)) }.map_err(cuda_error("launch"))?;
    Ok(w)
}
