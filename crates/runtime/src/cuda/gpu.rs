//! What a device op launches with: the stage's stream, cuBLAS handle and compiled kernels
//! ([`Gpu`]) with the launches every op shares (allocation, upload, strided gathers, row
//! reductions, GEMMs), the shapes and strides the kernels take by value ([`Dims`]), and the
//! stage's cuBLAS math mode ([`Tf32`]).

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::expanded::ExpandedWeights;
use super::functions::Functions;
use super::value::DeviceTensor;
use super::{host_times, staging};

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

/// What an op needs to launch work: the stage's stream, its cuBLAS handle, the kernels.
pub(super) struct Gpu<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub blas: &'a CudaBlas,
    pub functions: &'a Functions,
    /// The stage's expanded MatMulNBits weights (`nbits.rs`, `expanded.rs`).
    pub expanded: &'a ExpandedWeights,
}

pub(super) fn cuda_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("CUDA {what}: {e}")
}

impl Gpu<'_> {
    pub(super) fn alloc(&self, n: usize) -> Result<CudaSlice<f32>, String> {
        // SAFETY: every kernel writing into the buffer writes each of its `n` elements.
        host_times::timed(host_times::Part::Alloc, || unsafe {
            self.stream.alloc::<f32>(n)
        })
        .map_err(cuda_error("allocation"))
    }

    pub(super) fn upload<T: DeviceRepr>(&self, values: &[T]) -> Result<CudaSlice<T>, String> {
        host_times::timed(host_times::Part::Upload, || {
            staging::upload(self.stream, values)
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
    pub(super) fn gemm(
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
        host_times::timed(host_times::Part::Gemm, || unsafe {
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

#[cfg(test)]
mod tests {
    use super::*;

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
