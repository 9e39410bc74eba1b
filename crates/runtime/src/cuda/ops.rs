//! The ops the CUDA backend runs on the device, in fp32: matrix products through cuBLAS, the rest
//! through the NVRTC kernels of `kernels.cu`. [`run`] answers `Ok(None)` for a node it does not
//! take (an op without a device kernel, a non-float operand, a rank above 8, an empty tensor);
//! the executor then runs the CPU kernel on host copies, so every op the CPU runtime supports
//! runs, and the stage reports how often it fell back.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};

use super::{index_ops, losses, masks, row_ops, window_ops, DeviceTensor, Value};
use crate::kernels::{
    broadcast_shapes, checked_size, normalize_axis, shape_tensor, transpose_perm, view_shape, Ctx,
};
use crate::tensor::HostTensor;
use pipecut_ir::graph::DType;

/// Largest rank the kernels' [`Dims`] carries.
pub(super) const MAX_RANK: usize = 8;
/// Threads per block of the element-wise kernels and of the per-row kernels.
const BLOCK: u32 = 256;
/// Grid cap: the kernels loop, so more blocks than this only add scheduling.
const MAX_BLOCKS: u64 = 65_535;

/// Shapes and strides passed by value, laid out as `struct Dims` in `kernels.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Dims {
    rank: i32,
    /// 1: the kernels divide in 64 bits at every position (`PIPECUT_CUDA_WIDE_INDEX=on`, to
    /// compare); 0: in 32 bits below 2^31.
    wide: i32,
    shape: [i64; MAX_RANK],
    a: [i64; MAX_RANK],
    b: [i64; MAX_RANK],
    c: [i64; MAX_RANK],
}

// SAFETY: `Dims` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for Dims {}

/// The compiled kernels of one device.
#[derive(Debug)]
pub(super) struct Functions {
    unary: CudaFunction,
    binary: CudaFunction,
    where_: CudaFunction,
    gather_strided: CudaFunction,
    pub(super) copy_block: CudaFunction,
    pub(super) gather_axis: CudaFunction,
    pub(super) softmax_rows: CudaFunction,
    pub(super) norm_rows: CudaFunction,
    pub(super) norm_channels: CudaFunction,
    reduce_rows: CudaFunction,
    pub(super) reduce: CudaFunction,
    pub(super) im2col: CudaFunction,
    pub(super) conv_direct: CudaFunction,
    pub(super) conv_transpose: CudaFunction,
    pub(super) pool: CudaFunction,
    pub(super) pool_nd: CudaFunction,
    pub(super) gather_rows: CudaFunction,
    einsum: CudaFunction,
    pub(super) scatter_rows: CudaFunction,
    pub(super) batch_norm: CudaFunction,
    pub(super) resize_axis: CudaFunction,
    pub(super) arg_reduce: CudaFunction,
    pub(super) cumsum: CudaFunction,
    pub(super) lrn: CudaFunction,
    /// Attention and RotaryEmbedding (`attention.rs`).
    pub(super) attention: super::attention::Kernels,
    pub(super) grid_sample: CudaFunction,
    pub(super) recurrent_step: CudaFunction,
    pub(super) pad: CudaFunction,
    pub(super) roi_align: CudaFunction,
    pub(super) deform_conv: CudaFunction,
    pub(super) moments_rows: CudaFunction,
    pub(super) running_stats: CudaFunction,
    pub(super) conv3d: CudaFunction,
    pub(super) masks: masks::Kernels,
    pub(super) dft: CudaFunction,
    /// DFT's fast transforms (`fft.rs`).
    pub(super) fft: super::fft::Kernels,
    pub(super) det: CudaFunction,
    pub(super) reduce_blocks: CudaFunction,
    pub(super) stft_frames: CudaFunction,
    pub(super) trilu: CudaFunction,
    /// TopK's sorts (`top_k.rs`).
    pub(super) top_k: super::top_k::Kernels,
    pub(super) col2im: CudaFunction,
    pub(super) one_hot: CudaFunction,
    pub(super) mel_weights: CudaFunction,
    pub(super) bernoulli: CudaFunction,
    /// Binarizer, ArrayFeatureExtractor and TreeEnsemble (`ml.rs`).
    pub(super) ml: super::ml::Kernels,
    /// The element-wise fast path (`flat.rs`).
    pub(super) flat: super::flat::Kernels,
    /// The epilogue of a Conv with nodes folded in (`conv_fold.rs`).
    pub(super) conv_epilogue: CudaFunction,
    /// MatMulNBits' weight expansion (`nbits.rs`).
    pub(super) nbits: super::nbits::Kernels,
    /// The fused transformer steps (`fuse.rs`).
    pub(super) fused: super::fuse::Kernels,
}

impl Functions {
    /// Looks up every kernel in the module compiled from `kernels.cu`.
    pub(super) fn load(module: &Arc<CudaModule>) -> Result<Functions, String> {
        let f = |name: &str| kernel(module, name);
        Ok(Functions {
            unary: f("unary_f32")?,
            binary: f("binary_f32")?,
            where_: f("where_f32")?,
            gather_strided: f("gather_strided_f32")?,
            copy_block: f("copy_block_f32")?,
            gather_axis: f("gather_axis_f32")?,
            softmax_rows: f("softmax_rows_f32")?,
            norm_rows: f("norm_rows_f32")?,
            norm_channels: f("norm_channels_f32")?,
            reduce_rows: f("reduce_rows_f32")?,
            reduce: f("reduce_f32")?,
            im2col: f("im2col_f32")?,
            conv_direct: f("conv_direct_f32")?,
            conv_transpose: f("conv_transpose_f32")?,
            pool: f("pool_f32")?,
            pool_nd: f("pool_nd_f32")?,
            gather_rows: f("gather_rows_f32")?,
            einsum: f("einsum_f32")?,
            scatter_rows: f("scatter_rows_f32")?,
            batch_norm: f("batch_norm_f32")?,
            resize_axis: f("resize_axis_f32")?,
            arg_reduce: f("arg_reduce_f32")?,
            cumsum: f("cumsum_f32")?,
            lrn: f("lrn_f32")?,
            attention: super::attention::Kernels::load(module)?,
            grid_sample: f("grid_sample_f32")?,
            recurrent_step: f("recurrent_step_f32")?,
            pad: f("pad_f32")?,
            roi_align: f("roi_align_f32")?,
            deform_conv: f("deform_conv_f32")?,
            moments_rows: f("moments_rows_f32")?,
            running_stats: f("running_stats_f32")?,
            conv3d: f("conv3d_f32")?,
            masks: masks::Kernels::load(module)?,
            dft: f("dft_f32")?,
            fft: super::fft::Kernels::load(module)?,
            det: f("det_f32")?,
            reduce_blocks: f("reduce_blocks_f32")?,
            stft_frames: f("stft_frames_f32")?,
            trilu: f("trilu_f32")?,
            top_k: super::top_k::Kernels::load(module)?,
            col2im: f("col2im_f32")?,
            one_hot: f("one_hot_f32")?,
            mel_weights: f("mel_weights_f32")?,
            bernoulli: f("bernoulli_f32")?,
            ml: super::ml::Kernels::load(module)?,
            flat: super::flat::Kernels::load(module)?,
            conv_epilogue: f("conv_epilogue_f32")?,
            nbits: super::nbits::Kernels::load(module)?,
            fused: super::fuse::Kernels::load(module)?,
        })
    }
}

/// What an op needs to launch work: the stage's stream, its cuBLAS handle, the kernels.
pub(super) struct Gpu<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub blas: &'a CudaBlas,
    pub functions: &'a Functions,
    /// The stage's expanded MatMulNBits weights (`nbits.rs`).
    pub expanded: &'a super::nbits::ExpandedWeights,
}

/// A device result, or `None` when the op is left to the CPU kernel.
pub(super) type OpResult = Result<Option<Vec<Value>>, String>;

pub(super) fn cuda_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("CUDA {what}: {e}")
}

impl Gpu<'_> {
    pub(super) fn alloc(&self, n: usize) -> Result<CudaSlice<f32>, String> {
        // SAFETY: every kernel writing into the buffer writes each of its `n` elements.
        super::host_times::timed(super::host_times::Part::Alloc, || unsafe {
            self.stream.alloc::<f32>(n)
        })
        .map_err(cuda_error("allocation"))
    }

    pub(super) fn upload<T: DeviceRepr>(&self, values: &[T]) -> Result<CudaSlice<T>, String> {
        super::host_times::timed(super::host_times::Part::Upload, || {
            super::staging::upload(self.stream, values)
        })
        .map_err(cuda_error("host-to-device copy"))
    }

    /// An element-wise launch over `n` items.
    pub(super) fn grid(n: usize) -> LaunchConfig {
        let blocks = (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One block per row (up to the cap), with a float of shared memory per thread.
    pub(super) fn rows(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((rows as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: BLOCK * 4,
        }
    }

    /// `out` filled with `x[base + Σ idx_k · strides_k]` over `out_shape`.
    pub(super) fn gather_strided(
        &self,
        x: &CudaSlice<f32>,
        out_shape: &[usize],
        strides: &[i64],
        base: i64,
    ) -> Result<CudaSlice<f32>, String> {
        let n = numel(out_shape);
        let mut out = self.alloc(n)?;
        let dims = element_dims(out_shape, &[strides])?;
        let n64 = n as i64;
        let mut launch = self.stream.launch_builder(&self.functions.gather_strided);
        launch.arg(x).arg(&mut out).arg(&n64).arg(&dims).arg(&base);
        // SAFETY: argument types match `gather_strided_f32`; offsets stay inside `x` because the
        // strides and base come from a valid view of it.
        unsafe { launch.launch(Self::grid(n)) }.map_err(cuda_error("launch"))?;
        Ok(out)
    }

    /// Reduces each of `rows` rows of `cols` contiguous values of `x` into `out` (codes of
    /// `reduce_rows_f32`): one block per row.
    pub(super) fn reduce_rows(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        (rows, cols): (usize, usize),
        code: i32,
    ) -> Result<(), String> {
        let (r, c) = (rows as i64, cols as i64);
        let mut launch = self.stream.launch_builder(&self.functions.reduce_rows);
        launch.arg(x).arg(out).arg(&r).arg(&c).arg(&code);
        // SAFETY: argument types match `reduce_rows_f32`; the callers give `x` rows × cols
        // floats and `out` rows; shared memory is one float per thread.
        unsafe { launch.launch(Self::rows(rows)) }.map_err(cuda_error("launch"))?;
        Ok(())
    }

    /// `x` broadcast to `out_shape` as a contiguous buffer (`x` itself when already that shape).
    pub(super) fn expand(
        &self,
        x: &DeviceTensor,
        out_shape: &[usize],
    ) -> Result<DeviceTensor, String> {
        if x.shape == out_shape {
            return Ok(x.clone());
        }
        let strides = broadcast_strides(&x.shape, out_shape);
        let data = self.gather_strided(&x.data, out_shape, &strides, 0)?;
        Ok(DeviceTensor::new(out_shape.to_vec(), data))
    }

    /// Row-major `C[batch][m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C` through
    /// column-major cuBLAS: the transposed product `Cᵀ = op(B)ᵀ · op(A)ᵀ` needs no copies.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        (m, n, k): (usize, usize, usize),
        a: &CudaSlice<f32>,
        trans_a: bool,
        b: &CudaSlice<f32>,
        trans_b: bool,
        c: &mut CudaSlice<f32>,
        (alpha, beta): (f32, f32),
        (batch, stride_a, stride_b): (usize, usize, usize),
    ) -> Result<(), String> {
        let operands = (a, trans_a, b, trans_b);
        let strides = (batch, stride_a, stride_b, m * n);
        self.gemm_views((m, n, k), operands, c, (alpha, beta), strides)
    }

    /// [`Gpu::gemm_views`] for a convolution's product: in TF32 under `PIPECUT_CUDA_TF32=conv`
    /// (the handle's mode set around the one call; `on` set it for the stage already).
    pub(super) fn conv_gemm_views<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
        &self,
        mnk: (usize, usize, usize),
        operands: (&A, bool, &B, bool),
        c: &mut C,
        scale: (f32, f32),
        strides: (usize, usize, usize, usize),
    ) -> Result<(), String> {
        use cudarc::cublas::sys::cublasMath_t::{CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH};
        if tf32() != Tf32::Conv {
            return self.gemm_views(mnk, operands, c, scale, strides);
        }
        set_math_mode(self.stream, self.blas, CUBLAS_TF32_TENSOR_OP_MATH)?;
        let product = self.gemm_views(mnk, operands, c, scale, strides);
        set_math_mode(self.stream, self.blas, CUBLAS_DEFAULT_MATH)?;
        product
    }

    /// [`Gpu::gemm`] on views, with C's batch stride given (`batch, stride_a, stride_b,
    /// stride_c`): C's matrices need not be contiguous, as a group's rows of a convolution's
    /// output are not.
    pub(super) fn gemm_views<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
        &self,
        (m, n, k): (usize, usize, usize),
        (a, trans_a, b, trans_b): (&A, bool, &B, bool),
        c: &mut C,
        (alpha, beta): (f32, f32),
        (batch, stride_a, stride_b, stride_c): (usize, usize, usize, usize),
    ) -> Result<(), String> {
        let int = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| format!("{what} {v} exceeds cuBLAS's 32-bit sizes"))
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let config = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: op(trans_b),
                transb: op(trans_a),
                m: int(n, "dimension")?,
                n: int(m, "dimension")?,
                k: int(k, "dimension")?,
                alpha,
                lda: int(if trans_b { k } else { n }, "leading dimension")?,
                ldb: int(if trans_a { m } else { k }, "leading dimension")?,
                beta,
                ldc: int(n, "leading dimension")?,
            },
            batch_size: int(batch, "batch")?,
            stride_a: stride_b as i64,
            stride_b: stride_a as i64,
            stride_c: stride_c as i64,
        };
        // cuBLAS works in the calling thread's current context, which nothing else here
        // guarantees is the stream's (cudarc binds it only in its own calls).
        self.stream
            .context()
            .bind_to_thread()
            .map_err(cuda_error("context"))?;
        // SAFETY: the buffers hold `batch` matrices of the sizes in `config` (or one, with a zero
        // stride), as the callers build them.
        super::host_times::timed(super::host_times::Part::Gemm, || unsafe {
            self.blas.gemm_strided_batched(config, b, a, c)
        })
        .map_err(|e| format!("cuBLAS gemm: {e:?}"))
    }
}

/// Where cuBLAS may multiply in TF32 on tensor cores (`PIPECUT_CUDA_TF32`), keeping 10 bits of
/// each factor's mantissa (relative errors near 1e-3): `off`, the default, multiplies in full
/// fp32, within rounding of the CPU runtime; `conv` takes TF32 for convolutions only, as
/// PyTorch does by default; `on` for every product, as onnxruntime's CUDA provider does by
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tf32 {
    Off,
    Conv,
    On,
}

/// Sets how `blas` multiplies (`CUBLAS_TF32_TENSOR_OP_MATH` or the default), its stream's
/// context bound first: cuBLAS works in the calling thread's current context.
pub(super) fn set_math_mode(
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
    mode: cudarc::cublas::sys::cublasMath_t,
) -> Result<(), String> {
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_error("context"))?;
    // SAFETY: the handle is live; the mode is one of cuBLAS's.
    unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }
        .result()
        .map_err(|e| format!("cuBLAS math mode: {e:?}"))
}

pub(super) fn tf32() -> Tf32 {
    static MODE: std::sync::OnceLock<Tf32> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("PIPECUT_CUDA_TF32").as_deref() {
        Ok("on") => Tf32::On,
        Ok("conv") => Tf32::Conv,
        _ => Tf32::Off,
    })
}

/// Number of elements of a shape.
pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of `shape`, with 0 on the axes broadcast to `out_shape` (right-aligned).
pub(super) fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; out_shape.len()];
    let offset = out_shape.len() - shape.len();
    let mut stride = 1i64;
    for i in (0..shape.len()).rev() {
        strides[offset + i] = if shape[i] == 1 && out_shape[offset + i] != 1 {
            0
        } else {
            stride
        };
        stride *= shape[i] as i64;
    }
    strides
}

/// Contiguous row-major strides.
pub(super) fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as i64;
    }
    strides
}

/// [`Dims`] for an output shape and up to three operands' strides.
pub(super) fn dims(out_shape: &[usize], strides: &[&[i64]]) -> Result<Dims, String> {
    if out_shape.len() > MAX_RANK {
        return Err(format!(
            "rank {} above the kernels' {MAX_RANK}",
            out_shape.len()
        ));
    }
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let wide =
        *WIDE.get_or_init(|| std::env::var("PIPECUT_CUDA_WIDE_INDEX").is_ok_and(|v| v == "on"));
    let mut d = Dims {
        rank: out_shape.len() as i32,
        wide: i32::from(wide),
        ..Dims::default()
    };
    for (i, &s) in out_shape.iter().enumerate() {
        d.shape[i] = s as i64;
    }
    for (operand, s) in strides.iter().enumerate() {
        let target = match operand {
            0 => &mut d.a,
            1 => &mut d.b,
            _ => &mut d.c,
        };
        target[..s.len()].copy_from_slice(s);
    }
    Ok(d)
}

/// [`dims`] for the kernels that only turn positions into offsets (`offsets` in kernels.cu):
/// size-1 dims dropped and each dim merged into the one before it where every operand steps
/// through the two as through one, so a position is split with fewer divisions (an Add of a
/// `[8, 64, 128]` tensor and a `[128]` bias becomes `[512, 128]`). `PIPECUT_CUDA_MERGE_DIMS=off`
/// keeps the dims as they are, to compare.
pub(super) fn element_dims(out_shape: &[usize], strides: &[&[i64]]) -> Result<Dims, String> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off =
        *OFF.get_or_init(|| std::env::var("PIPECUT_CUDA_MERGE_DIMS").is_ok_and(|v| v == "off"));
    if off || strides.iter().any(|s| s.len() != out_shape.len()) {
        return dims(out_shape, strides);
    }
    let mut shape: Vec<usize> = Vec::with_capacity(out_shape.len());
    let mut merged: Vec<Vec<i64>> = vec![Vec::with_capacity(out_shape.len()); strides.len()];
    for (k, &size) in out_shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let steps_as_one = !shape.is_empty()
            && strides
                .iter()
                .zip(&merged)
                .all(|(s, m)| m.last() == Some(&(s[k] * size as i64)));
        if steps_as_one {
            *shape.last_mut().expect("not empty") *= size;
        } else {
            shape.push(size);
        }
        for (s, m) in strides.iter().zip(merged.iter_mut()) {
            if steps_as_one {
                *m.last_mut().expect("not empty") = s[k];
            } else {
                m.push(s[k]);
            }
        }
    }
    let views: Vec<&[i64]> = merged.iter().map(Vec::as_slice).collect();
    dims(&shape, &views)
}

/// The device operand `i`, or `None` when it is absent or not float (a boolean mask on the
/// device is not: only the ops of `masks.rs` and views take one).
pub(super) fn device(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<DeviceTensor>, String> {
    Ok(masks::device_or_mask(gpu, args, i)?.filter(|t| !t.mask))
}

/// The host copy of operand `i` (small: shapes, axes, indices, scalars).
pub(super) fn host(
    gpu: &Gpu,
    args: &[Option<Value>],
    i: usize,
) -> Result<Option<Arc<HostTensor>>, String> {
    match args.get(i).and_then(|a| a.as_ref()) {
        Some(v) => v.to_host(gpu.stream).map(Some),
        None => Ok(None),
    }
}

/// Every listed operand on the device, or `None` if one is not float or is missing.
fn all_device(
    gpu: &Gpu,
    args: &[Option<Value>],
    count: usize,
) -> Result<Option<Vec<DeviceTensor>>, String> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        match device(gpu, args, i)? {
            Some(t) => out.push(t),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

pub(super) fn one(t: DeviceTensor) -> OpResult {
    Ok(Some(vec![Value::Device(t)]))
}

/// Whether the node asks for outputs beyond the first (statistics, masks): left to the CPU.
pub(super) fn extra_outputs(ctx: &Ctx) -> bool {
    ctx.node.outputs.iter().skip(1).any(|o| o.is_some())
}

/// Runs the node on the device when it can.
pub(super) fn run(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let op = ctx.node.op_type.as_str();
    let ml = ctx.node.domain == "ai.onnx.ml";
    let microsoft = ctx.node.domain == "com.microsoft";
    if !ctx.node.domain.is_empty() && ctx.node.domain != "ai.onnx" && !ml && !microsoft {
        return Ok(None);
    }
    // Shape and Size read only the shape: a device tensor is not copied for them.
    if let (Some(Some(x)), "Shape" | "Size") = (args.first(), op) {
        let out = if op == "Shape" {
            shape_tensor(ctx, x.shape())
        } else {
            HostTensor::i64(vec![], vec![numel(x.shape()) as i64])
        };
        return Ok(Some(vec![Value::host(Arc::new(out))]));
    }
    // Empty or over-ranked operands are left to the CPU kernels (Resize's roi, scales and sizes
    // are read on the host, where an empty one means "not given"; Concat skips empty parts and
    // Split makes them on the host, where an empty tensor costs nothing).
    // CastLike's second input gives only its type (often an empty tensor).
    let tensors = if matches!(op, "Resize" | "Upsample" | "CastLike") {
        &args[..args.len().min(1)]
    } else {
        args
    };
    let empty_allowed = matches!(op, "Concat" | "Split");
    for v in tensors.iter().flatten() {
        let shape = v.shape();
        if shape.len() > MAX_RANK || (shape.contains(&0) && !empty_allowed) {
            return Ok(None);
        }
    }
    if ml {
        return super::ml::run(gpu, ctx, args);
    }
    if microsoft {
        return super::microsoft::run(gpu, ctx, args);
    }
    if let Some(code) = unary_code(ctx, op) {
        return unary(gpu, ctx, args, code);
    }
    if let Some(code) = binary_code(ctx, op).filter(|_| args.len() == 2) {
        return binary(gpu, args, code);
    }
    match op {
        "MatMul" => matmul(gpu, args),
        "Gemm" => gemm(gpu, ctx, args),
        "Where" => where_op(gpu, args),
        "Identity" => alias(gpu, args, None),
        "Dropout" => dropout(gpu, ctx, args),
        "Cast" | "CastLike" => masks::cast(gpu, ctx, args),
        "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Equal" | "And" | "Or" | "Xor" => {
            masks::compare(gpu, op, args)
        }
        "IsNaN" | "IsInf" | "Not" => masks::test(gpu, ctx, op, args),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let Some(x) = viewable(gpu, args)? else {
                return Ok(None);
            };
            let second = host(gpu, args, 1)?;
            let shape = view_shape(ctx, &x.shape, second.as_deref())?;
            alias(gpu, args, Some(shape))
        }
        "Transpose" => transpose(gpu, ctx, args),
        "Expand" => {
            if let Some(integers) = super::integers::expand(gpu, args)? {
                return Ok(Some(integers));
            }
            let (Some(x), Some(target)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
                return Ok(None);
            };
            let Some(shape) = expand_shape(&x.shape, &target)? else {
                return Ok(None);
            };
            one(gpu.expand(&x, &shape)?)
        }
        "Concat" => concat(gpu, ctx, args),
        "Slice" => slice(gpu, ctx, args),
        "Split" => split(gpu, ctx, args),
        "Gather" => gather(gpu, ctx, args),
        "GatherElements" => index_ops::gather_elements(gpu, ctx, args),
        "GatherND" => index_ops::gather_nd(gpu, ctx, args),
        "ScatterND" | "ScatterElements" | "Scatter" => index_ops::scatter(gpu, ctx, args),
        "Sum" | "Mean" | "Max" | "Min" => variadic(gpu, op, args),
        "Softmax" | "LogSoftmax" | "Hardmax" => row_ops::softmax(gpu, ctx, args),
        "LayerNormalization" => row_ops::norm(gpu, ctx, args, false),
        "RMSNormalization" => row_ops::norm(gpu, ctx, args, true),
        "InstanceNormalization" | "GroupNormalization" => row_ops::channel_norm(gpu, ctx, args),
        "ArgMax" | "ArgMin" => row_ops::arg_reduce(gpu, ctx, args),
        "CumSum" => row_ops::cumsum(gpu, ctx, args),
        "LRN" => row_ops::lrn(gpu, ctx, args),
        "DepthToSpace" | "SpaceToDepth" => depth_space(gpu, ctx, args),
        "Einsum" => einsum(gpu, ctx, args),
        "LpNormalization" => lp_normalization(gpu, ctx, args),
        "NegativeLogLikelihoodLoss" => losses::loss(gpu, ctx, args, false),
        "SoftmaxCrossEntropyLoss" => losses::loss(gpu, ctx, args, true),
        "DequantizeLinear" => super::quant::dequantize_linear(gpu, ctx, args),
        "DFT" => super::spectral::dft(gpu, ctx, args),
        "Det" => super::linalg::det(gpu, args),
        "STFT" => super::spectral::stft(gpu, ctx, args),
        "Tile" => super::layout_ops::tile(gpu, args),
        "Trilu" => super::layout_ops::trilu(gpu, ctx, args),
        "Compress" => super::layout_ops::compress(gpu, ctx, args),
        "CenterCropPad" => super::layout_ops::center_crop_pad(gpu, ctx, args),
        "AffineGrid" => super::layout_ops::affine_grid(gpu, ctx, args),
        "TopK" => super::top_k::top_k(gpu, ctx, args),
        "Col2Im" => super::layout_ops::col2im(gpu, ctx, args),
        "OneHot" => super::layout_ops::one_hot(gpu, ctx, args),
        "MelWeightMatrix" => super::mel_weights::mel_weight_matrix(gpu, args),
        "Bernoulli" => super::random::bernoulli(gpu, ctx, args),
        _ if reduce_code(op).is_some() => reduce(gpu, ctx, args),
        "Conv" | "ConvTranspose"
            if args
                .first()
                .is_some_and(|x| x.as_ref().is_some_and(|x| x.shape().len() == 5)) =>
        {
            super::conv3d::conv3d(gpu, ctx, args)
        }
        "Conv" => window_ops::conv(gpu, ctx, args),
        "ConvTranspose" => window_ops::conv_transpose(gpu, ctx, args),
        "Resize" | "Upsample" => super::resize::resize(gpu, ctx, args),
        "Attention" => super::attention::attention(gpu, ctx, args),
        "RotaryEmbedding" => super::attention::rotary_embedding(gpu, ctx, args),
        "GridSample" => super::grid_sample::grid_sample(gpu, ctx, args),
        "RNN" | "GRU" | "LSTM" => super::recurrent::recurrent(gpu, ctx, args),
        "Pad" => super::movement_ops::pad(gpu, ctx, args),
        "ReverseSequence" => super::movement_ops::reverse_sequence(gpu, ctx, args),
        "TensorScatter" => index_ops::tensor_scatter(gpu, ctx, args),
        "MaxUnpool" => index_ops::max_unpool(gpu, ctx, args),
        "RoiAlign" => super::roi_align::roi_align(gpu, ctx, args),
        "DeformConv" => super::deform_conv::deform_conv(gpu, ctx, args),
        "MeanVarianceNormalization" => super::moments::mean_variance_normalization(gpu, ctx, args),
        "BatchNormalization" if ctx.int("training_mode", 0) != 0 => {
            super::moments::batch_norm_training(gpu, ctx, args)
        }
        "MaxPool" => window_ops::pool(gpu, ctx, args),
        "AveragePool" | "LpPool" if !extra_outputs(ctx) => window_ops::pool(gpu, ctx, args),
        "GlobalAveragePool" | "GlobalMaxPool" => window_ops::global_pool(gpu, ctx, args),
        "BatchNormalization" if !extra_outputs(ctx) && ctx.int("training_mode", 0) == 0 => {
            window_ops::batch_norm(gpu, ctx, args)
        }
        _ => Ok(None),
    }
}

/// Codes of `unary_f32`.
fn unary_code(ctx: &Ctx, op: &str) -> Option<i32> {
    Some(match op {
        "Relu" => 0,
        "Sigmoid" => 1,
        "Tanh" => 2,
        "Erf" => 3,
        "Exp" => 4,
        "Log" => 5,
        "Sqrt" => 6,
        "Neg" => 7,
        "Abs" => 8,
        "Reciprocal" => 9,
        "Gelu" if ctx.string("approximate", "none") == "tanh" => 11,
        "Gelu" => 10,
        "LeakyRelu" => 12,
        "Clip" => 13,
        "Swish" => 14,
        "HardSigmoid" => 15,
        "HardSwish" => 16,
        "Elu" => 17,
        "Selu" => 18,
        "Celu" => 19,
        "Mish" => 20,
        "Softplus" => 21,
        "Softsign" => 22,
        "ThresholdedRelu" => 23,
        "Shrink" => 24,
        "Floor" => 25,
        "Ceil" => 26,
        "Round" => 27,
        "Sign" => 28,
        "Sin" => 29,
        "Cos" => 30,
        "Tan" => 31,
        "Asin" => 32,
        "Acos" => 33,
        "Atan" => 34,
        "Sinh" => 35,
        "Cosh" => 36,
        "Asinh" => 37,
        "Acosh" => 38,
        "Atanh" => 39,
        _ => return None,
    })
}

/// `unary_f32`'s code that multiplies by its `alpha` (Mean's division by the input count).
const SCALE_CODE: i32 = 40;

fn unary(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>], code: i32) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let (alpha, beta) = match code {
        12 => (ctx.float("alpha", 0.01), 0.0),
        14 | 17 | 19 | 23 => (ctx.float("alpha", 1.0), 0.0),
        // Defaults from the ONNX spec (Selu's are 1.67326319217681884765625 and
        // 1.05070102214813232421875).
        18 => (
            ctx.float("alpha", 1.673_263_2),
            ctx.float("gamma", 1.050_701),
        ),
        24 => (ctx.float("bias", 0.0), ctx.float("lambd", 0.5)),
        15 => (ctx.float("alpha", 0.2), ctx.float("beta", 0.5)),
        13 if ctx.opset < 11 => (
            ctx.float("min", f32::NEG_INFINITY),
            ctx.float("max", f32::INFINITY),
        ),
        13 => {
            let bound = |i: usize, default: f32| -> Result<f32, String> {
                Ok(match host(gpu, args, i)? {
                    Some(t) => *t.to_f32_vec().first().ok_or("Clip bound is empty")?,
                    None => default,
                })
            };
            (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?)
        }
        _ => (0.0, 0.0),
    };
    one(gpu.unary(&x, code, (alpha, beta))?)
}

impl Gpu<'_> {
    /// `unary_f32` with `code` and its two parameters over every element of `x`.
    pub(super) fn unary(
        &self,
        x: &DeviceTensor,
        code: i32,
        (alpha, beta): (f32, f32),
    ) -> Result<DeviceTensor, String> {
        let n = numel(&x.shape);
        let mut out = self.alloc(n)?;
        let n64 = n as i64;
        let mut launch = self.stream.launch_builder(&self.functions.unary);
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
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        code: i32,
    ) -> Result<DeviceTensor, String> {
        let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
        let flat = &self.functions.flat.binary;
        if let Some(out) = super::flat::pair(self, flat, (a, b), &shape, code)? {
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
        let mut out = self.alloc(n)?;
        let n64 = n as i64;
        let mut launch = self.stream.launch_builder(&self.functions.binary);
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
}

/// Codes of `binary_f32` (two-input forms only; more inputs go to [`variadic`]).
fn binary_code(ctx: &Ctx, op: &str) -> Option<i32> {
    Some(match op {
        "Add" => 0,
        "Sub" => 1,
        "Mul" => 2,
        "Div" => 3,
        "Pow" => 4,
        "Max" => 5,
        "Min" => 6,
        "PRelu" => 7,
        // Float Mod must be C's fmod (the spec requires fmod = 1 for floats).
        "Mod" if ctx.int("fmod", 0) != 0 => 8,
        _ => return None,
    })
}

fn binary(gpu: &Gpu, args: &[Option<Value>], code: i32) -> OpResult {
    if args.len() != 2 {
        return Ok(None);
    }
    let Some(a) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let b = match device(gpu, args, 1)? {
        Some(b) => b,
        // Pow's exponent may be an integer tensor (small, on the host): raised as floats.
        None if code == 4 => match host(gpu, args, 1)? {
            Some(e) if matches!(e.dtype(), DType::I64 | DType::I32) => {
                let values = e.to_f32_vec();
                DeviceTensor::new(e.shape().to_vec(), gpu.upload(&values)?)
            }
            _ => return Ok(None),
        },
        None => return Ok(None),
    };
    one(gpu.binary(&a, &b, code)?)
}

/// Sum, Mean, Max and Min of any number of float inputs, folded pairwise with broadcasting
/// (Mean scaled by 1/count at the end); one input is itself.
fn variadic(gpu: &Gpu, op: &str, args: &[Option<Value>]) -> OpResult {
    let Some(inputs) = all_device(gpu, args, args.len())? else {
        return Ok(None);
    };
    let Some((first, rest)) = inputs.split_first() else {
        return Ok(None);
    };
    let code = match op {
        "Max" => 5,
        "Min" => 6,
        _ => 0,
    };
    let mut acc = first.clone();
    for next in rest {
        acc = gpu.binary(&acc, next, code)?;
    }
    if op == "Mean" && !rest.is_empty() {
        acc = gpu.unary(&acc, SCALE_CODE, (1.0 / inputs.len() as f32, 0.0))?;
    }
    one(acc)
}

/// Dropout at inference: the input itself and, when asked for, a mask of ones (as the CPU
/// kernel, which never drops).
fn dropout(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let mut results = vec![Value::Device(x.clone())];
    if extra_outputs(ctx) {
        let mask = crate::TensorData::Bool(vec![true; numel(&x.shape)]);
        results.push(Value::host(Arc::new(HostTensor::with_data(
            x.shape.clone(),
            mask,
        ))));
    }
    Ok(Some(results))
}

/// DepthToSpace and SpaceToDepth: one strided copy through a rank-6 view.
fn depth_space(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let &[n, c, h, w] = x.shape.as_slice() else {
        return Ok(None);
    };
    let b = usize::try_from(ctx.int("blocksize", 0))
        .ok()
        .filter(|&b| b > 0)
        .ok_or("blocksize must be positive")?;
    let (view, perm, out_shape) = if ctx.node.op_type == "DepthToSpace" {
        if c % (b * b) != 0 {
            return Err(format!("{c} channels do not divide into blocks of {b}×{b}"));
        }
        let cb = c / (b * b);
        let out = vec![n, cb, h * b, w * b];
        if ctx.string("mode", "DCR") == "CRD" {
            (vec![n, cb, b, b, h, w], [0, 1, 4, 2, 5, 3], out)
        } else {
            (vec![n, b, b, cb, h, w], [0, 3, 4, 1, 5, 2], out)
        }
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(format!("{h}×{w} does not divide into blocks of {b}"));
        }
        let out = vec![n, c * b * b, h / b, w / b];
        (vec![n, c, h / b, b, w / b, b], [0, 3, 5, 1, 2, 4], out)
    };
    let strides = contiguous_strides(&view);
    let moved_shape: Vec<usize> = perm.iter().map(|&p| view[p]).collect();
    let moved_strides: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &moved_shape, &moved_strides, 0)?;
    one(DeviceTensor::new(out_shape, data))
}

fn where_op(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    if let Some(cond) = masks::device_mask(args, 0) {
        return masks::where_mask(gpu, &cond, args);
    }
    let Some(cond) = host(gpu, args, 0)? else {
        return Ok(None);
    };
    let crate::TensorData::Bool(flags) = cond.data() else {
        return Ok(None);
    };
    let (Some(a), Some(b)) = (device(gpu, args, 1)?, device(gpu, args, 2)?) else {
        return Ok(None);
    };
    let shape = broadcast_shapes(&[cond.shape(), &a.shape, &b.shape])?;
    let flags: Vec<u8> = flags.iter().map(|&f| f as u8).collect();
    let flags = gpu.upload(&flags)?;
    let flat_cond = super::flat::Condition::Flags(&flags, cond.shape());
    if let Some(out) = super::flat::choose(gpu, flat_cond, (&a, &b), &shape)? {
        return one(DeviceTensor::new(shape, out));
    }
    let dims = element_dims(
        &shape,
        &[
            &broadcast_strides(&a.shape, &shape),
            &broadcast_strides(&b.shape, &shape),
            &broadcast_strides(cond.shape(), &shape),
        ],
    )?;
    let n = numel(&shape);
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.where_);
    launch
        .arg(&flags)
        .arg(&*a.data)
        .arg(&*b.data)
        .arg(&mut out)
        .arg(&n64)
        .arg(&dims);
    // SAFETY: argument types match `where_f32`; broadcast strides keep offsets in bounds.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// The output shape of an Expand of `x_shape` to the host tensor `target`; `None` past the
/// kernels' rank.
pub(super) fn expand_shape(
    x_shape: &[usize],
    target: &HostTensor,
) -> Result<Option<Vec<usize>>, String> {
    let target = target
        .to_i64_vec()
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("Expand shape has a negative entry {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = broadcast_shapes(&[x_shape, &target])?;
    checked_size(&shape)?;
    Ok((shape.len() <= MAX_RANK).then_some(shape))
}

/// Operand 0 for a view: a float tensor, a mask or integers on the device (a view changes no
/// value), or a host float tensor uploaded.
fn viewable(gpu: &Gpu, args: &[Option<Value>]) -> Result<Option<DeviceTensor>, String> {
    match super::integers::device_integers(args, 0) {
        Some(integers) => Ok(Some(integers)),
        None => masks::device_or_mask(gpu, args, 0),
    }
}

/// The input itself (shared, not copied), optionally under a new shape.
fn alias(gpu: &Gpu, args: &[Option<Value>], shape: Option<Vec<usize>>) -> OpResult {
    let Some(x) = viewable(gpu, args)? else {
        return Ok(None);
    };
    let shape = shape.unwrap_or_else(|| x.shape.clone());
    if numel(&shape) != numel(&x.shape) {
        return Err(format!(
            "cannot view {:?} as {shape:?}: element counts differ",
            x.shape
        ));
    }
    one(DeviceTensor { shape, ..x })
}

fn transpose(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let perm = transpose_perm(ctx, x.shape.len())?;
    let strides = contiguous_strides(&x.shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let out_strides: Vec<i64> = perm.iter().map(|&p| strides[p]).collect();
    let data = gpu.gather_strided(&x.data, &out_shape, &out_strides, 0)?;
    one(DeviceTensor::new(out_shape, data))
}

fn concat(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    // Empty parts add nothing; the CPU kernel checks them (and an all-empty output) itself.
    let filled: Vec<Option<Value>> = args
        .iter()
        .filter(|a| a.as_ref().is_none_or(|v| !v.shape().contains(&0)))
        .cloned()
        .collect();
    if filled.is_empty() || filled.len() < args.len() && !empty_parts_agree(ctx, args)? {
        return Ok(None);
    }
    let Some(parts) = all_device(gpu, &filled, filled.len())? else {
        return Ok(None);
    };
    let first = &parts[0].shape;
    let axis = normalize_axis(ctx.int("axis", 0), first.len())?;
    // Every dim but the axis must agree: a longer row would be written past its place.
    for part in &parts {
        let agrees = part.shape.len() == first.len()
            && (0..first.len()).all(|i| i == axis || part.shape[i] == first[i]);
        if !agrees {
            return Err(format!(
                "Concat parts {first:?} and {:?} differ outside axis {axis}",
                part.shape
            ));
        }
    }
    let mut shape = first.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    let outer = numel(&first[..axis]);
    let out_inner = numel(&shape[axis..]);
    let mut out = gpu.alloc(numel(&shape))?;
    let mut offset = 0usize;
    for part in &parts {
        let in_inner = numel(&part.shape[axis..]);
        let (o, i, oi, off) = (
            outer as i64,
            in_inner as i64,
            out_inner as i64,
            offset as i64,
        );
        let mut launch = gpu.stream.launch_builder(&gpu.functions.copy_block);
        launch
            .arg(&*part.data)
            .arg(&mut out)
            .arg(&o)
            .arg(&i)
            .arg(&oi)
            .arg(&off);
        // SAFETY: argument types match `copy_block_f32`; each part lands in its own columns.
        unsafe { launch.launch(Gpu::grid(outer * in_inner)) }.map_err(cuda_error("launch"))?;
        offset += in_inner;
    }
    one(DeviceTensor::new(shape, out))
}

/// Whether Concat's empty parts have the rank of the others and agree with them outside the
/// axis (else the CPU kernel reports the mismatch).
fn empty_parts_agree(ctx: &Ctx, args: &[Option<Value>]) -> Result<bool, String> {
    let shapes: Vec<&[usize]> = args.iter().flatten().map(Value::shape).collect();
    let Some(first) = shapes.first() else {
        return Ok(false);
    };
    let axis = normalize_axis(ctx.int("axis", 0), first.len())?;
    Ok(shapes
        .iter()
        .all(|s| s.len() == first.len() && (0..first.len()).all(|i| i == axis || s[i] == first[i])))
}

/// First index, step and length of a slice of an axis of `dim` elements (ONNX's clamping).
fn slice_axis(dim: usize, start: i64, end: i64, step: i64) -> (i64, i64, usize) {
    let dim = dim as i64;
    let fix = |v: i64| if v < 0 { v + dim } else { v };
    let (start, end) = (fix(start), fix(end));
    let (start, end) = if step > 0 {
        (start.clamp(0, dim), end.clamp(0, dim))
    } else {
        (start.clamp(0, dim - 1), end.clamp(-1, dim - 1))
    };
    let len = if step > 0 { end - start } else { start - end }.max(0) as u64;
    let count = len.div_ceil(step.unsigned_abs());
    (start, step, count as usize)
}

fn slice(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let (starts, ends, axes, steps) = if ctx.opset >= 10 {
        let get = |i| -> Result<Option<Vec<i64>>, String> {
            Ok(host(gpu, args, i)?.map(|t| t.to_i64_vec()))
        };
        (
            get(1)?.ok_or("Slice needs starts")?,
            get(2)?.ok_or("Slice needs ends")?,
            get(3)?,
            get(4)?,
        )
    } else {
        (
            ctx.ints("starts").ok_or("Slice needs starts")?,
            ctx.ints("ends").ok_or("Slice needs ends")?,
            ctx.ints("axes"),
            None,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice's starts, ends, axes and steps differ in length".into());
    }
    let strides = contiguous_strides(&x.shape);
    let mut out_shape = x.shape.clone();
    let mut out_strides = strides.clone();
    let mut base = 0i64;
    for i in 0..starts.len() {
        let axis = normalize_axis(axes[i], rank)?;
        if steps[i] == 0 {
            return Err("Slice step 0".into());
        }
        let (start, step, count) = slice_axis(x.shape[axis], starts[i], ends[i], steps[i]);
        out_shape[axis] = count;
        out_strides[axis] = strides[axis] * step;
        if count > 0 {
            base += start * strides[axis];
        }
    }
    if out_shape.contains(&0) {
        return Ok(None);
    }
    let data = gpu.gather_strided(&x.data, &out_shape, &out_strides, base)?;
    one(DeviceTensor::new(out_shape, data))
}

fn split(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let axis = normalize_axis(ctx.int("axis", 0), x.shape.len())?;
    let outputs = ctx.node.outputs.len();
    let dim = x.shape[axis];
    let sizes: Vec<usize> = match if ctx.opset >= 13 {
        host(gpu, args, 1)?.map(|t| t.to_i64_vec())
    } else {
        ctx.ints("split")
    } {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            // Equal parts, the last smaller when the axis does not divide (opset 18).
            let part = dim.div_ceil(outputs.max(1));
            (0..outputs)
                .map(|i| part.min(dim.saturating_sub(i * part)))
                .collect()
        }
    };
    if sizes.len() != outputs || sizes.iter().sum::<usize>() != dim {
        return Ok(None);
    }
    let strides = contiguous_strides(&x.shape);
    let mut results = Vec::with_capacity(outputs);
    let mut start = 0usize;
    for size in sizes {
        let mut shape = x.shape.clone();
        shape[axis] = size;
        if size == 0 {
            // An empty part holds no data: a host tensor, with no device allocation.
            let empty = HostTensor::f32(shape, Vec::new());
            results.push(Value::host(Arc::new(empty)));
            continue;
        }
        let base = start as i64 * strides[axis];
        let data = gpu.gather_strided(&x.data, &shape, &strides, base)?;
        results.push(Value::Device(DeviceTensor::new(shape, data)));
        start += size;
    }
    Ok(Some(results))
}

fn gather(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    if !matches!(indices.dtype(), DType::I64 | DType::I32) {
        return Ok(None);
    }
    let axis = normalize_axis(ctx.int("axis", 0), x.shape.len())?;
    let axis_len = x.shape[axis];
    let idx: Vec<i64> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + axis_len as i64 } else { i };
            if (0..axis_len as i64).contains(&j) {
                Ok(j)
            } else {
                Err(format!("Gather index {i} out of range for {axis_len}"))
            }
        })
        .collect::<Result<_, _>>()?;
    let mut shape = x.shape[..axis].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&x.shape[axis + 1..]);
    if idx.is_empty() {
        return Ok(None);
    }
    let (outer, inner) = (numel(&x.shape[..axis]), numel(&x.shape[axis + 1..]));
    let idx = gpu.upload(&idx)?;
    let n = outer * indices.len() * inner;
    let mut out = gpu.alloc(n)?;
    let (o, a, m, i) = (
        outer as i64,
        axis_len as i64,
        indices.len() as i64,
        inner as i64,
    );
    let mut launch = gpu.stream.launch_builder(&gpu.functions.gather_axis);
    launch
        .arg(&*x.data)
        .arg(&idx)
        .arg(&mut out)
        .arg(&o)
        .arg(&a)
        .arg(&m)
        .arg(&i);
    // SAFETY: argument types match `gather_axis_f32`; indices were checked against the axis.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(shape, out))
}

/// Codes of `reduce_rows_f32` and `reduce_f32`.
fn reduce_code(op: &str) -> Option<i32> {
    Some(match op {
        "ReduceSum" => 0,
        "ReduceMean" => 1,
        "ReduceMax" => 2,
        "ReduceMin" => 3,
        "ReduceSumSquare" => 4,
        "ReduceL1" => 5,
        "ReduceL2" => 6,
        "ReduceLogSum" => 7,
        "ReduceLogSumExp" => 8,
        "ReduceProd" => 9,
        _ => return None,
    })
}

fn reduce(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let Some(code) = reduce_code(&ctx.node.op_type) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let axes: Vec<i64> = match host(gpu, args, 1)? {
        Some(a) => a.to_i64_vec(),
        None => ctx.ints("axes").unwrap_or_default(),
    };
    let keep_dims = ctx.int("keepdims", 1) != 0;
    if axes.is_empty() && ctx.int("noop_with_empty_axes", 0) != 0 {
        return alias(gpu, args, None);
    }
    let mut reduced_axes: Vec<usize> = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter()
            .map(|&a| normalize_axis(a, rank))
            .collect::<Result<_, _>>()?
    };
    reduced_axes.sort_unstable();
    reduced_axes.dedup();
    one(gpu.reduce_axes(&x, &reduced_axes, code, keep_dims)?)
}

impl Gpu<'_> {
    /// `x` reduced over `reduced_axes` (sorted, distinct) with a code of `reduce_rows_f32`:
    /// one block per row when they are the trailing axes, else `reductions::reduce_strided`.
    fn reduce_axes(
        &self,
        x: &DeviceTensor,
        reduced_axes: &[usize],
        code: i32,
        keep_dims: bool,
    ) -> Result<DeviceTensor, String> {
        let rank = x.shape.len();
        let strides = contiguous_strides(&x.shape);
        let kept_axes: Vec<usize> = (0..rank)
            .filter(|a| reduced_axes.binary_search(a).is_err())
            .collect();
        let kept_shape: Vec<usize> = kept_axes.iter().map(|&a| x.shape[a]).collect();
        let kept_strides: Vec<i64> = kept_axes.iter().map(|&a| strides[a]).collect();
        let red_shape: Vec<usize> = reduced_axes.iter().map(|&a| x.shape[a]).collect();
        let red_strides: Vec<i64> = reduced_axes.iter().map(|&a| strides[a]).collect();
        let (n_out, count) = (numel(&kept_shape), numel(&red_shape));
        let mut out = self.alloc(n_out)?;
        let trailing = reduced_axes
            .iter()
            .enumerate()
            .all(|(i, &a)| a == rank - reduced_axes.len() + i);
        if trailing {
            self.reduce_rows(&x.data, &mut out, (n_out, count), code)?;
        } else {
            let kept = dims(&kept_shape, &[&kept_strides])?;
            let reduced = dims(&red_shape, &[&red_strides])?;
            let operands = (&*x.data, &mut out);
            super::reductions::reduce_strided(
                self,
                operands,
                (kept, reduced),
                (n_out, count),
                code,
            )?;
        }
        let shape: Vec<usize> = if keep_dims {
            (0..rank)
                .map(|a| {
                    if reduced_axes.binary_search(&a).is_ok() {
                        1
                    } else {
                        x.shape[a]
                    }
                })
                .collect()
        } else {
            kept_shape
        };
        Ok(DeviceTensor::new(shape, out))
    }
}

/// LpNormalization: `x` divided by its L1 or L2 norm along `axis` (a reduction kept as a
/// size-1 axis, then a broadcast division).
fn lp_normalization(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let code = match ctx.int("p", 2) {
        1 => 5,
        2 => 6,
        // Another p: the CPU kernel refuses it with the reason.
        _ => return Ok(None),
    };
    let axis = normalize_axis(ctx.int("axis", -1), x.shape.len())?;
    let norm = gpu.reduce_axes(&x, &[axis], code, true)?;
    one(gpu.binary(&x, &norm, 3)?)
}

fn matmul(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    scaled_matmul(gpu, args, 1.0)
}

/// MatMul with its product times `alpha` (cuBLAS's alpha: a fused step's scale, `fuse.rs`).
pub(super) fn scaled_matmul(gpu: &Gpu, args: &[Option<Value>], alpha: f32) -> OpResult {
    let Some(v) = all_device(gpu, args, 2)? else {
        return Ok(None);
    };
    let (a, b) = (&v[0], &v[1]);
    if a.shape.is_empty() || b.shape.is_empty() {
        return Ok(None);
    }
    // Vectors are promoted to matrices, and the promoted axis is dropped from the result.
    let a_shape = if a.shape.len() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let b_shape = if b.shape.len() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k) = (a_shape[ra - 2], a_shape[ra - 1]);
    let (k2, n) = (b_shape[rb - 2], b_shape[rb - 1]);
    if k != k2 {
        return Err(format!(
            "MatMul inner dims differ: {:?} × {:?}",
            a.shape, b.shape
        ));
    }
    let batch = broadcast_shapes(&[&a_shape[..ra - 2], &b_shape[..rb - 2]])?;
    let count = numel(&batch);
    let mut out = gpu.alloc(count * m * n)?;
    let (a_count, b_count) = (numel(&a_shape[..ra - 2]), numel(&b_shape[..rb - 2]));
    if b_count == 1 && a_count == count {
        // Weights shared by the whole batch: one product with the batch folded into the rows.
        gpu.gemm(
            (count * m, n, k),
            &a.data,
            false,
            &b.data,
            false,
            &mut out,
            (alpha, 0.0),
            (1, 0, 0),
        )?;
    } else {
        // A batch broadcast from one matrix reads it with stride 0; any other broadcast is
        // materialised first.
        let operand = |t: &DeviceTensor, shape: &[usize], own: usize, rows: usize, cols: usize| {
            if own == count {
                Ok((t.data.clone(), rows * cols))
            } else if own == 1 {
                Ok((t.data.clone(), 0))
            } else {
                let mut full = batch.clone();
                full.extend_from_slice(&[rows, cols]);
                let view = DeviceTensor {
                    shape: shape.to_vec(),
                    data: t.data.clone(),
                    mask: false,
                    int: None,
                };
                gpu.expand(&view, &full).map(|e| (e.data, rows * cols))
            }
        };
        let (a_data, stride_a) = operand(a, &a_shape, a_count, m, k)?;
        let (b_data, stride_b) = operand(b, &b_shape, b_count, k, n)?;
        gpu.gemm(
            (m, n, k),
            &a_data,
            false,
            &b_data,
            false,
            &mut out,
            (alpha, 0.0),
            (count, stride_a, stride_b),
        )?;
    }
    let mut shape = batch;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    one(DeviceTensor::new(shape, out))
}

fn gemm(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(v) = all_device(gpu, args, 2)? else {
        return Ok(None);
    };
    let (a, b) = (&v[0], &v[1]);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Ok(None);
    }
    let (trans_a, trans_b) = (ctx.int("transA", 0) != 0, ctx.int("transB", 0) != 0);
    let (alpha, beta) = (ctx.float("alpha", 1.0), ctx.float("beta", 1.0));
    let (m, k) = if trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(format!(
            "Gemm inner dims differ: {:?} × {:?}",
            a.shape, b.shape
        ));
    }
    let c = match args.get(2).and_then(|c| c.as_ref()) {
        Some(_) => match device(gpu, args, 2)? {
            Some(c) => Some(c),
            None => return Ok(None),
        },
        None => None,
    };
    // C (broadcast to [m, n]) is written first and accumulated into by the product.
    let (mut out, beta) = match c {
        Some(c) if beta != 0.0 => {
            let strides = broadcast_strides(&c.shape, &[m, n]);
            (gpu.gather_strided(&c.data, &[m, n], &strides, 0)?, beta)
        }
        _ => (gpu.alloc(m * n)?, 0.0),
    };
    gpu.gemm(
        (m, n, k),
        &a.data,
        trans_a,
        &b.data,
        trans_b,
        &mut out,
        (alpha, beta),
        (1, 0, 0),
    )?;
    one(DeviceTensor::new(vec![m, n], out))
}

/// Borrowed views of each vector, as [`dims`] takes them.
fn slices(vectors: &[Vec<i64>]) -> Vec<&[i64]> {
    vectors.iter().map(Vec::as_slice).collect()
}

/// Einsum of one to three float operands: the CPU kernel's loops (`kernels/einsum.rs`), one
/// thread per output value summing over the contracted labels. A contraction that is a matrix
/// product would be faster as transposes and a cuBLAS batched GEMM; exporters write those as
/// MatMul, and the Einsums left are small.
fn einsum(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    if !(1..=3).contains(&args.len()) {
        return Ok(None);
    }
    let Some(operands) = all_device(gpu, args, args.len())? else {
        return Ok(None);
    };
    let shapes: Vec<&[usize]> = operands.iter().map(|t| t.shape.as_slice()).collect();
    let loops = crate::kernels::einsum_loops(ctx, &shapes)?;
    if loops.out_shape.len() > MAX_RANK || loops.summed_shape.len() > MAX_RANK {
        return Ok(None);
    }
    let as_i64 = |v: &[usize]| v.iter().map(|&s| s as i64).collect::<Vec<_>>();
    let out_strides: Vec<Vec<i64>> = loops.out_strides.iter().map(|s| as_i64(s)).collect();
    let summed_strides: Vec<Vec<i64>> = loops.summed_strides.iter().map(|s| as_i64(s)).collect();
    let out_dims = dims(&loops.out_shape, &slices(&out_strides))?;
    let summed_dims = dims(&loops.summed_shape, &slices(&summed_strides))?;
    let n = numel(&loops.out_shape);
    let count = numel(&loops.summed_shape) as i64;
    let mut out = gpu.alloc(n)?;
    let (n64, used) = (n as i64, operands.len() as i32);
    // Operands past the last are never read; the first stands in for them.
    let operand = |k: usize| &*operands[k.min(operands.len() - 1)].data;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.einsum);
    launch
        .arg(operand(0))
        .arg(operand(1))
        .arg(operand(2))
        .arg(&mut out)
        .arg(&n64)
        .arg(&out_dims)
        .arg(&summed_dims)
        .arg(&count)
        .arg(&used);
    // SAFETY: argument types match `einsum_f32`; the strides are the operands' own, checked
    // against their shapes by `einsum_loops`.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(loops.out_shape, out))
}

/// `name` from the compiled module, or why it is not there.
pub(super) fn kernel(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction, String> {
    module
        .load_function(name)
        .map_err(|e| format!("kernel '{name}' missing from the compiled module: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_onnx_clamping() {
        assert_eq!(slice_axis(10, 2, 8, 1), (2, 1, 6));
        assert_eq!(slice_axis(10, 0, i64::MAX, 3), (0, 3, 4));
        assert_eq!(slice_axis(10, -1, i64::MIN, -1), (9, -1, 10));
        assert_eq!(slice_axis(10, 8, 2, 1), (8, 1, 0));
        assert_eq!(slice_axis(4, -3, -1, 1), (1, 1, 2));
    }

    #[test]
    fn broadcast_strides_zero_the_broadcast_axes() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        assert_eq!(broadcast_strides(&[2, 3, 4], &[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
    }

    /// `offsets` of kernels.cu, on the host.
    fn offsets(d: &Dims, mut i: i64) -> [i64; 3] {
        let mut o = [0i64; 3];
        for k in (0..d.rank as usize).rev() {
            let idx = i % d.shape[k];
            i /= d.shape[k];
            o[0] += idx * d.a[k];
            o[1] += idx * d.b[k];
            o[2] += idx * d.c[k];
        }
        o
    }

    /// Every position of `out` has the same offsets under [`dims`] and [`element_dims`].
    fn assert_same_offsets(out: &[usize], strides: &[&[i64]]) {
        let (plain, merged) = (
            dims(out, strides).unwrap(),
            element_dims(out, strides).unwrap(),
        );
        for i in 0..numel(out) as i64 {
            assert_eq!(offsets(&plain, i), offsets(&merged, i), "{out:?} at {i}");
        }
    }

    #[test]
    fn merged_dims_give_every_position_the_same_offsets() {
        let cases: Vec<(Vec<usize>, Vec<Vec<usize>>)> = vec![
            // A bias Add, a one-hot comparison, a mask broadcast over heads, size-1 dims inside,
            // a scalar, and no broadcast at all.
            (vec![8, 4, 6], vec![vec![8, 4, 6], vec![6]]),
            (vec![4, 5, 7], vec![vec![4, 5, 1], vec![1, 1, 7]]),
            (
                vec![2, 3, 4, 4],
                vec![vec![2, 1, 4, 4], vec![2, 3, 4, 4], vec![4, 4]],
            ),
            (
                vec![3, 1, 5, 1, 2],
                vec![vec![3, 1, 5, 1, 2], vec![1, 1, 5, 1, 1]],
            ),
            (vec![1, 1], vec![vec![1], vec![1, 1]]),
            (vec![2, 3, 4], vec![vec![2, 3, 4], vec![2, 3, 4]]),
        ];
        for (out, operands) in cases {
            let strides: Vec<Vec<i64>> = operands
                .iter()
                .map(|shape| broadcast_strides(shape, &out))
                .collect();
            let views: Vec<&[i64]> = strides.iter().map(Vec::as_slice).collect();
            assert_same_offsets(&out, &views);
        }
        // A transpose's strides (perm [0, 2, 1]) and a slice's (every other column) stay split
        // where they must: the offsets still agree, and the bias Add above merges to rank 2.
        for (out, strides) in [
            (vec![2, 4, 3], vec![12i64, 1, 4]),
            (vec![3, 2], vec![8i64, 2]),
        ] {
            assert_same_offsets(&out, &[&strides]);
        }
        let bias = element_dims(&[8, 64, 128], &[&[8192, 128, 1], &[0, 0, 1]]).unwrap();
        assert_eq!(bias.rank, 2);
        assert_eq!(&bias.shape[..2], &[512, 128]);
        assert_eq!(element_dims(&[1, 1], &[&[0, 0]]).unwrap().rank, 0);
    }
}
